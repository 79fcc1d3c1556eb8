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
}

/// A regular file.
pub struct FileBacking {
    file: File,
}

impl FileBacking {
    /// Wraps an open read/write file.
    pub fn new(file: File) -> Self {
        FileBacking { file }
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
