//! The compressed block engine (ZBD, Klonatos et al. 2012, §2): logical
//! blocks compressed one by one, packed into fixed-size extents, written
//! out of place; a logical-to-physical table kept whole in RAM and
//! persisted by checkpoints; a cleaner; recovery by replaying the extents
//! written since the last checkpoint. The on-disk format is drawn in
//! [`crate::format`].
//!
//! # Writes
//!
//! A block is compressed outside any lock. Zero and same-filled blocks
//! become metadata: one range record for each run of neighbouring blocks
//! of one request filled alike. A block that does not shrink below 7/8 is
//! stored raw in a *raw extent* (blocks only, no header: incompressible
//! data costs its size plus a 32-byte record in a log extent). Compressed
//! blocks go into one of [`OPEN_EXTENTS`] log extent buffers in RAM — the
//! one whose free space fits it most tightly (ZBD's buckets by free
//! space). A log buffer is sealed (its header and crc written, the extent
//! written with one `pwrite`) when it is full, when it is older than the
//! aging timeout ([`Engine::seal_aged`]), and on every FLUSH; a raw
//! extent's new blocks are written at the same points, and it closes when
//! full. TRIM and WRITE_ZEROES are single range records: metadata only.
//!
//! # Durability and recovery
//!
//! FLUSH (and FUA) seals every log buffer and writes every raw block, then
//! `fdatasync`s the image: every write acknowledged before it is then in a
//! synced extent. Recovery takes the valid superblock with the highest
//! generation, loads its table, reads the header of every extent, and
//! replays — record by record, highest write counter wins — the log
//! extents opened after that checkpoint whose header crc holds, skipping
//! data records whose data crc fails (torn, and so never flushed). Work is
//! bounded by the extents written since the checkpoint, which is taken
//! after every `max(1024, extents / 8)` sealed extents and at close: by
//! the FLUSH that finds one due, or — with
//! [`Engine::set_background_checkpoints`], which the engine's
//! `Device::maintain` sets as a server runs — by the server's maintenance
//! thread, so no FLUSH waits for one.
//!
//! # Reads
//!
//! A read of whole blocks looks their locations up in one lock hold,
//! sorts the blocks stored in sealed extents by their place in the image
//! (sequential writes spread a run of blocks over the few extents open at
//! the time, in any order) and reads them in spans of up to 1 MiB, one
//! `pread` each, with holes of at most 8 KiB inside a span (a neighbouring
//! extent's header and records, not another extent's blocks); then it
//! checks and decodes each block from its span. A file image is mapped
//! read-only and a span is checked and decoded in place from the mapping
//! (no `pread` copy); the mapping's bus errors do not kill the process
//! ([`crate::backing::Mapped`]): a span that took one is read again with
//! `pread`, which reports the error as EIO, and the mapping is not used
//! again.
//!
//! # Checkpoints
//!
//! A checkpoint is incremental: each checkpoint area remembers which of
//! its 4 KiB table pages changed since it was last written, and only those
//! are written. The first one after an open too: the area not in use at
//! open may miss pages the other has, so the first checkpoint that writes
//! it reads it a stretch at a time (outside the lock) and also writes the
//! unmarked pages that differ from the table or do not load as its
//! generation's (torn, never written) — the open itself reads only the
//! area in use, and a close with nothing changed writes nothing. `create`
//! writes both areas, so a new image's first checkpoint is incremental as
//! well. It runs beside writes: under the state lock it closes the
//! log buffers (the cut: extents opened later have seq ≥ the checkpoint's
//! `next_seq` and are replayed on top of it), then copies the changed
//! pages a few at a time, each copy under the lock for a moment. A page
//! copied later may already hold writes made after the cut; the
//! checkpoint therefore writes out every buffer once more before it syncs,
//! so whatever its pages point to is durable, and replaying those writes
//! again at recovery changes nothing. Then the pages are written to the
//! area not in use, synced, and the superblock slot not in use (the next
//! generation, the seq of the next extent to open, the write counter) is
//! written and synced.
//!
//! # Space
//!
//! Freed extents are reused only after a checkpoint no longer refers to
//! them, and only extents sealed before the last checkpoint are cleaned
//! (their trim and zero records are in that checkpoint, so only their live
//! data records move). The cleaner starts when free extents fall below
//! the low mark (1/16 of extents), stops above the high mark (1/8),
//! scans a window of 2 MiB of extents at a time, picks the ones under 3/4
//! live, and packs their live blocks first-fit decreasing by runs of
//! neighbouring logical blocks (neighbours stay together). Writes that find
//! no free extent clean inline; when cleaning frees nothing they fail with
//! ENOSPC and change nothing.
//!
//! # Presented size (ZBD §5.3)
//!
//! The logical size is what `create --size` says. An image is
//! *provisioned* when its extents can hold every logical block raw plus
//! the cleaner's reserve: then no write can fail with ENOSPC, and block
//! status reports written blocks as allocated. A smaller `--physical`
//! makes a thin image: compression is what makes the logical size fit,
//! writes can fail with ENOSPC, and block status reports every block as a
//! hole (a write anywhere may need space).

use std::collections::BTreeSet;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::crc;
use crc32c::crc32c;
use parking_lot::{Mutex, RwLock};
use serde::Serialize;
use ztier_codec::page::{Form, PageEncoder};
use ztier_codec::CodecId;

use crate::backing::Backing;
use crate::format::{
    self, Kind, Loc, Record, Superblock, CKPT_PAGE, ENTRIES_PER_PAGE, EXT_HEADER, RECORD, SAME, SB_SIZE,
    UNMAPPED, ZERO,
};

/// Log extent buffers open at once.
pub const OPEN_EXTENTS: usize = 4;
/// Free extents kept for the cleaner (user writes cannot take them).
pub const CLEANER_RESERVE: u32 = 8;
/// Writes at least this long are compressed on two threads.
pub const SPLIT_WRITE: usize = 256 << 10;
/// Bytes of extents the cleaner scans per step.
pub const CLEAN_WINDOW: u64 = 2 << 20;
/// Cleaning rounds a write that finds no room runs (or waits for, while
/// another thread cleans) before it fails with NoSpace, when each round
/// frees something but not enough for it.
const MAX_CLEAN_ROUNDS: u32 = 64;
/// Bytes of a span read ahead of the block being checked (see
/// [`crc::prefetch`]).
const PREFETCH: usize = 8 << 10;
/// Checkpoint pages copied per hold of the state lock.
const PAGES_PER_HOLD: usize = 32;
/// Checkpoint pages a checkpoint that compares an area with the table
/// reads at a time (1 MiB).
const VERIFY_PAGES: usize = 256;
/// The most bytes a read of whole blocks reads from the image at once
/// (blocks of neighbouring extents are read together, up to this).
const READ_SPAN: usize = 1 << 20;
/// The largest hole a span of a read reads over: an extent's header and
/// records and the space left free in it, not a whole extent of other
/// blocks.
const READ_GAP: u64 = 8 << 10;

/// Errors of the engine.
#[derive(Debug, thiserror::Error)]
pub enum BlkError {
    /// No physical space left (after cleaning).
    #[error("no space left in the image (ENOSPC)")]
    NoSpace,
    /// The request is outside the device.
    #[error("request beyond the end of the device")]
    OutOfRange,
    /// A stored block failed its checksum or did not decompress.
    #[error("block {lba}: stored data is damaged ({why})")]
    Corrupt {
        /// Logical block.
        lba: u64,
        /// What failed.
        why: String,
    },
    /// I/O on the image failed.
    #[error("image I/O: {0}")]
    Io(#[from] io::Error),
    /// The image is not usable.
    #[error("{0}")]
    BadImage(String),
    /// The operation would be slow (FAST_ZERO asked).
    #[error("not fast")]
    NotFast,
}

/// Geometry and options of a new image.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    /// Logical size in bytes (a multiple of the block size).
    pub logical_size: u64,
    /// Logical block size.
    pub block_size: u32,
    /// Extent size.
    pub extent_size: u32,
    /// Codec.
    pub codec: CodecId,
    /// Physical bytes for extents; `None` = provisioned (every block fits raw).
    pub physical: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ExtState {
    Free,
    Open,
    Sealed,
    PendingFree,
}

#[derive(Debug, Clone, Copy)]
struct ExtInfo {
    state: ExtState,
    /// Bytes of live data: compressed blocks with their records (log
    /// extents), whole blocks (raw extents).
    live: u32,
    seq: u64,
    raw: bool,
}

impl ExtInfo {
    const FREE: ExtInfo = ExtInfo { state: ExtState::Free, live: 0, seq: 0, raw: false };
}

struct OpenExt {
    idx: u32,
    seq: u64,
    buf: Vec<u8>,
    /// Records (log) or blocks (raw) in the buffer.
    count: u32,
    /// Log: where the data grows down to.
    data_start: usize,
    /// Raw: blocks already written to the image.
    written: u32,
    raw: bool,
    opened: Instant,
}

impl OpenExt {
    /// Free bytes of a log buffer.
    fn free(&self) -> usize {
        self.data_start - (EXT_HEADER + self.count as usize * RECORD)
    }
}

struct State {
    table: Vec<Loc>,
    /// Per checkpoint area, the table pages changed since it was written.
    dirty: [Vec<u64>; 2],
    /// Per checkpoint area, whether its pages not marked in `dirty` are
    /// still to be compared with the table (the area not in use at open,
    /// until the first checkpoint that writes it has gone through it).
    unverified: [bool; 2],
    ext: Vec<ExtInfo>,
    free: BTreeSet<u32>,
    pending_free: Vec<u32>,
    open: Vec<OpenExt>,
    next_seq: u64,
    next_wseq: u64,
    generation: u64,
    ckpt_next_seq: u64,
    sealed_since_ckpt: u32,
    clean_cursor: u32,
    high_water: u32,
    poisoned: Option<String>,
    block_size: u32,
}

fn set_bit(v: &mut [u64], i: usize) {
    v[i / 64] |= 1 << (i % 64);
}
fn take_bit(v: &mut [u64], i: usize) -> bool {
    let was = v[i / 64] & (1 << (i % 64)) != 0;
    v[i / 64] &= !(1 << (i % 64));
    was
}

impl State {
    /// Bytes a location takes in its extent's live count.
    fn cost(&self, l: &Loc) -> u32 {
        if l.len as u32 == self.block_size {
            l.len as u32
        } else {
            l.len as u32 + RECORD as u32
        }
    }

