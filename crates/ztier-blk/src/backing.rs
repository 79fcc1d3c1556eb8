//! What the engine stores its image on: a file, or (for crash tests) a
//! device that forgets unflushed writes.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use parking_lot::Mutex;

/// Positional I/O with an explicit durability point.
pub trait Backing: Send + Sync {
    /// Reads exactly `buf.len()` bytes at `off` (bytes past the end read as zero).
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()>;
    /// Writes all of `buf` at `off`.
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()>;
    /// Makes every write so far durable (fdatasync).
    fn sync(&self) -> io::Result<()>;
    /// Bytes the image occupies on its device (allocated, not apparent size).
    fn allocated_bytes(&self) -> io::Result<u64>;
    /// Reads as [`Backing::read_at`] when that needs no wait for the
    /// device (the data is in the page cache, for a file); `None` when it
    /// would wait (or the backing cannot tell).
    fn read_at_nowait(&self, _buf: &mut [u8], _off: u64) -> Option<io::Result<()>> {
        None
    }
    /// Maps the first `len` bytes of the image for [`Backing::mapped`]
    /// (a file maps itself read-only; other backings ignore it).
    fn map(&self, _len: u64) {}
    /// The image's bytes `off..off + len` in place, from the mapping made
    /// by [`Backing::map`], with how many bus errors the mapping has taken
    /// so far ([`Mapped::faults`]); `None` without a mapping.
    fn mapped(&self, _off: u64, _len: usize) -> Option<(&[u8], &Mapped)> {
        None
    }
    /// Lets go of the pages reads have touched through the mapping, so
    /// that `posix_fadvise(DONTNEED)` can drop them from the page cache.
    fn unmap_pages(&self) {}
}

/// A shared device (tests keep a handle to crash it while the engine runs).
impl<B: Backing + ?Sized> Backing for std::sync::Arc<B> {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        (**self).read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        (**self).write_at(buf, off)
    }
    fn sync(&self) -> io::Result<()> {
        (**self).sync()
    }
    fn allocated_bytes(&self) -> io::Result<u64> {
        (**self).allocated_bytes()
    }
    fn read_at_nowait(&self, buf: &mut [u8], off: u64) -> Option<io::Result<()>> {
        (**self).read_at_nowait(buf, off)
    }
    fn map(&self, len: u64) {
        (**self).map(len)
    }
    fn mapped(&self, off: u64, len: usize) -> Option<(&[u8], &Mapped)> {
        (**self).mapped(off, len)
    }
    fn unmap_pages(&self) {
        (**self).unmap_pages()
    }
}

/// A regular file.
pub struct FileBacking {
    file: File,
    /// Its read-only mapping, once [`Backing::map`] asked for one (`None`
    /// inside when it could not be made).
    map: std::sync::OnceLock<Option<Mapped>>,
}

impl FileBacking {
    /// Wraps an open read/write file.
    pub fn new(file: File) -> Self {
        FileBacking { file, map: std::sync::OnceLock::new() }
    }
}

impl Backing for FileBacking {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], off + done as u64) {
                Ok(0) => {
                    buf[done..].fill(0); // a sparse tail never written
                    return Ok(());
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        self.file.write_all_at(buf, off)
    }
    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn allocated_bytes(&self) -> io::Result<u64> {
        use std::os::unix::fs::MetadataExt;
        Ok(self.file.metadata()?.blocks() * 512)
    }
    /// `preadv2(RWF_NOWAIT)`: only what the page cache holds, whole.
    fn read_at_nowait(&self, buf: &mut [u8], off: u64) -> Option<io::Result<()>> {
        use std::os::fd::AsRawFd;
        let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        // SAFETY: one iovec over `buf`, which outlives the call; the
        // descriptor is ours.
        let n =
            unsafe { libc::preadv2(self.file.as_raw_fd(), &iov, 1, off as libc::off_t, libc::RWF_NOWAIT) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) => None,
                _ => Some(Err(e)),
            };
        }
        (n as usize == buf.len()).then_some(Ok(()))
    }
    fn map(&self, len: u64) {
        self.map.get_or_init(|| Mapped::new(&self.file, len));
    }
    fn mapped(&self, off: u64, len: usize) -> Option<(&[u8], &Mapped)> {
        let m = self.map.get()?.as_ref()?;
        let end = off.checked_add(len as u64)?;
        if end > m.len as u64 {
            return None;
        }
        // SAFETY: `off..end` lies inside the mapping, which lives as long
        // as `self`. The engine reads only bytes of sealed extents that no
        // write changes while it reads them (its reuse lock); a page that
        // another program truncates away reads as zeros (see `Mapped`),
        // which the caller learns from `Mapped::faults` and the checksums.
        let b = unsafe { std::slice::from_raw_parts(m.base.add(off as usize), len) };
        Some((b, m))
    }
    fn unmap_pages(&self) {
        if let Some(Some(m)) = self.map.get() {
            // SAFETY: our own read-only shared file mapping: MADV_DONTNEED
            // only drops its page-table entries; the next access maps the
            // file's page again (no data is lost).
            unsafe { libc::madvise(m.base as *mut libc::c_void, m.len, libc::MADV_DONTNEED) };
        }
    }
}

