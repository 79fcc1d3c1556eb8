//! Launching a program under ztier's preloaded library, and measuring a
//! program: what `ztier run`, `ztier demo`, `ztier bench pressure` (and
//! its `--suite`) and `ztier hold` share, so that no command module calls
//! into another for it.
//!
//! - [`RunArgs`]: `ztier run`'s settings (the clap struct, so the options
//!   are defined once; [`RunArgs::defaults`] for the other commands).
//! - [`run_program`]: writes the embedded library out ([`preload_path`]),
//!   sets `LD_PRELOAD` and the `ZTIER_*` environment, runs the program
//!   under [`measure_with_timeout`] and merges the per-process statistics
//!   ([`merge_stats`]) into one object:
//!
//! ```text
//!  { "faults", "fault_p50_us", "fault_p99_us", "fault_mean_us", "pages_compressed",
//!    "fault_service_s", "fault_lock_wait_s", "fault_store_read_s", "fault_install_s",
//!    "orig_bytes", "stored_bytes", "peak_resident_bytes",   (DESIGN.md)
//!    "processes", "peak_rss_bytes", "wall_s", "exit_code", "per_process": [...] }
//! ```
//!
//! - [`measure`]: runs any command with wait4 (CPU time, peak RSS of its
//!   tree), forwarding SIGINT/SIGTERM/SIGHUP to it.
//! - [`CatchSignals`]: the one guard of those three signals (ztier run,
//!   the benchmarks and ztier hold); [`interrupted`] and [`take_signal`]
//!   say what arrived.
//! - [`pretty`], [`service_parts`]: how statistics are printed.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::Value;
use ztier_run_core::names::{env, merged, stats};

use crate::units::parse_size;

static PRELOAD: &[u8] = include_bytes!(env!("ZTIER_PRELOAD_SO"));

/// Arguments of `ztier run`.
#[derive(Args, Debug)]
#[command(after_long_help = "Examples:\n  \
    ztier run --budget 256M -- python3 job.py\n  \
    ztier run --budget 64M --codec wkdm --stats run.json -- sort big.txt\n  \
    ztier run --budget 128M --spill /var/tmp --store 64M -- gcc -O2 -c big.c\n  \
    ztier run --budget 256M --policy kaplan --spill /var/tmp -- python3 job.py\n  \
    ztier run --budget 256M --policy fifo+single -- python3 job.py\n\n\
