//! The next tier: where the store's oldest entries go when it is full,
//! **still compressed**.
//!
//! A [`NextTier`] receives an entry's bytes exactly as the store held them
//! (codec output, raw page, or nothing for zero/same-filled pages) together
//! with the [`SpillMeta`] needed to check and decode them later. The store
//! calls a tier only while it holds the lock of the shard that owns the key,
//! so a tier sees the operations on one key in order.
//!
//! Tiers in this crate:
//!
//! * no tier at all (`Option::None` in [`crate::Store::with_tier`]):
//!   ephemeral entries are dropped; entries of persistent pools are never
//!   evicted (a put that does not fit is refused instead).
//! * [`MemoryTier`] — a bounded map in RAM (tests; stand-in for a remote
//!   tier).
//! * [`FileTier`] — de Castro's compressed swap: a spill file written as a
//!   log of segments past the page cache (`O_DIRECT`), entries packed in a
//!   write buffer, holes left by removed entries compacted.
//!
//! A remote-RAM tier and a backing block device implement the same trait.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::lock::Mutex;

use crate::Key;

/// What the store knows about a spilled entry besides its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpillMeta {
    /// The entry's form/codec tag (drawn in the docs of the store module, which uses this one).
    pub tag: u8,
    /// Entry flags (dirty, file-backed).
    pub flags: u8,
    /// Stored length in bytes (0 for zero/same-filled pages).
    pub len: u16,
    /// crc32c of the stored bytes.
    pub crc: u32,
    /// The fill pattern of a same-filled page (0 otherwise).
    pub pattern: u64,
}

/// Errors of a next tier.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    /// The tier has no room for the entry.
    #[error("next tier is full")]
    Full,
    /// I/O on the tier's medium failed.
    #[error("next tier I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// A place for entries the store evicts, kept compressed.
pub trait NextTier: Send + Sync {
    /// A short name for reports.
    fn name(&self) -> String;
    /// Stores (or replaces) the entry for `key`.
    fn put(&self, key: Key, meta: SpillMeta, data: &[u8]) -> Result<(), TierError>;
    /// Copies the entry for `key` into `out` (resized to its length) and
    /// returns its metadata; `remove` also deletes it. `Ok(None)` if absent.
    fn get(&self, key: Key, out: &mut Vec<u8>, remove: bool) -> Result<Option<SpillMeta>, TierError>;
    /// Deletes the entry for `key`; returns whether there was one.
    fn remove(&self, key: Key) -> bool;
    /// Whether a [`NextTier::get`] of `key` would find it now, without
    /// reading it. The default says no: a caller then treats the entry
    /// as absent (the store's [`crate::Store::holds`]: a clean page is
    /// compressed again rather than trusted to a copy it cannot see).
    fn contains(&self, _key: Key) -> bool {
        false
    }
    /// Deletes every entry of `object` in `pool`; returns how many.
    fn remove_object(&self, pool: u32, object: u64) -> usize;
    /// Deletes every entry of `pool`; returns how many.
    fn remove_pool(&self, pool: u32) -> usize;
    /// Entries held.
    fn entries(&self) -> usize;
    /// Bytes of the tier's medium in use for entries.
    fn bytes_used(&self) -> u64;
    /// RAM the tier holds beside its index (its I/O buffers), which the
    /// store counts as its own memory.
    fn memory_bytes(&self) -> u64 {
        0
    }
    /// A spill file's counters (`None` for other tiers).
    fn file_stats(&self) -> Option<FileStats> {
        None
    }
    /// Why the latest failed [`NextTier::put`] failed, in words for a
    /// message to the user (`None` if no put has failed).
    fn last_error(&self) -> Option<String> {
        None
    }
    /// Before a fork, in the parent, with no other call in progress or
    /// made until [`NextTier::after_fork`] (in the child) or
    /// [`NextTier::parent_after_fork`]: readies a copy of every entry for
    /// the child. Returns whether it did, so that the child keeps the
    /// entries; if not (the default), the caller must take them back
    /// before forking, since the child's tier starts empty.
    fn prepare_fork(&self) -> Result<bool, TierError> {
        Ok(false)
    }
    /// In the parent after a fork (or a failed one): lets go of what
    /// [`NextTier::prepare_fork`] readied for the child.
    fn parent_after_fork(&self) {}
    /// In a child just forked, whose tier is a copy of its parent's: make
    /// it the child's own, so that neither process sees the other's
    /// later entries or overwrites its space. Called with no other thread
    /// running and before any other call. The default refuses (a tier on
    /// a medium the two processes would share, with no way to part).
    fn after_fork(&self) -> Result<(), TierError> {
        Err(TierError::Io(std::io::Error::other(format!(
            "the {} tier cannot be parted from a forked child's",
            self.name()
        ))))
    }
    /// Reads the entries it holds of `keys` ahead of their gets, for a
    /// bring-back of many pages: in few large reads, and without holding
    /// off other calls while it reads, so that the gets that follow take
    /// the bytes from memory. An entry removed or replaced meanwhile is
    /// not staged (its get reads it as ever). Returns how many entries
    /// were staged; the default (a tier in RAM) stages none.
    fn stage(&self, keys: &[Key]) -> Result<usize, TierError> {
        let _ = keys;
        Ok(0)
    }
    /// Lets go of what [`NextTier::stage`] read and no get took.
    fn unstage(&self) {}
}

/// Copies `len` bytes at `off` of `from` to the same offset of `to`.
fn copy_range(from: &File, to: &File, off: u64, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let (mut a, mut b) = (off as libc::loff_t, off as libc::loff_t);
    let end = off + len;
    while (a as u64) < end {
        let want = (end - a as u64).min(1 << 30) as usize;
        // SAFETY: two open descriptors and live offsets, which the call
        // advances; it touches no memory of ours.
        let n = unsafe { libc::copy_file_range(from.as_raw_fd(), &mut a, to.as_raw_fd(), &mut b, want, 0) };
        match n {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n if n > 0 => {}
            _ => {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    // Not between these files: read and write instead.
                    Some(libc::EXDEV | libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP) => {
                        return copy_by_hand(from, to, a as u64, end - a as u64)
                    }
                    Some(libc::EINTR) => {}
                    _ => return Err(e),
                }
            }
        }
    }
    Ok(())
}

/// [`copy_range`] through a buffer.
fn copy_by_hand(from: &File, to: &File, mut off: u64, len: u64) -> std::io::Result<()> {
    let end = off + len;
    // Aligned: either file may be open `O_DIRECT`.
    let mut buf = Aligned::new(1 << 20);
    while off < end {
        let n = (end - off).min(buf.len() as u64) as usize;
        from.read_exact_at(&mut buf[..n], off)?;
        to.write_all_at(&buf[..n], off)?;
        off += n as u64;
    }
    Ok(())
}

fn remove_where<V>(
    map: &mut HashMap<Key, V>,
    mut f: impl FnMut(&Key) -> bool,
    mut on: impl FnMut(V),
) -> usize {
    let keys: Vec<Key> = map.keys().filter(|k| f(k)).copied().collect();
    for k in &keys {
        if let Some(v) = map.remove(k) {
            on(v);
        }
    }
    keys.len()
}

/// Entries of a [`MemoryTier`] and the bytes they hold.
type MemoryMap = (HashMap<Key, (SpillMeta, Box<[u8]>)>, u64);

/// A next tier in RAM, holding at most `capacity` bytes of entry data.
pub struct MemoryTier {
    inner: Mutex<MemoryMap>,
    capacity: u64,
}

