//! The image format.
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
//!   0 magic "ZTIERBLK"   8 version u32 (1)   12 block_size u32   16 extent_size u32
//!  20 codec u8 (CodecId) 21 provisioned u8 (1 = every logical block can be
//!     rewritten raw without ENOSPC)          24 logical_size u64 (bytes)
//!  32 extents u32        36 table_pages u32 (4 KiB pages per checkpoint area)
//!  40 generation u64     48 next_seq u64 (extents opened after this checkpoint
//!     have seq ≥ next_seq)                   56 next_wseq u64 (write counter)
//! ```
//!
//! Checkpoint area: a 32-byte header — magic "ZTCKPT01", generation u64,
//! blocks u64, crc32c u32 of the entries — then one 12-byte entry per
//! logical block: extent u32 (0xffffffff unmapped, 0xfffffffe zero),
//! offset u16, len u16, crc32c u32 of the stored bytes.
//!
//! Extent (`extent_size` bytes; records grow from the front, data from the
//! back, so a block's record and its bytes share one write):
//!
//! ```text
//!  ┌────────────── header (32 B) ───────────────┬── records, 32 B each ──┬─ free ─┬─ data ◄─┐
//!  │ magic "ZEXT" u32 │ count u32 │ seq u64 │    │ lba u64 │ wseq u64 │    │        │ block n … │
//!  │ crc32c u32 (header+records, crc = 0) │ 12 B │ nblocks u32 │ offset u16│        │ block 0  │
//!  │                                      reserved│ len u16 │ kind u8 │ 3 B │ crc u32│          │
//!  └──────────────────────────────────────────────┴──────────────────────────┴────────┴──────────┘
//! ```
//!
//! Record kinds: 0 compressed (codec of the image), 1 raw, 2 zero (nblocks
//! blocks from lba read as zeros), 3 trim (nblocks blocks unmapped). `wseq`
//! orders every record ever written: at recovery the highest wins, whatever
//! the order extents were sealed in.

use crc32c::crc32c;

/// Superblock magic.
pub const SB_MAGIC: &[u8; 8] = b"ZTIERBLK";
/// Checkpoint area magic.
pub const CKPT_MAGIC: &[u8; 8] = b"ZTCKPT01";
/// Extent magic ("ZEXT").
pub const EXT_MAGIC: u32 = 0x5A45_5854;
/// Format version.
pub const VERSION: u32 = 1;
/// Superblock slot size.
pub const SB_SIZE: usize = 4096;
/// Extent header size.
pub const EXT_HEADER: usize = 32;
/// Record size.
pub const RECORD: usize = 32;
/// Checkpoint header size.
pub const CKPT_HEADER: usize = 32;
/// Checkpoint entry size.
pub const ENTRY: usize = 12;

/// Extent value of an unmapped block (reads zero, a hole).
pub const UNMAPPED: u32 = u32::MAX;
/// Extent value of a block written as zeros (metadata only).
pub const ZERO: u32 = u32::MAX - 1;

/// Record kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Compressed with the image's codec.
    Compressed = 0,
    /// Stored as is.
    Raw = 1,
    /// `nblocks` blocks read as zeros.
    Zero = 2,
    /// `nblocks` blocks unmapped.
    Trim = 3,
}

impl Kind {
    /// From the stored byte.
    pub fn from_u8(b: u8) -> Option<Kind> {
        match b {
            0 => Some(Kind::Compressed),
            1 => Some(Kind::Raw),
            2 => Some(Kind::Zero),
            3 => Some(Kind::Trim),
            _ => None,
        }
    }
}

/// Where a logical block lives (12 bytes in RAM and in checkpoints).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loc {
    /// Extent index, or [`UNMAPPED`] / [`ZERO`].
    pub extent: u32,
    /// Byte offset of the data in the extent.
    pub offset: u16,
    /// Stored length (= block size: raw).
    pub len: u16,
    /// crc32c of the stored bytes.
    pub crc: u32,
}

