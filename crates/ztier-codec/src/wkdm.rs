//! WKdm — the Wilson/Kaplan direct-mapped word codec (Wilson, Kaplan and
//! Smaragdakis, "The Case for Compressed Caching in Virtual Memory Systems",
//! USENIX 1999).
//!
//! The page is read as 32-bit little-endian words. A 16-entry direct-mapped
//! dictionary of recently seen words is indexed by a hash of a word's high
//! 22 bits. Each word gets a 2-bit tag:
//!
//! | tag | name    | meaning                                   | extra output          |
//! |-----|---------|-------------------------------------------|-----------------------|
//! | 0   | zero    | the word is 0                             | —                     |
//! | 1   | exact   | the dictionary entry equals the word      | 4-bit index           |
//! | 2   | partial | same high 22 bits as the dictionary entry | 4-bit index, low 10 bits |
//! | 3   | miss    | anything else                             | the full 32-bit word  |
//!
//! Partial matches and misses replace the dictionary entry with the word.
//! The dictionary starts all zero, so small integers (high bits zero) are
//! partial matches from the first word on.
//!
//! ## Format (version 1)
//!
//! The outputs of each kind are kept in separate, densely packed segments, as
//! in the paper, so that the decoder can unpack each segment with simple
//! word-parallel code. All multi-byte fields are little-endian.
//!
//! ```text
//!  byte 0     1      2..4      4..6      6..8      8..10
//! +--------+------+---------+---------+---------+---------+
//! | 0x01   | 0x00 | n_words | n_full  | n_index | n_low   |   header, 10 bytes
//! +--------+------+---------+---------+---------+---------+
//! | tags: ceil(n_words / 4) bytes; word i's tag is bits     |
//! |       2*(i%4)..2*(i%4)+2 of byte i/4                    |
//! +---------------------------------------------------------+
//! | full words: n_full × 4 bytes, in word order              |
//! +---------------------------------------------------------+
//! | indices: ceil(n_index / 2) bytes; index k is the low     |
//! |          nibble of byte k/2 when k is even, else high    |
//! +---------------------------------------------------------+
//! | low bits: ceil(n_low / 4) groups of 5 bytes; a group is  |
//! |           a 40-bit little-endian number holding 4 10-bit |
//! |           values, the first in bits 0..10                |
//! +---------------------------------------------------------+
//! ```
//!
//! `n_index` = exact + partial tags, `n_low` = partial tags, `n_full` = miss
//! tags; the decoder checks these counts against the tags and the total
//! length against `src.len()` before decoding, so a corrupt page is an error,
//! never an out-of-bounds access. Unused bits in the last byte or group of a
//! segment are zero.
//!
//! ## Speed
//!
//! On x86-64 CPUs with AVX-512F and AVX-512CD (detected at run time; built
//! by Rust 1.89 or later) both directions run 16 words at a time with the
//! dictionary in a vector register, since its 16 entries are one register:
//!
//! - Within 16 words, `vpconflictd` on their slots gives each word the
//!   earlier words of its slot, and `vplzcntd` the nearest, whose word (or
//!   bits) a lane permutation brings over; words with none read the
//!   register (`vpermd`).
//! - After 16 words, each slot's entry is the last of them that stored to
//!   it: four more `vpconflictd` find, for each slot, its last word, and a
//!   masked lane permutation writes them in (`avx512::last_of_slots`, a
//!   scatter in registers; AVX-512's scatter and gather through memory
//!   took twice as long, as the decoder's dictionary chain then runs
//!   through memory).
//!
//! The compressor (`avx512::model`) gets the tags from three
//! compares and packs each segment's entries to its cursor with
//! `vpcompressd`. Its output is the scalar loop's, byte for byte (a test
//! checks it on synthetic, corpus and colliding pages). Elsewhere, and for
//! the last words of a block that do not fill 16, the compressor runs a
//! branch-free loop per word: the tag is computed, every candidate output
//! (index, low bits, full word) is written at its segment's cursor, and
//! only the cursors the tag selects advance.
//!
//! The decompressor first validates the header against the tags and unpacks
//! the indices and low bits, one entry each. Then, with AVX-512 (the
//! `avx512` module), it spreads each segment's entries over the words of
//! their tags (`vpexpandd`) and rebuilds the dictionary's part in
//! registers, by the rules its module describes. On x86-64 CPUs with AVX2
//! but not AVX-512 (the `avx2` module) it plans 8 words at a time — per
//! word the dictionary entry it loads and stores and the bits it keeps and
//! adds — and runs the plans of the nonzero words through the dictionary
//! in a short branch-free scalar loop. Elsewhere it unpacks the tags and full words too and
//! runs a `match` on each tag without bounds checks (`decode_words_fast`;
//! the validation guarantees every cursor stays in bounds). A safe twin of
//! that loop (`decode_words_safe`) is kept, and tests check that every
//! decoder the CPU runs agrees with it. Work buffers live in the codec
//! value; nothing is allocated per call.
//!
//! `ztier bench codecs --corpus F --codecs wkdm,lz4` on a 2-CPU AMD EPYC VM
//! with AVX-512 (Zen 4), one run per corpus file, each against C LZ4 in the
//! same run:
//!
//! | corpus | compress × LZ4 | decompress × LZ4 |
//! |---|---|---|
//! | python-dict.pages | 3.39 (3201 MB/s) | 1.04 (2983 MB/s) |
//! | python-sqlite.pages | 4.39 | 1.12 |
//! | gcc-cc1.pages | 3.26 | 0.99 |
//!
//! The scalar compressor and the earlier AVX-512 decoder (which planned 16
//! words in registers and ran the plans through the dictionary in a scalar
//! loop) managed 1.18–1.33× and 0.88× on python-dict.pages the same day,
//! 1.51–1.73× and 0.93× on python-sqlite.pages, 1.24–1.27× and 0.71× on
//! gcc-cc1.pages. A test binary timing the two decoders and LZ4 in turn
//! (best of 15 passes): 1.12–1.15× LZ4 against 0.95–0.98× on python-dict,
//! 0.96–0.97× against 0.83–0.85× on gcc-cc1. Reading the full words with a
//! masked load and `vpexpandd` in registers, instead of the expanding load
//! from memory, made that decoder ~20% faster. The `match` decoder's
//! time goes mostly to branch mispredictions: decoding the same 32 pages over
//! and over, so that the predictor learns their tags, it runs twice as fast
//! as over all 4096 pages.
//!
//! On a 2-CPU AMD EPYC VM with AVX2 and no AVX-512 (Zen 3), 5 alternating
//! runs of the same command with and without the `avx2` decoder (medians):
//! decompression 1559 MB/s against 1343 MB/s for the `match` decoder, and
//! 0.69× LZ4 against 0.58× (the machine was noisy: 0.50–0.87× and
//! 0.45–0.77× per run); in a test binary timing the two in turn, best of
//! 15 passes each, 1.14–1.23× the `match` decoder and 0.68–0.75× LZ4.
//! Planning costs more than with AVX-512 (no `vpexpandd`: a table lookup
//! and a lane permutation per segment). Leaving the zero words out of the
//! dictionary loop (which took ~45% of the decoder's time) raised it from
//! ~1.06× the `match` decoder. Tried there and left out: a second
//! dictionary of the high bits that misses set, so that a run of partial
//! matches to one entry is not a chain through memory (no faster), and
//! reading the indices as packed nibbles instead of unpacking them first
//! (slower), and counting the tags inside the decoder instead of before
//! it (within noise: 1.01× in 4 alternating runs).
//!
//! Under callgrind, decoding every page of python-dict.pages took the
//! `avx2` decoder ~24 k instructions a page (13 a nonzero word in the
//! dictionary loop, ~110 per 8 words of planning) against ~13 k for
//! liblz4's `LZ4_decompress_safe`, which it trails by ~1.4× in time: it
//! is bound by its instruction count more than by the dictionary's
//! chain. Two cheap cuts were measured and left out: counting the tags
//! with `popcnt` (~320 instructions a page with it; no change in
//! 3 alternating runs) and skipping all-zero groups of 8 words (0.5% of
//! the groups of that corpus).

use crate::{check_input_len, check_output_len, Codec, CodecId, CompressError, DecompressError, MAX_INPUT};

/// Format version byte.
pub const VERSION: u8 = 1;
/// Header length in bytes.
pub const HEADER: usize = 10;
pub(crate) const MAX_WORDS: usize = MAX_INPUT / 4;
/// Words between two early-abort checks while compressing.
pub(crate) const CHECK_EVERY: usize = 256;

pub(crate) const LOW_MASK: u32 = 0x3ff;

/// Dictionary slot of a word: a multiplicative hash of its high 22 bits.
#[inline(always)]
fn slot(w: u32) -> usize {
    ((w >> 10).wrapping_mul(0x9E37_79B1) >> 28) as usize
}

/// Size of the packed output for the given counts.
#[inline]
pub(crate) fn packed_len(n_words: usize, n_full: usize, n_index: usize, n_low: usize) -> usize {
    HEADER + n_words.div_ceil(4) + 4 * n_full + n_index.div_ceil(2) + 5 * n_low.div_ceil(4)
}

