//! The store: compressed pages under a byte budget that counts everything.
//!
//! ```text
//!            put(handle, page)                        get(handle)
//!                 │ encode outside any lock                │
//!                 │ (thread-local codec state, crc32c)      │
//!                 ▼                                        ▼
//!   shard = hash(pool, object, index) % N   ──►  Mutex<Shard>  (one of N)
//!   ┌──────────────────────────────────────────────────────────────────┐
//!   │ table: hash → slot         slab: [Entry; ..] (48 B each)         │
//!   │ order: anon list, file list (FIFO by put, or LRU by touch)       │
//!   │ allocator: cells | chunks | classes (compressed bytes)           │
//!   │ budget/N: allocator memory + slab + table ≤ budget/N, always     │
//!   └──────────────────────────────────────────────────────────────────┘
//!                 │ full: compact if fragmented, else evict oldest
//!                 ▼
//!        next tier (still compressed) │ or dropped (ephemeral / clean)
//! ```
//!
//! # Entries
//!
//! An entry is 48 bytes: key (pool u32, object u64, index u32), where the
//! bytes are (allocator location, or the fill pattern of a same-filled
//! page), crc32c of the stored bytes, stored length, a tag and flags, the
//! order-list links and an age stamp. The **tag** is the codec id
//! ([`CodecId`] as u8) of a compressed page, [`TAG_RAW`] for a page stored
//! uncompressed, [`TAG_ZERO`] / [`TAG_SAME`] for pages kept as metadata
//! only. The codec id is that of the codec that wrote the bytes: a store
//! configured with `hybrid` tags each page `wkdm` or `lz4` (whichever won
//! it) and stores the bare inner payload, with no trailer byte
//! ([`PageEncoder::inner_tags`]). An entry tagged `hybrid` (the
//! self-describing form with a trailer byte, as written before, and as a
//! next tier may still hold) is still read: it is decoded by hybrid's
//! trailer decoder. A tag no codec has is a decode error
//! ([`StoreError::Decode`]), never a guess. The checksum is verified on every get before anything is
//! decoded; a mismatch is an error, never wrong data.
//!
//! # Budget
//!
//! The budget is split evenly over the shards. A shard's memory is its
//! allocator's [`crate::alloc::Allocator::memory_used`] (backing pages and
//! allocator metadata) plus the capacity of its slab and hash table; a put
//! never leaves it above the shard's share: when the put does not fit,
//! the shard compacts (if its allocator's waste grew by more than 1/64 of
//! the share since the last compaction)
//! and then evicts oldest entries until it does. Growth of the slab or
//! table is treated the same way, before it happens. Changing the budget
//! at run time ([`Store::set_budget`]) compacts first, then evicts. With
//! pinned entries (nothing left to evict) this rests on the allocator's
//! memory not growing when entries are freed (see
//! [`crate::alloc::Allocator::memory_used`]).
//!
//! # Pools (the tmem interface)
//!
//! Pools are *ephemeral* (cleancache: a put may be dropped at any time, a
//! get may miss) or *persistent* (frontswap: a successful put stays
//! gettable until flushed). Persistent entries are evicted only to a next
//! tier; with no next tier they stay, and a put that cannot fit is refused
//! with [`Refusal::Budget`]. With a next tier, a put that cannot fit with
//! nothing left to evict (a share set below what the shard's tables and
//! allocator take) goes to the tier itself ([`Stats::put_to_tier`]).
//! Evicting a *clean* entry of an ephemeral pool drops it (its content
//! exists elsewhere); dirty entries go to the next tier. A refused put
//! also removes any older copy under the same handle, so a get never
//! returns stale data.
//!
//! Sharding makes the FIFO/LRU order per shard, an approximation of one
//! global order that keeps every operation on one lock of N.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use hashbrown::HashTable;
use serde::Serialize;
use ztier_codec::page::{Form, PageEncoder};
use ztier_codec::{CodecId, DecompressError, PAGE_SIZE};

use crate::alloc::{Allocator, AllocatorKind, Loc};
use crate::lock::{const_mutex, Mutex};
use crate::tier::{NextTier, SpillMeta, TierError};
use crate::Key;

/// Tag of a page stored uncompressed.
pub const TAG_RAW: u8 = CodecId::Raw as u8;
/// Tag of an all-zero page (metadata only).
pub const TAG_ZERO: u8 = 0xf0;
/// Tag of a same-filled page (metadata only; pattern in the entry).
pub const TAG_SAME: u8 = 0xf1;

const F_DIRTY: u8 = 1;
const F_FILE: u8 = 2;
const F_PINNED: u8 = 4;
const NIL: u32 = u32::MAX;
/// Budget per shard below which [`StoreConfig::new`] uses fewer shards.
pub const MIN_SHARD_BUDGET: usize = 16 << 20;
/// Most pools a store can have at once.
pub const MAX_POOLS: usize = 64;

/// Entry order for eviction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Order {
    /// Insertion order: the order in which the VM evicted pages.
    Fifo,
    /// Least recently used: a get moves an entry to the young end.
    Lru,
}

impl std::str::FromStr for Order {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fifo" => Ok(Order::Fifo),
            "lru" => Ok(Order::Lru),
            _ => Err(format!("unknown order '{s}' (fifo, lru)")),
        }
    }
}

/// Store configuration.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Total bytes the store may use (data, metadata, fragmentation).
    pub budget: usize,
    /// How compressed pages are laid out in memory.
    pub allocator: AllocatorKind,
    /// The page codec.
    pub codec: CodecId,
    /// Eviction order.
    pub order: Order,
    /// Number of independently locked shards (rounded up to a power of 2).
    pub shards: usize,
    /// Cap on compressed bytes of anonymous pages (CCache's
    /// `max_anon_cc_size`); `None` = only the budget.
    pub anon_cap: Option<usize>,
    /// Cap on compressed bytes of file-backed pages (`max_fs_backed_cc_size`).
    pub file_cap: Option<usize>,
    /// Largest compressed size kept, as a fraction num/den of the page; a
    /// page that compresses worse is refused (or stored raw where the pool
    /// allows).
    pub raw_fraction: (usize, usize),
}

impl StoreConfig {
    /// A configuration with defaults: classes, LZ4, FIFO, and 2 shards per
    /// CPU but at least [`MIN_SHARD_BUDGET`] of budget per shard (a shard
    /// has fixed costs: an allocator's partly filled slabs or cells).
    pub fn new(budget: usize) -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let by_budget = (budget / MIN_SHARD_BUDGET).max(1);
        let shards = (cpus * 2).min(by_budget).min(64);
        StoreConfig {
            budget,
            allocator: AllocatorKind::Classes,
            codec: CodecId::Lz4,
            order: Order::Fifo,
            // The largest power of two not above `shards`.
            shards: 1 << shards.ilog2(),
            anon_cap: None,
            file_cap: None,
            raw_fraction: (3, 4),
        }
    }
}

/// Pool semantics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolKind {
    /// cleancache: puts may be dropped, gets may miss.
    Ephemeral,
    /// frontswap: a successful put is gettable until flushed.
    Persistent,
}

/// Options of a pool.
#[derive(Debug, Clone, Copy)]
pub struct PoolOptions {
    /// Ephemeral or persistent.
    pub kind: PoolKind,
    /// Most pages the pool may hold (`None` = no limit).
    pub max_pages: Option<usize>,
    /// Keep pages that compress poorly uncompressed instead of refusing them.
    pub store_raw: bool,
}

impl PoolOptions {
    /// Options of a pool of `kind`, no page limit, poor pages refused.
    pub fn new(kind: PoolKind) -> Self {
        PoolOptions { kind, max_pages: None, store_raw: false }
    }
}

