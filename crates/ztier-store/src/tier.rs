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
//! * [`FileTier`] — de Castro's compressed swap: a spill file in which each
//!   entry takes its compressed size rounded up to 256 bytes, with free
//!   space reused best-fit and neighbours merged.
//!
//! A remote-RAM tier and a backing block device implement the same trait.

use std::collections::{BTreeMap, BTreeSet, HashMap};
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
    let mut buf = vec![0u8; 1 << 20];
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

/// Space unit of the spill file.
pub const FILE_UNIT: u64 = 256;

/// Free space of the spill file: extents by offset (for merging) and by
/// (length, offset) (for best fit).
#[derive(Default)]
struct FreeSpace {
    by_off: BTreeMap<u64, u64>,
    by_len: BTreeSet<(u64, u64)>,
    end: u64,
}

impl FreeSpace {
    fn take(&mut self, len: u64) -> u64 {
        if let Some(&(l, off)) = self.by_len.range((len, 0)..).next() {
            self.by_len.remove(&(l, off));
            self.by_off.remove(&off);
            if l > len {
                self.insert(off + len, l - len);
            }
            return off;
        }
        let off = self.end;
        self.end += len;
        off
    }

    fn insert(&mut self, off: u64, len: u64) {
        self.by_off.insert(off, len);
        self.by_len.insert((len, off));
    }

    fn give(&mut self, mut off: u64, mut len: u64) {
        if let Some((&p, &pl)) = self.by_off.range(..off).next_back() {
            if p + pl == off {
                self.by_off.remove(&p);
                self.by_len.remove(&(pl, p));
                off = p;
                len += pl;
            }
        }
        if let Some(&nl) = self.by_off.get(&(off + len)) {
            self.by_off.remove(&(off + len));
            self.by_len.remove(&(nl, off + len));
            len += nl;
        }
        if off + len == self.end {
            self.end = off;
        } else {
            self.insert(off, len);
        }
    }
}

struct FileInner {
    file: File,
    index: HashMap<Key, (u64, SpillMeta)>,
    free: FreeSpace,
    used: u64,
    /// Why the latest failed put failed.
    last_error: Option<String>,
    /// From [`NextTier::prepare_fork`] to the fork: a new spill file
    /// holding every entry at the offset the index gives, for the child.
    for_child: Option<File>,
}

/// A spill file: entries kept compressed on a file (de Castro's
/// compressed swap). The index lives in RAM; the file is scratch space
/// (truncated when opened), not a persistent format.
pub struct FileTier {
    max_bytes: u64,
    inner: Mutex<FileInner>,
    /// Opens a new, empty spill file (for a forked child: see
    /// [`NextTier::after_fork`]).
    reopen: Option<Opener>,
}

/// How a [`FileTier`] opens its spill file.
pub type Opener = Box<dyn Fn() -> std::io::Result<File> + Send + Sync>;

impl FileTier {
    /// Creates (or truncates) the spill file at `path`, holding at most
    /// `max_bytes` of file space.
    pub fn create(path: &Path, max_bytes: u64) -> std::io::Result<Self> {
        let file =
            std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path)?;
        Ok(Self::from_file(file, max_bytes))
    }

    /// A spill file on `file`, open for reading and writing and empty,
    /// holding at most `max_bytes` of file space.
    pub fn from_file(file: File, max_bytes: u64) -> Self {
        FileTier {
            max_bytes,
            reopen: None,
            inner: Mutex::new(FileInner {
                file,
                index: HashMap::new(),
                free: FreeSpace::default(),
                used: 0,
                last_error: None,
                for_child: None,
            }),
        }
    }

    /// A spill file on what `open` opens (open for reading and writing,
    /// and empty), holding at most `max_bytes` of file space. A forked
    /// child opens a file of its own the same way
    /// ([`NextTier::after_fork`]).
    pub fn reopenable(open: Opener, max_bytes: u64) -> std::io::Result<Self> {
        let mut t = Self::from_file(open()?, max_bytes);
        t.reopen = Some(open);
        Ok(t)
    }

    fn units(len: u16) -> u64 {
        (len as u64).div_ceil(FILE_UNIT) * FILE_UNIT
    }

    /// Bytes of file space reached (the file's logical end).
    pub fn file_end(&self) -> u64 {
        self.inner.lock().free.end
    }
}

impl NextTier for FileTier {
    fn name(&self) -> String {
        "file".into()
    }