/// WKdm with its work buffers.
pub struct Wkdm {
    seg: Segments,
    /// The decoder this CPU runs.
    decoder: Decoder,
    /// Whether this CPU runs the vector encoder (`avx512::model`).
    vector_encoder: bool,
}

/// The decoders of the main loop, fastest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decoder {
    /// 16 words at a time (`avx512`).
    Avx512,
    /// 8 words at a time (`avx2`).
    Avx2,
    /// A `match` per word (`decode_words_fast`).
    Scalar,
}

impl Decoder {
    /// The fastest decoder this CPU (and compiler) can run.
    fn best() -> Self {
        if avx512::available() {
            Decoder::Avx512
        } else if avx2::available() {
            Decoder::Avx2
        } else {
            Decoder::Scalar
        }
    }
}

impl std::fmt::Debug for Wkdm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Wkdm")
    }
}

impl Default for Wkdm {
    fn default() -> Self {
        Self::new()
    }
}

fn boxed<T: Copy + Default, const N: usize>() -> Box<[T; N]> {
    vec![T::default(); N].into_boxed_slice().try_into().map_err(|_| ()).expect("length N")
}

impl Wkdm {
    /// A new codec.
    pub fn new() -> Self {
        Wkdm { seg: Segments::new(), decoder: Decoder::best(), vector_encoder: avx512::available() }
    }
}

/// Entries past the largest count in the unpacked index and low-bits
/// buffers.
const SLACK: usize = 16;

/// The unpacked segments of a WK-format page, reused between calls. WK4x4
/// shares this layout and code; only the dictionary differs.
pub(crate) struct Segments {
    pub(crate) tags: Box<[u8; MAX_WORDS]>,
    // Indices and low bits have SLACK entries past the most a page can
    // hold: the vector decoder loads 16 entries at a time from a cursor.
    pub(crate) index: Box<[u8; MAX_WORDS + SLACK]>,
    pub(crate) low: Box<[u16; MAX_WORDS + SLACK]>,
    pub(crate) full: Box<[u32; MAX_WORDS + 1]>,
}

impl Segments {
    pub(crate) fn new() -> Self {
        Segments { tags: boxed(), index: boxed(), low: boxed(), full: boxed() }
    }

    /// Writes header and segments for `n` words with the given counts into
    /// `dst`, which must hold `packed_len` bytes. Returns that length.
    pub(crate) fn pack(&mut self, version: u8, n: usize, c: Counts, dst: &mut [u8]) -> usize {
        let Counts { full: nf, index: ni, low: nl } = c;
        let total = packed_len(n, nf, ni, nl);
        let out = &mut dst[..total];
        out[0] = version;
        out[1] = 0;
        out[2..4].copy_from_slice(&(n as u16).to_le_bytes());
        out[4..6].copy_from_slice(&(nf as u16).to_le_bytes());
        out[6..8].copy_from_slice(&(ni as u16).to_le_bytes());
        out[8..10].copy_from_slice(&(nl as u16).to_le_bytes());
        let mut at = HEADER;
        // Zero the padding entries so that unused bits come out zero.
        let tag_bytes = n.div_ceil(4);
        self.tags[n..4 * tag_bytes].fill(0);
        self.index[ni..ni.next_multiple_of(2)].fill(0);
        self.low[nl..nl.next_multiple_of(4)].fill(0);
        // Tags, 4 per byte: four tag bytes read as one word, folded.
        for (o, t) in out[at..at + tag_bytes].iter_mut().zip(self.tags.chunks_exact(4)) {
            let x = u32::from_le_bytes(t.try_into().expect("4 bytes"));
            *o = (x | (x >> 6) | (x >> 12) | (x >> 18)) as u8;
        }
        at += tag_bytes;
        // Full words.
        for (o, w) in out[at..at + 4 * nf].chunks_exact_mut(4).zip(self.full[..nf].iter()) {
            o.copy_from_slice(&w.to_le_bytes());
        }
        at += 4 * nf;
        // Indices, 2 per byte.
        let idx_bytes = ni.div_ceil(2);
        for (o, p) in out[at..at + idx_bytes].iter_mut().zip(self.index.chunks_exact(2)) {
            *o = p[0] | (p[1] << 4);
        }
        at += idx_bytes;
        // Low bits, 4 per 5-byte group.
        for (o, g) in out[at..].chunks_exact_mut(5).zip(self.low.chunks_exact(4)) {
            let v = g[0] as u64 | (g[1] as u64) << 10 | (g[2] as u64) << 20 | (g[3] as u64) << 30;
            o.copy_from_slice(&v.to_le_bytes()[..5]);
        }
        total
    }

    /// Validates `src` as a page of `dst_len` bytes written with `version`
    /// and unpacks its segments. On success the tags, full words, indices
    /// and low bits are in the buffers and the counts are consistent with
    /// the tags, which is what the unchecked decode loops rely on.
    pub(crate) fn unpack(
        &mut self,
        version: u8,
        src: &[u8],
        dst_len: usize,
    ) -> Result<Counts, DecompressError> {
        let lay = Layout::check(version, src, dst_len)?;
        self.unpack_tags_full(src, &lay);
        self.unpack_index_low(src, &lay);
        Ok(lay.counts)
    }

    /// Unpacks the tags (one byte per word) and the full words of a
    /// validated page.
    fn unpack_tags_full(&mut self, src: &[u8], lay: &Layout) {
        // Tags, one byte per word (4 at a time through a table).
        for (t4, &b) in self.tags.chunks_exact_mut(4).zip(&src[lay.tags()]) {
            t4.copy_from_slice(&TAG_UNPACK[b as usize].to_le_bytes());
        }
        for (f, c) in self.full.iter_mut().zip(src[lay.full()].chunks_exact(4)) {
            *f = u32::from_le_bytes(c.try_into().expect("4 bytes"));
        }
    }

    /// Unpacks the indices (one byte each) and the low bits (one `u16`
    /// each) of a validated page.
    fn unpack_index_low(&mut self, src: &[u8], lay: &Layout) {
        let idx = &src[lay.index()];
        for (p, &b) in self.index[..idx.len() * 2].chunks_exact_mut(2).zip(idx) {
            p[0] = b & 15;
            p[1] = b >> 4;
        }
        let low = &src[lay.low()];
        for (g, o) in self.low[..low.len() / 5 * 4].chunks_exact_mut(4).zip(low.chunks_exact(5)) {
            let v = u64::from_le_bytes([o[0], o[1], o[2], o[3], o[4], 0, 0, 0]);
            for (k, x) in g.iter_mut().enumerate() {
                *x = ((v >> (10 * k)) & LOW_MASK as u64) as u16;
            }
        }
    }
}

/// Where the segments of a validated page lie in its compressed form.
///
/// Only [`Layout::check`] makes one, so a `Layout` means: `src` is exactly
/// as long as its header says, and the tags of its `n` words hold exactly
/// `counts.full` misses, `counts.index` exact-or-partial matches and
/// `counts.low` partial matches (padding tags past the last word are zero
/// or counted too). The decode loops rely on this to skip bounds checks.
pub(crate) struct Layout {
    /// Words in the page.
    pub(crate) n: usize,
    /// Entries in each segment.
    pub(crate) counts: Counts,
    full_at: usize,
    index_at: usize,
    low_at: usize,
    end: usize,
}

impl Layout {
    /// Validates the header of `src` (format `version`, `dst_len` bytes
    /// out) and its counts against the tags and the length of `src`.
    pub(crate) fn check(version: u8, src: &[u8], dst_len: usize) -> Result<Layout, DecompressError> {
        check_output_len(dst_len)?;
        if src.len() < HEADER {
            return Err(DecompressError::Truncated("WK header"));
        }
        if src[0] != version {
            return Err(DecompressError::WrongFormat { expected: version, found: src[0] });
        }
        let rd = |o: usize| u16::from_le_bytes([src[o], src[o + 1]]) as usize;
        let (n, nf, ni, nl) = (rd(2), rd(4), rd(6), rd(8));
        if n != dst_len / 4 {
            return Err(DecompressError::LengthMismatch { expected: dst_len, actual: n * 4 });
        }
        if src[1] != 0 || nl > ni || nf + ni > n {
            return Err(DecompressError::Corrupt("WK header counts are inconsistent"));
        }
        let total = packed_len(n, nf, ni, nl);
        if src.len() < total {
            return Err(DecompressError::Truncated("WK segments"));
        }
        if src.len() > total {
            return Err(DecompressError::Corrupt("trailing bytes after WK segments"));
        }
        let full_at = HEADER + n.div_ceil(4);
        let (misses, partials, exacts) = count_tags(&src[HEADER..full_at]);
        if misses != nf || exacts + partials != ni || partials != nl {
            return Err(DecompressError::Corrupt("WK tag counts disagree with the header"));
        }
        let index_at = full_at + 4 * nf;
        let low_at = index_at + ni.div_ceil(2);
        Ok(Layout {
            n,
            counts: Counts { full: nf, index: ni, low: nl },
            full_at,
            index_at,
            low_at,
            end: total,
        })
    }

