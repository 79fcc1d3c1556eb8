//! One budget for a whole process tree (`ztier run --budget-scope tree`).
//!
//! Every process `ztier run` manages has its own arena, store and
//! evictor; with `--budget-scope process` it has its own `--budget` too.
//! With the tree scope (the default) the processes of the command share
//! one budget, as the kernel's memory
//! cgroup limit covers every process in the cgroup: a `make -j`, a pool
//! of forked workers or a shell pipeline stays within it together.
//!
//! The processes share a small segment that `ztier run` makes (a memfd,
//! reached by each process through `/proc/<ztier run's PID>/fd/<fd>`,
//! named in `ZTIER_TREE`). It counts the budget in pages, and the pages
//! each process *holds*: a process holds at least as many pages as it
//! has resident (installing pages first takes more from the pool, in
//! chunks of [`CHUNK`]; evicting them gives the excess back). So the
//! pages resident in all processes together never exceed the budget,
//! except pages taken with [`Member::force`] when no process had any to
//! give (counted in `over`).
//!
//! ```text
//!  offset  size
//!  0       8     magic "ZTTREE05"
//!  8       8     budget, pages
//!  16      8     reserved: pages held by every slot together (atomic)
//!  24      8     peak of reserved (atomic)
//!  32      8     over: pages taken past the budget (atomic)
//!  40      8     reclaimed: pages given back for processes that died
//!                holding them (atomic)
//!  48      8     joined: processes that took a slot (atomic)
//!  56      8     adopted: pages forked children began to hold once no
//!                longer shared with their parent (atomic)
//!  64      8     store limit: bytes all the processes' compressed stores
//!                may use together (`--store`)
//!  72      8     stored: bytes the stores use, as each process last
//!                said (atomic)
//!  80      8     peak of stored (atomic)
//!  88      8     members: slots taken now (atomic)
//!  96      8     covers all: 1 if the budget bounds the stores and the
//!                library's tables too (`--budget-covers all`), 0 if
//!                resident pages only
//!  104     8     tables: bytes of the library's own tables, as each
//!                process last said (atomic)
//!  112     8     peak of everything held: held pages + stored + tables,
//!                in bytes (atomic)
//!  120     40×SLOTS  slots: pid (i32, 0 = free, -1 = being reclaimed),
//!                wake (u32, a futex word: bumped to wake the process's
//!                background evictor), held pages (u64, atomic), stored
//!                bytes (u64, atomic), start time (u64, clock ticks after
//!                boot as `/proc/PID/stat` says; 0 = not known), life
//!                (u32, a robust futex word: a thread's TID, marked
//!                FUTEX_OWNER_DIED by the kernel when that thread ends;
//!                0 = not set), tables (u32, KiB, atomic)
//! ```
//!
//! Under `--budget-covers all` (`bench pressure`'s; `ztier run`'s
//! default is still `resident`, `RunArgs::covers`) the budget bounds
//! everything the library holds for the command, as a memory cgroup's
//! `memory.max` bounds a program's memory with zswap's pool charged to
//! it: the pool a process takes resident pages from is the budget less
//! what the stores use and the tables take together
//! ([`Member::charged`]), so a store that grows leaves fewer pages to
//! be resident and the evictors make room. The stores' limit is then a
//! part of the budget (`ztier run` sets it), so that some pages can stay
//! resident.
//!
//! A forked child holds only the resident pages it does not share with
//! its parent: those it inherited are the parent's until they are its
//! own (written since, or dropped by the parent), which the child's
//! manager finds in `/proc/self/pagemap` and its parent's, and then holds
//! ([`Member::adopt`] counts them). So a page shared copy-on-write counts
//! once, as a memory cgroup charges it once; a page that children still
//! share after their parent dropped it counts in each of them that maps
//! it (none can tell which others do), more than once but not nowhere.
//!
//! The compressed stores share `--store` the same way: each process says
//! what its store uses after each eviction round ([`Member::publish_store`])
//! and sizes its store to [`Member::store_share`] — what it uses and its
//! part of what no store uses, or, once they use more than the limit
//! together, its part of the limit in proportion to what it uses.
//!
//! A process takes a slot when it starts (a slot of its own PID is from
//! before an `exec` of the same process, whose memory is gone: taken over
//! with its pages given back) and gives its pages back at exit. One
//! killed or ended without the exit hook keeps its slot until another
//! process finds the pool short (an install that cannot get its pages,
//! or a background evictor called on for the shortfall): slots of
//! processes that are gone (or zombies) are then reclaimed.
//!
//! How a process is told gone: a library thread that lives as long as
//! the process (the watchdog) puts its TID in the slot's life word and
//! names that word in its robust futex list ([`hold_life`]). When the
//! thread ends, as it does when the process dies, is killed, becomes a
//! zombie or calls `exec`, the kernel marks the word
//! `FUTEX_OWNER_DIED`. So one load tells a live process from a dead one,
//! and a process whose PID an unrelated process took since is gone as
//! well, with no system call and no descriptor. Until the word is set
//! (between the join and the thread's start, during which the
//! process holds no page: the library waits for it; or where the kernel
//! has no robust lists), a slot goes by PID and start time: a process that no
//! longer exists is gone ([`Look::Signal`], the background evictor's
//! look); an install also reads `/proc/PID/stat` for zombies and reused
//! PIDs ([`Look::Full`]). That read holds a descriptor for a moment,
//! which takes the lowest free number, so a program's `open` on another
//! thread could get the next one.

use std::io;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

use crate::sys;

/// The segment's first eight bytes.
pub const MAGIC: u64 = u64::from_le_bytes(*b"ZTTREE05");
/// Processes that can hold pages at once.
pub const SLOTS: usize = 1024;
/// Pages a process takes from the pool beyond what it needs now, so
/// that most installs touch no shared cache line.
pub const CHUNK: usize = 64;

/// One process's share.
#[repr(C)]
pub struct Slot {
    /// The process (0: free; -1: being reclaimed).
    pub pid: AtomicI32,
    /// Its background evictor sleeps on this futex word (shared between
    /// processes); bumped and woken by [`wake`].
    pub wake: AtomicU32,
    /// Pages it holds.
    pub held: AtomicU64,
    /// Bytes its compressed store uses, as it last said.
    pub stored: AtomicU64,
    /// When the process started (`/proc/PID/stat`'s field 22, clock
    /// ticks after boot), so that another process given the same PID
    /// later is not taken for it; 0: not known (PID alone).
    pub start: AtomicU64,
    /// A robust futex word ([`hold_life`]): the TID of a thread of the
    /// process that lives as long as it does, marked
    /// [`FUTEX_OWNER_DIED`] by the kernel when that thread ends; 0: not
    /// set.
    pub life: AtomicU32,
    /// KiB of the library's own tables in this process, as it last said.
    pub tables_kib: AtomicU32,
}

/// The bit the kernel sets in a robust futex word whose owner ended.
pub const FUTEX_OWNER_DIED: u32 = 0x4000_0000;

