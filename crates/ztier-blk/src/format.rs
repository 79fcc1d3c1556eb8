//! The image format (version 2).
//!
//! ```text
//!  offset 0        superblock slot 0 (4 KiB)   ─┐ two slots, written alternately;
//!  offset 4096     superblock slot 1 (4 KiB)   ─┘ the valid one with the highest
//!                                                 generation is current
//!  offset 8192     checkpoint area 0  ─┐ the logical-to-physical table at a
//!                  checkpoint area 1  ─┘ checkpoint (area = generation % 2)
//!  data_offset     extent 0, extent 1, … extent N−1   (extent_size each)
//! ```
//!
//! Superblock (little endian; crc32c of bytes 0..4092 at 4092):
//!
//! ```text
//!   0 magic "ZTIERBLK"   8 version u32 (2)   12 block_size u32   16 extent_size u32
//!  20 codec u8 (CodecId) 21 provisioned u8 (1 = every logical block can be
//!     rewritten raw without ENOSPC)          24 logical_size u64 (bytes)
//!  32 extents u32        36 table_pages u32 (4 KiB pages per checkpoint area)
//!  40 generation u64     48 next_seq u64 (extents opened after this checkpoint
//!     have seq ≥ next_seq)                   56 next_wseq u64 (write counter)
//!  64 uuid u64 (random at create; in every log extent's header)
//! ```
//!
//! Version 1 images (no uuid, raw blocks beside compressed ones, whole-table
//! checkpoints with one crc) are refused with a message naming the version:
//! copy their data out with the build that made them.
//!
//! Checkpoint area: `table_pages` pages of 4 KiB, each on its own, so a
//! checkpoint rewrites only the pages whose entries changed since that
//! area was last written (incremental checkpoints). `create` writes area 1
//! as generation 1 and area 0 as generation 2 (the first checkpoint's),
//! both with every block unmapped; a page of an area is compared with the
//! table, not trusted, before a checkpoint leaves it as it is. A page:
//!
//! ```text
//!   0 generation u64 (of the checkpoint that wrote it; ≤ the superblock's,
//!     same parity as the area)    8 crc32c u32 (of the page, this field 0)
//!  12 page index u32             16 340 entries of 12 bytes (blocks
//!                                   340·index … 340·index + 339)
//! ```
//!
//! An entry: extent u32 (0xffffffff unmapped, 0xfffffffe zero, 0xfffffffd
//! same-filled), then 8 bytes: offset u16, len u16, crc32c u32 of the
//! stored bytes (data), or the 8-byte fill pattern u64 (same-filled).
//!
//! Extents are of two kinds. A **log extent** holds records and compressed
//! blocks; records grow from the front, data from the back, so a block's
//! record and its bytes share one write:
//!
//! ```text
//!  ┌────────────── header (32 B) ──────────────────┬── records, 32 B each ──┬─ free ─┬─ data ◄─┐
//!  │ magic "ZEXT" u32 │ count u32 │ seq u64        │ see below              │        │ block n … │
//!  │ crc32c u32 (header+records, crc = 0)          │                        │        │ block 0  │
//!  │ extent index u32 │ uuid u64 (the superblock's)│                        │        │          │
//!  └───────────────────────────────────────────────┴────────────────────────┴────────┴──────────┘
//! ```
//!
//! A **raw extent** holds `extent_size / block_size` blocks stored as they
//! are and nothing else (incompressible data costs its size plus a 32-byte
//! record); the records of its blocks are in log extents. Which extents are
//! raw is known from the table and the records, never from the extent's
//! bytes (a raw block may look like anything, even a log extent header of
//! another image: the uuid and the index keep those from being replayed).
//!
//! A record (32 bytes):
//!
//! ```text
//!   0 lba u64    8 wseq u64    16 nblocks u32 (zero, trim, same) | extent u32 (compressed, raw)
//!  20 kind u8    21 reserved (3 B)
//!  24 offset u16, len u16, crc32c u32 of the data (compressed, raw) | pattern u64 (same)
//! ```
//!
//! Record kinds: 0 compressed (codec of the image, data in this extent), 1
//! raw (a whole block in raw extent `extent` at `offset`), 2 zero (nblocks
//! blocks from lba read as zeros), 3 trim (nblocks blocks unmapped), 4 same
//! (nblocks blocks filled with the 8-byte pattern). `wseq` orders every
//! record ever written: at recovery the highest wins, whatever the order
//! extents were sealed in.