/// Anonymous or file-backed page (each kind has its own cap).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PageKind {
    /// Anonymous memory (swap-backed).
    #[default]
    Anon,
    /// File-backed page-cache page.
    File,
}

/// Per-put options.
#[derive(Debug, Clone, Copy)]
pub struct PutFlags {
    /// The page differs from any copy elsewhere (must go to the next tier
    /// on eviction rather than be dropped).
    pub dirty: bool,
    /// Anonymous or file-backed.
    pub kind: PageKind,
}

impl Default for PutFlags {
    fn default() -> Self {
        PutFlags { dirty: true, kind: PageKind::Anon }
    }
}

/// Why a put was refused. Counted in [`Stats::rejects`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Refusal {
    /// The page did not compress below the raw threshold.
    PoorCompression,
    /// No room under the budget, even after compaction and eviction,
    /// and no next tier to take the page (none, or it failed; or the
    /// page is clean and ephemeral, which the tier would not keep).
    Budget,
    /// The pool holds its maximum number of pages.
    PoolLimit,
    /// The cap for the page's kind (anon/file) is reached.
    KindCap,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::PoorCompression => "page compresses poorly",
            Refusal::Budget => "no room under the budget",
            Refusal::PoolLimit => "pool page limit reached",
            Refusal::KindCap => "anon/file cap reached",
        })
    }
}

/// Errors of store operations.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The put was refused (the page is not stored; no older copy remains).
    #[error("put refused: {0}")]
    Refused(Refusal),
    /// The pool does not exist (never created, or destroyed).
    #[error("no pool {0}")]
    NoSuchPool(u32),
    /// All pool ids are in use.
    #[error("too many pools (at most {MAX_POOLS})")]
    TooManyPools,
    /// Pages are exactly 4096 bytes.
    #[error("page buffer is {0} bytes, expected 4096")]
    PageSize(usize),
    /// The stored bytes do not match their checksum.
    #[error("checksum mismatch for {key:?}: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum {
        /// The entry.
        key: Key,
        /// Checksum recorded at put.
        stored: u32,
        /// Checksum of the bytes read.
        computed: u32,
    },
    /// The stored bytes passed the checksum but did not decode.
    #[error("stored page for {key:?} does not decode: {err}")]
    Decode {
        /// The entry.
        key: Key,
        /// The codec's error.
        err: DecompressError,
    },
    /// The next tier failed.
    #[error(transparent)]
    Tier(#[from] TierError),
}

/// A pool id returned by [`Store::create_pool`].
pub type PoolId = u32;

/// Per-pool counters in [`Stats`].
#[derive(Debug, Clone, Default, Serialize)]
pub struct PoolStats {
    /// Pool id.
    pub id: u32,
    /// Ephemeral or persistent.
    pub kind: Option<PoolKind>,
    /// Pages held in RAM.
    pub pages: u64,
    /// Successful puts.
    pub puts: u64,
    /// Gets that found the page (in RAM or the next tier).
    pub hits: u64,
    /// Gets that did not.
    pub misses: u64,
}

/// Refused puts by reason.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Rejects {
    /// Compressed above the raw threshold (pool does not store raw).
    pub poor_compression: u64,
    /// No room under the budget.
    pub budget: u64,
    /// Pool page limit.
    pub pool_limit: u64,
    /// Anon/file cap.
    pub kind_cap: u64,
}

/// Store statistics, in the spirit of zram's `mm_stat` plus zswap's rejects.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    /// Current budget in bytes.
    pub budget: u64,
    /// Pages held in RAM.
    pub pages: u64,
    /// Uncompressed size of those pages.
    pub orig_bytes: u64,
    /// Bytes of stored data (compressed sizes; raw pages count 4096).
    pub compressed_bytes: u64,
    /// All memory used: allocator pages and metadata, slabs and tables.
    pub memory_used: u64,
    /// Of `memory_used`, metadata (store entries, tables, allocator metadata).
    pub metadata_bytes: u64,
    /// Of `metadata_bytes`, the allocators' own.
    pub allocator_metadata_bytes: u64,
    /// Allocator memory not holding data nor metadata (rounding, holes).
    pub fragmentation_bytes: u64,
    /// All-zero pages held (metadata only).
    pub zero_pages: u64,
    /// Same-filled (non-zero) pages held (metadata only).
    pub same_pages: u64,
    /// Pages held uncompressed.
    pub raw_pages: u64,
    /// Anonymous pages held.
    pub anon_pages: u64,
    /// File-backed pages held.
    pub file_pages: u64,
    /// Dirty pages held.
    pub dirty_pages: u64,
    /// Successful puts.
    pub puts: u64,
    /// Gets.
    pub gets: u64,
    /// Gets served from RAM.
    pub hits: u64,
    /// Gets served from the next tier.
    pub tier_hits: u64,
    /// Gets that found nothing.
    pub misses: u64,
    /// Pages flushed by `flush_page`/`flush_object`/`destroy_pool`.
    pub flushed: u64,
    /// Compactions run.
    pub compactions: u64,
    /// Time spent compacting, in nanoseconds.
    pub compaction_ns: u64,
    /// Entries moved by compaction.
    pub compaction_moves: u64,
    /// Entries evicted to the next tier.
    pub evicted_to_tier: u64,
    /// Puts that went straight to the next tier: no room in RAM, and
    /// nothing older left to push there (a share below what the shard's
    /// tables take).
    pub put_to_tier: u64,
    /// Time spent on the next tier in puts (pushing the oldest entries
    /// there, dropping a put key's older copy there), in nanoseconds.
    pub tier_put_ns: u64,
    /// Entries evicted and dropped (ephemeral or clean).
    pub evicted_dropped: u64,
    /// Refused puts by reason.
    pub rejects: Rejects,
    /// Gets that found a checksum mismatch.
    pub checksum_errors: u64,
    /// Failed next-tier operations.
    pub tier_errors: u64,
    /// Entries held by the next tier.
    pub tier_entries: u64,
    /// Bytes used on the next tier's medium.
    pub tier_bytes: u64,
    /// Per-pool counters (live pools).
    pub pools: Vec<PoolStats>,
}

impl Stats {
    /// orig_bytes / memory_used: the ratio after all overhead.
    pub fn effective_ratio(&self) -> f64 {
        if self.memory_used == 0 {
            0.0
        } else {
            self.orig_bytes as f64 / self.memory_used as f64
        }
    }
}

#[derive(Clone, Copy)]
struct Entry {
    object: u64,
    /// Allocator location, or the pattern of a same-filled page.
    loc: u64,
    pool: u32,
    index: u32,
    crc: u32,
    prev: u32,
    next: u32,
    /// Age stamp (put, or last get under LRU); compared with wrapping.
    seq: u32,
    len: u16,
    tag: u8,
    flags: u8,
}

impl Entry {
    fn key(&self) -> Key {
        Key { pool: self.pool, object: self.object, index: self.index }
    }
    fn kind(&self) -> usize {
        usize::from(self.flags & F_FILE != 0)
    }
    fn in_allocator(&self) -> bool {
        self.len > 0
    }
}

#[derive(Default, Clone)]
struct PoolCounters {
    puts: u64,
    hits: u64,
    misses: u64,
}

#[derive(Default)]
struct Counters {
    pages: u64,
    compressed: u64,
    zero: u64,
    same: u64,
    raw: u64,
    kind_pages: [u64; 2],
    kind_bytes: [usize; 2],
    dirty: u64,
    puts: u64,
    gets: u64,
    hits: u64,
    tier_hits: u64,
    misses: u64,
    flushed: u64,
    compactions: u64,
    compaction_ns: u64,
    compaction_moves: u64,
    evicted_to_tier: u64,
    put_to_tier: u64,
    tier_put_ns: u64,
    evicted_dropped: u64,
    rejects: [u64; 4],
    checksum_errors: u64,
    tier_errors: u64,
    pools: Vec<PoolCounters>,
}