impl Loc {
    /// Not mapped.
    pub const NONE: Loc = Loc { extent: UNMAPPED, offset: 0, len: 0, crc: 0 };
    /// Written as zeros.
    pub const ZEROED: Loc = Loc { extent: ZERO, offset: 0, len: 0, crc: 0 };

    /// Whether data is stored for it.
    pub fn is_data(&self) -> bool {
        self.extent < ZERO
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
            extent: u32::from_le_bytes(b[0..4].try_into().expect("4 bytes")),
            offset: u16::from_le_bytes(b[4..6].try_into().expect("2 bytes")),
            len: u16::from_le_bytes(b[6..8].try_into().expect("2 bytes")),
            crc: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
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
        2 * SB_SIZE as u64 + a * self.table_pages as u64 * 4096
    }

    /// Byte offset of the first extent.
    pub fn data_offset(&self) -> u64 {
        self.area_offset(2).next_multiple_of(4096)
    }

    /// Byte offset of extent `e`.
    pub fn extent_offset(&self, e: u32) -> u64 {
        self.data_offset() + e as u64 * self.extent_size as u64
    }

    /// Pages one checkpoint area needs for `blocks` blocks.
    pub fn table_pages_for(blocks: u64) -> u32 {
        (CKPT_HEADER as u64 + blocks * ENTRY as u64).div_ceil(4096) as u32
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
            return Err(format!("image format version {v}, this build reads {VERSION}"));
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
            return Err(format!("extent size {es}: a power of two, at most 64K, holding a raw block"));
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

/// One record of an extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// First logical block.
    pub lba: u64,
    /// Write counter.
    pub wseq: u64,
    /// Blocks covered (1 for data).
    pub nblocks: u32,
    /// Data offset in the extent.
    pub offset: u16,
    /// Data length.
    pub len: u16,
    /// Kind.
    pub kind: Kind,
    /// crc32c of the data.
    pub crc: u32,
}

impl Record {
    /// Encodes into 32 bytes.
    pub fn put(&self, b: &mut [u8]) {
        b[0..8].copy_from_slice(&self.lba.to_le_bytes());
        b[8..16].copy_from_slice(&self.wseq.to_le_bytes());
        b[16..20].copy_from_slice(&self.nblocks.to_le_bytes());
        b[20..22].copy_from_slice(&self.offset.to_le_bytes());
        b[22..24].copy_from_slice(&self.len.to_le_bytes());
        b[24] = self.kind as u8;
        b[25..28].fill(0);
        b[28..32].copy_from_slice(&self.crc.to_le_bytes());
    }

    /// Decodes 32 bytes.
    pub fn get(b: &[u8]) -> Option<Record> {
        Some(Record {
            lba: u64_at(b, 0),
            wseq: u64_at(b, 8),
            nblocks: u32_at(b, 16),
            offset: u16::from_le_bytes([b[20], b[21]]),
            len: u16::from_le_bytes([b[22], b[23]]),
            kind: Kind::from_u8(b[24])?,
            crc: u32_at(b, 28),
        })
    }
}

/// Writes an extent header for `count` records with `seq`, and its crc.
pub fn seal_header(ext: &mut [u8], count: u32, seq: u64) {
    ext[0..4].copy_from_slice(&EXT_MAGIC.to_le_bytes());
    ext[4..8].copy_from_slice(&count.to_le_bytes());
    ext[8..16].copy_from_slice(&seq.to_le_bytes());
    ext[16..32].fill(0);
    let end = EXT_HEADER + count as usize * RECORD;
    let c = crc32c(&ext[..end]);
    ext[16..20].copy_from_slice(&c.to_le_bytes());
}

/// The seq of an extent whose first bytes are `head`, if it looks sealed
/// (magic only; [`parse_extent`] checks the crc).
pub fn peek_seq(head: &[u8]) -> Option<u64> {
    (u32_at(head, 0) == EXT_MAGIC).then(|| u64_at(head, 8))
}

/// The seq and records of a sealed extent, or `None` if its header or
/// records are damaged (torn or never written). Records whose data range
/// is out of the extent are damage too.
pub fn parse_extent(ext: &[u8]) -> Option<(u64, Vec<Record>)> {
    if ext.len() < EXT_HEADER || u32_at(ext, 0) != EXT_MAGIC {
        return None;
    }
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
        if r.len != 0 && ((r.offset as usize) < end || r.offset as usize + r.len as usize > ext.len()) {
            return None;
        }
        recs.push(r);
    }
    Some((u64_at(ext, 8), recs))
}

