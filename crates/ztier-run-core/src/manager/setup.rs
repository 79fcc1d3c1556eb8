//! What a manager is made of: its settings ([`Config`], [`CleanMode`]),
//! and what it opens at start-up (and again in a forked child): the
//! policies, the userfaultfd and the arena's registration, the fault path,
//! the store and its spill file, the tree budget's segment, the page maps
//! a forked child reads.

use super::*;

/// Settings, from the environment `ztier run` sets.
#[derive(Clone, Debug)]
pub struct Config {
    /// Resident pages allowed.
    pub budget_pages: usize,
    /// Codec of the store.
    pub codec: CodecId,
    /// Allocator of the store's compressed bytes.
    pub allocator: AllocatorKind,
    /// Bytes the store may use in memory.
    pub store_bytes: usize,
    /// Folder for the spill file (`None` = no spill: when the store is
    /// full, pages stay resident).
    pub spill_dir: Option<PathBuf>,
    /// Largest spill file.
    pub spill_bytes: u64,
    /// Folder where each process writes `PID.json` at exit.
    pub stats_dir: Option<PathBuf>,
    /// Sizing policy (`--policy`): the budget is then resident pages and
    /// the store's memory together, split live by the policy.
    pub policy: Option<String>,
}

/// What the sizing policies are told a page costs here: a fault from the
/// spill file (read + decompress), compressing and decompressing a page
/// (this machine's profile of `ztier run` with lz4, rounded).
pub const POLICY_COSTS: ztier_policy::Costs =
    ztier_policy::Costs { disk_ns: 50_000.0, compress_ns: 7_000.0, decompress_ns: 2_000.0 };

/// How a page that came back from the store and still has its stored
/// copy is known to be unchanged when it is evicted again (`ZTIER_CLEAN`,
/// `ztier run --clean`; see the module docs).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum CleanMode {
    /// Copies are dropped on fault; every eviction compresses.
    Off,
    /// The page is installed write-protected; its first write is a fault.
    Wp,
    /// The page is installed writable; at eviction its hash is compared
    /// with its stored copy's.
    Verify,
}

impl CleanMode {
    /// From `ZTIER_CLEAN` (`verify`, `wp` or `off`; unset: `verify`).
    pub fn from_env() -> io::Result<CleanMode> {
        match std::env::var(env::CLEAN).as_deref() {
            Err(_) | Ok("verify") => Ok(CleanMode::Verify),
            Ok("wp") => Ok(CleanMode::Wp),
            Ok("off") => Ok(CleanMode::Off),
            Ok(v) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("ZTIER_CLEAN={v}: expected verify, wp or off"),
            )),
        }
    }
}
/// `/proc/self/pagemap`, kept from the program's `close`
/// (the library's `fds::keep`, [`Host::keep_fd`](crate::host::Host::keep_fd)) until dropped; -1 if it could not be opened.
/// Opened for each look instead, it took the lowest free number, and a
/// child that closes every descriptor it does not know (`forkmany.c`, as
/// a shell's subshell does) closed it under the look: each of those
/// reads failed, and the child took every page it shared with its parent
/// as its own. It could as well have read, and then closed, a file the
/// program opened at that number meanwhile.
pub(super) struct Pagemap(pub(super) i32);

impl Pagemap {
    pub(super) fn open() -> Pagemap {
        Pagemap::open_at(c"/proc/self/pagemap")
    }

    /// The page map of this process's parent.
    pub(super) fn open_parent() -> Pagemap {
        // SAFETY: getppid cannot fail.
        let ppid = unsafe { libc::getppid() };
        match std::ffi::CString::new(format!("/proc/{ppid}/pagemap")) {
            Ok(path) => Pagemap::open_at(&path),
            Err(_) => Pagemap(-1),
        }
    }

    pub(super) fn open_at(path: &std::ffi::CStr) -> Pagemap {
        // SAFETY: a NUL-terminated path.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        Pagemap(if fd >= 0 { (host().keep_fd)(fd) } else { -1 })
    }
}

impl PageMap for Pagemap {
    fn read(&self, map: &mut [u64], first: usize, bytes: usize) -> bool {
        if self.0 < 0 || bytes > map.len() * 8 {
            return false;
        }
        // SAFETY: reading at most `bytes` ≤ 8 × map.len() bytes into `map`.
        let n = unsafe { libc::pread(self.0, map.as_mut_ptr().cast(), bytes, (first * 8) as libc::off_t) };
        n == bytes as isize
    }
}

