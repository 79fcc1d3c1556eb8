//! The names `ztier run` and the library it preloads agree on: the
//! environment variables the command sets for the library (and that the
//! library reads at start-up), and the requests of the library's control
//! socket (`ztier stats`, `ztier hold`), and the keys of each process's
//! statistics. Both sides use these constants,
//! so that a name changed on one side cannot silently stop matching the
//! other.

/// The `ZTIER_*` environment variables.
pub mod env {
    /// What every one of their names starts with (the library hands the
    /// variables so named on to the programs a process starts).
    pub const PREFIX: &str = "ZTIER_";
    /// The memory budget in bytes; the library stays off without it.
    pub const BUDGET: &str = "ZTIER_BUDGET";
    /// The compressed store's share of the budget, in bytes.
    pub const STORE: &str = "ZTIER_STORE";
    /// The codec of the store (`ztier_codec::CodecId`'s name).
    pub const CODEC: &str = "ZTIER_CODEC";
    /// The store's allocator.
    pub const ALLOCATOR: &str = "ZTIER_ALLOCATOR";
    /// Where each process writes its statistics at exit.
    pub const STATS_DIR: &str = "ZTIER_STATS_DIR";
    /// Where each process writes its fault log (`--fault-log`).
    pub const FAULT_LOG_DIR: &str = "ZTIER_FAULT_LOG_DIR";
    /// The file (or `-`: standard error) the library's notices go to.
    pub const LOG: &str = "ZTIER_LOG";
    /// The budget tree's file, shared by the processes of one run.
    pub const TREE: &str = "ZTIER_TREE";
    /// `REPLACEMENT+PREFETCH+SIZING` (`--policy`).
    pub const POLICY: &str = "ZTIER_POLICY";
    /// How many pages a fault may bring in ahead.
    pub const PREFETCH: &str = "ZTIER_PREFETCH";
    /// The spill folder and its limit in bytes (`--spill`, `--spill-max`).
    pub const SPILL_DIR: &str = "ZTIER_SPILL_DIR";
    /// See [`SPILL_DIR`].
    pub const SPILL_MAX: &str = "ZTIER_SPILL_MAX";
    /// Clean-page handling (`--clean`).
    pub const CLEAN: &str = "ZTIER_CLEAN";
    /// Which thread serves faults: `auto`, `thread`, `signal`.
    pub const FAULT_PATH: &str = "ZTIER_FAULT_PATH";
    /// The remote tier's socket and its token (`--remote`).
    pub const REMOTE_SOCKET: &str = "ZTIER_REMOTE_SOCKET";
    /// See [`REMOTE_SOCKET`].
    pub const REMOTE_TOKEN: &str = "ZTIER_REMOTE_TOKEN";
    /// How many bytes of requests each process leaves to glibc first.
    pub const START_AFTER: &str = "ZTIER_START_AFTER";
    /// The CPUs the run may use, and whether the library pins threads.
    pub const CPUS: &str = "ZTIER_CPUS";
    /// See [`CPUS`].
    pub const PIN: &str = "ZTIER_PIN";
    /// `CPU@PID` (`--remote`): the CPU on which the server's replies
    /// arrive. The process whose parent is PID (the one `ztier run`
    /// started) pins its fault handler and main thread there, if it may
    /// run there, instead of on the CPU its PID picks.
    pub const SERVER_CPU: &str = "ZTIER_SERVER_CPU";
    /// The fault handler's spin before it sleeps, in microseconds.
    pub const SPIN_US: &str = "ZTIER_SPIN_US";
    /// How long a fault may wait before the watchdog speaks, in seconds.
    pub const WATCHDOG_S: &str = "ZTIER_WATCHDOG_S";
    /// `1`: open the userfaultfd user-mode-only, as an unprivileged user
    /// gets it.
    pub const UFFD_USER_MODE_ONLY: &str = "ZTIER_UFFD_USER_MODE_ONLY";
    /// Tests only: make the handler, the evictor, or the userfaultfd
    /// device fail on purpose.
    pub const TEST_HANG_AFTER: &str = "ZTIER_TEST_HANG_AFTER";
    /// See [`TEST_HANG_AFTER`].
    pub const TEST_EVICTOR_HANG_AFTER: &str = "ZTIER_TEST_EVICTOR_HANG_AFTER";
    /// See [`TEST_HANG_AFTER`].
    pub const TEST_NO_UFFD_DEVICE: &str = "ZTIER_TEST_NO_UFFD_DEVICE";
    /// `1` (without [`BUDGET`]): allocation-only mode, the library's
    /// allocator and nothing else (`ztier trace record` under valgrind).
    pub const ALLOC_ONLY: &str = "ZTIER_ALLOC_ONLY";
    /// With [`ALLOC_ONLY`]: a file the library appends the ranges a run
    /// would manage to (`PID m LO HI`, `PID u LO HI`: mapped, unmapped).
    pub const ALLOC_ONLY_MAPS: &str = "ZTIER_ALLOC_ONLY_MAPS";
    /// Tests only: the fault log's row limit.
    pub const TEST_FAULT_LOG_MAX: &str = "ZTIER_TEST_FAULT_LOG_MAX";
}