impl MemoryTier {
    /// A tier that holds up to `capacity` bytes of entry data.
    pub fn new(capacity: u64) -> Self {
        MemoryTier { inner: Mutex::new((HashMap::new(), 0)), capacity }
    }
}

impl NextTier for MemoryTier {
    fn name(&self) -> String {
        "memory".into()
    }

    /// The child's copy of the map will be its own.
    fn prepare_fork(&self) -> Result<bool, TierError> {
        Ok(true)
    }

    /// The child's copy of the map is its own already.
    fn after_fork(&self) -> Result<(), TierError> {
        Ok(())
    }

    fn put(&self, key: Key, meta: SpillMeta, data: &[u8]) -> Result<(), TierError> {
        let mut g = self.inner.lock();
        let (map, used) = &mut *g;
        let old = map.get(&key).map_or(0, |v| v.1.len() as u64);
        if *used - old + data.len() as u64 > self.capacity {
            return Err(TierError::Full);
        }
        *used = *used - old + data.len() as u64;
        map.insert(key, (meta, data.into()));
        Ok(())
    }

    fn get(&self, key: Key, out: &mut Vec<u8>, remove: bool) -> Result<Option<SpillMeta>, TierError> {
        let mut g = self.inner.lock();
        let (map, used) = &mut *g;
        let meta = match map.get(&key) {
            None => return Ok(None),
            Some((m, d)) => {
                out.clear();
                out.extend_from_slice(d);
                *m
            }
        };
        if remove {
            *used -= out.len() as u64;
            map.remove(&key);
        }
        Ok(Some(meta))
    }

    fn remove(&self, key: Key) -> bool {
        let mut g = self.inner.lock();
        let (map, used) = &mut *g;
        match map.remove(&key) {
            Some((_, d)) => {
                *used -= d.len() as u64;
                true
            }
            None => false,
        }
    }

    fn contains(&self, key: Key) -> bool {
        self.inner.lock().0.contains_key(&key)
    }

    fn remove_object(&self, pool: u32, object: u64) -> usize {
        let mut g = self.inner.lock();
        let (map, used) = &mut *g;
        remove_where(map, |k| k.pool == pool && k.object == object, |(_, d)| *used -= d.len() as u64)
    }

    fn remove_pool(&self, pool: u32) -> usize {
        let mut g = self.inner.lock();
        let (map, used) = &mut *g;
        remove_where(map, |k| k.pool == pool, |(_, d)| *used -= d.len() as u64)
    }

    fn entries(&self) -> usize {
        self.inner.lock().0.len()
    }

    fn bytes_used(&self) -> u64 {
        self.inner.lock().1
    }
}

/// Block of the spill file: the unit of its reads and writes (`O_DIRECT`
/// wants them aligned to the device's block).
pub const FILE_BLOCK: usize = 4096;

/// Segment of the spill file: entries are gathered in a write buffer of
/// this size and written to the file a segment at a time.
pub const FILE_SEGMENT: usize = 64 << 10;

/// Free space the file may hold beyond 1.5× its live bytes before a
/// segment is compacted.
const COMPACT_SLACK: u64 = 4 * FILE_SEGMENT as u64;

/// No segment: an entry of no bytes (a zero or same-filled page).
const NO_SEGMENT: u32 = u32::MAX;

/// A buffer aligned to [`FILE_BLOCK`], as `O_DIRECT` needs.
struct Aligned {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is owned memory, reached only through `&`/`&mut self`.
unsafe impl Send for Aligned {}
// SAFETY: as above; shared access reads only.
unsafe impl Sync for Aligned {}

impl Aligned {
    fn new(len: usize) -> Self {
        let layout =
            std::alloc::Layout::from_size_align(len.max(FILE_BLOCK), FILE_BLOCK).expect("a valid layout");
        // SAFETY: a layout of non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = std::ptr::NonNull::new(ptr) else { std::alloc::handle_alloc_error(layout) };
        Aligned { ptr, len: layout.size() }
    }
}

impl std::ops::Deref for Aligned {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes (zeroed at allocation) owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for Aligned {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, borrowed exclusively through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this size and alignment.
        unsafe {
            std::alloc::dealloc(
                self.ptr.as_ptr(),
                std::alloc::Layout::from_size_align_unchecked(self.len, FILE_BLOCK),
            )
        }
    }
}

/// Where an entry of the spill file is.
#[derive(Clone, Copy)]
struct Place {
    seg: u32,
    /// Offset in the segment.
    off: u32,
    /// Bytes it takes there: its length and the padding before it.
    foot: u32,
    meta: SpillMeta,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum SegState {
    Free,
    /// Being filled in the write buffer.
    Open,
    /// Written to the file, read-only until all its entries are gone.
    Sealed,
}

#[derive(Clone)]
struct Segment {
    state: SegState,
    /// Bytes its live entries take (`Place::foot`).
    live: u64,
    count: u32,
    /// Whether its space in the file is allocated.
    reserved: bool,
    /// Keys put into it (some since removed or moved: the index says).
    keys: Vec<Key>,
}

/// I/O counters of a [`FileTier`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileStats {
    /// Bytes of the file's space in use: its written segments and the
    /// one being filled (a freed segment's space is given back to the
    /// file system, and the file cut short when they are at its end).
    pub file_bytes: u64,
    /// RAM the tier holds for its I/O: the write buffer and the read
    /// buffers (not its index).
    pub memory_bytes: u64,
    /// Reads from the file.
    pub reads: u64,
    /// Bytes of those reads.
    pub read_bytes: u64,
    /// Segments written (and reserved by writing zeros).
    pub writes: u64,
    /// Bytes of those writes.
    pub write_bytes: u64,
    /// Gets served from the write buffer, the segment read last or what
    /// was read ahead ([`NextTier::stage`]).
    pub buffer_hits: u64,
    /// Segments compacted.
    pub compactions: u64,
    /// Entries moved by compaction.
    pub compaction_moves: u64,
    /// Whether the file is read and written past the page cache
    /// (`O_DIRECT`); if not, through it, each range dropped from it after
    /// use (`POSIX_FADV_DONTNEED`).
    pub direct: bool,
}

struct FileInner {
    file: File,
    index: HashMap<Key, Place>,
    segs: Vec<Segment>,
    /// Free segments below the last one in use.
    free: BTreeSet<u32>,
    /// The segment being filled in `buf`, and how far.
    open: Option<u32>,
    fill: usize,
    buf: Aligned,
    /// A segment read whole, and which (`None`: none valid).
    seg_read: Aligned,
    seg_cached: Option<u32>,
    /// The segment the latest read from the file was in.
    last_read: u32,
    /// A buffer for reads of a block.
    blocks: Aligned,
    /// Bytes of live entries (`Place::foot`).
    used: u64,
    /// Segments sealed.
    sealed: u64,
    io: FileStats,
    /// Why the latest failed put failed.
    last_error: Option<String>,
    /// From [`NextTier::prepare_fork`] to the fork: a new spill file
    /// holding every written segment at its offset, for the child.
    for_child: Option<File>,
    /// Entries being read ahead or read ([`NextTier::stage`]); a put or
    /// removal of the key drops its one. No segment is compacted while
    /// there are any.
    staged: HashMap<Key, Staged>,
    /// The latest [`NextTier::stage`] call's number.
    stagings: u64,
}

/// An entry of [`FileInner::staged`].
enum Staged {
    /// To be read by the [`NextTier::stage`] call of this number.
    Pending(u64),
    /// The entry's bytes.
    Ready(Box<[u8]>),
}

/// Most bytes [`NextTier::stage`] reads in one read (16 segments).
const STAGE_READ: u64 = 1 << 20;

/// Segments between two to stage that one read takes along rather than
/// reading them apart.
const STAGE_GAP: u32 = 1;

/// A spill file: entries kept compressed on a file (de Castro's
/// compressed swap), **read from the disk, not from the page cache**:
/// the file is opened `O_DIRECT`. Entries are packed into a write buffer
/// of a segment ([`FILE_SEGMENT`]), an entry of a block or less never
/// across a block boundary; a full segment is written whole, at the
/// lowest free segment of the file. A get reads the block(s) holding the
/// entry (from the write buffer if it is there); two gets in a row from
/// one segment read it whole, and the next gets from it are served from
/// that copy. Removed entries leave holes; when the file's written
/// segments exceed 1.5× the live bytes plus 4 segments of slack, the
/// segment with the fewest live bytes is read and its live entries
/// appended again. Where the file system refuses `O_DIRECT`, the file
/// is read and written through the page cache and each range dropped
/// from it after use ([`FileStats::direct`] says which).
///
/// The index lives in RAM; the file is scratch space (truncated when
/// opened), not a persistent format.
pub struct FileTier {
    max_bytes: u64,
    inner: Mutex<FileInner>,
    /// Opens a new, empty spill file (for a forked child: see
    /// [`NextTier::after_fork`]).
    reopen: Option<Opener>,
}

/// How a [`FileTier`] opens its spill file.
pub type Opener = Box<dyn Fn() -> std::io::Result<File> + Send + Sync>;

/// Sets `O_DIRECT` on `file`; whether it took.
fn set_direct(file: &File) -> bool {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on an open descriptor; no memory involved.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    fl >= 0 && unsafe { libc::fcntl(fd, libc::F_SETFL, fl | libc::O_DIRECT) } == 0
}

/// Clears `O_DIRECT` on `file`.
fn clear_direct(file: &File) {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on an open descriptor; no memory involved.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if fl >= 0 {
        // SAFETY: as above.
        unsafe { libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_DIRECT) };
    }
}