/// A read-only shared mapping of an image file whose bus errors do not
/// kill the process.
///
/// A plain mapping turns a read of a page the file no longer has (the file
/// truncated by another program) or that the device cannot read into a
/// SIGBUS, where `pread` gives EIO. Each mapping is registered in a fixed
/// table; a process-wide SIGBUS handler that finds the faulting address in
/// a registered mapping puts a zero page over the faulting page (so the
/// instruction completes, reading zeros) and counts the fault on that
/// mapping. A reader compares [`Mapped::faults`] before and after using
/// the bytes: if it moved, the bytes are not trusted (the engine reads
/// them again with `pread`, which reports the error, and stops using the
/// mapping). Faults outside every registered mapping go to the handler
/// that was installed before (Rust's own, or the default action).
pub struct Mapped {
    base: *const u8,
    len: usize,
    slot: usize,
}

// SAFETY: the mapping is read-only memory owned by this value until Drop;
// sharing its address between threads is as safe as sharing `&[u8]`.
unsafe impl Send for Mapped {}
// SAFETY: as above; no interior state besides atomics in the slot table.
unsafe impl Sync for Mapped {}

/// A registered mapping: `[start, end)` (0, 0 when free) and its fault count.
struct Slot {
    start: std::sync::atomic::AtomicUsize,
    end: std::sync::atomic::AtomicUsize,
    faults: std::sync::atomic::AtomicU64,
}

const SLOTS: usize = 64;
#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    start: std::sync::atomic::AtomicUsize::new(0),
    end: std::sync::atomic::AtomicUsize::new(0),
    faults: std::sync::atomic::AtomicU64::new(0),
};
static TABLE: [Slot; SLOTS] = [FREE; SLOTS];
static PAGE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(4096);
/// The SIGBUS action before ours (written once, before ours is installed).
static mut PREVIOUS: Option<libc::sigaction> = None;
static INSTALL: std::sync::Once = std::sync::Once::new();

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    use std::sync::atomic::Ordering;
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in &TABLE {
        let (a, b) = (s.start.load(Ordering::Acquire), s.end.load(Ordering::Acquire));
        if a != 0 && addr >= a && addr < b {
            let page = PAGE.load(Ordering::Relaxed);
            let at = addr & !(page - 1);
            // SAFETY: replaces one page inside a mapping this process owns
            // (registered until it is unmapped) by a private zero page;
            // mmap is async-signal-safe.
            let r = unsafe {
                libc::mmap(
                    at as *mut libc::c_void,
                    page,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if r != libc::MAP_FAILED {
                s.faults.fetch_add(1, Ordering::AcqRel);
                return;
            }
        }
    }
    // Not ours: what would have happened without this handler.
    // SAFETY: PREVIOUS was written before this handler was installed and
    // never after; the calls below are what the kernel would have made.
    unsafe {
        let prev = (*std::ptr::addr_of!(PREVIOUS)).unwrap_or(std::mem::zeroed());
        let h = prev.sa_sigaction;
        if h == libc::SIG_DFL || h == libc::SIG_IGN {
            // The fault repeats on return and takes the default action.
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
        } else if prev.sa_flags & libc::SA_SIGINFO != 0 {
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                std::mem::transmute(h);
            f(sig, info, ctx);
        } else {
            let f: extern "C" fn(libc::c_int) = std::mem::transmute(h);
            f(sig);
        }
    }
}

fn install() {
    INSTALL.call_once(|| {
        // SAFETY: sysconf has no preconditions; the sigaction structs are
        // plain data, PREVIOUS is written here once before our handler can
        // run.
        unsafe {
            let page = libc::sysconf(libc::_SC_PAGESIZE);
            if page > 0 {
                PAGE.store(page as usize, std::sync::atomic::Ordering::Relaxed);
            }
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old);
            *std::ptr::addr_of_mut!(PREVIOUS) = Some(old);
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction =
                on_sigbus as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) as usize;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut());
        }
    });
}