What is managed: memory from malloc/calloc/realloc/memalign (replaced) and the\n\
program's private anonymous mmaps, read-write or reserved (PROT_NONE, made usable\n\
later), as the heaps of the JVM and of node's V8 are; an address hint is only a\n\
hint (the memory comes from ztier's arena; runtimes check what they got). exec'd\n\
and forked children are managed too, each from the request that brings what it\n\
asked for to 1 MiB (or from its second thread): the little it allocated before\n\
stays glibc's, and small helpers (a shell's) run as natively, without the arena.\n\
A child started with an environment its parent made (env -i, env LD_PRELOAD=..,\n\
subprocess with env=) gets ztier's LD_PRELOAD and ZTIER_* settings added back,\n\
except through system(), popen() and execl(): those keep the program's own.\n\
A statically linked program is out of reach (no dynamic linker reads LD_PRELOAD):\n\
ztier warns before it runs, and after, if no process started the library while\n\
the peak RSS went over the budget.\n\
Memory mapped with a fixed address outside the arena or other protections, thread\n\
stacks and glibc's own internal mappings are not.\n\
Needs userfaultfd: root, or vm.unprivileged_userfaultfd=1, or (any other user)\n\
UFFD_USER_MODE_ONLY with syscall user dispatch (Linux 5.11): in that mode the\n\
kernel's own accesses to evicted memory are not reported, so each system call\n\
of the program is caught first and the memory it reads or writes brought back\n\
(a signal per call, except the common ones made through glibc's functions -\n\
read/write and kin, open, stat, socket calls, poll/epoll_wait, syscall - which\n\
ztier enters directly; --clean wp becomes verify). io_uring and Linux AIO are not\n\
offered in that mode (their buffers are used after the call: the program is told\n\
ENOSYS and falls back), signal frames go to a stack of ztier's, and a thread the\n\
program starts with its own clone() and no thread-local storage of its own runs\n\
without that catching: its system calls on evicted memory fail with EFAULT (said in\n\
ztier's notices when one starts: see --log). glibc's own threads (SIGEV_THREAD timers, POSIX AIO) are\n\
caught as pthread_create's are.")]
pub struct RunArgs {
    /// Most memory ztier holds for the command, e.g. 256M: its managed pages resident
    /// (the default, --budget-covers resident; the store bounded by --store), or with
    /// --budget-covers all those, its compressed stores and the library's own tables,
    /// as a memory cgroup's memory.max bounds a program with zswap's pool charged to
    /// it: for all of the command's processes together (--budget-scope tree, the
    /// default), or per process (--budget-scope process, resident pages only). With a
    /// sizing policy in --policy: resident pages and the compressed stores together.
    #[arg(long, value_parser = parse_size)]
    pub budget: u64,
    /// What --budget counts [default: resident; `bench pressure` passes all; all with
    /// a sizing policy in --policy]. all: resident managed pages + the compressed
    /// stores + the library's tables (tree scope; the stores may take up to 3/8 of the
    /// budget with --spill or --remote, 3/4 without, or --store if smaller). With --spill the total stays within the budget
    /// (but for 64 KiB a process its store may have grown by unsaid): a store that
    /// outgrows the room the others leave sends its oldest pages to the spill file
    /// first. Without --spill the pages the budget has no room for stay in memory over
    /// it, counted in --stats' tree_over_bytes. With a sizing policy: resident pages
    /// and the stores as the policy splits them.
    /// resident: resident managed pages only, the stores bounded apart by --store
    /// (default half of RAM); not with a sizing policy.
    #[arg(long, value_parser = ["all", "resident"])]
    pub budget_covers: Option<String>,
    /// What --budget bounds [default: tree]. tree: the
    /// command's processes share one budget, as a memory cgroup's limit covers every
    /// process in it (a make -j, a pool of forked workers, a pipeline): a process that
    /// finds none left evicts its own oldest pages, and every process's evictor gives
    /// back its share (by the pages it holds) while fewer than a reserve are left. A
    /// page a forked child shares with its parent counts once, in the parent, until one
    /// of them writes it. --stats then gives tree_peak_held_bytes (at most --budget, but
    /// for tree_over_bytes taken when no process had pages to give back). process: each
    /// process of the command has a budget of its own. With a sizing policy each
    /// process splits its part (tree) or its budget (process) between its resident
    /// pages and its store, and holds pages of the shared budget for both.
    #[arg(long, value_parser = ["process", "tree"])]
    pub budget_scope: Option<String>,
    /// The policy: a replacement, a prefetch and a sizing policy joined by '+'
    /// (any part left out takes its default) — the objects `ztier sim` replays.
    /// Replacement (which resident pages go; it sees faults only): segmented
    /// (protected and probation segments, refault-distance promotion, adaptive
    /// aging) or fifo (oldest first). Prefetch: walk (stored pages of sequential
    /// and interleaved walks, zero runs of 16 new pages) or single (one page a
    /// fault). Sizing (split the budget live between resident pages and the
    /// compressed store): static:F (a fixed fraction F compressed), kaplan
    /// (Wilson/Kaplan 1999 cost/benefit), castro, castro-aggressive,
    /// castro-sluggish (de Castro 2003), pressure (refault feedback), none, any
    /// of them +clean-disable; with one, --budget holds the stores too, and
    /// --spill is needed (what a store's share cannot hold goes there, still
    /// compressed); without one, the store is beside the budget (--store).
    /// shipped = segmented+walk.
    #[arg(long, default_value = "segmented+walk", value_name = "POLICY")]
    pub policy: String,
    /// Codec of the compressed store (lz4, wkdm, wk4x4, wk64, lzo, zstd, deflate, hybrid, raw).
    #[arg(long, default_value = "lz4")]
    pub codec: String,
    /// Allocator of the store's compressed bytes: classes (zsmalloc-style size
    /// classes), chunks (CCache's chunks), cells or cellsN (de Castro's cells of
    /// N pages; cells = cells2) — the allocators `ztier bench store` compares.
    #[arg(long, default_value = "classes")]
    pub allocator: String,
    /// Most memory the compressed stores may use (default: half of RAM): all the
    /// command's processes together (the default --budget-scope tree), or each
    /// process (--budget-scope process).
    /// When it is full the oldest compressed pages go to the spill file (with --spill);
    /// without one, or once the spill file can take no more (--spill-max, a full
    /// device), the pages it refuses stay resident over --budget (said once: see --log).
    #[arg(long, value_parser = parse_size)]
    pub store: Option<u64>,
    /// Folder for spill files (kept compressed; files without a name, so nothing is left behind).
    #[arg(long)]
    pub spill: Option<PathBuf>,
    /// Largest spill file per process.
    #[arg(long, value_parser = parse_size)]
    pub spill_max: Option<u64>,
    /// Write the merged statistics of every process as JSON here.
    #[arg(long)]
    pub stats: Option<PathBuf>,
    /// `main`: the main thread and the fault handler share one CPU (faults are
    /// served without cross-CPU wake-ups; with --remote on a server bound to one
    /// CPU of this machine, that CPU); `off`: no pinning.
    #[arg(long, default_value = "main", value_parser = ["main", "off"])]
    pub pin: String,
    /// Pages installed per fault when faults run sequentially; a fault that
    /// continues one of several interleaved walks gets up to 8 (1 = no prefetch).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub prefetch: u32,
    /// After a fault, keep polling for the next one this long without sleeping
    /// (useful with --pin off and an idle CPU).
    #[arg(long, default_value_t = 0)]
    pub spin_us: u32,
    /// Abort the program with a message if its fault handler or its evictor
    /// makes no progress for this many seconds (a stuck one would otherwise
    /// leave threads waiting on page faults forever).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..))]
    pub watchdog: u32,
    /// How a page that comes back from the store and is evicted again
    /// without being written avoids a second compression.
    ///
    /// verify: a page faulted back into probation (not the protected part of
    /// the budget, where pages stay long) keeps its compressed copy and is
    /// installed writable; at eviction its xxh3-128 hash is compared with the
    /// copy's, and an unchanged page is just dropped. Costs a hash per
    /// eviction and the copies of probation's pages. wp: every page faulted
    /// back keeps its copy and is installed write-protected, so its first
    /// write costs one more fault (pays for read-mostly programs only;
    /// CPython writes most pages it reads, reference counts). off: every
    /// eviction compresses.
    #[arg(long, default_value = "verify", value_parser = ["verify", "wp", "off"])]
    pub clean: String,
    /// Where a fault is served. thread: a handler thread reads it from the
    /// userfaultfd and wakes the faulting thread (two wake-ups per fault,
    /// ~10 µs). signal: the faulting thread serves it itself, in a SIGBUS
    /// handler (UFFD_FEATURE_SIGBUS) — less time per fault (0.6–0.9× the
    /// wall time of thread on python3, node, java, ruby, php and guile
    /// under pressure), but every system call of the program is then
    /// caught first, as in user-mode-only mode (a signal per call, ~2–4 µs,
    /// except the read/write family, open, stat, socket calls, poll/epoll
    /// and a few more entered directly through glibc's functions: a
    /// directory walk in Python took 1.38× as long), memory the kernel
    /// touches outside a system call is not served, --clean wp becomes
    /// verify, io_uring and Linux AIO are not offered (ENOSYS), and a
    /// thread of the program's own clone() without thread-local storage of
    /// its own gets EFAULT from system calls on evicted memory (said in
    /// ztier's notices, see --log). auto (the default): signal where system calls are caught
    /// anyway — under the user-mode-only userfaultfd an unprivileged user
    /// gets, which has all of those limits with either path — and thread
    /// with a full userfaultfd (root, or vm.unprivileged_userfaultfd=1). A
    /// program whose executable has a malloc of its own (jemalloc or
    /// mimalloc linked in, as rustc's is) takes signal with any: its
    /// allocator's fork handlers touch its evicted metadata while they hold
    /// the allocator's locks, which a new handler thread in the forked
    /// child would need to start. --stats says which path each process
    /// took (overall: thread, signal, or mixed).
    #[arg(long, env = env::FAULT_PATH, default_value = "auto", value_parser = ["auto", "thread", "signal"])]
    pub fault_path: String,
    /// Print a one-line summary to stderr when the program ends (after
    /// ztier's notices, without --log).
    #[arg(long)]
    pub summary: bool,
    /// Where ztier's notices go: what it says about the run that the
    /// program did not cause (a request the arena cannot hold, a full
    /// store, a call refused in this mode, a hold that lapsed, a program
    /// out of LD_PRELOAD's reach), from every process of the command, a
    /// line each, appended to FILE as they come. `-`: on stderr, among the
    /// program's own messages. Without --log they stay out of the
    /// program's stderr, which is its own: the --stats file lists them
    /// ("notices"), and --summary prints them after the run. (A message
    /// that ends the program, an abort of ztier's, is said on stderr all
    /// the same.)
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// Log every page-in into this folder (made if missing): each process
    /// writes PID.csv at exit (PID-N.csv if another process of the command
    /// had its PID), one row per fault served, with its time, kind
    /// (store, zero, pin, deferred, wp, lost), first page, pages installed,
    /// refault distance, eviction clock, whether the page joined the protected
    /// segment, and service time. Misses only (userfaultfd never sees hits).
    /// Costs 32 bytes of memory per row, outside the budget, up to 8 Mi rows
    /// per process; a process killed by a signal writes none. `ztier faults DIR/PID.csv`
    /// summarises one.
    #[arg(long, value_name = "DIR")]
    pub fault_log: Option<PathBuf>,
    // (No doc comment: clap would take it for help text; the flattened
    // options document themselves.)
    #[allow(missing_docs)]
    #[command(flatten)]
    pub remote: crate::remote_args::RemoteArgs,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub cmd: Vec<OsString>,
}

impl RunArgs {
    /// What the budget counts: `resident` (the default) or `all`. A
    /// sizing policy in `--policy` splits the budget between resident
    /// pages and the stores, so with one it is `all` (and `resident` is
    /// refused); without one `all` needs the tree scope.
    pub fn covers(&self) -> anyhow::Result<&str> {
        let sizing = ztier_policy::Spec::parse(&self.policy, ztier_policy::Frontend::Run)
            .map_err(|e| anyhow::anyhow!("--policy: {e}"))?
            .sizing;
        Ok(match (self.budget_covers.as_deref(), self.scope(), sizing) {
            (Some("resident"), _, Some(sizing)) => bail!(
                "--budget-covers resident cannot be used with --policy {}: its sizing policy {sizing} \
                 splits the budget between resident pages and the store",
                self.policy
            ),
            (_, _, Some(_)) => "all",
            (Some("all"), "process", None) => bail!(
                "--budget-covers all needs --budget-scope tree (or a sizing policy in --policy, which \
                 splits each process's budget between its resident pages and its store)"
            ),
            (Some(c), _, None) => c,
            // Not yet the default: without --spill, pages the budget has no
            // room for stay resident over it (16 of cli_run's tests at
            // budgets of 8–48M went over it by up to 7×).
            (None, _, None) => "resident",
        })
    }

    /// With the tree scope: the bytes all the stores may use together
    /// (`--store`, or half of RAM; under `--budget-covers all` at most 3/8
    /// of the budget with a next tier, 3/4 without one, so that the rest
    /// stays for resident pages). With a
    /// sizing policy none (0): each process sizes its own store, holding
    /// pages of the shared budget for it.
    fn tree_store_limit(&self) -> anyhow::Result<u64> {
        let sizing = ztier_policy::Spec::parse(&self.policy, ztier_policy::Frontend::Run)
            .map_err(|e| anyhow::anyhow!("--policy: {e}"))?
            .sizing
            .is_some();
        let asked = self.store.unwrap_or(physical_memory() / 2);
        Ok(match self.covers()? {
            _ if sizing => 0,
            // With a next tier, 3/8: what a smaller store no longer
            // holds is read back from the next tier, and a larger resident
            // share takes fewer faults (six suite programs, 0.65–0.97× the
            // wall time at 3/4 with an uncached spill file; see
            // docs/measurements/2026-12-08-store-share.md). Without one,
            // 3/4: what the store cannot take stays resident over the budget.
            "all" if self.spill.is_some() || self.remote.remote.is_some() => asked.min(self.budget / 8 * 3),
            "all" => asked.min(self.budget / 4 * 3),
            _ => asked,
        })
    }

    /// What the budget bounds: `tree` (the default) or `process`.
    pub fn scope(&self) -> &str {
        self.budget_scope.as_deref().unwrap_or("tree")
    }

    /// The defaults of `ztier run` for `cmd` at `budget` with `codec`
    /// (what the demo and `bench pressure` use).
    pub fn defaults(budget: u64, codec: &str, cmd: Vec<OsString>) -> RunArgs {
        RunArgs {
            budget,
            budget_scope: None,
            budget_covers: None,
            codec: codec.into(),
            allocator: "classes".into(),
            store: None,
            policy: ztier_policy::spec::SHIPPED.into(),
            spill: None,
            spill_max: None,
            stats: None,
            pin: "main".into(),
            prefetch: 32,
            spin_us: 0,
            watchdog: 30,
            clean: "verify".into(),
            fault_path: "auto".into(),
            summary: false,
            log: None,
            fault_log: None,
            remote: Default::default(),
            cmd,
        }
    }
}

/// Writes the embedded library to a per-user cache folder (once per
/// content) and returns its path.
pub fn preload_path() -> Result<PathBuf> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    PRELOAD.hash(&mut h);
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let dir = std::env::temp_dir().join(format!("ztier-{uid}"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let meta = std::fs::symlink_metadata(&dir)?;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if meta.uid() != uid || !meta.is_dir() {
        bail!("{} is not a folder owned by this user; set TMPDIR elsewhere", dir.display());
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    let path = dir.join(format!("libztier_preload-{:016x}.so", h.finish()));
    if std::fs::metadata(&path).map(|m| m.len() as usize == PRELOAD.len()).unwrap_or(false) {
        // Marked as used now, so the pruning below spares it.
        let _ = std::fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(std::time::SystemTime::now()));
    } else {
        let tmp = dir.join(format!(".preload-{}.tmp", std::process::id()));
        std::fs::write(&tmp, PRELOAD).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path)?;
    }
    prune_preloads(&dir, &path, std::time::Duration::from_secs(7 * 24 * 3600));
    Ok(path)
}

/// Removes the libraries other builds of `ztier` left in `dir` that no
/// `ztier run` has used for `age` (a program still running keeps its
/// mapping of a removed file; only a run starting with that very old
/// build at this moment could miss it).
fn prune_preloads(dir: &Path, keep: &Path, age: std::time::Duration) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        if p == keep || !name.starts_with("libztier_preload-") || !name.ends_with(".so") {
            continue;
        }
        let old = e.metadata().and_then(|m| m.modified()).is_ok_and(|t| t.elapsed().is_ok_and(|a| a > age));
        if old {
            let _ = std::fs::remove_file(&p);
        }
    }
}

