//! The cache: reads served from RAM, then the SSD cache, then the
//! backing; writes through to the backing, never held only here — or,
//! in write-back mode, held dirty in the SSD cache and copied behind.
//!
//! ```text
//!  read(block) ─► RAM cache ─hit─► done
//!                   │ miss
//!                   ▼
//!               directory ─hit─► item on the cache device: checked (lba, crc), decoded ─► done
//!                   │ miss                                    (and kept in RAM)
//!                   ▼
//!               remote RAM cache (--remote; Redis) ─hit─► sealed value checked, decoded ─► done
//!                   │ miss, lost or unreachable                (and kept in RAM)
//!                   ▼
//!               backing read ─► done; fill queued ─► filler: compress, append, insert
//!                                                    (and keep in RAM and the remote)
//!
//!  write ─► stripe: in flight += 1, lines dropped (directory, RAM)
//!        ─► journal record "copies older than G are stale" (pwrite; synced with --journal-sync)
//!        ─► backing write ─► stripe: last end = G', in flight −= 1
//!        ─► write-through: the new data queued as a fill
//! ```
//!
//! # Never stale
//!
//! Every fill (from a read miss, an SSD hit kept in RAM, or a
//! write-through) holds a *reservation* for its block, taken before its
//! data was read: a token in the block's stripe, refused while a write of
//! the block is in flight. A write of the block removes the reservation
//! when it starts (under the stripe's lock, with the block's lines), so a
//! fill whose data may predate a write finds its token gone and is
//! dropped — bcache's read race, fixed late there; the test
//! `fill_racing_a_write_is_dropped` replays it. The write's journal
//! record ("copies older than G are stale") draws G once every block's
//! lines and reservations are dropped, so an item filled before that is
//! older than G and a recovery drops it. A write-through fill is
//! reserved when its write ends, and only if no other write of the block
//! was in flight at any moment of its own (two overlapping writes leave
//! the backing with either's data: neither is cached).
//!
//! # Persistence
//!
//! Lines live in segments on the cache device ([`crate::log`]); a
//! checkpoint lists the live ones; the journal ([`crate::journal`]) records
//! every invalidation since. At open, every segment's summary is read and
//! a line is kept if its segment is valid, it is listed (segments the
//! checkpoint covers) or not marked dead (later ones), and no journal
//! record invalidates it; every hit then checks its item's checksum. A
//! clean stop seals, checkpoints and records a fingerprint of the backing;
//! a crash on the same boot loses only the open segment; after a reboot
//! the cache is kept only if it was served with `--journal-sync`.
//!
//! # Write-back
//!
//! `Mode::Writeback`: a whole-block write appends its item to the open
//! segment and points its line at it, marked dirty (a bit in the
//! directory, read lock-free by a seal, which flags the summary entry
//! dirty; an entry in the stripe's `dirty` map). A flush or FUA seals,
//! writes and syncs the open segment. Dirty lines are never replaced
//! (`Directory::insert_with`'s pinned lines) nor evicted (recycling copies
//! them forward, synced before their old segment is reused, or writes
//! them back first), never promoted to RAM, and a
//! fill never takes a reservation for a dirty block. Write-back threads
//! copy a dirty line's block to the backing (marked busy meanwhile: writes
//! through and recycling of that block wait), then record "copies older
//! than its generation are stale" (synced) and mark it clean if not
//! written again. Recovery takes each block's newest copy by generation;
//! a dirty one only if its item checks out, and it is dirty again.
//!
//! # The remote RAM cache
//!
//! With a [`Remote`] (`ztier cache serve --remote redis://...`), blocks
//! filled into the RAM cache from the backing (read misses, write-through)
//! are also given to a [`RemoteTier`]: compressed, sealed (MAC or
//! encryption) and written to Redis by its flusher thread. It is
//! cleancache's *ephemeral* pool on other machines' RAM (RAMster): the
//! servers may lose any value (eviction, restart, a dead server), and a
//! lost or unreachable value is a miss that the backing answers. It is
//! looked up after the SSD cache (a local SSD hit is cheaper than a round
//! trip) and never from the connection's thread. A write drops the
//! block's entry from the tier's index under the stripe lock, as it drops
//! the block's RAM and SSD lines, and fills put under the same lock with
//! the same reservation: never stale. Values live only as long as the
//! server process (the tier's run id is new each start); a clean stop
//! deletes them.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use serde::Serialize;
use ztier_blk::backing::Backing;
use ztier_codec::page::{Form as PageForm, PageEncoder};
use ztier_codec::CodecId;
use ztier_remote::RemoteTier;
use ztier_store::tier::{NextTier, SpillMeta};
use ztier_store::Key;

use crate::admit::Doorkeeper;
use crate::backend::Backend;
use crate::dir::Directory;
use crate::format::{self, Checkpoint, Form, Invalidation, Placement, Policy, SbState, Superblock, BLOCK};
use crate::journal::{self, Journal, JournalError, JournalStats};
use crate::log::{self, Item, ItemRead, Log, LogStats, Pick, Sealed, Tail};
use crate::pressure::{self, PressureConfig, PressureStats, Watch};
use crate::ram::{RamCache, RamStats};
use crate::seq::Sequential;
use crate::stats::{summary, Counters, Latencies, LatencySummary};
use crate::CacheError;

/// What writes do to the SSD and RAM caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Written blocks are cached (after the backing has them).
    Writethrough,
    /// Written blocks are only dropped from the caches.
    Writearound,
    /// Written blocks go to the SSD cache only (dirty) and are copied to
    /// the backing behind; a flush makes them durable on the cache device.
    Writeback,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "writethrough" => Ok(Mode::Writethrough),
            "writearound" => Ok(Mode::Writearound),
            "writeback" => Ok(Mode::Writeback),
            _ => Err(format!("unknown mode '{s}' (writethrough, writearound, writeback)")),
        }
    }
}

/// Which blocks a full SSD cache takes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Admission {
    /// Every block read from the backing or written through.
    All,
    /// Only a block asked for before, within about the directory's
    /// line count of other blocks ([`crate::admit::Doorkeeper`]); every
    /// block while no segment was recycled yet.
    Seen,
}

impl std::str::FromStr for Admission {
    type Err = String;
    fn from_str(s: &str) -> Result<Admission, String> {
        match s {
            "all" => Ok(Admission::All),
            "seen" => Ok(Admission::Seen),
            _ => Err(format!("unknown admission '{s}' (all, seen)")),
        }
    }
}

/// How to serve a cache.
#[derive(Debug, Clone)]
pub struct CacheOptions {
    /// Writes: through or around.
    pub mode: Mode,
    /// RAM cache size in bytes (0: none).
    pub ram_cache: u64,
    /// Sequential streams longer than this bypass (0: never).
    pub sequential_cutoff: u64,
    /// Sync the journal before each backing write (warm after power loss).
    pub journal_sync: bool,
    /// Refuse writes.
    pub read_only: bool,
    /// Drop every line and bind the cache to this backing.
    pub discard: bool,
    /// Filler threads.
    pub fillers: usize,
    /// Fills waiting at most (more are dropped).
    pub fill_queue: usize,
    /// Seal the open segment after this long.
    pub seal_after: Duration,
    /// Recycling a segment copies every line it still holds
    /// when they fill at most this share of it (in %, 50–95; writes and
    /// evictions leave the rest dead): a segment whose blocks were
    /// mostly overwritten gives its space back without evicting. Fuller
    /// segments copy only their referenced lines (at most half a
    /// segment). Higher keeps more blocks under writes at the price of
    /// more copies per fill (see docs/cache.md).
    pub recycle_keep: u8,
    /// Which sealed segment recycling takes.
    pub recycle_pick: Pick,
    /// Which blocks the SSD cache takes in once full.
    pub admission: Admission,
    /// Write-back: threads copying dirty blocks to the backing (each one
    /// block at a time).
    pub writeback_threads: usize,
    /// The machine's boot id (read from the kernel if `None`).
    pub boot_id: Option<[u8; 16]>,
    /// The RAM cache's memory pressure watcher (`None`: fixed size).
    pub pressure: Option<PressureConfig>,
    /// A remote RAM cache below the RAM cache (needs `ram_cache` > 0).
    pub remote: Option<Remote>,
    /// Calls at the points where races are decided, for tests.
    #[doc(hidden)]
    pub hooks: Hooks,
}

/// Calls at the points where races are decided, so that tests replay a
/// race in one order every time (none by default).
#[doc(hidden)]
#[derive(Clone, Default)]
pub struct Hooks {
    /// A write dropped this block's lines and reservation (the next
    /// block's are not yet).
    pub write_dropped: Option<Arc<dyn Fn(u64) + Send + Sync>>,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks").field("write_dropped", &self.write_dropped.is_some()).finish()
    }
}

/// A remote RAM cache: blocks kept in Redis through a [`RemoteTier`]
/// (which should not wait long for a get: a miss has the backing).
#[derive(Clone)]
pub struct Remote(pub Arc<RemoteTier>);

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.name())
    }
}

/// The remote RAM cache's key of a block (its own pool number; the
/// tier's values are named by run, so no other cache shares them).
fn remote_key(lba: u64) -> Key {
    Key { pool: 1, object: lba >> 16, index: (lba & 0xffff) as u32 }
}

/// A remote get that failed after this long (not a lost value: a server
/// down or slow) rests the remote for [`REMOTE_REST`].
const REMOTE_SLOW: Duration = Duration::from_millis(10);

/// While the remote rests, misses go straight to the backing.
const REMOTE_REST: Duration = Duration::from_secs(1);

/// Queued bytes above which a fill is not given to the remote (a put
/// would wait for the servers while the filler holds a stripe lock).
const REMOTE_QUEUE_MAX: usize = 1 << 20;

/// [`CacheOptions::recycle_keep`]'s default: in process, uniform reads
/// with 30% writes over twice the cache, lz4 keeps 13.5k lines (hit
/// 0.822) at 1.6 copies per fill, against 12.7k (0.773) and 0.6 copies
/// at 50 (`--example ways`, docs/measurements/2026-12-06-cache-mix.md).
pub const RECYCLE_KEEP: u8 = 80;

/// [`CacheOptions::writeback_threads`]'s default.
pub const WRITEBACK_THREADS: usize = 24;

/// Write-back: dirty blocks at most, in % of the blocks the cache
/// device's segments hold uncompressed (beyond it writes go through):
/// recycling always has clean lines to drop and room to copy dirty ones.
const DIRTY_MAX_PCT: u64 = 50;

/// RAM per dirty line (its entry in a stripe's map, with the map's
/// overhead), counted in `metadata_bytes`.
const DIRTY_ENTRY_BYTES: u64 = 48;

/// [`CacheOptions::recycle_pick`]'s default (see docs/cache.md).
pub const RECYCLE_PICK: Pick = Pick::CostBenefit;

/// The remote RAM cache's figures.
#[derive(Debug, Clone, Serialize)]
pub struct RemoteStats {
    /// The servers.
    pub name: String,
    /// Blocks read from it.
    pub hits: u64,
    /// Blocks given to it.
    pub puts: u64,
    /// Blocks not given to it: its queue to the servers was long.
    pub skipped: u64,
    /// Gets that failed (value lost, server down or slow): read from below.
    pub errors: u64,
    /// Times a slow failure rested the remote (no gets for a second).
    pub rests: u64,
    /// Blocks it holds (by its index; the servers may have lost some).
    pub entries: usize,
    /// The tier's own counters and latencies.
    pub tier: ztier_remote::StatsSnapshot,
}

impl Default for CacheOptions {
    fn default() -> Self {
        CacheOptions {
            mode: Mode::Writethrough,
            ram_cache: 0,
            sequential_cutoff: 4 << 20,
            journal_sync: false,
            read_only: false,
            discard: false,
            fillers: 1,
            fill_queue: 8192,
            seal_after: Duration::from_secs(5),
            recycle_keep: RECYCLE_KEEP,
            recycle_pick: RECYCLE_PICK,
            admission: Admission::All,
            writeback_threads: WRITEBACK_THREADS,
            boot_id: None,
            pressure: Some(PressureConfig::default()),
            remote: None,
            hooks: Hooks::default(),
        }
    }
}

/// How the cache came up.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Recovery {
    /// new, clean, crash, or cold (with the reason).
    pub kind: String,
    /// Why the cache started cold, if it did.
    pub cold_reason: Option<String>,
    /// Lines kept.
    pub lines_loaded: u64,
    /// Lines dropped: not in the checkpoint, or marked dead.
    pub lines_dead: u64,
    /// Lines dropped by journal records.
    pub lines_invalidated: u64,
    /// Dirty lines found (write-back), queued to be written back.
    pub lines_dirty: u64,
    /// Dirty lines written back while opening (no line for them, or not
    /// served in write-back mode).
    pub dirty_written_back: u64,
    /// Journal records replayed.
    pub journal_records: u64,
    /// Valid segments found.
    pub segments: u64,
    /// Seconds it took.
    pub seconds: f64,
}

/// Per stripe (a group of sets): writes in flight and fill reservations, by block.
#[derive(Default)]
struct Stripe {
    /// Block → (writes of it in flight, writes of it started since the
    /// first of those).
    writes: HashMap<u64, (u32, u32)>,
    /// Block → the token of the one fill allowed to insert it.
    fills: HashMap<u64, u64>,
    /// Write-back: dirty line → its block.
    dirty: HashMap<usize, Dirty>,
    /// Write-back: blocks being copied to the backing now (no other write
    /// of them may reach the backing meanwhile).
    busy: Vec<u64>,
}