/// The requests a client sends the control socket (`@ztier-PID`, one
/// datagram each). Any other request is answered with the statistics, as
/// [`STATS`](control::STATS) is.
pub mod control {
    /// The control socket's abstract name is this and the PID: `@ztier-PID`.
    pub const SOCKET_PREFIX: &str = "ztier-";
    /// Process `pid`'s control socket's abstract name (without the `@`).
    pub fn socket_name(pid: u32) -> String {
        format!("{SOCKET_PREFIX}{pid}")
    }
    /// The process's statistics, one JSON datagram.
    pub const STATS: &[u8] = b"stats";
    /// No eviction for the lease (5 s) from now; sent again to renew it.
    pub const HOLD: &[u8] = b"hold";
    /// Ends a hold before its lease runs out.
    pub const RELEASE: &[u8] = b"release";

    /// Keys of the answer to [`HOLD`] and [`RELEASE`] (with
    /// [`stats::PID`](super::stats::PID), [`stats::HELD_BY`](super::stats::HELD_BY),
    /// [`stats::RESIDENT_BYTES`](super::stats::RESIDENT_BYTES) and
    /// [`stats::BUDGET_BYTES`](super::stats::BUDGET_BYTES)).
    pub mod reply {
        /// The request answered: `hold` or `release`.
        pub const REQUEST: &str = "request";
        /// Whether any hold is in force after it.
        pub const HELD: &str = "held";
        /// Bytes brought back from the store for the hold.
        pub const BROUGHT_BACK_BYTES: &str = "brought_back_bytes";
        /// A request refused (its sender may not ask), with the reason.
        pub const DENIED: &str = "denied";
        /// A request that failed, with the reason.
        pub const ERROR: &str = "error";
    }
}