use crc32c::crc32c;

/// Superblock magic.
pub const SB_MAGIC: &[u8; 8] = b"ZTIERBLK";
/// Extent magic ("ZEXT").
pub const EXT_MAGIC: u32 = 0x5A45_5854;
/// Format version.
pub const VERSION: u32 = 2;
/// Superblock slot size.
pub const SB_SIZE: usize = 4096;
/// Extent header size.
pub const EXT_HEADER: usize = 32;
/// Record size.
pub const RECORD: usize = 32;
/// Checkpoint page size.
pub const CKPT_PAGE: usize = 4096;
/// Checkpoint page header size.
pub const CKPT_PAGE_HEADER: usize = 16;
/// Checkpoint entry size.
pub const ENTRY: usize = 12;
/// Entries per checkpoint page.
pub const ENTRIES_PER_PAGE: usize = (CKPT_PAGE - CKPT_PAGE_HEADER) / ENTRY;

/// Extent value of an unmapped block (reads zero, a hole).
pub const UNMAPPED: u32 = u32::MAX;
/// Extent value of a block written as zeros (metadata only).
pub const ZERO: u32 = u32::MAX - 1;
/// Extent value of a same-filled block (metadata only).
pub const SAME: u32 = u32::MAX - 2;

/// Record kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Compressed with the image's codec, in this extent.
    Compressed = 0,
    /// A whole block as is, in a raw extent.
    Raw = 1,
    /// `nblocks` blocks read as zeros.
    Zero = 2,
    /// `nblocks` blocks unmapped.
    Trim = 3,
    /// `nblocks` blocks filled with an 8-byte pattern.
    Same = 4,
}

impl TryFrom<u8> for Kind {
    type Error = u8;
    fn try_from(b: u8) -> Result<Kind, u8> {
        match b {
            0 => Ok(Kind::Compressed),
            1 => Ok(Kind::Raw),
            2 => Ok(Kind::Zero),
            3 => Ok(Kind::Trim),
            4 => Ok(Kind::Same),
            _ => Err(b),
        }
    }
}

impl Kind {
    /// Whether records of this kind cover a range of blocks (no data).
    pub fn is_range(self) -> bool {
        matches!(self, Kind::Zero | Kind::Trim | Kind::Same)
    }
}

/// Where a logical block lives (12 bytes in RAM and in checkpoints).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loc {
    /// Extent index, or [`UNMAPPED`] / [`ZERO`] / [`SAME`].
    pub extent: u32,
    /// Byte offset of the data in the extent (low 16 bits of the pattern
    /// when same-filled).
    pub offset: u16,
    /// Stored length (= block size: raw; bits 16..32 of the pattern when
    /// same-filled).
    pub len: u16,
    /// crc32c of the stored bytes (high 32 bits of the pattern when
    /// same-filled).
    pub crc: u32,
}

impl Loc {
    /// Not mapped.
    pub const NONE: Loc = Loc { extent: UNMAPPED, offset: 0, len: 0, crc: 0 };
    /// Written as zeros.
    pub const ZEROED: Loc = Loc { extent: ZERO, offset: 0, len: 0, crc: 0 };

    /// Filled with `pattern` (little endian, repeated).
    pub fn same(pattern: u64) -> Loc {
        Loc { extent: SAME, offset: pattern as u16, len: (pattern >> 16) as u16, crc: (pattern >> 32) as u32 }
    }

    /// The fill pattern of a same-filled block.
    pub fn pattern(&self) -> u64 {
        self.offset as u64 | (self.len as u64) << 16 | (self.crc as u64) << 32
    }

    /// Whether data is stored for it.
    pub fn is_data(&self) -> bool {
        self.extent < SAME
    }

    /// Encodes into 12 bytes.
    pub fn put(&self, b: &mut [u8]) {
        b[0..4].copy_from_slice(&self.extent.to_le_bytes());
        b[4..6].copy_from_slice(&self.offset.to_le_bytes());
        b[6..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..12].copy_from_slice(&self.crc.to_le_bytes());
    }