static CHILD: AtomicI32 = AtomicI32::new(0);

/// SIGINT, SIGTERM and SIGHUP caught for the guard's life: each sets
/// [`interrupted`], is noted for [`take_signal`] and is passed on to the
/// program being [`measure`]d, if any (a command ztier hold starts gets
/// them from its own loop instead, all but SIGINT). The dispositions
/// before are put back when it is dropped (so one made inside another's
/// life leaves the outer one's). A command started meanwhile gets the
/// default actions back at its `exec`.
pub struct CatchSignals([libc::sighandler_t; 3]);

const CAUGHT: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

impl CatchSignals {
    /// Catches SIGINT, SIGTERM and SIGHUP until dropped.
    pub fn new() -> CatchSignals {
        // SAFETY: installing an async-signal-safe handler.
        CatchSignals(
            CAUGHT.map(|sig| unsafe { libc::signal(sig, forward as *const () as libc::sighandler_t) }),
        )
    }
}

impl Default for CatchSignals {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for CatchSignals {
    fn drop(&mut self) {
        for (sig, old) in CAUGHT.into_iter().zip(self.0) {
            // SAFETY: putting back the disposition `new` found.
            unsafe { libc::signal(sig, old) };
        }
    }
}

extern "C" fn forward(sig: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
    PENDING.store(sig, Ordering::Relaxed);
    let pid = CHILD.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe; pid is our child.
        unsafe { libc::kill(pid, sig) };
    }
}

/// The smallest `--budget` (bytes).
pub const MIN_BUDGET: u64 = 1 << 20;

/// Everything `ztier run` produced.
pub struct RunOutcome {
    /// Exit code to pass on (128 + signal if the program was killed).
    pub code: i32,
    /// The merged statistics.
    pub stats: Value,
    /// Killed at the timeout given to [`run_program`].
    pub timed_out: bool,
}