/// The keys of the statistics each process of `ztier run` writes (one
/// JSON object per process: `--stats`' `per_process` entries, and the
/// control socket's answer to [`control::STATS`]). The library writes
/// them, `ztier run` merges them ([`SUMMED`](stats::SUMMED)) and the
/// commands read them by these names. What each means: docs/json.md.
pub mod stats {
    /// The process's PID.
    pub const PID: &str = "pid";
    /// Its budget, in bytes.
    pub const BUDGET_BYTES: &str = "budget_bytes";
    /// Faults served.
    pub const FAULTS: &str = "faults";
    /// The median fault's service time, µs (from the histogram).
    pub const FAULT_P50_US: &str = "fault_p50_us";
    /// The 99th percentile's, µs.
    pub const FAULT_P99_US: &str = "fault_p99_us";
    /// Pages compressed into the store.
    pub const PAGES_COMPRESSED: &str = "pages_compressed";
    /// The store's peak, uncompressed bytes.
    pub const ORIG_BYTES: &str = "orig_bytes";
    /// The store's peak, compressed bytes.
    pub const STORED_BYTES: &str = "stored_bytes";
    /// The store now, uncompressed bytes.
    pub const STORE_ORIG_BYTES_NOW: &str = "store_orig_bytes_now";
    /// The store now, compressed bytes.
    pub const STORE_BYTES_NOW: &str = "store_bytes_now";
    /// Bytes in the next tier (spill file or remote).
    pub const SPILLED_BYTES: &str = "spilled_bytes";
    /// Pages read back from the next tier (spill file or remote), for
    /// faults and prefetches: the store's gets it did not hold in memory.
    pub const SPILL_READS: &str = "spill_reads";
    /// Peak resident managed bytes.
    pub const PEAK_RESIDENT_BYTES: &str = "peak_resident_bytes";
    /// Resident managed bytes now.
    pub const RESIDENT_BYTES: &str = "resident_bytes";
    /// Bytes pinned (no eviction) now.
    pub const PINNED_BYTES: &str = "pinned_bytes";
    /// Faults on pages never written (zero-filled).
    pub const ZERO_FAULTS: &str = "zero_faults";
    /// Faults that read a page back from the store.
    pub const STORE_FAULTS: &str = "store_faults";
    /// Store faults that continued no walk (served one page alone).
    pub const LONE_FAULTS: &str = "lone_faults";
    /// Whether the userfaultfd is user-mode-only.
    pub const USER_MODE_ONLY: &str = "user_mode_only";
    /// Which thread served faults: `thread` or `signal`.
    pub const FAULT_PATH: &str = "fault_path";
    /// The CPU the fault handler and the main thread were pinned to
    /// (null: not pinned).
    pub const HANDLER_CPU: &str = "handler_cpu";
    /// System calls whose memory was brought back and pinned first.
    pub const PINNED_CALLS: &str = "pinned_calls";
    /// Stored pages brought back for them.
    pub const PINNED_IN: &str = "pinned_in";
    /// System calls the dispatch handler ran.
    pub const DISPATCHED_CALLS: &str = "dispatched_calls";
    /// Calls entered through the library's wrappers, with no signal.
    pub const DIRECT_CALLS: &str = "direct_calls";
    /// Pages installed beyond the first of a store fault.
    pub const PREFETCHED: &str = "prefetched";
    /// Evicted pages that were all zero (not stored).
    pub const EVICTED_ZERO: &str = "evicted_zero";
    /// Pages the store refused (they stayed resident).
    pub const REFUSED: &str = "refused";
    /// Write-protect faults.
    pub const WP_FAULTS: &str = "wp_faults";
    /// Write-protect calls made to evict, one per run of victims.
    pub const WP_CALLS: &str = "wp_calls";
    /// The background evictor's batches write-protected by a fault service on the program's CPU.
    pub const WP_BATCHES_NEAR: &str = "wp_batches_near";
    /// Those the evictor write-protected itself.
    pub const WP_BATCHES_FAR: &str = "wp_batches_far";
    /// Faults left waiting for an eviction's commit.
    pub const DEFERRED: &str = "deferred";
    /// Writes to a victim of the background evictor's batch in flight that took it back instead of waiting.
    pub const TAKEN_BACK: &str = "taken_back";
    /// Faults on a victim the evictor had already released, served from the store before the batch's commit.
    pub const COMMITTED_EARLY: &str = "committed_early";
    /// Pages promoted to the protected segment.
    pub const PROMOTED: &str = "promoted";
    /// Pages aged out of the protected segment.
    pub const DEMOTED: &str = "demoted";
    /// Demoted pages that came back from the store.
    pub const REGRETTED: &str = "regretted";
    /// Victims the fault handler evicted itself to make room.
    pub const EVICTED_INLINE: &str = "evicted_inline";
    /// Victims per demotion.
    pub const AGE_EVERY: &str = "age_every";
    /// The refault distance under which a page came back hot.
    pub const HOT_DISTANCE: &str = "hot_distance";
    /// Victims released without compression (the store held their content).
    pub const CLEAN_EVICTED: &str = "clean_evicted";
    /// Pages that came back with their copy kept and were written.
    pub const DIRTIED: &str = "dirtied";
    /// The resident part of the budget, in bytes.
    pub const RESIDENT_BUDGET_BYTES: &str = "resident_budget_bytes";
    /// The sizing policy's name (`null`: none).
    pub const POLICY: &str = "policy";
    /// The replacement policy's name.
    pub const REPLACEMENT: &str = "replacement";
    /// The prefetch policy's name.
    pub const PREFETCH: &str = "prefetch";
    /// The store's allocator.
    pub const ALLOCATOR: &str = "allocator";
    /// The store's part of the budget (`null`: none).
    pub const STORE_BUDGET_BYTES: &str = "store_budget_bytes";
    /// Forks this process made.
    pub const FORKS: &str = "forks";
    /// Whether this process is a forked child.
    pub const FORKED_CHILD: &str = "forked_child";
    /// Fault handler threads started.
    pub const HANDLERS: &str = "handlers";
    /// PIDs of the `ztier hold`s in force.
    pub const HELD_BY: &str = "held_by";
    /// Bytes of the tree budget this process holds (`null`: process scope).
    pub const TREE_HELD_BYTES: &str = "tree_held_bytes";
    /// What every process holds of the tree budget together.
    pub const TREE_RESERVED_BYTES: &str = "tree_reserved_bytes";
    /// Its resident pages still shared with its parent, held by the parent.
    pub const TREE_INHERITED_BYTES: &str = "tree_inherited_bytes";
    /// Time serving faults, ns (`fault_service_s` merged).
    pub const FAULT_SERVICE_NS: &str = "fault_service_ns";
    /// Of it, waiting for the lock.
    pub const FAULT_LOCK_WAIT_NS: &str = "fault_lock_wait_ns";
    /// Of it, reading the store.
    pub const FAULT_STORE_READ_NS: &str = "fault_store_read_ns";
    /// Of it, installing pages.
    pub const FAULT_INSTALL_NS: &str = "fault_install_ns";
    /// Faults (and pins) that evicted inline.
    pub const INLINE_EVICTIONS: &str = "inline_evictions";
    /// Time of those inline evictions, ns.
    pub const FAULT_EVICT_NS: &str = "fault_evict_ns";
    /// Of it, taking the victims.
    pub const FAULT_EVICT_TAKE_NS: &str = "fault_evict_take_ns";
    /// Of it, write-protecting them.
    pub const FAULT_EVICT_PROTECT_NS: &str = "fault_evict_protect_ns";
    /// Of it, compressing them into the store (next tier included).
    pub const FAULT_EVICT_COMPRESS_NS: &str = "fault_evict_compress_ns";
    /// Of that, the store's pushes to its next tier.
    pub const FAULT_EVICT_TIER_NS: &str = "fault_evict_tier_ns";
    /// Of it, releasing their memory.
    pub const FAULT_EVICT_RELEASE_NS: &str = "fault_evict_release_ns";
    /// Time deferred faults waited, ns.
    pub const DEFERRED_WAIT_NS: &str = "deferred_wait_ns";
    /// The fault latency histogram: `[bucket upper bound in ns, count]` pairs.
    pub const LATENCY_NS: &str = "latency_ns";
    /// Every key of a process's record, in the order the library writes them.
    pub const ALL: [&str; 69] = [
        PID,
        BUDGET_BYTES,
        FAULTS,
        FAULT_P50_US,
        FAULT_P99_US,
        PAGES_COMPRESSED,
        ORIG_BYTES,
        STORED_BYTES,
        STORE_ORIG_BYTES_NOW,
        STORE_BYTES_NOW,
        SPILLED_BYTES,
        SPILL_READS,
        PEAK_RESIDENT_BYTES,
        RESIDENT_BYTES,
        PINNED_BYTES,
        ZERO_FAULTS,
        STORE_FAULTS,
        LONE_FAULTS,
        USER_MODE_ONLY,
        FAULT_PATH,
        HANDLER_CPU,
        PINNED_CALLS,
        PINNED_IN,
        DISPATCHED_CALLS,
        DIRECT_CALLS,
        PREFETCHED,
        EVICTED_ZERO,
        REFUSED,
        WP_FAULTS,
        WP_CALLS,
        WP_BATCHES_NEAR,
        WP_BATCHES_FAR,
        DEFERRED,
        TAKEN_BACK,
        COMMITTED_EARLY,
        PROMOTED,
        DEMOTED,
        REGRETTED,
        EVICTED_INLINE,
        AGE_EVERY,
        HOT_DISTANCE,
        CLEAN_EVICTED,
        DIRTIED,
        RESIDENT_BUDGET_BYTES,
        POLICY,
        REPLACEMENT,
        PREFETCH,
        ALLOCATOR,
        STORE_BUDGET_BYTES,
        FORKS,
        FORKED_CHILD,
        HANDLERS,
        HELD_BY,
        TREE_HELD_BYTES,
        TREE_RESERVED_BYTES,
        TREE_INHERITED_BYTES,
        FAULT_SERVICE_NS,
        FAULT_LOCK_WAIT_NS,
        FAULT_STORE_READ_NS,
        FAULT_INSTALL_NS,
        INLINE_EVICTIONS,
        FAULT_EVICT_NS,
        FAULT_EVICT_TAKE_NS,
        FAULT_EVICT_PROTECT_NS,
        FAULT_EVICT_COMPRESS_NS,
        FAULT_EVICT_TIER_NS,
        FAULT_EVICT_RELEASE_NS,
        DEFERRED_WAIT_NS,
        LATENCY_NS,
    ];
    /// The counters `ztier run` adds up over the processes (a key ending
    /// in `_ns` becomes one ending in `_s`, in seconds).
    pub const SUMMED: [&str; 40] = [
        FAULTS,
        PAGES_COMPRESSED,
        ORIG_BYTES,
        STORED_BYTES,
        ZERO_FAULTS,
        STORE_FAULTS,
        SPILL_READS,
        LONE_FAULTS,
        PINNED_CALLS,
        PINNED_IN,
        DISPATCHED_CALLS,
        DIRECT_CALLS,
        PREFETCHED,
        EVICTED_ZERO,
        REFUSED,
        WP_FAULTS,
        WP_CALLS,
        WP_BATCHES_NEAR,
        WP_BATCHES_FAR,
        DEFERRED,
        TAKEN_BACK,
        COMMITTED_EARLY,
        PROMOTED,
        DEMOTED,
        REGRETTED,
        EVICTED_INLINE,
        CLEAN_EVICTED,
        DIRTIED,
        FAULT_SERVICE_NS,
        FAULT_LOCK_WAIT_NS,
        FAULT_STORE_READ_NS,
        FAULT_INSTALL_NS,
        INLINE_EVICTIONS,
        FAULT_EVICT_NS,
        FAULT_EVICT_TAKE_NS,
        FAULT_EVICT_PROTECT_NS,
        FAULT_EVICT_COMPRESS_NS,
        FAULT_EVICT_TIER_NS,
        FAULT_EVICT_RELEASE_NS,
        DEFERRED_WAIT_NS,
    ];
    /// The list of processes' records in the merged statistics.
    pub const PER_PROCESS: &str = "per_process";
    /// Under `ztier run --remote`: in a process's record, its view of the
    /// proxy; in the merged statistics, the run's remote tier.
    pub const REMOTE: &str = "remote";
}