    /// Decodes 12 bytes.
    pub fn get(b: &[u8]) -> Loc {
        Loc {
            extent: u32_at(b, 0),
            offset: u16::from_le_bytes([b[4], b[5]]),
            len: u16::from_le_bytes([b[6], b[7]]),
            crc: u32_at(b, 8),
        }
    }
}

/// The superblock's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superblock {
    /// Logical block size.
    pub block_size: u32,
    /// Extent size.
    pub extent_size: u32,
    /// Codec tag.
    pub codec: u8,
    /// Every block can be rewritten raw without ENOSPC.
    pub provisioned: bool,
    /// Logical size in bytes.
    pub logical_size: u64,
    /// Extents.
    pub extents: u32,
    /// Pages per checkpoint area.
    pub table_pages: u32,
    /// Checkpoint generation.
    pub generation: u64,
    /// First extent seq not covered by the checkpoint.
    pub next_seq: u64,
    /// Next record write counter.
    pub next_wseq: u64,
    /// The image's identity (in every log extent header).
    pub uuid: u64,
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

impl Superblock {
    /// Blocks of the logical device.
    pub fn blocks(&self) -> u64 {
        self.logical_size / self.block_size as u64
    }

    /// Byte offset of checkpoint area `a` (0 or 1).
    pub fn area_offset(&self, a: u64) -> u64 {
        2 * SB_SIZE as u64 + a * self.table_pages as u64 * CKPT_PAGE as u64
    }

    /// Byte offset of page `p` of checkpoint area `a`.
    pub fn page_offset(&self, a: u64, p: u32) -> u64 {
        self.area_offset(a) + p as u64 * CKPT_PAGE as u64
    }

    /// Byte offset of the first extent.
    pub fn data_offset(&self) -> u64 {
        self.area_offset(2).next_multiple_of(4096)
    }

    /// Byte offset of extent `e`.
    pub fn extent_offset(&self, e: u32) -> u64 {
        self.data_offset() + e as u64 * self.extent_size as u64
    }

    /// Blocks a raw extent holds.
    pub fn raw_slots(&self) -> u32 {
        self.extent_size / self.block_size
    }

    /// Pages one checkpoint area needs for `blocks` blocks.
    pub fn table_pages_for(blocks: u64) -> u32 {
        blocks.div_ceil(ENTRIES_PER_PAGE as u64).max(1) as u32
    }

    /// Encodes one slot.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SB_SIZE];
        b[0..8].copy_from_slice(SB_MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.block_size.to_le_bytes());
        b[16..20].copy_from_slice(&self.extent_size.to_le_bytes());
        b[20] = self.codec;
        b[21] = u8::from(self.provisioned);
        b[24..32].copy_from_slice(&self.logical_size.to_le_bytes());
        b[32..36].copy_from_slice(&self.extents.to_le_bytes());
        b[36..40].copy_from_slice(&self.table_pages.to_le_bytes());
        b[40..48].copy_from_slice(&self.generation.to_le_bytes());
        b[48..56].copy_from_slice(&self.next_seq.to_le_bytes());
        b[56..64].copy_from_slice(&self.next_wseq.to_le_bytes());
        b[64..72].copy_from_slice(&self.uuid.to_le_bytes());
        let c = crc32c(&b[..SB_SIZE - 4]);
        b[SB_SIZE - 4..].copy_from_slice(&c.to_le_bytes());
        b
    }

    /// Decodes one slot; `Err` says why it is not a valid superblock.
    pub fn decode(b: &[u8]) -> Result<Superblock, String> {
        if b.len() < SB_SIZE || &b[0..8] != SB_MAGIC {
            return Err("no ztier block image magic".into());
        }
        if crc32c(&b[..SB_SIZE - 4]) != u32_at(b, SB_SIZE - 4) {
            return Err("superblock checksum mismatch".into());
        }
        let v = u32_at(b, 8);
        if v != VERSION {
            return Err(format!(
                "image format version {v}; this build reads version {VERSION} only (copy the data \
                 out with the build that made the image, into an image made by this one)"
            ));
        }
        let sb = Superblock {
            block_size: u32_at(b, 12),
            extent_size: u32_at(b, 16),
            codec: b[20],
            provisioned: b[21] != 0,
            logical_size: u64_at(b, 24),
            extents: u32_at(b, 32),
            table_pages: u32_at(b, 36),
            generation: u64_at(b, 40),
            next_seq: u64_at(b, 48),
            next_wseq: u64_at(b, 56),
            uuid: u64_at(b, 64),
        };
        sb.validate()?;
        Ok(sb)
    }

    /// Checks the geometry.
    pub fn validate(&self) -> Result<(), String> {
        let bs = self.block_size;
        if !bs.is_power_of_two() || !(512..=32768).contains(&bs) {
            return Err(format!("block size {bs}: a power of two from 512 to 32K"));
        }
        let es = self.extent_size;
        if !es.is_power_of_two() || es > 65536 || (es as usize) < EXT_HEADER + RECORD + bs as usize {
            return Err(format!(
                "extent size {es}: a power of two, at most 64K, holding a raw block and its record"
            ));
        }
        if self.logical_size == 0 || self.logical_size % bs as u64 != 0 {
            return Err(format!("logical size {}: a positive multiple of the block size", self.logical_size));
        }
        if self.table_pages < Self::table_pages_for(self.blocks()) {
            return Err("checkpoint area too small for the logical size".into());
        }
        if self.extents < 4 {
            return Err("fewer than 4 extents".into());
        }
        Ok(())
    }
}