/// Reads that should not read ahead.
fn advise_random(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: advice on an open descriptor; no memory involved.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
}

/// Drops `len` bytes at `off` of `file` from the page cache, written out
/// first (they are dropped only clean).
fn drop_cached(file: &File, off: u64, len: u64, written: bool) {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    if written {
        // SAFETY: on an open descriptor; no memory involved.
        unsafe {
            libc::sync_file_range(
                fd,
                off as libc::off64_t,
                len as libc::off64_t,
                libc::SYNC_FILE_RANGE_WAIT_BEFORE
                    | libc::SYNC_FILE_RANGE_WRITE
                    | libc::SYNC_FILE_RANGE_WAIT_AFTER,
            )
        };
    }
    // SAFETY: as above.
    unsafe { libc::posix_fadvise(fd, off as libc::off_t, len as libc::off_t, libc::POSIX_FADV_DONTNEED) };
}

impl FileTier {
    /// Creates (or truncates) the spill file at `path`, holding at most
    /// `max_bytes` of entries.
    pub fn create(path: &Path, max_bytes: u64) -> std::io::Result<Self> {
        let file =
            std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path)?;
        Ok(Self::from_file(file, max_bytes))
    }

    /// A spill file on `file`, open for reading and writing and empty,
    /// holding at most `max_bytes` of entries (the file itself may reach
    /// 1.5× that and 4 segments of slack before segments are compacted).
    pub fn from_file(file: File, max_bytes: u64) -> Self {
        let direct = set_direct(&file);
        if !direct {
            advise_random(&file);
        }
        FileTier {
            max_bytes,
            reopen: None,
            inner: Mutex::new(FileInner {
                file,
                index: HashMap::new(),
                segs: Vec::new(),
                free: BTreeSet::new(),
                open: None,
                fill: 0,
                buf: Aligned::new(FILE_SEGMENT),
                seg_read: Aligned::new(FILE_SEGMENT),
                seg_cached: None,
                last_read: NO_SEGMENT,
                blocks: Aligned::new(FILE_BLOCK),
                used: 0,
                sealed: 0,
                io: FileStats { direct, ..FileStats::default() },
                last_error: None,
                for_child: None,
                staged: HashMap::new(),
                stagings: 0,
            }),
        }
    }

    /// A spill file on what `open` opens (open for reading and writing,
    /// and empty), holding at most `max_bytes` of entries. A forked
    /// child opens a file of its own the same way
    /// ([`NextTier::after_fork`]).
    pub fn reopenable(open: Opener, max_bytes: u64) -> std::io::Result<Self> {
        let mut t = Self::from_file(open()?, max_bytes);
        t.reopen = Some(open);
        Ok(t)
    }

    /// Bytes of file space reached: up to the end of the last segment
    /// written or being filled (0 when it holds nothing).
    pub fn file_end(&self) -> u64 {
        self.inner.lock().file_end()
    }

    /// The tier's I/O counters.
    pub fn file_stats(&self) -> FileStats {
        let g = self.inner.lock();
        FileStats { file_bytes: g.file_bytes(), memory_bytes: g.memory(), ..g.io }
    }

    /// Writes the segment being filled to the file now (it is written
    /// when full otherwise); the next entries go to another segment.
    pub fn flush(&self) -> std::io::Result<()> {
        self.inner.lock().seal()
    }
}

impl FileInner {
    /// The entry of `key` is gone or replaced: its staged bytes too.
    fn unstage(&mut self, key: &Key) {
        if !self.staged.is_empty() {
            self.staged.remove(key);
        }
    }

    fn file_end(&self) -> u64 {
        let last = self.segs.iter().rposition(|s| match s.state {
            SegState::Sealed => true,
            SegState::Open => self.fill > 0,
            SegState::Free => false,
        });
        last.map_or(0, |i| (i as u64 + 1) * FILE_SEGMENT as u64)
    }

    fn file_bytes(&self) -> u64 {
        let n = self.segs.iter().filter(|s| s.state != SegState::Free).count() as u64;
        n * FILE_SEGMENT as u64
    }

    fn memory(&self) -> u64 {
        (self.buf.len + self.seg_read.len + self.blocks.len) as u64
    }

    /// `O_DIRECT` refused at I/O (`EINVAL`): through the page cache from now.
    fn fall_back(&mut self, e: &std::io::Error) -> bool {
        if self.io.direct && e.raw_os_error() == Some(libc::EINVAL) {
            clear_direct(&self.file);
            advise_random(&self.file);
            self.io.direct = false;
            return true;
        }
        false
    }

    fn write_at(&mut self, which: Which, len: usize, off: u64) -> std::io::Result<()> {
        loop {
            let b = match which {
                Which::Buf => &self.buf,
                Which::SegRead => &self.seg_read,
            };
            match self.file.write_all_at(&b[..len], off) {
                Ok(()) => break,
                Err(e) if self.fall_back(&e) => {}
                Err(e) => return Err(e),
            }
        }
        if !self.io.direct {
            drop_cached(&self.file, off, len as u64, true);
        }
        Ok(())
    }