/// Runs `a.cmd` under the budget; the program's stdout goes to `stdout`
/// (inherited when `None`), its stderr is inherited. After `timeout` the
/// program is killed (see [`measure_with_timeout`]).
pub fn run_program(
    a: &RunArgs,
    stdout: Option<std::fs::File>,
    timeout: Option<std::time::Duration>,
) -> Result<RunOutcome> {
    let codec: ztier_codec::CodecId = a.codec.parse().map_err(|e| anyhow::anyhow!("--codec: {e}"))?;
    let allocator: ztier_store::alloc::AllocatorKind =
        a.allocator.parse().map_err(|e| anyhow::anyhow!("--allocator: {e}"))?;
    if a.budget < MIN_BUDGET {
        bail!("--budget {} is too small (at least 1M)", a.budget);
    }
    let policy = ztier_policy::Spec::parse(&a.policy, ztier_policy::Frontend::Run)
        .map_err(|e| anyhow::anyhow!("--policy: {e}"))?;
    if let Some(sizing) = &policy.sizing {
        if a.spill.is_none() {
            bail!(
                "--policy {}: the sizing policy {sizing} needs --spill DIR: pages beyond the store's share \
                 of the budget go there",
                a.policy
            );
        }
        if a.store.is_some() {
            bail!(
                "--policy {}: the sizing policy {sizing} sizes the store: --store cannot be given",
                a.policy
            );
        }
    }
    let lib = preload_path()?;
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let stats_dir =
        std::env::temp_dir().join(format!("ztier-{uid}")).join(format!("run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&stats_dir);
    std::fs::create_dir_all(&stats_dir)?;
    let _cleanup = crate::scratch::TempDir::adopt(stats_dir.clone());
    let mut preload = lib.as_os_str().to_owned();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    // Kept open until the command ends: its processes open it by a path
    // into this process's descriptors.
    let covers = a.covers()?;
    let tree = match a.scope() {
        // With a sizing policy the stores are held as pages of the shared
        // budget already: the segment charges only the pages held.
        "tree" => {
            let t = ztier_uffd::tree::Shared::create(a.budget >> 12, a.tree_store_limit()?)
                .context("--budget-scope tree")?;
            Some(if covers == "all" && policy.sizing.is_none() { t.covering_all() } else { t })
        }
        _ => None,
    };
    let mut cmd = std::process::Command::new(&a.cmd[0]);
    match &tree {
        Some(t) => cmd.env(env::TREE, t.path()),
        None => cmd.env_remove(env::TREE),
    };
    cmd.args(&a.cmd[1..])
        .env("LD_PRELOAD", preload)
        .env(env::BUDGET, a.budget.to_string())
        .env(env::CODEC, format!("{codec}"))
        .env(env::ALLOCATOR, allocator.name())
        .env(env::STATS_DIR, &stats_dir)
        .env(env::PIN, &a.pin)
        .env(env::PREFETCH, a.prefetch.to_string())
        .env(env::SPIN_US, a.spin_us.to_string())
        .env(env::WATCHDOG_S, a.watchdog.to_string())
        .env(env::CLEAN, &a.clean)
        .env(env::FAULT_PATH, &a.fault_path)
        .env(env::CPUS, allowed_cpus());
    if let Some(s) = a.store {
        cmd.env(env::STORE, s.to_string());
    }
    cmd.env(env::POLICY, &a.policy);
    let mut spill = None;
    if let Some(d) = &a.spill {
        if !d.is_dir() {
            bail!("--spill {}: not a folder", d.display());
        }
        // Absolute: the program (or a child it starts elsewhere) may
        // change its working folder before its library starts.
        let d = std::fs::canonicalize(d).with_context(|| format!("--spill {}", d.display()))?;
        // Each process makes its spill file there when it starts: a folder
        // it cannot write in is said now, not as an abort of the program.
        let probe = d.join(format!(".ztier-probe-{}", std::process::id()));
        std::fs::File::create(&probe)
            .with_context(|| format!("--spill {}: cannot make a spill file there", d.display()))?;
        let _ = std::fs::remove_file(&probe);
        spill = Some(d);
    }
    // With --remote the spill file is the remote's fallback, in this
    // process (the remote tier's proxy, checked and started here).
    let proxy = a.remote.start(spill.clone().map(|d| (d, a.spill_max.unwrap_or(u64::MAX))))?;
    match &proxy {
        Some(p) => {
            for (k, v) in p.env() {
                cmd.env(k, v);
            }
            // The program's first process pins its fault handler where
            // the server's replies arrive (its children keep their pick),
            // if the server stays there.
            match p.server_cpu().filter(|c| c.worth_following()) {
                Some(c) => cmd.env(env::SERVER_CPU, format!("{}@{}", c.cpu, std::process::id())),
                None => cmd.env_remove(env::SERVER_CPU),
            };
        }
        None => {
            for k in [env::REMOTE_SOCKET, env::REMOTE_TOKEN, env::SERVER_CPU] {
                cmd.env_remove(k);
            }
            if let Some(d) = spill {
                cmd.env(env::SPILL_DIR, d);
            }
        }
    }
    if let Some(m) = a.spill_max {
        cmd.env(env::SPILL_MAX, m.to_string());
    }
    if let Some(d) = &a.fault_log {
        if d.exists() && !d.is_dir() {
            bail!("--fault-log {}: not a folder", d.display());
        }
        std::fs::create_dir_all(d).with_context(|| format!("--fault-log {}", d.display()))?;
        // Absolute: the program may change its working folder.
        let d = std::fs::canonicalize(d).with_context(|| format!("--fault-log {}", d.display()))?;
        cmd.env(env::FAULT_LOG_DIR, d);
    } else {
        cmd.env_remove(env::FAULT_LOG_DIR);
    }
    // The processes' notices: into --log FILE, or a file of the run's
    // folder read back into the statistics; with `--log -`, stderr.
    let log = match a.log.as_deref() {
        Some(p) if p == Path::new("-") => None,
        Some(p) => {
            let f = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(p)
                .with_context(|| format!("--log {}: cannot write there", p.display()))?;
            // Absolute: the program may change its working folder.
            Some((std::path::absolute(p)?, f.metadata()?.len()))
        }
        None => Some((stats_dir.join("notices.log"), 0)),
    };
    match &log {
        Some((p, _)) => cmd.env(env::LOG, p),
        None => cmd.env_remove(env::LOG),
    };
    if let Some(f) = stdout {
        cmd.stdout(f);
    }
    let m = measure_with_timeout(&mut cmd, timeout)?;
    let code = m.code;
    let mut stats = merge_stats(&stats_dir, m.pid)?;
    if let Some(p) = proxy {
        crate::remote_args::end(p, &mut stats);
    }
    stats[merged::WALL_S] = m.wall_s.into();
    stats[merged::EXIT_CODE] = code.into();
    stats[merged::PEAK_RSS_BYTES] = m.maxrss.into();
    stats[merged::MAJOR_FAULTS] = m.majflt.into();
    stats[merged::CPU_S] = m.cpu_s.into();
    stats[stats::BUDGET_BYTES] = a.budget.into();
    stats[stats::FAULT_PATH] = taken_fault_path(&stats, &a.fault_path).into();
    stats[merged::BUDGET_SCOPE] = a.scope().into();
    stats[merged::BUDGET_COVERS] = covers.into();
    if let Some((p, from)) = &log {
        stats[merged::NOTICES] = read_notices(p, *from).into();
    }
    if let Some(t) = &tree {
        let seg = t.segment();
        let bytes = |v: &std::sync::atomic::AtomicU64| v.load(std::sync::atomic::Ordering::Acquire) << 12;
        stats[merged::TREE_PEAK_HELD_BYTES] = bytes(&seg.peak).into();
        stats[merged::TREE_OVER_BYTES] = bytes(&seg.over).into();
        stats[merged::TREE_RECLAIMED_BYTES] = bytes(&seg.reclaimed).into();
        stats[merged::TREE_ADOPTED_BYTES] = bytes(&seg.adopted).into();
        stats[merged::TREE_STORE_PEAK_BYTES] =
            seg.store_peak.load(std::sync::atomic::Ordering::Acquire).into();
        stats[merged::TREE_STORE_LIMIT_BYTES] = seg.store_limit.into();
        // Everything the library held for the command at its most:
        // resident pages held, the stores and the tables (what
        // `--budget-covers all` bounds).
        stats[merged::TREE_PEAK_TOTAL_BYTES] =
            seg.total_peak.load(std::sync::atomic::Ordering::Acquire).into();
        stats[merged::TREE_PROCESSES] = seg.joined.load(std::sync::atomic::Ordering::Acquire).into();
    }
    Ok(RunOutcome { code, stats, timed_out: m.timed_out })
}

/// The notices the processes wrote into the log `path` from byte `from`
/// on (where the file ended when the run began), a line each.
fn read_notices(path: &Path, from: u64) -> Vec<String> {
    use std::io::Seek;
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        if f.seek(std::io::SeekFrom::Start(from)).is_ok() {
            let mut bytes = Vec::new();
            let _ = f.read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
    }
    text.lines().map(str::to_owned).collect()
}

/// Says `msg`, a notice of ztier's own about the run (see `--log`): on
/// stderr with `--log -`, else appended to the --log file, and among the
/// statistics' notices.
pub fn say_notice(a: &RunArgs, stats: Option<&mut Value>, msg: String) {
    match a.log.as_deref() {
        Some(p) if p == Path::new("-") => eprintln!("{msg}"),
        Some(p) => {
            let _ = std::fs::OpenOptions::new().append(true).open(p).and_then(|mut f| writeln!(f, "{msg}"));
        }
        None => {}
    }
    if let Some(Value::Array(n)) = stats.and_then(|s| s.get_mut(merged::NOTICES)) {
        n.push(msg.into());
    }
}

/// The fault path the command's processes took (a program with a
/// `malloc` of its own takes `signal` whatever was asked): the one they
/// all took, `mixed`, or `asked` if no process wrote statistics.
fn taken_fault_path(stats: &Value, asked: &str) -> String {
    let mut taken = stats[stats::PER_PROCESS]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p[stats::FAULT_PATH].as_str());
    match taken.next() {
        None => asked.into(),
        Some(first) if taken.all(|p| p == first) => first.into(),
        Some(_) => "mixed".into(),
    }
}

/// Why the program `cmd` (a path, or a name looked up in `PATH`) cannot
/// load ztier's library, if its file says so: a statically linked ELF
/// executable has no dynamic linker to read `LD_PRELOAD`. A script is
/// judged by its interpreter (`#!`, as the kernel follows it: a few
/// levels). `None` when it can (or the file cannot be read: the
/// program's start will say why).
pub fn out_of_reach(cmd: &std::ffi::OsStr) -> Option<String> {
    out_of_reach_at(cmd, 0)
}

fn out_of_reach_at(cmd: &std::ffi::OsStr, depth: u32) -> Option<String> {
    let path = if cmd.as_encoded_bytes().contains(&b'/') { PathBuf::from(cmd) } else { in_path(cmd)? };
    // The ELF header and its program headers, which follow it in every
    // linker's output, lie in the first 64 KiB; a `#!` line too.
    let mut head = Vec::new();
    std::fs::File::open(&path).and_then(|f| f.take(64 << 10).read_to_end(&mut head)).ok()?;
    if head.starts_with(b"#!") && depth < 4 {
        let line = head[2..].split(|&c| c == b'\n').next()?;
        let interp = line.split(|&c| c == b' ' || c == b'\t').find(|t| !t.is_empty())?;
        return out_of_reach_at(std::ffi::OsStr::from_bytes(interp), depth + 1)
            .map(|why| format!("{why} (the interpreter of {})", path.display()));
    }
    // The dynamic linker run as a command (`ld-linux-x86-64.so.2 PROG`)
    // has no PT_INTERP of its own, and reads LD_PRELOAD for PROG.
    let name = path.file_name().map(|n| n.as_encoded_bytes()).unwrap_or_default();
    if head.starts_with(b"\x7fELF") && !name.starts_with(b"ld-linux") && !name.starts_with(b"ld.so") {
        return (static_elf_executable(&head) == Some(true))
            .then(|| format!("{} is statically linked", path.display()));
    }
    None
}

/// Is this 64-bit little-endian ELF file an executable (`ET_EXEC`, or
/// `ET_DYN`: a PIE, static or not) with no `PT_INTERP` program header,
/// so that no dynamic linker runs for it? `None` if it is not such a
/// file, or its program headers lie past the bytes given.
fn static_elf_executable(b: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    if b.get(4) != Some(&2) || b.get(5) != Some(&1) {
        return None;
    }
    let u16_at = |o: usize| Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?));
    let (phoff, phentsize, phnum) = (u64_at(0x20)? as usize, u16_at(0x36)? as usize, u16_at(0x38)? as usize);
    let types: Vec<u32> = (0..phnum).map(|k| u32_at(phoff + k * phentsize)).collect::<Option<_>>()?;
    Some(matches!(u16_at(16)?, 2 | 3) && !types.contains(&PT_INTERP))
}

