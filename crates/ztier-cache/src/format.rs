//! The cache device's format.
//!
//! ```text
//!  offset 0        superblock slot 0 (4 KiB)  ─┐ written alternately; the valid
//!  offset 4096     superblock slot 1 (4 KiB)  ─┘ one with the highest sb_gen is current
//!  ckpt_off        checkpoint slot 0  ─┐ the live lines at a checkpoint; the valid
//!                  checkpoint slot 1  ─┘ one with the highest ckpt_seq is current
//!  journal_off     invalidation journal: a ring of 512-byte sectors
//!  data_off        segment 0, segment 1, … segment N−1   (segment_size each),
//!                  used as a ring: written whole, oldest recycled first
//! ```
//!
//! Everything is little endian and carries the cache's `uuid`: discarding
//! the cache (a new uuid) makes every old segment, journal sector and
//! checkpoint invalid at once.
//!
//! **Superblock** (crc32c of bytes 0..4092 at 4092):
//!
//! ```text
//!   0 magic "ZTCACHE1"   8 version u32 (1)   12 block_size u32 (4096)
//!  16 segment_size u32   20 segments u32     24 lines u64
//!  32 ways u16           34 placement u8 (0 direct, 1 assoc)   35 policy u8 (0 lru, 1 clock)
//!     (ways: a power of two, at most 8 with LRU, 64 with CLOCK; builds
//!     before 64-way sets refuse more than 16 with a clear error)
//!  36 codec u8 (CodecId) 37 state u8 (0 new, 1 serving, 2 stopped clean)
//!  38 flags u8 (bit 0: the journal was synced before each backing write)
//!  40 uuid u64           48 sb_gen u64       56 ckpt_off u64    64 ckpt_size u64
//!  72 journal_off u64    80 journal_size u64 88 data_off u64    96 loc_unit u32
//! 104 backing_size u64 (0: not yet bound)    112 backing_fingerprint u64 (at a clean stop)
//! 120 boot_id [16] (of the machine that served it last)         136 created u64 (unix s)
//! ```
//!
//! **Segment** (`segment_size` bytes; summary entries grow from the
//! front, items from the back; written with one `pwrite` when sealed):
//!
//! ```text
//!  ┌ header (64 B) ─────────────────────────┬ summary, 24 B each ─────────┬ free ┬ items ◄──┐
//!  │ magic "ZCSG" u32 │ version u8 │ 0 u8   │ lba u64 │ gen u64 │ off u32   │      │ item n … │
//!  │ count u16 │ seq u64 │ uuid u64          │ len u16 │ form u8 │ flags u8  │      │ item 0   │
//!  │ 32 B reserved │ crc32c u32 (header with │ (flags bit 0: dead — no     │      │          │
//!  │ crc = 0, then the summary)  │ 4 B     │  longer cached when sealed; │      │          │
//!  │                             │         │  bit 1: dirty when sealed)  │      │          │
//!  └─────────────────────────────────────────┴─────────────────────────────┴──────┴──────────┘
//!
//!  item (at a multiple of loc_unit): lba u64 │ len u16 │ form u8 │ codec u8 │ crc32c u32 │ data (len)
//!       crc32c covers the segment's seq (u64, not stored here), the item's first 12 bytes
//!       and its data; form: 0 zero, 1 same-filled (data = the 8-byte pattern), 2 raw,
//!       3 compressed with `codec`
//! ```
//!
//! The segment's seq in an item's checksum makes an item left on the
//! device by an earlier use of the same segment (a newer one not written
//! yet, or whose write failed) fail its check instead of passing for the
//! item the directory points to.
//!
//! A hit reads one item (header and data in one `pread`) and checks its
//! lba and crc; the summary is what recovery and the ring's recycling read.
//!
//! **Journal sector** (512 bytes; a sector is rewritten in place while
//! records are added to it, which relies on 512-byte writes being atomic):
//!
//! ```text
//!   0 magic "ZCJ1" u32   4 count u16   8 seq u64 (sector sequence, ever growing)
//!  16 uuid u64          24 crc32c u32 (of the sector, crc = 0)
//!  32 records, 16 B each: gen u64 │ lba u48 + (nblocks − 1) u16 in one u64
//! ```
//!
//! A record says "every copy of these blocks with a generation below
//! `gen` is stale". Recovery replays the sectors from the checkpoint's
//! `journal_head` while their seq follows on.
//!
//! **Checkpoint** (crc32c of the header with crc = 0, then the locations):
//!
//! ```text
//!   0 magic "ZCCKPT01"   8 uuid u64   16 ckpt_seq u64   24 covered_seq u64
//!  32 journal_head u64   40 gen u64   48 count u64      56 crc32c u32
//!  64 count × u32: the location of every line cached at the checkpoint, sorted
//! ```
//!
//! A segment with seq below `covered_seq` was on the device when the
//! checkpoint was taken: its items are valid only if listed. Items of
//! later segments are valid unless their summary marks them dead or a
//! journal record from `journal_head` on invalidates them.