/// Encodes a checkpoint area image for `table` at `generation`.
pub fn encode_checkpoint(table: &[Loc], generation: u64, pages: u32) -> Vec<u8> {
    let mut b = vec![0u8; pages as usize * 4096];
    for (i, l) in table.iter().enumerate() {
        l.put(&mut b[CKPT_HEADER + i * ENTRY..]);
    }
    let c = crc32c(&b[CKPT_HEADER..CKPT_HEADER + table.len() * ENTRY]);
    b[0..8].copy_from_slice(CKPT_MAGIC);
    b[8..16].copy_from_slice(&generation.to_le_bytes());
    b[16..24].copy_from_slice(&(table.len() as u64).to_le_bytes());
    b[24..28].copy_from_slice(&c.to_le_bytes());
    b
}

/// Decodes a checkpoint area for `blocks` blocks written at `generation`.
pub fn decode_checkpoint(b: &[u8], blocks: u64, generation: u64) -> Result<Vec<Loc>, String> {
    if b.len() < CKPT_HEADER || &b[0..8] != CKPT_MAGIC {
        return Err("checkpoint area has no magic".into());
    }
    if u64_at(b, 8) != generation || u64_at(b, 16) != blocks {
        return Err("checkpoint area does not match the superblock".into());
    }
    let end = CKPT_HEADER + blocks as usize * ENTRY;
    if end > b.len() || crc32c(&b[CKPT_HEADER..end]) != u32_at(b, 24) {
        return Err("checkpoint table checksum mismatch".into());
    }
    Ok((0..blocks as usize).map(|i| Loc::get(&b[CKPT_HEADER + i * ENTRY..])).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_round_trips_and_rejects_damage() {
        let sb = Superblock {
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
        };
        let b = sb.encode();
        assert_eq!(Superblock::decode(&b), Ok(sb));
        for i in [0, 9, 13, 30, 4000, 4093] {
            let mut d = b.clone();
            d[i] ^= 1;
            assert!(Superblock::decode(&d).is_err(), "byte {i}");
        }
        let bad = Superblock { block_size: 3000, ..sb };
        assert!(Superblock::decode(&bad.encode()).is_err());
    }

    #[test]
    fn extents_and_checkpoints_round_trip_and_detect_tears() {
        let mut ext = vec![0u8; 32768];
        let r =
            Record { lba: 7, wseq: 3, nblocks: 1, offset: 30000, len: 100, kind: Kind::Compressed, crc: 9 };
        r.put(&mut ext[EXT_HEADER..]);
        seal_header(&mut ext, 1, 42);
        assert_eq!(parse_extent(&ext), Some((42, vec![r])));
        assert_eq!(peek_seq(&ext), Some(42));
        let mut torn = ext.clone();
        torn[EXT_HEADER + 3] ^= 0xff;
        assert_eq!(parse_extent(&torn), None);
        let t = vec![Loc { extent: 3, offset: 100, len: 200, crc: 5 }, Loc::NONE, Loc::ZEROED];
        let b = encode_checkpoint(&t, 4, 1);
        assert_eq!(decode_checkpoint(&b, 3, 4), Ok(t));
        assert!(decode_checkpoint(&b, 3, 5).is_err());
        let mut d = b.clone();
        d[CKPT_HEADER + 5] ^= 1;
        assert!(decode_checkpoint(&d, 3, 4).is_err());
    }
}