/// One record of a log extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// First logical block.
    pub lba: u64,
    /// Write counter.
    pub wseq: u64,
    /// Kind.
    pub kind: Kind,
    /// Blocks covered (range kinds; 1 for data).
    pub nblocks: u32,
    /// Extent holding the data (data kinds).
    pub extent: u32,
    /// Data offset in that extent.
    pub offset: u16,
    /// Data length.
    pub len: u16,
    /// crc32c of the data.
    pub crc: u32,
    /// Fill pattern ([`Kind::Same`]).
    pub pattern: u64,
}

impl Record {
    /// A data record.
    pub fn data(lba: u64, wseq: u64, kind: Kind, extent: u32, offset: u16, len: u16, crc: u32) -> Record {
        Record { lba, wseq, kind, nblocks: 1, extent, offset, len, crc, pattern: 0 }
    }

    /// A range record (zero, trim, same with `pattern`).
    pub fn range(lba: u64, wseq: u64, kind: Kind, nblocks: u32, pattern: u64) -> Record {
        Record { lba, wseq, kind, nblocks, extent: 0, offset: 0, len: 0, crc: 0, pattern }
    }

    /// The location a data record gives its block.
    pub fn loc(&self) -> Loc {
        Loc { extent: self.extent, offset: self.offset, len: self.len, crc: self.crc }
    }

    /// Encodes into 32 bytes.
    pub fn put(&self, b: &mut [u8]) {
        b[0..8].copy_from_slice(&self.lba.to_le_bytes());
        b[8..16].copy_from_slice(&self.wseq.to_le_bytes());
        let n = if self.kind.is_range() { self.nblocks } else { self.extent };
        b[16..20].copy_from_slice(&n.to_le_bytes());
        b[20] = self.kind as u8;
        b[21..24].fill(0);
        if self.kind == Kind::Same {
            b[24..32].copy_from_slice(&self.pattern.to_le_bytes());
        } else {
            b[24..26].copy_from_slice(&self.offset.to_le_bytes());
            b[26..28].copy_from_slice(&self.len.to_le_bytes());
            b[28..32].copy_from_slice(&self.crc.to_le_bytes());
        }
    }

    /// Decodes 32 bytes (`None`: an unknown kind).
    pub fn get(b: &[u8]) -> Option<Record> {
        let kind = Kind::try_from(b[20]).ok()?;
        let n = u32_at(b, 16);
        let (lba, wseq) = (u64_at(b, 0), u64_at(b, 8));
        Some(match kind {
            Kind::Same => Record::range(lba, wseq, kind, n, u64_at(b, 24)),
            Kind::Zero | Kind::Trim => Record::range(lba, wseq, kind, n, 0),
            Kind::Compressed | Kind::Raw => Record::data(
                lba,
                wseq,
                kind,
                n,
                u16::from_le_bytes([b[24], b[25]]),
                u16::from_le_bytes([b[26], b[27]]),
                u32_at(b, 28),
            ),
        })
    }
}

