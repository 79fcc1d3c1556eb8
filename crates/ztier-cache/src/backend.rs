//! The slow storage a cache sits in front of: a file or block device, or
//! an NBD export reached through `ztier_blk::client`. (An in-memory
//! backend serves the tests.)

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

use parking_lot::RwLock;
use ztier_blk::client::{Client, ClientOptions};

/// Positional I/O on the backing device. Every method takes `&self` and
/// is called from many threads at once.
pub trait Backend: Send + Sync {
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Reads exactly `buf.len()` bytes at `off`.
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()>;
    /// Writes all of `data` at `off`; with `fua`, durable on return.
    fn write_at(&self, data: &[u8], off: u64, fua: bool) -> io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// Discards a range (advisory; may do nothing).
    fn trim(&self, off: u64, len: u64) -> io::Result<()>;
    /// Writes zeros over a range; with `fast`, fails with
    /// `ErrorKind::Unsupported` rather than write them slowly.
    fn write_zeroes(&self, off: u64, len: u64, fast: bool) -> io::Result<()>;
    /// Whether writes are refused.
    fn read_only(&self) -> bool;
    /// What it is, for messages.
    fn describe(&self) -> String;
}

/// A file or block device.
pub struct FileBackend {
    file: File,
    size: u64,
    read_only: bool,
    name: String,
    block_device: bool,
}

impl FileBackend {
    /// Opens `path` (read/write unless `read_only`).
    pub fn open(path: &Path, read_only: bool) -> io::Result<FileBackend> {
        let mut file = OpenOptions::new().read(true).write(!read_only).open(path)?;
        use std::os::unix::fs::FileTypeExt;
        let block_device = file.metadata()?.file_type().is_block_device();
        let size = file.seek(SeekFrom::End(0))?;
        Ok(FileBackend { file, size, read_only, name: path.display().to_string(), block_device })
    }
}

fn fallocate(f: &File, mode: libc::c_int, off: u64, len: u64) -> io::Result<()> {
    // SAFETY: fallocate on a descriptor we own, with plain integer arguments.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, off as libc::off_t, len as libc::off_t) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl Backend for FileBackend {
    fn size(&self) -> u64 {
        self.size
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, off)
    }
    fn write_at(&self, data: &[u8], off: u64, fua: bool) -> io::Result<()> {
        self.file.write_all_at(data, off)?;
        if fua {
            self.file.sync_data()?;
        }
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn trim(&self, off: u64, len: u64) -> io::Result<()> {
        if self.block_device {
            return Ok(());
        }
        match fallocate(&self.file, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, off, len) {
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(()),
            r => r,
        }
    }
    fn write_zeroes(&self, off: u64, len: u64, fast: bool) -> io::Result<()> {
        if !self.block_device {
            for mode in [libc::FALLOC_FL_ZERO_RANGE, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE] {
                if fallocate(&self.file, mode, off, len).is_ok() {
                    return Ok(());
                }
            }
        }
        if fast {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "no fast zeroing here"));
        }
        let z = vec![0u8; (len as usize).min(1 << 20)];
        let mut at = off;
        while at < off + len {
            let n = ((off + len - at) as usize).min(z.len());
            self.file.write_all_at(&z[..n], at)?;
            at += n as u64;
        }
        Ok(())
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn describe(&self) -> String {
        self.name.clone()
    }
}

/// An NBD export.
pub struct NbdBackend {
    client: Client,
}

impl NbdBackend {
    /// Connects to `uri` (`nbd://HOST:PORT/NAME`, `nbd+unix:///NAME?socket=PATH`).
    pub fn connect(uri: &str, opts: ClientOptions) -> Result<NbdBackend, ztier_blk::client::ClientError> {
        Ok(NbdBackend { client: Client::connect(uri, opts)? })
    }

    /// The client (connections, reconnections).
    pub fn client(&self) -> &Client {
        &self.client
    }
}

impl Backend for NbdBackend {
    fn size(&self) -> u64 {
        self.client.size()
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        Ok(self.client.read(off, buf)?)
    }
    fn write_at(&self, data: &[u8], off: u64, fua: bool) -> io::Result<()> {
        Ok(self.client.write(off, data, fua)?)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(self.client.flush()?)
    }
    fn trim(&self, off: u64, len: u64) -> io::Result<()> {
        Ok(self.client.trim(off, len, false)?)
    }
    fn write_zeroes(&self, off: u64, len: u64, fast: bool) -> io::Result<()> {
        Ok(self.client.write_zeroes(off, len, fast, false)?)
    }
    fn read_only(&self) -> bool {
        self.client.info().read_only()
    }
    fn describe(&self) -> String {
        self.client.describe()
    }
}

/// A backend in memory (for tests): every write applied at once.
pub struct MemBackend {
    data: RwLock<Vec<u8>>,
}

impl MemBackend {
    /// `size` bytes of zeros.
    pub fn new(size: u64) -> MemBackend {
        MemBackend { data: RwLock::new(vec![0u8; size as usize]) }
    }
    /// A copy of the contents.
    pub fn contents(&self) -> Vec<u8> {
        self.data.read().clone()
    }
    /// Changes the contents behind the cache's back (for tests of a
    /// backing changed while the cache was offline).
    pub fn poke(&self, off: u64, bytes: &[u8]) {
        self.data.write()[off as usize..off as usize + bytes.len()].copy_from_slice(bytes);
    }
}

fn range(len: usize, off: u64, n: usize) -> io::Result<std::ops::Range<usize>> {
    match (off as usize).checked_add(n) {
        Some(end) if end <= len => Ok(off as usize..end),
        _ => Err(io::Error::new(io::ErrorKind::InvalidInput, "beyond the end")),
    }
}

impl Backend for MemBackend {
    fn size(&self) -> u64 {
        self.data.read().len() as u64
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let d = self.data.read();
        buf.copy_from_slice(&d[range(d.len(), off, buf.len())?]);
        Ok(())
    }
    fn write_at(&self, data: &[u8], off: u64, _fua: bool) -> io::Result<()> {
        let mut d = self.data.write();
        let r = range(d.len(), off, data.len())?;
        d[r].copy_from_slice(data);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn trim(&self, off: u64, len: u64) -> io::Result<()> {
        self.write_zeroes(off, len, false)
    }
    fn write_zeroes(&self, off: u64, len: u64, _fast: bool) -> io::Result<()> {
        let mut d = self.data.write();
        let r = range(d.len(), off, len as usize)?;
        d[r].fill(0);
        Ok(())
    }
    fn read_only(&self) -> bool {
        false
    }
    fn describe(&self) -> String {
        "memory".into()
    }
}

/// Opens a backing given on the command line: an `nbd://` or
/// `nbd+unix://` URI, else a file or block device.
pub fn open_backing(spec: &str, read_only: bool, opts: ClientOptions) -> io::Result<Box<dyn Backend>> {
    if spec.starts_with("nbd://") || spec.starts_with("nbd+unix://") || spec.starts_with("nbds") {
        let b = NbdBackend::connect(spec, opts).map_err(io::Error::other)?;
        if !read_only && b.read_only() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{spec} is a read-only export: serve the cache with --readonly"),
            ));
        }
        Ok(Box::new(b))
    } else {
        Ok(Box::new(FileBackend::open(Path::new(spec), read_only)?))
    }
}