use crc32c::crc32c;

/// Superblock magic.
pub const SB_MAGIC: &[u8; 8] = b"ZTCACHE1";
/// Format version.
pub const VERSION: u32 = 1;
/// Most ways of a set (with CLOCK; 8 with LRU).
pub const MAX_WAYS: u16 = 64;
/// Superblock slot size.
pub const SB_SIZE: usize = 4096;
/// Cache block (line) size.
pub const BLOCK: usize = 4096;
/// Segment magic ("ZCSG").
pub const SEG_MAGIC: u32 = 0x4753_435a;
/// Segment header size.
pub const SEG_HEADER: usize = 64;
/// Summary entry size.
pub const ENTRY: usize = 24;
/// Item header size.
pub const ITEM_HEADER: usize = 16;
/// Most items in one segment (bounds the summary).
pub const MAX_ITEMS: usize = 1024;
/// Journal sector size.
pub const SECTOR: usize = 512;
/// Journal sector magic ("ZCJ1").
pub const JOURNAL_MAGIC: u32 = 0x314a_435a;
/// Journal sector header size.
pub const SECTOR_HEADER: usize = 32;
/// Journal record size.
pub const RECORD: usize = 16;
/// Records per journal sector.
pub const RECORDS_PER_SECTOR: usize = (SECTOR - SECTOR_HEADER) / RECORD;
/// Most blocks one journal record covers.
pub const MAX_RECORD_BLOCKS: u64 = 1 << 16;
/// Checkpoint magic.
pub const CKPT_MAGIC: &[u8; 8] = b"ZCCKPT01";
/// Checkpoint header size.
pub const CKPT_HEADER: usize = 64;

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes(b[o..o + 2].try_into().expect("2 bytes"))
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}
fn put16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_le_bytes());
}
fn put32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}

/// Where a block goes in the directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// FlaZ: one possible line per block.
    Direct,
    /// `ways` possible lines per block (a set).
    Assoc,
}

/// Replacement within a set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Pseudo-LRU (a binary tree of W−1 bits per set).
    Lru,
    /// CLOCK: a reference bit per line, a hand per set.
    Clock,
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Placement::Direct => "direct",
            Placement::Assoc => "assoc",
        })
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Policy::Lru => "lru",
            Policy::Clock => "clock",
        })
    }
}

impl std::fmt::Display for SbState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SbState::New => "new",
            SbState::Serving => "serving (or crashed while serving)",
            SbState::Clean => "clean",
        })
    }
}

/// Superblock state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SbState {
    /// Created, never served.
    New,
    /// Being served (or the server crashed).
    Serving,
    /// Stopped cleanly.
    Clean,
}

/// The superblock's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superblock {
    /// Segment size.
    pub segment_size: u32,
    /// Segments.
    pub segments: u32,
    /// Directory lines.
    pub lines: u64,
    /// Ways per set (1 for direct).
    pub ways: u16,
    /// Placement.
    pub placement: Placement,
    /// Policy within a set.
    pub policy: Policy,
    /// Codec tag.
    pub codec: u8,
    /// State.
    pub state: SbState,
    /// The journal was synced before each backing write (survives power loss warm).
    pub journal_sync: bool,
    /// Identity of the cache's current contents.
    pub uuid: u64,
    /// Superblock generation.
    pub sb_gen: u64,
    /// Checkpoint slot 0 offset.
    pub ckpt_off: u64,
    /// Checkpoint slot size.
    pub ckpt_size: u64,
    /// Journal offset.
    pub journal_off: u64,
    /// Journal size.
    pub journal_size: u64,
    /// First segment's offset.
    pub data_off: u64,
    /// Granularity of item locations (bytes).
    pub loc_unit: u32,
    /// Size of the backing the cache holds blocks of (0 = none yet).
    pub backing_size: u64,
    /// Fingerprint of the backing's sample blocks at the last clean stop.
    pub backing_fingerprint: u64,
    /// Boot id of the machine that served it last.
    pub boot_id: [u8; 16],
    /// Creation time (unix seconds).
    pub created: u64,
}