    /// The packed tags: 4 per byte.
    pub(crate) fn tags(&self) -> std::ops::Range<usize> {
        HEADER..self.full_at
    }

    /// The full words: 4 bytes each.
    pub(crate) fn full(&self) -> std::ops::Range<usize> {
        self.full_at..self.index_at
    }

    /// The packed indices: 2 per byte.
    pub(crate) fn index(&self) -> std::ops::Range<usize> {
        self.index_at..self.low_at
    }

    /// The packed low bits: 4 per 5-byte group.
    pub(crate) fn low(&self) -> std::ops::Range<usize> {
        self.low_at..self.end
    }
}

impl Codec for Wkdm {
    fn id(&self) -> CodecId {
        CodecId::Wkdm
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, CompressError> {
        check_input_len(src.len())?;
        let n = src.len() / 4;
        let cap = dst.len();
        let overflow = Err(CompressError::Overflow { capacity: cap });
        if packed_len(n, 0, 0, 0) > cap {
            return overflow;
        }
        // Slot 16 is a scratch slot: zero words "write" there, so a store's
        // data is always the input word and no chain of dependent loads and
        // stores forms through the dictionary.
        let mut dict = [0u32; 17];
        let mut counts = Counts::default();
        for (block, tags) in src.chunks(4 * CHECK_EVERY).zip(self.seg.tags[..n].chunks_mut(CHECK_EVERY)) {
            let done = if self.vector_encoder {
                // SAFETY: `vector_encoder` is set only when the CPU has the
                // features the encoder needs (`Wkdm::new`), its one
                // requirement.
                unsafe {
                    avx512::model(
                        block,
                        tags,
                        &mut self.seg.index[..],
                        &mut self.seg.low[..],
                        &mut self.seg.full[..],
                        &mut dict,
                        &mut counts,
                    )
                }
            } else {
                0
            };
            model_block(
                &block[4 * done..],
                &mut tags[done..],
                &mut self.seg.index[..],
                &mut self.seg.low[..],
                &mut self.seg.full[..],
                &mut dict,
                &mut counts,
            );
            if packed_len(n, counts.full, counts.index, counts.low) > cap {
                return overflow;
            }
        }
        if packed_len(n, counts.full, counts.index, counts.low) > cap {
            return overflow;
        }
        Ok(self.seg.pack(VERSION, n, counts, dst))
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), DecompressError> {
        let lay = Layout::check(VERSION, src, dst.len())?;
        self.seg.unpack_index_low(src, &lay);
        if self.decoder != Decoder::Scalar {
            let (ni, nl) = (lay.counts.index, lay.counts.low);
            let (tags, full) = (&src[lay.tags()], &src[lay.full()]);
            let (index, low) = (&self.seg.index[..ni + SLACK], &self.seg.low[..nl + SLACK]);
            // SAFETY: `decoder` names a vector decoder only when the CPU
            // has the features it needs (`Decoder::best`), its one
            // requirement. (Both bounds-check their reads and do not panic
            // here: `lay` passed the checks, so the tags hold as many
            // entries of each segment as it has, and the unpacked index
            // and low-bits segments come with the SLACK entries they read
            // past them.)
            unsafe {
                if self.decoder == Decoder::Avx512 {
                    avx512::decode(tags, lay.n, full, index, low, dst)
                } else {
                    avx2::decode(tags, lay.n, full, index, low, dst)
                }
            };
            return Ok(());
        }
        self.seg.unpack_tags_full(src, &lay);
        let (c, seg) = (lay.counts, &self.seg);
        decode_words_fast(
            &seg.tags[..lay.n],
            &seg.full[..c.full],
            &seg.index[..c.index],
            &seg.low[..c.low],
            dst,
        );
        Ok(())
    }

    fn max_compressed_len(&self, len: usize) -> usize {
        // Misses cost 4 bytes a word, partial matches 1.75; segment rounding
        // adds at most 6 bytes.
        let n = len / 4;
        packed_len(n, n, 0, 0) + 6
    }
}

/// Entries in each segment.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) full: usize,
    pub(crate) index: usize,
    pub(crate) low: usize,
}

/// Models one block of words: writes each word's tag to `tags` and appends
/// its index, low bits and full word to the segments its tag selects.
///
/// Branch-free: every candidate is written at the segment's cursor and only
/// the cursors the tag selects advance (tags of real pages are too
/// irregular to predict). Zero words "write" dictionary slot 16, a scratch
/// slot, so a dictionary store's data is always the input word and no chain
/// of dependent loads and stores forms through the dictionary.
#[inline]
fn model_block(
    block: &[u8],
    tags: &mut [u8],
    index: &mut [u8],
    low: &mut [u16],
    full: &mut [u32],
    dict: &mut [u32; 17],
    c: &mut Counts,
) {
    let words = block.len() / 4;
    assert!(tags.len() >= words);
    assert!(index.len() > c.index + words && low.len() > c.low + words && full.len() > c.full + words);
    // Raw cursors keep the loop's live values within the registers.
    let (ib, lb, fb) = (index.as_mut_ptr(), low.as_mut_ptr(), full.as_mut_ptr());
    // SAFETY: the counts are within the slices (asserted above).
    let (mut ip, mut lp, mut fp) = unsafe { (ib.add(c.index), lb.add(c.low), fb.add(c.full)) };
    let mut tp = tags.as_mut_ptr();
    let dp = dict.as_mut_ptr();
    for w in block.chunks_exact(4) {
        let w = u32::from_le_bytes(w.try_into().expect("4 bytes"));
        let h = slot(w);
        // SAFETY: h < 16 (a 4-bit hash) and h | 16 < 17 index the 17-entry
        // dictionary; tp advances once per word over `words` <= tags.len()
        // entries; each segment cursor starts at its count and advances at
        // most once per word, so it stays below count + words < slice
        // length (asserted above).
        unsafe {
            let d = *dp.add(h);
            // Flags as machine words: no byte-register shuffling.
            let nz = (w != 0) as usize;
            let ex = (d == w) as usize;
            let pm = ((d ^ w) <= LOW_MASK) as usize; // exact implies pm
            let has_ix = nz & pm;
            let is_partial = has_ix & (ex ^ 1);
            let miss = nz & (pm ^ 1);
            // zero → 0, exact → 1, partial → 2, miss → 3.
            *tp = (has_ix + is_partial + 3 * miss) as u8;
            *ip = h as u8;
            *lp = (w & LOW_MASK) as u16;
            *fp = w;
            tp = tp.add(1);
            ip = ip.add(has_ix);
            lp = lp.add(is_partial);
            fp = fp.add(miss);
            *dp.add(h | ((nz ^ 1) << 4)) = w;
        }
    }
    // SAFETY: each cursor was derived from its slice's base pointer.
    let (ni, nl, nf) = unsafe { (ip.offset_from(ib), lp.offset_from(lb), fp.offset_from(fb)) };
    let (ip, lp, fp) = (ni as usize, nl as usize, nf as usize);
    *c = Counts { full: fp, index: ip, low: lp };
}