/// What one measured child run gave.
pub struct Measured {
    /// Exit code (128 + signal if killed).
    pub code: i32,
    /// Wall time.
    pub wall_s: f64,
    /// Peak RSS of the largest process of the program's tree (each one's
    /// VmHWM, sampled every 20 ms; wait4's figure where that is higher and
    /// above ztier's own peak: see `peak_rss`).
    pub maxrss: u64,
    /// Major faults of the child and its waited-for descendants.
    pub majflt: u64,
    /// CPU time (user + system, seconds) of the child and its waited-for
    /// descendants, every thread included (wait4). Work the kernel does
    /// in its own threads (kswapd, for instance) is not in it.
    pub cpu_s: f64,
    /// Killed after the timeout.
    pub timed_out: bool,
    /// The PID of the process started (the program's first).
    pub pid: u32,
}

/// The peak RSS of process `pid` (`"self"` for ztier's own), from
/// `/proc/PID/status` (`VmHWM`); `None` once it has no memory map.
fn vm_hwm(pid: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = s.lines().find_map(|l| l.strip_prefix("VmHWM:"))?;
    Some(kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok()? * 1024)
}

/// The program's peak RSS, from the tree's `VmHWM` sampled every 20 ms
/// (`sampled`) and wait4's `ru_maxrss`. A sample can miss a peak: a
/// statically linked program that filled 48 MB and exited between two
/// samples was reported at under 1 MiB, below the budget, so `ztier run`
/// did not warn that the budget had not held (CI saw it once). But
/// `ru_maxrss` counts ztier's own memory too, which the child shared
/// until its exec; so it counts only where it is above ztier's own peak
/// (`own`): then the program's tree went that high.
fn peak_rss(sampled: u64, ru_maxrss: u64, own: u64) -> u64 {
    if sampled == 0 || ru_maxrss > own {
        sampled.max(ru_maxrss)
    } else {
        sampled
    }
}