impl Superblock {
    /// Encodes one slot.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SB_SIZE];
        b[0..8].copy_from_slice(SB_MAGIC);
        put32(&mut b, 8, VERSION);
        put32(&mut b, 12, BLOCK as u32);
        put32(&mut b, 16, self.segment_size);
        put32(&mut b, 20, self.segments);
        put64(&mut b, 24, self.lines);
        put16(&mut b, 32, self.ways);
        b[34] = match self.placement {
            Placement::Direct => 0,
            Placement::Assoc => 1,
        };
        b[35] = match self.policy {
            Policy::Lru => 0,
            Policy::Clock => 1,
        };
        b[36] = self.codec;
        b[37] = match self.state {
            SbState::New => 0,
            SbState::Serving => 1,
            SbState::Clean => 2,
        };
        b[38] = u8::from(self.journal_sync);
        put64(&mut b, 40, self.uuid);
        put64(&mut b, 48, self.sb_gen);
        put64(&mut b, 56, self.ckpt_off);
        put64(&mut b, 64, self.ckpt_size);
        put64(&mut b, 72, self.journal_off);
        put64(&mut b, 80, self.journal_size);
        put64(&mut b, 88, self.data_off);
        put32(&mut b, 96, self.loc_unit);
        put64(&mut b, 104, self.backing_size);
        put64(&mut b, 112, self.backing_fingerprint);
        b[120..136].copy_from_slice(&self.boot_id);
        put64(&mut b, 136, self.created);
        let c = crc32c(&b[..SB_SIZE - 4]);
        put32(&mut b, SB_SIZE - 4, c);
        b
    }

    /// Decodes one slot; `Err` says why it is not a valid superblock.
    pub fn decode(b: &[u8]) -> Result<Superblock, String> {
        if b.len() < SB_SIZE || &b[0..8] != SB_MAGIC {
            return Err("no ztier cache magic".into());
        }
        if crc32c(&b[..SB_SIZE - 4]) != u32_at(b, SB_SIZE - 4) {
            return Err("superblock checksum mismatch".into());
        }
        let v = u32_at(b, 8);
        if v != VERSION {
            return Err(format!("cache format version {v}, this build reads {VERSION}"));
        }
        if u32_at(b, 12) != BLOCK as u32 {
            return Err(format!("block size {}, this build uses {BLOCK}", u32_at(b, 12)));
        }
        let sb = Superblock {
            segment_size: u32_at(b, 16),
            segments: u32_at(b, 20),
            lines: u64_at(b, 24),
            ways: u16_at(b, 32),
            placement: match b[34] {
                0 => Placement::Direct,
                1 => Placement::Assoc,
                x => return Err(format!("unknown placement {x}")),
            },
            policy: match b[35] {
                0 => Policy::Lru,
                1 => Policy::Clock,
                x => return Err(format!("unknown policy {x}")),
            },
            codec: b[36],
            state: match b[37] {
                0 => SbState::New,
                1 => SbState::Serving,
                2 => SbState::Clean,
                x => return Err(format!("unknown state {x}")),
            },
            journal_sync: b[38] & 1 != 0,
            uuid: u64_at(b, 40),
            sb_gen: u64_at(b, 48),
            ckpt_off: u64_at(b, 56),
            ckpt_size: u64_at(b, 64),
            journal_off: u64_at(b, 72),
            journal_size: u64_at(b, 80),
            data_off: u64_at(b, 88),
            loc_unit: u32_at(b, 96),
            backing_size: u64_at(b, 104),
            backing_fingerprint: u64_at(b, 112),
            boot_id: b[120..136].try_into().expect("16 bytes"),
            created: u64_at(b, 136),
        };
        sb.validate()?;
        Ok(sb)
    }

    /// Checks the geometry.
    pub fn validate(&self) -> Result<(), String> {
        let ss = self.segment_size as u64;
        if !ss.is_power_of_two() || !(16384..=(16 << 20)).contains(&ss) {
            return Err(format!("segment size {ss}: a power of two from 16K to 16M"));
        }
        if self.segments < 4 {
            return Err(format!("{} segments: at least 4", self.segments));
        }
        if self.ways == 0 || self.ways > MAX_WAYS || !self.ways.is_power_of_two() {
            return Err(format!("{} ways: a power of two up to {MAX_WAYS}", self.ways));
        }
        if self.ways > 8 && self.policy == Policy::Lru {
            return Err(format!("{} ways with LRU: at most 8 ({MAX_WAYS} with CLOCK)", self.ways));
        }
        if (self.placement == Placement::Direct) != (self.ways == 1) {
            return Err("direct placement has exactly one way".into());
        }
        if self.lines == 0 || self.lines % self.ways as u64 != 0 || self.lines >= u32::MAX as u64 {
            return Err(format!("{} lines for {} ways", self.lines, self.ways));
        }
        let lu = self.loc_unit as u64;
        if !lu.is_power_of_two() || !(32..=4096).contains(&lu) {
            return Err(format!("location unit {lu}"));
        }
        let data_units = self.segments as u64 * ss / lu;
        if data_units >= u32::MAX as u64 {
            return Err("too much data for the location unit".into());
        }
        if self.ckpt_size < (CKPT_HEADER as u64 + 4 * self.lines) {
            return Err("checkpoint slots too small for the lines".into());
        }
        let ends = [
            (2 * SB_SIZE as u64, self.ckpt_off),
            (self.ckpt_off + 2 * self.ckpt_size, self.journal_off),
            (self.journal_off + self.journal_size, self.data_off),
        ];
        for (end, next) in ends {
            if next < end || next % 4096 != 0 {
                return Err("overlapping or unaligned areas".into());
            }
        }
        if self.journal_size < 8 * SECTOR as u64 || self.journal_size % SECTOR as u64 != 0 {
            return Err("journal too small".into());
        }
        Ok(())
    }

    /// Byte offset of segment `s`.
    pub fn segment_offset(&self, s: u32) -> u64 {
        self.data_off + s as u64 * self.segment_size as u64
    }

    /// Bytes of the whole device.
    pub fn device_size(&self) -> u64 {
        self.segment_offset(self.segments)
    }

    /// Journal sectors.
    pub fn journal_sectors(&self) -> u64 {
        self.journal_size / SECTOR as u64
    }

    /// Byte offset of the journal sector of sequence `seq`.
    pub fn sector_offset(&self, seq: u64) -> u64 {
        self.journal_off + (seq % self.journal_sectors()) * SECTOR as u64
    }

    /// Location units per segment.
    pub fn units_per_segment(&self) -> u32 {
        self.segment_size / self.loc_unit
    }
}