/// Writes a log extent header for `count` records with `seq`, and its crc.
pub fn seal_header(ext: &mut [u8], count: u32, seq: u64, index: u32, uuid: u64) {
    ext[0..4].copy_from_slice(&EXT_MAGIC.to_le_bytes());
    ext[4..8].copy_from_slice(&count.to_le_bytes());
    ext[8..16].copy_from_slice(&seq.to_le_bytes());
    ext[16..20].fill(0);
    ext[20..24].copy_from_slice(&index.to_le_bytes());
    ext[24..32].copy_from_slice(&uuid.to_le_bytes());
    let end = EXT_HEADER + count as usize * RECORD;
    let c = crc32c(&ext[..end]);
    ext[16..20].copy_from_slice(&c.to_le_bytes());
}

/// The seq of log extent `index` of image `uuid` whose first bytes are
/// `head`, if it looks sealed (magic, index and uuid; [`parse_extent`]
/// checks the crc).
pub fn peek_seq(head: &[u8], index: u32, uuid: u64) -> Option<u64> {
    (u32_at(head, 0) == EXT_MAGIC && u32_at(head, 20) == index && u64_at(head, 24) == uuid)
        .then(|| u64_at(head, 8))
}

/// The seq and records of sealed log extent `index` of image `uuid`, or
/// `None` if its header or records are damaged (torn or never written).
/// Compressed records whose data range is out of the extent, or that name
/// another extent, are damage too.
pub fn parse_extent(ext: &[u8], index: u32, uuid: u64) -> Option<(u64, Vec<Record>)> {
    if ext.len() < EXT_HEADER {
        return None;
    }
    let seq = peek_seq(ext, index, uuid)?;
    let count = u32_at(ext, 4) as usize;
    let end = EXT_HEADER.checked_add(count.checked_mul(RECORD)?)?;
    if end > ext.len() {
        return None;
    }
    let want = u32_at(ext, 16);
    let mut tmp = ext[..end].to_vec();
    tmp[16..20].fill(0);
    if crc32c(&tmp) != want {
        return None;
    }
    let mut recs = Vec::with_capacity(count);
    for i in 0..count {
        let r = Record::get(&ext[EXT_HEADER + i * RECORD..])?;
        if r.kind == Kind::Compressed
            && (r.extent != index
                || (r.offset as usize) < end
                || r.offset as usize + r.len as usize > ext.len())
        {
            return None;
        }
        recs.push(r);
    }
    Some((seq, recs))
}

/// Encodes checkpoint page `index` holding `entries` (at most
/// [`ENTRIES_PER_PAGE`]) written at `generation`.
pub fn encode_page(entries: &[Loc], index: u32, generation: u64, out: &mut [u8]) {
    debug_assert!(entries.len() <= ENTRIES_PER_PAGE && out.len() == CKPT_PAGE);
    out.fill(0);
    out[0..8].copy_from_slice(&generation.to_le_bytes());
    out[12..16].copy_from_slice(&index.to_le_bytes());
    for (i, l) in entries.iter().enumerate() {
        l.put(&mut out[CKPT_PAGE_HEADER + i * ENTRY..]);
    }
    let c = crc32c(out);
    out[8..12].copy_from_slice(&c.to_le_bytes());
}