    /// Reads `len` bytes at `off` (aligned) into the buffer `which`.
    fn read_at(&mut self, which: Which2, len: usize, off: u64) -> std::io::Result<()> {
        loop {
            let b = match which {
                Which2::Seg => &mut self.seg_read,
                Which2::Blocks => &mut self.blocks,
            };
            match self.file.read_exact_at(&mut b[..len], off) {
                Ok(()) => break,
                Err(e) if self.fall_back(&e) => {}
                Err(e) => return Err(e),
            }
        }
        if !self.io.direct {
            drop_cached(&self.file, off, len as u64, false);
        }
        self.io.reads += 1;
        self.io.read_bytes += len as u64;
        Ok(())
    }

    /// Writes the open segment (the blocks it filled) and seals it.
    fn seal(&mut self) -> std::io::Result<()> {
        let Some(s) = self.open else { return Ok(()) };
        if self.fill == 0 {
            return Ok(());
        }
        let len = self.fill.div_ceil(FILE_BLOCK) * FILE_BLOCK;
        self.write_at(Which::Buf, len, s as u64 * FILE_SEGMENT as u64)?;
        self.io.writes += 1;
        self.io.write_bytes += len as u64;
        self.segs[s as usize].state = SegState::Sealed;
        self.sealed += 1;
        self.open = None;
        self.fill = 0;
        Ok(())
    }

    /// Opens a segment to fill: the lowest free one, or a new one at the
    /// end, its space reserved in the file first (so that a full device
    /// refuses the put now, not a write of entries already taken).
    fn open_segment(&mut self) -> std::io::Result<()> {
        let s = match self.free.first() {
            Some(&s) => s,
            None => {
                let s = self.segs.len() as u32;
                self.segs.push(Segment {
                    state: SegState::Free,
                    live: 0,
                    count: 0,
                    reserved: false,
                    keys: Vec::new(),
                });
                self.free.insert(s);
                s
            }
        };
        if !self.segs[s as usize].reserved {
            self.reserve(s)?;
        }
        self.free.remove(&s);
        if self.seg_cached == Some(s) {
            self.seg_cached = None;
        }
        self.segs[s as usize] =
            Segment { state: SegState::Open, live: 0, count: 0, reserved: true, keys: Vec::new() };
        self.open = Some(s);
        self.fill = 0;
        Ok(())
    }

    fn reserve(&mut self, s: u32) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let off = s as u64 * FILE_SEGMENT as u64;
        // SAFETY: on an open descriptor; no memory involved.
        let r = unsafe {
            libc::fallocate(self.file.as_raw_fd(), 0, off as libc::off_t, FILE_SEGMENT as libc::off_t)
        };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                // No reservation here: written instead (zeros).
                Some(libc::EOPNOTSUPP | libc::ENODEV | libc::EINVAL | libc::ENOSYS | libc::ESPIPE) => {
                    self.seg_cached = None;
                    self.seg_read.fill(0);
                    self.write_at(Which::SegRead, FILE_SEGMENT, off)?;
                }
                _ => return Err(e),
            }
        }
        self.segs[s as usize].reserved = true;
        Ok(())
    }

    /// Appends an entry to the open segment (opening one, and writing the
    /// full one, as needed); its place.
    fn append(&mut self, key: Key, meta: SpillMeta, data: &[u8]) -> std::io::Result<Place> {
        let len = data.len();
        let fits = |fill: usize| {
            let mut off = fill;
            if len <= FILE_BLOCK && off % FILE_BLOCK + len > FILE_BLOCK {
                off = off.next_multiple_of(FILE_BLOCK);
            }
            (off + len <= FILE_SEGMENT).then_some(off)
        };
        let off = match (self.open, fits(self.fill)) {
            (Some(_), Some(off)) => off,
            _ => {
                self.seal()?;
                self.open_segment()?;
                0
            }
        };
        let s = self.open.expect("a segment open");
        self.buf[off..off + len].copy_from_slice(data);
        let foot = (off + len - self.fill) as u32;
        self.fill = off + len;
        let seg = &mut self.segs[s as usize];
        seg.live += foot as u64;
        seg.count += 1;
        seg.keys.push(key);
        self.used += foot as u64;
        Ok(Place { seg: s, off: off as u32, foot, meta })
    }

    /// Forgets an entry's place: its segment freed once empty.
    fn release(&mut self, p: Place) {
        if p.seg == NO_SEGMENT {
            return;
        }
        self.used -= p.foot as u64;
        let seg = &mut self.segs[p.seg as usize];
        seg.live -= p.foot as u64;
        seg.count -= 1;
        if seg.count > 0 {
            return;
        }
        seg.keys = Vec::new();
        match seg.state {
            SegState::Open => {
                self.fill = 0;
                self.trim();
            }
            SegState::Sealed => {
                seg.state = SegState::Free;
                self.sealed -= 1;
                if self.seg_cached == Some(p.seg) {
                    self.seg_cached = None;
                }
                self.free.insert(p.seg);
                self.unreserve(p.seg);
                self.trim();
            }
            SegState::Free => unreachable!("an entry in a free segment"),
        }
    }

    /// Gives segment `s`'s space back to the file system (a hole).
    fn unreserve(&mut self, s: u32) {
        use std::os::fd::AsRawFd;
        let off = s as u64 * FILE_SEGMENT as u64;
        // SAFETY: on an open descriptor; no memory involved.
        let r = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off as libc::off_t,
                FILE_SEGMENT as libc::off_t,
            )
        };
        // Where holes cannot be made the space stays allocated.
        self.segs[s as usize].reserved = r != 0;
    }

    /// Gives back the free segments at the file's end.
    fn trim(&mut self) {
        let before = self.segs.len();
        loop {
            match self.segs.last().map(|s| s.state) {
                Some(SegState::Free) => {}
                // An empty open segment: closed (its buffer is kept).
                Some(SegState::Open) if self.fill == 0 => self.open = None,
                _ => break,
            }
            self.segs.pop();
            self.free.remove(&(self.segs.len() as u32));
        }
        if self.segs.len() < before {
            let _ = self.file.set_len(self.segs.len() as u64 * FILE_SEGMENT as u64);
        }
    }

    /// Copies the entry of `key`, at `p`, into `out` (from what was
    /// staged for it, if anything was).
    fn read(&mut self, key: &Key, p: Place, out: &mut Vec<u8>) -> std::io::Result<()> {
        let len = p.meta.len as usize;
        out.resize(len, 0);
        if len == 0 {
            return Ok(());
        }
        if let Some(Staged::Ready(b)) = self.staged.get(key) {
            if b.len() == len {
                out.copy_from_slice(b);
                self.io.buffer_hits += 1;
                return Ok(());
            }
        }
        let off = p.off as usize;
        if self.open == Some(p.seg) {
            out.copy_from_slice(&self.buf[off..off + len]);
            self.io.buffer_hits += 1;
            return Ok(());
        }
        if self.seg_cached == Some(p.seg) {
            out.copy_from_slice(&self.seg_read[off..off + len]);
            self.io.buffer_hits += 1;
            return Ok(());
        }
        let base = p.seg as u64 * FILE_SEGMENT as u64;
        if self.last_read == p.seg || len > FILE_BLOCK {
            // A second read from one segment in a row: read it whole (so
            // is an entry of more than a block).
            self.read_segment(p.seg)?;
            out.copy_from_slice(&self.seg_read[off..off + len]);
            return Ok(());
        }
        self.last_read = p.seg;
        // An entry of a block or less lies in one block.
        let start = off / FILE_BLOCK * FILE_BLOCK;
        self.read_at(Which2::Blocks, FILE_BLOCK, base + start as u64)?;
        out.copy_from_slice(&self.blocks[off - start..off - start + len]);
        Ok(())
    }

    /// Reads segment `s` whole into the segment buffer.
    fn read_segment(&mut self, s: u32) -> std::io::Result<()> {
        self.seg_cached = None;
        self.read_at(Which2::Seg, FILE_SEGMENT, s as u64 * FILE_SEGMENT as u64)?;
        self.seg_cached = Some(s);
        Ok(())
    }

    /// While the written segments exceed 1.5× the live bytes and the
    /// slack, moves the live entries of the one with the fewest (at most
    /// two segments a call, so that no call takes long).
    fn compact(&mut self) {
        if !self.staged.is_empty() {
            // A bring-back is reading entries ahead: their places stay
            // (and the file is being emptied).
            return;
        }
        for _ in 0..2 {
            if self.sealed * FILE_SEGMENT as u64 <= self.used + self.used / 2 + COMPACT_SLACK {
                return;
            }
            let Some(s) = (0..self.segs.len())
                .filter(|&i| self.segs[i].state == SegState::Sealed)
                .min_by_key(|&i| self.segs[i].live)
            else {
                return;
            };
            if self.compact_segment(s as u32).is_err() {
                return;
            }
        }
    }

    fn compact_segment(&mut self, s: u32) -> std::io::Result<()> {
        if self.seg_cached != Some(s) {
            self.read_segment(s)?;
        }
        self.io.compactions += 1;
        let keys = std::mem::take(&mut self.segs[s as usize].keys);
        let mut data = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let Some(&p) = self.index.get(key).filter(|p| p.seg == s) else { continue };
            let off = p.off as usize;
            data.clear();
            data.extend_from_slice(&self.seg_read[off..off + p.meta.len as usize]);
            let place = match self.append(*key, p.meta, &data) {
                Ok(place) => place,
                Err(e) => {
                    // The rest stays where it is.
                    if self.segs[s as usize].state == SegState::Sealed {
                        self.segs[s as usize].keys = keys[i..].to_vec();
                    }
                    return Err(e);
                }
            };
            self.index.insert(*key, place);
            self.io.compaction_moves += 1;
            // Last: it may free the segment (and drop what was read).
            self.release(p);
        }
        Ok(())
    }

    fn remove_where(&mut self, mut f: impl FnMut(&Key) -> bool) -> usize {
        self.staged.retain(|k, _| !f(k));
        let mut gone = Vec::new();
        let n = remove_where(&mut self.index, f, |p| gone.push(p));
        for p in gone {
            self.release(p);
        }
        self.compact();
        n
    }
}