/// Counts (misses, partials, exacts) among the packed tags. Bits of a padding
/// tag past the last word are zero, so they count as zero tags.
fn count_tags(packed: &[u8]) -> (usize, usize, usize) {
    let (mut m, mut p, mut e) = (0u32, 0u32, 0u32);
    let mut chunks = packed.chunks_exact(8);
    let count = |x: u64, m: &mut u32, p: &mut u32, e: &mut u32| {
        let lo = x & 0x5555_5555_5555_5555;
        let hi = (x >> 1) & 0x5555_5555_5555_5555;
        *m += (lo & hi).count_ones();
        *p += (hi & !lo).count_ones();
        *e += (lo & !hi).count_ones();
    };
    for c in &mut chunks {
        count(u64::from_le_bytes(c.try_into().expect("8 bytes")), &mut m, &mut p, &mut e);
    }
    let mut last = [0u8; 8];
    last[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    count(u64::from_le_bytes(last), &mut m, &mut p, &mut e);
    (m as usize, p as usize, e as usize)
}

/// The decoder's main loop over validated, unpacked segments.
///
/// `full`, `index` and `low` hold exactly as many entries as there are miss,
/// exact-or-partial and partial tags in `tags`. A plain `match` on the tag.
/// It mispredicts often on real pages, but a branch-free scalar select is
/// slower still, because it executes every candidate's loads, stores and
/// selects (measured on python-dict.pages, unpacking included: 2.3 GB/s
/// against 1.7 GB/s; a 2-way branch with selects inside, 2.3 GB/s; a jump
/// table per 2 or 4 tags, 1.7 and 2.2 GB/s). The vector decoders do the
/// selecting in vector registers instead, where it is cheap.
///
/// This is the safe twin of [`decode_words_fast`]; tests check they agree.
#[cfg_attr(not(test), allow(dead_code))]
fn decode_words_safe(tags: &[u8], full: &[u32], index: &[u8], low: &[u16], dst: &mut [u8]) {
    let mut dict = [0u32; 16];
    let (mut fp, mut ip, mut lp) = (0usize, 0usize, 0usize);
    for (&t, out) in tags.iter().zip(dst.chunks_exact_mut(4)) {
        let v = match t {
            0 => 0,
            1 => {
                let v = dict[index[ip] as usize & 15];
                ip += 1;
                v
            }
            2 => {
                let ix = index[ip] as usize & 15;
                let v = (dict[ix] & !LOW_MASK) | low[lp] as u32;
                ip += 1;
                lp += 1;
                dict[ix] = v;
                v
            }
            _ => {
                let f = full[fp];
                fp += 1;
                dict[slot(f)] = f;
                f
            }
        };
        out.copy_from_slice(&v.to_le_bytes());
    }
}

/// The decoder's main loop without bounds checks, over tags unpacked one
/// per byte (see [`decode_words_safe`] for the algorithm).
fn decode_words_fast(tags: &[u8], full: &[u32], index: &[u8], low: &[u16], dst: &mut [u8]) {
    assert!(dst.len() >= 4 * tags.len());
    let mut dict = [0u32; 16];
    let (mut fp, mut ip, mut lp) = (full.as_ptr(), index.as_ptr(), low.as_ptr());
    let out = dst.as_mut_ptr();
    for (i, &t) in tags.iter().enumerate() {
        // SAFETY: the caller checked that the tags hold exactly full.len()
        // misses, index.len() exact-or-partial tags and low.len() partial
        // tags, and each cursor advances only on its tag, so every read is
        // within its slice. Dictionary indices are masked to 4 bits and
        // slot() is 4-bit. i < tags.len() and dst has 4 * tags.len() bytes
        // (asserted above); the write is unaligned.
        unsafe {
            let v = match t {
                0 => 0,
                1 => {
                    let v = *dict.get_unchecked(*ip as usize & 15);
                    ip = ip.add(1);
                    v
                }
                2 => {
                    let ix = *ip as usize & 15;
                    let v = (*dict.get_unchecked(ix) & !LOW_MASK) | *lp as u32;
                    ip = ip.add(1);
                    lp = lp.add(1);
                    *dict.get_unchecked_mut(ix) = v;
                    v
                }
                _ => {
                    let f = *fp;
                    fp = fp.add(1);
                    *dict.get_unchecked_mut(slot(f)) = f;
                    f
                }
            };
            out.add(4 * i).cast::<u32>().write_unaligned(v.to_le());
        }
    }
}

/// The vector decoder and encoder, for x86-64 CPUs with AVX-512F,
/// AVX-512CD, BMI2 and POPCNT: 16 words at a time, the dictionary included
/// (`model` for the encoder; the decoder follows).
///
/// The `match` of [`decode_words_fast`] mispredicts often on real pages
/// (tag sequences are too irregular to learn), and a branch-free scalar
/// select costs more instructions than the mispredictions. Here masks of
/// the four tags come from the packed tag bits, and each segment's next
/// entries are loaded and spread over the words of their tag
/// (`vpexpandd`). What is left sequential is the dictionary, and its rules
/// make it parallel:
///
/// - A word's slot is its index (exact and partial matches) or the hash of
///   its full word (misses); zero words do not touch the dictionary.
/// - A partial match keeps the entry's high 22 bits, so an entry's high
///   bits change only at a miss: a word's high bits are those of the
///   nearest earlier miss of its slot among the 16, else those of the
///   entry before the group.
/// - An exact match changes nothing, so an exact match's low 10 bits are
///   those of the nearest earlier miss or partial match of its slot, else
///   those of the entry before the group.
///
/// `vpconflictd` on the slots gives each word the mask of the earlier words
/// of its slot; masked by the misses (or by the misses and partial
/// matches) `vplzcntd` finds the nearest, and a lane permutation brings its
/// bits over. The entries before the group come from the dictionary's
/// register, and after it each slot's entry is its last nonzero word
/// (`last_of_slots`).
// The AVX-512 intrinsics are stable since Rust 1.89; the workspace builds
// with 1.85 too. build.rs sets `wkdm_avx512` when the compiler has them.
#[cfg(all(target_arch = "x86_64", wkdm_avx512))]
#[allow(clippy::incompatible_msrv)]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{Counts, LOW_MASK};

    /// Whether this CPU can run [`decode`] and [`model`].
    pub(super) fn available() -> bool {
        cfg!(not(miri))
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512cd")
            && is_x86_feature_detected!("bmi2")
            && is_x86_feature_detected!("popcnt")
    }

    /// Decodes `n` words into `dst` (`4 * n` bytes) from the packed tags
    /// (`ceil(n / 4)` bytes), the full words as they are packed, and the
    /// indices and low bits unpacked one per entry, each followed by at
    /// least 16 more entries (their values do not matter).
    ///
    /// Every segment read is bounds-checked (16 words at a time), so
    /// corrupt counts make this panic, never read out of bounds; a page
    /// that passed [`super::Layout::check`] never panics.
    ///
    /// # Safety
    ///
    /// The CPU must support AVX-512F, AVX-512CD, BMI2 and POPCNT
    /// ([`available`]).
    #[target_feature(enable = "avx512f,avx512cd,bmi2,popcnt")]
    pub(super) unsafe fn decode(
        tags: &[u8],
        n: usize,
        full: &[u8],
        index: &[u8],
        low: &[u16],
        dst: &mut [u8],
    ) {
        assert!(tags.len() == n.div_ceil(4) && dst.len() == 4 * n);
        assert!(full.len() % 4 == 0 && index.len() >= 16 && low.len() >= 16);
        // Largest cursor values from which 16 entries can be loaded.
        let (max_ip, max_lp) = (index.len() - 16, low.len() - 16);
        let max_fp = full.len() / 4;
        // The dictionary lives in a register.
        let mut dict = _mm512_setzero_si512();
        let hash = _mm512_set1_epi32(0x9E37_79B1_u32 as i32);
        // Keys of zero words: no slot (0..16) has them, nor another lane.
        let lanes = _mm512_setr_epi32(16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
        let low_mask = _mm512_set1_epi32(LOW_MASK as i32);
        let top = _mm512_set1_epi32(31);
        let (mut fp, mut ip, mut lp) = (0usize, 0usize, 0usize);
        for (g, out) in dst.chunks_mut(64).enumerate() {
            // The tags of the next 16 words (fewer at the end: the
            // missing ones read as zero words).
            let w0 = 16 * g;
            let t = if n - w0 >= 16 {
                u32::from_le_bytes(tags[w0 / 4..w0 / 4 + 4].try_into().expect("4 bytes"))
            } else {
                let mut t = [0u8; 4];
                let rest = &tags[w0 / 4..];
                t[..rest.len()].copy_from_slice(rest);
                u32::from_le_bytes(t) & ((1 << (2 * (n - w0))) - 1)
            };
            let lo = _pext_u32(t, 0x5555_5555) as u16;
            let hi = _pext_u32(t, 0xAAAA_AAAA) as u16;
            let (miss, partial, indexed, nonzero) = (lo & hi, hi & !lo, lo ^ hi, lo | hi);
            let (nf, ni, nl) =
                (miss.count_ones() as usize, indexed.count_ones() as usize, partial.count_ones() as usize);
            assert!(fp + nf <= max_fp && ip <= max_ip && lp <= max_lp, "WK counts checked");
            // SAFETY: the masked load from `full` reads exactly nf =
            // popcount(miss) <= 16 consecutive 4-byte entries, fp..fp + nf
            // <= max_fp = full.len() / 4 (asserted); the masked-off ones
            // are not read. The loads from `index` (16 bytes) and `low`
            // (16 u16s) start at ip <= index.len() - 16 and lp <=
            // low.len() - 16 (asserted). All loads are unaligned.
            let (f, ix, lw) = unsafe {
                (
                    // (A masked load, then `vpexpandd` in registers: the
                    // expanding load from memory took ~20% longer.)
                    _mm512_maskz_expand_epi32(
                        miss,
                        _mm512_maskz_loadu_epi32(((1u32 << nf) - 1) as u16, full.as_ptr().add(4 * fp).cast()),
                    ),
                    _mm_loadu_si128(index.as_ptr().add(ip).cast()),
                    _mm256_loadu_si256(low.as_ptr().add(lp).cast()),
                )
            };
            (fp, ip, lp) = (fp + nf, ip + ni, lp + nl);
            // Spread the other segments' entries over the words of their
            // tags too. Indices are 4-bit.
            let ix = _mm512_maskz_expand_epi32(
                indexed,
                _mm512_and_si512(_mm512_cvtepu8_epi32(ix), _mm512_set1_epi32(15)),
            );
            let lw = _mm512_maskz_expand_epi32(partial, _mm512_cvtepu16_epi32(lw));
            // Each word's slot, and the earlier words of its slot.
            let hashed = _mm512_srli_epi32::<28>(_mm512_mullo_epi32(_mm512_srli_epi32::<10>(f), hash));
            let slot = _mm512_mask_mov_epi32(ix, miss, hashed);
            let keys = _mm512_mask_mov_epi32(lanes, nonzero, slot);
            let earlier = _mm512_conflict_epi32(keys);
            let before = _mm512_permutexvar_epi32(slot, dict);
            // High bits: the nearest earlier miss of the slot's.
            let m = _mm512_and_si512(earlier, _mm512_set1_epi32(miss as i32));
            let high = _mm512_mask_permutexvar_epi32(
                before,
                _mm512_test_epi32_mask(m, m),
                _mm512_sub_epi32(top, _mm512_lzcnt_epi32(m)),
                f,
            );
            // Low bits: the nearest earlier miss's or partial match's.
            let p = _mm512_and_si512(earlier, _mm512_set1_epi32((miss | partial) as i32));
            let low_bits = _mm512_mask_permutexvar_epi32(
                before,
                _mm512_test_epi32_mask(p, p),
                _mm512_sub_epi32(top, _mm512_lzcnt_epi32(p)),
                _mm512_or_si512(f, lw),
            );
            // zero: 0; exact: the entry (those high and low bits);
            // partial: the entry's high bits and its own low bits; miss:
            // the full word.
            let low_bits = _mm512_mask_mov_epi32(low_bits, partial, lw);
            let matched = _mm512_ternarylogic_epi32::<0xCA>(low_mask, low_bits, high);
            let words = _mm512_mask_mov_epi32(_mm512_maskz_mov_epi32(indexed, matched), miss, f);
            let rest = out.len() / 4;
            // SAFETY: the store writes `rest` <= 16 words to the `4 * rest`
            // bytes of `out` (the mask leaves the others), unaligned.
            unsafe {
                _mm512_mask_storeu_epi32(
                    out.as_mut_ptr().cast(),
                    (1u32 << rest).wrapping_sub(1) as u16,
                    words,
                );
            }
            let (set, from) = last_of_slots(keys);
            dict = _mm512_mask_permutexvar_epi32(dict, set, from, words);
        }
    }

    /// For 16 keys (slots 0..16, or keys of 16 and up that no slot has):
    /// the slots some lane has, and for each such slot the last lane that
    /// has it. That is where a dictionary entry comes from after 16 words
    /// that store to their slots in order — a scatter in registers.
    ///
    /// Four `vpconflictd` compare 8 lanes with 8 slots each: lanes 0..8 hold
    /// 8 keys, lanes 8..16 hold 8 slots, and the mask of each slot's lane
    /// names the keys that equal it.
    #[inline]
    #[target_feature(enable = "avx512f,avx512cd")]
    pub(super) fn last_of_slots(keys: __m512i) -> (__mmask16, __m512i) {
        let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        // Keys 0..8 or 8..16 (a < 16) beside slots 0..8 or 8..16 (b >= 16).
        let pick = |a: i32, b: i32| {
            _mm512_setr_epi32(
                a,
                a + 1,
                a + 2,
                a + 3,
                a + 4,
                a + 5,
                a + 6,
                a + 7,
                b,
                b + 1,
                b + 2,
                b + 3,
                b + 4,
                b + 5,
                b + 6,
                b + 7,
            )
        };
        let cmp = |a: i32, b: i32| _mm512_conflict_epi32(_mm512_permutex2var_epi32(keys, pick(a, b), lanes));
        // The slots' lanes (8..16) of two comparisons, side by side.
        let join = |x: __m512i, y: __m512i| _mm512_permutex2var_epi32(x, pick(8, 24), y);
        let low = join(cmp(0, 16), cmp(0, 24));
        let high = join(cmp(8, 16), cmp(8, 24));
        let has = _mm512_or_si512(
            _mm512_slli_epi32::<8>(_mm512_and_si512(high, _mm512_set1_epi32(0xff))),
            _mm512_and_si512(low, _mm512_set1_epi32(0xff)),
        );
        (_mm512_test_epi32_mask(has, has), _mm512_sub_epi32(_mm512_set1_epi32(31), _mm512_lzcnt_epi32(has)))
    }

    /// The vector encoder: the scalar [`super::model_block`], 16 words at a time.
    ///
    /// The dictionary is what makes WKdm sequential: a word is matched against
    /// the entry that the last nonzero word of its slot left. For 16 words at
    /// once that entry is either the one before the group (from the
    /// dictionary's register) or the word of the nearest earlier lane with the same slot:
    /// `vpconflictd` on the slots (zero words get keys no slot has, since they
    /// do not store) gives each lane a mask of the earlier lanes it collides
    /// with, and `vplzcntd` the nearest of them, whose word a lane permutation
    /// brings over. The tags then come from three compares, each segment's
    /// entries are packed to its cursor with `vpcompressd`, and each slot's
    /// last nonzero word of the 16 goes into the dictionary's register
    /// ([`last_of_slots`]), as the scalar loop's stores in order would
    /// leave it. The output is byte for byte the scalar
    /// encoder's.
    ///
    /// Models the first `16 * (words / 16)` words of `block` as
    /// [`super::model_block`] does — tags to `tags`, segment entries
    /// appended at the cursors in `c`, the dictionary updated — and returns
    /// how many words it modelled; the caller models the rest.
    ///
    /// Each segment must have room for 16 entries past its cursor for every
    /// 16 words (as `model_block` asserts); it panics otherwise.
    ///
    /// # Safety
    ///
    /// The CPU must support AVX-512F, AVX-512CD and POPCNT ([`available`]).
    #[target_feature(enable = "avx512f,avx512cd,popcnt")]
    pub(super) unsafe fn model(
        block: &[u8],
        tags: &mut [u8],
        index: &mut [u8],
        low: &mut [u16],
        full: &mut [u32],
        dict: &mut [u32; 17],
        c: &mut Counts,
    ) -> usize {
        let groups = block.len() / 64;
        let hash = _mm512_set1_epi32(0x9E37_79B1_u32 as i32);
        // Keys of zero words: no slot (0..16) has them, nor another lane.
        let lanes = _mm512_setr_epi32(16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
        let low_mask = _mm512_set1_epi32(LOW_MASK as i32);
        let top = _mm512_set1_epi32(31);
        let (one, two, three) = (_mm512_set1_epi32(1), _mm512_set1_epi32(2), _mm512_set1_epi32(3));
        let (mut ip, mut lp, mut fp) = (c.index, c.low, c.full);
        // The dictionary in a register while the groups run (the 17th
        // entry is the scalar loop's scratch slot).
        // SAFETY: 16 of the dictionary's 17 entries; unaligned.
        let mut dv = unsafe { _mm512_loadu_si512(dict.as_ptr().cast()) };
        for g in 0..groups {
            let at = 16 * g;
            let src = &block[4 * at..4 * at + 64];
            // SAFETY: a 64-byte load from a 64-byte slice; unaligned.
            let w = unsafe { _mm512_loadu_si512(src.as_ptr().cast()) };
            let h = _mm512_srli_epi32::<28>(_mm512_mullo_epi32(_mm512_srli_epi32::<10>(w), hash));
            let nz = _mm512_test_epi32_mask(w, w);
            // The entry each word is matched against: the nearest earlier
            // nonzero word of its slot in this group, else the dictionary's.
            let keys = _mm512_mask_mov_epi32(lanes, nz, h);
            let conflicts = _mm512_conflict_epi32(keys);
            let collides = _mm512_test_epi32_mask(conflicts, conflicts);
            let nearest = _mm512_sub_epi32(top, _mm512_lzcnt_epi32(conflicts));
            let before = _mm512_permutexvar_epi32(h, dv);
            let d = _mm512_mask_permutexvar_epi32(before, collides, nearest, w);
            let exact = _mm512_mask_cmpeq_epi32_mask(nz, d, w);
            let indexed = _mm512_mask_cmple_epu32_mask(nz, _mm512_xor_si512(d, w), low_mask);
            let partial = indexed & !exact;
            let miss = nz & !indexed;
            // zero → 0, exact → 1, partial → 2, miss → 3.
            let t = _mm512_mask_mov_epi32(
                _mm512_mask_mov_epi32(_mm512_maskz_mov_epi32(exact, one), partial, two),
                miss,
                three,
            );
            let ix = _mm512_cvtepi32_epi8(_mm512_maskz_compress_epi32(indexed, h));
            let lw =
                _mm512_cvtepi32_epi16(_mm512_maskz_compress_epi32(partial, _mm512_and_si512(w, low_mask)));
            let fw = _mm512_maskz_compress_epi32(miss, w);
            let (t_out, i_out) = (&mut tags[at..at + 16], &mut index[ip..ip + 16]);
            let (l_out, f_out) = (&mut low[lp..lp + 16], &mut full[fp..fp + 16]);
            // SAFETY: each store writes 16 entries to a 16-entry slice just
            // taken (bounds-checked); the stores are unaligned.
            unsafe {
                _mm_storeu_si128(t_out.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(t));
                _mm_storeu_si128(i_out.as_mut_ptr().cast(), ix);
                _mm256_storeu_si256(l_out.as_mut_ptr().cast(), lw);
                _mm512_storeu_si512(f_out.as_mut_ptr().cast(), fw);
            }
            // Each slot's last nonzero word of the 16 is its entry now.
            let (set, from) = last_of_slots(keys);
            dv = _mm512_mask_permutexvar_epi32(dv, set, from, w);
            ip += indexed.count_ones() as usize;
            lp += partial.count_ones() as usize;
            fp += miss.count_ones() as usize;
        }
        // SAFETY: 16 of the dictionary's 17 entries; unaligned.
        unsafe { _mm512_storeu_si512(dict.as_mut_ptr().cast(), dv) };
        *c = Counts { full: fp, index: ip, low: lp };
        16 * groups
    }
}

#[cfg(not(all(target_arch = "x86_64", wkdm_avx512)))]
mod avx512 {
    use super::Counts;

    /// No vector decoder or encoder on this architecture or with this
    /// compiler.
    pub(super) fn available() -> bool {
        false
    }

    /// Never called: [`available`] is false.
    ///
    /// # Safety
    ///
    /// None needed; it panics.
    pub(super) unsafe fn decode(_: &[u8], _: usize, _: &[u8], _: &[u8], _: &[u16], _: &mut [u8]) {
        unreachable!("no vector decoder in this build")
    }
    /// Never called: [`available`] is false.
    ///
    /// # Safety
    ///
    /// None needed; it panics.
    pub(super) unsafe fn model(
        _: &[u8],
        _: &mut [u8],
        _: &mut [u8],
        _: &mut [u16],
        _: &mut [u32],
        _: &mut [u32; 17],
        _: &mut Counts,
    ) -> usize {
        unreachable!("no vector encoder in this build")
    }
}

/// The vector decoder for x86-64 CPUs with AVX2 but no AVX-512 (AMD Zen 2
/// and 3, Intel before Ice Lake): 8 words at a time, each planned in
/// registers and run through the dictionary in a scalar loop, with the zero
/// words left out of that loop.
///
/// AVX2 has no `vpexpandd`, so each segment's entries are spread over the
/// words of their tag by a lane permutation (`vpermd`) whose indices come
/// from a 256-entry table keyed by the 8-bit tag mask (`SPREAD`); the
/// full words are read with a plain load (a masked one near the end). Each
/// word gets a plan — the dictionary entry it loads, the
/// bits it keeps, the bits it adds, the entry it stores to — and a short
/// branch-free scalar loop runs the plans in order through the dictionary.
/// Here the plans of zero words (~30% of the words of a Python heap) are
/// left out: each 8 words' plans are packed to the front with the same
/// permutation from a second table (`PACK`), each carrying its word's
/// position, and the zero words come out of a vector store of the
/// words' full values (zero for them) made before the loop.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::LOW_MASK;

    /// Whether this CPU can run [`decode`].
    pub(super) fn available() -> bool {
        cfg!(not(miri)) && is_x86_feature_detected!("avx2") && is_x86_feature_detected!("popcnt")
    }

    /// `SPREAD[m]`, nibble `i`: how many of the set bits of `m` lie below
    /// bit `i`. When the next entries of a segment sit packed in lanes
    /// 0, 1, 2, …, lane `i` of a word whose tag is in `m` takes the entry
    /// in that lane.
    static SPREAD: [u32; 256] = {
        let mut t = [0u32; 256];
        let mut m = 0;
        while m < 256 {
            let mut i = 0;
            while i < 8 {
                t[m] |= ((m as u32) & ((1 << i) - 1)).count_ones() << (4 * i);
                i += 1;
            }
            m += 1;
        }
        t
    };

    /// `PACK[m]`, nibble `j`: the lane of the `j`-th set bit of `m` (0 past
    /// the last): the permutation that packs the lanes in `m` to the front.
    static PACK: [u32; 256] = {
        let mut t = [0u32; 256];
        let mut m = 0;
        while m < 256 {
            let (mut i, mut j) = (0, 0);
            while i < 8 {
                if m & (1 << i) != 0 {
                    t[m] |= i << (4 * j);
                    j += 1;
                }
                i += 1;
            }
            m += 1;
        }
        t
    };

    /// Words planned at a time before their plans run.
    const BLOCK: usize = 128;
    /// Dictionary entries 16..24: where exact matches store, one per lane
    /// of the 8, so that no two nearby words store to one entry.
    const SCRATCH: i32 = 16;

    /// Decodes `n` words into `dst` (`4 * n` bytes) from the packed tags
    /// (`ceil(n / 4)` bytes), the full words as they are packed, and the
    /// indices and low bits unpacked one per entry, each followed by at
    /// least 8 more entries (their values do not matter).
    ///
    /// Every segment read is bounds-checked (8 words at a time), so corrupt
    /// counts make this panic, never read out of bounds; a page that passed
    /// [`super::Layout::check`] never panics.
    ///
    /// # Safety
    ///
    /// The CPU must support AVX2 and POPCNT ([`available`]).
    #[target_feature(enable = "avx2,popcnt")]
    pub(super) unsafe fn decode(
        tags: &[u8],
        n: usize,
        full: &[u8],
        index: &[u8],
        low: &[u16],
        dst: &mut [u8],
    ) {
        assert!(tags.len() == n.div_ceil(4) && dst.len() == 4 * n);
        assert!(full.len() % 4 == 0 && index.len() >= 8 && low.len() >= 8);
        // Largest cursor values from which 8 entries can be loaded.
        let (max_ip, max_lp) = (index.len() - 8, low.len() - 8);
        let max_fp = full.len() / 4;
        // The packed plans of a block's nonzero words: x, a, and p = the
        // entry loaded | the entry stored << 8 | the word's position in
        // the block << 16. 8 entries of room past the block for the last
        // packed store.
        let (mut x, mut a, mut p) = ([0u32; BLOCK + 8], [0u32; BLOCK + 8], [0u32; BLOCK + 8]);
        let mut dict = [0u32; 256];
        let hash = _mm256_set1_epi32(0x9E37_79B1_u32 as i32);
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let scratch = _mm256_add_epi32(lanes, _mm256_set1_epi32(SCRATCH));
        let tag_shift = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
        let nibble_shift = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
        let (one, two, three, seven) =
            (_mm256_set1_epi32(1), _mm256_set1_epi32(2), _mm256_set1_epi32(3), _mm256_set1_epi32(7));
        let high = _mm256_set1_epi32(!LOW_MASK as i32);
        // A lane permutation from a table of nibbles.
        let perm =
            |t: u32| _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(t as i32), nibble_shift), seven);
        let mask8 = |v: __m256i| _mm256_movemask_ps(_mm256_castsi256_ps(v)) as usize;
        let (mut fp, mut ip, mut lp) = (0usize, 0usize, 0usize);
        for (b, out) in dst.chunks_mut(4 * BLOCK).enumerate() {
            let words = out.len() / 4;
            let mut k = 0; // packed plans so far
            for c in 0..words.div_ceil(8) {
                // The tags of the next 8 words (fewer at the end: the
                // missing ones read as zero words).
                let w0 = b * BLOCK + 8 * c;
                let t = if n - w0 >= 8 {
                    u16::from_le_bytes([tags[w0 / 4], tags[w0 / 4 + 1]]) as u32
                } else {
                    let mut t = [0u8; 2];
                    let rest = &tags[w0 / 4..];
                    t[..rest.len()].copy_from_slice(rest);
                    u16::from_le_bytes(t) as u32 & ((1 << (2 * (n - w0))) - 1)
                };
                let tv = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(t as i32), tag_shift), three);
                let miss = _mm256_cmpeq_epi32(tv, three);
                let partial = _mm256_cmpeq_epi32(tv, two);
                let exact = _mm256_cmpeq_epi32(tv, one);
                let indexed = _mm256_or_si256(partial, exact);
                let (mm, mi, mp) = (mask8(miss), mask8(indexed), mask8(partial));
                let (nf, ni, nl) =
                    (mm.count_ones() as usize, mi.count_ones() as usize, mp.count_ones() as usize);
                assert!(fp + nf <= max_fp && ip <= max_ip && lp <= max_lp, "WK counts checked");
                // SAFETY: the load from `full` reads 8 4-byte entries from
                // fp when fp + 8 <= max_fp = full.len() / 4; otherwise a
                // masked load reads exactly the first nf = popcount(miss)
                // lanes, entries fp..fp + nf <= max_fp (asserted), and the
                // masked-off lanes are not accessed (a masked load costs
                // several times a plain one here, so it is kept for the
                // last entries). The loads from `index` (8 bytes) and
                // `low` (8 u16s) start at ip <= index.len() - 8 and lp <=
                // low.len() - 8 (asserted). All loads are unaligned.
                let (f, ix, lw) = unsafe {
                    let at = full.as_ptr().add(4 * fp);
                    (
                        if fp + 8 <= max_fp {
                            _mm256_loadu_si256(at.cast())
                        } else {
                            let first = _mm256_cmpgt_epi32(_mm256_set1_epi32(nf as i32), lanes);
                            _mm256_maskload_epi32(at.cast(), first)
                        },
                        _mm_loadl_epi64(index.as_ptr().add(ip).cast()),
                        _mm_loadu_si128(low.as_ptr().add(lp).cast()),
                    )
                };
                (fp, ip, lp) = (fp + nf, ip + ni, lp + nl);
                // Spread each segment's entries over the words of its tag.
                let f = _mm256_and_si256(_mm256_permutevar8x32_epi32(f, perm(SPREAD[mm])), miss);
                let ix = _mm256_permutevar8x32_epi32(_mm256_cvtepu8_epi32(ix), perm(SPREAD[mi]));
                let lw = _mm256_permutevar8x32_epi32(_mm256_cvtepu16_epi32(lw), perm(SPREAD[mp]));
                // zero: 0; exact: the entry; partial: its high bits and the
                // low bits; miss: the full word.
                let xv = _mm256_or_si256(f, _mm256_and_si256(lw, partial));
                let av = _mm256_or_si256(exact, _mm256_and_si256(partial, high));
                // Stores: a miss to slot(word), a partial match to its
                // index, an exact match to its lane's scratch entry; loads:
                // exact and partial matches from their index, misses from
                // where they store (the value is masked off).
                let slot = _mm256_srli_epi32::<28>(_mm256_mullo_epi32(_mm256_srli_epi32::<10>(f), hash));
                let sv = _mm256_blendv_epi8(_mm256_blendv_epi8(scratch, ix, partial), slot, miss);
                let lv = _mm256_blendv_epi8(sv, ix, indexed);
                let at = _mm256_add_epi32(lanes, _mm256_set1_epi32(8 * c as i32));
                let pv = _mm256_or_si256(
                    _mm256_or_si256(lv, _mm256_slli_epi32::<8>(sv)),
                    _mm256_slli_epi32::<16>(at),
                );
                // Every word's full value (the final one for zero words
                // and misses), then the nonzero words' plans packed.
                let nz = mm | mi;
                let pack = perm(PACK[nz]);
                let rest = out.len() - 32 * c;
                // SAFETY: out's words 8c..8c + 8 exist when 8c + 8 <=
                // words (the last, shorter group of a page goes through a
                // copy); c < words.div_ceil(8) <= BLOCK / 8 and k <= 8c, so
                // entries k..k + 8 are within the BLOCK + 8-entry arrays.
                // The stores are unaligned.
                unsafe {
                    if rest >= 32 {
                        _mm256_storeu_si256(out.as_mut_ptr().add(32 * c).cast(), xv);
                    } else {
                        let mut last = [0u8; 32];
                        _mm256_storeu_si256(last.as_mut_ptr().cast(), xv);
                        out[32 * c..].copy_from_slice(&last[..rest]);
                    }
                    _mm256_storeu_si256(x.as_mut_ptr().add(k).cast(), _mm256_permutevar8x32_epi32(xv, pack));
                    _mm256_storeu_si256(a.as_mut_ptr().add(k).cast(), _mm256_permutevar8x32_epi32(av, pack));
                    _mm256_storeu_si256(p.as_mut_ptr().add(k).cast(), _mm256_permutevar8x32_epi32(pv, pack));
                }
                k += nz.count_ones() as usize;
            }
            // The plans in order: word `p >> 16` loads entry `p & 255`,
            // keeps the bits `a` of it and ORs in `x`; the result is the
            // word, and it is stored to entry `p >> 8 & 255`. Branch-free
            // (a byte indexes the 256 entries without a bounds check).
            let o = out.as_mut_ptr();
            for ((&x, &a), &p) in x[..k].iter().zip(&a[..k]).zip(&p[..k]) {
                let v = (dict[p as u8 as usize] & a) | x;
                dict[(p >> 8) as u8 as usize] = v;
                // SAFETY: a packed plan's position is 8c + i for a lane i
                // whose tag is nonzero, and lanes at or past the page's
                // last word were given zero tags, so it is below `words`:
                // the 4 bytes written are within `out`.
                unsafe { o.add(4 * (p >> 16) as usize).cast::<u32>().write_unaligned(v.to_le()) };
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod avx2 {
    /// No vector decoder on this architecture.
    pub(super) fn available() -> bool {
        false
    }

    /// Never called: [`available`] is false.
    ///
    /// # Safety
    ///
    /// None needed; it panics.
    pub(super) unsafe fn decode(_: &[u8], _: usize, _: &[u8], _: &[u8], _: &[u16], _: &mut [u8]) {
        unreachable!("no vector decoder in this build")
    }
}

/// Packed tag byte → four tag bytes (as a little-endian u32).
static TAG_UNPACK: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut b = 0;
    while b < 256 {
        let x = b as u32;
        t[b] = (x & 3) | ((x >> 2 & 3) << 8) | ((x >> 4 & 3) << 16) | ((x >> 6 & 3) << 24);
        b += 1;
    }
    t
};

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(words: &[u32]) -> Vec<u8> {
        crate::testutil::round_trip(&mut Wkdm::new(), &crate::testutil::words(words))
    }

    #[test]
    fn golden_vectors() {
        // Four zero words: header + one tag byte of zeros.
        assert_eq!(enc(&[0, 0, 0, 0]), vec![1, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0x00]);
        // 5 is a partial match of the zero-initialised slot(5) = slot(0) = 0:
        // tag 2, index 0, low bits 5. Then 5 again: exact, index 0.
        // Then 0x12345678: miss (tag 3), full word. Then 0: zero.
        assert_eq!(slot(5), 0);
        let out = enc(&[5, 5, 0x1234_5678, 0]);
        let tags = 2 | (1 << 2) | (3 << 4); // 0b00_11_01_10
        assert_eq!(
            out,
            vec![
                1, 0, 4, 0, 1, 0, 2, 0, 1, 0,    // header: 4 words, 1 full, 2 indices, 1 low
                tags, // tags
                0x78, 0x56, 0x34, 0x12, // full word
                0x00, // indices 0 and 0
                5, 0, 0, 0, 0, // low-bits group: 5
            ]
        );
        // A partial match against a missed word fills in its slot index.
        let w = 0x1234_5400u32;
        let out = enc(&[w, w | 0x3ff]);
        assert_eq!(slot(w), slot(w | 0x3ff));
        assert_eq!(out[10], 3 | (2 << 2));
        assert_eq!(&out[11..15], &w.to_le_bytes());
        assert_eq!(out[15], slot(w) as u8);
        assert_eq!(&out[16..21], &[0xff, 0x03, 0, 0, 0]);
    }

    /// The decoders this CPU runs. A vector decoder the CPU lacks is
    /// named on stderr (the CI hosts run at least one of them).
    fn available_decoders() -> Vec<Decoder> {
        let mut d = vec![Decoder::Scalar];
        for (v, yes) in [(Decoder::Avx2, avx2::available()), (Decoder::Avx512, avx512::available())] {
            if yes {
                d.push(v);
            } else {
                eprintln!("no {v:?} decoder on this CPU or compiler: it is not tested");
            }
        }
        d
    }

    /// Decodes `src` (a page of `len` bytes) with every decoder — the safe
    /// twin, the unchecked scalar loop and `decompress` with each decoder
    /// the CPU runs — checks that they agree and returns the page.
    fn decode_every_way(src: &[u8], len: usize) -> Vec<u8> {
        let mut seg = Segments::new();
        let c = seg.unpack(VERSION, src, len).unwrap();
        let n = len / 4;
        let (tags, full, index, low) =
            (&seg.tags[..n], &seg.full[..c.full], &seg.index[..c.index], &seg.low[..c.low]);
        let mut safe = vec![0u8; len];
        decode_words_safe(tags, full, index, low, &mut safe);
        let mut fast = vec![0xa5u8; len];
        decode_words_fast(tags, full, index, low, &mut fast);
        assert!(fast == safe, "decode_words_fast differs from decode_words_safe");
        for decoder in available_decoders() {
            let mut c = Wkdm::new();
            c.decoder = decoder;
            let mut out = vec![0x5au8; len];
            c.decompress(src, &mut out).unwrap();
            assert!(out == safe, "decompress ({decoder:?} decoder) differs from decode_words_safe");
        }
        safe
    }

    #[test]
    fn decoders_agree_on_synthetic_and_corpus_pages() {
        let mut rng = crate::corpus::synth::Rng::new(5);
        let mut pages = Vec::new();
        for kind in crate::corpus::synth::KINDS {
            for len in [4, 60, 4096, 4100, crate::MAX_INPUT] {
                let mut page = vec![0u8; len.next_multiple_of(8)];
                crate::corpus::synth::fill(&mut page, kind, &mut rng);
                page.truncate(len);
                pages.push(page);
            }
        }
        let f =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/python-dict.pages");
        let corpus =
            crate::corpus::Corpus::load(&[f]).expect("python-dict.pages (CI provides ../shared/corpus)");
        pages.extend(corpus.pages().step_by(7).map(|p| p.to_vec()));
        let mut c = Wkdm::new();
        for page in pages {
            let mut out = vec![0u8; c.max_compressed_len(page.len())];
            let n = c.compress(&page, &mut out).unwrap();
            assert!(decode_every_way(&out[..n], page.len()) == page);
        }
    }

    /// The vector encoder writes what the scalar one writes, byte for byte,
    /// and overflows where it does: on synthetic pages of every kind and
    /// length, corpus pages, and pages made to collide in the dictionary
    /// within a group of 16 words (few slots, zero words between).
    #[test]
    fn encoders_agree_on_synthetic_corpus_and_colliding_pages() {
        if !avx512::available() {
            // The CI hosts have AVX-512; a host without it says so.
            eprintln!("no vector encoder on this CPU or compiler: it is not tested");
            return;
        }
        let mut rng = crate::corpus::synth::Rng::new(21);
        let mut pages = Vec::new();
        for kind in crate::corpus::synth::KINDS {
            for len in [4, 60, 64, 68, 1020, 1024, 4096, 4100, crate::MAX_INPUT] {
                let mut page = vec![0u8; len.next_multiple_of(8)];
                crate::corpus::synth::fill(&mut page, kind, &mut rng);
                page.truncate(len);
                pages.push(page);
            }
        }
        for round in 0..200 {
            // Words from a few high parts (so a few slots), random low
            // bits, and zero words at a rate that varies by round.
            let highs: Vec<u32> = (0..1 + rng.below(4)).map(|_| rng.next_u64() as u32 & !LOW_MASK).collect();
            let zeros = rng.below(4);
            let words: Vec<u32> = (0..[16, 48, 1024][round % 3])
                .map(|_| match rng.below(8) {
                    r if r < zeros => 0,
                    4 => rng.next_u64() as u32,
                    5 => rng.below(1024) as u32,
                    _ => highs[rng.below(highs.len() as u64) as usize] | (rng.below(4) as u32),
                })
                .collect();
            pages.push(crate::testutil::words(&words));
        }
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus");
        for f in ["python-dict.pages", "gcc-cc1.pages"] {
            let corpus =
                crate::corpus::Corpus::load(&[dir.join(f)]).expect("corpus (CI provides ../shared/corpus)");
            pages.extend(corpus.pages().step_by(5).map(|p| p.to_vec()));
        }
        let (mut scalar, mut vector) = (Wkdm::new(), Wkdm::new());
        scalar.vector_encoder = false;
        for (k, page) in pages.iter().enumerate() {
            let cap = scalar.max_compressed_len(page.len());
            let (mut a, mut b) = (vec![0u8; cap], vec![0u8; cap]);
            let n = scalar.compress(page, &mut a).unwrap();
            let m = vector.compress(page, &mut b).unwrap();
            assert!(a[..n] == b[..m], "page {k} ({} bytes): the encoders differ", page.len());
            // Too small by one byte, and by half: both refuse.
            for cap in [n - 1, n / 2] {
                let (mut a, mut b) = (vec![0u8; cap], vec![0u8; cap]);
                assert!(scalar.compress(page, &mut a).is_err() && vector.compress(page, &mut b).is_err());
            }
        }
    }

    /// Valid but arbitrary compressed pages: random tags (padding tags
    /// too), indices naming slots never written, random segment bytes, and
    /// the header counts that make them pass the checks.
    #[test]
    fn decoders_agree_on_arbitrary_valid_input() {
        let mut rng = crate::corpus::synth::Rng::new(9);
        for round in 0..400 {
            let n = match round % 4 {
                0 => 1 + rng.below(40) as usize,
                1 => 1024,
                2 => 1 + rng.below(MAX_WORDS as u64) as usize,
                _ => MAX_WORDS - rng.below(20) as usize,
            };
            // Tag mixes from all zero to all miss: tag t has weight w[t].
            let w: Vec<u64> = (0..4).map(|_| rng.below(4)).collect();
            let total: u64 = w.iter().sum();
            let mut tags = vec![0u8; n.div_ceil(4)];
            for i in 0..4 * tags.len() {
                let mut t = 0;
                if total == 0 {
                    t = rng.below(4) as usize;
                } else {
                    let mut r = rng.below(total);
                    while r >= w[t] {
                        r -= w[t];
                        t += 1;
                    }
                }
                tags[i / 4] |= (t as u8) << (2 * (i % 4));
            }
            let (mut nf, mut nl, mut ne) = count_tags(&tags);
            if nf + nl + ne > n {
                // Too many padding tags to pass the header check.
                tags[n / 4] &= (1 << (2 * (n % 4))) - 1;
                (nf, nl, ne) = count_tags(&tags);
            }
            let ni = nl + ne;
            let mut src = vec![VERSION, 0];
            for v in [n, nf, ni, nl] {
                src.extend_from_slice(&(v as u16).to_le_bytes());
            }
            src.extend_from_slice(&tags);
            let body = packed_len(n, nf, ni, nl) - src.len();
            src.extend((0..body).map(|_| rng.next_u64() as u8));
            decode_every_way(&src, 4 * n);
        }
    }

    #[test]
    fn vector_decoder_panics_on_counts_it_was_not_given() {
        if !avx512::available() {
            return;
        }
        // 16 misses but room for 15 full words: a panic, not a read past
        // the end.
        let tags = [0xffu8; 4];
        let (index, low) = ([0u8; 16], [0u16; 16]);
        let mut dst = [0u8; 64];
        let r = std::panic::catch_unwind(move || {
            // SAFETY: the CPU has the features (checked above).
            unsafe { avx512::decode(&tags, 16, &[0u8; 60], &index, &low, &mut dst) }
        });
        assert!(r.is_err());
    }

    #[test]
    fn avx2_decoder_panics_on_counts_it_was_not_given() {
        if !avx2::available() {
            eprintln!("no AVX2 decoder on this CPU: its bounds are not tested");
            return;
        }
        let (index, low) = ([0u8; 8], [0u16; 8]);
        // 8 misses but room for 7 full words: a panic, not a read past the
        // end.
        let r = std::panic::catch_unwind(move || {
            let mut dst = [0u8; 32];
            // SAFETY: the CPU has the features (checked above).
            unsafe { avx2::decode(&[0xff; 2], 8, &[0u8; 28], &index, &low, &mut dst) }
        });
        assert!(r.is_err());
        // 8 exact matches with an index segment of 8 entries and no slack.
        let r = std::panic::catch_unwind(move || {
            let mut dst = [0u8; 64];
            // SAFETY: as above.
            unsafe { avx2::decode(&[0x55; 4], 16, &[], &index, &low, &mut dst) }
        });
        assert!(r.is_err());
        // The same counts with room for them decode.
        let mut dst = [0xa5u8; 32];
        let full: Vec<u8> = (1..=8u32).flat_map(|w| (w << 12).to_le_bytes()).collect();
        // SAFETY: as above.
        unsafe { avx2::decode(&[0xff; 2], 8, &full, &index, &low, &mut dst) };
        assert_eq!(dst.to_vec(), full);
    }

    /// Corrupt pages (valid ones with tag bytes, counts or segment bytes
    /// changed): every decoder the CPU runs accepts and refuses the same
    /// ones, and decodes the accepted ones alike.
    #[test]
    fn decoders_agree_on_corrupt_input() {
        let mut rng = crate::corpus::synth::Rng::new(13);
        let mut c = Wkdm::new();
        let (mut refused, mut accepted) = (0, 0);
        for round in 0..3000 {
            let len: usize = [64, 4096, 1000][round % 3];
            let mut page = vec![0u8; len.next_multiple_of(8)];
            crate::corpus::synth::fill(&mut page, crate::corpus::synth::KINDS[round % 4], &mut rng);
            page.truncate(len);
            let mut src = vec![0u8; c.max_compressed_len(len)];
            let n = c.compress(&page, &mut src).unwrap();
            src.truncate(n);
            for _ in 0..1 + rng.below(3) {
                let at = match rng.below(3) {
                    0 => HEADER + rng.below((len / 16) as u64) as usize, // a tag byte
                    1 => 2 + rng.below(8) as usize,                      // a count
                    _ => rng.below(n as u64) as usize,
                };
                if at < src.len() {
                    src[at] ^= 1 << rng.below(8);
                }
            }
            let mut first: Option<Result<Vec<u8>, ()>> = None;
            for decoder in available_decoders() {
                let mut d = Wkdm::new();
                d.decoder = decoder;
                let mut out = vec![0u8; len];
                let r = d.decompress(&src, &mut out).map(|()| out).map_err(|_| ());
                match &first {
                    None => first = Some(r),
                    Some(f) => assert!(*f == r, "{decoder:?} decoder disagrees on round {round}"),
                }
            }
            if first.unwrap().is_ok() {
                accepted += 1;
            } else {
                refused += 1;
            }
        }
        assert!(refused > 500 && accepted > 100, "refused {refused}, accepted {accepted}");
    }

    #[test]
    fn header_checks_reject_bad_counts() {
        let out = enc(&[5, 5, 0x1234_5678, 0]);
        let mut back = vec![0u8; 16];
        let mut c = Wkdm::new();
        let mut bad = out.clone();
        bad[0] = 2;
        assert!(matches!(c.decompress(&bad, &mut back), Err(DecompressError::WrongFormat { .. })));
        let mut bad = out.clone();
        bad[4] = 2; // n_full 2
        assert!(c.decompress(&bad, &mut back).is_err());
        let mut bad = out.clone();
        bad[10] = 0xff; // all misses: counts disagree
        assert!(c.decompress(&bad, &mut back).is_err());
        assert!(c.decompress(&out[..out.len() - 1], &mut back).is_err());
        let mut long = out.clone();
        long.push(0);
        assert!(c.decompress(&long, &mut back).is_err());
        let mut back8 = vec![0u8; 8];
        assert!(matches!(c.decompress(&out, &mut back8), Err(DecompressError::LengthMismatch { .. })));
    }
}