impl Drop for Pagemap {
    fn drop(&mut self) {
        if self.0 >= 0 {
            (host().forget_fd)(self.0);
            (host().raw)(libc::SYS_close, [self.0 as u64, 0, 0, 0, 0, 0]);
        }
    }
}

/// The replacement, prefetch and sizing policies `spec` names
/// (`ZTIER_POLICY`; unset: the shipped ones) for an arena of `pages`
/// pages and a budget of `budget` pages (resident pages, or resident
/// pages and the store with a sizing policy); `prefetch`: the most stored
/// pages a walk brings in (`ZTIER_PREFETCH`).
pub(super) fn policies(
    spec: Option<&str>,
    pages: usize,
    budget: usize,
    prefetch: usize,
) -> io::Result<Parts> {
    let bad = |e: String| io::Error::new(io::ErrorKind::InvalidInput, format!("ZTIER_POLICY: {e}"));
    let spec =
        ztier_policy::Spec::parse(spec.unwrap_or(ztier_policy::spec::SHIPPED), ztier_policy::Frontend::Run)
            .map_err(bad)?;
    let (bits, stamps) = (Table::<u8>::new(pages)?, Table::<u32>::new(pages)?);
    spec.parts(budget, bits, stamps, prefetch, POLICY_COSTS).map_err(bad)
}

/// Opens a userfaultfd and registers the arena for missing and
/// write-protect faults.
/// `ZTIER_UFFD_USER_MODE_ONLY=1` opens it as an unprivileged user would
/// get it (`UFFD_USER_MODE_ONLY`), also as root: for the tests. The
/// fault path is decided here, once the descriptor says whether it is
/// user-mode-only ([`decide_signal_path`]); on the signal path faults
/// raise `SIGBUS` in the faulting thread (see [`signal_path`]).
pub(super) fn open_uffd(base: usize, len: usize) -> io::Result<Arc<Uffd>> {
    let umo = (host().knob)(env::UFFD_USER_MODE_ONLY).is_some_and(|v| v == "1");
    let mut u = Uffd::open_via(if umo { None } else { uffd_device() }, umo, decide_signal_path)?;
    // Out of the program's way, kept from its `close` (see [`Host::keep_fd`](crate::host::Host::keep_fd)).
    u.move_fd_up((host().low_fd)())?;
    (host().register_fd)(u.raw_fd());
    register_arena(&u, base, len).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("registering the arena with userfaultfd (missing + write-protect): {e}"),
        )
    })?;
    Ok(Arc::new(u))
}

/// Registers the arena `[base, base + len)` for missing and
/// write-protect faults. A process that mapped something else over part
/// of it (a file or shared memory with `MAP_FIXED`; the shim marks such
/// pages never evicted) cannot have it registered whole: the kernel
/// refuses a range with such a mapping in it (`EINVAL`). That happens
/// in a forked child, which registers again: node maps part of its own
/// binary over its code range, which lies in the arena, and every child
/// process it forked aborted here. Then each run of private anonymous
/// mappings (from `/proc/self/maps`) is registered on its own.
pub(super) fn register_arena(u: &Uffd, base: usize, len: usize) -> io::Result<()> {
    const MODE: u64 = REGISTER_MODE_MISSING | REGISTER_MODE_WP;
    match u.register_mode(base, len, MODE) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            let maps = std::fs::read_to_string("/proc/self/maps")?;
            let runs = anonymous_runs(&maps, base, base + len);
            if runs.is_empty() {
                return Err(e);
            }
            for (start, end) in runs {
                u.register_mode(start, end - start, MODE)?;
            }
            Ok(())
        }
        r => r,
    }
}

/// One line of `/proc/PID/maps`: the range `[lo, hi)`, its permissions
/// (`rw-p`), and whether it is private anonymous memory (no file;
/// `named`: `PR_SET_VMA_ANON_NAME`'s `[anon:...]` names count too, else
/// only unnamed memory does).
pub struct MapsLine<'a> {
    /// First address.
    pub lo: usize,
    /// Address past the end.
    pub hi: usize,
    /// Permissions, as `rw-p`.
    pub perms: &'a str,
    /// Private anonymous memory.
    pub anonymous: bool,
}