/// What the geometry is computed from.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    /// Total bytes of the cache device.
    pub size: u64,
    /// Segment size.
    pub segment_size: u32,
    /// Directory lines per 4 KiB of segment space (the compression the
    /// directory is sized for).
    pub lines_per_block: f64,
    /// Placement.
    pub placement: Placement,
    /// Ways (1 for direct).
    pub ways: u16,
    /// Policy within a set.
    pub policy: Policy,
    /// Codec tag.
    pub codec: u8,
    /// Journal size (default: 1/256 of the device, 256 KiB to 64 MiB).
    pub journal_size: Option<u64>,
}

fn round4k(x: u64) -> u64 {
    x.next_multiple_of(4096)
}

impl Geometry {
    /// Lays out a device of `size` bytes: journal 1/256 of it (256 KiB to
    /// 64 MiB), two checkpoint slots for the lines, the rest segments.
    pub fn superblock(&self, uuid: u64, created: u64) -> Result<Superblock, String> {
        let ss = self.segment_size as u64;
        let journal = round4k(self.journal_size.unwrap_or((self.size / 256).clamp(256 << 10, 64 << 20)));
        let mut data = self.size.saturating_sub(2 * SB_SIZE as u64 + journal);
        let mut lines = 0;
        let mut ckpt = 0;
        for _ in 0..4 {
            let segs = data / ss;
            let blocks = segs * ss / BLOCK as u64;
            lines = ((blocks as f64 * self.lines_per_block) as u64) / self.ways as u64 * self.ways as u64;
            ckpt = round4k(CKPT_HEADER as u64 + 4 * lines);
            data = self.size.saturating_sub(2 * SB_SIZE as u64 + 2 * ckpt + journal);
        }
        let segments = data / ss;
        if segments < 4 {
            return Err(format!(
                "cache size {} too small: it needs at least 4 segments of {} after its metadata",
                self.size, ss
            ));
        }
        let mut loc_unit = 32u64;
        while segments * ss / loc_unit >= u32::MAX as u64 {
            loc_unit *= 2;
        }
        let ckpt_off = 2 * SB_SIZE as u64;
        let journal_off = ckpt_off + 2 * ckpt;
        let sb = Superblock {
            segment_size: self.segment_size,
            segments: segments.min(u32::MAX as u64 - 1) as u32,
            lines,
            ways: self.ways,
            placement: self.placement,
            policy: self.policy,
            codec: self.codec,
            state: SbState::New,
            journal_sync: false,
            uuid,
            sb_gen: 1,
            ckpt_off,
            ckpt_size: ckpt,
            journal_off,
            journal_size: journal,
            data_off: journal_off + journal,
            loc_unit: loc_unit as u32,
            backing_size: 0,
            backing_fingerprint: 0,
            boot_id: [0; 16],
            created,
        };
        sb.validate()?;
        Ok(sb)
    }
}