/// Decodes checkpoint page `index` of an area read for a superblock of
/// `generation`, appending its first `n` entries to `table`; returns the
/// page's generation.
pub fn decode_page(
    b: &[u8],
    index: u32,
    generation: u64,
    n: usize,
    table: &mut Vec<Loc>,
) -> Result<u64, String> {
    let g = u64_at(b, 0);
    let mut tmp = [0u8; CKPT_PAGE];
    tmp.copy_from_slice(&b[..CKPT_PAGE]);
    tmp[8..12].fill(0);
    if crc32c(&tmp) != u32_at(b, 8) || u32_at(b, 12) != index {
        return Err(format!("checkpoint page {index} is damaged (checksum mismatch)"));
    }
    if g > generation || g % 2 != generation % 2 || g == 0 {
        return Err(format!(
            "checkpoint page {index} is of generation {g}, the superblock's is {generation}"
        ));
    }
    table.extend((0..n).map(|i| Loc::get(&b[CKPT_PAGE_HEADER + i * ENTRY..])));
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb() -> Superblock {
        Superblock {
            block_size: 4096,
            extent_size: 32768,
            codec: 5,
            provisioned: true,
            logical_size: 1 << 30,
            extents: 40000,
            table_pages: Superblock::table_pages_for(1 << 18),
            generation: 7,
            next_seq: 99,
            next_wseq: 12345,
            uuid: 0x1234_5678_9abc_def0,
        }
    }

    #[test]
    fn superblock_round_trips_and_rejects_damage_and_old_versions() {
        let sb = sb();
        let b = sb.encode();
        assert_eq!(Superblock::decode(&b), Ok(sb));
        for i in [0, 9, 13, 30, 66, 4000, 4093] {
            let mut d = b.clone();
            d[i] ^= 1;
            assert!(Superblock::decode(&d).is_err(), "byte {i}");
        }
        let bad = Superblock { block_size: 3000, ..sb };
        assert!(Superblock::decode(&bad.encode()).is_err());
        let mut v1 = b.clone();
        v1[8..12].copy_from_slice(&1u32.to_le_bytes());
        let c = crc32c(&v1[..SB_SIZE - 4]);
        v1[SB_SIZE - 4..].copy_from_slice(&c.to_le_bytes());
        let e = Superblock::decode(&v1).unwrap_err();
        assert!(e.contains("version 1") && e.contains("version 2"), "{e}");
    }

    #[test]
    fn extents_round_trip_and_detect_tears_and_strangers() {
        let mut ext = vec![0u8; 32768];
        let r = Record::data(7, 3, Kind::Compressed, 5, 30000, 100, 9);
        let raw = Record::data(8, 4, Kind::Raw, 77, 8192, 4096, 10);
        let same = Record::range(9, 5, Kind::Same, 300, 0x0102_0304_0506_0708);
        let trim = Record::range(10, 6, Kind::Trim, 3, 0);
        for (i, x) in [r, raw, same, trim].iter().enumerate() {
            x.put(&mut ext[EXT_HEADER + i * RECORD..]);
        }
        seal_header(&mut ext, 4, 42, 5, 0xabc);
        assert_eq!(parse_extent(&ext, 5, 0xabc), Some((42, vec![r, raw, same, trim])));
        assert_eq!(peek_seq(&ext, 5, 0xabc), Some(42));
        // Another extent's index or another image's uuid: not this log.
        assert_eq!(peek_seq(&ext, 6, 0xabc), None);
        assert_eq!(parse_extent(&ext, 5, 0xabd), None);
        let mut torn = ext.clone();
        torn[EXT_HEADER + 3] ^= 0xff;
        assert_eq!(parse_extent(&torn, 5, 0xabc), None);
    }

    #[test]
    fn checkpoint_pages_round_trip_and_detect_damage() {
        let mut t = vec![Loc { extent: 3, offset: 100, len: 200, crc: 5 }, Loc::NONE, Loc::ZEROED];
        t.push(Loc::same(0xdead_beef_0bad_f00d));
        assert_eq!(t[3].pattern(), 0xdead_beef_0bad_f00d);
        assert!(!t[3].is_data() && t[0].is_data());
        let mut page = vec![0u8; CKPT_PAGE];
        encode_page(&t, 2, 4, &mut page);
        let mut back = Vec::new();
        assert_eq!(decode_page(&page, 2, 6, 4, &mut back), Ok(4));
        assert_eq!(back, t);
        assert!(decode_page(&page, 3, 6, 4, &mut back).is_err(), "wrong index");
        assert!(decode_page(&page, 2, 2, 4, &mut back).is_err(), "newer than the superblock");
        assert!(decode_page(&page, 2, 5, 4, &mut back).is_err(), "other area's parity");
        let mut d = page.clone();
        d[CKPT_PAGE_HEADER + 5] ^= 1;
        assert!(decode_page(&d, 2, 4, 4, &mut back).is_err());
    }
}