impl Counters {
    fn pool(&mut self, p: u32) -> &mut PoolCounters {
        let p = p as usize;
        if self.pools.len() <= p {
            self.pools.resize(p + 1, PoolCounters::default());
        }
        &mut self.pools[p]
    }
}

struct Shard {
    alloc: Box<dyn Allocator>,
    table: HashTable<u32>,
    slab: Vec<Entry>,
    free: u32,
    head: [u32; 2],
    tail: [u32; 2],
    seq: u32,
    budget: usize,
    caps: [usize; 2],
    frees_since_compact: u32,
    /// Allocator waste right after the last compaction.
    waste_floor: usize,
    c: Counters,
    buf: Vec<u8>,
}

/// Pool state word: generation << 8 | state (0 free, 1 ephemeral, 2 persistent,
/// 3 being destroyed) | store_raw << 2.
struct PoolSlot {
    state: AtomicU64,
    max_pages: AtomicUsize,
    pages: AtomicUsize,
}

const POOL_FREE: u64 = 0;
const POOL_EPHEMERAL: u64 = 1;
const POOL_PERSISTENT: u64 = 2;
const POOL_DYING: u64 = 3;
const POOL_RAW: u64 = 4;

/// The hash of a key. Sixteen consecutive indices of one object (pages
/// of a walk, blocks of an extent) share a shard and a run of 16
/// buckets of its table — one group of control bytes, one cache line of
/// slot numbers — so a walk over neighbouring pages finds the index
/// lines it needs already cached; each index of the 16 still gets its own
/// 7-bit tag (the top bits, which the table matches first).
///
/// ```text
///  bit 63 ........ 57 56 ............................ 4 3 ........ 0
///   tag (mix + 47·lo) │ mix of pool, object, index/16 │ mix + lo (mod 16)
///                                              (lo = index % 16)
/// ```
///
/// The low 4 bits keep the mix too, so keys that differ only in their
/// object (index 0 everywhere) still spread over every bucket.
fn hash_key(k: &Key) -> u64 {
    let lo = u64::from(k.index & 15);
    let mut h = (k.object ^ ((k.pool as u64) << 32 | u64::from(k.index >> 4)).rotate_left(29))
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^= h >> 32;
    h = h.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    h ^= h >> 32;
    // 47 is odd: the 16 tags of a group are distinct.
    let tag = ((h >> 57) + lo * 47) & 0x7F;
    (h & !(0xF | (0x7F << 57))) | ((h + lo) & 0xF) | (tag << 57)
}

/// Page buffers and encoders lent to whichever thread needs one, from a
/// pool rather than kept per thread: a thread-local value with a
/// destructor registers it, on the thread's first use, with glibc's
/// `__cxa_thread_atexit_impl`, which allocates with the program's
/// `calloc`. Under `ztier run` that may be an allocator of the program's
/// own (rustc links jemalloc in), whose lock the faulting thread — or
/// the one the handler serves — holds while it touches its fresh memory:
/// the fault's service then waited for that lock for ever. (The store's
/// locks keep nothing per thread either: [`crate::lock`].) A pool that
/// is busy (a crash handler that interrupted its holder) lends a fresh
/// one; at most [`POOL_KEEP`] are kept.
static SCRATCH: Mutex<Vec<Vec<u8>>> = const_mutex(Vec::new());
static ENCODERS: Mutex<Vec<PageEncoder>> = const_mutex(Vec::new());
const POOL_KEEP: usize = 64;

/// A page-sized buffer from the pool (not zeroed on every use; the codec
/// writes what is read back), returned when dropped.
struct Scratch(Vec<u8>);

impl Scratch {
    fn take() -> Self {
        match SCRATCH.try_lock().and_then(|mut p| p.pop()) {
            Some(v) => Scratch(v),
            None => Scratch(vec![0; PAGE_SIZE]),
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(mut p) = SCRATCH.try_lock() {
            if p.len() < POOL_KEEP {
                p.push(std::mem::take(&mut self.0));
            }
        }
    }
}

/// Runs `f` with an encoder for `codec` (and raw fraction) from the pool.
fn with_encoder<R>(codec: CodecId, raw: (usize, usize), f: impl FnOnce(&mut PageEncoder) -> R) -> R {
    let fits = |p: &PageEncoder| p.codec_id() == codec && p.limit(4 * raw.1) == 4 * raw.0;
    let mut enc = ENCODERS
        .try_lock()
        .and_then(|mut p| p.iter().position(fits).map(|i| p.swap_remove(i)))
        .unwrap_or_else(|| PageEncoder::new(codec).raw_fraction(raw.0, raw.1).inner_tags());
    let r = f(&mut enc);
    if let Some(mut p) = ENCODERS.try_lock() {
        if p.len() < POOL_KEEP {
            p.push(enc);
        }
    }
    r
}

/// The compressed page store. Shared between threads by reference.
pub struct Store {
    cfg: StoreConfig,
    shards: Box<[Mutex<Shard>]>,
    shard_mask: usize,
    pools: Box<[PoolSlot]>,
    tier: Option<Box<dyn NextTier>>,
    budget: AtomicUsize,
}

enum Evict {
    Done,
    Nothing,
}

impl Shard {
    fn new(alloc: Box<dyn Allocator>, budget: usize, caps: [usize; 2]) -> Self {
        Shard {
            alloc,
            table: HashTable::new(),
            slab: Vec::new(),
            free: NIL,
            head: [NIL; 2],
            tail: [NIL; 2],
            seq: 0,
            budget,
            caps,
            frees_since_compact: 0,
            waste_floor: 0,
            c: Counters::default(),
            buf: vec![0; PAGE_SIZE],
        }
    }

    fn meta_bytes(&self) -> usize {
        self.slab.capacity() * std::mem::size_of::<Entry>() + self.table.allocation_size()
    }

    fn memory(&self) -> usize {
        self.alloc.memory_used() + self.meta_bytes()
    }

    fn waste(&self) -> usize {
        let data = self.alloc.memory_used() - self.alloc.metadata_bytes();
        data.saturating_sub(self.c.kind_bytes[0] + self.c.kind_bytes[1])
    }

    fn find(&self, h: u64, k: &Key) -> Option<u32> {
        self.table.find(h, |&s| self.slab[s as usize].key() == *k).copied()
    }

    fn link(&mut self, s: u32) {
        let kind = self.slab[s as usize].kind();
        self.seq = self.seq.wrapping_add(1);
        let t = self.tail[kind];
        let e = &mut self.slab[s as usize];
        e.seq = self.seq;
        e.prev = t;
        e.next = NIL;
        if t == NIL {
            self.head[kind] = s;
        } else {
            self.slab[t as usize].next = s;
        }
        self.tail[kind] = s;
    }

    fn unlink(&mut self, s: u32) {
        let e = self.slab[s as usize];
        let kind = e.kind();
        if e.prev == NIL {
            self.head[kind] = e.next;
        } else {
            self.slab[e.prev as usize].next = e.next;
        }
        if e.next == NIL {
            self.tail[kind] = e.prev;
        } else {
            self.slab[e.next as usize].prev = e.prev;
        }
    }