    fn set_loc(&mut self, lba: u64, loc: Loc) {
        let old = std::mem::replace(&mut self.table[lba as usize], loc);
        if old == loc {
            return;
        }
        if old.is_data() {
            let c = self.cost(&old);
            self.ext[old.extent as usize].live -= c;
        }
        if loc.is_data() {
            let c = self.cost(&loc);
            self.ext[loc.extent as usize].live += c;
        }
        let page = lba as usize / ENTRIES_PER_PAGE;
        set_bit(&mut self.dirty[0], page);
        set_bit(&mut self.dirty[1], page);
    }

    fn open_log_count(&self) -> usize {
        self.open.iter().filter(|o| !o.raw).count()
    }
}

/// Counters (monotonic) and gauges.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    /// Logical size, bytes.
    pub logical_size: u64,
    /// Block size.
    pub block_size: u32,
    /// Extent size.
    pub extent_size: u32,
    /// Codec.
    pub codec: String,
    /// Whether every block fits raw (see the module docs).
    pub provisioned: bool,
    /// Extents in the image.
    pub extents_total: u32,
    /// Extents free now.
    pub extents_free: u32,
    /// Extents holding data (sealed, open or awaiting a checkpoint).
    pub used_extents: u32,
    /// Of those, raw extents (whole blocks, no header).
    pub raw_extents: u32,
    /// Highest extent ever used + 1 (the image file's extent area).
    pub high_water_extents: u32,
    /// Blocks holding data.
    pub data_blocks: u64,
    /// Blocks written as zeros (metadata only).
    pub zero_blocks: u64,
    /// Blocks filled with a repeated 8-byte pattern (metadata only).
    pub same_blocks: u64,
    /// Logical bytes of the data blocks (zero, same-filled and unmapped
    /// blocks excluded).
    pub logical_bytes_mapped: u64,
    /// Bytes those blocks take in extents (data + records).
    pub data_stored_bytes: u64,
    /// Physical bytes of the image (superblocks, checkpoint areas, used extents).
    pub physical_bytes_used: u64,
    /// Bytes the image file occupies on its filesystem.
    pub file_allocated_bytes: u64,
    /// logical_bytes_mapped / data_stored_bytes (the compression ratio).
    pub ratio: f64,
    /// Blocks stored raw.
    pub raw_writes: u64,
    /// Blocks written (data).
    pub block_writes: u64,
    /// Blocks written as zeros or same-filled (metadata only).
    pub fill_writes: u64,
    /// Blocks read.
    pub block_reads: u64,
    /// Extents sealed.
    pub extents_sealed: u64,
    /// Cleaner passes that freed or moved something.
    pub cleaner_runs: u64,
    /// Extents cleaned.
    pub extents_cleaned: u64,
    /// Blocks moved by the cleaner.
    pub blocks_relocated: u64,
    /// Microseconds spent cleaning.
    pub cleaner_us: u64,
    /// Checkpoints written.
    pub checkpoints: u64,
    /// Table pages written by checkpoints (4 KiB each).
    pub checkpoint_pages_written: u64,
    /// Microseconds spent in checkpoints (all of them).
    pub checkpoint_us: u64,
    /// The longest checkpoint, microseconds.
    pub checkpoint_max_us: u64,
    /// Flushes.
    pub flushes: u64,
    /// Writes refused for lack of space.
    pub enospc: u64,
    /// Reads that found damaged data.
    pub corrupt_reads: u64,
    /// Spans of stored blocks checked and decoded in place from the
    /// image's mapping (no `pread` copy).
    pub mapped_reads: u64,
    /// Extents replayed at open.
    pub recovered_extents: u64,
    /// Whether background work is due or running right now: the cleaner
    /// (free extents under the low mark) or a checkpoint. A server that
    /// has just taken a burst of writes does this work next; a benchmark
    /// waits for `false` before it times reads.
    pub maintenance_pending: bool,
}

#[derive(Default)]
struct Counters {
    raw_writes: AtomicU64,
    block_writes: AtomicU64,
    fill_writes: AtomicU64,
    block_reads: AtomicU64,
    extents_sealed: AtomicU64,
    cleaner_runs: AtomicU64,
    extents_cleaned: AtomicU64,
    blocks_relocated: AtomicU64,
    cleaner_us: AtomicU64,
    checkpoints: AtomicU64,
    checkpoint_pages_written: AtomicU64,
    checkpoint_us: AtomicU64,
    checkpoint_max_us: AtomicU64,
    flushes: AtomicU64,
    enospc: AtomicU64,
    corrupt_reads: AtomicU64,
    mapped_reads: AtomicU64,
    recovered_extents: AtomicU64,
    /// Set once the image's mapping took a bus error: reads `pread` from then on.
    map_off: AtomicBool,
}

/// What a block holds, for block status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    /// Never written or trimmed.
    Unmapped,
    /// Written as zeros.
    Zero,
    /// Holds data (same-filled blocks included).
    Data,
}

/// The engine. All methods take `&self`; it is shared by connections.
pub struct Engine {
    backing: Box<dyn Backing>,
    sb: Superblock,
    codec: CodecId,
    state: Mutex<State>,
    /// Readers hold it shared while they read sealed extents; freed
    /// extents return to the free list only under it exclusively.
    reuse: RwLock<()>,
    /// Serialises read-modify-write of partial blocks (by block number).
    stripes: Vec<Mutex<()>>,
    /// Serialises checkpoints and cleaning.
    maint: Mutex<()>,
    counters: Counters,
    read_only: bool,
    /// FLUSH leaves due checkpoints to `checkpoint_if_due` (a server's
    /// maintenance thread) instead of taking them itself.
    background_checkpoints: AtomicBool,
    /// A background checkpoint failed (and was reported).
    checkpoint_failed: AtomicBool,
}

thread_local! {
    /// The compressed bytes of a read, kept from read to read.
    static SPAN: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    static ENC: std::cell::RefCell<Option<(CodecId, PageEncoder, Vec<u8>)>> = const { std::cell::RefCell::new(None) };
}

fn with_encoder<R>(codec: CodecId, len: usize, f: impl FnOnce(&mut PageEncoder, &mut Vec<u8>) -> R) -> R {
    ENC.with(|c| {
        let mut c = c.borrow_mut();
        if c.as_ref().is_none_or(|(id, _, _)| *id != codec) {
            *c = Some((codec, PageEncoder::new(codec).raw_fraction(7, 8), Vec::new()));
        }
        let (_, enc, buf) = c.as_mut().expect("just set");
        if buf.len() < len {
            buf.resize(len, 0);
        }
        f(enc, buf)
    })
}

/// A block encoded, ready to place.
#[derive(Debug, PartialEq, Eq)]
enum Encoded {
    Zero,
    Same(u64),
    Compressed(Vec<u8>),
    Raw,
}

/// A random image identity (the std hasher's keys come from the OS).
fn random_uuid() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish() | 1
}

fn micros(t: Instant) -> u64 {
    t.elapsed().as_micros() as u64
}

impl Engine {
    /// Creates a new image on `backing` (which must be empty or disposable).
    pub fn create(backing: Box<dyn Backing>, o: &CreateOptions) -> Result<Engine, BlkError> {
        let blocks = o.logical_size / o.block_size.max(1) as u64;
        let table_pages = Superblock::table_pages_for(blocks);
        // Raw blocks fill raw extents exactly; their records (and
        // compressed data) go to log extents.
        let raw_exts = blocks.div_ceil((o.extent_size / o.block_size.max(1)).max(1) as u64);
        let recs = blocks
            .div_ceil(((o.extent_size as u64).saturating_sub(EXT_HEADER as u64) / RECORD as u64).max(1));
        let full = raw_exts + recs + CLEANER_RESERVE as u64 + OPEN_EXTENTS as u64 + 1 + raw_exts / 16;
        let extents = match o.physical {
            None => full,
            Some(p) => (p / o.extent_size.max(1) as u64).max(4),
        };
        if extents > u32::MAX as u64 / 2 {
            return Err(BlkError::BadImage("too many extents: use a bigger extent size".into()));
        }
        let sb = Superblock {
            block_size: o.block_size,
            extent_size: o.extent_size,
            codec: o.codec as u8,
            provisioned: extents >= full,
            logical_size: o.logical_size,
            extents: extents as u32,
            table_pages,
            generation: 1,
            next_seq: 1,
            next_wseq: 1,
            uuid: random_uuid(),
        };
        sb.validate().map_err(BlkError::BadImage)?;
        if (extents as u32) < CLEANER_RESERVE + OPEN_EXTENTS as u32 + 5 {
            return Err(BlkError::BadImage(format!(
                "physical size too small: {} extents of {}, at least {}",
                extents,
                o.extent_size,
                CLEANER_RESERVE + OPEN_EXTENTS as u32 + 5
            )));
        }
        // Area 1 holds generation 1: every block unmapped. Area 0 gets the
        // same pages as generation 2 (the first checkpoint's, which writes
        // that area), so that checkpoint writes only the pages changed by
        // then; until a superblock of generation 2 exists area 0 is not read.
        let none = vec![Loc::NONE; ENTRIES_PER_PAGE];
        let chunk = 256usize;
        let mut buf = vec![0u8; chunk * CKPT_PAGE];
        for (area, generation) in [(1u64, 1u64), (0, 2)] {
            let mut p = 0u32;
            while p < table_pages {
                let k = (table_pages - p).min(chunk as u32);
                for i in 0..k {
                    let first = (p + i) as u64 * ENTRIES_PER_PAGE as u64;
                    let n = (blocks - first).min(ENTRIES_PER_PAGE as u64) as usize;
                    let at = i as usize * CKPT_PAGE;
                    format::encode_page(&none[..n], p + i, generation, &mut buf[at..at + CKPT_PAGE]);
                }
                backing.write_at(&buf[..k as usize * CKPT_PAGE], sb.page_offset(area, p))?;
                p += k;
            }
        }
        // Generation g lives in slot g % 2: generation 1 in slot 1, so the
        // first checkpoint (2, slot 0) leaves it whole.
        backing.write_at(&vec![0u8; SB_SIZE], 0)?;
        backing.write_at(&sb.encode(), SB_SIZE as u64)?;
        // Zero the first bytes of the last extent so the file has its full size.
        backing.write_at(&[0u8; 8], sb.extent_offset(sb.extents - 1))?;
        backing.sync()?;
        let eng = Engine::open(backing, false)?;
        // Both areas hold the table just written: nothing to compare.
        eng.state.lock().unverified = [false; 2];
        Ok(eng)
    }