/// A dirty line (write-back): newer than the backing.
#[derive(Debug, Clone, Copy)]
struct Dirty {
    lba: u64,
    /// The generation of the item the line points to.
    gen: u64,
    /// In the write-back queue.
    queued: bool,
}

thread_local! {
    /// Set while [`Cache::read_deferring_fills`] runs: its fills are kept
    /// in `DEFERRED` (counted in `fills_pending`) instead of queued.
    static DEFER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static DEFERRED: std::cell::RefCell<Vec<Fill>> = const { std::cell::RefCell::new(Vec::new()) };
    /// This thread's fills left for [`Cache::run_deferred_fills`].
    static LATER: std::cell::RefCell<Vec<(Arc<Inner>, Fill)>> = const { std::cell::RefCell::new(Vec::new()) };
}

struct Fill {
    lba: u64,
    data: Vec<u8>,
    token: u64,
    /// A write-through fill.
    write: bool,
    /// An SSD hit to keep in RAM (not in the SSD cache again).
    ram_only: bool,
}

/// A block of a write in flight: whether it was the only write of the
/// block when it started, and the block's start count then.
struct Writing {
    lba: u64,
    alone: bool,
    mark: u32,
}

pub(crate) struct Inner {
    sb: Mutex<Superblock>,
    geo: Superblock,
    dev: Arc<dyn Backing>,
    backing: Arc<dyn Backend>,
    size: u64,
    dir: Directory,
    log: Log,
    /// `Admission::Seen`'s filter.
    door: Option<Doorkeeper>,
    /// A segment with lines in it was recycled: the cache is full.
    full: AtomicBool,
    journal: Journal,
    stripes: Box<[Mutex<Stripe>]>,
    tokens: AtomicU64,
    gen: AtomicU64,
    ram: Option<Arc<RamCache>>,
    watch: Arc<Watch>,
    fill_tx: Mutex<Option<SyncSender<Fill>>>,
    fills_pending: AtomicU64,
    /// Nanoseconds after `started` until which the remote rests (0: never).
    remote_rest_until: AtomicU64,
    /// The remote tier's count of lost values at the last failed get.
    remote_lost: AtomicU64,
    seq: Sequential,
    opts: CacheOptions,
    codec: CodecId,
    pub(crate) c: Counters,
    pub(crate) lat: Latencies,
    /// Held while recycling or checkpointing (I/O, milliseconds): a std
    /// mutex, whose waiters sleep on a futex (`parking_lot`'s call
    /// `sched_yield` about ten times each first; every worker filling
    /// after its reply may wait here).
    maint: std::sync::Mutex<()>,
    ckpt_seq: AtomicU64,
    stop: Arc<AtomicBool>,
    /// The SSD level is off (the cache device failed).
    ssd_off: AtomicBool,
    /// Writes are refused: the device failed and the cache could not be
    /// marked discarded, so a restart could serve stale lines.
    broken: Mutex<Option<String>>,
    degraded: Mutex<Option<String>>,
    recovery: Recovery,
    started: Instant,
    /// Write-back: dirty lines to copy to the backing.
    wb_queue: Mutex<VecDeque<usize>>,
    wb_cv: Condvar,
    /// Dirty lines now.
    dirty: AtomicU64,
    /// Most dirty lines.
    dirty_max: u64,
    /// Dirty data was lost (cache device failure): every flush fails.
    wb_lost: Mutex<Option<String>>,
}

/// A cache in front of a backing. Shared by reference between threads.
pub struct Cache {
    inner: Arc<Inner>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

fn boot_id() -> [u8; 16] {
    let s = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let hex: String = s.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    let mut b = [0u8; 16];
    for (i, x) in b.iter_mut().enumerate() {
        *x = hex.get(2 * i..2 * i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()).unwrap_or(0);
    }
    b
}

/// A random id (uuid of a cache's contents).
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom").and_then(|mut f| io::Read::read_exact(&mut f, &mut b)).is_err() {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        return t.as_nanos() as u64 ^ (std::process::id() as u64) << 40;
    }
    u64::from_le_bytes(b).max(1)
}

/// A fingerprint of the backing: 8 blocks spread over it and its size.
pub fn fingerprint(b: &dyn Backend) -> io::Result<u64> {
    let size = b.size();
    let mut buf = vec![0u8; BLOCK];
    let mut c = crc32c::crc32c(&size.to_le_bytes());
    let mut d = 0u32;
    for i in 0..8u64 {
        let off = (size / 8 * i) / BLOCK as u64 * BLOCK as u64;
        let n = (size - off).min(BLOCK as u64) as usize;
        b.read_at(&mut buf[..n], off)?;
        c = crc32c::crc32c_append(c, &buf[..n]);
        d = crc32c::crc32c_append(d ^ i as u32, &buf[..n]);
    }
    Ok((c as u64) << 32 | d as u64)
}

/// Reads the current superblock of a cache device.
pub fn read_superblock(dev: &dyn Backing) -> Result<Superblock, CacheError> {
    let mut best: Option<Superblock> = None;
    let mut why = String::new();
    for s in 0..2u64 {
        let mut b = vec![0u8; format::SB_SIZE];
        dev.read_at(&mut b, s * format::SB_SIZE as u64)?;
        match Superblock::decode(&b) {
            Ok(sb) if best.is_none_or(|x| sb.sb_gen > x.sb_gen) => best = Some(sb),
            Ok(_) => {}
            Err(e) => why = e,
        }
    }
    best.ok_or(CacheError::NotACache(why))
}

fn write_superblock(dev: &dyn Backing, sb: &Superblock) -> io::Result<()> {
    dev.write_at(&sb.encode(), (sb.sb_gen % 2) * format::SB_SIZE as u64)?;
    dev.sync()
}

/// Writes a new, empty cache's superblock on `dev` (both slots: an old
/// cache's superblock is overwritten).
pub fn create(dev: &dyn Backing, sb: &Superblock) -> Result<(), CacheError> {
    dev.write_at(&vec![0u8; 2 * format::SB_SIZE], 0)?;
    dev.write_at(&sb.encode(), (sb.sb_gen % 2) * format::SB_SIZE as u64)?;
    // Make the device its full size (the last segment's first bytes).
    let last = sb.device_size() - 4096;
    dev.write_at(&[0u8; 8], last)?;
    dev.sync()?;
    Ok(())
}

/// The newest valid checkpoint of cache `uuid`.
fn read_checkpoint(dev: &dyn Backing, sb: &Superblock) -> io::Result<Option<(Checkpoint, Vec<u32>)>> {
    let mut best: Option<(Checkpoint, Vec<u32>)> = None;
    for s in 0..2u64 {
        let at = sb.ckpt_off + s * sb.ckpt_size;
        let mut head = vec![0u8; format::CKPT_HEADER];
        dev.read_at(&mut head, at)?;
        let Some((c, count)) = format::peek_checkpoint(&head) else { continue };
        if c.uuid != sb.uuid || format::CKPT_HEADER as u64 + 4 * count > sb.ckpt_size {
            continue;
        }
        let mut b = vec![0u8; format::CKPT_HEADER + 4 * count as usize];
        dev.read_at(&mut b, at)?;
        if let Some((c, locs)) = format::decode_checkpoint(&b) {
            if best.as_ref().is_none_or(|(x, _)| c.ckpt_seq > x.ckpt_seq) {
                best = Some((c, locs));
            }
        }
    }
    Ok(best)
}

/// What a cache device holds, read offline.
#[derive(Debug, Clone, Serialize)]
pub struct OfflineStats {
    /// Bytes of the device.
    pub device_bytes: u64,
    /// Segments.
    pub segments: u32,
    /// Segment size.
    pub segment_size: u32,
    /// Segments holding valid data.
    pub segments_valid: u64,
    /// Directory lines.
    pub lines: u64,
    /// Placement.
    pub placement: Placement,
    /// Ways.
    pub ways: u16,
    /// Policy.
    pub policy: Policy,
    /// RAM the directory takes when served.
    pub directory_bytes: u64,
    /// State.
    pub state: SbState,
    /// Items in valid segments (live or not).
    pub items: u64,
    /// Bytes they take.
    pub stored_bytes: u64,
    /// 4096 × items / stored bytes.
    pub ratio: f64,
    /// Codec.
    pub codec: String,
    /// Backing size it is bound to (0: none yet).
    pub backing_size: u64,
    /// Whether its last server synced the journal.
    pub journal_sync: bool,
    /// Creation time (unix seconds).
    pub created: u64,
}

/// Reads a cache device's superblock and segment summaries (offline).
pub fn inspect(dev: &dyn Backing) -> Result<OfflineStats, CacheError> {
    let sb = read_superblock(dev)?;
    let found = log::scan(dev, &sb)?;
    let items: u64 = found.iter().map(|f| f.entries.len() as u64).sum();
    let stored: u64 = found
        .iter()
        .flat_map(|f| f.entries.iter())
        .map(|e| format::item_span(e.len as usize, sb.loc_unit) as u64)
        .sum();
    Ok(OfflineStats {
        device_bytes: sb.device_size(),
        segments: sb.segments,
        segment_size: sb.segment_size,
        segments_valid: found.len() as u64,
        lines: sb.lines,
        placement: sb.placement,
        ways: sb.ways,
        policy: sb.policy,
        directory_bytes: sb.lines * 6 + if sb.ways > 1 { sb.lines / sb.ways as u64 } else { 0 },
        state: sb.state,
        items,
        stored_bytes: stored,
        ratio: if stored == 0 { 1.0 } else { (items * BLOCK as u64) as f64 / stored as f64 },
        codec: CodecId::try_from(sb.codec)
            .map_or_else(|_| format!("unknown ({})", sb.codec), |c| c.name().into()),
        backing_size: sb.backing_size,
        journal_sync: sb.journal_sync,
        created: sb.created,
    })
}

/// A copy of a block found at recovery.
#[derive(Clone, Copy)]
struct CopyAt {
    gen: u64,
    loc: u32,
    dirty: bool,
    /// Its item's offset on the device.
    at: u64,
    /// Its segment's seq.
    seq: u64,
}

/// Journal invalidations by block, for recovery.
struct Invalidations {
    by_block: HashMap<u64, u64>,
    ranges: Vec<Invalidation>,
}

impl Invalidations {
    fn new(recs: &[Invalidation]) -> Invalidations {
        let mut by_block = HashMap::new();
        let mut ranges = Vec::new();
        for r in recs {
            if r.n > 64 {
                ranges.push(*r);
            } else {
                for b in r.lba..r.lba + r.n {
                    let g = by_block.entry(b).or_insert(0);
                    *g = (*g).max(r.gen);
                }
            }
        }
        Invalidations { by_block, ranges }
    }
    fn newest(&self, lba: u64) -> u64 {
        let a = self.by_block.get(&lba).copied().unwrap_or(0);
        let b = self
            .ranges
            .iter()
            .filter(|r| lba >= r.lba && lba < r.lba + r.n)
            .map(|r| r.gen)
            .max()
            .unwrap_or(0);
        a.max(b)
    }
}

thread_local! {
    static ENC: std::cell::RefCell<Option<(CodecId, PageEncoder)>> = const { std::cell::RefCell::new(None) };
}

fn with_encoder<R>(codec: CodecId, f: impl FnOnce(&mut PageEncoder) -> R) -> R {
    ENC.with(|c| {
        let mut c = c.borrow_mut();
        if c.as_ref().is_none_or(|(id, _)| *id != codec) {
            *c = Some((codec, PageEncoder::new(codec).raw_fraction(7, 8)));
        }
        f(&mut c.as_mut().expect("just set").1)
    })
}

/// Encodes a block for the SSD cache: `(form, bytes)`. The `raw` codec
/// stores every block as it is (no zero or same-fill detection either:
/// it is the uncompressed peer).
fn encode(codec: CodecId, block: &[u8], out: &mut Vec<u8>) -> Form {
    out.clear();
    if codec == CodecId::Raw {
        out.extend_from_slice(block);
        return Form::Raw;
    }
    out.resize(BLOCK, 0);
    let e = with_encoder(codec, |enc| enc.encode(block, out)).expect("a 4096-byte block always encodes");
    match e.form {
        PageForm::Zero => {
            out.clear();
            Form::Zero
        }
        PageForm::Same(p) => {
            out.clear();
            out.extend_from_slice(&p.to_le_bytes());
            Form::Same
        }
        PageForm::Raw => {
            out.clear();
            out.extend_from_slice(block);
            Form::Raw
        }
        PageForm::Compressed(_) => {
            out.truncate(e.len);
            Form::Compressed
        }
    }
}