    /// Removes entry `s` entirely (table, order, allocator, counters).
    fn remove(&mut self, s: u32, pools: &[PoolSlot]) {
        let e = self.slab[s as usize];
        let h = hash_key(&e.key());
        if let Ok(o) = self.table.find_entry(h, |&x| x == s) {
            o.remove();
        }
        if e.flags & F_PINNED == 0 {
            self.unlink(s);
        }
        if e.in_allocator() {
            self.alloc.free(Loc(e.loc), e.len as usize);
            self.frees_since_compact = self.frees_since_compact.saturating_add(1);
        }
        let c = &mut self.c;
        c.pages -= 1;
        c.compressed -= e.len as u64;
        c.kind_pages[e.kind()] -= 1;
        c.kind_bytes[e.kind()] -= e.len as usize;
        match e.tag {
            TAG_ZERO => c.zero -= 1,
            TAG_SAME => c.same -= 1,
            TAG_RAW => c.raw -= 1,
            _ => {}
        }
        if e.flags & F_DIRTY != 0 {
            c.dirty -= 1;
        }
        pools[e.pool as usize].pages.fetch_sub(1, Ordering::Relaxed);
        let slot = &mut self.slab[s as usize];
        slot.next = self.free;
        slot.tag = 0;
        self.free = s;
    }

    /// The oldest evictable entry, of `kind` or of either kind.
    fn oldest(&self, kind: Option<usize>) -> Option<u32> {
        match kind {
            Some(k) => (self.head[k] != NIL).then_some(self.head[k]),
            None => match (self.head[0], self.head[1]) {
                (NIL, NIL) => None,
                (a, NIL) => Some(a),
                (NIL, b) => Some(b),
                (a, b) => {
                    let (sa, sb) = (self.slab[a as usize].seq, self.slab[b as usize].seq);
                    Some(if (sa.wrapping_sub(sb) as i32) <= 0 { a } else { b })
                }
            },
        }
    }

    fn read_stored(&self, e: &Entry, out: &mut [u8]) {
        if e.in_allocator() {
            self.alloc.read(Loc(e.loc), e.len as usize, out);
        }
    }

    /// Evicts the oldest evictable entry (of `kind` if given).
    fn evict(&mut self, kind: Option<usize>, pools: &[PoolSlot], tier: Option<&dyn NextTier>) -> Evict {
        let Some(s) = self.oldest(kind) else { return Evict::Nothing };
        let e = self.slab[s as usize];
        let persistent = pools[e.pool as usize].state.load(Ordering::Acquire) & 3 == POOL_PERSISTENT;
        let keep = persistent || e.flags & F_DIRTY != 0;
        if let (true, Some(t)) = (keep, tier) {
            let mut buf = std::mem::take(&mut self.buf);
            self.read_stored(&e, &mut buf);
            let meta = SpillMeta {
                tag: e.tag,
                flags: e.flags & (F_DIRTY | F_FILE),
                len: e.len,
                crc: e.crc,
                pattern: if e.tag == TAG_SAME { e.loc } else { 0 },
            };
            let t0 = Instant::now();
            let r = t.put(e.key(), meta, &buf[..e.len as usize]);
            self.c.tier_put_ns += t0.elapsed().as_nanos() as u64;
            self.buf = buf;
            match r {
                Ok(()) => self.c.evicted_to_tier += 1,
                Err(_) if persistent => {
                    // Cannot lose a persistent page: it stays; make it the
                    // youngest so other entries are tried before it again.
                    self.c.tier_errors += 1;
                    self.unlink(s);
                    self.link(s);
                    return Evict::Nothing;
                }
                Err(_) => {
                    self.c.tier_errors += 1;
                    self.c.evicted_dropped += 1;
                }
            }
        } else {
            self.c.evicted_dropped += 1;
        }
        self.remove(s, pools);
        Evict::Done
    }

    fn compact(&mut self) -> usize {
        let t = Instant::now();
        let mut moves = 0u64;
        let slab = &mut self.slab;
        let freed = self.alloc.compact(&mut |m| {
            slab[m.owner as usize].loc = m.to.0;
            moves += 1;
        });
        self.c.compactions += 1;
        self.c.compaction_moves += moves;
        self.c.compaction_ns += t.elapsed().as_nanos() as u64;
        self.frees_since_compact = 0;
        self.waste_floor = self.waste();
        freed
    }

    /// Compacts if the allocator's waste grew by more than 1/64 of the
    /// share since the last compaction (what compaction cannot recover —
    /// class rounding, slab tails, cell remainders — stays in the floor)
    /// and enough has been freed since to make it worth it.
    fn maybe_compact(&mut self) -> bool {
        let floor = self.waste_floor + (self.budget / 64).max(4 * PAGE_SIZE);
        if self.frees_since_compact >= 32 && self.waste() > floor {
            self.compact();
            true
        } else {
            false
        }
    }

    /// Makes the shard fit its budget; false if it cannot (pinned entries).
    fn shrink_to_budget(&mut self, pools: &[PoolSlot], tier: Option<&dyn NextTier>) -> bool {
        if self.memory() > self.budget {
            self.maybe_compact();
        }
        while self.memory() > self.budget {
            if let Evict::Nothing = self.evict(None, pools, tier) {
                self.compact();
                self.slab.shrink_to_fit();
                self.table.shrink_to_fit(|&s| hash_key(&self.slab[s as usize].key()));
                return self.memory() <= self.budget;
            }
        }
        true
    }
}

impl Store {
    /// A store with no next tier.
    pub fn new(cfg: StoreConfig) -> Self {
        Self::with_tier(cfg, None)
    }

    /// A store whose evicted entries go to `tier`.
    pub fn with_tier(cfg: StoreConfig, tier: Option<Box<dyn NextTier>>) -> Self {
        let n = cfg.shards.clamp(1, 1024).next_power_of_two();
        let caps = [cfg.anon_cap.unwrap_or(usize::MAX) / n, cfg.file_cap.unwrap_or(usize::MAX) / n];
        let shards =
            (0..n).map(|_| Mutex::new(Shard::new(cfg.allocator.build(), cfg.budget / n, caps))).collect();
        let pools = (0..MAX_POOLS)
            .map(|_| PoolSlot {
                state: AtomicU64::new(0),
                max_pages: AtomicUsize::new(0),
                pages: AtomicUsize::new(0),
            })
            .collect();
        Store { budget: AtomicUsize::new(cfg.budget), shard_mask: n - 1, shards, pools, tier, cfg }
    }

    /// The configuration the store was made with (budget as created).
    pub fn config(&self) -> &StoreConfig {
        &self.cfg
    }

    /// Number of shards.
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// Creates a pool; returns its id.
    pub fn create_pool(&self, opts: PoolOptions) -> Result<PoolId, StoreError> {
        let kind = match opts.kind {
            PoolKind::Ephemeral => POOL_EPHEMERAL,
            PoolKind::Persistent => POOL_PERSISTENT,
        } | if opts.store_raw { POOL_RAW } else { 0 };
        for (i, p) in self.pools.iter().enumerate() {
            let cur = p.state.load(Ordering::Acquire);
            if cur & 3 == POOL_FREE {
                p.max_pages.store(opts.max_pages.unwrap_or(usize::MAX), Ordering::Relaxed);
                p.pages.store(0, Ordering::Relaxed);
                let new = ((cur >> 8) + 1) << 8 | kind;
                if p.state.compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    return Ok(i as PoolId);
                }
            }
        }
        Err(StoreError::TooManyPools)
    }

    fn pool_state(&self, pool: u32) -> Result<u64, StoreError> {
        let p = self.pools.get(pool as usize).ok_or(StoreError::NoSuchPool(pool))?;
        let s = p.state.load(Ordering::Acquire);
        match s & 3 {
            POOL_EPHEMERAL | POOL_PERSISTENT => Ok(s),
            _ => Err(StoreError::NoSuchPool(pool)),
        }
    }