impl Mapped {
    /// Maps `len` bytes of `file` read-only and registers the mapping;
    /// `None` if it cannot (no free slot, or mmap failed).
    fn new(file: &File, len: u64) -> Option<Mapped> {
        use std::os::fd::AsRawFd;
        use std::sync::atomic::Ordering;
        let len = usize::try_from(len).ok().filter(|&l| l > 0)?;
        install();
        // SAFETY: a new read-only shared mapping of a descriptor we own;
        // the kernel picks the address.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0)
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        let start = p as usize;
        for (i, s) in TABLE.iter().enumerate() {
            if s.start.compare_exchange(0, start, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                s.faults.store(0, Ordering::Release);
                s.end.store(start + len, Ordering::Release);
                return Some(Mapped { base: p as *const u8, len, slot: i });
            }
        }
        // SAFETY: the mapping made above, unused.
        unsafe { libc::munmap(p, len) };
        None
    }

    /// Bus errors this mapping has taken (each left a zero page behind).
    pub fn faults(&self) -> u64 {
        TABLE[self.slot].faults.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering;
        let s = &TABLE[self.slot];
        s.end.store(0, Ordering::Release);
        s.start.store(0, Ordering::Release);
        // SAFETY: our mapping, no longer registered; no slice of it
        // outlives `self` (they borrow the backing that owns it).
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

/// An in-memory device for crash tests, in the manner of dm-vdo's tests:
/// writes since the last [`Backing::sync`] are volatile; [`CrashBacking::crash`]
/// keeps a chosen subset of them, tearing others at 512-byte sectors.
#[derive(Default)]
pub struct CrashBacking {
    inner: Mutex<CrashState>,
}

#[derive(Default)]
struct CrashState {
    /// What reads see (every write applied).
    current: Vec<u8>,
    /// What survives a crash right now (synced writes only).
    durable: Vec<u8>,
    /// Unsynced writes, in order.
    pending: Vec<(u64, Vec<u8>)>,
}

fn put(v: &mut Vec<u8>, off: u64, data: &[u8]) {
    let end = off as usize + data.len();
    if v.len() < end {
        v.resize(end, 0);
    }
    v[off as usize..end].copy_from_slice(data);
}

impl CrashBacking {
    /// An empty device.
    pub fn new() -> Self {
        Self::default()
    }

    /// A device whose durable and current contents are `image`.
    pub fn from_image(image: Vec<u8>) -> Self {
        CrashBacking {
            inner: Mutex::new(CrashState { current: image.clone(), durable: image, ..Default::default() }),
        }
    }

    /// The image a crash now would leave: the durable image plus, for
    /// each unsynced write `i`, `keep(i, sectors)` sectors of 512 bytes
    /// (`0` = lost, `sectors` = whole; any number in between tears it,
    /// keeping that many leading sectors).
    pub fn crash(&self, mut keep: impl FnMut(usize, usize) -> usize) -> Vec<u8> {
        let s = self.inner.lock();
        let mut img = s.durable.clone();
        for (i, (off, data)) in s.pending.iter().enumerate() {
            let sectors = data.len().div_ceil(512);
            let k = keep(i, sectors).min(sectors);
            let n = (k * 512).min(data.len());
            if n > 0 {
                put(&mut img, *off, &data[..n]);
            }
        }
        img
    }

    /// The current image (every write applied).
    pub fn image(&self) -> Vec<u8> {
        self.inner.lock().current.clone()
    }
}

impl Backing for CrashBacking {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let s = self.inner.lock();
        let start = (off as usize).min(s.current.len());
        let end = (off as usize + buf.len()).min(s.current.len());
        buf[..end - start].copy_from_slice(&s.current[start..end]);
        buf[end - start..].fill(0);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        let mut s = self.inner.lock();
        put(&mut s.current, off, buf);
        s.pending.push((off, buf.to_vec()));
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        let mut s = self.inner.lock();
        let pending = std::mem::take(&mut s.pending);
        for (off, data) in pending {
            put(&mut s.durable, off, &data);
        }
        Ok(())
    }
    fn allocated_bytes(&self) -> io::Result<u64> {
        Ok(self.inner.lock().current.len() as u64)
    }
    fn read_at_nowait(&self, buf: &mut [u8], off: u64) -> Option<io::Result<()>> {
        Some(self.read_at(buf, off))
    }
}