// ---- segments ---------------------------------------------------------------

/// How an item's block is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Form {
    /// All zeros (no data).
    Zero = 0,
    /// Every 8-byte word is the pattern in the data (8 bytes).
    Same = 1,
    /// Uncompressed (4096 bytes).
    Raw = 2,
    /// Compressed with the item's codec.
    Compressed = 3,
}

impl TryFrom<u8> for Form {
    type Error = String;
    fn try_from(b: u8) -> Result<Form, String> {
        match b {
            0 => Ok(Form::Zero),
            1 => Ok(Form::Same),
            2 => Ok(Form::Raw),
            3 => Ok(Form::Compressed),
            x => Err(format!("unknown item form {x}")),
        }
    }
}

/// One summary entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Backing block.
    pub lba: u64,
    /// Generation at insertion.
    pub gen: u64,
    /// Byte offset of the item in the segment.
    pub off: u32,
    /// Data length.
    pub len: u16,
    /// Form.
    pub form: Form,
    /// Not cached any more when the segment was sealed.
    pub dead: bool,
    /// Dirty when the segment was sealed (write-back: newer than the
    /// backing; recovery writes it back).
    pub dirty: bool,
}

impl Entry {
    /// Encodes into 24 bytes.
    pub fn put(&self, b: &mut [u8]) {
        put64(b, 0, self.lba);
        put64(b, 8, self.gen);
        put32(b, 16, self.off);
        put16(b, 20, self.len);
        b[22] = self.form as u8;
        b[23] = u8::from(self.dead) | u8::from(self.dirty) << 1;
    }
    /// Decodes 24 bytes.
    pub fn get(b: &[u8]) -> Result<Entry, String> {
        Ok(Entry {
            lba: u64_at(b, 0),
            gen: u64_at(b, 8),
            off: u32_at(b, 16),
            len: u16_at(b, 20),
            form: Form::try_from(b[22])?,
            dead: b[23] & 1 != 0,
            dirty: b[23] & 2 != 0,
        })
    }
}

/// Bytes an item takes in a segment (header + data, rounded to `unit`).
pub fn item_span(len: usize, unit: u32) -> usize {
    (ITEM_HEADER + len).next_multiple_of(unit as usize)
}

/// Writes an item (header + data) of the segment of sequence `seq` at
/// the start of `b`.
pub fn put_item(b: &mut [u8], seq: u64, lba: u64, form: Form, codec: u8, data: &[u8]) {
    put64(b, 0, lba);
    put16(b, 8, data.len() as u16);
    b[10] = form as u8;
    b[11] = codec;
    b[ITEM_HEADER..ITEM_HEADER + data.len()].copy_from_slice(data);
    let c = item_crc(seq, &b[..12], data);
    put32(b, 12, c);
}