    /// Destroys a pool and everything in it (RAM and next tier); returns
    /// the number of pages removed.
    pub fn destroy_pool(&self, pool: PoolId) -> Result<usize, StoreError> {
        let s = self.pool_state(pool)?;
        let slot = &self.pools[pool as usize];
        if slot
            .state
            .compare_exchange(s, (s & !0xff) | POOL_DYING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(StoreError::NoSuchPool(pool));
        }
        let mut n = 0;
        for sh in self.shards.iter() {
            let mut g = sh.lock();
            n += self.remove_where(&mut g, |e| e.pool == pool);
            if let Some(c) = g.c.pools.get_mut(pool as usize) {
                *c = PoolCounters::default();
            }
        }
        if let Some(t) = &self.tier {
            n += t.remove_pool(pool);
        }
        slot.state.store(s & !0xff, Ordering::Release);
        Ok(n)
    }

    fn remove_where(&self, g: &mut Shard, f: impl Fn(&Entry) -> bool) -> usize {
        let doomed: Vec<u32> = g.table.iter().copied().filter(|&s| f(&g.slab[s as usize])).collect();
        for &s in &doomed {
            g.remove(s, &self.pools);
        }
        g.c.flushed += doomed.len() as u64;
        doomed.len()
    }

    fn shard(&self, h: u64) -> &Mutex<Shard> {
        &self.shards[(h >> 48) as usize & self.shard_mask]
    }

    /// Stores `page` (4096 bytes) under `key`, replacing any older copy.
    pub fn put(&self, key: Key, page: &[u8], flags: PutFlags) -> Result<(), StoreError> {
        self.put_timed(key, page, flags).0
    }

    /// [`Store::put`], and the nanoseconds it spent pushing older entries
    /// to the next tier to make room (0 without a tier, or when the page
    /// fitted).
    pub fn put_timed(&self, key: Key, page: &[u8], flags: PutFlags) -> (Result<(), StoreError>, u64) {
        if page.len() != PAGE_SIZE {
            return (Err(StoreError::PageSize(page.len())), 0);
        }
        let state = match self.pool_state(key.pool) {
            Ok(s) => s,
            Err(e) => return (Err(e), 0),
        };
        let mut scratch = Scratch::take();
        let buf = &mut scratch.0[..PAGE_SIZE];
        let enc = with_encoder(self.cfg.codec, self.cfg.raw_fraction, |e| e.encode(page, buf))
            .expect("a 4096-byte page always encodes (raw fallback)");
        let (tag, loc) = match enc.form {
            Form::Zero => (TAG_ZERO, 0),
            Form::Same(p) => (TAG_SAME, p),
            Form::Raw => (TAG_RAW, 0),
            Form::Compressed(c) => (c as u8, 0),
        };
        let data = &buf[..enc.len];
        let crc = crc32c::crc32c(data);
        let h = hash_key(&key);
        let mut g = self.shard(h).lock();
        let before = g.c.tier_put_ns;
        let r = self.put_locked(&mut g, h, key, state, (tag, loc, crc), data, flags);
        (r, g.c.tier_put_ns - before)
    }

    /// The part of [`Store::put_timed`] under the shard's lock: `form` is
    /// the encoded page's tag, location (a same-filled page's pattern)
    /// and crc32c; `data` its bytes.
    #[allow(clippy::too_many_arguments)]
    fn put_locked(
        &self,
        g: &mut Shard,
        h: u64,
        key: Key,
        state: u64,
        form: (u8, u64, u32),
        data: &[u8],
        flags: PutFlags,
    ) -> Result<(), StoreError> {
        let (tag, loc, crc) = form;
        let tier = self.tier.as_deref();
        // Any older copy goes first, whatever happens to this put.
        if let Some(s) = g.find(h, &key) {
            g.remove(s, &self.pools);
        }
        if let Some(t) = tier {
            let t0 = Instant::now();
            t.remove(key);
            g.c.tier_put_ns += t0.elapsed().as_nanos() as u64;
        }
        let pool = &self.pools[key.pool as usize];
        if pool.state.load(Ordering::Acquire) != state {
            return Err(StoreError::NoSuchPool(key.pool));
        }
        let refuse = |g: &mut Shard, r: Refusal| {
            g.c.rejects[r as usize] += 1;
            Err(StoreError::Refused(r))
        };
        // No room in RAM and nothing left to push out (the shard is empty,
        // its share below what its tables take): a page the next tier
        // would keep (persistent or dirty) goes there itself, as it would
        // have as the oldest entry a moment later. Only a store without a
        // tier, or whose tier fails, refuses for its budget.
        let no_room = |g: &mut Shard| {
            pool.pages.fetch_sub(1, Ordering::AcqRel);
            let keep = state & 3 == POOL_PERSISTENT || flags.dirty;
            if let (true, Some(t)) = (keep, tier) {
                let file = if flags.kind == PageKind::File { F_FILE } else { 0 };
                let meta = SpillMeta {
                    tag,
                    flags: if flags.dirty { F_DIRTY } else { 0 } | file,
                    len: data.len() as u16,
                    crc,
                    pattern: if tag == TAG_SAME { loc } else { 0 },
                };
                let t0 = Instant::now();
                let r = t.put(key, meta, data);
                g.c.tier_put_ns += t0.elapsed().as_nanos() as u64;
                match r {
                    Ok(()) => {
                        g.c.put_to_tier += 1;
                        g.c.puts += 1;
                        g.c.pool(key.pool).puts += 1;
                        return Ok(());
                    }
                    Err(_) => g.c.tier_errors += 1,
                }
            }
            refuse(g, Refusal::Budget)
        };
        if tag == TAG_RAW && state & POOL_RAW == 0 {
            return refuse(g, Refusal::PoorCompression);
        }
        if pool.pages.fetch_add(1, Ordering::AcqRel) >= pool.max_pages.load(Ordering::Relaxed) {
            pool.pages.fetch_sub(1, Ordering::AcqRel);
            return refuse(g, Refusal::PoolLimit);
        }
        let kind = usize::from(flags.kind == PageKind::File);
        while g.c.kind_bytes[kind] + data.len() > g.caps[kind] {
            if let Evict::Nothing = g.evict(Some(kind), &self.pools, tier) {
                pool.pages.fetch_sub(1, Ordering::AcqRel);
                return refuse(g, Refusal::KindCap);
            }
        }
        // A slot and a table entry, growing only if the growth fits.
        while g.free == NIL && g.slab.len() == g.slab.capacity() {
            let extra = (g.slab.len() / 8).max(16);
            let grown = g.memory() + extra * std::mem::size_of::<Entry>();
            if grown <= g.budget {
                g.slab.reserve_exact(extra);
            } else if let Evict::Nothing = g.evict(None, &self.pools, tier) {
                return no_room(g);
            }
        }
        while g.table.len() == g.table.capacity() {
            let grown = g.memory() + g.table.allocation_size().max(64) + 64;
            if grown <= g.budget {
                g.table.reserve(1, |&s| hash_key(&g.slab[s as usize].key()));
            } else if let Evict::Nothing = g.evict(None, &self.pools, tier) {
                return no_room(g);
            }
        }
        let slot = if g.free != NIL {
            let s = g.free;
            g.free = g.slab[s as usize].next;
            s
        } else {
            g.slab.push(Entry {
                object: 0,
                loc: 0,
                pool: 0,
                index: 0,
                crc: 0,
                prev: NIL,
                next: NIL,
                seq: 0,
                len: 0,
                tag: 0,
                flags: 0,
            });
            (g.slab.len() - 1) as u32
        };
        let mut loc = loc;
        if !data.is_empty() {
            let mut compacted = false;
            loop {
                let limit = g.budget.saturating_sub(g.meta_bytes());
                let slab = &mut g.slab;
                if let Some(l) =
                    g.alloc.alloc(data, slot as u64, limit, &mut |m| slab[m.owner as usize].loc = m.to.0)
                {
                    loc = l.0;
                    break;
                }
                if !compacted && g.maybe_compact() {
                    compacted = true;
                    continue;
                }
                if let Evict::Nothing = g.evict(None, &self.pools, tier) {
                    g.slab[slot as usize].next = g.free;
                    g.free = slot;
                    return no_room(g);
                }
            }
        }
        let persistent = state & 3 == POOL_PERSISTENT;
        let pinned = persistent && tier.is_none();
        let mut fl = if flags.dirty { F_DIRTY } else { 0 };
        if kind == 1 {
            fl |= F_FILE;
        }
        if pinned {
            fl |= F_PINNED;
        }
        g.slab[slot as usize] = Entry {
            object: key.object,
            loc,
            pool: key.pool,
            index: key.index,
            crc,
            prev: NIL,
            next: NIL,
            seq: 0,
            len: data.len() as u16,
            tag,
            flags: fl,
        };
        let slab = &g.slab;
        g.table.insert_unique(h, slot, |&s| hash_key(&slab[s as usize].key()));
        if !pinned {
            g.link(slot);
        }
        let c = &mut g.c;
        c.pages += 1;
        c.compressed += data.len() as u64;
        c.kind_pages[kind] += 1;
        c.kind_bytes[kind] += data.len();
        match tag {
            TAG_ZERO => c.zero += 1,
            TAG_SAME => c.same += 1,
            TAG_RAW => c.raw += 1,
            _ => {}
        }
        if flags.dirty {
            c.dirty += 1;
        }
        c.puts += 1;
        c.pool(key.pool).puts += 1;
        // An allocator's own metadata may grow by a little beyond its
        // limit; whatever the cause, the shard ends within its share.
        while g.memory() > g.budget {
            if let Evict::Nothing = g.evict(None, &self.pools, tier) {
                if let Some(s) = g.find(h, &key) {
                    g.remove(s, &self.pools);
                    g.c.puts -= 1;
                    g.c.pool(key.pool).puts -= 1;
                    return refuse(g, Refusal::Budget);
                }
                break;
            }
        }
        Ok(())
    }