/// The shared segment (see the module docs for the layout).
#[repr(C)]
pub struct Segment {
    magic: u64,
    /// The budget, in pages.
    pub budget: u64,
    /// Pages held by every slot together.
    pub reserved: AtomicU64,
    /// The most pages ever held together.
    pub peak: AtomicU64,
    /// Pages taken past the budget (no process had any to give).
    pub over: AtomicU64,
    /// Pages given back for processes that died holding them.
    pub reclaimed: AtomicU64,
    /// Processes that took a slot.
    pub joined: AtomicU64,
    /// Pages forked children began to hold once no longer shared with
    /// their parent ([`Member::adopt`]).
    pub adopted: AtomicU64,
    /// Bytes all the compressed stores may use together.
    pub store_limit: u64,
    /// Bytes the stores use together, as each last said.
    pub stored: AtomicU64,
    /// The most of `stored` ever.
    pub store_peak: AtomicU64,
    /// Slots taken now.
    pub members: AtomicU64,
    /// 1: the budget bounds the stores and the tables too.
    pub covers_all: u64,
    /// Bytes of the library's tables in every process together.
    pub tables: AtomicU64,
    /// The most ever held together: pages held (in bytes), stored bytes
    /// and tables.
    pub total_peak: AtomicU64,
    /// One per process.
    pub slots: [Slot; SLOTS],
}

/// Size of the segment in bytes.
pub const BYTES: usize = std::mem::size_of::<Segment>();

impl Segment {
    /// For tests: makes slot `k` a member as process `pid` (started at
    /// `start`, 0: not known) holding `held` pages, as its own
    /// [`Member::join`] and [`Member::ensure`] would have.
    #[doc(hidden)]
    pub fn fake_member(&self, k: usize, pid: i32, start: u64, held: u64) {
        let s = &self.slots[k];
        s.pid.store(pid, Ordering::Release);
        s.start.store(start, Ordering::Release);
        s.held.store(held, Ordering::Release);
        self.members.fetch_add(1, Ordering::AcqRel);
        self.reserved.fetch_add(held, Ordering::AcqRel);
    }

    /// For tests: says that slot `k`'s store uses `bytes`, as its own
    /// [`Member::publish_store`] would have.
    #[doc(hidden)]
    pub fn fake_stored(&self, k: usize, bytes: u64) {
        let was = self.slots[k].stored.swap(bytes, Ordering::AcqRel);
        self.stored.fetch_sub(was, Ordering::AcqRel);
        self.stored.fetch_add(bytes, Ordering::AcqRel);
    }

    /// Gives back what slot `s` holds of the budget and of the stores'
    /// limit (its process is gone, or this is the same process after an
    /// exec); returns the pages. The caller has turned its PID to -1.
    fn release(&self, s: &Slot) -> u64 {
        let h = s.held.swap(0, Ordering::AcqRel);
        self.reserved.fetch_sub(h, Ordering::AcqRel);
        let b = s.stored.swap(0, Ordering::AcqRel);
        self.stored.fetch_sub(b, Ordering::AcqRel);
        let t = s.tables_kib.swap(0, Ordering::AcqRel);
        self.tables.fetch_sub(u64::from(t) << 10, Ordering::AcqRel);
        h
    }

    /// Bytes held by every process together now: pages held, stored
    /// bytes and tables.
    pub fn total(&self) -> u64 {
        (self.reserved.load(Ordering::Acquire) << 12)
            + self.stored.load(Ordering::Acquire)
            + self.tables.load(Ordering::Acquire)
    }

    /// Records [`Segment::total`] if it is the most yet.
    fn note_total(&self) {
        self.total_peak.fetch_max(self.total(), Ordering::Relaxed);
    }

    /// Pages of the budget the stores and tables take (`--budget-covers
    /// all`; 0 otherwise): what is left of the budget for held pages is
    /// the budget less these.
    pub fn charged(&self) -> u64 {
        if self.covers_all == 0 {
            return 0;
        }
        (self.stored.load(Ordering::Acquire) + self.tables.load(Ordering::Acquire)).div_ceil(4096)
    }

    /// Pages that may be held now: the budget, less [`Segment::charged`].
    pub fn pool(&self) -> u64 {
        self.budget.saturating_sub(self.charged())
    }
}

/// A segment made by [`Shared::create`] (in `ztier run`): the memfd and
/// its mapping, both kept until dropped.
pub struct Shared {
    fd: std::os::fd::OwnedFd,
    seg: &'static Segment,
}