fn item_crc(seq: u64, head: &[u8], data: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c_append(crc32c(&seq.to_le_bytes()), head), data)
}

/// A checked item header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemHeader {
    /// Backing block.
    pub lba: u64,
    /// Data length.
    pub len: u16,
    /// Form.
    pub form: Form,
    /// Codec of a compressed item.
    pub codec: u8,
}

/// Parses and verifies the item at the start of `b` (its data must be in
/// `b` too), of the segment of sequence `seq`. Returns the header and the data.
pub fn get_item(b: &[u8], seq: u64) -> Result<(ItemHeader, &[u8]), String> {
    if b.len() < ITEM_HEADER {
        return Err("item cut short".into());
    }
    let len = u16_at(b, 8) as usize;
    if len > BLOCK || ITEM_HEADER + len > b.len() {
        return Err(format!("item length {len} out of range"));
    }
    let data = &b[ITEM_HEADER..ITEM_HEADER + len];
    if item_crc(seq, &b[..12], data) != u32_at(b, 12) {
        return Err("item checksum mismatch".into());
    }
    let form = Form::try_from(b[10])?;
    let ok = match form {
        Form::Zero => len == 0,
        Form::Same => len == 8,
        Form::Raw => len == BLOCK,
        Form::Compressed => len > 0 && len < BLOCK,
    };
    if !ok {
        return Err(format!("item form {form:?} with length {len}"));
    }
    Ok((ItemHeader { lba: u64_at(b, 0), len: len as u16, form, codec: b[11] }, data))
}

/// Seals a segment buffer: writes its header (count, seq, uuid) and the crc
/// over the header and summary.
pub fn seal_segment(buf: &mut [u8], count: usize, seq: u64, uuid: u64) {
    put32(buf, 0, SEG_MAGIC);
    buf[4] = 1;
    buf[5] = 0;
    put16(buf, 6, count as u16);
    put64(buf, 8, seq);
    put64(buf, 16, uuid);
    buf[24..60].fill(0);
    put32(buf, 60, 0);
    let end = SEG_HEADER + count * ENTRY;
    let c = crc32c(&buf[..end]);
    put32(buf, 60, c);
}

/// The header of a segment: `(count, seq, uuid)` if the magic is right.
/// (The crc needs the summary: see [`parse_summary`].)
pub fn peek_segment(head: &[u8]) -> Option<(usize, u64, u64)> {
    if head.len() < SEG_HEADER || u32_at(head, 0) != SEG_MAGIC || head[4] != 1 {
        return None;
    }
    let count = u16_at(head, 6) as usize;
    (count <= MAX_ITEMS).then(|| (count, u64_at(head, 8), u64_at(head, 16)))
}

/// Bytes to read for a segment's header and summary of `count` entries.
pub fn summary_len(count: usize) -> usize {
    SEG_HEADER + count * ENTRY
}

/// Parses a segment's header and summary (`b` holds at least
/// [`summary_len`] bytes); `None` if the magic, the crc or an entry is
/// bad (a torn or never-written segment).
pub fn parse_summary(b: &[u8], segment_size: u32) -> Option<(u64, u64, Vec<Entry>)> {
    let (count, seq, uuid) = peek_segment(b)?;
    let end = summary_len(count);
    if b.len() < end {
        return None;
    }
    let mut h = b[..end].to_vec();
    put32(&mut h, 60, 0);
    if crc32c(&h) != u32_at(b, 60) {
        return None;
    }
    let mut v = Vec::with_capacity(count);
    for i in 0..count {
        let e = Entry::get(&b[SEG_HEADER + i * ENTRY..]).ok()?;
        if (e.off as usize) < end || e.off as usize + ITEM_HEADER + e.len as usize > segment_size as usize {
            return None;
        }
        v.push(e);
    }
    Some((seq, uuid, v))
}

// ---- journal -----------------------------------------------------------------

/// One invalidation: copies of blocks `[lba, lba + n)` older than `gen` are stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Invalidation {
    /// Generation of the write (or trim) that made them stale.
    pub gen: u64,
    /// First block.
    pub lba: u64,
    /// Blocks (1 to [`MAX_RECORD_BLOCKS`]).
    pub n: u64,
}