    /// Reads the page under `key` into `out` (4096 bytes). Returns
    /// `Ok(false)` on a miss. `exclusive` removes the entry once it has
    /// been read, verified and decoded (frontswap's exclusive gets); an
    /// error leaves the entry where it was.
    ///
    /// A page held in RAM is checked and decoded under its shard's lock,
    /// straight from the allocator's memory where the allocator keeps it
    /// in one piece (cells, classes) — no copy of the compressed bytes;
    /// chunks are gathered into a scratch buffer first. (The copy and the
    /// lookup were a third of the fault handler's time in `ztier run`.)
    pub fn get(&self, key: Key, out: &mut [u8], exclusive: bool) -> Result<bool, StoreError> {
        if out.len() != PAGE_SIZE {
            return Err(StoreError::PageSize(out.len()));
        }
        self.pool_state(key.pool)?;
        let h = hash_key(&key);
        let mut scratch = Scratch::take();
        let buf = &mut scratch.0[..PAGE_SIZE];
        let (tag, len, pattern) = {
            let mut g = self.shard(h).lock();
            let g = &mut *g;
            g.c.gets += 1;
            match g.find(h, &key) {
                Some(s) => {
                    self.take_entry(g, s, key, out, buf, exclusive)?;
                    return Ok(true);
                }
                None => {
                    let mut v = Vec::new();
                    let got = match &self.tier {
                        Some(t) => t.get(key, &mut v, exclusive).inspect_err(|_| g.c.tier_errors += 1)?,
                        None => None,
                    };
                    let Some(m) = got else {
                        g.c.misses += 1;
                        g.c.pool(key.pool).misses += 1;
                        return Ok(false);
                    };
                    let computed = crc32c::crc32c(&v);
                    if computed != m.crc || v.len() != m.len as usize {
                        g.c.checksum_errors += 1;
                        if exclusive {
                            // Put it back: a failed get must not lose it.
                            if let Some(t) = &self.tier {
                                let _ = t.put(key, m, &v);
                            }
                        }
                        return Err(StoreError::Checksum { key, stored: m.crc, computed });
                    }
                    g.c.tier_hits += 1;
                    g.c.pool(key.pool).hits += 1;
                    buf[..v.len()].copy_from_slice(&v);
                    (m.tag, v.len(), m.pattern)
                }
            }
        };
        // From the next tier: decoded without the lock.
        let form = self.form_of(tag, pattern, key)?;
        with_encoder(self.form_codec(form), self.cfg.raw_fraction, |e| e.decode(form, &buf[..len], out))
            .map_err(|err| StoreError::Decode { key, err })?;
        Ok(true)
    }

    /// Reads the `n` pages under `first`'s object at indices `first.index
    /// ..first.index + n` into `out` (`n` × 4096 bytes), as `n` calls of
    /// [`Store::get`] would, and returns how many were found before the
    /// first miss (the pages after a miss are not read). An error leaves
    /// the failing page and those after it in the store.
    ///
    /// Faster for a run: neighbouring indices share a shard (see
    /// `hash_key`), so each shard's lock is taken once per 16 indices,
    /// and every entry of that part is looked up and its compressed bytes
    /// touched before the first is decoded, so their cache misses overlap.
    /// Measured in `ztier run` per page got one by one: 0.39 µs taking the
    /// lock, 0.30 looking up, 0.52 checking the crc (mostly the misses of
    /// the compressed bytes), 0.72 decoding, 0.14 removing.
    pub fn get_run(
        &self,
        first: Key,
        n: usize,
        out: &mut [u8],
        exclusive: bool,
    ) -> Result<usize, StoreError> {
        if out.len() != n * PAGE_SIZE {
            return Err(StoreError::PageSize(out.len()));
        }
        let key = |k: usize| Key { index: first.index.wrapping_add(k as u32), ..first };
        let mut k = 0;
        while k < n {
            // The part of the run in this key's group of 16 (one shard).
            let end = n.min(k + 16 - (key(k).index & 15) as usize);
            let found = self.get_group(&key, k, end, out, exclusive)?;
            if found < end {
                // A miss, or a page in the next tier: the slow path from
                // there on, one page at a time.
                let mut at = found;
                while at < end {
                    if !self.get(key(at), &mut out[at * PAGE_SIZE..(at + 1) * PAGE_SIZE], exclusive)? {
                        return Ok(at);
                    }
                    at += 1;
                }
            }
            k = end;
        }
        Ok(n)
    }

    /// Pages `k..end` of a run, all in one shard, from RAM: returns the
    /// index of the first one not in RAM (`end` if all were).
    fn get_group(
        &self,
        key: &dyn Fn(usize) -> Key,
        k: usize,
        end: usize,
        out: &mut [u8],
        exclusive: bool,
    ) -> Result<usize, StoreError> {
        self.pool_state(key(k).pool)?;
        let mut g = self.shard(hash_key(&key(k))).lock();
        let g = &mut *g;
        let mut slots = [NIL; 16];
        let mut have = k;
        let mut touched = 0u8;
        // In steps, each over all the pages: the lookups (each misses on
        // its entry in the slab), then where each page's bytes are (the
        // allocator's slab of them), then the bytes, one load per cache
        // line. Each step's misses wait for the step before, but no
        // page's wait for another page's, so the pages' misses overlap.
        // (Page by page, one page's long touching loop kept the next
        // page's lookup from starting: `examples/get_run.rs` took 2.0 µs
        // a page against 1.8 in steps.)
        for at in k..end {
            let Some(s) = g.find(hash_key(&key(at)), &key(at)) else { break };
            slots[at - k] = s;
            have = at + 1;
        }
        let mut bytes: [&[u8]; 16] = [&[]; 16];
        for (b, &s) in bytes.iter_mut().zip(&slots[..have - k]) {
            let e = g.slab[s as usize];
            if e.in_allocator() {
                *b = g.alloc.bytes(Loc(e.loc), e.len as usize).unwrap_or(&[]);
            }
        }
        for d in &bytes[..have - k] {
            touched ^= d.iter().step_by(64).fold(0, |a, &b| a ^ b);
        }
        std::hint::black_box(touched);
        let mut scratch = Scratch::take();
        for at in k..have {
            g.c.gets += 1;
            let page = &mut out[at * PAGE_SIZE..(at + 1) * PAGE_SIZE];
            self.take_entry(g, slots[at - k], key(at), page, &mut scratch.0[..PAGE_SIZE], exclusive)?;
        }
        Ok(have)
    }