/// The largest VmHWM (bytes) among `pid` and its descendants now (found
/// through `/proc/PID/task/TID/children`; at most 4096 processes).
fn tree_hwm(pid: u32) -> u64 {
    let mut todo = vec![pid];
    let (mut seen, mut max) = (0, 0);
    while let Some(p) = todo.pop() {
        seen += 1;
        if seen > 4096 {
            break;
        }
        if let Some(b) = vm_hwm(&p.to_string()) {
            max = max.max(b);
        }
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else { continue };
        for t in tasks.flatten() {
            if let Ok(c) = std::fs::read_to_string(t.path().join("children")) {
                todo.extend(c.split_whitespace().filter_map(|x| x.parse::<u32>().ok()));
            }
        }
    }
    max
}

/// Runs `cmd`, forwarding SIGINT/SIGTERM/SIGHUP to it, and measures it
/// with wait4. [`interrupted`] tells afterwards whether a signal came.
pub fn measure(cmd: &mut std::process::Command) -> Result<Measured> {
    measure_with_timeout(cmd, None)
}

/// As [`measure`]; after `timeout` the program is killed (SIGKILL, by pid)
/// and `timed_out` is set.
pub fn measure_with_timeout(
    cmd: &mut std::process::Command,
    timeout: Option<std::time::Duration>,
) -> Result<Measured> {
    let t = std::time::Instant::now();
    let child = cmd.spawn().with_context(|| format!("starting {}", cmd.get_program().to_string_lossy()))?;
    let pid = child.id() as i32;
    // Peak RSS from the mm of each process of the program's tree (VmHWM),
    // sampled while it runs: wait4's ru_maxrss also counts the parent's
    // memory, which a spawned child shares until exec. The tree, not just
    // the child: the child may be a shell or a driver (`sh -c 'a | b'`,
    // `make`, `gcc`) whose own memory says nothing.
    let hwm = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    // Told to stop through a channel, so that it ends at once when the
    // program does (a sleep would add up to 20 ms to every run).
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let sampler = {
        let hwm = hwm.clone();
        std::thread::spawn(move || loop {
            hwm.fetch_max(tree_hwm(pid as u32), Ordering::Relaxed);
            if stop_rx.recv_timeout(std::time::Duration::from_millis(20))
                != Err(std::sync::mpsc::RecvTimeoutError::Timeout)
            {
                break;
            }
        })
    };
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let killed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watchdog = timeout.map(|d| {
        let killed = killed.clone();
        std::thread::spawn(move || {
            if done_rx.recv_timeout(d) == Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                killed.store(true, Ordering::Relaxed);
                // SAFETY: killing our own child, not yet reaped (the main
                // thread reaps it only after this thread is told or ends).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        })
    });
    CHILD.store(pid, Ordering::Relaxed);
    let caught = CatchSignals::new();
    let mut status = 0;
    // SAFETY: a zeroed rusage for wait4 to fill.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: waiting for our own child into live out-parameters.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        if r == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e).context("waiting for the program");
        }
    }
    let wall_s = t.elapsed().as_secs_f64();
    CHILD.store(0, Ordering::Relaxed);
    drop(stop_tx);
    let _ = sampler.join();
    drop(done_tx);
    if let Some(w) = watchdog {
        let _ = w.join();
    }
    drop(caught);
    let code = if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { 128 + libc::WTERMSIG(status) };
    Ok(Measured {
        code,
        wall_s,
        pid: pid as u32,
        maxrss: peak_rss(
            hwm.load(Ordering::Relaxed),
            ru.ru_maxrss as u64 * 1024,
            vm_hwm("self").unwrap_or(u64::MAX),
        ),
        majflt: ru.ru_majflt as u64,
        cpu_s: [ru.ru_utime, ru.ru_stime].iter().map(|t| t.tv_sec as f64 + t.tv_usec as f64 / 1e6).sum(),
        timed_out: killed.load(Ordering::Relaxed),
    })
}

/// Did a SIGINT/SIGTERM/SIGHUP arrive during a [`measure`] (or while a
/// [`CatchSignals`] lived)?
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The last of SIGINT, SIGTERM, SIGHUP that a [`CatchSignals`] caught and
/// [`take_signal`] has not taken yet (0: none).
static PENDING: AtomicI32 = AtomicI32::new(0);

/// The last signal a [`CatchSignals`] caught since the last call (0:
/// none), taken.
pub fn take_signal() -> libc::c_int {
    PENDING.swap(0, Ordering::Relaxed)
}

/// Has a [`CatchSignals`] caught a signal [`take_signal`] has not taken?
pub fn signal_pending() -> bool {
    PENDING.load(Ordering::Relaxed) != 0
}

/// Bytes of RAM (the library's default `--store` is half of it).
fn physical_memory() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let (pages, size) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    pages.max(1) as u64 * size.max(1) as u64
}