    /// Opens an image, recovering from a crash if it was not closed.
    pub fn open(backing: Box<dyn Backing>, read_only: bool) -> Result<Engine, BlkError> {
        let mut best: Option<Superblock> = None;
        let mut why = Vec::new();
        for s in 0..2u64 {
            let mut b = vec![0u8; SB_SIZE];
            backing.read_at(&mut b, s * SB_SIZE as u64)?;
            match Superblock::decode(&b) {
                Ok(sb) if best.is_none_or(|b| sb.generation > b.generation) => best = Some(sb),
                Ok(_) => {}
                Err(e) => why.push(format!("superblock slot {s}: {e}")),
            }
        }
        let sb =
            best.ok_or_else(|| BlkError::BadImage(format!("not a ztier block image: {}", why.join("; "))))?;
        let codec = CodecId::try_from(sb.codec)
            .map_err(|_| BlkError::BadImage(format!("unknown codec {}", sb.codec)))?;
        let blocks = sb.blocks();
        let area = sb.generation % 2;
        // Warm reads check and decode stored blocks in place (see decode_run).
        backing.map(sb.extent_offset(sb.extents));
        let mut table = Vec::with_capacity(blocks as usize);
        {
            let chunk = 256u32;
            let mut buf = vec![0u8; chunk as usize * CKPT_PAGE];
            let mut p = 0u32;
            let needed = Superblock::table_pages_for(blocks);
            while p < needed {
                let k = (needed - p).min(chunk);
                let b = &mut buf[..k as usize * CKPT_PAGE];
                backing.read_at(b, sb.page_offset(area, p))?;
                for i in 0..k {
                    let first = (p + i) as u64 * ENTRIES_PER_PAGE as u64;
                    let n = (blocks - first).min(ENTRIES_PER_PAGE as u64) as usize;
                    let at = i as usize * CKPT_PAGE;
                    format::decode_page(&b[at..at + CKPT_PAGE], p + i, sb.generation, n, &mut table)
                        .map_err(|e| BlkError::BadImage(format!("checkpoint area {area}: {e}")))?;
                }
                p += k;
            }
        }
        let n = sb.extents;
        let bs = sb.block_size as usize;
        let pages = Superblock::table_pages_for(blocks) as usize; // the ones in use
        let mut dirty = [vec![0u64; pages.div_ceil(64)], vec![0u64; pages.div_ceil(64)]];
        // Replay the log extents opened after the checkpoint.
        let mut wseq = vec![0u64; table.len()];
        let mut max_seq = sb.next_seq.saturating_sub(1);
        let mut max_wseq = sb.next_wseq.saturating_sub(1);
        let mut seqs = vec![0u64; n as usize];
        let mut head = [0u8; EXT_HEADER];
        let mut replay: Vec<(u64, u32)> = Vec::new();
        for e in 0..n {
            backing.read_at(&mut head, sb.extent_offset(e))?;
            if let Some(seq) = format::peek_seq(&head, e, sb.uuid) {
                seqs[e as usize] = seq;
                if seq >= sb.next_seq {
                    replay.push((seq, e));
                }
            }
        }
        replay.sort_unstable();
        let mut buf = vec![0u8; sb.extent_size as usize];
        let mut block = vec![0u8; bs];
        let mut recovered = 0u64;
        let mut replayed = 0usize;
        for &(seq, e) in &replay {
            backing.read_at(&mut buf, sb.extent_offset(e))?;
            let Some((s, recs)) = format::parse_extent(&buf, e, sb.uuid) else {
                seqs[e as usize] = 0; // torn header: never flushed
                continue;
            };
            debug_assert_eq!(s, seq);
            recovered += 1;
            replayed += 1;
            max_seq = max_seq.max(seq);
            for r in recs {
                max_wseq = max_wseq.max(r.wseq);
                let mut apply = |i: u64, loc: Loc, table: &mut Vec<Loc>| {
                    let i = i as usize;
                    if r.wseq > wseq[i] {
                        wseq[i] = r.wseq;
                        table[i] = loc;
                        set_bit(&mut dirty[0], i / ENTRIES_PER_PAGE);
                        set_bit(&mut dirty[1], i / ENTRIES_PER_PAGE);
                    }
                };
                match r.kind {
                    Kind::Compressed => {
                        if r.lba >= blocks {
                            continue;
                        }
                        let data = &buf[r.offset as usize..r.offset as usize + r.len as usize];
                        if crc32c(data) != r.crc {
                            continue; // torn data: never flushed
                        }
                        apply(r.lba, r.loc(), &mut table);
                    }
                    Kind::Raw => {
                        let fits = r.extent < n
                            && r.len as usize == bs
                            && r.offset as usize % bs == 0
                            && r.offset as usize + bs <= sb.extent_size as usize;
                        if r.lba >= blocks || !fits {
                            continue;
                        }
                        backing.read_at(&mut block, sb.extent_offset(r.extent) + r.offset as u64)?;
                        if crc32c(&block) != r.crc {
                            continue; // the block was not written: never flushed
                        }
                        apply(r.lba, r.loc(), &mut table);
                    }
                    Kind::Zero | Kind::Trim | Kind::Same => {
                        let end = r.lba.saturating_add(r.nblocks as u64).min(blocks);
                        let loc = match r.kind {
                            Kind::Zero => Loc::ZEROED,
                            Kind::Trim => Loc::NONE,
                            _ => Loc::same(r.pattern),
                        };
                        for i in r.lba.min(end)..end {
                            apply(i, loc, &mut table);
                        }
                    }
                }
            }
        }
        drop(wseq);
        // The area not in use may miss pages the one in use has (the
        // checkpoints before the last wrote only what changed since it was
        // written): the first checkpoint that writes it compares its
        // unmarked pages with the table as it goes (`checkpoint`), so the
        // open does not read it.
        let mut unverified = [false; 2];
        unverified[1 - area as usize] = !read_only;
        // Extent states from the table.
        let mut ext = vec![ExtInfo::FREE; n as usize];
        for l in &table {
            if l.is_data() {
                if l.extent >= n {
                    return Err(BlkError::BadImage(format!("table points to extent {} of {n}", l.extent)));
                }
                let raw = l.len as usize == bs;
                let x = &mut ext[l.extent as usize];
                x.state = ExtState::Sealed;
                x.raw = raw;
                x.live += if raw { l.len as u32 } else { l.len as u32 + RECORD as u32 };
            }
        }
        let mut free = BTreeSet::new();
        let mut high_water = 0;
        for (i, x) in ext.iter_mut().enumerate() {
            x.seq = if x.raw { 0 } else { seqs[i] };
            if x.state == ExtState::Free {
                free.insert(i as u32);
            } else {
                high_water = i as u32 + 1;
            }
        }
        let st = State {
            table,
            dirty,
            unverified,
            ext,
            free,
            pending_free: Vec::new(),
            open: Vec::new(),
            next_seq: max_seq + 1,
            next_wseq: max_wseq + 1,
            generation: sb.generation,
            ckpt_next_seq: sb.next_seq,
            sealed_since_ckpt: replayed as u32,
            clean_cursor: 0,
            high_water,
            poisoned: None,
            block_size: sb.block_size,
        };
        let eng = Engine {
            backing,
            sb,
            codec,
            state: Mutex::new(st),
            reuse: RwLock::new(()),
            stripes: (0..64).map(|_| Mutex::new(())).collect(),
            maint: Mutex::new(()),
            counters: Counters::default(),
            read_only,
            background_checkpoints: AtomicBool::new(false),
            checkpoint_failed: AtomicBool::new(false),
        };
        eng.counters.recovered_extents.store(recovered, Ordering::Relaxed);
        if !read_only && !replay.is_empty() {
            // Make the recovered state the checkpointed one: replayed
            // extents can then be cleaned, and torn ones reused.
            eng.checkpoint()?;
        }
        Ok(eng)
    }

    /// The superblock as opened.
    pub fn geometry(&self) -> &Superblock {
        &self.sb
    }

    /// Logical size in bytes.
    pub fn size(&self) -> u64 {
        self.sb.logical_size
    }

    /// Block size.
    pub fn block_size(&self) -> usize {
        self.sb.block_size as usize
    }