impl Shared {
    /// A new segment for a budget of `budget_pages` and stores of
    /// `store_limit` bytes together.
    pub fn create(budget_pages: u64, store_limit: u64) -> io::Result<Shared> {
        // SAFETY: a NUL-terminated name and valid flags.
        let fd = unsafe { libc::memfd_create(c"ztier-tree".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor we just made and own from here on.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
        // SAFETY: resizing our own memfd.
        if unsafe { libc::ftruncate(raw, BYTES as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let seg = map(raw)?;
        // SAFETY: the mapping is BYTES long, zero-filled, ours alone until
        // the path is handed out; the two plain fields are written once,
        // before any other process maps it.
        unsafe {
            let p = seg as *const Segment as *mut Segment;
            (*p).budget = budget_pages;
            (*p).store_limit = store_limit;
            (*p).magic = MAGIC;
        }
        Ok(Shared { fd, seg })
    }

    /// Makes the budget bound the stores and the library's tables too
    /// (`--budget-covers all`): the pool of pages to hold shrinks as they
    /// grow. Called before the path is handed out.
    pub fn covering_all(self) -> Shared {
        // SAFETY: as in `create`: no other process has mapped it yet.
        unsafe { (*(self.seg as *const Segment as *mut Segment)).covers_all = 1 };
        self
    }

    /// The path another process of this user opens it by, while this one
    /// lives.
    pub fn path(&self) -> String {
        format!("/proc/{}/fd/{}", std::process::id(), std::os::fd::AsRawFd::as_raw_fd(&self.fd))
    }

    /// The segment.
    pub fn segment(&self) -> &Segment {
        self.seg
    }
}

fn map(fd: i32) -> io::Result<&'static Segment> {
    // SAFETY: a new shared mapping of BYTES of the descriptor; it is never
    // unmapped, so the reference lives as long as the process.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), BYTES, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: page-aligned, BYTES long, and Segment is plain integers
    // and atomics, valid for any bytes.
    Ok(unsafe { &*(p as *const Segment) })
}

/// Opens the segment at `path` (as `ZTIER_TREE` names it).
pub fn open(path: &str) -> io::Result<&'static Segment> {
    let f = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
    let len = f.metadata()?.len();
    if len < BYTES as u64 {
        return Err(io::Error::other(format!("{path} is {len} bytes, not a budget segment")));
    }
    let seg = map(std::os::fd::AsRawFd::as_raw_fd(&f))?;
    if seg.magic != MAGIC {
        return Err(io::Error::other(format!("{path} is not a budget segment")));
    }
    Ok(seg)
}

/// The state letter of a `/proc/.../stat` file (`R`, `S`, `Z`, ...) at
/// the path `path` formats to; `None` if it cannot be read. Nothing is
/// allocated (it runs in fault service, under the manager's lock).
pub fn proc_state(path: std::fmt::Arguments) -> Option<u8> {
    proc_stat(path).map(|(state, _)| state)
}

/// The state letter and the start time (field 22: clock ticks after
/// boot; 0 if the file stops short of it) of a `/proc/.../stat` file at
/// the path `path` formats to; `None` if it cannot be read. Nothing is
/// allocated.
pub fn proc_stat(path: std::fmt::Arguments) -> Option<(u8, u64)> {
    let mut name = [0u8; 64];
    let mut w = std::io::Cursor::new(&mut name[..]);
    std::io::Write::write_fmt(&mut w, path).ok()?;
    std::io::Write::write_all(&mut w, b"\0").ok()?;
    // SAFETY: a NUL-terminated path in a local buffer; plain calls.
    let fd = unsafe { libc::open(name.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // The first 22 fields take at most ~480 bytes (a 16-byte name and
    // 20 numbers of at most 20 digits).
    let mut buf = [0u8; 1024];
    // SAFETY: reading into a local buffer of that size.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    // SAFETY: our own descriptor.
    unsafe { libc::close(fd) };
    // "pid (comm) S ppid ...": the fields from the state on (field 3)
    // follow the last ')'; the start time is field 22.
    let text = &buf[..n.max(0) as usize];
    let rest = &text[text.iter().rposition(|&b| b == b')')? + 1..];
    let mut fields = rest.split(|&b| b == b' ').filter(|f| !f.is_empty());
    let state = *fields.next()?.first()?;
    let start = fields
        .nth(22 - 4)
        .and_then(|f| std::str::from_utf8(f).ok())
        .and_then(|f| f.trim_end().parse().ok())
        .unwrap_or(0);
    Some((state, start))
}

/// This process's start time ([`Slot::start`]); 0 if it cannot be read.
fn my_start() -> u64 {
    proc_stat(format_args!("/proc/self/stat")).map_or(0, |(_, start)| start)
}

/// Wakes whoever sleeps on `word` ([`sleep`]), in any process.
pub fn wake(word: &AtomicU32) {
    word.fetch_add(1, Ordering::Release);
    // A shared futex (the sleeper may be another process); nothing to do
    // about a failed wake of a live word.
    let _ = sys::futex_wake(word, u32::MAX);
}

/// Sleeps on `word` while it still reads `seen` (loaded before the
/// caller's last look for work), for at most `timeout`.
pub fn sleep(word: &AtomicU32, seen: u32, timeout: std::time::Duration) {
    // Woken, timed out, the word changed first or a signal: the caller
    // looks for work again either way.
    let _ = sys::futex_wait(word, seen, timeout);
}

/// The kernel's robust futex list (`struct robust_list_head`), with the
/// one entry this process puts in it.
#[repr(C)]
struct RobustHead {
    next: *const RobustEntry,
    /// From the entry to the futex word, in bytes.
    futex_offset: libc::c_long,
    pending: *const RobustEntry,
}

/// An entry of the list (`struct robust_list`): the next one, or the
/// head at the end.
#[repr(C)]
struct RobustEntry {
    next: *const RobustHead,
}

/// Makes `word` (a slot's [`Slot::life`]) say while the calling thread
/// lives: registers with the kernel a robust futex list whose one entry
/// is `word`, then puts the thread's TID in it. The kernel marks it
/// [`FUTEX_OWNER_DIED`] when the thread ends, however it ends. Call it
/// on a thread that lives as long as the process and takes no robust
/// mutex of glibc's: the list replaces the one glibc registered for the
/// thread. `false` (the word left at 0) if the kernel refused the list.
pub fn hold_life(word: &'static AtomicU32) -> bool {
    thread_local! {
        // The calling thread's list: it lives as long as the thread (the
        // kernel walks it as the thread ends), and taking it allocates
        // nothing (a forked child may call this).
        static LIST: (std::cell::UnsafeCell<RobustHead>, std::cell::UnsafeCell<RobustEntry>) = const {
            (
                std::cell::UnsafeCell::new(RobustHead {
                    next: std::ptr::null(),
                    futex_offset: 0,
                    pending: std::ptr::null(),
                }),
                std::cell::UnsafeCell::new(RobustEntry { next: std::ptr::null() }),
            )
        };
    }
    LIST.with(|(head, entry)| {
        let (head, entry) = (head.get(), entry.get());
        // SAFETY: this thread's own list, which only it and the kernel
        // read: head -> entry -> head, the entry naming `word` (in a
        // mapping kept for good) by its offset.
        let r = unsafe {
            (*head).next = entry;
            (*head).futex_offset = (word.as_ptr() as isize).wrapping_sub(entry as isize) as libc::c_long;
            (*head).pending = std::ptr::null();
            (*entry).next = head;
            // SAFETY: the list is well formed (above), and the thread's
            // own: it lives as long as the thread, and `word` for good.
            sys::set_robust_list(head.cast_const())
        };
        if r.is_err() {
            return false;
        }
        // SAFETY: gettid cannot fail.
        let tid = unsafe { libc::gettid() } as u32;
        word.store(tid, Ordering::Release);
        true
    })
}

/// How a look for processes that are gone ([`Member::reclaim`]) looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Look {
    /// `kill(pid, 0)` and `/proc/PID/stat`: a zombie, and a process whose
    /// PID another took since, are gone too. Reading the file opens a
    /// descriptor for a moment, and it takes the lowest free number: so
    /// only on a thread the program waits for (a fault's service), not
    /// on one that runs beside it.
    Full,
    /// `kill(pid, 0)` alone (no such process): no descriptor is opened.
    /// The background evictor's: its reads of `/proc` made a program's
    /// `open` after `closefrom(3)` get descriptor 4 now and then, not 3
    /// (`cli_run_modes::a_program_that_closes_every_descriptor_keeps_its_memory`
    /// failed once so in CI).
    Signal,
}

/// Is the process that took slot `s` as `pid` gone (or a zombie, whose
/// memory is gone)? By its life word once set ([`hold_life`]); until then
/// by its PID and start time ([`gone_by_pid`]).
fn gone(s: &Slot, pid: i32, look: Look) -> bool {
    match s.life.load(Ordering::Acquire) {
        0 => gone_by_pid(pid, s.start.load(Ordering::Acquire), look),
        life => life & FUTEX_OWNER_DIED != 0,
    }
}

/// Is the process that took a slot as `pid` at `start` gone (or a
/// zombie)? A process of that PID that started at another time is
/// another process (`start` 0: not known, PID alone). With
/// [`Look::Signal`], only a process that no longer exists is gone.
fn gone_by_pid(pid: i32, start: u64, look: Look) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid, 0) } != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return true;
    }
    if look == Look::Signal {
        return false;
    }
    match proc_stat(format_args!("/proc/{pid}/stat")) {
        None | Some((b'Z' | b'X', _)) => true,
        Some((_, now)) => start != 0 && now != 0 && now != start,
    }
}

/// Least time between two looks for the pages of processes that are
/// gone ([`Member::reclaim`]): a look costs a system call or more per
/// process, and the pool runs short on every fault of a busy tree.
pub const RECLAIM_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