/// The keys `ztier run` adds to the statistics it merges ([`stats::SUMMED`]
/// and the quantiles): the run's own measurements (wall, CPU, peak RSS),
/// its settings, its notices and, with the tree scope, the shared
/// budget's figures. `ztier run --stats` writes them; `ztier run
/// --summary`, `ztier demo` and `ztier bench pressure` read them.
pub mod merged {
    /// Wall seconds of the command.
    pub const WALL_S: &str = "wall_s";
    /// The command's exit status.
    pub const EXIT_CODE: &str = "exit_code";
    /// The largest RSS of the command's processes, in bytes.
    pub const PEAK_RSS_BYTES: &str = "peak_rss_bytes";
    /// Major faults of the command's processes.
    pub const MAJOR_FAULTS: &str = "major_faults";
    /// CPU seconds (user and system) of the command's processes.
    pub const CPU_S: &str = "cpu_s";
    /// `--budget-scope`: `tree` or `process`.
    pub const BUDGET_SCOPE: &str = "budget_scope";
    /// `--budget-covers`: `resident` or `all`.
    pub const BUDGET_COVERS: &str = "budget_covers";
    /// ztier's own notices about the run, a line each.
    pub const NOTICES: &str = "notices";
    /// How many processes wrote statistics.
    pub const PROCESSES: &str = "processes";
    /// The mean fault service time over every process, in microseconds.
    pub const FAULT_MEAN_US: &str = "fault_mean_us";
    /// [`stats::FAULT_SERVICE_NS`](super::stats::FAULT_SERVICE_NS) summed, in seconds.
    pub const FAULT_SERVICE_S: &str = "fault_service_s";
    /// [`stats::FAULT_LOCK_WAIT_NS`](super::stats::FAULT_LOCK_WAIT_NS) summed, in seconds.
    pub const FAULT_LOCK_WAIT_S: &str = "fault_lock_wait_s";
    /// [`stats::FAULT_STORE_READ_NS`](super::stats::FAULT_STORE_READ_NS) summed, in seconds.
    pub const FAULT_STORE_READ_S: &str = "fault_store_read_s";
    /// [`stats::FAULT_INSTALL_NS`](super::stats::FAULT_INSTALL_NS) summed, in seconds.
    pub const FAULT_INSTALL_S: &str = "fault_install_s";
    /// Tree scope: the most pages the processes held together, in bytes.
    pub const TREE_PEAK_HELD_BYTES: &str = "tree_peak_held_bytes";
    /// Tree scope: bytes taken past the shared budget.
    pub const TREE_OVER_BYTES: &str = "tree_over_bytes";
    /// Tree scope: bytes taken back from processes that died holding them.
    pub const TREE_RECLAIMED_BYTES: &str = "tree_reclaimed_bytes";
    /// Tree scope: bytes forked children began to hold once they no longer
    /// shared them with their parent.
    pub const TREE_ADOPTED_BYTES: &str = "tree_adopted_bytes";
    /// Tree scope: the most the stores held together, in bytes.
    pub const TREE_STORE_PEAK_BYTES: &str = "tree_store_peak_bytes";
    /// Tree scope: the stores' shared limit (`--store`), in bytes.
    pub const TREE_STORE_LIMIT_BYTES: &str = "tree_store_limit_bytes";
    /// Tree scope: the most held in all (resident, stores, tables), in bytes.
    pub const TREE_PEAK_TOTAL_BYTES: &str = "tree_peak_total_bytes";
    /// Tree scope: how many processes joined the budget.
    pub const TREE_PROCESSES: &str = "tree_processes";
    /// Every key of this module.
    pub const ALL: [&str; 23] = [
        WALL_S,
        EXIT_CODE,
        PEAK_RSS_BYTES,
        MAJOR_FAULTS,
        CPU_S,
        BUDGET_SCOPE,
        BUDGET_COVERS,
        NOTICES,
        PROCESSES,
        FAULT_MEAN_US,
        FAULT_SERVICE_S,
        FAULT_LOCK_WAIT_S,
        FAULT_STORE_READ_S,
        FAULT_INSTALL_S,
        TREE_PEAK_HELD_BYTES,
        TREE_OVER_BYTES,
        TREE_RECLAIMED_BYTES,
        TREE_ADOPTED_BYTES,
        TREE_STORE_PEAK_BYTES,
        TREE_STORE_LIMIT_BYTES,
        TREE_PEAK_TOTAL_BYTES,
        TREE_PROCESSES,
        super::stats::REMOTE,
    ];
}