/// Encodes a journal sector.
pub fn encode_sector(seq: u64, uuid: u64, recs: &[Invalidation]) -> [u8; SECTOR] {
    assert!(recs.len() <= RECORDS_PER_SECTOR);
    let mut b = [0u8; SECTOR];
    put32(&mut b, 0, JOURNAL_MAGIC);
    put16(&mut b, 4, recs.len() as u16);
    put64(&mut b, 8, seq);
    put64(&mut b, 16, uuid);
    for (i, r) in recs.iter().enumerate() {
        let o = SECTOR_HEADER + i * RECORD;
        debug_assert!(r.n >= 1 && r.n <= MAX_RECORD_BLOCKS && r.lba < 1 << 48);
        put64(&mut b, o, r.gen);
        put64(&mut b, o + 8, r.lba | (r.n - 1) << 48);
    }
    let c = crc32c(&b);
    put32(&mut b, 24, c);
    b
}

/// Decodes a journal sector: `(seq, uuid, records)` if valid.
pub fn decode_sector(b: &[u8]) -> Option<(u64, u64, Vec<Invalidation>)> {
    if b.len() < SECTOR || u32_at(b, 0) != JOURNAL_MAGIC {
        return None;
    }
    let count = u16_at(b, 4) as usize;
    if count > RECORDS_PER_SECTOR {
        return None;
    }
    let mut c = b[..SECTOR].to_vec();
    put32(&mut c, 24, 0);
    if crc32c(&c) != u32_at(b, 24) {
        return None;
    }
    let recs = (0..count)
        .map(|i| {
            let o = SECTOR_HEADER + i * RECORD;
            let x = u64_at(b, o + 8);
            Invalidation { gen: u64_at(b, o), lba: x & ((1 << 48) - 1), n: (x >> 48) + 1 }
        })
        .collect();
    Some((u64_at(b, 8), u64_at(b, 16), recs))
}

// ---- checkpoints -----------------------------------------------------------

/// A checkpoint's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpoint {
    /// Cache identity.
    pub uuid: u64,
    /// Ever-growing sequence (the highest valid slot wins).
    pub ckpt_seq: u64,
    /// Segments with a lower seq were on the device at the checkpoint.
    pub covered_seq: u64,
    /// First journal sector to replay.
    pub journal_head: u64,
    /// Generation at the checkpoint.
    pub gen: u64,
}

/// Encodes a checkpoint with the sorted live locations.
pub fn encode_checkpoint(c: &Checkpoint, locs: &[u32]) -> Vec<u8> {
    let mut b = vec![0u8; (CKPT_HEADER + 4 * locs.len()).next_multiple_of(4096)];
    b[0..8].copy_from_slice(CKPT_MAGIC);
    put64(&mut b, 8, c.uuid);
    put64(&mut b, 16, c.ckpt_seq);
    put64(&mut b, 24, c.covered_seq);
    put64(&mut b, 32, c.journal_head);
    put64(&mut b, 40, c.gen);
    put64(&mut b, 48, locs.len() as u64);
    for (i, l) in locs.iter().enumerate() {
        put32(&mut b, CKPT_HEADER + 4 * i, *l);
    }
    let end = CKPT_HEADER + 4 * locs.len();
    let c = crc32c(&b[..end]);
    put32(&mut b, 56, c);
    b
}

/// The header of a checkpoint slot and its location count, if the magic
/// is right (`b` holds at least the header).
pub fn peek_checkpoint(b: &[u8]) -> Option<(Checkpoint, u64)> {
    if b.len() < CKPT_HEADER || &b[0..8] != CKPT_MAGIC {
        return None;
    }
    Some((
        Checkpoint {
            uuid: u64_at(b, 8),
            ckpt_seq: u64_at(b, 16),
            covered_seq: u64_at(b, 24),
            journal_head: u64_at(b, 32),
            gen: u64_at(b, 40),
        },
        u64_at(b, 48),
    ))
}