#[derive(Clone, Copy)]
enum Which {
    Buf,
    SegRead,
}

#[derive(Clone, Copy)]
enum Which2 {
    Seg,
    Blocks,
}

impl NextTier for FileTier {
    fn name(&self) -> String {
        "file".into()
    }

    fn put(&self, key: Key, meta: SpillMeta, data: &[u8]) -> Result<(), TierError> {
        let mut g = self.inner.lock();
        g.unstage(&key);
        if let Some(p) = g.index.remove(&key) {
            g.release(p);
        }
        let len = meta.len as u64;
        if len == 0 {
            g.index.insert(key, Place { seg: NO_SEGMENT, off: 0, foot: 0, meta });
            return Ok(());
        }
        if g.used + len > self.max_bytes {
            g.last_error = Some(format!("the spill file reached its limit of {} bytes", self.max_bytes));
            return Err(TierError::Full);
        }
        match g.append(key, meta, &data[..meta.len as usize]) {
            Ok(p) => {
                g.index.insert(key, p);
                g.compact();
                Ok(())
            }
            Err(e) => {
                g.last_error = Some(format!("writing the spill file failed: {e}"));
                Err(e.into())
            }
        }
    }

    fn get(&self, key: Key, out: &mut Vec<u8>, remove: bool) -> Result<Option<SpillMeta>, TierError> {
        let mut g = self.inner.lock();
        let Some(&p) = g.index.get(&key) else { return Ok(None) };
        g.read(&key, p, out)?;
        if remove {
            g.unstage(&key);
            g.index.remove(&key);
            g.release(p);
            g.compact();
        }
        Ok(Some(p.meta))
    }

    fn remove(&self, key: Key) -> bool {
        let mut g = self.inner.lock();
        g.unstage(&key);
        match g.index.remove(&key) {
            Some(p) => {
                g.release(p);
                g.compact();
                true
            }
            None => false,
        }
    }

    fn contains(&self, key: Key) -> bool {
        self.inner.lock().index.contains_key(&key)
    }

    fn remove_object(&self, pool: u32, object: u64) -> usize {
        self.inner.lock().remove_where(|k| k.pool == pool && k.object == object)
    }

    fn remove_pool(&self, pool: u32) -> usize {
        self.inner.lock().remove_where(|k| k.pool == pool)
    }

    fn entries(&self) -> usize {
        self.inner.lock().index.len()
    }

    fn bytes_used(&self) -> u64 {
        self.inner.lock().used
    }

    fn memory_bytes(&self) -> u64 {
        self.inner.lock().memory()
    }

    fn file_stats(&self) -> Option<FileStats> {
        Some(FileTier::file_stats(self))
    }

    fn last_error(&self) -> Option<String> {
        self.inner.lock().last_error.clone()
    }

    /// A new spill file (opened as the first was) with every written
    /// segment copied to the same offset, so that the child's copy of the
    /// index holds for it (the segment being filled is in the write
    /// buffer, which the child's memory copies): by the kernel
    /// (`copy_file_range`, runs of adjacent segments merged; a file
    /// system that shares blocks copies nothing), or read and written
    /// where the kernel will not. Copying the compressed bytes is the
    /// cheapest way to give the child its pages: before, every spilled
    /// page came back resident for each fork, far over the budget, and
    /// both processes compressed it again. Without an opener, nothing is
    /// readied (`Ok(false)`); an error (a full device) drops the partial
    /// copy.
    fn prepare_fork(&self) -> Result<bool, TierError> {
        let Some(open) = &self.reopen else { return Ok(false) };
        let mut g = self.inner.lock();
        g.for_child = None;
        let copy = open()?;
        let seg = FILE_SEGMENT as u64;
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for (i, s) in g.segs.iter().enumerate() {
            if s.state != SegState::Sealed {
                continue;
            }
            match runs.last_mut() {
                Some((a, l)) if *a + *l == i as u64 * seg => *l += seg,
                _ => runs.push((i as u64 * seg, seg)),
            }
        }
        for (off, len) in runs {
            copy_range(&g.file, &copy, off, len)?;
        }
        g.for_child = Some(copy);
        Ok(true)
    }

    fn parent_after_fork(&self) {
        self.inner.lock().for_child = None;
    }

    /// The file is shared with the parent: the child takes the copy
    /// [`NextTier::prepare_fork`] readied, or else a new, empty one. Then
    /// it must hold no entries (the parent's would be lost: take them
    /// back before forking).
    fn after_fork(&self) -> Result<(), TierError> {
        let mut g = self.inner.lock();
        // The parent's bring-back, if one was reading, is not the child's.
        g.staged = HashMap::new();
        if let Some(copy) = g.for_child.take() {
            g.io.direct = set_direct(&copy);
            if !g.io.direct {
                advise_random(&copy);
            }
            g.file = copy;
            // Space was reserved in the parent's file; this one has the
            // written segments only.
            for seg in g.segs.iter_mut() {
                seg.reserved = seg.state == SegState::Sealed;
            }
            g.last_error = None;
            return Ok(());
        }
        if !g.index.is_empty() {
            return Err(TierError::Io(std::io::Error::other(format!(
                "the spill file holds {} entries at fork; a child cannot keep them",
                g.index.len()
            ))));
        }
        let Some(open) = &self.reopen else {
            return Err(TierError::Io(std::io::Error::other(
                "the spill file was given ready-made; a forked child cannot open its own",
            )));
        };
        let file = open()?;
        g.io.direct = set_direct(&file);
        if !g.io.direct {
            advise_random(&file);
        }
        g.file = file;
        g.segs.clear();
        g.free.clear();
        g.open = None;
        g.fill = 0;
        g.seg_cached = None;
        g.last_read = NO_SEGMENT;
        g.used = 0;
        g.sealed = 0;
        g.last_error = None;
        Ok(())
    }