fn allowed_cpus() -> String {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above, for this thread.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return String::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: reading a filled set.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Mean of a merged histogram keyed by bucket upper bound (ns), in µs,
/// each bucket counted at its middle (100 ns wide up to 100 µs, 10 µs
/// wide above), rounded to 0.1 µs.
fn mean_us(hist: &std::collections::BTreeMap<u64, u64>) -> f64 {
    let total: u64 = hist.values().sum();
    if total == 0 {
        return 0.0;
    }
    let sum: f64 = hist
        .iter()
        .map(|(&b, &c)| {
            let width = if b <= 100_000 { 100.0 } else { 10_000.0 };
            (b as f64 - width / 2.0) * c as f64
        })
        .sum();
    (sum / total as f64 / 100.0).round() / 10.0
}

/// Quantile (0..1) of a merged histogram keyed by bucket upper bound (ns), in µs.
fn quantile(hist: &std::collections::BTreeMap<u64, u64>, q: f64) -> f64 {
    let total: u64 = hist.values().sum();
    if total == 0 {
        return 0.0;
    }
    let want = ((total as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (&b, &c) in hist {
        seen += c;
        if seen >= want {
            return b as f64 / 1000.0;
        }
    }
    0.0
}

/// Merges the `PID.json` (or `PID-N.json`) files of every process:
/// counters summed, the
/// latency histograms merged, peaks as the largest.
/// `per_process` lists `first` (the process `ztier run` started) first,
/// then the others by PID (PIDs wrap: a child's may be lower).
pub fn merge_stats(dir: &Path, first: u32) -> Result<Value> {
    let mut per = Vec::new();
    let mut hist = std::collections::BTreeMap::<u64, u64>::new();
    let sum_keys = stats::SUMMED;
    let mut sums = vec![0u64; sum_keys.len()];
    let mut peak = 0u64;
    for e in std::fs::read_dir(dir)? {
        let path = e?.path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        if text.is_empty() {
            // Opened when the process started, never written: it ended
            // without its exit handlers (a signal, `_exit`).
            continue;
        }
        let v: Value = serde_json::from_str(&text)
            .with_context(|| format!("statistics {} are not JSON", path.display()))?;
        for (k, s) in sum_keys.iter().zip(sums.iter_mut()) {
            *s += v[*k].as_u64().unwrap_or(0);
        }
        peak = peak.max(v[stats::PEAK_RESIDENT_BYTES].as_u64().unwrap_or(0));
        if let Some(h) = v[stats::LATENCY_NS].as_array() {
            for pair in h {
                if let (Some(b), Some(c)) = (pair[0].as_u64(), pair[1].as_u64()) {
                    *hist.entry(b).or_default() += c;
                }
            }
        }
        per.push(v);
    }
    per.sort_by_key(|v| {
        let pid = v[stats::PID].as_u64();
        (pid != Some(u64::from(first)), pid)
    });
    let mut out = serde_json::Map::new();
    for (k, s) in sum_keys.iter().zip(&sums) {
        match k.strip_suffix("_ns") {
            // Seconds in the merged file: `fault_service_s` and its parts.
            Some(name) => out.insert(format!("{name}_s"), (*s as f64 / 1e9).into()),
            None => out.insert(k.to_string(), (*s).into()),
        };
    }
    out.insert(stats::FAULT_P50_US.into(), quantile(&hist, 0.5).into());
    out.insert(stats::FAULT_P99_US.into(), quantile(&hist, 0.99).into());
    out.insert(merged::FAULT_MEAN_US.into(), mean_us(&hist).into());
    // The histogram itself, merged: `[bucket upper bound in ns, count]`
    // pairs of the buckets that counted any fault, in order.
    out.insert(stats::LATENCY_NS.into(), hist.iter().map(|(&b, &c)| serde_json::json!([b, c])).collect());
    out.insert(stats::PEAK_RESIDENT_BYTES.into(), peak.into());
    out.insert(merged::PROCESSES.into(), per.len().into());
    out.insert(stats::PER_PROCESS.into(), Value::Array(per));
    Ok(Value::Object(out))
}

/// `v` as indented JSON, except that an array inside an array is written
/// on one line: the latency histograms' `[bound, count]` pairs take a
/// line each instead of four.
pub fn pretty(v: &Value) -> Result<String> {
    use serde_json::ser::{CompactFormatter, Formatter, PrettyFormatter};
    use std::io::{Result as IoResult, Write};
    /// Indents like `PrettyFormatter` until an array opens inside an
    /// array; from there to that array's end, writes like
    /// `CompactFormatter`.
    struct Pairs<'a> {
        pretty: PrettyFormatter<'a>,
        /// Whether each open container is an array.
        open: Vec<bool>,
        /// `open`'s length when the compact stretch began.
        compact_from: Option<usize>,
    }
    impl Pairs<'_> {
        fn compact(&self) -> bool {
            self.compact_from.is_some()
        }
    }
    macro_rules! either {
        ($self:ident, $w:ident, $m:ident $(, $arg:expr)*) => {
            if $self.compact() { CompactFormatter.$m($w $(, $arg)*) } else { $self.pretty.$m($w $(, $arg)*) }
        };
    }
    impl Formatter for Pairs<'_> {
        fn begin_array<W: ?Sized + Write>(&mut self, w: &mut W) -> IoResult<()> {
            if self.compact_from.is_none() && self.open.last() == Some(&true) {
                self.compact_from = Some(self.open.len());
            }
            self.open.push(true);
            either!(self, w, begin_array)
        }
        fn end_array<W: ?Sized + Write>(&mut self, w: &mut W) -> IoResult<()> {
            let r = either!(self, w, end_array);
            self.open.pop();
            if self.compact_from == Some(self.open.len()) {
                self.compact_from = None;
            }
            r
        }
        fn begin_array_value<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> IoResult<()> {
            either!(self, w, begin_array_value, first)
        }
        fn end_array_value<W: ?Sized + Write>(&mut self, w: &mut W) -> IoResult<()> {
            either!(self, w, end_array_value)
        }
        fn begin_object<W: ?Sized + Write>(&mut self, w: &mut W) -> IoResult<()> {
            self.open.push(false);
            either!(self, w, begin_object)
        }
        fn end_object<W: ?Sized + Write>(&mut self, w: &mut W) -> IoResult<()> {
            let r = either!(self, w, end_object);
            self.open.pop();
            r
        }
        fn begin_object_key<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> IoResult<()> {
            either!(self, w, begin_object_key, first)
        }
        fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> IoResult<()> {
            either!(self, w, begin_object_value)
        }
        fn end_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> IoResult<()> {
            either!(self, w, end_object_value)
        }
    }
    let mut out = Vec::new();
    let f = Pairs { pretty: PrettyFormatter::new(), open: Vec::new(), compact_from: None };
    let mut ser = serde_json::Serializer::with_formatter(&mut out, f);
    serde::Serialize::serialize(v, &mut ser)?;
    Ok(String::from_utf8(out)?)
}

/// The parts of the fault handler's service time, in words: `lock wait
/// A s, store reads B s, installs C s, the rest D s`.
pub fn service_parts(service: f64, lock: f64, read: f64, install: f64) -> String {
    format!(
        "lock wait {lock:.2} s, store reads {read:.2} s, installs {install:.2} s, the rest {:.2} s",
        (service - lock - read - install).max(0.0)
    )
}

/// Can `cmd` be run, as a shell would look for it? `Err` with the exit
/// status a shell gives, said on stderr the way a shell says it: 127 for
/// a command not found, 126 for one found but not executable (it was 1,
/// "starting CMD: No such file or directory").
pub fn runnable(cmd: &std::ffi::OsStr) -> std::result::Result<(), i32> {
    let shown = cmd.to_string_lossy();
    if cmd.as_encoded_bytes().contains(&b'/') {
        let p = Path::new(cmd);
        return match p.metadata() {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                eprintln!("ztier: {shown}: no such file");
                Err(127)
            }
            Ok(m) if m.is_dir() => {
                eprintln!("ztier: {shown}: is a folder");
                Err(126)
            }
            // Root runs what has any execute bit; others are told by exec.
            _ if !executable(p) => {
                eprintln!("ztier: {shown}: not executable");
                Err(126)
            }
            _ => Ok(()),
        };
    }
    if in_path(cmd).is_some() {
        return Ok(());
    }
    eprintln!("ztier: {shown}: command not found");
    Err(127)
}