/// Least store a process is given of the shared limit
/// ([`Member::store_share`]).
pub const STORE_FLOOR: usize = 2 << 20;

/// This process's membership: its slot and the pages it holds.
pub struct Member {
    seg: &'static Segment,
    slot: usize,
    /// Pages this process holds (its slot's count, kept here too).
    held: usize,
    /// Bytes its store uses, as it last said (its slot's, kept here too).
    stored: usize,
    /// The last look for pages of processes that are gone.
    looked: Option<std::time::Instant>,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member").field("slot", &self.slot).field("held", &self.held).finish()
    }
}

impl Member {
    /// Takes a slot for this process (`None`: all are taken).
    pub fn join(seg: &'static Segment) -> Option<Member> {
        let me = std::process::id() as i32;
        let start = my_start();
        // A slot is taken as -1 (which every look passes over) and made
        // this process's with its start time and an unset life word, then
        // named by the PID.
        //
        // A slot of our own PID is from before an exec of this process
        // (the same start time), or of a process that died with it
        // before the PID came to us: either way its pages are gone. Its
        // life word is marked (the thread that held it ended with the old
        // image), so another process may be taking it back now: whoever
        // turns the PID to -1 first has it.
        let own = seg
            .slots
            .iter()
            .position(|s| s.pid.compare_exchange(me, -1, Ordering::AcqRel, Ordering::Relaxed).is_ok());
        let slot = match own {
            Some(k) => {
                let s = &seg.slots[k];
                let was = s.start.load(Ordering::Acquire);
                let h = seg.release(s);
                if was != 0 && start != 0 && was != start {
                    seg.reclaimed.fetch_add(h, Ordering::Relaxed);
                }
                k
            }
            None => {
                let k = seg.slots.iter().position(|s| {
                    s.pid.compare_exchange(0, -1, Ordering::AcqRel, Ordering::Relaxed).is_ok()
                })?;
                seg.members.fetch_add(1, Ordering::AcqRel);
                k
            }
        };
        let s = &seg.slots[slot];
        s.start.store(start, Ordering::Release);
        s.life.store(0, Ordering::Release);
        s.pid.store(me, Ordering::Release);
        seg.joined.fetch_add(1, Ordering::Relaxed);
        Some(Member { seg, slot, held: 0, stored: 0, looked: None })
    }