    /// The entries' places are looked up under the lock, and each key
    /// marked as being staged by this call (those in the write buffer,
    /// and of no bytes, are left to their gets); then the segments
    /// holding them are read whole, in the file's order, runs of them
    /// (1 MiB at most, a free segment between two read through)
    /// in one read each, with the lock let go (through a descriptor of
    /// its own, `O_DIRECT` as the tier's is), and each run's entries
    /// staged under it if still marked by this call. A put or removal of
    /// a key meanwhile drops its mark; while a mark stands the entry's
    /// segment is neither freed nor compacted, so the bytes read are its
    /// own. A run that cannot be read leaves its entries to their gets,
    /// and its error is returned once the others were read. (One read of
    /// a block or a segment at a time, as gets read, under the manager's
    /// lock, a hold's bring-back of 40 MiB outlasted its lease on a
    /// loaded machine.)
    fn stage(&self, keys: &[Key]) -> Result<usize, TierError> {
        let (file, direct, mut places, call) = {
            let mut g = self.inner.lock();
            let g = &mut *g;
            g.stagings += 1;
            let call = g.stagings;
            let mut places = Vec::new();
            for &k in keys {
                let Some(&p) = g.index.get(&k) else { continue };
                if p.seg == NO_SEGMENT || g.open == Some(p.seg) {
                    continue;
                }
                if !matches!(g.staged.get(&k), Some(Staged::Ready(_))) {
                    places.push((p.seg, p.off, p.meta.len, k));
                    g.staged.insert(k, Staged::Pending(call));
                }
            }
            if places.is_empty() {
                return Ok(0);
            }
            (g.file.try_clone()?, g.io.direct, places, call)
        };
        places.sort_unstable_by_key(|p| (p.0, p.1));
        let seg = FILE_SEGMENT as u64;
        let most = (STAGE_READ / seg) as u32;
        let mut buf = Aligned::new(STAGE_READ as usize);
        let (mut staged, mut failed, mut at) = (0, None, 0);
        while at < places.len() {
            let first = places[at].0;
            let (mut last, mut k) = (first, at + 1);
            while k < places.len() && places[k].0 <= last + 1 + STAGE_GAP && places[k].0 < first + most {
                last = places[k].0;
                k += 1;
            }
            let len = (last - first + 1) as usize * FILE_SEGMENT;
            let read = file.read_exact_at(&mut buf[..len], first as u64 * seg);
            if !direct {
                drop_cached(&file, first as u64 * seg, len as u64, false);
            }
            let mut g = self.inner.lock();
            match read {
                Ok(()) => {
                    g.io.reads += 1;
                    g.io.read_bytes += len as u64;
                    for &(s, off, n, key) in &places[at..k] {
                        let Some(st) = g.staged.get_mut(&key) else { continue };
                        if matches!(st, Staged::Pending(c) if *c == call) {
                            let from = (s - first) as usize * FILE_SEGMENT + off as usize;
                            *st = Staged::Ready(buf[from..from + n as usize].into());
                            staged += 1;
                        }
                    }
                }
                Err(e) => {
                    for (_, _, _, key) in &places[at..k] {
                        if matches!(g.staged.get(key), Some(Staged::Pending(c)) if *c == call) {
                            g.staged.remove(key);
                        }
                    }
                    failed.get_or_insert(e);
                }
            }
            drop(g);
            at = k;
        }
        match failed {
            Some(e) => Err(e.into()),
            None => Ok(staged),
        }
    }