fn decode(h: &format::ItemHeader, data: &[u8], out: &mut [u8]) -> Result<(), String> {
    match h.form {
        Form::Zero => out.fill(0),
        Form::Same => {
            let p = u64::from_le_bytes(data.try_into().map_err(|_| "bad pattern")?);
            for w in out.chunks_exact_mut(8) {
                w.copy_from_slice(&p.to_le_bytes());
            }
        }
        Form::Raw => out.copy_from_slice(data),
        Form::Compressed => {
            let c = CodecId::try_from(h.codec).map_err(|e| e.to_string())?;
            with_encoder(c, |enc| enc.decode(PageForm::Compressed(c), data, out))
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Which level served a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Ram,
    Ssd,
    /// The remote RAM cache.
    Remote,
    Miss,
    /// In the SSD cache, but reading it would wait for the device.
    WouldBlock,
    /// Dirty in the SSD cache (write-back) and unreadable: an error, never
    /// the backing's older copy.
    Lost,
}

impl Inner {
    fn stripe(&self, lba: u64) -> &Mutex<Stripe> {
        &self.stripes[(self.dir.set_of(lba) as usize) & (self.stripes.len() - 1)]
    }

    fn next_gen(&self) -> u64 {
        self.gen.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn cacheable(&self, lba: u64) -> bool {
        (lba + 1) * BLOCK as u64 <= self.size
    }

    /// Reserves `lba` for a fill whose data is about to be read: its
    /// token, or `None` while a write of the block is in flight.
    fn reserve(&self, lba: u64) -> Option<u64> {
        let mut st = self.stripe(lba).lock();
        if st.writes.contains_key(&lba) || self.dirty_line(&st, lba).is_some() {
            return None;
        }
        let t = self.tokens.fetch_add(1, Ordering::Relaxed);
        st.fills.insert(lba, t);
        Some(t)
    }

    /// Gives a reservation up (its fill will not come).
    fn cancel(&self, lba: u64, token: u64) {
        let mut st = self.stripe(lba).lock();
        if st.fills.get(&lba) == Some(&token) {
            st.fills.remove(&lba);
        }
    }

    /// Looks a block up in RAM, then the SSD cache. `promote`: an SSD hit
    /// is queued to be kept in RAM too. `nowait`: an SSD hit only if its
    /// item is read without waiting for the device ([`Level::WouldBlock`]
    /// otherwise).
    fn lookup(&self, lba: u64, out: &mut [u8], promote: bool, nowait: bool) -> Level {
        if let Some(ram) = &self.ram {
            if ram.get(lba, out) {
                return Level::Ram;
            }
        }
        let ssd = if self.ssd_off.load(Ordering::Acquire) {
            Level::Miss
        } else {
            self.ssd_lookup(lba, out, promote, nowait)
        };
        match (ssd, &self.opts.remote) {
            // The remote only from a worker (it may wait for the network).
            (Level::Miss, Some(r)) if !nowait && !self.remote_resting() => {
                self.remote_lookup(&r.0, lba, out, promote)
            }
            (l, _) => l,
        }
    }

    /// Whether the remote rests after a slow failure.
    fn remote_resting(&self) -> bool {
        let until = self.remote_rest_until.load(Ordering::Acquire);
        until != 0 && (self.started.elapsed().as_nanos() as u64) < until
    }

    /// Looks a block up in the remote RAM cache; a hit is kept in RAM
    /// (`promote`), reserved before the value is read.
    fn remote_lookup(&self, r: &RemoteTier, lba: u64, out: &mut [u8], promote: bool) -> Level {
        let key = remote_key(lba);
        let token = match (&self.ram, promote) {
            (Some(_), true) => self.reserve(lba),
            _ => None,
        };
        let mut v = Vec::new();
        let t = Instant::now();
        let level = match r.get(key, &mut v, false) {
            Ok(Some(m)) => {
                let ok = Form::try_from(m.tag).ok().is_some_and(|form| {
                    let h = format::ItemHeader { lba, len: v.len() as u16, form, codec: self.codec as u8 };
                    crc32c::crc32c(&v) == m.crc && decode(&h, &v, out).is_ok()
                });
                if ok {
                    Level::Remote
                } else {
                    self.c.remote_errors.fetch_add(1, Ordering::Relaxed);
                    r.remove(key);
                    Level::Miss
                }
            }
            Ok(None) => Level::Miss,
            Err(_) => {
                // Lost by the servers, or they are down or slow: ephemeral.
                self.c.remote_errors.fetch_add(1, Ordering::Relaxed);
                r.remove(key);
                // A value the server no longer has is no sign of a server
                // down or slow (the tier counts those as lost).
                let lost = r.stats().lost;
                let lost_before = self.remote_lost.swap(lost, Ordering::AcqRel);
                if t.elapsed() >= REMOTE_SLOW && lost == lost_before {
                    let until = (self.started.elapsed() + REMOTE_REST).as_nanos() as u64;
                    self.remote_rest_until.store(until, Ordering::Release);
                    self.c.remote_rests.fetch_add(1, Ordering::Relaxed);
                }
                Level::Miss
            }
        };
        self.promote(lba, token, level == Level::Remote, out);
        level
    }

    /// Looks a block up in the SSD cache (see [`Inner::lookup`]).
    fn ssd_lookup(&self, lba: u64, out: &mut [u8], promote: bool, nowait: bool) -> Level {
        let Some(f) = self.dir.lookup(lba) else { return Level::Miss };
        // Reserved before the item is read: kept in RAM only if no write
        // of the block starts meanwhile. Dirty lines stay out of RAM.
        let token = match (&self.ram, promote && !self.dir.is_dirty(f.line)) {
            (Some(_), true) => self.reserve(lba),
            _ => None,
        };
        let r = self.log.read_item(f.loc, lba, nowait);
        let level = match r {
            Ok(ItemRead::Found(h, b)) => {
                let data = &b[format::ITEM_HEADER..format::ITEM_HEADER + h.len as usize];
                if decode(&h, data, out).is_ok() {
                    self.dir.touch(f.line);
                    Level::Ssd
                } else if self.dirty_unreadable(lba, f.line) {
                    Level::Lost
                } else {
                    self.c.verify_failures.fetch_add(1, Ordering::Relaxed);
                    self.drop_line(lba, f.loc);
                    Level::Miss
                }
            }
            Ok(ItemRead::WouldBlock) => Level::WouldBlock,
            // Recycled or dropped since the lookup (the line points
            // elsewhere now or is gone): a miss, not a failure.
            Ok(ItemRead::Gone) if self.dir.find_at(lba, f.loc).is_none() => Level::Miss,
            Ok(ItemRead::Gone) | Err(_) if self.dirty_unreadable(lba, f.line) => Level::Lost,
            Ok(ItemRead::Gone) => {
                self.c.verify_failures.fetch_add(1, Ordering::Relaxed);
                self.drop_line(lba, f.loc);
                Level::Miss
            }
            Err(_) => {
                self.c.cache_read_errors.fetch_add(1, Ordering::Relaxed);
                self.drop_line(lba, f.loc);
                Level::Miss
            }
        };
        self.promote(lba, token, level == Level::Ssd, out);
        level
    }

    /// Ends a lookup's reservation (`token`, taken before the level was
    /// read): a hit (`data`) is queued to be kept in RAM, else given up.
    fn promote(&self, lba: u64, token: Option<u64>, hit: bool, data: &[u8]) {
        let Some(t) = token else { return };
        if hit {
            self.queue_fill(Fill { lba, data: data.to_vec(), token: t, write: false, ram_only: true });
        } else {
            self.cancel(lba, t);
        }
    }

    /// Drops `lba`'s line if it still points at `loc`.
    fn drop_line(&self, lba: u64, loc: u32) {
        let mut st = self.stripe(lba).lock();
        if let Some(line) = self.dir.find_at(lba, loc) {
            match st.dirty.get(&line) {
                // Another block's dirty line (a partial tag's collision).
                Some(d) if d.lba != lba => return,
                Some(_) => {
                    self.forget_dirty(&mut st, line);
                    self.wb_lose(&format!("dirty block {lba} dropped (its segment's write failed)"));
                }
                None => {}
            }
            self.dir.clear(line);
        }
    }

    fn queue_fill(&self, f: Fill) {
        if DEFER.with(|d| d.get()) {
            self.fills_pending.fetch_add(1, Ordering::AcqRel);
            DEFERRED.with(|d| d.borrow_mut().push(f));
            return;
        }
        let (lba, token) = (f.lba, f.token);
        let sent = {
            let tx = self.fill_tx.lock();
            match tx.as_ref() {
                None => false,
                Some(tx) => {
                    self.fills_pending.fetch_add(1, Ordering::AcqRel);
                    match tx.try_send(f) {
                        Ok(()) => true,
                        Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                            self.fills_pending.fetch_sub(1, Ordering::AcqRel);
                            self.c.fills_dropped_queue.fetch_add(1, Ordering::Relaxed);
                            false
                        }
                    }
                }
            }
        };
        if !sent {
            self.cancel(lba, token);
        }
    }

    /// Keeps a filled block in RAM and, unless it came from a cache level
    /// (`ram_only`), in the remote RAM cache (`enc`: its encoding, if
    /// made). Called under the block's stripe lock with its reservation.
    fn keep(&self, f: &Fill, enc: Option<(Form, &[u8])>) {
        let Some(ram) = &self.ram else { return };
        if ram.put(f.lba, &f.data) {
            self.c.ram_fills.fetch_add(1, Ordering::Relaxed);
        }
        let Some(r) = &self.opts.remote else { return };
        if f.ram_only {
            return;
        }
        if r.0.pending().1 > REMOTE_QUEUE_MAX {
            self.c.remote_skipped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut own = Vec::new();
        let (form, data) = match enc {
            Some(e) => e,
            None => {
                let form = encode(self.codec, &f.data, &mut own);
                (form, &own[..])
            }
        };
        let meta = SpillMeta {
            tag: form as u8,
            flags: 0,
            len: data.len() as u16,
            crc: crc32c::crc32c(data),
            pattern: 0,
        };
        match r.0.put(remote_key(f.lba), meta, data) {
            Ok(()) => self.c.remote_puts.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.c.remote_skipped.fetch_add(1, Ordering::Relaxed),
        };
    }

    /// Whether a full SSD cache takes `lba` in (and records it).
    fn admit(&self, lba: u64) -> bool {
        let Some(d) = &self.door else { return true };
        if d.seen(lba) || !self.full.load(Ordering::Relaxed) {
            return true;
        }
        self.c.fills_not_admitted.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// A filler's work on one fill.
    fn fill(&self, f: Fill, buf: &mut Vec<u8>) {
        let ssd = !self.ssd_off.load(Ordering::Acquire) && !f.ram_only && self.admit(f.lba);
        let form = if ssd { encode(self.codec, &f.data, buf) } else { Form::Raw };
        fn enc(ssd: bool, form: Form, buf: &[u8]) -> Option<(Form, &[u8])> {
            ssd.then_some((form, buf))
        }
        // Twice at most: with no free segment, recycle one and try again.
        for attempt in 0..2 {
            let mut sealed = None;
            let mut no_room = false;
            {
                let mut st = self.stripe(f.lba).lock();
                if st.fills.get(&f.lba) != Some(&f.token) {
                    self.c.fills_dropped_race.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                // Dirty lines (write-back) are never replaced by a fill.
                let pinned = |l: usize| st.dirty.contains_key(&l);
                let room = ssd && self.dir.can_insert(f.lba, &pinned);
                if ssd && !room {
                    self.c.fills_dropped_space.fetch_add(1, Ordering::Relaxed);
                }
                if room {
                    let gen = self.next_gen();
                    let it = Item { lba: f.lba, gen, form, codec: self.codec as u8, data: buf };
                    // The line is inserted under the log's lock, with the
                    // item: a seal never finds the item without its line.
                    let (placed, s) = self
                        .log
                        .append(&self.dir, it, false, |loc| self.dir.insert_with(f.lba, loc, &pinned));
                    sealed = s;
                    match placed {
                        Some(None) => {}
                        Some(Some((_, old))) => {
                            if old != crate::dir::EMPTY {
                                self.c.conflict_evictions.fetch_add(1, Ordering::Relaxed);
                            }
                            self.c.ssd_fills.fetch_add(1, Ordering::Relaxed);
                            if f.write {
                                self.c.write_through_fills.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        None => no_room = true,
                    }
                }
                // The reservation is kept while a segment is recycled for it.
                if !no_room || attempt == 1 {
                    st.fills.remove(&f.lba);
                }
                if !no_room || attempt == 1 {
                    self.keep(&f, enc(ssd, form, buf));
                }
            }
            if let Some(s) = sealed {
                self.write_segment(s);
            }
            if !no_room {
                return;
            }
            if attempt == 1 || !self.recycle_for_room() {
                self.c.fills_dropped_space.fetch_add(1, Ordering::Relaxed);
                if attempt == 0 {
                    let mut st = self.stripe(f.lba).lock();
                    if st.fills.get(&f.lba) == Some(&f.token) {
                        st.fills.remove(&f.lba);
                        self.keep(&f, enc(ssd, form, buf));
                    }
                }
                return;
            }
        }
    }

    fn write_segment(&self, s: Sealed) {
        let r = self.log.write(s, |lba, loc| self.drop_line(lba, loc));
        if let Err(e) = r {
            self.degrade(&format!("writing a segment to the cache device: {e}"), false);
        }
    }

    /// Turns the SSD level off after a cache device failure (`journal`:
    /// the journal failed, so restarts must not trust the device).
    fn degrade(&self, why: &str, journal: bool) {
        if !journal {
            // A failed segment write: its lines are dropped already; keep going.
            *self.degraded.lock() = Some(why.to_string());
            return;
        }
        if self.ssd_off.swap(true, Ordering::AcqRel) {
            return;
        }
        eprintln!("ztier cache: {why}: the SSD cache is off from now on");
        *self.degraded.lock() = Some(why.to_string());
        if self.dirty.load(Ordering::Acquire) > 0 {
            self.wb_lose(&format!("{why}: the dirty blocks on the cache device are lost"));
        }
        self.dir.clear_all();
        // Make the next start discard the device's contents; if even that
        // fails, a restart could trust lines a write made stale: refuse
        // writes from now on.
        let mut sb = self.sb.lock();
        let mut new = *sb;
        new.uuid = random_u64();
        new.sb_gen += 1;
        match write_superblock(&*self.dev, &new) {
            Ok(()) => *sb = new,
            Err(e) => {
                let msg = format!(
                    "{why}; marking the cache discarded failed too ({e}): writes are refused so that a \
                     restart cannot serve stale data — stop the server, then serve without this cache or re-create it"
                );
                eprintln!("ztier cache: {msg}");
                *self.broken.lock() = Some(msg);
            }
        }
    }

    /// Enters a write of `[first, first + n)`: each block counted in
    /// flight, its reservations and lines dropped; then the invalidation
    /// recorded (before the backing is touched). Returns the write's
    /// generation and its blocks.
    fn begin_write(&self, first: u64, n: u64) -> Result<(u64, Vec<Writing>), io::Error> {
        if let Some(why) = self.broken.lock().as_ref() {
            return Err(io::Error::other(why.clone()));
        }
        let ssd = !self.ssd_off.load(Ordering::Acquire);
        let mut blocks = Vec::with_capacity(n as usize);
        for b in first..first + n {
            let mut st = self.lock_idle(b);
            // Write-back: a dirty block goes to the backing first (a partial
            // write, a trim or zeroing then applies on top of it; the
            // record below makes its copies stale).
            if let Some(line) = self.dirty_line(&st, b) {
                match self.write_back_locked(&st, line) {
                    Ok((_, g)) => {
                        self.mark_clean(&mut st, line, g);
                        self.c.written_back.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        drop(st);
                        self.end_write(&blocks, |_| false);
                        return Err(e);
                    }
                }
            }
            let e = st.writes.entry(b).or_insert((0, 0));
            let alone = e.0 == 0;
            e.0 += 1;
            e.1 += 1;
            let mark = e.1;
            st.fills.remove(&b);
            if ssd && self.dir.remove(b).is_some() {
                self.c.invalidated_lines.fetch_add(1, Ordering::Relaxed);
                // A cached block written is taken in again by its
                // write-through fill.
                if let Some(d) = &self.door {
                    d.seen(b);
                }
            }
            if let Some(ram) = &self.ram {
                ram.remove(b);
            }
            if let Some(r) = &self.opts.remote {
                r.0.remove(remote_key(b));
            }
            drop(st);
            blocks.push(Writing { lba: b, alone, mark });
            if let Some(h) = &self.opts.hooks.write_dropped {
                h(b);
            }
        }
        // The generation once every block's lines and reservations are
        // dropped: an item a fill appended before its block's were (its
        // data read before this write) has a lower one, so the record
        // invalidates it at recovery. (Taken first, a fill of a later
        // block appended meanwhile was newer than the record and came
        // back after a crash: `fill_during_a_writes_drops_is_invalidated_after_a_crash`.)
        let gen = self.next_gen();
        if ssd {
            if let Err(e) = self.journal_invalidation(gen, first, n, false) {
                self.end_write(&blocks, |_| false);
                return Err(e);
            }
        }
        Ok((gen, blocks))
    }

    fn journal_invalidation(&self, gen: u64, first: u64, n: u64, maint_held: bool) -> io::Result<()> {
        let mut recs = Vec::new();
        let mut at = first;
        while at < first + n {
            let k = (first + n - at).min(format::MAX_RECORD_BLOCKS);
            recs.push(Invalidation { gen, lba: at, n: k });
            at += k;
        }
        for chunk in recs.chunks(format::RECORDS_PER_SECTOR) {
            let mut tries = 0;
            let t = loop {
                match self.journal.append(chunk) {
                    Ok(t) => break t,
                    Err(JournalError::Full) if tries < 3 => {
                        tries += 1;
                        let r = if maint_held { self.checkpoint_locked() } else { self.checkpoint() };
                        if let Err(e) = r {
                            return self.journal_failed(e);
                        }
                    }
                    Err(e) => return self.journal_failed(io::Error::other(e)),
                }
            };
            if let Err(e) = self.journal.wait(t) {
                return self.journal_failed(io::Error::other(e));
            }
        }
        Ok(())
    }

    fn journal_failed(&self, e: io::Error) -> io::Result<()> {
        self.degrade(&format!("recording an invalidation on the cache device: {e}"), true);
        if self.broken.lock().is_some() {
            return Err(io::Error::other(format!(
                "the cache device failed ({e}): write refused, the backing is untouched"
            )));
        }
        // Discarded: the write may proceed (nothing on the device will be trusted).
        Ok(())
    }

    /// The end of a write: each block's count in flight drops. Returns a
    /// reservation for each block `want`s cached (write-through) when no
    /// other write of it overlapped this one — its data is then what the
    /// backing holds.
    fn end_write(&self, blocks: &[Writing], want: impl Fn(u64) -> bool) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for w in blocks {
            let mut st = self.stripe(w.lba).lock();
            let Some(e) = st.writes.get_mut(&w.lba) else { continue };
            let only = w.alone && e.1 == w.mark;
            e.0 -= 1;
            if e.0 == 0 {
                st.writes.remove(&w.lba);
            }
            if want(w.lba) {
                if only {
                    let t = self.tokens.fetch_add(1, Ordering::Relaxed);
                    st.fills.insert(w.lba, t);
                    out.push((w.lba, t));
                } else {
                    self.c.fills_dropped_race.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        out
    }

    /// Seals and writes the open segment, then writes a checkpoint: the
    /// live lines, the journal head from which records are still needed.
    fn checkpoint(&self) -> io::Result<()> {
        let _m = self.maint();
        self.checkpoint_locked()
    }

    /// [`Inner::checkpoint`] with the maintenance lock held.
    fn checkpoint_locked(&self) -> io::Result<()> {
        if self.ssd_off.load(Ordering::Acquire) {
            return Ok(());
        }
        if let Some(s) = self.log.seal_open(&self.dir, None) {
            self.write_segment(s);
        }
        self.log.wait_writes();
        let covered_seq = self.log.next_seq();
        let journal_head = self.journal.position();
        let gen = self.gen.load(Ordering::SeqCst);
        let locs = self.dir.live_locs();
        let ckpt_seq = self.ckpt_seq.fetch_add(1, Ordering::AcqRel) + 1;
        let c = Checkpoint { uuid: self.geo.uuid, ckpt_seq, covered_seq, journal_head, gen };
        let b = format::encode_checkpoint(&c, &locs);
        let uuid_now = self.sb.lock().uuid;
        if uuid_now != self.geo.uuid {
            return Ok(()); // discarded after a failure
        }
        // Every segment the checkpoint covers is on the device first.
        self.dev.sync()?;
        self.dev.write_at(&b, self.geo.ckpt_off + (ckpt_seq % 2) * self.geo.ckpt_size)?;
        self.dev.sync()?;
        self.journal.set_head(journal_head);
        self.c.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// One round of background work: recycle segments while free ones are
    /// few, seal an old open segment, checkpoint when the journal is half full.
    fn maintain(&self) {
        if self.ssd_off.load(Ordering::Acquire) {
            return;
        }
        let mut rounds = 0;
        while self.log.free() < self.log.low_mark() && rounds < 64 {
            if !self.recycle_one() {
                break;
            }
            rounds += 1;
        }
        if let Some(s) = self.log.seal_open(&self.dir, Some(self.opts.seal_after)) {
            self.write_segment(s);
        }
        if self.journal.fill() > 0.5 {
            if let Err(e) = self.checkpoint() {
                self.degrade(&format!("writing a checkpoint: {e}"), true);
            }
        }
    }

    /// The maintenance lock (a panic while it was held poisons nothing
    /// it guards: it guards no data).
    fn maint(&self) -> std::sync::MutexGuard<'_, ()> {
        self.maint.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fill found no free segment: recycles one, unless another thread
    /// freed one meanwhile (fills run on many workers at once).
    fn recycle_for_room(&self) -> bool {
        {
            let _m = self.maint();
            if self.log.free() > crate::log::RESERVE {
                return true;
            }
        }
        self.recycle_one()
    }

    /// Recycles the segment [`CacheOptions::recycle_pick`] chooses: its
    /// lines copied forward when few, else the referenced ones (at most
    /// half a segment's worth) and the others dropped. `false` when
    /// nothing was freed: no sealed segment, or a dirty line that could be
    /// neither copied forward nor written back kept its segment.
    fn recycle_one(&self) -> bool {
        let _m = self.maint();
        let Some(idx) = self.log.choose(&self.dir, self.opts.recycle_pick) else { return false };
        let contents = self.log.take(idx);
        if let Some(Tail { seq, entries, buf }) = contents {
            if !entries.is_empty() {
                self.full.store(true, Ordering::Relaxed);
            }
            let seg = self.geo.segment_size as usize;
            let mut budget = seg / 2;
            // A tail at most `recycle_keep`% of which is still cached
            // (overwritten or evicted blocks leave the rest dead) keeps
            // every line: recycling it frees the dead space without
            // evicting. Otherwise only referenced lines are copied (second
            // chance), at most half a segment. (The share is an estimate
            // without the stripe locks: each line is checked again under
            // its lock below.)
            // What its live lines take, and of that its dirty lines.
            let (live, dirty) = entries.iter().fold((0, 0), |(live, dirty), e| {
                match self.dir.find_at(e.lba, self.log.entry_loc(idx, e)) {
                    Some(line) => {
                        let span = format::item_span(e.len as usize, self.geo.loc_unit);
                        (live + span, if self.dir.is_dirty(line) { dirty + span } else { dirty })
                    }
                    None => (live, dirty),
                }
            });
            // Against the segment's size, or what its items took when it
            // was sealed full (less than one more block's room left): a
            // full segment of few large items (raw blocks in small
            // segments) with nothing dead is not sparse, and copying it
            // all would free nothing.
            let written: usize =
                entries.iter().map(|e| format::item_span(e.len as usize, self.geo.loc_unit)).sum();
            let room = seg.saturating_sub(format::SEG_HEADER + entries.len() * format::ENTRY + written);
            let cap = if room < format::item_span(BLOCK, self.geo.loc_unit) { written } else { seg };
            let keep = self.opts.recycle_keep.clamp(50, 95) as usize;
            let keep_all = live <= cap * keep / 100;
            if keep_all {
                budget = budget.max(live);
            } else {
                // Dirty lines are copied whatever the budget: what they
                // take comes out of the referenced lines' share, so that
                // the copies never need more than one segment (the open
                // one's room and the reserve hold that much).
                budget = budget.saturating_sub(dirty);
            }
            let mut sealed = Vec::new();
            // Dirty lines written back here, to record as clean.
            let mut cleaned = Vec::new();
            // Whether a dirty line was copied forward.
            let mut moved_dirty = false;
            // A dirty line neither copied forward nor written back: the
            // segment is kept (sealed, its remaining lines still in it)
            // rather than reused over the only copy of a block.
            let mut stuck = false;
            self.log.recycling(true);
            for e in &entries {
                let loc = self.log.entry_loc(idx, e);
                // A line still pointing at an item its seal marked dead is
                // dropped or moved all the same: the segment is reused next.
                if e.dead && self.dir.find_at(e.lba, loc).is_none() {
                    continue;
                }
                let mut st = self.lock_idle(e.lba);
                let Some(line) = self.dir.find_at(e.lba, loc) else { continue };
                let span = format::item_span(e.len as usize, self.geo.loc_unit);
                let mut moved = false;
                // A dirty line is copied forward whatever the budget.
                let dirty = st.dirty.contains_key(&line);
                if dirty || ((keep_all || self.dir.referenced(line)) && span <= budget) {
                    if let Ok((h, data)) = format::get_item(&buf[e.off as usize..], seq) {
                        if h.lba == e.lba {
                            let it = Item { lba: e.lba, gen: e.gen, form: h.form, codec: h.codec, data };
                            let (placed, s) =
                                self.log.append(&self.dir, it, true, |nl| self.dir.relocate(line, nl));
                            sealed.extend(s);
                            if placed.is_some() {
                                budget = budget.saturating_sub(span);
                                moved = true;
                                moved_dirty |= dirty;
                            }
                        }
                    }
                }
                if !moved {
                    if dirty {
                        // No room to copy it: to the backing first.
                        match self.write_back_locked(&st, line) {
                            Ok((lba, g)) => {
                                self.mark_clean(&mut st, line, g);
                                self.c.written_back.fetch_add(1, Ordering::Relaxed);
                                cleaned.push((g, lba));
                            }
                            Err(_) => {
                                // Counted in `writeback_errors`; the block
                                // stays dirty and is tried again later.
                                stuck = true;
                                break;
                            }
                        }
                    }
                    self.dir.clear(line);
                }
                drop(st);
                self.log.count_recycled_line(moved);
            }
            self.log.recycling(false);
            for s in sealed {
                self.write_segment(s);
            }
            // Dirty copies made here are durable before their segment is
            // reused (overwritten): else a crash could keep the new
            // contents of this segment and lose the copies, and with them
            // a block flushed to the cache device only.
            if moved_dirty {
                if let Some(s) = self.log.seal_open(&self.dir, None) {
                    self.write_segment(s);
                }
                self.log.wait_writes();
                if let Err(e) = self.dev.sync() {
                    self.degrade(&format!("syncing the cache device: {e}"), true);
                }
            }
            // Before the segment is reused (its items then vanish): a
            // restart must not bring back an older copy of a block
            // written back here.
            for (g, lba) in cleaned {
                let _ = self.journal_invalidation(g, lba, 1, true);
            }
            if stuck {
                return false;
            }
        }
        self.log.release(idx);
        true
    }
}

/// Write-back (`Mode::Writeback`): dirty lines, their copies to the
/// backing, and what keeps them from being lost.
impl Inner {
    fn stripe_of_line(&self, line: usize) -> &Mutex<Stripe> {
        &self.stripes[(line / self.dir.ways()) & (self.stripes.len() - 1)]
    }

    /// The dirty line holding `lba`, if any (under its stripe lock).
    fn dirty_line(&self, st: &Stripe, lba: u64) -> Option<usize> {
        if st.dirty.is_empty() {
            return None;
        }
        let f = self.dir.lookup(lba)?;
        st.dirty.get(&f.line).is_some_and(|d| d.lba == lba).then_some(f.line)
    }

    /// A lookup of `lba` failed on `line`: whether it is `lba`'s dirty
    /// line (then the data is lost, recorded: never read from the backing).
    fn dirty_unreadable(&self, lba: u64, line: usize) -> bool {
        let st = self.stripe(lba).lock();
        if st.dirty.get(&line).is_some_and(|d| d.lba == lba) {
            drop(st);
            self.c.cache_read_errors.fetch_add(1, Ordering::Relaxed);
            self.wb_lose(&format!("dirty block {lba} is unreadable on the cache device"));
            return true;
        }
        false
    }

    /// Copies dirty `line` to the backing (with FUA), under its stripe
    /// lock so that no other write of the block runs meanwhile; it stays
    /// dirty. Returns its block and generation.
    fn write_back_locked(&self, st: &Stripe, line: usize) -> io::Result<(u64, u64)> {
        let d = *st.dirty.get(&line).expect("a dirty line");
        debug_assert!(!st.busy.contains(&d.lba));
        let blk = self.read_dirty(line, d.lba)?;
        if let Err(e) = self.backing.write_at(&blk, d.lba * BLOCK as u64, true) {
            self.c.writeback_errors.fetch_add(1, Ordering::Relaxed);
            self.c.backing_errors.fetch_add(1, Ordering::Relaxed);
            return Err(e);
        }
        Ok((d.lba, d.gen))
    }

    /// Reads dirty `line`'s block (under its stripe lock); a failure loses it.
    fn read_dirty(&self, line: usize, lba: u64) -> io::Result<Vec<u8>> {
        let mut blk = vec![0u8; BLOCK];
        let read = match self.log.read_item(self.dir.loc(line), lba, false) {
            Ok(ItemRead::Found(h, b)) => {
                decode(&h, &b[format::ITEM_HEADER..format::ITEM_HEADER + h.len as usize], &mut blk)
                    .map_err(io::Error::other)
            }
            Ok(_) => Err(io::Error::other("its item failed its check")),
            Err(e) => Err(e),
        };
        if let Err(e) = read {
            self.wb_lose(&format!("reading dirty block {lba}: {e}"));
            return Err(e);
        }
        Ok(blk)
    }

    /// The stripe of `lba`, locked once no copy of it to the backing is
    /// under way.
    fn lock_idle(&self, lba: u64) -> parking_lot::MutexGuard<'_, Stripe> {
        loop {
            let st = self.stripe(lba).lock();
            if !st.busy.contains(&lba) {
                return st;
            }
            drop(st);
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Marks `line` clean if it still holds generation `gen` (under its
    /// stripe lock).
    fn mark_clean(&self, st: &mut Stripe, line: usize, gen: u64) -> bool {
        match st.dirty.get(&line) {
            Some(d) if d.gen == gen => {
                st.dirty.remove(&line);
                self.dir.set_dirty(line, false);
                self.dirty.fetch_sub(1, Ordering::AcqRel);
                true
            }
            _ => false,
        }
    }

    /// Forgets a dirty line whose data is lost (under its stripe lock).
    fn forget_dirty(&self, st: &mut Stripe, line: usize) {
        if st.dirty.remove(&line).is_some() {
            self.dir.set_dirty(line, false);
            self.dirty.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Dirty data was lost: every flush fails from now on.
    fn wb_lose(&self, why: &str) {
        self.c.writeback_errors.fetch_add(1, Ordering::Relaxed);
        let mut l = self.wb_lost.lock();
        if l.is_none() {
            eprintln!("ztier cache: write-back: {why}: flushes fail from now on");
            *l = Some(why.to_string());
        }
    }

    fn queue_dirty(&self, line: usize) {
        self.wb_queue.lock().push_back(line);
        self.wb_cv.notify_one();
    }

    /// Copies one dirty line to the backing; then records that its older
    /// copies are stale (before the line, clean, may be dropped: a
    /// restart must not bring one back) and marks it clean unless it was
    /// written again meanwhile. False on a backing error (it stays dirty).
    /// `wait`: while a copy of its block is under way, waits for it to end
    /// (else the line is queued again for a write-back thread).
    fn write_back_one(&self, line: usize, wait: bool) -> bool {
        let stripe = self.stripe_of_line(line);
        let (lba, gen, blk) = {
            let mut st = stripe.lock();
            let d = loop {
                let Some(d) = st.dirty.get(&line).copied() else { return true };
                if !st.busy.contains(&d.lba) {
                    break d;
                }
                // An older copy of it is on its way: this one after.
                drop(st);
                std::thread::sleep(Duration::from_micros(200));
                if !wait {
                    self.queue_dirty(line);
                    return true;
                }
                st = stripe.lock();
            };
            let Ok(blk) = self.read_dirty(line, d.lba) else { return true };
            st.dirty.get_mut(&line).expect("checked").queued = false;
            st.busy.push(d.lba);
            (d.lba, d.gen, blk)
        };
        // The stripe is free meanwhile: reads, fills and writes of its
        // blocks go on; a write through of this block (`begin_write`) and
        // recycling wait for `busy`.
        let r = self.backing.write_at(&blk, lba * BLOCK as u64, true);
        {
            let mut st = stripe.lock();
            st.busy.retain(|&b| b != lba);
            if r.is_err() {
                self.c.writeback_errors.fetch_add(1, Ordering::Relaxed);
                self.c.backing_errors.fetch_add(1, Ordering::Relaxed);
                if let Some(d) = st.dirty.get_mut(&line) {
                    d.queued = true;
                }
                return false;
            }
        }
        if self.journal_invalidation(gen, lba, 1, false).is_err() {
            // The cache device failed: its dirty blocks are lost (recorded).
            return true;
        }
        let mut st = stripe.lock();
        if self.mark_clean(&mut st, line, gen) {
            self.c.written_back.fetch_add(1, Ordering::Relaxed);
        } else {
            self.c.writeback_superseded.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// A write-back thread: dirty lines from the queue, one at a time.
    fn writeback_loop(&self) {
        let mut failures = 0u32;
        loop {
            let line = {
                let mut q = self.wb_queue.lock();
                loop {
                    if self.stop.load(Ordering::Acquire) {
                        return;
                    }
                    if let Some(l) = q.pop_front() {
                        break l;
                    }
                    self.wb_cv.wait_for(&mut q, Duration::from_millis(100));
                }
            };
            if self.write_back_one(line, false) {
                failures = 0;
            } else {
                // The backing failed: the line stays dirty and is retried.
                failures += 1;
                if failures == 1 {
                    eprintln!("ztier cache: write-back: the backing refused a write; retrying");
                }
                self.queue_dirty(line);
                std::thread::sleep(Duration::from_millis((10 * failures as u64).min(1000)));
            }
        }
    }

    /// Writes every dirty line back now (a clean stop, tests, opening
    /// in another mode).
    fn write_back_all(&self) -> io::Result<()> {
        for _ in 0..8 {
            let lines: Vec<usize> = self
                .stripes
                .iter()
                .flat_map(|s| s.lock().dirty.keys().copied().collect::<Vec<_>>())
                .collect();
            if lines.is_empty() {
                return Ok(());
            }
            for line in lines {
                if !self.write_back_one(line, true) {
                    return Err(io::Error::other("write-back: the backing refused a write"));
                }
            }
        }
        if self.dirty.load(Ordering::Acquire) == 0 {
            Ok(())
        } else {
            Err(io::Error::other("write-back: blocks kept being written"))
        }
    }

    /// Write-back of the whole block `b`: into the SSD cache only, dirty.
    /// False when it cannot be (no line or room for it, too many dirty):
    /// the caller writes it through. `nowait`: false rather than wait for
    /// a write through of the block or recycle a segment for room.
    fn write_dirty(&self, b: u64, data: &[u8], buf: &mut Vec<u8>, nowait: bool) -> bool {
        if self.ssd_off.load(Ordering::Acquire)
            || !self.cacheable(b)
            || self.dirty.load(Ordering::Acquire) >= self.dirty_max
        {
            return false;
        }
        let form = encode(self.codec, data, buf);
        for attempt in 0..2 {
            let mut no_room = false;
            let mut push = None;
            let sealed;
            {
                // A write through of the block in flight (a partial write,
                // trim, zeroing) ends first.
                let mut st = loop {
                    let st = self.stripe(b).lock();
                    if !st.writes.contains_key(&b) {
                        break st;
                    }
                    drop(st);
                    if nowait {
                        return false;
                    }
                    std::thread::sleep(Duration::from_micros(100));
                };
                st.fills.remove(&b);
                if let Some(ram) = &self.ram {
                    ram.remove(b);
                }
                if let Some(r) = &self.opts.remote {
                    r.0.remove(remote_key(b));
                }
                let pinned = |l: usize| st.dirty.get(&l).is_some_and(|d| d.lba != b);
                if !self.dir.can_insert(b, &pinned) {
                    return false;
                }
                let gen = self.next_gen();
                let it = Item { lba: b, gen, form, codec: self.codec as u8, data: buf };
                // Line and dirty bit set under the log's lock, with the
                // item: a seal marks it dirty in the summary.
                let (placed, s) = self.log.append(&self.dir, it, false, |loc| {
                    let r = self.dir.insert_with(b, loc, &pinned);
                    if let Some((line, _)) = r {
                        self.dir.set_dirty(line, true);
                    }
                    r
                });
                sealed = s;
                match placed.flatten() {
                    Some((line, _)) => {
                        let prev = st.dirty.insert(line, Dirty { lba: b, gen, queued: true });
                        match prev {
                            Some(p) if p.queued => {}
                            Some(_) => push = Some(line),
                            None => {
                                self.dirty.fetch_add(1, Ordering::AcqRel);
                                push = Some(line);
                            }
                        }
                        self.c.dirty_writes.fetch_add(1, Ordering::Relaxed);
                    }
                    None => no_room = true,
                }
            }
            if let Some(s) = sealed {
                self.write_segment(s);
            }
            if let Some(line) = push {
                self.queue_dirty(line);
            }
            if !no_room {
                return true;
            }
            if nowait || attempt == 1 || !self.recycle_one() {
                return false;
            }
        }
        false
    }

    /// Makes every dirty block written so far durable on the cache
    /// device: the open segment sealed and written, the device synced.
    fn sync_dirty(&self) -> io::Result<()> {
        if let Some(why) = self.wb_lost.lock().as_ref() {
            return Err(io::Error::other(format!("write-back: {why}")));
        }
        if self.dirty.load(Ordering::Acquire) > 0 {
            if let Some(s) = self.log.seal_open(&self.dir, None) {
                self.write_segment(s);
            }
            self.log.wait_writes();
            self.dev.sync()?;
        }
        if let Some(why) = self.wb_lost.lock().as_ref() {
            return Err(io::Error::other(format!("write-back: {why}")));
        }
        Ok(())
    }
}

fn range_blocks(off: u64, len: u64) -> (u64, u64) {
    let first = off / BLOCK as u64;
    let last = (off + len).div_ceil(BLOCK as u64);
    (first, last - first)
}

impl Cache {
    /// Opens the cache on `dev` in front of `backing`, recovering what it
    /// can (see the module docs), and starts its threads.
    pub fn open(
        dev: Arc<dyn Backing>,
        backing: Arc<dyn Backend>,
        opts: CacheOptions,
    ) -> Result<Cache, CacheError> {
        if opts.remote.is_some() && opts.ram_cache == 0 {
            return Err(CacheError::Options("a remote RAM cache needs a RAM cache (--ram-cache)".into()));
        }
        let t0 = Instant::now();
        let mut sb = read_superblock(&*dev)?;
        let codec = CodecId::try_from(sb.codec)
            .map_err(|_| CacheError::Damaged(format!("unknown codec {}", sb.codec)))?;
        let size = backing.size();
        if size < BLOCK as u64 {
            return Err(CacheError::Backing(format!("{} is smaller than one block", backing.describe())));
        }
        if sb.backing_size != 0 && sb.backing_size != size && !opts.discard {
            return Err(CacheError::WrongBacking { cached: sb.backing_size, given: size });
        }
        let boot = opts.boot_id.unwrap_or_else(boot_id);
        let mut rec = Recovery::default();
        let cold = if opts.discard {
            Some("asked to (--discard)".to_string())
        } else {
            match sb.state {
                SbState::New => {
                    rec.kind = "new".into();
                    None
                }
                SbState::Clean => match fingerprint(&*backing) {
                    Err(e) => Some(format!("the backing cannot be read to check it did not change ({e})")),
                    Ok(fp) if fp != sb.backing_fingerprint => {
                        Some("the backing changed while the cache was not serving it".to_string())
                    }
                    Ok(_) => {
                        rec.kind = "clean".into();
                        None
                    }
                },
                SbState::Serving => {
                    if sb.boot_id == boot || sb.journal_sync {
                        rec.kind = "crash".into();
                        None
                    } else {
                        Some("the machine restarted since the cache was served without --journal-sync, so invalidations of its last moments may be lost".to_string())
                    }
                }
            }
        };
        let mut found = Vec::new();
        let mut ckpt: Option<(Checkpoint, Vec<u32>)> = None;
        let mut recs = Vec::new();
        let mut journal_next = 0;
        if let Some(why) = &cold {
            rec.kind = "cold".into();
            rec.cold_reason = Some(why.clone());
            sb.uuid = random_u64();
        } else if sb.state != SbState::New {
            ckpt = read_checkpoint(&*dev, &sb)?;
            found = log::scan(&*dev, &sb)?;
            let head = ckpt.as_ref().map_or(0, |c| c.0.journal_head);
            let (r, next) = journal::replay(&*dev, &sb, head)?;
            recs = r;
            journal_next = next;
        }
        // Write-back keeps the journal synced: a power loss must not
        // make the next start cold (its dirty blocks would be dropped).
        let journal_sync = opts.journal_sync || opts.mode == Mode::Writeback;
        // Bind and mark serving before anything new is written.
        sb.state = SbState::Serving;
        sb.boot_id = boot;
        sb.journal_sync = journal_sync;
        sb.backing_size = size;
        sb.sb_gen += 1;
        write_superblock(&*dev, &sb)?;
        let dir = Directory::new(sb.lines, sb.ways as usize, sb.placement, sb.policy)
            .count_segments(sb.segments, sb.units_per_segment());
        // Rebuild the directory, oldest segment first.
        found.sort_by_key(|f| f.seq);
        let inval = Invalidations::new(&recs);
        let mut max_gen = ckpt.as_ref().map_or(0, |c| c.0.gen);
        max_gen = max_gen.max(recs.iter().map(|r| r.gen).max().unwrap_or(0));
        rec.journal_records = recs.len() as u64;
        rec.segments = found.len() as u64;
        let ups = sb.units_per_segment();
        // The valid copies of each block, in the order found.
        let mut copies: HashMap<u64, usize> = HashMap::new();
        let mut all: Vec<(u64, Vec<CopyAt>)> = Vec::new();
        for f in &found {
            let covered = ckpt.as_ref().is_some_and(|(c, _)| f.seq < c.covered_seq);
            for e in &f.entries {
                max_gen = max_gen.max(e.gen);
                let loc = f.idx * ups + e.off / sb.loc_unit;
                let listed = match &ckpt {
                    Some((_, locs)) if covered => locs.binary_search(&loc).is_ok(),
                    _ => !e.dead,
                };
                if !listed || e.lba * BLOCK as u64 + BLOCK as u64 > size {
                    rec.lines_dead += 1;
                    continue;
                }
                if inval.newest(e.lba) > e.gen {
                    rec.lines_invalidated += 1;
                    continue;
                }
                let c = CopyAt {
                    gen: e.gen,
                    loc,
                    dirty: e.dirty,
                    at: sb.segment_offset(f.idx) + e.off as u64,
                    seq: f.seq,
                };
                match copies.get(&e.lba) {
                    Some(&k) => all[k].1.push(c),
                    None => {
                        copies.insert(e.lba, all.len());
                        all.push((e.lba, vec![c]));
                    }
                }
            }
        }
        // The newest copy of each block (by generation); a dirty one only
        // if its item checks (a segment written but not synced may be torn
        // by a power loss: it held nothing flushed, and an older copy is
        // then the newest the cache holds).
        let mut cands: Vec<(u64, u64, u32, bool)> = Vec::new();
        let mut ib = vec![0u8; format::ITEM_HEADER + BLOCK];
        for (lba, mut cs) in all {
            cs.sort_by_key(|c| std::cmp::Reverse(c.gen));
            for c in cs {
                if c.dirty {
                    let n = (format::ITEM_HEADER + BLOCK).min((sb.device_size() - c.at) as usize);
                    dev.read_at(&mut ib[..n], c.at)?;
                    if !format::get_item(&ib[..n], c.seq).is_ok_and(|(h, _)| h.lba == lba) {
                        rec.lines_dead += 1;
                        continue;
                    }
                }
                cands.push((lba, c.gen, c.loc, c.dirty));
                break;
            }
        }
        // Dirty copies first (a clean one never takes a dirty one's line);
        // a dirty one without a line is written back below.
        let mut dirty_lines: HashMap<usize, (u64, u64)> = HashMap::new();
        let mut unplaced = Vec::new();
        for &(lba, gen, loc, dirty) in &cands {
            if !dirty {
                continue;
            }
            match dir.insert_with(lba, loc, &|l| dirty_lines.contains_key(&l)) {
                Some((line, _)) => {
                    dir.set_dirty(line, true);
                    dirty_lines.insert(line, (lba, gen));
                }
                None => unplaced.push((lba, loc)),
            }
        }
        for &(lba, _, loc, dirty) in &cands {
            if !dirty {
                dir.insert_with(lba, loc, &|l| dirty_lines.contains_key(&l));
            }
        }
        rec.lines_loaded = dir.count();
        rec.lines_dirty = dirty_lines.len() as u64;
        let log = Log::new(dev.clone(), &sb, &found);
        let journal = Journal::new(dev.clone(), &sb, journal_sync, journal_next, journal_next);
        let nstripes = ((sb.lines / 1024) as usize).clamp(64, 4096).next_power_of_two();
        let ram = if opts.ram_cache > 0 {
            Some(Arc::new(
                RamCache::new(opts.ram_cache, codec).map_err(|e| CacheError::Backing(e.to_string()))?,
            ))
        } else {
            None
        };
        let (tx, rx) = mpsc::sync_channel(opts.fill_queue.max(1));
        let dirty_max = (sb.segments as u64 * sb.segment_size as u64 / BLOCK as u64) * DIRTY_MAX_PCT / 100;
        let mut inner = Inner {
            sb: Mutex::new(sb),
            geo: sb,
            dev,
            backing,
            size,
            door: (opts.admission == Admission::Seen).then(|| Doorkeeper::new(dir.lines() as u64)),
            full: AtomicBool::new(false),
            dir,
            log,
            journal,
            stripes: (0..nstripes).map(|_| Mutex::new(Stripe::default())).collect(),
            tokens: AtomicU64::new(1),
            gen: AtomicU64::new(max_gen + 1),
            ram,
            watch: Arc::new(Watch::default()),
            fill_tx: Mutex::new(Some(tx)),
            fills_pending: AtomicU64::new(0),
            remote_rest_until: AtomicU64::new(0),
            remote_lost: AtomicU64::new(0),
            seq: Sequential::new(opts.sequential_cutoff),
            codec,
            c: Counters::default(),
            lat: Latencies::default(),
            maint: std::sync::Mutex::new(()),
            ckpt_seq: AtomicU64::new(ckpt.as_ref().map_or(0, |c| c.0.ckpt_seq)),
            stop: Arc::new(AtomicBool::new(false)),
            ssd_off: AtomicBool::new(false),
            broken: Mutex::new(None),
            degraded: Mutex::new(None),
            recovery: Recovery::default(),
            started: Instant::now(),
            wb_queue: Mutex::new(VecDeque::new()),
            wb_cv: Condvar::new(),
            dirty: AtomicU64::new(0),
            dirty_max,
            wb_lost: Mutex::new(None),
            opts,
        };
        // Dirty blocks found: queued to be written back; those without a
        // line written back now (their segments are intact until the log
        // appends).
        for (line, (lba, gen)) in dirty_lines {
            inner.stripe_of_line(line).lock().dirty.insert(line, Dirty { lba, gen, queued: true });
            inner.dirty.fetch_add(1, Ordering::AcqRel);
            inner.wb_queue.lock().push_back(line);
        }
        let mut blk = vec![0u8; BLOCK];
        for (lba, loc) in unplaced {
            let ok = match inner.log.read_item(loc, lba, false) {
                Ok(ItemRead::Found(h, b)) => {
                    decode(&h, &b[format::ITEM_HEADER..format::ITEM_HEADER + h.len as usize], &mut blk)
                        .is_ok()
                }
                _ => false,
            };
            if !ok {
                return Err(CacheError::Damaged(format!(
                    "dirty block {lba} is unreadable on the cache device"
                )));
            }
            inner
                .backing
                .write_at(&blk, lba * BLOCK as u64, true)
                .map_err(|e| CacheError::Backing(format!("writing back dirty block {lba}: {e}")))?;
            rec.dirty_written_back += 1;
        }
        if inner.opts.mode != Mode::Writeback {
            // Served in another mode now: every dirty block to the backing first.
            let n = inner.dirty.load(Ordering::Acquire);
            inner
                .write_back_all()
                .map_err(|e| CacheError::Backing(format!("writing back the dirty blocks: {e}")))?;
            rec.dirty_written_back += n;
        }
        // A checkpoint of what was recovered: the old journal is no longer needed.
        inner.checkpoint()?;
        rec.seconds = t0.elapsed().as_secs_f64();
        inner.recovery = rec;
        let inner = Arc::new(inner);
        let cache = Cache { inner: inner.clone(), threads: Mutex::new(Vec::new()) };
        cache.start(rx);
        Ok(cache)
    }

    fn start(&self, rx: Receiver<Fill>) {
        let mut th = self.threads.lock();
        let rx = Arc::new(Mutex::new(rx));
        for k in 0..self.inner.opts.fillers.max(1) {
            let (i, rx) = (self.inner.clone(), rx.clone());
            th.push(
                std::thread::Builder::new()
                    .name(format!("cache-fill-{k}"))
                    .spawn(move || {
                        let mut buf = Vec::with_capacity(BLOCK);
                        loop {
                            let f = rx.lock().recv();
                            let Ok(f) = f else { break };
                            i.fill(f, &mut buf);
                            i.fills_pending.fetch_sub(1, Ordering::AcqRel);
                        }
                    })
                    .expect("spawning a filler"),
            );
        }
        let i = self.inner.clone();
        th.push(
            std::thread::Builder::new()
                .name("cache-maint".into())
                .spawn(move || {
                    while !i.stop.load(Ordering::Acquire) {
                        {
                            let mut g = i.log.low_lock.lock();
                            i.log.low.wait_for(&mut g, Duration::from_millis(100));
                        }
                        i.maintain();
                    }
                })
                .expect("spawning the maintenance thread"),
        );
        if self.inner.opts.mode == Mode::Writeback {
            for k in 0..self.inner.opts.writeback_threads.max(1) {
                let i = self.inner.clone();
                th.push(
                    std::thread::Builder::new()
                        .name(format!("cache-wb-{k}"))
                        .spawn(move || i.writeback_loop())
                        .expect("spawning a write-back thread"),
                );
            }
        }
        if let (Some(ram), Some(p)) = (&self.inner.ram, &self.inner.opts.pressure) {
            th.push(pressure::spawn(
                p.clone(),
                ram.clone(),
                self.inner.watch.clone(),
                self.inner.stop.clone(),
            ));
        }
    }

    /// Backing size in bytes (the size the cache exports).
    pub fn size(&self) -> u64 {
        self.inner.size
    }

    /// Whether writes are refused.
    pub fn read_only(&self) -> bool {
        self.inner.opts.read_only || self.inner.backing.read_only()
    }

    /// How the cache came up.
    pub fn recovery(&self) -> &Recovery {
        &self.inner.recovery
    }

    /// The latency histograms (measured inside the server).
    pub fn latencies(&self) -> &Latencies {
        &self.inner.lat
    }

    /// The superblock as served.
    pub fn geometry(&self) -> Superblock {
        self.inner.geo
    }

    /// Reads `buf.len()` bytes at `off`.
    pub fn read(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let i = &*self.inner;
        let t = Instant::now();
        i.c.reads.fetch_add(1, Ordering::Relaxed);
        let len = buf.len() as u64;
        if off.checked_add(len).is_none_or(|e| e > i.size) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "read beyond the end"));
        }
        if len == 0 {
            return Ok(());
        }
        let (first, n) = range_blocks(off, len);
        i.c.read_blocks.fetch_add(n, Ordering::Relaxed);
        let bypass = i.seq.observe(off, len);
        let mut blk = vec![0u8; BLOCK];
        let mut missing: Vec<u64> = Vec::new();
        let (mut used_ssd, mut used_remote) = (false, false);
        // Hits are copied into place; misses are listed.
        for b in first..first + n {
            let cacheable = i.cacheable(b);
            let lvl = if cacheable { i.lookup(b, &mut blk, !bypass, false) } else { Level::Miss };
            match lvl {
                Level::Miss | Level::WouldBlock => missing.push(b),
                Level::Lost => {
                    i.c.errors.fetch_add(1, Ordering::Relaxed);
                    return Err(io::Error::other("a dirty block is unreadable on the cache device"));
                }
                l => {
                    match l {
                        Level::Ram => i.c.ram_hits.fetch_add(1, Ordering::Relaxed),
                        Level::Remote => {
                            used_remote = true;
                            i.c.remote_hits.fetch_add(1, Ordering::Relaxed)
                        }
                        _ => {
                            used_ssd = true;
                            i.c.ssd_hits.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                    copy_block(b, &blk, off, buf);
                }
            }
        }
        // A dirty line moved by recycling between a lookup and its item's
        // read looks like a miss: never from the backing (older), but
        // read under the stripe lock, where no line moves.
        if i.dirty.load(Ordering::Acquire) > 0 {
            let mut lost = false;
            missing.retain(|&b| {
                let st = i.stripe(b).lock();
                let Some(line) = i.dirty_line(&st, b) else { return true };
                match i.read_dirty(line, b) {
                    Ok(d) => {
                        copy_block(b, &d, off, buf);
                        used_ssd = true;
                        i.c.ssd_hits.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => lost = true,
                }
                false
            });
            if lost {
                i.c.errors.fetch_add(1, Ordering::Relaxed);
                return Err(io::Error::other("a dirty block is unreadable on the cache device"));
            }
        }
        if missing.is_empty() {
            let h = if used_remote {
                &i.lat.remote_hit
            } else if used_ssd {
                &i.lat.ssd_hit
            } else {
                &i.lat.ram_hit
            };
            h.record(t.elapsed());
            return Ok(());
        }
        i.c.misses.fetch_add(missing.len() as u64, Ordering::Relaxed);
        if bypass {
            i.c.bypassed_read_blocks.fetch_add(missing.len() as u64, Ordering::Relaxed);
        }
        // Reservations first, then one backing read from the first missing
        // block to the last.
        let tokens: Vec<Option<u64>> =
            missing.iter().map(|&b| if !bypass && i.cacheable(b) { i.reserve(b) } else { None }).collect();
        let lo = missing[0] * BLOCK as u64;
        let hi = ((missing[missing.len() - 1] + 1) * BLOCK as u64).min(i.size);
        let mut span = vec![0u8; (hi - lo) as usize];
        if let Err(e) = i.backing.read_at(&mut span, lo) {
            for (&b, t) in missing.iter().zip(&tokens) {
                if let Some(t) = t {
                    i.cancel(b, *t);
                }
            }
            i.c.backing_errors.fetch_add(1, Ordering::Relaxed);
            i.c.errors.fetch_add(1, Ordering::Relaxed);
            return Err(e);
        }
        for (&b, token) in missing.iter().zip(tokens) {
            let s = ((b * BLOCK as u64 - lo) as usize).min(span.len());
            let e = (s + BLOCK).min(span.len());
            let data = &span[s..e];
            let boff = b * BLOCK as u64;
            // Copy the part inside the request.
            let from = off.max(boff);
            let to = (off + len).min(boff + data.len() as u64);
            if from < to {
                buf[(from - off) as usize..(to - off) as usize]
                    .copy_from_slice(&data[(from - boff) as usize..(to - boff) as usize]);
            }
            if let Some(token) = token {
                i.queue_fill(Fill { lba: b, data: data.to_vec(), token, write: false, ram_only: false });
            }
        }
        i.lat.miss.record(t.elapsed());
        Ok(())
    }

    /// [`Cache::read`], its fills left to this thread: they run at its
    /// next [`Cache::run_deferred_fills`] (a server's worker, once it has
    /// sent the reply: no filler thread to wake and put to sleep again).
    /// Until then they count as pending ([`Cache::drain`] waits for them).
    pub fn read_deferring_fills(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        DEFER.with(|d| d.set(true));
        let r = self.read(off, buf);
        DEFER.with(|d| d.set(false));
        let fills = DEFERRED.with(|d| std::mem::take(&mut *d.borrow_mut()));
        if !fills.is_empty() {
            LATER.with(|l| l.borrow_mut().extend(fills.into_iter().map(|f| (self.inner.clone(), f))));
        }
        r
    }

    /// Runs the fills this thread's [`Cache::read_deferring_fills`] left
    /// (of any cache).
    pub fn run_deferred_fills(&self) {
        let later = LATER.with(|l| std::mem::take(&mut *l.borrow_mut()));
        let mut buf = Vec::with_capacity(BLOCK);
        for (i, f) in later {
            i.fill(f, &mut buf);
            i.fills_pending.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Serves a read at once if every block is in RAM, or in the SSD
    /// cache and readable without waiting for the device; `None`
    /// otherwise (nothing counted: the ordinary read follows).
    pub fn read_fast(&self, off: u64, buf: &mut [u8]) -> Option<io::Result<()>> {
        let i = &*self.inner;
        let t = Instant::now();
        let len = buf.len() as u64;
        if len == 0 || off.checked_add(len).is_none_or(|e| e > i.size) {
            return None;
        }
        let (first, n) = range_blocks(off, len);
        let mut blk = [0u8; BLOCK];
        let (mut ram, mut ssd) = (0, 0);
        // A stream's hits count toward its length too (recorded only if
        // served here: the ordinary read records the others).
        let bypass = i.seq.peek(off, len);
        for b in first..first + n {
            if !i.cacheable(b) {
                return None;
            }
            match i.lookup(b, &mut blk, !bypass, true) {
                Level::Ram => ram += 1,
                Level::Ssd => ssd += 1,
                Level::Lost => {
                    return Some(Err(io::Error::other("a dirty block is unreadable on the cache device")))
                }
                Level::Remote | Level::Miss | Level::WouldBlock => return None,
            }
            copy_block(b, &blk, off, buf);
        }
        i.seq.observe(off, len);
        i.c.reads.fetch_add(1, Ordering::Relaxed);
        i.c.read_blocks.fetch_add(n, Ordering::Relaxed);
        i.c.ram_hits.fetch_add(ram, Ordering::Relaxed);
        i.c.ssd_hits.fetch_add(ssd, Ordering::Relaxed);
        let h = if ssd > 0 { &i.lat.ssd_hit } else { &i.lat.ram_hit };
        h.record(t.elapsed());
        Some(Ok(()))
    }

    fn write_op(
        &self,
        off: u64,
        len: u64,
        op: impl FnOnce() -> io::Result<()>,
        data: Option<&[u8]>,
    ) -> io::Result<()> {
        let i = &*self.inner;
        if self.read_only() {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, "read-only"));
        }
        if off.checked_add(len).is_none_or(|e| e > i.size) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "beyond the end"));
        }
        if len == 0 {
            return op();
        }
        let t = Instant::now();
        let (first, n) = range_blocks(off, len);
        let bypass = data.is_some() && i.seq.observe(off, len);
        let (_gen, blocks) = i.begin_write(first, n)?;
        let at_backing = Instant::now();
        let r = op();
        let backing = at_backing.elapsed();
        if r.is_err() {
            i.c.backing_errors.fetch_add(1, Ordering::Relaxed);
        }
        // Write-through: the whole blocks written, unless the write failed
        // or is part of a sequential stream.
        let through = r.is_ok() && i.opts.mode != Mode::Writearound && data.is_some() && !bypass;
        if r.is_ok() && bypass {
            i.c.bypassed_write_blocks.fetch_add(n, Ordering::Relaxed);
        }
        let whole = |b: u64| {
            let boff = b * BLOCK as u64;
            through && boff >= off && boff + BLOCK as u64 <= off + len && i.cacheable(b)
        };
        let fills = i.end_write(&blocks, whole);
        if let Some(data) = data {
            for (b, token) in fills {
                let at = (b * BLOCK as u64 - off) as usize;
                i.queue_fill(Fill {
                    lba: b,
                    data: data[at..at + BLOCK].to_vec(),
                    token,
                    write: true,
                    ram_only: false,
                });
            }
        }
        let all = t.elapsed();
        i.lat.write.record(all);
        i.lat.write_cache.record(all.saturating_sub(backing));
        if r.is_err() {
            i.c.errors.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// Writes `data` at `off` to the backing (with `fua`, durable on
    /// return); the blocks' lines are dropped first and, in write-through
    /// mode, the new data cached after.
    pub fn write(&self, off: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let i = &*self.inner;
        i.c.writes.fetch_add(1, Ordering::Relaxed);
        i.c.written_blocks.fetch_add(range_blocks(off, data.len() as u64).1, Ordering::Relaxed);
        if i.opts.mode == Mode::Writeback && !self.read_only() {
            return self.write_back_mode(off, data, fua);
        }
        self.write_op(off, data.len() as u64, || i.backing.write_at(data, off, fua), Some(data))
    }

    /// Serves a write at once when it needs no waiting: in write-back
    /// mode, whole blocks without FUA that go dirty into the SSD cache
    /// with no segment to recycle first. `None` otherwise, with nothing
    /// done (the ordinary write follows).
    pub fn write_fast(&self, off: u64, data: &[u8], fua: bool) -> Option<io::Result<()>> {
        let i = &*self.inner;
        let len = data.len() as u64;
        let bs = BLOCK as u64;
        if i.opts.mode != Mode::Writeback
            || fua
            || self.read_only()
            || len == 0
            || off % bs != 0
            || len % bs != 0
            || off.checked_add(len).is_none_or(|e| e > i.size)
            || i.ssd_off.load(Ordering::Acquire)
            || i.dirty.load(Ordering::Acquire) + len / bs > i.dirty_max
            || i.log.free() <= crate::log::RESERVE + 1
        {
            return None;
        }
        let t = Instant::now();
        let mut buf = Vec::with_capacity(BLOCK);
        let first = off / bs;
        if !i.write_dirty(first, &data[..BLOCK], &mut buf, true) {
            return None;
        }
        i.c.writes.fetch_add(1, Ordering::Relaxed);
        i.c.written_blocks.fetch_add(len / bs, Ordering::Relaxed);
        // The first block is in: the rest must follow, the ordinary way
        // if one of them cannot at once.
        for k in 1..len / bs {
            let at = (k * bs) as usize;
            if !i.write_dirty(first + k, &data[at..at + BLOCK], &mut buf, true) {
                return Some(self.write_back_mode(off + k * bs, &data[at..], false));
            }
        }
        i.lat.write.record(t.elapsed());
        i.lat.write_cache.record(t.elapsed());
        Some(Ok(()))
    }

    /// A write in write-back mode: whole blocks go to the SSD cache only
    /// (dirty); the others (partial blocks, or no line or room for them)
    /// through to the backing. With `fua`, durable on return (on the
    /// cache device, or the backing).
    fn write_back_mode(&self, off: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let i = &*self.inner;
        let len = data.len() as u64;
        if off.checked_add(len).is_none_or(|e| e > i.size) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "beyond the end"));
        }
        if len == 0 {
            return Ok(());
        }
        let t = Instant::now();
        let (first, n) = range_blocks(off, len);
        let mut buf = Vec::with_capacity(BLOCK);
        let mut through: Vec<u64> = Vec::new();
        let mut dirty = false;
        for b in first..first + n {
            let boff = b * BLOCK as u64;
            let whole = boff >= off && boff + BLOCK as u64 <= off + len;
            if whole && i.write_dirty(b, &data[(boff - off) as usize..][..BLOCK], &mut buf, false) {
                dirty = true;
                continue;
            }
            if whole {
                i.c.writeback_fallbacks.fetch_add(1, Ordering::Relaxed);
            }
            through.push(b);
        }
        // Runs of blocks written through.
        let mut k = 0;
        while k < through.len() {
            let mut e = k + 1;
            while e < through.len() && through[e] == through[e - 1] + 1 {
                e += 1;
            }
            let lo = off.max(through[k] * BLOCK as u64);
            let hi = (off + len).min((through[e - 1] + 1) * BLOCK as u64);
            let part = &data[(lo - off) as usize..(hi - off) as usize];
            self.write_op(lo, hi - lo, || i.backing.write_at(part, lo, fua), Some(part))?;
            k = e;
        }
        if dirty && fua {
            i.sync_dirty()?;
        }
        if through.is_empty() {
            i.lat.write.record(t.elapsed());
            i.lat.write_cache.record(t.elapsed());
        }
        Ok(())
    }

    /// Discards a range on the backing (its lines dropped).
    pub fn trim(&self, off: u64, len: u64, fua: bool) -> io::Result<()> {
        let i = &*self.inner;
        i.c.trims.fetch_add(1, Ordering::Relaxed);
        self.write_op(
            off,
            len,
            || {
                i.backing.trim(off, len)?;
                if fua {
                    i.backing.flush()?;
                }
                Ok(())
            },
            None,
        )
    }

    /// Writes zeros over a range on the backing (its lines dropped).
    pub fn write_zeroes(&self, off: u64, len: u64, fast: bool, fua: bool) -> io::Result<()> {
        let i = &*self.inner;
        i.c.zeroes.fetch_add(1, Ordering::Relaxed);
        self.write_op(
            off,
            len,
            || {
                i.backing.write_zeroes(off, len, fast)?;
                if fua {
                    i.backing.flush()?;
                }
                Ok(())
            },
            None,
        )
    }

    /// Makes every completed write durable on the backing.
    pub fn flush(&self) -> io::Result<()> {
        let i = &*self.inner;
        i.c.flushes.fetch_add(1, Ordering::Relaxed);
        if i.opts.mode == Mode::Writeback {
            i.sync_dirty().inspect_err(|_| {
                i.c.errors.fetch_add(1, Ordering::Relaxed);
            })?;
        }
        i.backing.flush().inspect_err(|_| {
            i.c.backing_errors.fetch_add(1, Ordering::Relaxed);
            i.c.errors.fetch_add(1, Ordering::Relaxed);
        })
    }

    /// Waits until every queued fill is done (for tests and benchmarks).
    pub fn drain(&self) {
        while self.inner.fills_pending.load(Ordering::Acquire) > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Write-back: copies every dirty block to the backing now (waiting
    /// for copies under way).
    pub fn write_back_all(&self) -> io::Result<()> {
        self.inner.write_back_all()
    }

    /// Writes a checkpoint now.
    pub fn checkpoint(&self) -> io::Result<()> {
        self.inner.checkpoint()
    }

    /// Runs one round of background work now (tests).
    pub fn maintain(&self) {
        self.inner.maintain();
    }

    /// Stops the threads; with `clean`, seals, checkpoints, records the
    /// backing's fingerprint and marks the cache stopped cleanly (a
    /// restart is then warm).
    fn shutdown(&self, clean: bool) -> Result<(), CacheError> {
        let i = &*self.inner;
        if clean && i.opts.mode == Mode::Writeback && !i.stop.load(Ordering::Acquire) {
            // The write-back threads copy what is dirty (in parallel) while
            // they make progress; what is left is written back below.
            let mut last = (i.dirty.load(Ordering::Acquire), Instant::now());
            while last.0 > 0 && last.1.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(5));
                let n = i.dirty.load(Ordering::Acquire);
                if n < last.0 {
                    last = (n, Instant::now());
                }
            }
        }
        if i.stop.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        // No more fills: the queue ends, fillers finish what is queued.
        i.fill_tx.lock().take();
        i.log.low.notify_all();
        i.wb_cv.notify_all();
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
        if let Some(r) = &i.opts.remote {
            // Its values are of this process only: deleted (what cannot be
            // now stays until `ztier remote gc`).
            r.0.close();
        }
        if !clean {
            return Ok(());
        }
        // Write-back: every dirty block to the backing (a cache stopped
        // cleanly leaves the backing whole); if that fails, the cache is
        // not marked clean and the next start finds them dirty.
        let wb = i.write_back_all().map_err(|e| CacheError::Backing(format!("at the stop: {e}")));
        // The backing's flush may fail (a dead backing): the cache is
        // checkpointed all the same, and the failure reported after.
        let flushed =
            i.backing.flush().map_err(|e| CacheError::Backing(format!("flushing at the stop: {e}")));
        if i.ssd_off.load(Ordering::Acquire) {
            return flushed;
        }
        i.checkpoint()?;
        flushed?;
        wb?;
        let fp = match fingerprint(&*i.backing) {
            Ok(fp) => fp,
            Err(e) => {
                // Left marked as serving: the next start trusts the journal,
                // as after a crash on this boot.
                eprintln!("ztier cache: reading the backing's fingerprint failed ({e}): not marked clean");
                return Ok(());
            }
        };
        let mut sb = i.sb.lock();
        sb.state = SbState::Clean;
        sb.backing_fingerprint = fp;
        sb.sb_gen += 1;
        write_superblock(&*i.dev, &sb)?;
        Ok(())
    }

    /// A clean stop (SIGTERM): the cache is warm on restart.
    pub fn close(&self) -> Result<(), CacheError> {
        self.shutdown(true)
    }

    /// Stops without the clean-stop steps, as a crash would leave the
    /// device (for tests: the device then holds what a killed server's would).
    pub fn abandon(&self) {
        let _ = self.shutdown(false);
    }

    /// Statistics now.
    pub fn stats(&self) -> CacheStats {
        let i = &*self.inner;
        let g = Counters::get;
        let c = &i.c;
        let ls = i.log.stats();
        let lines_used = i.dir.count();
        let ram = i.ram.as_ref().map(|r| r.stats());
        let read_blocks = g(&c.read_blocks);
        let (rh, sh, m) = (g(&c.ram_hits), g(&c.ssd_hits), g(&c.misses));
        let remh = g(&c.remote_hits);
        let lookups = (rh + sh + remh + m).max(1) as f64;
        let ratio = if ls.stored_bytes == 0 { 1.0 } else { ls.logical_bytes as f64 / ls.stored_bytes as f64 };
        let metadata = i.dir.memory_bytes()
            + i.door.as_ref().map_or(0, |d| d.memory_bytes())
            + i.log.memory_bytes()
            + (i.stripes.len() * std::mem::size_of::<Mutex<Stripe>>()) as u64
            + (crate::seq::STREAMS * 24) as u64
            + i.dirty.load(Ordering::Relaxed) * DIRTY_ENTRY_BYTES;
        let sb = *i.sb.lock();
        CacheStats {
            backing: i.backing.describe(),
            backing_size: i.size,
            mode: i.opts.mode,
            placement: sb.placement,
            ways: sb.ways,
            policy: sb.policy,
            codec: i.codec.name().to_string(),
            device_bytes: sb.device_size(),
            segment_size: sb.segment_size,
            lines: i.dir.lines() as u64,
            lines_used,
            cached_bytes: lines_used * BLOCK as u64,
            reads: g(&c.reads),
            writes: g(&c.writes),
            flushes: g(&c.flushes),
            trims: g(&c.trims),
            zeroes: g(&c.zeroes),
            errors: g(&c.errors),
            read_blocks,
            written_blocks: g(&c.written_blocks),
            ram_hits: rh,
            ssd_hits: sh,
            misses: m,
            hit_ratio: (rh + sh + remh) as f64 / lookups,
            ram_hit_ratio: rh as f64 / lookups,
            ssd_hit_ratio: sh as f64 / lookups,
            ssd_fills: g(&c.ssd_fills),
            ram_fills: g(&c.ram_fills),
            write_through_fills: g(&c.write_through_fills),
            fills_dropped_race: g(&c.fills_dropped_race),
            fills_dropped_queue: g(&c.fills_dropped_queue),
            fills_dropped_space: g(&c.fills_dropped_space),
            fills_not_admitted: g(&c.fills_not_admitted),
            bypassed_read_blocks: g(&c.bypassed_read_blocks),
            bypassed_write_blocks: g(&c.bypassed_write_blocks),
            invalidated_lines: g(&c.invalidated_lines),
            conflict_evictions: g(&c.conflict_evictions),
            capacity_evictions: ls.capacity_evictions,
            reinserted: ls.reinserted,
            verify_failures: g(&c.verify_failures),
            cache_read_errors: g(&c.cache_read_errors) + ls.read_errors,
            cache_write_errors: ls.write_errors,
            backing_errors: g(&c.backing_errors),
            checkpoints: g(&c.checkpoints),
            dirty_blocks: i.dirty.load(Ordering::Relaxed),
            dirty_writes: g(&c.dirty_writes),
            written_back: g(&c.written_back),
            writeback_superseded: g(&c.writeback_superseded),
            writeback_errors: g(&c.writeback_errors),
            writeback_fallbacks: g(&c.writeback_fallbacks),
            writeback_lost: i.wb_lost.lock().clone(),
            ratio,
            stored_bytes: ls.stored_bytes,
            bytes_saved: (lines_used as f64 * BLOCK as f64 * (1.0 - 1.0 / ratio)).max(0.0) as u64,
            metadata_bytes: metadata,
            metadata_bytes_per_line: metadata as f64 / i.dir.lines().max(1) as f64,
            metadata_bytes_per_cached_block: if lines_used == 0 {
                0.0
            } else {
                metadata as f64 / lines_used as f64
            },
            log: ls,
            journal: i.journal.stats(),
            ram,
            pressure: i.ram.as_ref().map(|_| i.watch.stats()),
            remote: i.opts.remote.as_ref().map(|r| RemoteStats {
                name: r.0.name(),
                hits: remh,
                puts: g(&c.remote_puts),
                skipped: g(&c.remote_skipped),
                errors: g(&c.remote_errors),
                rests: g(&c.remote_rests),
                entries: r.0.entries(),
                tier: r.0.stats(),
            }),
            latency: LatencyStats {
                ram_hit: summary(&i.lat.ram_hit),
                ssd_hit: summary(&i.lat.ssd_hit),
                remote_hit: summary(&i.lat.remote_hit),
                miss: summary(&i.lat.miss),
                write: summary(&i.lat.write),
                write_cache: summary(&i.lat.write_cache),
            },
            recovery: i.recovery.clone(),
            degraded: i.degraded.lock().clone(),
            writes_refused: i.broken.lock().clone(),
            uptime_s: i.started.elapsed().as_secs_f64(),
        }
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        // Threads hold the inner state: stop them (no clean-stop steps).
        let _ = self.shutdown(false);
    }
}

fn copy_block(b: u64, blk: &[u8], off: u64, buf: &mut [u8]) {
    let boff = b * BLOCK as u64;
    let end = off + buf.len() as u64;
    let from = off.max(boff);
    let to = end.min(boff + BLOCK as u64);
    buf[(from - off) as usize..(to - off) as usize]
        .copy_from_slice(&blk[(from - boff) as usize..(to - boff) as usize]);
}

/// Latency summaries, measured inside the server (request in, data ready).
#[derive(Debug, Clone, Serialize)]
pub struct LatencyStats {
    /// Reads served wholly from the RAM cache.
    pub ram_hit: LatencySummary,
    /// Reads served from the caches, the SSD cache among them.
    pub ssd_hit: LatencySummary,
    /// Reads served from the caches, the remote RAM cache among them.
    pub remote_hit: LatencySummary,
    /// Reads that went to the backing.
    pub miss: LatencySummary,
    /// Writes.
    pub write: LatencySummary,
    /// Writes, the backing's part left out (the cache's own cost).
    pub write_cache: LatencySummary,
}

/// What `ztier cache stats` prints (live, from the server).
#[derive(Debug, Clone, Serialize)]
pub struct CacheStats {
    /// The backing.
    pub backing: String,
    /// Its size (the export's).
    pub backing_size: u64,
    /// Write mode.
    pub mode: Mode,
    /// Placement.
    pub placement: Placement,
    /// Ways per set.
    pub ways: u16,
    /// Replacement within a set.
    pub policy: Policy,
    /// Codec of the SSD cache.
    pub codec: String,
    /// Bytes of the cache device.
    pub device_bytes: u64,
    /// Segment size.
    pub segment_size: u32,
    /// Directory lines.
    pub lines: u64,
    /// Lines holding a block.
    pub lines_used: u64,
    /// Logical bytes cached on the SSD level (lines used × 4096).
    pub cached_bytes: u64,
    /// Read requests.
    pub reads: u64,
    /// Write requests.
    pub writes: u64,
    /// Flushes.
    pub flushes: u64,
    /// Trims.
    pub trims: u64,
    /// Write-zeroes requests.
    pub zeroes: u64,
    /// Requests that failed.
    pub errors: u64,
    /// Blocks read.
    pub read_blocks: u64,
    /// Blocks written.
    pub written_blocks: u64,
    /// Blocks served from RAM.
    pub ram_hits: u64,
    /// Blocks served from the SSD cache.
    pub ssd_hits: u64,
    /// Blocks read from the backing.
    pub misses: u64,
    /// (RAM + SSD hits) / blocks looked up.
    pub hit_ratio: f64,
    /// RAM hits / blocks looked up.
    pub ram_hit_ratio: f64,
    /// SSD hits / blocks looked up.
    pub ssd_hit_ratio: f64,
    /// Blocks put in the SSD cache.
    pub ssd_fills: u64,
    /// Blocks put in the RAM cache.
    pub ram_fills: u64,
    /// Of the SSD fills, from write-through.
    pub write_through_fills: u64,
    /// Fills dropped for a racing write.
    pub fills_dropped_race: u64,
    /// Fills dropped: queue full.
    pub fills_dropped_queue: u64,
    /// Fills dropped: no free segment.
    pub fills_dropped_space: u64,
    /// Fills kept out of the full SSD cache: their blocks were not asked
    /// for before (`serve --admission seen`).
    pub fills_not_admitted: u64,
    /// Blocks of sequential reads around the cache.
    pub bypassed_read_blocks: u64,
    /// Blocks of sequential writes around the cache.
    pub bypassed_write_blocks: u64,
    /// Lines dropped by writes, trims, zeroing.
    pub invalidated_lines: u64,
    /// Lines replaced by another block of their set.
    pub conflict_evictions: u64,
    /// Lines dropped when their segment was recycled.
    pub capacity_evictions: u64,
    /// Lines copied forward when their segment was recycled.
    pub reinserted: u64,
    /// Cached lines that failed their check on read.
    pub verify_failures: u64,
    /// Failed reads of the cache device.
    pub cache_read_errors: u64,
    /// Failed segment writes.
    pub cache_write_errors: u64,
    /// Failed backing requests.
    pub backing_errors: u64,
    /// Checkpoints written.
    pub checkpoints: u64,
    /// Write-back: dirty blocks now (in the SSD cache, not yet on the backing).
    pub dirty_blocks: u64,
    /// Write-back: blocks written to the SSD cache only.
    pub dirty_writes: u64,
    /// Write-back: dirty blocks copied to the backing.
    pub written_back: u64,
    /// Write-back: copies whose block was written again meanwhile (still dirty).
    pub writeback_superseded: u64,
    /// Write-back: failed copies to the backing (kept dirty, retried) and
    /// dirty blocks lost with the cache device.
    pub writeback_errors: u64,
    /// Write-back: whole blocks written through instead (no line or room
    /// for them, or too many dirty).
    pub writeback_fallbacks: u64,
    /// Write-back: why dirty data was lost, if it was (flushes then fail).
    pub writeback_lost: Option<String>,
    /// Compression ratio of the items on the cache device (4096 per item / bytes taken).
    pub ratio: f64,
    /// Bytes items take on the cache device.
    pub stored_bytes: u64,
    /// Bytes of SSD the cached lines do not take thanks to compression.
    pub bytes_saved: u64,
    /// RAM for the SSD cache's metadata (directory, segment tables, stripes).
    pub metadata_bytes: u64,
    /// Per directory line.
    pub metadata_bytes_per_line: f64,
    /// Per cached block (the target: ≤ 8).
    pub metadata_bytes_per_cached_block: f64,
    /// The line store.
    pub log: LogStats,
    /// The journal.
    pub journal: JournalStats,
    /// The RAM cache, if any.
    pub ram: Option<RamStats>,
    /// Its memory pressure watcher.
    pub pressure: Option<PressureStats>,
    /// The remote RAM cache (`--remote`).
    pub remote: Option<RemoteStats>,
    /// Latencies.
    pub latency: LatencyStats,
    /// How the cache came up.
    pub recovery: Recovery,
    /// Why the SSD level is degraded, if it is.
    pub degraded: Option<String>,
    /// Why writes are refused, if they are.
    pub writes_refused: Option<String>,
    /// Seconds since open.
    pub uptime_s: f64,
}