impl<'a> MapsLine<'a> {
    /// The line's fields; `None` if it is not one of `maps`.
    pub fn parse(line: &'a str, named: bool) -> Option<MapsLine<'a>> {
        let mut f = line.split_whitespace();
        let (range, perms, _off, _dev, inode) = (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
        let (lo, hi) = range.split_once('-')?;
        let (lo, hi) = (usize::from_str_radix(lo, 16).ok()?, usize::from_str_radix(hi, 16).ok()?);
        let unnamed_or = match f.next() {
            None => true,
            Some(path) => named && path.starts_with("[anon:"),
        };
        Some(MapsLine { lo, hi, perms, anonymous: perms.ends_with('p') && inode == "0" && unnamed_or })
    }
}

/// The runs of private anonymous mappings in `maps` (the text of
/// `/proc/PID/maps`) within `[lo, hi)`, adjacent ones merged.
pub(super) fn anonymous_runs(maps: &str, lo: usize, hi: usize) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for m in maps.lines().filter_map(|l| MapsLine::parse(l, true)) {
        let (s, e) = (m.lo.max(lo), m.hi.min(hi));
        // Named anonymous memory (`PR_SET_VMA_ANON_NAME`) is anonymous too.
        if s >= e || !m.anonymous {
            continue;
        }
        match runs.last_mut() {
            Some(last) if last.1 == s => last.1 = e,
            _ => runs.push((s, e)),
        }
    }
    runs
}

/// `/dev/userfaultfd`, opened once (kept: see [`Host::keep_fd`](crate::host::Host::keep_fd); -2 not tried
/// yet, -1 not available).
pub(super) static UFFD_DEVICE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-2);

/// `/dev/userfaultfd` if this process could open it when it first made a
/// userfaultfd: a full-mode userfaultfd is made from it, also in a child
/// forked after the program dropped root (`setuid`), where the system
/// call would refuse one. Before, such a child got a user-mode-only one
/// without syscall user dispatch, and its system calls on evicted memory
/// failed with `EFAULT`. Closed at `exec`: the new program gets what its
/// own privileges allow.
pub(super) fn uffd_device() -> Option<i32> {
    use std::os::fd::IntoRawFd;
    let mut fd = UFFD_DEVICE.load(Ordering::Relaxed);
    if fd == -2 {
        // For the tests only: as on a kernel without the device.
        let skip = (host().knob)(env::TEST_NO_UFFD_DEVICE).is_some_and(|v| v == "1");
        fd = Uffd::open_device().filter(|_| !skip).map_or(-1, |d| (host().keep_fd)(d.into_raw_fd()));
        UFFD_DEVICE.store(fd, Ordering::Relaxed);
    }
    (fd >= 0).then_some(fd)
}

/// Faults are served in the faulting thread, from a `SIGBUS` handler
/// (`ZTIER_FAULT_PATH=signal`, `ztier run --fault-path signal`), instead
/// of by the handler thread: no wake-up of another thread per fault, but
/// every system call of the program is caught first (the `sud` module),
/// since the kernel's own faults on evicted memory fail with `EFAULT`.
///
/// `ZTIER_FAULT_PATH=auto` (the default, and what an unset variable
/// means) takes this path where system calls are caught anyway: under a
/// user-mode-only userfaultfd (an unprivileged user's), whose kernel
/// faults fail the same way, so the handler thread's round trip buys
/// nothing there. With a full-mode userfaultfd it takes the handler
/// thread, which serves the kernel's faults too.
///
/// A program whose executable has a `malloc` of its own
/// ([`Host::program_has_own_malloc`](crate::host::Host::program_has_own_malloc): jemalloc or mimalloc linked in, as
/// rustc's is) takes this path whatever was asked. Such an allocator's
/// fork handlers touch its own metadata, arena memory, while they hold
/// its locks: in the forked child, until the last of them has run, no
/// thread of the library can start there (`pthread_create` allocates
/// with that allocator), so only the faulting thread itself can serve
/// those faults (see the library's `__register_atfork`). With the handler
/// thread rustc hung at its first fork until the watchdog ended it.
/// Decided once per process, when its first userfaultfd is opened
/// ([`decide_signal_path`]; a forked child keeps its parent's decision,
/// and a program it starts decides for itself).
pub fn signal_path() -> bool {
    // Every caller runs after the process's first userfaultfd was opened
    // (faults, the handler and watchdog threads, statistics of a started
    // process); false, the handler thread, is never relied on.
    SIGNAL_PATH.get().copied().unwrap_or(false)
}

/// The process's fault path ([`signal_path`]), once decided.
pub(super) static SIGNAL_PATH: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Decides the fault path ([`signal_path`]) for a userfaultfd that is
/// user-mode-only (`umo`) or not; a decision already made stands.
pub(super) fn decide_signal_path(umo: bool) -> bool {
    *SIGNAL_PATH.get_or_init(|| {
        let asked = std::env::var(env::FAULT_PATH).unwrap_or_default();
        let signal = match asked.as_str() {
            "signal" => true,
            "thread" => false,
            _ => umo,
        };
        signal || (host().program_has_own_malloc)()
    })
}