    /// Whether the image was opened read-only.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    fn check_range(&self, off: u64, len: u64) -> Result<(), BlkError> {
        match off.checked_add(len) {
            Some(end) if end <= self.sb.logical_size => Ok(()),
            _ => Err(BlkError::OutOfRange),
        }
    }

    fn check_poison(st: &State) -> Result<(), BlkError> {
        match &st.poisoned {
            Some(why) => Err(BlkError::Io(io::Error::other(format!("image failed earlier: {why}")))),
            None => Ok(()),
        }
    }

    // ---- reads -------------------------------------------------------

    /// Reads `buf.len()` bytes at `off`.
    pub fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), BlkError> {
        self.check_range(off, buf.len() as u64)?;
        let bs = self.block_size() as u64;
        let mut tmp = vec![0u8; bs as usize];
        let mut done = 0usize;
        while done < buf.len() {
            let pos = off + done as u64;
            let lba = pos / bs;
            let within = (pos % bs) as usize;
            if within == 0 && buf.len() - done >= bs as usize {
                // The aligned run in one batch.
                let n = (buf.len() - done) / bs as usize * bs as usize;
                self.read_aligned(lba, &mut buf[done..done + n])?;
                done += n;
                continue;
            }
            let n = (bs as usize - within).min(buf.len() - done);
            self.read_block(lba, &mut tmp)?;
            buf[done..done + n].copy_from_slice(&tmp[within..within + n]);
            done += n;
        }
        Ok(())
    }

    /// Fills `dst` for a block stored as metadata (unmapped, zero, same).
    fn fill_meta(loc: &Loc, dst: &mut [u8]) {
        if loc.extent == SAME {
            let p = loc.pattern().to_le_bytes();
            for c in dst.chunks_exact_mut(8) {
                c.copy_from_slice(&p);
            }
        } else {
            dst.fill(0);
        }
    }

    /// Reads whole blocks from `lba` into `out`: one table lookup under the
    /// lock, then one `pread` per span of stored blocks (`decode_run`).
    fn read_aligned(&self, lba: u64, out: &mut [u8]) -> Result<(), BlkError> {
        let bs = self.block_size();
        let n = out.len() / bs;
        self.counters.block_reads.fetch_add(n as u64, Ordering::Relaxed);
        let _reuse = self.reuse.read();
        let mut locs = Vec::with_capacity(n);
        // Bytes of blocks still in open buffers, copied under the lock.
        let mut open_bytes: Vec<Option<Vec<u8>>> = Vec::with_capacity(n);
        {
            let st = self.state.lock();
            for i in 0..n {
                let loc = st.table[lba as usize + i];
                let mut ob = None;
                if loc.is_data() {
                    if let Some(o) = st.open.iter().find(|o| o.idx == loc.extent) {
                        ob =
                            Some(o.buf[loc.offset as usize..loc.offset as usize + loc.len as usize].to_vec());
                    }
                }
                locs.push(loc);
                open_bytes.push(ob);
            }
        }
        SPAN.with(|span| self.decode_run(lba, &locs, &mut open_bytes, out, &mut span.borrow_mut()))
    }

    /// Decodes blocks `lba..lba + locs.len()` into `out`: from the open
    /// buffers' copies, or from spans of the image read into `span`, one
    /// `pread` each: the stored blocks in file order, a span taking the
    /// next block while the hole before it is at most READ_GAP bytes and
    /// the span stays within READ_SPAN bytes.
    fn decode_run(
        &self,
        lba: u64,
        locs: &[Loc],
        open_bytes: &mut [Option<Vec<u8>>],
        out: &mut [u8],
        span: &mut Vec<u8>,
    ) -> Result<(), BlkError> {
        let bs = self.block_size();
        let pos = |l: &Loc| self.sb.extent_offset(l.extent) + l.offset as u64;
        // (position in the image, index) of the blocks to read.
        let mut stored: Vec<(u64, usize)> = Vec::with_capacity(locs.len());
        for (k, loc) in locs.iter().enumerate() {
            let dst = &mut out[k * bs..(k + 1) * bs];
            if !loc.is_data() {
                Self::fill_meta(loc, dst);
            } else if let Some(b) = open_bytes[k].take() {
                self.decode(lba + k as u64, loc, &b, dst)?;
            } else {
                stored.push((pos(loc), k));
            }
        }
        stored.sort_unstable();
        let mut i = 0;
        while i < stored.len() {
            let lo = stored[i].0;
            let mut hi = lo + locs[stored[i].1].len as u64;
            let mut j = i + 1;
            while j < stored.len() {
                let (p, k) = stored[j];
                let end = hi.max(p + locs[k].len as u64);
                if p > hi + READ_GAP || end - lo > READ_SPAN as u64 {
                    break;
                }
                hi = end;
                j += 1;
            }
            let len = (hi - lo) as usize;
            let blocks = &stored[i..j];
            i = j;
            // Three blocks at a time: their checksums interleaved (see
            // `crc`), then each decoded while its bytes are still in cache.
            let decode_all = |span: &[u8], out: &mut [u8]| -> Result<(), BlkError> {
                let bytes = |&(p, k): &(u64, usize)| {
                    let a = (p - lo) as usize;
                    &span[a..a + locs[k].len as usize]
                };
                // Bytes up to here asked for ahead of the checksums.
                let mut fetched = 0;
                for group in blocks.chunks(3) {
                    if let Some(&(p, k)) = group.last() {
                        let ahead = ((p - lo) as usize + locs[k].len as usize + PREFETCH).min(span.len());
                        if ahead > fetched {
                            crc::prefetch(&span[fetched.max(ahead.saturating_sub(PREFETCH))..ahead]);
                            fetched = ahead;
                        }
                    }
                    let crcs = match group {
                        [x, y, z] => crc::crc32c_x3(bytes(x), bytes(y), bytes(z)),
                        _ => {
                            let mut c = [0; 3];
                            for (i, b) in group.iter().enumerate() {
                                c[i] = crc32c(bytes(b));
                            }
                            c
                        }
                    };
                    for (i, b) in group.iter().enumerate() {
                        let k = b.1;
                        let lba = lba + k as u64;
                        self.check_crc(lba, &locs[k], crcs[i])?;
                        self.decode_checked(lba, &locs[k], bytes(b), &mut out[k * bs..(k + 1) * bs])?;
                    }
                }
                Ok(())
            };
            // In place from the image's mapping: no pread copy. A bus
            // error under it (the file truncated, the device failing) left
            // zeros where the bytes were: then the mapping is given up and
            // the span read again with pread, which reports the error.
            if !self.counters.map_off.load(Ordering::Relaxed) {
                if let Some((m, map)) = self.backing.mapped(lo, len) {
                    let f0 = map.faults();
                    let r = decode_all(m, out);
                    if map.faults() == f0 {
                        self.counters.mapped_reads.fetch_add(1, Ordering::Relaxed);
                        r?;
                        continue;
                    }
                    self.counters.map_off.store(true, Ordering::Relaxed);
                }
            }
            if span.len() < len {
                span.resize(len, 0);
            }
            let span = &mut span[..len];
            self.backing.read_at(span, lo)?;
            decode_all(span, out)?;
        }
        Ok(())
    }

    fn read_block(&self, lba: u64, out: &mut [u8]) -> Result<(), BlkError> {
        self.counters.block_reads.fetch_add(1, Ordering::Relaxed);
        let _reuse = self.reuse.read();
        let mut stored = Vec::new();
        let loc;
        {
            let st = self.state.lock();
            loc = st.table[lba as usize];
            if !loc.is_data() {
                Self::fill_meta(&loc, out);
                return Ok(());
            }
            if let Some(o) = st.open.iter().find(|o| o.idx == loc.extent) {
                stored.extend_from_slice(&o.buf[loc.offset as usize..loc.offset as usize + loc.len as usize]);
            }
        }
        if stored.is_empty() {
            stored.resize(loc.len as usize, 0);
            self.backing.read_at(&mut stored, self.sb.extent_offset(loc.extent) + loc.offset as u64)?;
        }
        self.decode(lba, &loc, &stored, out)
    }

    fn decode(&self, lba: u64, loc: &Loc, stored: &[u8], out: &mut [u8]) -> Result<(), BlkError> {
        self.check_crc(lba, loc, crc32c(stored))?;
        self.decode_checked(lba, loc, stored, out)
    }

    /// Whether `crc`, computed over a block's stored bytes, is the one its
    /// record holds.
    fn check_crc(&self, lba: u64, loc: &Loc, crc: u32) -> Result<(), BlkError> {
        if crc != loc.crc {
            self.counters.corrupt_reads.fetch_add(1, Ordering::Relaxed);
            return Err(BlkError::Corrupt { lba, why: "checksum mismatch".into() });
        }
        Ok(())
    }

    /// Decodes a block whose stored bytes' checksum was checked.
    fn decode_checked(&self, lba: u64, loc: &Loc, stored: &[u8], out: &mut [u8]) -> Result<(), BlkError> {
        if loc.len as usize == out.len() {
            out.copy_from_slice(stored);
            return Ok(());
        }
        with_encoder(self.codec, 0, |enc, _| enc.decode(Form::Compressed(self.codec), stored, out)).map_err(
            |e| {
                self.counters.corrupt_reads.fetch_add(1, Ordering::Relaxed);
                BlkError::Corrupt { lba, why: e.to_string() }
            },
        )
    }

    /// The state of each block in `[lba, lba + n)`.
    pub fn block_states(&self, lba: u64, n: u64) -> Vec<BlockState> {
        let st = self.state.lock();
        st.table[lba as usize..(lba + n) as usize]
            .iter()
            .map(|l| match l.extent {
                UNMAPPED => BlockState::Unmapped,
                ZERO => BlockState::Zero,
                _ => BlockState::Data,
            })
            .collect()
    }

    /// Whether the image is provisioned (see the module docs).
    pub fn provisioned(&self) -> bool {
        self.sb.provisioned
    }

    // ---- writes ------------------------------------------------------

    fn encode(&self, data: &[u8]) -> Encoded {
        with_encoder(self.codec, data.len(), |enc, buf| match enc.encode(data, &mut buf[..]) {
            Ok(e) => match e.form {
                Form::Zero => Encoded::Zero,
                Form::Same(0) => Encoded::Zero,
                Form::Same(p) => Encoded::Same(p),
                Form::Compressed(_) => Encoded::Compressed(buf[..e.len].to_vec()),
                Form::Raw => Encoded::Raw,
            },
            Err(_) => Encoded::Raw,
        })
    }

    /// Writes `data` at `off`; with `fua`, durable on return.
    pub fn write(&self, off: u64, data: &[u8], fua: bool) -> Result<(), BlkError> {
        self.check_writable()?;
        self.check_range(off, data.len() as u64)?;
        let bs = self.block_size() as u64;
        // Large aligned requests are compressed on two threads: one split,
        // not a split of each half again (a thread is started for it and
        // builds its own encoder).
        if data.len() >= SPLIT_WRITE && off % bs == 0 && data.len() as u64 % bs == 0 {
            let half = (data.len() / 2) / bs as usize * bs as usize;
            let (a, b) = data.split_at(half);
            let (ra, rb) = std::thread::scope(|sc| {
                let h = sc.spawn(|| self.write_blocks(off, a));
                let rb = self.write_blocks(off + half as u64, b);
                (h.join().expect("write thread"), rb)
            });
            ra.and(rb)?;
            if fua {
                self.flush()?;
            }
            return Ok(());
        }
        self.write_blocks(off, data)?;
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    /// [`Engine::write`] of a checked range on this thread, without FUA.
    fn write_blocks(&self, off: u64, data: &[u8]) -> Result<(), BlkError> {
        let bs = self.block_size() as u64;
        let mut done = 0usize;
        // A run of blocks filled alike (zero or one pattern), written as
        // one range record when it ends.
        let mut run: Option<(u64, u64, Kind, u64)> = None; // first lba, blocks, kind, pattern
        while done < data.len() {
            let pos = off + done as u64;
            let lba = pos / bs;
            let within = (pos % bs) as usize;
            let n = (bs as usize - within).min(data.len() - done);
            if within == 0 && n == bs as usize {
                let block = &data[done..done + n];
                let e = self.encode(block);
                let fill = match e {
                    Encoded::Zero => Some((Kind::Zero, 0)),
                    Encoded::Same(p) => Some((Kind::Same, p)),
                    _ => None,
                };
                match (fill, &mut run) {
                    (Some((k, p)), Some(r)) if r.2 == k && r.3 == p && r.0 + r.1 == lba => r.1 += 1,
                    (Some((k, p)), _) => {
                        if let Some((a, c, k, p)) = run.take() {
                            self.put_range(a, c, k, p)?;
                        }
                        run = Some((lba, 1, k, p));
                    }
                    (None, _) => {
                        if let Some((a, c, k, p)) = run.take() {
                            self.put_range(a, c, k, p)?;
                        }
                        self.put_block(lba, e, block)?;
                    }
                }
            } else {
                if let Some((a, c, k, p)) = run.take() {
                    self.put_range(a, c, k, p)?;
                }
                let _g = self.stripes[lba as usize % self.stripes.len()].lock();
                let mut blk = vec![0u8; bs as usize];
                self.read_block(lba, &mut blk)?;
                blk[within..within + n].copy_from_slice(&data[done..done + n]);
                let e = self.encode(&blk);
                match e {
                    Encoded::Zero => self.put_range(lba, 1, Kind::Zero, 0)?,
                    Encoded::Same(p) => self.put_range(lba, 1, Kind::Same, p)?,
                    e => self.put_block(lba, e, &blk)?,
                }
            }
            done += n;
        }
        if let Some((a, c, k, p)) = run.take() {
            self.put_range(a, c, k, p)?;
        }
        Ok(())
    }

    fn check_writable(&self) -> Result<(), BlkError> {
        if self.read_only {
            return Err(BlkError::Io(io::Error::new(io::ErrorKind::PermissionDenied, "read-only")));
        }
        Ok(())
    }

    /// Stores one data block (`e` is compressed or raw; `block` its bytes).
    fn put_block(&self, lba: u64, e: Encoded, block: &[u8]) -> Result<(), BlkError> {
        self.counters.block_writes.fetch_add(1, Ordering::Relaxed);
        match e {
            Encoded::Compressed(bytes) => {
                let mut st = self.lock_with_space(RECORD + bytes.len(), false, false)?;
                self.add_compressed(&mut st, lba, &bytes, false)
            }
            Encoded::Raw => {
                self.counters.raw_writes.fetch_add(1, Ordering::Relaxed);
                let mut st = self.lock_with_space(RECORD, true, false)?;
                self.add_raw(&mut st, lba, block, false)
            }
            Encoded::Zero | Encoded::Same(_) => unreachable!("fills are range records"),
        }
    }

    /// Appends `rec` to open log buffer `slot`.
    fn push_record(st: &mut State, slot: usize, rec: &Record) {
        let o = &mut st.open[slot];
        let at = EXT_HEADER + o.count as usize * RECORD;
        rec.put(&mut o.buf[at..at + RECORD]);
        o.count += 1;
    }

    /// Places compressed `bytes` of block `lba` and maps it there.
    fn add_compressed(&self, st: &mut State, lba: u64, bytes: &[u8], cleaner: bool) -> Result<(), BlkError> {
        let slot = self.place_log(st, RECORD + bytes.len(), cleaner)?;
        let wseq = st.next_wseq;
        st.next_wseq += 1;
        let crc = crc32c(bytes);
        let o = &mut st.open[slot];
        o.data_start -= bytes.len();
        let offset = o.data_start;
        o.buf[offset..offset + bytes.len()].copy_from_slice(bytes);
        let idx = o.idx;
        let rec = Record::data(lba, wseq, Kind::Compressed, idx, offset as u16, bytes.len() as u16, crc);
        Self::push_record(st, slot, &rec);
        st.set_loc(lba, rec.loc());
        Ok(())
    }

    /// Places raw `block` of `lba` in the open raw extent, its record in a
    /// log buffer, and maps it there.
    fn add_raw(&self, st: &mut State, lba: u64, block: &[u8], cleaner: bool) -> Result<(), BlkError> {
        let bs = self.block_size();
        let rs = self.place_raw(st, cleaner)?;
        let o = &mut st.open[rs];
        let offset = o.count as usize * bs;
        o.buf[offset..offset + bs].copy_from_slice(block);
        o.count += 1;
        let idx = o.idx;
        let full = o.count == self.sb.raw_slots();
        if full {
            self.seal(st, rs)?;
        }
        let slot = self.place_log(st, RECORD, cleaner)?;
        let wseq = st.next_wseq;
        st.next_wseq += 1;
        let rec = Record::data(lba, wseq, Kind::Raw, idx, offset as u16, bs as u16, crc32c(block));
        Self::push_record(st, slot, &rec);
        st.set_loc(lba, rec.loc());
        Ok(())
    }

    /// Writes a zero, trim or same record over `n` blocks from `lba`.
    fn put_range(&self, lba: u64, n: u64, kind: Kind, pattern: u64) -> Result<(), BlkError> {
        if kind != Kind::Trim {
            self.counters.fill_writes.fetch_add(n, Ordering::Relaxed);
        }
        let mut at = lba;
        let end = lba + n;
        while at < end {
            let k = (end - at).min(u32::MAX as u64);
            let mut st = self.lock_with_space(RECORD, false, false)?;
            let slot = self.place_log(&mut st, RECORD, false)?;
            let wseq = st.next_wseq;
            st.next_wseq += 1;
            Self::push_record(&mut st, slot, &Record::range(at, wseq, kind, k as u32, pattern));
            let loc = match kind {
                Kind::Zero => Loc::ZEROED,
                Kind::Same => Loc::same(pattern),
                _ => Loc::NONE,
            };
            for b in at..at + k {
                st.set_loc(b, loc);
            }
            at += k;
        }
        Ok(())
    }

    /// Writes zeros over `[off, off + len)`: whole blocks as metadata,
    /// partial ones by read-modify-write (refused with `fast`).
    pub fn write_zeroes(&self, off: u64, len: u64, fast: bool, fua: bool) -> Result<(), BlkError> {
        self.check_writable()?;
        self.check_range(off, len)?;
        let bs = self.block_size() as u64;
        let first = off.div_ceil(bs);
        let last = (off + len) / bs;
        let partial = off % bs != 0 || (off + len) % bs != 0;
        if fast && partial && len > 0 {
            return Err(BlkError::NotFast);
        }
        if first >= last {
            if len > 0 {
                self.write(off, &vec![0u8; len as usize], false)?;
            }
        } else {
            if off % bs != 0 {
                self.write(off, &vec![0u8; (first * bs - off) as usize], false)?;
            }
            self.put_range(first, last - first, Kind::Zero, 0)?;
            if (off + len) % bs != 0 {
                self.write(last * bs, &vec![0u8; ((off + len) - last * bs) as usize], false)?;
            }
        }
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    /// Discards whole blocks inside `[off, off + len)` (partial blocks are
    /// left as they are, which TRIM allows).
    pub fn trim(&self, off: u64, len: u64, fua: bool) -> Result<(), BlkError> {
        self.check_writable()?;
        self.check_range(off, len)?;
        let bs = self.block_size() as u64;
        let first = off.div_ceil(bs);
        let last = (off + len) / bs;
        if first < last {
            self.put_range(first, last - first, Kind::Trim, 0)?;
        }
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    /// Seals every log buffer holding records and writes every raw
    /// extent's new blocks (no sync).
    fn write_out(&self, st: &mut State) -> Result<(), BlkError> {
        // Empty log buffers stay open: nothing of theirs needs to be durable.
        while let Some(i) = st.open.iter().position(|o| !o.raw && o.count > 0) {
            self.seal(st, i)?;
        }
        for i in 0..st.open.len() {
            if st.open[i].raw {
                self.write_raw(st, i)?;
            }
        }
        Ok(())
    }

    /// Seals every open extent and syncs the image.
    pub fn flush(&self) -> Result<(), BlkError> {
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
        {
            let mut st = self.state.lock();
            Self::check_poison(&st)?;
            self.write_out(&mut st)?;
        }
        self.backing.sync()?;
        if !self.background_checkpoints.load(Ordering::Relaxed) {
            self.checkpoint_if_due()?;
        }
        Ok(())
    }

    /// With `on`, FLUSH no longer takes a due checkpoint itself: whoever
    /// calls this (a server's maintenance thread) calls
    /// [`Engine::checkpoint_if_due`] often. A FLUSH's data is durable in
    /// the log either way (recovery replays what follows the last
    /// checkpoint); checkpoints bound that replay and recycle extents.
    pub fn set_background_checkpoints(&self, on: bool) {
        self.background_checkpoints.store(on, Ordering::Relaxed);
    }

    /// Whether this is the first call after a background checkpoint
    /// failed (so the failure is reported once).
    pub(crate) fn first_checkpoint_failure(&self) -> bool {
        !self.checkpoint_failed.swap(true, Ordering::Relaxed)
    }

    /// Seals log buffers opened more than `age` ago (the extent buffer's
    /// aging timeout) and writes raw blocks as old; no sync.
    pub fn seal_aged(&self, age: Duration) -> Result<(), BlkError> {
        let mut st = self.state.lock();
        while let Some(i) = st.open.iter().position(|o| !o.raw && o.opened.elapsed() >= age && o.count > 0) {
            self.seal(&mut st, i)?;
        }
        for i in 0..st.open.len() {
            if st.open[i].raw && st.open[i].opened.elapsed() >= age {
                self.write_raw(&mut st, i)?;
            }
        }
        Ok(())
    }

    /// Takes the state lock with room for a record of `need` bytes in an
    /// open log buffer (and, with `raw`, a block in a raw extent) or free
    /// extents to open, cleaning inline if needed.
    fn lock_with_space(
        &self,
        need: usize,
        raw: bool,
        cleaner: bool,
    ) -> Result<parking_lot::MutexGuard<'_, State>, BlkError> {
        let reserve = if cleaner { 0 } else { CLEANER_RESERVE as usize };
        let slots = self.sb.raw_slots();
        // Cleaning rounds in a row that freed nothing, here or elsewhere
        // (another writer's or the maintenance thread's cleaning, whose
        // extents another writer may have taken before this one looked).
        let mut idle = 0;
        let mut rounds = 0u32;
        loop {
            let st = self.state.lock();
            Self::check_poison(&st)?;
            let mut new = usize::from(!st.open.iter().any(|o| !o.raw && o.free() >= need));
            if raw && !st.open.iter().any(|o| o.raw && o.count < slots) {
                new += 1;
            }
            if new == 0 || st.free.len() >= reserve + new {
                return Ok(st);
            }
            drop(st);
            // Full only when cleaning (every extent, after a checkpoint
            // made the latest ones cleanable) frees nothing twice in a row
            // and nobody else freed anything meanwhile. The rounds are
            // bounded as well: each that frees something moves blocks, and
            // on an image within a few extents of full that could go on.
            let cleaned = self.counters.extents_cleaned.load(Ordering::Relaxed);
            let freed = match self.clean(true) {
                Err(BlkError::NoSpace) => 0,
                r => r?,
            };
            let others = self.counters.extents_cleaned.load(Ordering::Relaxed) - cleaned - freed as u64;
            idle = if freed > 0 || others > 0 { 0 } else { idle + 1 };
            rounds += 1;
            if idle >= 2 || rounds >= MAX_CLEAN_ROUNDS {
                break;
            }
        }
        self.counters.enospc.fetch_add(1, Ordering::Relaxed);
        Err(BlkError::NoSpace)
    }

    /// Takes a free extent for a new buffer; its slot in `st.open`.
    fn open_extent(&self, st: &mut State, raw: bool, cleaner: bool) -> Result<usize, BlkError> {
        let reserve = if cleaner { 0 } else { CLEANER_RESERVE as usize };
        if st.free.len() <= reserve {
            self.counters.enospc.fetch_add(1, Ordering::Relaxed);
            return Err(BlkError::NoSpace);
        }
        let idx = st.free.pop_first().expect("checked above");
        let seq = st.next_seq;
        st.next_seq += 1;
        st.ext[idx as usize] = ExtInfo { state: ExtState::Open, live: 0, seq, raw };
        st.high_water = st.high_water.max(idx + 1);
        let es = self.sb.extent_size as usize;
        st.open.push(OpenExt {
            idx,
            seq,
            buf: vec![0u8; es],
            count: 0,
            data_start: es,
            written: 0,
            raw,
            opened: Instant::now(),
        });
        Ok(st.open.len() - 1)
    }

    /// Chooses the open log buffer for `need` bytes (best fit), opening or
    /// sealing as needed. Returns its slot.
    fn place_log(&self, st: &mut State, need: usize, cleaner: bool) -> Result<usize, BlkError> {
        let best = st
            .open
            .iter()
            .enumerate()
            .filter(|(_, o)| !o.raw && o.free() >= need)
            .min_by_key(|(_, o)| o.free());
        if let Some((i, _)) = best {
            return Ok(i);
        }
        let reserve = if cleaner { 0 } else { CLEANER_RESERVE as usize };
        if st.free.len() <= reserve {
            self.counters.enospc.fetch_add(1, Ordering::Relaxed);
            return Err(BlkError::NoSpace);
        }
        if st.open_log_count() >= OPEN_EXTENTS {
            // Seal the fullest.
            let i = st
                .open
                .iter()
                .enumerate()
                .filter(|(_, o)| !o.raw)
                .min_by_key(|(_, o)| o.free())
                .map(|(i, _)| i)
                .expect("open extents");
            self.seal(st, i)?;
        }
        self.open_extent(st, false, cleaner)
    }

    /// The slot of the open raw extent with room for a block, opening one
    /// if needed.
    fn place_raw(&self, st: &mut State, cleaner: bool) -> Result<usize, BlkError> {
        let slots = self.sb.raw_slots();
        if let Some(i) = st.open.iter().position(|o| o.raw && o.count < slots) {
            return Ok(i);
        }
        self.open_extent(st, true, cleaner)
    }

    /// Writes the blocks of open raw extent `slot` not yet written; a
    /// full one is then closed (sealed).
    fn write_raw(&self, st: &mut State, slot: usize) -> Result<(), BlkError> {
        let bs = self.block_size();
        let o = &st.open[slot];
        let (a, b) = (o.written as usize * bs, o.count as usize * bs);
        if b > a {
            if let Err(e) = self.backing.write_at(&o.buf[a..b], self.sb.extent_offset(o.idx) + a as u64) {
                st.poisoned = Some(e.to_string());
                return Err(e.into());
            }
            st.open[slot].written = st.open[slot].count;
        }
        if st.open[slot].count == self.sb.raw_slots() {
            let o = st.open.swap_remove(slot);
            st.ext[o.idx as usize].state = ExtState::Sealed;
            st.sealed_since_ckpt += 1;
            self.counters.extents_sealed.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Seals open extent `slot`: a log buffer's header, crc and one write;
    /// a raw extent's remaining blocks.
    fn seal(&self, st: &mut State, slot: usize) -> Result<(), BlkError> {
        if st.open[slot].raw {
            return self.write_raw(st, slot);
        }
        let mut o = st.open.swap_remove(slot);
        format::seal_header(&mut o.buf, o.count, o.seq, o.idx, self.sb.uuid);
        if let Err(e) = self.backing.write_at(&o.buf, self.sb.extent_offset(o.idx)) {
            // The data is still needed: keep the buffer open, report.
            st.poisoned = Some(e.to_string());
            st.open.push(o);
            return Err(e.into());
        }
        st.ext[o.idx as usize].state = ExtState::Sealed;
        st.sealed_since_ckpt += 1;
        self.counters.extents_sealed.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    // ---- checkpoints and cleaning -------------------------------------

    /// Takes a checkpoint if one is due; whether it did.
    pub fn checkpoint_if_due(&self) -> Result<bool, BlkError> {
        if self.read_only || !self.checkpoint_due() {
            return Ok(false);
        }
        self.checkpoint()?;
        Ok(true)
    }

    /// Whether enough extents were sealed since the last checkpoint (or
    /// freed extents wait for one while free extents run low).
    pub fn checkpoint_due(&self) -> bool {
        self.checkpoint_due_in(&self.state.lock())
    }

    fn checkpoint_due_in(&self, st: &State) -> bool {
        st.sealed_since_ckpt >= (self.sb.extents / 8).max(1024)
            || (!st.pending_free.is_empty() && st.free.len() < self.low_mark() as usize)
    }

    /// Whether the cleaner or a checkpoint is due, or either is running
    /// (`maintenance_pending` in [`Stats`]).
    pub fn maintenance_pending(&self) -> bool {
        // A cleaner pass or checkpoint holds `maint` while it runs.
        let running = self.maint.is_locked();
        let st = self.state.lock();
        !self.read_only
            && (running || (st.free.len() as u32) < self.low_mark() || self.checkpoint_due_in(&st))
    }

    fn low_mark(&self) -> u32 {
        (self.sb.extents / 16).max(CLEANER_RESERVE + OPEN_EXTENTS as u32 + 2)
    }

    fn high_mark(&self) -> u32 {
        (self.sb.extents / 8).max(self.low_mark() + 4)
    }

    /// Writes a checkpoint (see the module docs) and returns extents
    /// freed by earlier cleaning to the free list.
    pub fn checkpoint(&self) -> Result<(), BlkError> {
        if self.read_only {
            return Ok(());
        }
        let t0 = Instant::now();
        let _m = self.maint.lock();
        // The cut: every log extent opened before it is sealed.
        let (generation, next_seq, freed) = {
            let mut st = self.state.lock();
            Self::check_poison(&st)?;
            while let Some(i) = st.open.iter().position(|o| !o.raw && o.count > 0) {
                self.seal(&mut st, i)?;
            }
            // Empty log buffers go back: extents opened after the cut
            // must have seq ≥ next_seq.
            while let Some(i) = st.open.iter().position(|o| !o.raw) {
                let o = st.open.swap_remove(i);
                st.ext[o.idx as usize] = ExtInfo::FREE;
                st.free.insert(o.idx);
            }
            (st.generation + 1, st.next_seq, std::mem::take(&mut st.pending_free))
        };
        let area = generation % 2;
        let pages = Superblock::table_pages_for(self.sb.blocks()) as usize; // the ones in use
        let blocks = self.sb.blocks() as usize;
        // The first checkpoint to write the area not in use at open also
        // compares that area's unmarked pages with the table: it reads
        // the area a stretch at a time outside the lock.
        let verify = self.state.lock().unverified[area as usize];
        let mut disk: Vec<Loc> = Vec::new();
        let mut loads = Vec::new();
        let mut raw = vec![0u8; if verify { VERIFY_PAGES * CKPT_PAGE } else { 0 }];
        // The changed pages, a few at a time under the lock.
        let mut copied: Vec<(u32, Vec<Loc>)> = Vec::new();
        let mut p = 0;
        while p < pages {
            let stretch = (p + if verify { VERIFY_PAGES } else { pages }).min(pages);
            if verify {
                let r = self.read_area(area, p, stretch, generation, &mut raw, &mut disk, &mut loads);
                if let Err(e) = r {
                    // Nothing written: the pages taken so far stay to write.
                    let mut st = self.state.lock();
                    for (q, _) in &copied {
                        set_bit(&mut st.dirty[area as usize], *q as usize);
                    }
                    st.pending_free.extend(freed);
                    return Err(e);
                }
            }
            while p < stretch {
                let st = &mut *self.state.lock();
                let end = (p + PAGES_PER_HOLD).min(stretch);
                for q in p..end {
                    let a = q * ENTRIES_PER_PAGE;
                    let b = (a + ENTRIES_PER_PAGE).min(blocks);
                    let changed = take_bit(&mut st.dirty[area as usize], q)
                        || verify && {
                            // Pages of a stretch are full but its last.
                            let at = (q % VERIFY_PAGES) * ENTRIES_PER_PAGE;
                            !loads[q % VERIFY_PAGES] || disk[at..at + (b - a)] != st.table[a..b]
                        };
                    if changed {
                        copied.push((q as u32, st.table[a..b].to_vec()));
                    }
                }
                p = end;
            }
        }
        // What the copies point to must be durable before they are.
        let next_wseq = {
            let mut st = self.state.lock();
            let r = self.write_out(&mut st);
            if let Err(e) = r {
                st.pending_free.extend(freed);
                return Err(e);
            }
            st.next_wseq
        };
        let sb = Superblock { generation, next_seq, next_wseq, ..self.sb };
        let written = copied.len() as u64;
        let r = (|| -> io::Result<()> {
            self.backing.sync()?;
            // Runs of neighbouring pages in one write each.
            let mut i = 0;
            let mut buf = Vec::new();
            while i < copied.len() {
                let mut j = i + 1;
                while j < copied.len() && copied[j].0 == copied[j - 1].0 + 1 && j - i < 256 {
                    j += 1;
                }
                buf.resize((j - i) * CKPT_PAGE, 0);
                for (k, (q, locs)) in copied[i..j].iter().enumerate() {
                    format::encode_page(locs, *q, generation, &mut buf[k * CKPT_PAGE..(k + 1) * CKPT_PAGE]);
                }
                self.backing.write_at(&buf, self.sb.page_offset(area, copied[i].0))?;
                i = j;
            }
            self.backing.sync()?;
            self.backing.write_at(&sb.encode(), area * SB_SIZE as u64)?;
            self.backing.sync()
        })();
        if let Err(e) = r {
            let mut st = self.state.lock();
            st.pending_free.extend(freed);
            st.poisoned = Some(e.to_string());
            return Err(e.into());
        }
        {
            let _reuse = self.reuse.write();
            let mut st = self.state.lock();
            st.generation = generation;
            st.ckpt_next_seq = next_seq;
            st.unverified[area as usize] = false;
            st.sealed_since_ckpt =
                st.ext.iter().filter(|x| x.state == ExtState::Sealed && x.seq >= next_seq).count() as u32;
            for e in freed {
                st.ext[e as usize] = ExtInfo::FREE;
                st.free.insert(e);
            }
        }
        let c = &self.counters;
        c.checkpoints.fetch_add(1, Ordering::Relaxed);
        c.checkpoint_pages_written.fetch_add(written, Ordering::Relaxed);
        let us = micros(t0);
        c.checkpoint_us.fetch_add(us, Ordering::Relaxed);
        c.checkpoint_max_us.fetch_max(us, Ordering::Relaxed);
        Ok(())
    }

    /// Reads pages `from..to` (at most [`VERIFY_PAGES`], `from` a
    /// multiple of it) of checkpoint area `area` and decodes them as
    /// pages of `generation` into `disk` (`ENTRIES_PER_PAGE` entries per
    /// page) and `loads` (whether each loaded: one that does not — torn,
    /// never written — differs from any table).
    #[allow(clippy::too_many_arguments)]
    fn read_area(
        &self,
        area: u64,
        from: usize,
        to: usize,
        generation: u64,
        raw: &mut [u8],
        disk: &mut Vec<Loc>,
        loads: &mut Vec<bool>,
    ) -> Result<(), BlkError> {
        let blocks = self.sb.blocks() as usize;
        let raw = &mut raw[..(to - from) * CKPT_PAGE];
        self.backing.read_at(raw, self.sb.page_offset(area, from as u32))?;
        disk.clear();
        loads.clear();
        for q in from..to {
            let n = (blocks - q * ENTRIES_PER_PAGE).min(ENTRIES_PER_PAGE);
            let at = (q - from) * CKPT_PAGE;
            let start = disk.len();
            let ok = format::decode_page(&raw[at..at + CKPT_PAGE], q as u32, generation, n, disk).is_ok();
            disk.resize(start + ENTRIES_PER_PAGE, Loc::NONE);
            loads.push(ok);
        }
        Ok(())
    }

    /// Whether the cleaner should run (free extents below the low mark).
    pub fn needs_cleaning(&self) -> bool {
        let st = self.state.lock();
        (st.free.len() as u32) < self.low_mark()
    }

    /// Cleans until free extents reach the high mark or nothing more can
    /// be gained; `urgent` also takes extents over 3/4 live. Returns the
    /// extents freed.
    pub fn clean(&self, urgent: bool) -> Result<u32, BlkError> {
        if self.read_only {
            return Ok(0);
        }
        let t0 = Instant::now();
        let window = (CLEAN_WINDOW / self.sb.extent_size as u64).max(1) as u32;
        let mut freed = 0;
        for pass in 0..2 {
            let mut scanned = 0;
            while scanned < self.sb.extents {
                let enough = {
                    let st = self.state.lock();
                    st.free.len() + st.pending_free.len() >= self.high_mark() as usize
                };
                if enough {
                    break;
                }
                freed += self.clean_window(window, urgent)?;
                scanned += window;
                // Recycle what was freed when free extents run low.
                let recycle = {
                    let st = self.state.lock();
                    !st.pending_free.is_empty() && (st.free.len() as u32) < self.low_mark()
                };
                if recycle {
                    self.checkpoint()?;
                }
            }
            let (pending, recent) = {
                let st = self.state.lock();
                (!st.pending_free.is_empty(), st.sealed_since_ckpt > 0)
            };
            // Freed extents become free at a checkpoint; a checkpoint also
            // makes the extents sealed since the last one cleanable, so
            // with nothing freed one more pass may find garbage.
            if pending || recent {
                self.checkpoint()?;
            }
            if freed > 0 || !recent || pass == 1 {
                break;
            }
        }
        self.counters.cleaner_runs.fetch_add(1, Ordering::Relaxed);
        self.counters.cleaner_us.fetch_add(micros(t0), Ordering::Relaxed);
        Ok(freed)
    }

    /// Cleans one window of extents from the cursor; returns extents freed.
    fn clean_window(&self, window: u32, urgent: bool) -> Result<u32, BlkError> {
        let _m = self.maint.lock();
        let es = self.sb.extent_size;
        let bs = self.sb.block_size;
        let victims: Vec<u32> = {
            let mut st = self.state.lock();
            let n = self.sb.extents;
            let start = st.clean_cursor % n;
            st.clean_cursor = (start + window) % n;
            let limit = |raw: bool| {
                let cap = if raw { es } else { es - EXT_HEADER as u32 };
                if urgent {
                    cap - cap / 32
                } else {
                    cap * 3 / 4
                }
            };
            let mut v: Vec<(u32, u32)> = (start..(start + window).min(n))
                .filter_map(|e| {
                    let x = st.ext[e as usize];
                    (x.state == ExtState::Sealed && x.seq < st.ckpt_next_seq && x.live <= limit(x.raw))
                        .then_some((x.live, e))
                })
                .collect();
            v.sort_unstable();
            // Victims are freed only at the next checkpoint: move no more
            // than the free extents (the reserve included) and half the
            // open buffers' room can take now (placing a run that fits no
            // open buffer seals the fullest, and its room is lost).
            let cap = es as u64 - EXT_HEADER as u64;
            let mut budget: u64 = st.free.len().saturating_sub(2) as u64 * cap
                + st.open.iter().filter(|o| !o.raw).map(|o| o.free() as u64).sum::<u64>() / 2;
            v.into_iter()
                .take_while(|&(live, e)| {
                    let raw = st.ext[e as usize].raw;
                    let records = if raw { (live / bs) as u64 * RECORD as u64 } else { 0 };
                    let need = live as u64 + records + live as u64 / 8;
                    let ok = need <= budget;
                    budget = budget.saturating_sub(need);
                    ok
                })
                .map(|(_, e)| e)
                .collect()
        };
        if victims.is_empty() {
            return Ok(0);
        }
        // Read the victims and collect their live blocks.
        let mut bufs = Vec::new();
        for &e in &victims {
            let mut b = vec![0u8; es as usize];
            self.backing.read_at(&mut b, self.sb.extent_offset(e))?;
            bufs.push(b);
        }
        let mut st = self.state.lock();
        let mut live: Vec<(u64, usize, u16, u16, Kind)> = Vec::new(); // lba, victim idx, offset, len, kind
        let mut raw_victims = Vec::new();
        for (vi, &e) in victims.iter().enumerate() {
            if st.ext[e as usize].raw {
                raw_victims.push((e, vi));
                continue;
            }
            let Some((_, recs)) = format::parse_extent(&bufs[vi], e, self.sb.uuid) else {
                // A sealed extent we wrote ourselves no longer parses: leave
                // it (its blocks fail their crc on read) rather than guess.
                continue;
            };
            for r in recs {
                if r.kind == Kind::Compressed
                    && r.lba < st.table.len() as u64
                    && st.table[r.lba as usize] == r.loc()
                {
                    live.push((r.lba, vi, r.offset, r.len, r.kind));
                }
            }
        }
        if !raw_victims.is_empty() {
            // Raw extents carry no records: their blocks are found in the table.
            raw_victims.sort_unstable();
            for (lba, l) in st.table.iter().enumerate() {
                if l.is_data() {
                    if let Ok(k) = raw_victims.binary_search_by_key(&l.extent, |x| x.0) {
                        live.push((lba as u64, raw_victims[k].1, l.offset, l.len, Kind::Raw));
                    }
                }
            }
        }
        // First-fit decreasing over runs of neighbouring blocks.
        live.sort_unstable_by_key(|x| x.0);
        let cap = es as usize - EXT_HEADER;
        let mut runs: Vec<(usize, usize, usize)> = Vec::new(); // start, end, bytes
        for (i, x) in live.iter().enumerate() {
            match runs.last_mut() {
                Some(r) if live[r.1 - 1].0 + 1 == x.0 && r.2 + x.3 as usize + RECORD <= cap => {
                    r.1 = i + 1;
                    r.2 += x.3 as usize + RECORD;
                }
                _ => runs.push((i, i + 1, x.3 as usize + RECORD)),
            }
        }
        runs.sort_unstable_by_key(|r| std::cmp::Reverse(r.2));
        let mut moved = 0u64;
        let slots = self.sb.raw_slots() as usize;
        for (s, e, _) in runs {
            // Stop (the victims left with live blocks stay sealed) before
            // a run could need more free extents than are left: a cleaner
            // that ran out mid-window would keep the extents it filled and
            // free none, and with no free extent left it could never run
            // again. A run is at most one extent of records and data (two
            // new log extents, one sealed early) plus raw extents for its
            // raw blocks.
            let raw_blocks = live[s..e].iter().filter(|x| x.4 == Kind::Raw).count();
            let raw_room: usize = st.open.iter().filter(|o| o.raw).map(|o| slots - o.count as usize).sum();
            let new = 2 + raw_blocks.saturating_sub(raw_room).div_ceil(slots.max(1));
            if st.free.len() < new {
                break;
            }
            for &(lba, vi, offset, len, kind) in &live[s..e] {
                let bytes = &bufs[vi][offset as usize..offset as usize + len as usize];
                if kind == Kind::Raw {
                    self.add_raw(&mut st, lba, bytes, true)?;
                } else {
                    self.add_compressed(&mut st, lba, bytes, true)?;
                }
                moved += 1;
            }
        }
        let mut freed = 0;
        for &e in &victims {
            if st.ext[e as usize].live == 0 && st.ext[e as usize].state == ExtState::Sealed {
                st.ext[e as usize].state = ExtState::PendingFree;
                st.pending_free.push(e);
                freed += 1;
            }
        }
        self.counters.blocks_relocated.fetch_add(moved, Ordering::Relaxed);
        self.counters.extents_cleaned.fetch_add(freed as u64, Ordering::Relaxed);
        Ok(freed)
    }

    /// Checkpoints (the clean shutdown): the next open replays nothing.
    pub fn close(&self) -> Result<(), BlkError> {
        if self.read_only || self.unchanged_since_checkpoint() {
            return Ok(());
        }
        self.checkpoint()
    }

    /// Whether the image on disk is the last checkpoint's, with nothing
    /// written, trimmed, cleaned or sealed since (so a checkpoint would
    /// change nothing but the generation).
    fn unchanged_since_checkpoint(&self) -> bool {
        let st = self.state.lock();
        let area = (st.generation % 2) as usize;
        st.poisoned.is_none()
            && st.sealed_since_ckpt == 0
            && st.pending_free.is_empty()
            && st.open.iter().all(|o| o.count == 0)
            && st.dirty[area].iter().all(|&w| w == 0)
    }

    // ---- inspection ----------------------------------------------------

    /// Lets go of the image pages reads have mapped
    /// ([`Backing::unmap_pages`]), so that `posix_fadvise(DONTNEED)` can
    /// drop them from the page cache (`ztier bench blk --cold`).
    pub fn unmap_pages(&self) {
        self.backing.unmap_pages();
    }

    /// Current statistics.
    pub fn stats(&self) -> Stats {
        let maintenance_pending = self.maintenance_pending();
        let st = self.state.lock();
        let bs = self.sb.block_size as u64;
        let (mut data_blocks, mut zero_blocks, mut same_blocks, mut stored) = (0u64, 0u64, 0u64, 0u64);
        for l in &st.table {
            if l.is_data() {
                data_blocks += 1;
                stored += l.len as u64 + RECORD as u64;
            } else if l.extent == ZERO {
                zero_blocks += 1;
            } else if l.extent == SAME {
                same_blocks += 1;
            }
        }
        let used = st.ext.iter().filter(|x| x.state != ExtState::Free).count() as u32;
        let raw = st.ext.iter().filter(|x| x.state != ExtState::Free && x.raw).count() as u32;
        let c = &self.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            logical_size: self.sb.logical_size,
            block_size: self.sb.block_size,
            extent_size: self.sb.extent_size,
            codec: self.codec.name().to_string(),
            provisioned: self.sb.provisioned,
            extents_total: self.sb.extents,
            extents_free: st.free.len() as u32,
            used_extents: used,
            raw_extents: raw,
            high_water_extents: st.high_water,
            data_blocks,
            zero_blocks,
            same_blocks,
            logical_bytes_mapped: data_blocks * bs,
            data_stored_bytes: stored,
            physical_bytes_used: self.sb.data_offset() + used as u64 * self.sb.extent_size as u64,
            file_allocated_bytes: self.backing.allocated_bytes().unwrap_or(0),
            ratio: if stored == 0 { 1.0 } else { (data_blocks * bs) as f64 / stored as f64 },
            raw_writes: g(&c.raw_writes),
            block_writes: g(&c.block_writes),
            fill_writes: g(&c.fill_writes),
            block_reads: g(&c.block_reads),
            extents_sealed: g(&c.extents_sealed),
            cleaner_runs: g(&c.cleaner_runs),
            extents_cleaned: g(&c.extents_cleaned),
            blocks_relocated: g(&c.blocks_relocated),
            cleaner_us: g(&c.cleaner_us),
            checkpoints: g(&c.checkpoints),
            checkpoint_pages_written: g(&c.checkpoint_pages_written),
            checkpoint_us: g(&c.checkpoint_us),
            checkpoint_max_us: g(&c.checkpoint_max_us),
            flushes: g(&c.flushes),
            enospc: g(&c.enospc),
            corrupt_reads: g(&c.corrupt_reads),
            mapped_reads: g(&c.mapped_reads),
            recovered_extents: g(&c.recovered_extents),
            maintenance_pending,
        }
    }

    /// Reads every mapped block back (crc and decode); returns the
    /// problems found. Safe while the image is served: each block is read
    /// as any reader reads it.
    pub fn verify_blocks(&self) -> Result<Vec<String>, BlkError> {
        let n = self.sb.blocks();
        let mut out = vec![0u8; self.block_size()];
        let mut problems = Vec::new();
        for lba in 0..n {
            if self.block_states(lba, 1)[0] == BlockState::Data {
                match self.read_block(lba, &mut out) {
                    Ok(()) => {}
                    Err(e @ BlkError::Corrupt { .. }) => problems.push(e.to_string()),
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(problems)
    }

    /// Offline audit: every mapped block reads back (crc and decode), the
    /// live bytes of every extent match the table, no two blocks overlap,
    /// no extent holds both raw and compressed blocks.
    /// Returns the problems found (empty = clean).
    pub fn check(&self) -> Result<Vec<String>, BlkError> {
        let mut problems = Vec::new();
        let table: Vec<Loc> = self.state.lock().table.clone();
        let n = self.sb.extents as usize;
        let bs = self.sb.block_size as usize;
        let mut live = vec![0u64; n];
        let mut kinds = vec![(false, false); n]; // (raw, compressed) seen
        let mut spans: Vec<(u32, u16, u16, u64)> = Vec::new();
        let mut out = vec![0u8; bs];
        for (lba, l) in table.iter().enumerate() {
            if !l.is_data() {
                continue;
            }
            if l.extent >= self.sb.extents {
                problems.push(format!("block {lba}: extent {} out of range", l.extent));
                continue;
            }
            let raw = l.len as usize == bs;
            let start = if raw { 0 } else { EXT_HEADER };
            if (l.offset as usize) < start
                || l.offset as usize + l.len as usize > self.sb.extent_size as usize
                || (raw && l.offset as usize % bs != 0)
            {
                problems.push(format!("block {lba}: data range out of its extent"));
                continue;
            }
            let k = &mut kinds[l.extent as usize];
            if raw {
                k.0 = true;
            } else {
                k.1 = true;
            }
            live[l.extent as usize] += l.len as u64 + if raw { 0 } else { RECORD as u64 };
            spans.push((l.extent, l.offset, l.len, lba as u64));
            if let Err(e) = self.read_block(lba as u64, &mut out) {
                problems.push(e.to_string());
            }
        }
        spans.sort_unstable();
        for w in spans.windows(2) {
            if w[0].0 == w[1].0 && w[0].1 as u32 + w[0].2 as u32 > w[1].1 as u32 {
                problems.push(format!("blocks {} and {} overlap in extent {}", w[0].3, w[1].3, w[0].0));
            }
        }
        let st = self.state.lock();
        for (e, x) in st.ext.iter().enumerate() {
            if x.live as u64 != live[e] {
                problems.push(format!("extent {e}: live bytes {} but the table says {}", x.live, live[e]));
            }
            if x.state == ExtState::Free && live[e] > 0 {
                problems.push(format!("extent {e} is free but holds live blocks"));
            }
            if kinds[e].0 && kinds[e].1 {
                problems.push(format!("extent {e} holds both raw and compressed blocks"));
            } else if (kinds[e].0 || kinds[e].1) && x.raw != kinds[e].0 {
                problems.push(format!("extent {e}: kind {} but the table says otherwise", x.raw));
            }
        }
        Ok(problems)
    }
}