#[cfg(test)]
mod tests {
    use super::{control, env, merged, stats};

    #[test]
    fn the_verbs_differ_and_fit_the_librarys_request_buffer() {
        let verbs = [control::STATS, control::HOLD, control::RELEASE];
        for (i, v) in verbs.iter().enumerate() {
            // The library reads a request into 64 bytes.
            assert!(!v.is_empty() && v.len() <= 64, "{v:?}");
            assert!(verbs[..i].iter().all(|w| w != v), "{v:?} twice");
        }
    }

    #[test]
    fn the_environment_names_are_ztier_s_and_differ() {
        let names = [
            env::BUDGET,
            env::STORE,
            env::CODEC,
            env::ALLOCATOR,
            env::STATS_DIR,
            env::FAULT_LOG_DIR,
            env::LOG,
            env::TREE,
            env::POLICY,
            env::PREFETCH,
            env::SPILL_DIR,
            env::SPILL_MAX,
            env::CLEAN,
            env::FAULT_PATH,
            env::REMOTE_SOCKET,
            env::REMOTE_TOKEN,
            env::START_AFTER,
            env::CPUS,
            env::PIN,
            env::SERVER_CPU,
            env::SPIN_US,
            env::WATCHDOG_S,
            env::UFFD_USER_MODE_ONLY,
            env::TEST_HANG_AFTER,
            env::TEST_EVICTOR_HANG_AFTER,
            env::TEST_NO_UFFD_DEVICE,
            env::TEST_FAULT_LOG_MAX,
            env::ALLOC_ONLY,
            env::ALLOC_ONLY_MAPS,
        ];
        for (i, n) in names.iter().enumerate() {
            assert!(
                n.strip_prefix(env::PREFIX)
                    .is_some_and(|s| s.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')),
                "{n}"
            );
            assert!(!names[..i].contains(n), "{n} twice");
        }
    }

    #[test]
    fn the_stats_keys_differ_and_the_summed_ones_are_written() {
        for (i, k) in stats::ALL.iter().enumerate() {
            assert!(
                !k.is_empty() && k.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{k}"
            );
            assert!(!stats::ALL[..i].contains(k), "{k} twice");
        }
        for k in stats::SUMMED {
            assert!(stats::ALL.contains(&k), "{k} summed but not written");
        }
        assert!(!stats::ALL.contains(&stats::PER_PROCESS));
        assert!(!stats::ALL.contains(&stats::REMOTE));
    }

    #[test]
    fn the_merged_keys_differ_from_the_processes_and_the_seconds_are_the_summed_nanoseconds() {
        for (i, k) in merged::ALL.iter().enumerate() {
            assert!(!k.is_empty() && k.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'), "{k}");
            assert!(!merged::ALL[..i].contains(k), "{k} twice");
            assert!(!stats::ALL.contains(k) && *k != stats::PER_PROCESS, "{k} is a process's key too");
        }
        // `ztier run` names a summed `X_ns` counter `X_s` in seconds.
        let seconds: Vec<String> =
            stats::SUMMED.iter().filter_map(|k| k.strip_suffix("_ns")).map(|k| format!("{k}_s")).collect();
        for k in [
            merged::FAULT_SERVICE_S,
            merged::FAULT_LOCK_WAIT_S,
            merged::FAULT_STORE_READ_S,
            merged::FAULT_INSTALL_S,
        ] {
            assert!(seconds.iter().any(|s| s == k), "{k} is not a summed counter in seconds");
        }
    }

    #[test]
    fn the_control_socket_is_named_by_the_pid() {
        assert_eq!(control::socket_name(1234), "ztier-1234");
        assert!(control::socket_name(7).starts_with(control::SOCKET_PREFIX));
    }
}