    /// (Segments left uncompacted meanwhile are compacted at the next
    /// put or removal.)
    fn unstage(&self) {
        self.inner.lock().staged = HashMap::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(len: u16) -> SpillMeta {
        SpillMeta { tag: 5, flags: 0, len, crc: len as u32, pattern: 0 }
    }

    fn exercise(t: &dyn NextTier) {
        let k = |o: u64, i: u32| Key { pool: 1, object: o, index: i };
        for o in 0..20u64 {
            for i in 0..10u32 {
                let len = ((o * 37 + i as u64 * 101) % 4000 + 1) as u16;
                let d = vec![(o + i as u64) as u8; len as usize];
                t.put(k(o, i), meta(len), &d).unwrap();
            }
        }
        assert_eq!(t.entries(), 200);
        let mut out = Vec::new();
        let m = t.get(k(3, 4), &mut out, false).unwrap().unwrap();
        assert_eq!(out, vec![7u8; m.len as usize]);
        assert_eq!(t.remove_object(1, 3), 10);
        assert!(t.get(k(3, 4), &mut out, false).unwrap().is_none());
        // Replace with a different size, then take it exclusively.
        t.put(k(5, 5), meta(17), &[9u8; 17]).unwrap();
        assert_eq!(t.get(k(5, 5), &mut out, true).unwrap(), Some(meta(17)));
        assert_eq!(out, vec![9u8; 17]);
        assert!(!t.remove(k(5, 5)));
        assert!(t.remove(k(6, 6)));
        assert_eq!(t.remove_pool(1), 188);
        assert_eq!(t.entries(), 0);
        assert_eq!(t.bytes_used(), 0);
    }

    #[test]
    fn memory_tier_semantics_and_capacity() {
        exercise(&MemoryTier::new(1 << 30));
        let t = MemoryTier::new(100);
        let k = Key { pool: 0, object: 0, index: 0 };
        assert!(matches!(t.put(k, meta(101), &[0; 101]), Err(TierError::Full)));
        t.put(k, meta(100), &[0; 100]).unwrap();
    }

    #[test]
    fn file_tier_semantics_reuse_and_capacity() {
        let dir = std::env::temp_dir().join(format!("ztier-tier-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let t = FileTier::create(&dir.join("spill"), 1 << 30).unwrap();
        exercise(&t);
        // Everything freed: the file space shrinks back to nothing.
        assert_eq!(t.file_end(), 0);
        let small = FileTier::create(&dir.join("small"), 512).unwrap();
        let k = |i| Key { pool: 0, object: 0, index: i };
        small.put(k(0), meta(300), &[1; 300]).unwrap();
        assert_eq!(small.last_error(), None);
        assert!(matches!(small.put(k(1), meta(300), &[2; 300]), Err(TierError::Full)));
        assert_eq!(small.last_error().as_deref(), Some("the spill file reached its limit of 512 bytes"));
        let mut out = Vec::new();
        assert_eq!(small.get(k(0), &mut out, false).unwrap(), Some(meta(300)));
        assert_eq!(out, vec![1; 300]);
        std::fs::remove_dir_all(&dir).unwrap();
        // A full device: the write fails, its space is given back, and
        // the reason is kept.
        let full = FileTier::create(Path::new("/dev/full"), 1 << 20).unwrap();
        match full.put(k(0), meta(300), &[3; 300]) {
            Err(TierError::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::StorageFull),
            r => panic!("{r:?}"),
        }
        assert_eq!(full.file_end(), 0);
        assert_eq!(full.entries(), 0);
        let why = full.last_error().unwrap();
        assert!(why.starts_with("writing the spill file failed: No space left on device"), "{why}");
    }

    /// An opener of files 0, 1, 2, ... in `dir`, and how many it opened.
    fn numbered_files(dir: &Path) -> (Opener, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        let opened = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (d, o) = (dir.to_path_buf(), opened.clone());
        let open: Opener = Box::new(move || {
            let n = o.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(d.join(format!("{n}")))
        });
        (open, opened)
    }

    /// A forked child's tier: a file tier takes a new file of its own
    /// (and refuses while it holds entries, which the child would lose);
    /// one given a ready-made file cannot; a memory tier's copy is the
    /// child's already.
    #[test]
    fn after_fork_parts_a_tier_from_its_parent() {
        let dir = std::env::temp_dir().join(format!("ztier-tier-fork-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (open, opened) = numbered_files(&dir);
        let t = FileTier::reopenable(open, 1 << 20).unwrap();
        let k = |i| Key { pool: 0, object: 0, index: i };
        t.put(k(0), meta(300), &[1; 300]).unwrap();
        match t.after_fork() {
            Err(TierError::Io(e)) => assert!(e.to_string().contains("holds 1 entries at fork"), "{e}"),
            r => panic!("{r:?}"),
        }
        assert!(t.remove(k(0)));
        t.after_fork().unwrap();
        assert_eq!(opened.load(std::sync::atomic::Ordering::Relaxed), 2);
        t.put(k(1), meta(500), &[2; 500]).unwrap();
        let mut out = Vec::new();
        assert_eq!(t.get(k(1), &mut out, false).unwrap(), Some(meta(500)));
        assert_eq!(out, vec![2; 500]);
        // The new file took it; the parent's is as the parent left it.
        t.flush().unwrap();
        let at_start = |f: &str, n: usize| std::fs::read(dir.join(f)).unwrap()[..n].to_vec();
        assert_eq!(at_start("1", 500), vec![2; 500]);
        assert!(!std::fs::read(dir.join("0")).unwrap().starts_with(&[2; 500]));
        assert_eq!(t.get(k(1), &mut out, false).unwrap(), Some(meta(500)));
        assert_eq!(out, vec![2; 500]);
        let fixed = FileTier::create(&dir.join("fixed"), 1 << 20).unwrap();
        assert!(fixed.after_fork().is_err());
        std::fs::remove_dir_all(&dir).unwrap();
        let m = MemoryTier::new(1 << 20);
        m.put(k(2), meta(100), &[3; 100]).unwrap();
        m.after_fork().unwrap();
        assert_eq!(m.get(k(2), &mut out, true).unwrap(), Some(meta(100)));
        assert_eq!(out, vec![3; 100]);
    }

    /// With a copy readied before the fork, a forked child's file tier
    /// keeps every entry: it reads them from the copy (each at its
    /// offset, written through the page cache and read past it), whatever
    /// the parent then writes to its own file. The parent lets go of the
    /// copy and, holding entries, still cannot part without one.
    #[test]
    fn a_forked_child_keeps_the_entries_in_a_copy() {
        let dir = std::env::temp_dir().join(format!("ztier-tier-forkcopy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (open, opened) = numbered_files(&dir);
        let t = FileTier::reopenable(open, 1 << 20).unwrap();
        let k = |i| Key { pool: 0, object: 0, index: i };
        let data = |i: u32| vec![i as u8 + 1; 100 + 37 * i as usize];
        for i in 0..20 {
            t.put(k(i), meta(data(i).len() as u16), &data(i)).unwrap();
        }
        // Holes between the entries left (not copied).
        for i in [3, 4, 11] {
            assert!(t.remove(k(i)));
        }
        // Written to the file (not only in the write buffer, which the
        // child's memory would copy anyway).
        t.flush().unwrap();
        // The parent's side: readied, then let go.
        assert!(t.prepare_fork().unwrap());
        t.parent_after_fork();
        assert!(t.after_fork().unwrap_err().to_string().contains("holds 17 entries at fork"));
        // The child's side.
        assert!(t.prepare_fork().unwrap());
        assert_eq!(opened.load(std::sync::atomic::Ordering::Relaxed), 3);
        std::fs::write(dir.join("0"), vec![0xee; 8192]).unwrap();
        t.after_fork().unwrap();
        let mut out = Vec::new();
        for i in (0..20).filter(|i| ![3, 4, 11].contains(i)) {
            assert_eq!(t.get(k(i), &mut out, false).unwrap(), Some(meta(data(i).len() as u16)), "{i}");
            assert_eq!(out, data(i), "{i}");
        }
        assert!(t.get(k(3), &mut out, false).unwrap().is_none());
        // New entries go to the copy.
        t.put(k(30), meta(200), &[9; 200]).unwrap();
        assert_eq!(t.get(k(30), &mut out, true).unwrap(), Some(meta(200)));
        assert_eq!(out, vec![9; 200]);
        assert_eq!(t.entries(), 17);
        // A tier given a ready-made file readies nothing; a memory tier's
        // copy is the child's anyway.
        assert!(!FileTier::create(&dir.join("fixed"), 1 << 20).unwrap().prepare_fork().unwrap());
        assert!(MemoryTier::new(1 << 20).prepare_fork().unwrap());
        // Where the kernel will not copy between two files, they are read
        // and written.
        let (a, b) = (dir.join("a"), dir.join("b"));
        std::fs::write(&a, (0..3000u32).map(|i| i as u8).collect::<Vec<u8>>()).unwrap();
        let (fa, fb) = (File::open(&a).unwrap(), std::fs::File::create(&b).unwrap());
        copy_by_hand(&fa, &fb, 1000, 1500).unwrap();
        let got = std::fs::read(&b).unwrap();
        assert_eq!(got.len(), 2500);
        assert!(got[..1000].iter().all(|&x| x == 0));
        assert!(got[1000..].iter().enumerate().all(|(i, &x)| x == (1000 + i as u32) as u8));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Pages of `file` in the page cache (`mincore` of a mapping of it).
    fn cached_pages(file: &Path) -> usize {
        use std::os::fd::AsRawFd;
        let f = File::open(file).unwrap();
        let len = f.metadata().unwrap().len() as usize;
        if len == 0 {
            return 0;
        }
        // SAFETY: a new shared read-only mapping of an open file; only
        // its residency is asked, its bytes never touched.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0)
        };
        assert_ne!(p, libc::MAP_FAILED);
        let mut v = vec![0u8; len.div_ceil(4096)];
        // SAFETY: the mapping just made, `v` one byte a page of it.
        let r = unsafe { libc::mincore(p, len, v.as_mut_ptr()) };
        // SAFETY: unmaps what was mapped above.
        unsafe { libc::munmap(p, len) };
        assert_eq!(r, 0);
        v.iter().filter(|&&b| b & 1 != 0).count()
    }

    /// Entries of `n` bytes telling `i` apart.
    fn entry(i: u32, n: usize) -> Vec<u8> {
        (0..n).map(|j| (i as usize * 31 + j * 7 + (j >> 8)) as u8).collect()
    }

    /// 12 MiB written and read back, in entries of every size: the spill
    /// file is not in the page cache (the file system of the temporary
    /// folder takes `O_DIRECT`; where it does not, each range is dropped
    /// after use), and everything reads back.
    #[test]
    fn the_spill_file_stays_out_of_the_page_cache() {
        let dir = std::env::temp_dir().join(format!("ztier-tier-uncached-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("spill");
        let t = FileTier::create(&path, 1 << 30).unwrap();
        let k = |i| Key { pool: 0, object: 0, index: i };
        let len = |i: u32| [4096, 1000, 2500, 77, 4096, 3000][i as usize % 6];
        let (mut i, mut total) = (0, 0);
        while total < 12 << 20 {
            t.put(k(i), meta(len(i) as u16), &entry(i, len(i))).unwrap();
            total += len(i);
            i += 1;
        }
        let st = t.file_stats();
        assert!(st.write_bytes >= 12 << 20 && st.file_bytes >= 12 << 20, "{st:?}");
        // Read back in an order the file does not have (strided), then in its own.
        let mut out = Vec::new();
        for j in (0..i).map(|j| (j * 7919) % i).chain(0..i) {
            assert_eq!(t.get(k(j), &mut out, false).unwrap(), Some(meta(len(j) as u16)), "{j}");
            assert_eq!(out, entry(j, len(j)), "{j}");
        }
        let st = t.file_stats();
        assert!(st.read_bytes >= 12 << 20, "{st:?}");
        // Read ahead whole for a bring-back: not cached either.
        let keys: Vec<Key> = (0..i).map(k).collect();
        assert!(t.stage(&keys).unwrap() > 0);
        t.unstage();
        let cached = cached_pages(&path);
        let pages = (st.file_bytes / 4096) as usize;
        assert!(cached <= 16, "{cached} of the spill file's {pages} pages cached ({st:?})");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Staged entries ([`NextTier::stage`]) are read ahead whole segments
    /// at a time, up to 16 in a read, and their gets take them from
    /// memory (the file is overwritten behind the tier's back after
    /// staging, and the gets still return what was put); an entry
    /// replaced or removed after staging is got as it is now; what no
    /// get took is let go.
    #[test]
    fn staged_entries_are_got_from_memory_unless_replaced_or_removed() {
        let dir = std::env::temp_dir().join(format!("ztier-tier-stage-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let t = FileTier::create(&dir.join("spill"), 1 << 30).unwrap();
        let k = |i| Key { pool: 1, object: 0, index: i };
        let n = 600u32;
        let len = |i: u32| (i * 997 % 4000 + 1) as u16 * if i % 7 == 0 { 0 } else { 1 };
        for i in 0..n {
            t.put(k(i), meta(len(i)), &entry(i, len(i) as usize)).unwrap();
        }
        // Entries in the write buffer are left to their gets: none here.
        t.flush().unwrap();
        let before = t.file_stats();
        // Key 1000 is not held; zero-length entries have no bytes to read.
        let keys: Vec<Key> = (0..n).rev().map(k).chain([k(1000)]).collect();
        let staged = t.stage(&keys).unwrap();
        assert_eq!(staged, (0..n).filter(|&i| len(i) > 0).count());
        let st = t.file_stats();
        let segments = t.file_end() / FILE_SEGMENT as u64;
        assert!(segments > 16, "{st:?}");
        assert_eq!(st.reads - before.reads, segments.div_ceil(16), "{st:?}");
        assert_eq!(st.read_bytes - before.read_bytes, segments * FILE_SEGMENT as u64, "{st:?}");
        let end = t.file_end();
        let other = std::fs::OpenOptions::new().write(true).open(dir.join("spill")).unwrap();
        other.write_all_at(&vec![0xee; end as usize], 0).unwrap();
        drop(other);
        t.put(k(1), meta(5), &[9; 5]).unwrap();
        assert!(t.remove(k(2)));
        let mut out = Vec::new();
        assert_eq!(t.get(k(1), &mut out, true).unwrap(), Some(meta(5)));
        assert_eq!(out, [9; 5], "replaced: not the bytes staged");
        assert_eq!(t.get(k(2), &mut out, true).unwrap(), None);
        for i in 3..n - 1 {
            assert_eq!(t.get(k(i), &mut out, i % 2 == 0).unwrap(), Some(meta(len(i))));
            assert_eq!(out, entry(i, len(i) as usize), "entry {i}");
        }
        assert_eq!(t.file_stats().reads, st.reads, "every get from memory");
        // Got and kept (odd i): still staged until let go.
        assert_eq!(t.get(k(3), &mut out, false).unwrap(), Some(meta(len(3))));
        assert_eq!(out, entry(3, len(3) as usize));
        t.unstage();
        assert!(t.inner.lock().staged.is_empty());
        assert_eq!(t.get(k(3), &mut out, false).unwrap(), Some(meta(len(3))));
        assert_eq!(out, vec![0xee; len(3) as usize], "let go: read from the file again");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Removed entries leave holes; once the written segments exceed 1.5×
    /// the live bytes and the slack, the emptiest are compacted: the file
    /// stays within that bound, and every live entry reads back intact.
    #[test]
    fn compaction_reclaims_the_dead_and_keeps_the_live() {
        let dir = std::env::temp_dir().join(format!("ztier-tier-compact-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let t = FileTier::create(&dir.join("spill"), 1 << 30).unwrap();
        let k = |i| Key { pool: 0, object: 0, index: i };
        let len = |i: u32| 300 + (i as usize * 977) % 3700;
        let n = 20_000u32;
        for i in 0..n {
            t.put(k(i), meta(len(i) as u16), &entry(i, len(i))).unwrap();
        }
        let full = t.file_end();
        assert_eq!(t.file_stats().compactions, 0);
        // Three entries of four removed (or replaced by a shorter one), spread evenly.
        for i in 0..n {
            match i % 8 {
                0 | 4 => {}
                1 | 3 | 5 => assert!(t.remove(k(i))),
                2 => t.put(k(i), meta(100), &entry(i + n, 100)).unwrap(),
                _ => assert!(t.get(k(i), &mut Vec::new(), true).unwrap().is_some()),
            }
        }
        let st = t.file_stats();
        let live = t.bytes_used();
        assert!(st.compactions > 0 && st.compaction_moves > 0, "{st:?}");
        let bound = live + live / 2 + COMPACT_SLACK + FILE_SEGMENT as u64;
        assert!(
            st.file_bytes <= bound,
            "file {} for {live} live bytes ({full} before; {st:?})",
            st.file_bytes
        );
        assert!(st.file_bytes < full / 2, "file {} of {full} before ({st:?})", st.file_bytes);
        // So says the file system.
        use std::os::unix::fs::MetadataExt;
        let on_disk = std::fs::metadata(dir.join("spill")).unwrap().blocks() * 512;
        assert!(on_disk <= bound, "{on_disk} bytes allocated for {live} live bytes ({st:?})");
        let mut out = Vec::new();
        for i in 0..n {
            let want = match i % 8 {
                0 | 4 => Some(entry(i, len(i))),
                2 => Some(entry(i + n, 100)),
                _ => None,
            };
            let got = t.get(k(i), &mut out, false).unwrap().map(|_| out.clone());
            assert_eq!(got, want, "{i}");
        }
        assert_eq!(t.entries(), (n / 8 * 3) as usize);
        // Everything gone: the file shrinks back to nothing.
        assert_eq!(t.remove_pool(0), (n / 8 * 3) as usize);
        assert_eq!((t.file_end(), t.bytes_used()), (0, 0));
        assert_eq!(std::fs::metadata(dir.join("spill")).unwrap().len(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