/// Decodes a whole checkpoint slot; `None` if damaged.
pub fn decode_checkpoint(b: &[u8]) -> Option<(Checkpoint, Vec<u32>)> {
    let (c, count) = peek_checkpoint(b)?;
    let end = CKPT_HEADER.checked_add(usize::try_from(count).ok()?.checked_mul(4)?)?;
    if b.len() < end {
        return None;
    }
    let mut h = b[..end].to_vec();
    put32(&mut h, 56, 0);
    if crc32c(&h) != u32_at(b, 56) {
        return None;
    }
    let locs: Vec<u32> = (0..count as usize).map(|i| u32_at(b, CKPT_HEADER + 4 * i)).collect();
    if locs.windows(2).any(|w| w[0] >= w[1]) {
        return None;
    }
    Some((c, locs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geom() -> Geometry {
        Geometry {
            size: 64 << 20,
            segment_size: 128 << 10,
            lines_per_block: 2.0,
            placement: Placement::Assoc,
            ways: 8,
            policy: Policy::Clock,
            codec: 4,
            journal_size: None,
        }
    }

    #[test]
    fn geometry_fits_and_superblock_round_trips() {
        let sb = geom().superblock(42, 7).unwrap();
        assert!(sb.device_size() <= 64 << 20);
        assert!(sb.device_size() > 60 << 20, "{sb:?}");
        assert_eq!(sb.lines % 8, 0);
        assert!(sb.lines as f64 >= 1.9 * (sb.segments as f64 * 32.0));
        let mut b = sb.encode();
        assert_eq!(Superblock::decode(&b).unwrap(), sb);
        b[100] ^= 1;
        assert!(Superblock::decode(&b).unwrap_err().contains("checksum"));
        assert!(Geometry { size: 600 << 10, ..geom() }.superblock(1, 1).is_err());
        // A terabyte cache gets a bigger location unit.
        let big = Geometry { size: 1 << 40, segment_size: 1 << 20, ..geom() }.superblock(1, 1).unwrap();
        assert!(big.loc_unit >= 256, "{big:?}");
    }

    #[test]
    fn items_and_summaries_round_trip_and_catch_damage() {
        let mut seg = vec![0u8; 128 << 10];
        let data = [9u8; 1000];
        let off = seg.len() - item_span(data.len(), 32);
        put_item(&mut seg[off..], 12, 77, Form::Compressed, 4, &data);
        let e = Entry {
            lba: 77,
            gen: 5,
            off: off as u32,
            len: 1000,
            form: Form::Compressed,
            dead: false,
            dirty: true,
        };
        e.put(&mut seg[SEG_HEADER..]);
        seal_segment(&mut seg, 1, 12, 99);
        let (seq, uuid, es) = parse_summary(&seg, 128 << 10).unwrap();
        assert_eq!((seq, uuid, es), (12, 99, vec![e]));
        let (h, d) = get_item(&seg[off..], 12).unwrap();
        assert_eq!((h.lba, h.len, h.form, h.codec), (77, 1000, Form::Compressed, 4));
        assert_eq!(d, &data[..]);
        assert!(get_item(&seg[off..], 13).is_err(), "an item of another use of the segment");
        let mut bad = seg.clone();
        bad[off + 500] ^= 1;
        assert!(get_item(&bad[off..], 12).is_err());
        let mut bad = seg.clone();
        bad[SEG_HEADER + 3] ^= 1;
        assert!(parse_summary(&bad, 128 << 10).is_none());
    }

    #[test]
    fn journal_sectors_and_checkpoints_round_trip() {
        let recs = vec![
            Invalidation { gen: 10, lba: 5, n: 1 },
            Invalidation { gen: 11, lba: (1 << 48) - 1, n: MAX_RECORD_BLOCKS },
        ];
        let s = encode_sector(33, 7, &recs);
        assert_eq!(decode_sector(&s), Some((33, 7, recs)));
        let mut bad = s;
        bad[40] ^= 1;
        assert_eq!(decode_sector(&bad), None);
        let c = Checkpoint { uuid: 1, ckpt_seq: 2, covered_seq: 3, journal_head: 4, gen: 5 };
        let b = encode_checkpoint(&c, &[1, 5, 9]);
        assert_eq!(decode_checkpoint(&b), Some((c, vec![1, 5, 9])));
        let mut bad = b.clone();
        bad[CKPT_HEADER + 1] ^= 1;
        assert_eq!(decode_checkpoint(&bad), None);
    }
}