/// A new spill file in `dir`, without a name (`O_TMPFILE`): nothing is
/// left behind even if the process is killed, and no other process can
/// open it. Where the file system cannot make one, a new file
/// `spill.PID.N` (made with `O_EXCL`: PIDs repeat across PID namespaces,
/// and two processes that opened one name would write one file) unlinked
/// at once. Its descriptor is moved out of the program's way and kept
/// from its `close` (see [`Host::keep_fd`](crate::host::Host::keep_fd)).
pub(super) fn open_spill(dir: &std::path::Path) -> io::Result<std::fs::File> {
    use std::os::fd::{FromRawFd, IntoRawFd};
    use std::os::unix::fs::OpenOptionsExt;
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)
    {
        Ok(f) => f,
        // Not a directory, gone, or not ours to write: said as it is.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOENT | libc::ENOTDIR | libc::EACCES | libc::EROFS)
            ) =>
        {
            return Err(io::Error::new(e.kind(), format!("spill directory {}: {e}", dir.display())));
        }
        // No O_TMPFILE here (EOPNOTSUPP; EISDIR before Linux 3.11).
        Err(_) => open_spill_named(dir)?,
    };
    // SAFETY: the file's descriptor, moved.
    Ok(unsafe { std::fs::File::from_raw_fd((host().keep_fd)(file.into_raw_fd())) })
}

/// [`open_spill`] where the file system makes no `O_TMPFILE`: the first
/// new name `spill.PID.N`, unlinked at once.
pub(super) fn open_spill_named(dir: &std::path::Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    for n in 0.. {
        let path = dir.join(format!("spill.{}.{n}", std::process::id()));
        match std::fs::OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&path) {
            Ok(f) => {
                let _ = std::fs::remove_file(&path);
                return Ok(f);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 1000 => {}
            Err(e) => return Err(io::Error::new(e.kind(), format!("spill file {}: {e}", path.display()))),
        }
    }
    unreachable!("the loop returns by its 1000th name")
}

pub(super) fn open_store(cfg: &Config) -> io::Result<(Arc<Store>, u32)> {
    let mut sc = StoreConfig::new(cfg.store_bytes);
    sc.codec = cfg.codec;
    sc.allocator = cfg.allocator;
    let remote = (host().remote_tier)()?;
    let tier: Option<Box<dyn ztier_store::tier::NextTier>> = match &cfg.spill_dir {
        // `--remote`: the run's proxy (and its spill file) instead.
        _ if remote.is_some() => remote,
        // A forked child opens a spill file of its own the same way.
        Some(dir) => {
            let dir = dir.clone();
            Some(Box::new(FileTier::reopenable(Box::new(move || open_spill(&dir)), cfg.spill_bytes)?))
        }
        None => None,
    };
    let store = Arc::new(Store::with_tier(sc, tier));
    let pool = store
        .create_pool(PoolOptions { store_raw: true, ..PoolOptions::new(PoolKind::Persistent) })
        .map_err(store_err)?;
    Ok((store, pool))
}

/// This process's share of the command's budget with `--budget-scope
/// tree` (`ZTIER_TREE` names the segment), if it can take one; if not,
/// it says why in the log and keeps a budget of its own.
pub(super) fn join_tree() -> Option<Member> {
    let path = std::env::var(env::TREE).ok().filter(|p| !p.is_empty())?;
    let why = match ztier_uffd::tree::open(&path) {
        Ok(seg) => match Member::join(seg) {
            Some(m) => return Some(m),
            None => format!("its {} processes' places are all taken", ztier_uffd::tree::SLOTS),
        },
        Err(e) => format!("{path}: {e}"),
    };
    (host().notice)(format_args!(
        "ztier: process {}: cannot share the command's budget ({why}; `ztier run` has ended?): \
         this process keeps its own --budget",
        std::process::id()
    ));
    None
}

/// Bytes the per-page tables (state, eviction time, hash: 21 bytes a
/// page) take where `chunks` runs of 256 arena pages were ever resident:
/// a page of the hash table each, and a quarter and a sixteenth of one
/// of the others (an estimate: they are backed only where touched).
/// What the library holds for the arena besides the store, counted by
/// `--budget-covers all`.
pub(super) fn tables_bytes(chunks: usize) -> usize {
    chunks * (PAGE + PAGE / 4 + PAGE / 16)
}
