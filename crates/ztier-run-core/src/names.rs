//! The names `ztier run` and the library it preloads agree on: the
//! environment variables the command sets for the library (and that the
//! library reads at start-up), and the requests of the library's control
//! socket (`ztier stats`, `ztier hold`). Both sides use these constants,
//! so that a name changed on one side cannot silently stop matching the
//! other.

/// The `ZTIER_*` environment variables.
pub mod env {
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
    /// Tests only: the fault log's row limit.
    pub const TEST_FAULT_LOG_MAX: &str = "ZTIER_TEST_FAULT_LOG_MAX";
}

/// The requests a client sends the control socket (`@ztier-PID`, one
/// datagram each). Any other request is answered with the statistics, as
/// [`STATS`](control::STATS) is.
pub mod control {
    /// The process's statistics, one JSON datagram.
    pub const STATS: &[u8] = b"stats";
    /// No eviction for the lease (5 s) from now; sent again to renew it.
    pub const HOLD: &[u8] = b"hold";
    /// Ends a hold before its lease runs out.
    pub const RELEASE: &[u8] = b"release";
}

#[cfg(test)]
mod tests {
    use super::{control, env};

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
            env::SPIN_US,
            env::WATCHDOG_S,
            env::UFFD_USER_MODE_ONLY,
            env::TEST_HANG_AFTER,
            env::TEST_EVICTOR_HANG_AFTER,
            env::TEST_NO_UFFD_DEVICE,
            env::TEST_FAULT_LOG_MAX,
        ];
        for (i, n) in names.iter().enumerate() {
            assert!(
                n.starts_with("ZTIER_") && n[6..].bytes().all(|b| b.is_ascii_uppercase() || b == b'_'),
                "{n}"
            );
            assert!(!names[..i].contains(n), "{n} twice");
        }
    }
}