    /// Checks and decodes the entry in `slot` of shard `g` (found under
    /// `key`) into `out`, from the allocator's memory in place or
    /// gathered into `buf`; then counts the hit and removes the entry
    /// (`exclusive`) or refreshes its age (LRU). On an error the entry
    /// stays.
    #[inline]
    fn take_entry(
        &self,
        g: &mut Shard,
        slot: u32,
        key: Key,
        out: &mut [u8],
        buf: &mut [u8],
        exclusive: bool,
    ) -> Result<(), StoreError> {
        let e = g.slab[slot as usize];
        let form = self.form_of(e.tag, e.loc, key)?;
        let len = e.len as usize;
        let data: &[u8] = if !e.in_allocator() {
            &[]
        } else if let Some(d) = g.alloc.bytes(Loc(e.loc), len) {
            d
        } else {
            g.alloc.read(Loc(e.loc), len, buf);
            &buf[..len]
        };
        let computed = crc32c::crc32c(data);
        if computed != e.crc {
            g.c.checksum_errors += 1;
            return Err(StoreError::Checksum { key, stored: e.crc, computed });
        }
        with_encoder(self.form_codec(form), self.cfg.raw_fraction, |enc| enc.decode(form, data, out))
            .map_err(|err| StoreError::Decode { key, err })?;
        g.c.hits += 1;
        g.c.pool(key.pool).hits += 1;
        if exclusive {
            g.remove(slot, &self.pools);
        } else if self.cfg.order == Order::Lru && e.flags & F_PINNED == 0 {
            g.unlink(slot);
            g.link(slot);
        }
        Ok(())
    }

    /// The form of a stored page from its tag (and, for a repeated
    /// pattern, the pattern kept in place of a location).
    fn form_of(&self, tag: u8, pattern: u64, key: Key) -> Result<Form, StoreError> {
        Ok(match tag {
            TAG_ZERO => Form::Zero,
            TAG_SAME => Form::Same(pattern),
            TAG_RAW => Form::Raw,
            t => Form::Compressed(CodecId::try_from(t).map_err(|_| StoreError::Decode {
                key,
                err: DecompressError::WrongFormat { expected: CodecId::Lz4 as u8, found: t },
            })?),
        })
    }

    /// The codec whose encoder decodes `form`.
    fn form_codec(&self, form: Form) -> CodecId {
        match form {
            Form::Compressed(c) => c,
            _ => self.cfg.codec,
        }
    }

    /// Whether `key` is held in RAM (not counting the next tier).
    pub fn contains(&self, key: Key) -> bool {
        let h = hash_key(&key);
        self.shard(h).lock().find(h, &key).is_some()
    }

    /// Whether `key` is held in RAM or by the next tier
    /// ([`NextTier::contains`]): a get would find it. `ztier run` asks it
    /// of a clean page it evicts, whose copy may have gone on to the next
    /// tier since the page came back (a get that keeps the copy leaves it
    /// there): the copy is still the page's, so it need not be
    /// compressed and put again.
    pub fn holds(&self, key: Key) -> bool {
        let h = hash_key(&key);
        let g = self.shard(h).lock();
        // The tier is asked under the shard's lock, as every call of it
        // about this key is made.
        g.find(h, &key).is_some() || self.tier.as_ref().is_some_and(|t| t.contains(key))
    }

    /// Entries held by the next tier (0 without one).
    pub fn tier_entries(&self) -> usize {
        self.tier.as_ref().map_or(0, |t| t.entries())
    }

    /// Before `fork`: takes every shard's lock and keeps it, so that no
    /// store operation is half done in the memory the child gets a copy
    /// of. [`Store::unlock_after_fork`] lets them go, in the parent and in
    /// the child. (The next tier is only called under a shard's lock, so
    /// its own lock is free too.)
    ///
    /// Another thread waiting for a shard's lock meanwhile is harmless to
    /// the child (the lock's word only says that someone waits:
    /// [`crate::lock`]), but it would go on only after the fork; `ztier
    /// run` keeps other users out first (every store call but its
    /// evictor's is made under the manager's lock, which its fork
    /// preparation holds, after waiting for the evictor's batch).
    pub fn lock_for_fork(&self) {
        for sh in self.shards.iter() {
            std::mem::forget(sh.lock());
        }
    }

    /// After `fork`, in the parent or the child: lets go of the locks
    /// [`Store::lock_for_fork`] took.
    ///
    /// # Safety
    ///
    /// Only once after [`Store::lock_for_fork`], by the thread that
    /// called it (in the child: the thread that forked), while it still
    /// holds every shard's lock.
    pub unsafe fn unlock_after_fork(&self) {
        for sh in self.shards.iter() {
            // SAFETY: the caller holds this lock (taken and its guard
            // forgotten in `lock_for_fork`), as the contract says.
            unsafe { sh.force_unlock() };
        }
    }

    /// Before `fork`, with every other user of the store kept out (as for
    /// [`Store::lock_for_fork`]): readies a copy of the next tier's
    /// entries for the child ([`NextTier::prepare_fork`]). Returns whether
    /// the child will keep them (also when there is no tier); if not, the
    /// caller must take them back before forking.
    pub fn prepare_fork_tier(&self) -> Result<bool, StoreError> {
        match &self.tier {
            Some(t) => t.prepare_fork().map_err(StoreError::from),
            None => Ok(true),
        }
    }

    /// In the parent after `fork` (or a failed one): lets go of what
    /// [`Store::prepare_fork_tier`] readied.
    pub fn tier_parent_after_fork(&self) {
        if let Some(t) = &self.tier {
            t.parent_after_fork();
        }
    }

    /// In a forked child, whose store is a copy of its parent's: the
    /// entries in RAM are the child's own already; the next tier is made
    /// the child's own too ([`NextTier::after_fork`]), with the entries
    /// [`Store::prepare_fork_tier`] readied for it.
    pub fn after_fork(&self) -> Result<(), StoreError> {
        match &self.tier {
            Some(t) => t.after_fork().map_err(StoreError::from),
            None => Ok(()),
        }
    }

    /// Marks the entry under `key` clean (its content now exists
    /// elsewhere). Returns whether the entry was found.
    pub fn set_clean(&self, key: Key) -> bool {
        let h = hash_key(&key);
        let mut g = self.shard(h).lock();
        match g.find(h, &key) {
            Some(s) => {
                if g.slab[s as usize].flags & F_DIRTY != 0 {
                    g.slab[s as usize].flags &= !F_DIRTY;
                    g.c.dirty -= 1;
                }
                true
            }
            None => false,
        }
    }

    /// Removes the page under `key` (RAM and next tier). Returns whether
    /// there was one.
    pub fn flush_page(&self, key: Key) -> Result<bool, StoreError> {
        self.pool_state(key.pool)?;
        let h = hash_key(&key);
        let mut g = self.shard(h).lock();
        let mut found = false;
        if let Some(s) = g.find(h, &key) {
            g.remove(s, &self.pools);
            found = true;
        }
        if let Some(t) = &self.tier {
            found |= t.remove(key);
        }
        if found {
            g.c.flushed += 1;
        }
        Ok(found)
    }