    /// The futex word this process's background evictor sleeps on.
    pub fn wake_word(&self) -> &'static AtomicU32 {
        &self.seg.slots[self.slot].wake
    }

    /// This process's life word, for [`hold_life`].
    pub fn life_word(&self) -> &'static AtomicU32 {
        &self.seg.slots[self.slot].life
    }

    /// Wakes the background evictors of the other processes that hold
    /// pages (they give back their share of the shortfall).
    pub fn wake_others(&self) {
        for (k, s) in self.seg.slots.iter().enumerate() {
            if k != self.slot && s.pid.load(Ordering::Relaxed) > 0 && s.held.load(Ordering::Relaxed) > 0 {
                wake(&s.wake);
            }
        }
    }

    /// Pages this process holds.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Pages no process holds (of the pool: under `--budget-covers all`,
    /// the budget less what the stores and tables take).
    pub fn free(&self) -> usize {
        (self.seg.pool() as usize).saturating_sub(self.seg.reserved.load(Ordering::Acquire) as usize)
    }

    /// Pages held past the pool: under `--budget-covers all`, what the
    /// processes must give back since the stores and tables grew.
    pub fn overdrawn(&self) -> usize {
        (self.seg.reserved.load(Ordering::Acquire) as usize).saturating_sub(self.seg.pool() as usize)
    }

    /// Under `--budget-covers all`, while the processes hold more pages
    /// than the pool has (the stores or tables grew into it): gives back
    /// what this process holds beyond `keep`, up to what is overdrawn, so
    /// that the pages it evicted go back to the pool instead of staying
    /// its slack. Returns the pages still overdrawn (0 without `all`).
    pub fn settle(&mut self, keep: usize) -> usize {
        if self.seg.covers_all == 0 {
            return 0;
        }
        let over = self.overdrawn();
        if over > 0 && self.held > keep {
            self.give((self.held - keep).min(over));
            return self.overdrawn();
        }
        over
    }

    /// Does the budget bound the stores and tables too (`--budget-covers all`)?
    pub fn covers_all(&self) -> bool {
        self.seg.covers_all != 0
    }

    /// Pages of the budget the stores and tables take now ([`Segment::charged`]).
    pub fn charged(&self) -> usize {
        self.seg.charged() as usize
    }

    /// Pages all processes hold together.
    pub fn reserved(&self) -> usize {
        self.seg.reserved.load(Ordering::Acquire) as usize
    }

    /// Holds at least `want` pages (a [`CHUNK`] more if the pool has
    /// them); `false` if the pool cannot give enough, even after taking
    /// back the pages of processes that are gone (looked for at most
    /// every [`RECLAIM_EVERY`]).
    pub fn ensure(&mut self, want: usize) -> bool {
        if self.held >= want {
            return true;
        }
        let need = want - self.held;
        if self.take(need + CHUNK) || self.take(need) {
            return true;
        }
        self.reclaim_due(Look::Full) > 0 && self.take(need)
    }

    /// Holds up to `want` pages: takes what the pool has of those it
    /// lacks (none past the budget); returns the pages it holds.
    pub fn ensure_some(&mut self, want: usize) -> usize {
        if self.held < want {
            self.take_up_to(want - self.held, 1);
        }
        self.held
    }

    /// Takes back the pages of processes that are gone ([`Member::reclaim`]),
    /// unless this process looked less than [`RECLAIM_EVERY`] ago; returns
    /// how many. Called when the pool runs short: by [`Member::ensure`],
    /// and by the background evictor before it evicts for the shortfall
    /// (a process killed while the others' evictors kept the pool from
    /// running dry was otherwise never looked for), with [`Look::Signal`].
    pub fn reclaim_due(&mut self, look: Look) -> usize {
        let now = std::time::Instant::now();
        if self.looked.is_some_and(|t| now.duration_since(t) < RECLAIM_EVERY) {
            return 0;
        }
        self.looked = Some(now);
        self.reclaim(look)
    }

    /// Holds at least `want` pages, past the budget if need be (the pages
    /// past it counted in `over`); returns how many went past it.
    pub fn force(&mut self, want: usize) -> usize {
        if self.ensure(want) {
            return 0;
        }
        let k = (want - self.held) as u64;
        let r = self.seg.reserved.fetch_add(k, Ordering::AcqRel) + k;
        let over = r.saturating_sub(self.seg.pool()).min(k);
        self.seg.over.fetch_add(over, Ordering::Relaxed);
        self.seg.peak.fetch_max(r, Ordering::Relaxed);
        self.seg.note_total();
        self.seg.slots[self.slot].held.fetch_add(k, Ordering::AcqRel);
        self.held += k as usize;
        over as usize
    }

    /// Counts `k` pages a forked child takes over from its parent: pages
    /// it inherited resident and shared, which its parent held, and which
    /// are its own now (written since, or dropped by the parent). The
    /// caller holds them next ([`Member::ensure`] or [`Member::force`]),
    /// unless they are leaving memory (an eviction's victims).
    pub fn adopt(&self, k: usize) {
        self.seg.adopted.fetch_add(k as u64, Ordering::Relaxed);
    }

    /// Gives back what this process holds beyond `keep` + a [`CHUNK`],
    /// once that is more than two chunks.
    pub fn trim(&mut self, keep: usize) {
        if self.held > keep + 2 * CHUNK {
            self.give(self.held - keep - CHUNK);
        }
    }

    /// Gives everything back and frees the slot (at exit).
    pub fn leave(&mut self) {
        self.give(self.held);
        self.publish_store(0);
        self.publish_tables(0);
        let s = &self.seg.slots[self.slot];
        s.start.store(0, Ordering::Release);
        s.life.store(0, Ordering::Release);
        s.pid.store(0, Ordering::Release);
        self.seg.members.fetch_sub(1, Ordering::AcqRel);
    }

    /// In a forked child: a slot of its own, holding nothing yet (the
    /// slot copied from the parent is the parent's).
    pub fn rejoin(&self) -> Option<Member> {
        Member::join(self.seg)
    }

    /// Says that this process's store uses `bytes` now.
    pub fn publish_store(&mut self, bytes: usize) {
        self.publish_store_keeping(bytes, usize::MAX);
    }

    /// [`Member::publish_store`], and under `--budget-covers all` gives
    /// back at once what this process holds beyond `keep` while the pool
    /// is overdrawn ([`Member::settle`]), before the total is noted: the
    /// pages an eviction took out of memory go back to the pool as its
    /// compressed copies come in.
    pub fn publish_store_keeping(&mut self, bytes: usize, keep: usize) {
        let slot = &self.seg.slots[self.slot].stored;
        if bytes >= self.stored {
            let d = (bytes - self.stored) as u64;
            slot.fetch_add(d, Ordering::AcqRel);
            let t = self.seg.stored.fetch_add(d, Ordering::AcqRel) + d;
            self.seg.store_peak.fetch_max(t, Ordering::Relaxed);
        } else {
            let d = (self.stored - bytes) as u64;
            slot.fetch_sub(d, Ordering::AcqRel);
            self.seg.stored.fetch_sub(d, Ordering::AcqRel);
        }
        self.stored = bytes;
        if keep != usize::MAX {
            self.settle(keep);
        }
        self.seg.note_total();
    }

    /// Under `--budget-covers all`: how many bytes this process's store,
    /// about to say that it uses `bytes`, must let go of first for the
    /// budget to hold ([`Member::store_room`]'s excess); 0 when they fit,
    /// and without `all`. (The manager asks `store_room` itself.)
    #[cfg(test)]
    pub fn store_overflow(&self, bytes: usize, keep: usize) -> usize {
        self.store_room(keep).map_or(0, |room| bytes.saturating_sub(room))
    }

    /// Under `--budget-covers all`: the most this process's store may say
    /// it uses (its oldest pages go to the next tier beyond it) for the
    /// pages held, the stores and the tables to stay within the budget,
    /// once this process has given back what it holds beyond `keep`
    /// ([`Member::settle`]); `None` without `all`. A store may grow only
    /// into the room the others leave: before, a forked child that
    /// evicted pages it did not hold (shared with its parent, or adopted
    /// once its parent dropped them) grew its store with nothing given
    /// back, and four `workers.py` processes held 25.7-27.7 MB at
    /// `--budget 24M` (25.2 MB).
    pub fn store_room(&self, keep: usize) -> Option<usize> {
        if self.seg.covers_all == 0 {
            return None;
        }
        let others = (self.seg.stored.load(Ordering::Acquire) as usize).saturating_sub(self.stored);
        let tables = self.seg.tables.load(Ordering::Acquire) as usize;
        let held = self.reserved().saturating_sub(self.held.saturating_sub(keep));
        Some(((self.seg.budget as usize) << 12).saturating_sub((held << 12) + others + tables))
    }

    /// Says that the library's tables take `bytes` in this process now
    /// (counted in KiB, rounded up).
    pub fn publish_tables(&mut self, bytes: usize) {
        self.publish_tables_keeping(bytes, usize::MAX);
    }

    /// [`Member::publish_tables`], and under `--budget-covers all` gives
    /// back at once what this process holds beyond `keep` while the pool
    /// is overdrawn ([`Member::settle`]), before the total is noted (as
    /// [`Member::publish_store_keeping`] does): a process that holds the
    /// pages for its tables' growth first ([`Member::ensure`]) says it
    /// without the total passing the budget. Before, the tables were said
    /// only after an eviction, with nothing given back: a program's first
    /// fill of a 16M budget took 121 KiB of tables uncounted, said at once
    /// past it.
    pub fn publish_tables_keeping(&mut self, bytes: usize, keep: usize) {
        let kib = u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX);
        let was = self.seg.slots[self.slot].tables_kib.swap(kib, Ordering::AcqRel);
        // One step by the difference: never counted twice for a moment.
        if kib >= was {
            self.seg.tables.fetch_add(u64::from(kib - was) << 10, Ordering::AcqRel);
        } else {
            self.seg.tables.fetch_sub(u64::from(was - kib) << 10, Ordering::AcqRel);
        }
        if keep != usize::MAX {
            self.settle(keep);
        }
        self.seg.note_total();
    }

    /// KiB of tables this process said it has.
    pub fn tables_kib(&self) -> u32 {
        self.seg.slots[self.slot].tables_kib.load(Ordering::Acquire)
    }

    /// The bytes this process's store may use now (`None` without a
    /// shared limit): what it uses and its part of what no store uses
    /// (split evenly between the processes, which may all grow into it
    /// at once); once the stores use more than the limit together, its
    /// part of the limit in proportion to what it uses. At least
    /// [`STORE_FLOOR`] (or an eighth of the limit, if smaller), so that
    /// a process whose store is empty can still store pages while the
    /// others give theirs back.
    pub fn store_share(&self) -> Option<usize> {
        let limit = self.seg.store_limit as usize;
        if limit == 0 {
            return None;
        }
        let total = self.seg.stored.load(Ordering::Acquire) as usize;
        let share = if total <= limit {
            let n = self.seg.members.load(Ordering::Relaxed) as usize;
            self.stored + (limit - total) / n.max(1)
        } else {
            (self.stored as u128 * limit as u128 / total as u128) as usize
        };
        Some(share.max(STORE_FLOOR.min(limit / 8)))
    }

    /// Bytes this process's store uses, as it last said.
    pub fn stored(&self) -> usize {
        self.stored
    }

    /// The limit of all the stores together (0: none).
    pub fn store_limit(&self) -> usize {
        self.seg.store_limit as usize
    }

    fn take(&mut self, k: usize) -> bool {
        self.take_up_to(k, k) == k
    }

    /// Takes `k` pages from the pool if it has at least `least` of them
    /// (as many as it has, up to `k`); returns how many it took.
    fn take_up_to(&mut self, k: usize, least: usize) -> usize {
        let mut r = self.seg.reserved.load(Ordering::Acquire);
        let pool = self.seg.pool();
        let k = loop {
            let n = k.min(pool.saturating_sub(r) as usize);
            if n == 0 || n < least {
                return 0;
            }
            match self.seg.reserved.compare_exchange_weak(
                r,
                r + n as u64,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break n,
                Err(now) => r = now,
            }
        };
        self.seg.peak.fetch_max(r + k as u64, Ordering::Relaxed);
        self.seg.slots[self.slot].held.fetch_add(k as u64, Ordering::AcqRel);
        self.held += k;
        self.seg.note_total();
        k
    }

    fn give(&mut self, k: usize) {
        self.seg.slots[self.slot].held.fetch_sub(k as u64, Ordering::AcqRel);
        self.seg.reserved.fetch_sub(k as u64, Ordering::AcqRel);
        self.held -= k;
    }

    /// Takes back the pages of processes that are gone, looking as `look`
    /// says; returns how many. This process's own slot is passed over
    /// (it is not gone).
    pub fn reclaim(&self, look: Look) -> usize {
        let mut total = 0;
        for (k, s) in self.seg.slots.iter().enumerate() {
            let pid = s.pid.load(Ordering::Acquire);
            if pid <= 0
                || k == self.slot
                || (s.held.load(Ordering::Acquire) == 0
                    && s.stored.load(Ordering::Acquire) == 0
                    && s.tables_kib.load(Ordering::Acquire) == 0)
                || !gone(s, pid, look)
            {
                continue;
            }
            if s.pid.compare_exchange(pid, -1, Ordering::AcqRel, Ordering::Relaxed).is_err() {
                continue;
            }
            // Between the look and the turn to -1, a new image of the
            // same process (after an exec) may have taken the slot over
            // (its life word set anew): looked at again, it lives.
            if !gone(s, pid, look) {
                s.pid.store(pid, Ordering::Release);
                continue;
            }
            let h = self.seg.release(s);
            self.seg.reclaimed.fetch_add(h, Ordering::Relaxed);
            s.start.store(0, Ordering::Release);
            s.life.store(0, Ordering::Release);
            s.pid.store(0, Ordering::Release);
            self.seg.members.fetch_sub(1, Ordering::AcqRel);
            total += h as usize;
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_share_the_budget_and_give_back_what_they_do_not_use() {
        let shared = Shared::create(1000, 0).unwrap();
        let seg = open(&shared.path()).unwrap();
        let mut a = Member::join(seg).unwrap();
        assert!(a.ensure(100));
        assert_eq!(a.held(), 100 + CHUNK, "a chunk more than asked");
        // A second member of the same process (as after an exec) takes the
        // slot over: what the first held is given back.
        let mut b = Member::join(seg).unwrap();
        assert_eq!(b.slot, a.slot);
        assert_eq!(seg.reserved.load(Ordering::Relaxed), 0);
        assert!(b.ensure(900));
        assert!(!b.ensure(1001), "past the budget");
        assert!(b.held() <= 1000);
        // Up to what the pool has, none past the budget.
        assert_eq!(b.held(), 900 + CHUNK);
        assert_eq!(b.ensure_some(1005), 1000);
        assert_eq!(seg.reserved.load(Ordering::Relaxed), 1000);
        assert_eq!(b.ensure_some(10), 1000, "holds more already");
        b.force(1010);
        assert_eq!(b.held(), 1010);
        assert_eq!(seg.over.load(Ordering::Relaxed), 10);
        assert_eq!(seg.peak.load(Ordering::Relaxed), 1010);
        b.trim(100);
        assert_eq!(b.held(), 100 + CHUNK);
        assert_eq!(seg.reserved.load(Ordering::Relaxed) as usize, 100 + CHUNK);
        b.leave();
        assert_eq!(seg.reserved.load(Ordering::Relaxed), 0);
        assert_eq!(seg.slots[b.slot].pid.load(Ordering::Relaxed), 0);
        // `a` lost its slot to `b` (as an image replaced by exec would).
        assert_eq!(a.slot, b.slot);
    }

    #[test]
    fn the_stores_share_their_limit_in_proportion_once_it_is_full() {
        const M: usize = 1 << 20;
        let shared = Shared::create(1000, 100 << 20).unwrap();
        let seg = open(&shared.path()).unwrap();
        let mut me = Member::join(seg).unwrap();
        assert_eq!(me.store_share(), Some(100 * M), "all of it while no store uses any");
        // Another process (a live one, as far as a look can tell) uses 30 MiB.
        let other = &seg.slots[SLOTS - 1];
        seg.fake_member(SLOTS - 1, 1, 0, 0);
        let say = |b: usize| seg.fake_stored(SLOTS - 1, b as u64);
        say(30 * M);
        me.publish_store(10 * M);
        assert_eq!(seg.stored.load(Ordering::Acquire) as usize, 40 * M);
        assert_eq!(me.store_share(), Some(40 * M), "its own and half of what no store uses");
        // The other went past the limit (its share shrank later than it grew).
        say(120 * M);
        seg.store_peak.fetch_max(130 << 20, Ordering::Relaxed);
        assert_eq!(me.store_share(), Some(10 * M * 100 / 130), "in proportion");
        me.publish_store(0);
        assert_eq!(me.store_share(), Some(STORE_FLOOR), "an empty store can still take pages");
        me.publish_store(5 * M);
        me.leave();
        assert_eq!(seg.stored.load(Ordering::Acquire) as usize, 120 * M, "given back at exit");
        // A process gone with a store and no pages held: its bytes come back.
        let mut dead = std::process::Command::new("true").spawn().unwrap();
        dead.wait().unwrap();
        other.pid.store(dead.id() as i32, Ordering::Release);
        assert_eq!(me.reclaim(Look::Full), 0, "no pages");
        assert_eq!(seg.stored.load(Ordering::Acquire), 0);
        assert_eq!(other.pid.load(Ordering::Acquire), 0);
        assert_eq!(seg.members.load(Ordering::Acquire), 0, "both slots free");
        // Without a shared limit, none.
        let none = Shared::create(1000, 0).unwrap();
        assert_eq!(Member::join(open(&none.path()).unwrap()).unwrap().store_share(), None);
    }

    #[test]
    fn a_process_wakes_the_evictors_of_the_others() {
        let shared = Shared::create(100, 0).unwrap();
        let seg = open(&shared.path()).unwrap();
        // SAFETY: the child joins, takes pages, sleeps on its word and
        // exits (no allocation after fork beyond what join does).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let mut m = Member::join(seg).unwrap();
            // Loaded before its pages show, so a wake after they do is seen.
            let seen = m.wake_word().load(Ordering::Acquire);
            let ok = m.ensure(10);
            let t = std::time::Instant::now();
            sleep(m.wake_word(), seen, std::time::Duration::from_secs(20));
            // SAFETY: _exit in the child.
            unsafe {
                libc::_exit(if ok && t.elapsed() < std::time::Duration::from_secs(10) { 0 } else { 1 })
            };
        }
        while seg.reserved.load(Ordering::Acquire) < 10 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let me = Member::join(seg).unwrap();
        me.wake_others();
        let mut status = 0;
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "status {status:#x}");
    }

    #[test]
    fn the_state_of_a_process_is_read_from_proc() {
        // The reading thread is running.
        assert_eq!(proc_state(format_args!("/proc/thread-self/stat")), Some(b'R'));
        assert_eq!(proc_state(format_args!("/proc/{}/stat", i32::MAX)), None);
        assert!(gone_by_pid(i32::MAX, 0, Look::Full) && gone_by_pid(i32::MAX, 0, Look::Signal));
        let me = std::process::id() as i32;
        // The process's state is its main thread's (the harness's, waiting).
        let (_, start) = proc_stat(format_args!("/proc/self/stat")).unwrap();
        assert_eq!(proc_stat(format_args!("/proc/thread-self/stat")).map(|s| s.0), Some(b'R'));
        // Field 22 of the kernel's own line, read another way.
        let line = std::fs::read_to_string("/proc/self/stat").unwrap();
        let after = &line[line.rfind(')').unwrap() + 2..];
        assert_eq!(start, after.split(' ').nth(19).unwrap().parse::<u64>().unwrap());
        assert!(start > 0);
        assert!(!gone_by_pid(me, 0, Look::Full));
        assert!(!gone_by_pid(me, start, Look::Full));
        assert!(gone_by_pid(me, start + 1, Look::Full), "another process that had this PID");
        assert!(!gone_by_pid(me, start + 1, Look::Signal), "no descriptor: the PID alone");
    }

    /// A slot names its process by PID and start time: an unrelated
    /// process that took the PID of one that died holding pages does not
    /// keep them held (before, they stayed held until the run ended).
    #[test]
    fn a_process_whose_pid_was_reused_is_gone() {
        let shared = Shared::create(1000, 0).unwrap();
        let seg = open(&shared.path()).unwrap();
        let mut live = std::process::Command::new("sleep").arg("60").spawn().unwrap();
        let pid = live.id() as i32;
        let (_, start) = proc_stat(format_args!("/proc/{pid}/stat")).unwrap();
        let fake = |k, pid, start, held| seg.fake_member(k, pid, start, held);
        // The process that holds them, and one that had its PID before.
        fake(SLOTS - 1, pid, start, 100);
        fake(SLOTS - 2, pid, start - 1, 300);
        let me = Member::join(seg).unwrap();
        assert_eq!(me.reclaim(Look::Full), 300, "only the one that started earlier is gone");
        assert_eq!(seg.slots[SLOTS - 2].pid.load(Ordering::Acquire), 0);
        assert_eq!(seg.slots[SLOTS - 2].start.load(Ordering::Acquire), 0, "a freed slot's start time");
        assert_eq!(seg.slots[SLOTS - 1].pid.load(Ordering::Acquire), pid);
        assert_eq!(seg.reserved.load(Ordering::Acquire), 100);
        // A slot of the joining process's own PID: from before an exec
        // of it (its start time), or left by a process that died with
        // that PID (another start time), whose pages count as reclaimed.
        let mine = my_start();
        let myself = std::process::id() as i32;
        let mut m = me;
        m.leave();
        fake(0, myself, mine, 40);
        let m = Member::join(seg).unwrap();
        assert_eq!((m.slot, seg.reclaimed.load(Ordering::Acquire)), (0, 300), "an exec: not reclaimed");
        assert_eq!(seg.slots[0].start.load(Ordering::Acquire), mine);
        seg.slots[0].start.store(mine + 1, Ordering::Release);
        seg.slots[0].held.store(50, Ordering::Release);
        seg.reserved.fetch_add(50, Ordering::AcqRel);
        let m = Member::join(seg).unwrap();
        assert_eq!((m.slot, seg.reclaimed.load(Ordering::Acquire)), (0, 350));
        assert_eq!(seg.reserved.load(Ordering::Acquire), 100, "the live process's alone");
        live.kill().unwrap();
        live.wait().unwrap();
    }

    /// Forks a child that joins `seg`, takes `pages` (and, with `life`,
    /// holds its life word on its one thread), then waits to be killed;
    /// its PID.
    fn fork_member(seg: &'static Segment, pages: usize, life: bool) -> i32 {
        // SAFETY: the child only joins, takes pages, registers its robust
        // list and waits (nothing allocated after the fork).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let mut m = Member::join(seg).unwrap();
            let ok = m.ensure(pages) && (!life || hold_life(m.life_word()));
            // SAFETY: pause/_exit in the child.
            unsafe {
                if !ok {
                    libc::_exit(1);
                }
                loop {
                    libc::pause();
                }
            }
        }
        pid
    }

    #[test]
    fn the_pages_of_a_process_that_is_gone_are_taken_back_when_the_pool_runs_short() {
        let shared = Shared::create(500, 0).unwrap();
        let seg = open(&shared.path()).unwrap();
        // A child takes 400 pages and is killed.
        let pid = fork_member(seg, 400, false);
        while seg.reserved.load(Ordering::Acquire) < 400 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let mut me = Member::join(seg).unwrap();
        let small = me.ensure(30);
        let big = me.ensure(400);
        // SAFETY: killing and reaping our own child.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        assert!(small && !big, "the child holds {} of 500", 400 + CHUNK);
        // The failed `ensure` looked for dead processes just now.
        std::thread::sleep(RECLAIM_EVERY);
        assert!(me.ensure(400), "the dead child's pages came back");
        assert!(seg.reclaimed.load(Ordering::Relaxed) >= 400);
        assert!(seg.reserved.load(Ordering::Relaxed) <= 500);
        me.leave();
    }

    /// A slot whose life word a thread holds ([`hold_life`]) is told
    /// gone by that word alone: a zombie (its memory gone, though signal
    /// 0 still reaches it) is found by the look that opens no descriptor
    /// (before, only an install's look at `/proc` found it), a slot whose
    /// thread ended is gone though its PID is alive (the PID another
    /// process's now), and one whose thread lives is not gone though its
    /// PID no longer is.
    #[test]
    fn a_process_is_told_gone_by_its_life_word() {
        let shared = Shared::create(1000, 0).unwrap();
        let seg = open(&shared.path()).unwrap();
        // A child that joins, takes 300 pages, holds its life word on its
        // one thread, and is killed, but not reaped: a zombie.
        let pid = fork_member(seg, 300, true);
        while seg
            .slots
            .iter()
            .all(|s| s.pid.load(Ordering::Acquire) != pid || s.life.load(Ordering::Acquire) == 0)
        {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let k = seg.slots.iter().position(|s| s.pid.load(Ordering::Acquire) == pid).unwrap();
        assert_eq!(seg.slots[k].life.load(Ordering::Acquire), pid as u32, "its one thread's TID");
        let me = Member::join(seg).unwrap();
        assert_eq!(me.reclaim(Look::Signal), 0, "alive");
        // SAFETY: killing our own child; waiting for it to die without
        // reaping it.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOWAIT);
        }
        assert_eq!(seg.slots[k].life.load(Ordering::Acquire), FUTEX_OWNER_DIED, "marked by the kernel");
        // SAFETY: signal 0 to our zombie child.
        assert_eq!(unsafe { libc::kill(pid, 0) }, 0, "a zombie");
        assert_eq!(me.reclaim(Look::Signal), 300 + CHUNK, "the zombie's pages, with no look at /proc");
        assert_eq!(seg.slots[k].life.load(Ordering::Acquire), 0, "a freed slot's life word");
        // SAFETY: reaping our child.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };

        // Threads of this process stand for other processes: one whose
        // thread ended though its PID (ours) lives, and one whose thread
        // lives though its PID (the child's, reaped) does not.
        let (a, b) = (SLOTS - 1, SLOTS - 2);
        seg.fake_member(a, std::process::id() as i32, 0, 100);
        seg.fake_member(b, pid, 0, 200);
        let hold = |k: usize| {
            let word = &seg.slots[k].life;
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let t = std::thread::spawn(move || {
                assert!(hold_life(word));
                let _ = rx.recv();
            });
            while word.load(Ordering::Acquire) == 0 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            (tx, t)
        };
        let (ta, ja) = hold(a);
        let (_tb, _jb) = hold(b);
        assert_eq!(me.reclaim(Look::Full), 0, "both threads live");
        drop(ta);
        ja.join().unwrap();
        assert_eq!(me.reclaim(Look::Signal), 100, "the slot whose thread ended");
        assert_eq!(seg.slots[b].pid.load(Ordering::Acquire), pid, "the slot whose thread lives");
    }

    #[test]
    fn covering_all_the_stores_and_tables_take_from_the_pool() {
        let shared = Shared::create(1000, 2 << 20).unwrap().covering_all();
        let seg = open(&shared.path()).unwrap();
        let mut a = Member::join(seg).unwrap();
        assert!(a.ensure(500));
        let held = a.held();
        assert_eq!(a.free(), 1000 - held);
        // 400 KiB stored and 40 KiB of tables: 110 pages of the budget.
        a.publish_store(400 << 10);
        a.publish_tables(40 << 10);
        assert_eq!(a.charged(), 110);
        assert_eq!(a.free(), 1000 - 110 - held);
        // The pool cannot give what the store took: at most 890 pages held.
        assert!(!a.ensure(1000 - 109));
        assert!(a.ensure(1000 - 110));
        assert_eq!(a.free(), 0);
        // Past it only by force, and that counts as over the budget.
        a.force(1000 - 100);
        assert_eq!(seg.over.load(Ordering::Relaxed), 10);
        // The peak of everything held: pages, stored bytes and tables.
        assert_eq!(seg.total_peak.load(Ordering::Relaxed), (900 << 12) + (440 << 10));
        assert!(seg.total_peak.load(Ordering::Relaxed) > 1000 << 12, "over the budget, and said so");
        a.trim(0);
        a.publish_store(0);
        assert_eq!(a.charged(), 10);
        a.leave();
        assert_eq!((seg.reserved.load(Ordering::Relaxed), seg.tables.load(Ordering::Relaxed)), (0, 0));
        // Resident pages only (the old meaning): the store takes nothing.
        let old = Shared::create(1000, 2 << 20).unwrap();
        let mut b = Member::join(open(&old.path()).unwrap()).unwrap();
        b.publish_store(400 << 10);
        b.publish_tables(40 << 10);
        assert_eq!(b.charged(), 0);
        assert!(b.ensure(1000));
        assert_eq!(old.segment().total_peak.load(Ordering::Relaxed), (1000 << 12) + (440 << 10));
    }

    /// A store that grows into the pool overdraws it; `settle` gives back
    /// what a process holds beyond what it keeps, up to the overdraft,
    /// and says what is still overdrawn (what it must evict).
    #[test]
    fn settling_gives_back_what_is_held_past_the_pool() {
        let shared = Shared::create(1000, 2 << 20).unwrap().covering_all();
        let seg = open(&shared.path()).unwrap();
        let (mut a, mut b) = (Member::join(seg).unwrap(), Member::join(seg).unwrap());
        assert!(a.ensure(600) && b.ensure(300));
        assert_eq!(a.settle(0), 0, "nothing overdrawn, nothing given");
        // (b got no chunk more: the pool had 336 left.)
        assert_eq!((a.held(), b.held()), (600 + CHUNK, 300));
        // b's store grows by 400 pages: the pool is 600, 964 held.
        b.publish_store(400 << 12);
        assert_eq!(a.overdrawn(), 364);
        // a keeps its 500 resident: gives back 164, 200 still overdrawn.
        assert_eq!(a.settle(500), 200);
        assert_eq!(a.held(), 500);
        // b keeps 100: gives back the 200.
        assert_eq!(b.settle(100), 0);
        assert_eq!((a.held(), b.held(), a.free()), (500, 100, 0));
        assert!(!a.ensure(501), "nothing left in the pool");
        a.leave();
        b.leave();
        assert_eq!(seg.reserved.load(Ordering::Relaxed), 0);
    }

    /// A store may grow only into what the pages held (less what their
    /// process gives back), the other stores and the tables leave of the
    /// budget: the rest it must spill first.
    #[test]
    fn a_store_grows_only_into_the_room_the_others_leave() {
        let shared = Shared::create(1000, 2 << 20).unwrap().covering_all();
        let seg = open(&shared.path()).unwrap();
        let (mut a, mut b) = (Member::join(seg).unwrap(), Member::join(seg).unwrap());
        assert!(a.ensure(600) && b.ensure(300));
        let held = a.held() + b.held();
        b.publish_tables(40 << 10);
        // 1000 pages: held, 10 of tables; the rest is room.
        let room = (1000 - held - 10) << 12;
        assert_eq!(b.store_overflow(room, b.held()), 0);
        assert_eq!(b.store_overflow(room + 5000, b.held()), 5000);
        // What b gives back of its own makes room; a's pages do not.
        assert_eq!(b.store_overflow(room + (100 << 12), b.held() - 100), 0);
        assert_eq!(a.store_overflow(room + (100 << 12), a.held()), 100 << 12);
        // The other stores count; its own published size is replaced.
        a.publish_store(8 << 12);
        assert_eq!(b.store_overflow(room, b.held()), 8 << 12);
        assert_eq!(a.store_overflow(room, a.held()), 0);
        // All of it at most (no room at all: pages taken past the budget).
        a.force(2000);
        assert_eq!(a.store_overflow(4 << 12, a.held()), 4 << 12);
        a.leave();
        b.leave();
        // Counting resident pages only: never.
        let old = Shared::create(1000, 2 << 20).unwrap();
        let mut c = Member::join(open(&old.path()).unwrap()).unwrap();
        assert!(c.ensure(1000));
        assert_eq!(c.store_overflow(1 << 30, c.held()), 0);
        c.leave();
    }

    /// Without `--budget-covers all` nothing is ever overdrawn: `settle`
    /// gives nothing back.
    #[test]
    fn settling_without_covers_all_gives_nothing() {
        let shared = Shared::create(1000, 2 << 20).unwrap();
        let seg = open(&shared.path()).unwrap();
        let mut a = Member::join(seg).unwrap();
        assert!(a.ensure(600));
        a.publish_store(900 << 12);
        assert_eq!(a.settle(0), 0);
        assert_eq!(a.held(), 600 + CHUNK);
        a.leave();
    }
}