/// Is `p` a file with an execute bit?
fn executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The executable file `cmd` (a name without `/`) names in `PATH`, as a
/// shell finds it.
fn in_path(cmd: &std::ffi::OsStr) -> Option<PathBuf> {
    let dirs = std::env::var_os("PATH")?;
    std::env::split_paths(&dirs).map(|d| d.join(cmd)).find(|p| executable(p))
}

/// The type of the file system `path` is on (`statfs`'s `f_type`).
pub fn fs_type(path: &Path) -> Option<libc::c_long> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: a zeroed statfs for the call to fill.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a live out-parameter.
    (unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0).then_some(st.f_type)
}

/// Is `path` in `/proc` or `/sys`, whose files take no statistics (a
/// write there fails at the end, or changes a setting)?
pub fn in_proc_or_sys(path: &Path) -> bool {
    let at = if path.exists() {
        path
    } else {
        path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
    };
    matches!(fs_type(at), Some(libc::PROC_SUPER_MAGIC | libc::SYSFS_MAGIC))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under `--budget-covers all` the stores may take 3/8 of the budget
    /// with a next tier (what they cannot hold is read back from it) and
    /// 3/4 without one; `--store` lowers either; a sizing policy sizes
    /// each store itself.
    #[test]
    fn the_stores_share_of_the_budget_depends_on_a_next_tier() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            run: RunArgs,
        }
        let parse = |v: &[&str]| <Cli as clap::Parser>::try_parse_from(v).unwrap().run;
        let args = |extra: &[&str]| {
            let mut v = vec!["run", "--budget", "24M", "--budget-covers", "all"];
            v.extend_from_slice(extra);
            v.extend_from_slice(&["--", "true"]);
            parse(&v)
        };
        assert_eq!(args(&[]).tree_store_limit().unwrap(), 18 << 20);
        assert_eq!(args(&["--spill", "/var/tmp"]).tree_store_limit().unwrap(), 9 << 20);
        assert_eq!(args(&["--remote", "redis://127.0.0.1:1"]).tree_store_limit().unwrap(), 9 << 20);
        assert_eq!(args(&["--spill", "/var/tmp", "--store", "4M"]).tree_store_limit().unwrap(), 4 << 20);
        assert_eq!(args(&["--store", "4M"]).tree_store_limit().unwrap(), 4 << 20);
        let sized = parse(&[
            "run",
            "--budget",
            "24M",
            "--policy",
            "segmented+walk+kaplan",
            "--spill",
            "/var/tmp",
            "--",
            "true",
        ]);
        assert_eq!(sized.tree_store_limit().unwrap(), 0);
    }

    #[test]
    fn pretty_json_puts_each_pair_on_a_line() {
        let v = serde_json::json!({
            "faults": 3,
            "latency_ns": [[1700, 2], [250000, 1]],
            "per_process": [{ "latency_ns": [[1700, 2]], "tags": [1, 2] }],
        });
        let want = "{\n  \"faults\": 3,\n  \"latency_ns\": [\n    [1700,2],\n    [250000,1]\n  ],\n  \
                    \"per_process\": [\n    {\n      \"latency_ns\": [\n        [1700,2]\n      ],\n      \
                    \"tags\": [\n        1,\n        2\n      ]\n    }\n  ]\n}";
        let got = pretty(&v).unwrap();
        assert_eq!(got, want, "got:\n{got}");
        assert_eq!(serde_json::from_str::<Value>(&got).unwrap(), v);
    }

    #[test]
    fn a_peak_the_samples_missed_is_taken_from_wait4_when_it_is_the_programs() {
        let mib = |n: u64| n << 20;
        // The samples saw 3 MiB; wait4 says 50, above ztier's own 12.
        assert_eq!(peak_rss(mib(3), mib(50), mib(12)), mib(50));
        // wait4's figure is no higher than ztier's own peak: it may be
        // ztier's memory, shared until exec, so the samples stand.
        assert_eq!(peak_rss(mib(3), mib(10), mib(12)), mib(3));
        // No sample at all: wait4's figure is all there is.
        assert_eq!(peak_rss(0, mib(10), mib(12)), mib(10));
        // The samples saw more than wait4 says: they stand.
        assert_eq!(peak_rss(mib(96), mib(50), mib(12)), mib(96));
        assert!(vm_hwm("self").is_some_and(|b| b > 0));
    }

    #[test]
    fn peak_rss_is_the_largest_process_of_the_tree() {
        // A shell whose grandchild (a pipeline stage) holds 96 MiB: the
        // figure is that process's, not the shell's few megabytes.
        let mut c = std::process::Command::new("sh");
        c.args([
            "-c",
            "python3 -c 'import time; b = bytearray(96 << 20); b[::4096] = b\"x\" * (len(b) // 4096); \
             time.sleep(0.3)' | cat",
        ]);
        let m = measure(&mut c).unwrap();
        assert_eq!(m.code, 0);
        assert!(m.maxrss >= 96 << 20, "peak RSS {} bytes", m.maxrss);
    }

    #[test]
    fn cpu_time_counts_the_children_and_not_the_sleep() {
        // A shell whose child spins ~0.4 s on the CPU, then sleeps 0.4 s.
        let mut c = std::process::Command::new("sh");
        c.args([
            "-c",
            "python3 -c 'import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass' \
             && sleep 0.4",
        ]);
        let m = measure(&mut c).unwrap();
        assert_eq!(m.code, 0);
        assert!(m.cpu_s >= 0.4, "CPU {} s", m.cpu_s);
        assert!(m.cpu_s < m.wall_s - 0.3, "CPU {} s of {} s wall, 0.4 s of it asleep", m.cpu_s, m.wall_s);
    }

    #[test]
    fn fault_mean_counts_each_bucket_at_its_middle() {
        let mut h = std::collections::BTreeMap::new();
        assert_eq!(mean_us(&h), 0.0);
        // 3 faults in [5.0, 5.1) µs and one in [190, 200) µs.
        h.insert(5_100, 3);
        h.insert(200_000, 1);
        assert_eq!(mean_us(&h), ((5.05 * 3.0 + 195.0) / 4.0 * 10.0f64).round() / 10.0);
        assert_eq!(quantile(&h, 0.5), 5.1);
    }

    #[test]
    fn old_preload_libraries_are_pruned_and_the_current_one_kept() {
        let dir = std::env::temp_dir().join(format!("ztier-prune-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let week_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(8 * 24 * 3600);
        let make = |name: &str, old: bool| {
            let p = dir.join(name);
            let f = std::fs::File::create(&p).unwrap();
            if old {
                f.set_modified(week_ago).unwrap();
            }
            p
        };
        let stale = make("libztier_preload-00000000000000aa.so", true);
        let recent = make("libztier_preload-00000000000000bb.so", false);
        let current = make("libztier_preload-00000000000000cc.so", true);
        let other = make("notes.txt", true);
        prune_preloads(&dir, &current, std::time::Duration::from_secs(7 * 24 * 3600));
        assert!(!stale.exists(), "unused for 8 days: removed");
        assert!(recent.exists() && current.exists() && other.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