    fn put(&self, key: Key, meta: SpillMeta, data: &[u8]) -> Result<(), TierError> {
        let mut g = self.inner.lock();
        if let Some((off, m)) = g.index.remove(&key) {
            g.free.give(off, Self::units(m.len));
            g.used -= Self::units(m.len);
        }
        let size = Self::units(meta.len);
        let off = if size == 0 { 0 } else { g.free.take(size) };
        if size > 0 && g.free.end > self.max_bytes {
            g.free.give(off, size);
            g.last_error = Some(format!("the spill file reached its limit of {} bytes", self.max_bytes));
            return Err(TierError::Full);
        }
        if size > 0 {
            if let Err(e) = g.file.write_all_at(data, off) {
                g.free.give(off, size);
                g.last_error = Some(format!("writing the spill file failed: {e}"));
                return Err(e.into());
            }
        }
        g.used += size;
        g.index.insert(key, (off, meta));
        Ok(())
    }

    fn get(&self, key: Key, out: &mut Vec<u8>, remove: bool) -> Result<Option<SpillMeta>, TierError> {
        let mut g = self.inner.lock();
        let Some(&(off, meta)) = g.index.get(&key) else { return Ok(None) };
        out.resize(meta.len as usize, 0);
        g.file.read_exact_at(out, off)?;
        if remove {
            g.index.remove(&key);
            g.free.give(off, Self::units(meta.len));
            g.used -= Self::units(meta.len);
        }
        Ok(Some(meta))
    }

    fn remove(&self, key: Key) -> bool {
        let mut g = self.inner.lock();
        match g.index.remove(&key) {
            Some((off, m)) => {
                g.free.give(off, Self::units(m.len));
                g.used -= Self::units(m.len);
                true
            }
            None => false,
        }
    }

    fn contains(&self, key: Key) -> bool {
        self.inner.lock().index.contains_key(&key)
    }

    fn remove_object(&self, pool: u32, object: u64) -> usize {
        let mut g = self.inner.lock();
        let g = &mut *g;
        remove_where(
            &mut g.index,
            |k| k.pool == pool && k.object == object,
            |(off, m)| {
                g.free.give(off, Self::units(m.len));
                g.used -= Self::units(m.len);
            },
        )
    }

    fn remove_pool(&self, pool: u32) -> usize {
        let mut g = self.inner.lock();
        let g = &mut *g;
        remove_where(
            &mut g.index,
            |k| k.pool == pool,
            |(off, m)| {
                g.free.give(off, Self::units(m.len));
                g.used -= Self::units(m.len);
            },
        )
    }

    fn entries(&self) -> usize {
        self.inner.lock().index.len()
    }

    fn bytes_used(&self) -> u64 {
        self.inner.lock().used
    }

    fn last_error(&self) -> Option<String> {
        self.inner.lock().last_error.clone()
    }

    /// A new spill file (opened as the first was) with every entry copied
    /// to the same offset, so that the child's copy of the index holds
    /// for it: by the kernel (`copy_file_range`, extents of adjacent
    /// entries merged; a filesystem that shares blocks copies nothing),
    /// or read and written where the kernel will not. Copying the
    /// compressed bytes is the cheapest way to give the child its pages:
    /// before, every spilled page came back resident for each fork, far
    /// over the budget, and both processes compressed it again. Without
    /// an opener, nothing is readied (`Ok(false)`); an error (a full
    /// device) drops the partial copy.
    fn prepare_fork(&self) -> Result<bool, TierError> {
        let Some(open) = &self.reopen else { return Ok(false) };
        let mut g = self.inner.lock();
        g.for_child = None;
        let mut extents: Vec<(u64, u64)> =
            g.index.values().filter(|(_, m)| m.len > 0).map(|&(off, m)| (off, Self::units(m.len))).collect();
        extents.sort_unstable();
        let copy = open()?;
        // Adjacent entries' extents merged into runs, each copied whole.
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for (off, len) in extents {
            match runs.last_mut() {
                Some((a, l)) if *a + *l == off => *l += len,
                _ => runs.push((off, len)),
            }
        }
        // The last entry's padding may lie past the file's end.
        let size = g.file.metadata()?.len();
        for (off, len) in runs {
            copy_range(&g.file, &copy, off, len.min(size.saturating_sub(off)))?;
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
        if let Some(copy) = g.for_child.take() {
            g.file = copy;
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
        g.file = open()?;
        g.free = FreeSpace::default();
        g.used = 0;
        g.last_error = None;
        Ok(())
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
        assert_eq!(std::fs::metadata(dir.join("0")).unwrap().len(), 300);
        assert_eq!(std::fs::metadata(dir.join("1")).unwrap().len(), 500);
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
    /// offset, the last one's padding past the file's end), whatever
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
        // New entries go to the copy, into the holes first.
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

    #[test]
    fn free_space_merges_neighbours() {
        let mut f = FreeSpace::default();
        let a = f.take(256);
        let b = f.take(512);
        let c = f.take(256);
        f.give(a, 256);
        f.give(c, 256);
        assert_eq!(f.end, 768);
        f.give(b, 512);
        assert_eq!(f.end, 0);
        assert!(f.by_off.is_empty() && f.by_len.is_empty());
    }
}