    /// Removes every page of `object` in `pool`; returns how many.
    pub fn flush_object(&self, pool: PoolId, object: u64) -> Result<usize, StoreError> {
        self.pool_state(pool)?;
        let mut n = 0;
        for sh in self.shards.iter() {
            let mut g = sh.lock();
            n += self.remove_where(&mut g, |e| e.pool == pool && e.object == object);
        }
        if let Some(t) = &self.tier {
            n += t.remove_object(pool, object);
        }
        Ok(n)
    }

    /// Has the store a next tier (its oldest pages can leave it)?
    pub fn has_tier(&self) -> bool {
        self.tier.is_some()
    }

    /// Why the next tier's latest put failed ([`NextTier::last_error`]);
    /// `None` with no next tier or no failure.
    pub fn tier_error(&self) -> Option<String> {
        self.tier.as_ref().and_then(|t| t.last_error())
    }

    /// The current budget in bytes.
    pub fn budget(&self) -> usize {
        self.budget.load(Ordering::Relaxed)
    }

    /// Changes the budget. Shrinking compacts first, then evicts oldest
    /// entries. Returns false if pinned entries (persistent pools without
    /// a next tier) keep some shard above its new share.
    pub fn set_budget(&self, bytes: usize) -> bool {
        self.budget.store(bytes, Ordering::Relaxed);
        let n = self.shards.len();
        let mut ok = true;
        for sh in self.shards.iter() {
            let mut g = sh.lock();
            g.budget = bytes / n;
            ok &= g.shrink_to_budget(&self.pools, self.tier.as_deref());
        }
        ok
    }

    /// Compacts every shard; returns the bytes released.
    pub fn compact(&self) -> usize {
        self.shards.iter().map(|s| s.lock().compact()).sum()
    }

    /// Memory used by the store: allocators and metadata, all shards.
    pub fn memory_used(&self) -> usize {
        self.shards.iter().map(|s| s.lock().memory()).sum()
    }

    /// (memory used, budget) of every shard.
    #[doc(hidden)]
    pub fn shard_memory(&self) -> Vec<(usize, usize)> {
        self.shards
            .iter()
            .map(|s| {
                let g = s.lock();
                (g.memory(), g.budget)
            })
            .collect()
    }

    /// Flips a stored byte of the entry under `key` (corruption tests).
    #[doc(hidden)]
    pub fn corrupt(&self, key: Key, byte: usize) -> bool {
        let h = hash_key(&key);
        let mut g = self.shard(h).lock();
        match g.find(h, &key) {
            Some(s) if g.slab[s as usize].len > 0 => {
                let e = g.slab[s as usize];
                g.alloc.corrupt(Loc(e.loc), byte % e.len as usize);
                true
            }
            _ => false,
        }
    }

    /// A snapshot of the statistics.
    pub fn stats(&self) -> Stats {
        let mut s = Stats { budget: self.budget() as u64, ..Stats::default() };
        let mut pools: Vec<PoolCounters> = Vec::new();
        for sh in self.shards.iter() {
            let g = sh.lock();
            let c = &g.c;
            s.pages += c.pages;
            s.compressed_bytes += c.compressed;
            s.memory_used += g.memory() as u64;
            s.metadata_bytes += (g.meta_bytes() + g.alloc.metadata_bytes()) as u64;
            s.allocator_metadata_bytes += g.alloc.metadata_bytes() as u64;
            s.fragmentation_bytes += g.waste() as u64;
            s.zero_pages += c.zero;
            s.same_pages += c.same;
            s.raw_pages += c.raw;
            s.anon_pages += c.kind_pages[0];
            s.file_pages += c.kind_pages[1];
            s.dirty_pages += c.dirty;
            s.puts += c.puts;
            s.gets += c.gets;
            s.hits += c.hits;
            s.tier_hits += c.tier_hits;
            s.misses += c.misses;
            s.flushed += c.flushed;
            s.compactions += c.compactions;
            s.compaction_ns += c.compaction_ns;
            s.compaction_moves += c.compaction_moves;
            s.evicted_to_tier += c.evicted_to_tier;
            s.put_to_tier += c.put_to_tier;
            s.tier_put_ns += c.tier_put_ns;
            s.evicted_dropped += c.evicted_dropped;
            s.rejects.poor_compression += c.rejects[Refusal::PoorCompression as usize];
            s.rejects.budget += c.rejects[Refusal::Budget as usize];
            s.rejects.pool_limit += c.rejects[Refusal::PoolLimit as usize];
            s.rejects.kind_cap += c.rejects[Refusal::KindCap as usize];
            s.checksum_errors += c.checksum_errors;
            s.tier_errors += c.tier_errors;
            if pools.len() < c.pools.len() {
                pools.resize(c.pools.len(), PoolCounters::default());
            }
            for (a, b) in pools.iter_mut().zip(&c.pools) {
                a.puts += b.puts;
                a.hits += b.hits;
                a.misses += b.misses;
            }
        }
        s.orig_bytes = s.pages * PAGE_SIZE as u64;
        if let Some(t) = &self.tier {
            s.tier_entries = t.entries() as u64;
            s.tier_bytes = t.bytes_used();
        }
        for (i, p) in self.pools.iter().enumerate() {
            let st = p.state.load(Ordering::Acquire) & 3;
            if st == POOL_EPHEMERAL || st == POOL_PERSISTENT {
                let c = pools.get(i).cloned().unwrap_or_default();
                s.pools.push(PoolStats {
                    id: i as u32,
                    kind: Some(if st == POOL_EPHEMERAL { PoolKind::Ephemeral } else { PoolKind::Persistent }),
                    pages: p.pages.load(Ordering::Relaxed) as u64,
                    puts: c.puts,
                    hits: c.hits,
                    misses: c.misses,
                });
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbouring_indices_share_a_shard_and_a_bucket_run_with_distinct_tags() {
        for (pool, object) in [(0u32, 0u64), (3, 0), (1, 77)] {
            for group in [0u32, 1, 4096, 1 << 27] {
                let hs: Vec<u64> =
                    (0..16).map(|lo| hash_key(&Key { pool, object, index: group * 16 + lo })).collect();
                let tags: std::collections::HashSet<u64> = hs.iter().map(|h| h >> 57).collect();
                assert_eq!(tags.len(), 16, "tags of group {group} of ({pool}, {object})");
                for (lo, h) in hs.iter().enumerate() {
                    assert_eq!(h & 0xF, (hs[0] + lo as u64) & 0xF, "16 positions of one block");
                    assert_eq!(h & !(0xF | (0x7F << 57)), hs[0] & !(0xF | (0x7F << 57)), "one run");
                }
            }
        }
        // Groups, objects and pools spread over shards (bits 48..) and runs.
        let mut shards = std::collections::HashSet::new();
        let mut runs = std::collections::HashSet::new();
        for g in 0..4096u32 {
            let h = hash_key(&Key { pool: 1, object: 0, index: g * 16 });
            shards.insert((h >> 48) & 63);
            runs.insert(h & 0x00FF_FFFF_FFFF_FFF0);
        }
        assert_eq!(shards.len(), 64, "every shard of 64 gets groups");
        assert_eq!(runs.len(), 4096, "every group its own run");
        // Keys that differ only in their object use all 16 low positions.
        let low: std::collections::HashSet<u64> =
            (0..256u64).map(|o| hash_key(&Key { pool: 1, object: o, index: 0 }) & 0xF).collect();
        assert_eq!(low.len(), 16);
        let a = hash_key(&Key { pool: 1, object: 0, index: 5 });
        assert_ne!(a, hash_key(&Key { pool: 2, object: 0, index: 5 }));
        assert_ne!(a, hash_key(&Key { pool: 1, object: 1, index: 5 }));
    }
}
