//! The AVX2 kernel ([`super::Kernel::Avx2`]), for x86-64 CPUs with AVX2
//! and POPCNT (AMD since Zen 1, Intel since Haswell): 8 words at a time
//! in vector registers, and the dictionary, which makes WKdm sequential,
//! in a short branch-free scalar loop.
//!
//! AVX2 has no `vpcompressd`/`vpexpandd` (AVX-512's packing of a segment's
//! entries to or from the words of their tag): here a lane permutation
//! (`vpermd`) does it, with its indices from a 256-entry table keyed by
//! the 8-bit mask of the words of a tag — [`SPREAD`] to spread a segment's
//! next entries over its words, [`PACK`] to pack its words' entries to
//! the front. A table entry is 8 bytes, one lane index each, read and
//! widened by one `vpmovzxbd`.
//!
//! ## Encoder ([`model`])
//!
//! A word is matched against the dictionary entry its slot holds, which the
//! last nonzero word of that slot left. Three passes over a block of up to
//! 256 words:
//!
//! 1. each word's slot, 8 at a time (zero words get slot 16, a scratch
//!    entry, since they do not store);
//! 2. in order, each word's entry (load) and the word into its slot
//!    (store) — a loop of two loads and two stores a word, with no chain
//!    through the dictionary since a store's data is the input word;
//! 3. 8 at a time, the tags from three compares of word and entry, each
//!    segment's entries packed to its cursor (`PACK`), and the tags
//!    written one byte per word from the masks through [`BITS`].
//!
//! ## Decoder ([`decode`])
//!
//! The indices and low bits are unpacked to one entry each first (16 to 32
//! at a time with byte shuffles and multiplies). Then, for each 8 words,
//! the tags give masks of the four kinds; each segment's next entries are
//! loaded and spread over the words of their tag; and each word gets a
//! plan: the dictionary entry it loads (its index), the bits of it it
//! keeps (all for an exact match, the high 22 for a partial one, none for
//! a miss), the bits it adds (the low bits or the full word) and the
//! entry it stores to (its index, its slot, or for an
//! exact match a scratch entry of its lane, so that exact matches, which
//! change nothing, add no store-to-load chain). A miss loads an entry
//! nothing stores to, since it keeps none of it. The words' full values —
//! right for misses and zero words — are stored to the output, and the
//! nonzero words' plans, each with its position, are packed to the front
//! of a block's plan arrays (`PACK`); on pages with few zero words every
//! word gets a plan in place instead. After 256 words a scalar loop runs
//! the plans in order through the dictionary: a load, an and, an or and
//! two stores a word.

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use super::{Counts, Layout, Segments, CHECK_EVERY, HASH, LOW_MASK};

/// Whether this CPU can run the kernel.
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("popcnt")
}

/// A table of 8 lane indices (one byte each) for each 8-bit mask.
type Lanes = [u64; 256];

/// `SPREAD[m]`, byte `i`: how many of the set bits of `m` lie below bit
/// `i`. When a segment's next entries sit in lanes 0, 1, 2, …, lane `i`
/// of a word whose tag is in `m` takes the entry in that lane.
static SPREAD: Lanes = {
    let mut t = [0u64; 256];
    let mut m = 0;
    while m < 256 {
        let mut i = 0;
        while i < 8 {
            t[m] |= (((m as u32) & ((1 << i) - 1)).count_ones() as u64) << (8 * i);
            i += 1;
        }
        m += 1;
    }
    t
};

/// `PACK[m]`, byte `j`: the lane of the `j`-th set bit of `m` (0 past the
/// last): the permutation that packs the lanes in `m` to the front.
static PACK: Lanes = {
    let mut t = [0u64; 256];
    let mut m = 0;
    while m < 256 {
        let (mut i, mut j) = (0, 0);
        while i < 8 {
            if m & (1 << i) != 0 {
                t[m] |= (i as u64) << (8 * j);
                j += 1;
            }
            i += 1;
        }
        m += 1;
    }
    t
};

/// `BITS[m]`, byte `i`: bit `i` of `m`.
static BITS: Lanes = {
    let mut t = [0u64; 256];
    let mut m = 0;
    while m < 256 {
        let mut i = 0;
        while i < 8 {
            t[m] |= (((m >> i) & 1) as u64) << (8 * i);
            i += 1;
        }
        m += 1;
    }
    t
};

/// The lane permutation of `table[mask]`.
#[inline]
#[target_feature(enable = "avx2")]
fn lanes(table: &Lanes, mask: u32) -> __m256i {
    let entry = &table[mask as usize & 255];
    // SAFETY: an 8-byte load from an 8-byte table entry; unaligned.
    _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64((entry as *const u64).cast()) })
}

/// The 8-bit mask of the lanes of `v` whose top bit is set.
#[inline]
#[target_feature(enable = "avx2")]
fn mask8(v: __m256i) -> u32 {
    _mm256_movemask_ps(_mm256_castsi256_ps(v)) as u32
}

/// Each lane's dictionary slot: a multiplicative hash of its high 22 bits.
#[inline]
#[target_feature(enable = "avx2")]
fn slots(w: __m256i) -> __m256i {
    _mm256_srli_epi32::<28>(_mm256_mullo_epi32(_mm256_srli_epi32::<10>(w), _mm256_set1_epi32(HASH as i32)))
}

/// The encoder: models the first `8 * (words / 8)` words of `block` (at
/// most [`CHECK_EVERY`]) as the scalar `model_block` does — tags to
/// `tags`, segment entries appended at the cursors in `c`, the dictionary
/// updated — and returns how many words it modelled; the caller models
/// the rest.
///
/// Each segment must have room for as many entries past its cursor as
/// words are modelled; it panics otherwise.
///
/// # Safety
///
/// The CPU must support AVX2 and POPCNT ([`available`]).
#[target_feature(enable = "avx2,popcnt")]
pub(super) unsafe fn model(
    block: &[u8],
    tags: &mut [u8],
    index: &mut [u8],
    low: &mut [u16],
    full: &mut [u32],
    dict: &mut [u32; 17],
    c: &mut Counts,
) -> usize {
    let groups = (block.len() / 32).min(CHECK_EVERY / 8);
    let m = 8 * groups;
    assert!(tags.len() >= m);
    assert!(index.len() >= c.index + m && low.len() >= c.low + m && full.len() >= c.full + m);
    let src = block.as_ptr();
    let zero = _mm256_setzero_si256();

    // 1. Each word's slot; zero words store to the scratch slot 16. (The
    // arrays are written before they are read: no zeroing.)
    let mut keys = [MaybeUninit::<u32>::uninit(); CHECK_EVERY];
    for (g, k) in keys[..m].chunks_exact_mut(8).enumerate() {
        // SAFETY: a 32-byte load of words 8g..8g + 8 < m of `block`; the
        // store writes the 8 entries of `k`. Both unaligned.
        unsafe {
            let w = _mm256_loadu_si256(src.add(32 * g).cast());
            let key = _mm256_blendv_epi8(slots(w), _mm256_set1_epi32(16), _mm256_cmpeq_epi32(w, zero));
            _mm256_storeu_si256(k.as_mut_ptr().cast(), key);
        }
    }
    // SAFETY: the first m entries were written just above.
    let keys = unsafe { std::slice::from_raw_parts(keys.as_ptr().cast::<u32>(), m) };

    // 2. In order: each word's dictionary entry, then the word into it.
    let mut prev = [MaybeUninit::<u32>::uninit(); CHECK_EVERY];
    let mut d = [0u32; 32];
    d[..17].copy_from_slice(dict);
    for ((&k, p), w) in keys.iter().zip(&mut prev[..m]).zip(block.chunks_exact(4)) {
        let k = k as usize & 31;
        p.write(d[k]);
        d[k] = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
    }
    dict.copy_from_slice(&d[..17]);

    // 3. Tags and segments, 8 words at a time.
    let high = _mm256_set1_epi32(!LOW_MASK as i32);
    let low_mask = _mm256_set1_epi32(LOW_MASK as i32);
    // Byte 0 of each 32-bit lane to the first 4 bytes of its 128-bit half,
    // then the halves' first 4 bytes side by side.
    let byte0 = _mm256_setr_epi8(
        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1,
        -1, -1, -1, -1, -1,
    );
    let halves = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0);
    let (mut ip, mut lp, mut fp) = (c.index, c.low, c.full);
    for (g, t_out) in tags[..m].chunks_exact_mut(8).enumerate() {
        // SAFETY: 32-byte loads of words 8g..8g + 8 < m of `block`, of
        // entries 8g..8g + 8 of `prev` (written in step 2) and of `keys`;
        // unaligned.
        let (w, d, h) = unsafe {
            (
                _mm256_loadu_si256(src.add(32 * g).cast()),
                _mm256_loadu_si256(prev.as_ptr().add(8 * g).cast()),
                _mm256_loadu_si256(keys.as_ptr().add(8 * g).cast()),
            )
        };
        let x = _mm256_xor_si256(w, d);
        let nz = !mask8(_mm256_cmpeq_epi32(w, zero)) & 255;
        let exact = mask8(_mm256_cmpeq_epi32(x, zero)) & nz;
        let indexed = mask8(_mm256_cmpeq_epi32(_mm256_and_si256(x, high), zero)) & nz;
        let partial = indexed & !exact;
        let miss = nz & !indexed;
        // zero → 0, exact → 1, partial → 2, miss → 3.
        let t = BITS[(exact | miss) as usize] | BITS[(partial | miss) as usize] << 1;
        t_out.copy_from_slice(&t.to_le_bytes());
        // Each segment's entries of the 8 words, packed to the front.
        let ix = _mm256_permutevar8x32_epi32(h, lanes(&PACK, indexed));
        let ix = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(ix, byte0), halves);
        let lw = _mm256_permutevar8x32_epi32(_mm256_and_si256(w, low_mask), lanes(&PACK, partial));
        let lw = _mm256_permute4x64_epi64::<0b1000>(_mm256_packus_epi32(lw, lw));
        let fw = _mm256_permutevar8x32_epi32(w, lanes(&PACK, miss));
        // SAFETY: each store writes 8 entries at a cursor that is at most
        // its count + 8g (it advances by at most 8 a group), within the
        // room for `m` entries past the count asserted above; unaligned.
        unsafe {
            _mm_storel_epi64(index.as_mut_ptr().add(ip).cast(), _mm256_castsi256_si128(ix));
            _mm_storeu_si128(low.as_mut_ptr().add(lp).cast(), _mm256_castsi256_si128(lw));
            _mm256_storeu_si256(full.as_mut_ptr().add(fp).cast(), fw);
        }
        ip += indexed.count_ones() as usize;
        lp += partial.count_ones() as usize;
        fp += miss.count_ones() as usize;
    }
    *c = Counts { full: fp, index: ip, low: lp };
    m
}

/// Unpacks the indices (one byte each) and the low bits (one `u16` each)
/// of a page `lay` validated into `seg`, 32 indices and 16 low-bits values
/// at a time while the loads stay within `src`, then one by one.
///
/// # Safety
///
/// The CPU must support AVX2 ([`available`]).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn unpack_index_low(src: &[u8], lay: &Layout, seg: &mut Segments) {
    assert!(src.len() >= lay.end);
    // Indices: 16 packed bytes give 32 entries.
    let idx = &src[lay.index()];
    let (mut i, out) = (0, seg.index.as_mut_ptr());
    let nibble = _mm_set1_epi8(15);
    while i < idx.len() && lay.index_at + i + 16 <= src.len() && 2 * i + 32 <= seg.index.len() {
        // SAFETY: a 16-byte load within `src` and two 16-byte stores
        // within `seg.index` (both checked by the loop); unaligned.
        unsafe {
            let v = _mm_loadu_si128(src.as_ptr().add(lay.index_at + i).cast());
            let lo = _mm_and_si128(v, nibble);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), nibble);
            _mm_storeu_si128(out.add(2 * i).cast(), _mm_unpacklo_epi8(lo, hi));
            _mm_storeu_si128(out.add(2 * i + 16).cast(), _mm_unpackhi_epi8(lo, hi));
        }
        i += 16;
    }
    for (k, &b) in idx.iter().enumerate().skip(i) {
        seg.index[2 * k] = b & 15;
        seg.index[2 * k + 1] = b >> 4;
    }
    // Low bits: value k of a 5-byte group is bits 2k..2k + 10 of its bytes
    // k and k + 1 read as a 16-bit number; a multiply by 2^(6 - 2k) moves
    // them to bits 6..16 and a shift down by 6 to 0..10. Two groups to
    // each 128-bit half.
    let low = &src[lay.low()];
    let groups = low.len() / 5;
    let pairs = _mm256_setr_epi8(
        0, 1, 1, 2, 2, 3, 3, 4, 5, 6, 6, 7, 7, 8, 8, 9, 0, 1, 1, 2, 2, 3, 3, 4, 5, 6, 6, 7, 7, 8, 8, 9,
    );
    let scale = _mm256_setr_epi16(64, 16, 4, 1, 64, 16, 4, 1, 64, 16, 4, 1, 64, 16, 4, 1);
    let (mut g, out) = (0, seg.low.as_mut_ptr());
    while g + 4 <= groups && lay.low_at + 5 * g + 26 <= src.len() && 4 * g + 16 <= seg.low.len() {
        // SAFETY: 16-byte loads at 5g and 5g + 10 of the low-bits segment,
        // within `src` (checked by the loop), and a 32-byte store of
        // entries 4g..4g + 16 of `seg.low` (checked too); unaligned.
        unsafe {
            let at = src.as_ptr().add(lay.low_at + 5 * g);
            let v = _mm256_inserti128_si256::<1>(
                _mm256_castsi128_si256(_mm_loadu_si128(at.cast())),
                _mm_loadu_si128(at.add(10).cast()),
            );
            let v = _mm256_srli_epi16::<6>(_mm256_mullo_epi16(_mm256_shuffle_epi8(v, pairs), scale));
            _mm256_storeu_si256(out.add(4 * g).cast(), v);
        }
        g += 4;
    }
    for (k, o) in low.chunks_exact(5).enumerate().skip(g) {
        let v = u64::from_le_bytes([o[0], o[1], o[2], o[3], o[4], 0, 0, 0]);
        for j in 0..4 {
            seg.low[4 * k + j] = ((v >> (10 * j)) & LOW_MASK as u64) as u16;
        }
    }
}

/// Counts (misses, partials, exacts) among packed tags as the scalar
/// `count_tags` does, 32 bytes at a time: each nibble holds two tags, and
/// a byte shuffle looks up each nibble's count of a kind in a 16-entry
/// table.
///
/// # Safety
///
/// The CPU must support AVX2 ([`available`]).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn count_tags(packed: &[u8]) -> (usize, usize, usize) {
    // Tags of a nibble: bits 0..2 and 2..4; a table of how many are `kind`.
    let table = |kind: u8| {
        let mut t = [0i8; 16];
        for (v, c) in t.iter_mut().enumerate() {
            *c = ((v as u8 & 3) == kind) as i8 + ((v as u8 >> 2) == kind) as i8;
        }
        _mm256_broadcastsi128_si256(_mm_setr_epi8(
            t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], t[10], t[11], t[12], t[13], t[14],
            t[15],
        ))
    };
    let (tm, tp, te) = (table(3), table(2), table(1));
    let nibble = _mm256_set1_epi8(15);
    let zero = _mm256_setzero_si256();
    let (mut m, mut p, mut e) = (zero, zero, zero);
    let mut chunks = packed.chunks_exact(32);
    for c in &mut chunks {
        // SAFETY: a 32-byte load from a 32-byte chunk; unaligned.
        let v = unsafe { _mm256_loadu_si256(c.as_ptr().cast()) };
        let (lo, hi) = (_mm256_and_si256(v, nibble), _mm256_and_si256(_mm256_srli_epi16::<4>(v), nibble));
        // Per byte at most 4 of a kind; summed over each 8 bytes.
        let count = |t: __m256i| {
            _mm256_sad_epu8(_mm256_add_epi8(_mm256_shuffle_epi8(t, lo), _mm256_shuffle_epi8(t, hi)), zero)
        };
        m = _mm256_add_epi64(m, count(tm));
        p = _mm256_add_epi64(p, count(tp));
        e = _mm256_add_epi64(e, count(te));
    }
    let sum = |v: __m256i| {
        let mut l = [0u64; 4];
        // SAFETY: a 32-byte store to a 32-byte array; unaligned.
        unsafe { _mm256_storeu_si256(l.as_mut_ptr().cast(), v) };
        l.iter().sum::<u64>() as usize
    };
    let (rm, rp, re) = super::count_tags(chunks.remainder());
    (sum(m) + rm, sum(p) + rp, sum(e) + re)
}

/// Words planned at a time before their plans run (a plan's position is
/// one byte).
const BLOCK: usize = 256;
const _: () = assert!(BLOCK <= 256);
/// The dictionary entry misses load from: one nothing stores to (zero),
/// so that a miss's plan (which keeps none of the entry's bits) does not
/// wait for the store of an earlier word of its slot.
const UNUSED: i32 = 255;
/// Dictionary entries 16..24: where exact matches store, one per lane of
/// the 8, so that no two nearby words store to one entry.
const SCRATCH: i32 = 16;

/// Decodes the page `src`, which `lay` validated, into `dst`.
///
/// # Safety
///
/// The CPU must support AVX2 and POPCNT ([`available`]).
#[target_feature(enable = "avx2,popcnt")]
pub(super) unsafe fn decode(src: &[u8], lay: &Layout, seg: &mut Segments, dst: &mut [u8]) {
    let n = lay.n;
    assert!(dst.len() == 4 * n && src.len() == lay.end);
    // SAFETY: the CPU has AVX2 (this function's contract).
    unsafe { unpack_index_low(src, lay, seg) };
    // The full words are loaded 8 at a time at the cursor: from the page
    // when 8 words of it follow the segment, else from a copy with room.
    let fullp: *const u32 = if lay.index_at + 32 <= src.len() {
        src[lay.full_at..].as_ptr().cast()
    } else {
        for (f, c) in seg.full.iter_mut().zip(src[lay.full()].chunks_exact(4)) {
            *f = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        seg.full.as_ptr()
    };
    // Loads of 8 entries at a cursor stay within these: a cursor never
    // passes its segment's count (`lay` checked the counts against the
    // tags), and each buffer has 8 entries of room past the count.
    assert!(lay.counts.index + 8 <= seg.index.len() && lay.counts.low + 8 <= seg.low.len());
    // The packed tags, 2 bytes for every 8 words: the tags past the last
    // word zero (as zero words they take no entries).
    let tag_bytes = n.div_ceil(4);
    let tags = &mut seg.tags[..2 * n.div_ceil(8)];
    tags[..tag_bytes].copy_from_slice(&src[lay.tags()]);
    tags[tag_bytes..].fill(0);
    if n % 4 != 0 {
        tags[tag_bytes - 1] &= (1 << (2 * (n % 4))) - 1;
    }
    let mut st = State {
        fullp,
        indexp: seg.index.as_ptr(),
        lowp: seg.low.as_ptr(),
        fp: 0,
        ip: 0,
        lp: 0,
        dict: [0; 256],
        x: [MaybeUninit::uninit(); BLOCK + 8],
        a: [MaybeUninit::uninit(); BLOCK + 8],
        p: [MaybeUninit::uninit(); BLOCK + 8],
    };
    // Plans for the nonzero words only, packed, when zero words are an
    // eighth of the page or more; else for every word, in place (no
    // packing, no positions; zero words' plans store 0 to a scratch
    // entry), which costs fewer instructions then (python-sqlite.pages,
    // 9% zero words: 6% fewer a page under callgrind).
    let zeros = n - lay.counts.full - lay.counts.index;
    let packed = 8 * zeros >= n;
    // SAFETY: the caller's contract (below).
    let run = |st: &mut State, t: &[u8], out: *mut u32, groups: usize| unsafe {
        if packed {
            decode_block::<true>(st, t, out, groups)
        } else {
            decode_block::<false>(st, t, out, groups)
        }
    };
    for (b, out) in dst.chunks_mut(4 * BLOCK).enumerate() {
        let words = out.len() / 4;
        let t = &tags[b * BLOCK / 4..];
        if words % 8 == 0 {
            // SAFETY: the CPU has the features (this function's contract);
            // `out` holds the block's words, and `t` 2 tag bytes for each
            // 8 of them.
            run(&mut st, t, out.as_mut_ptr().cast(), words / 8);
        } else {
            // The page's last block ends in a shorter group: decoded
            // whole into a copy.
            let mut last = [0u32; BLOCK];
            // SAFETY: as above; `last` has room for the groups' words.
            run(&mut st, t, last.as_mut_ptr(), words.div_ceil(8));
            for (o, w) in out.chunks_exact_mut(4).zip(&last) {
                o.copy_from_slice(&w.to_le_bytes());
            }
        }
    }
}

/// What the decoder carries from block to block.
struct State {
    /// The full words, the indices and the low bits, and the cursors in
    /// them. A load of 8 entries at a cursor stays within the buffers.
    fullp: *const u32,
    indexp: *const u8,
    lowp: *const u16,
    fp: usize,
    ip: usize,
    lp: usize,
    /// The dictionary (0..16) and the scratch entries exact matches store
    /// to (16..24); a byte indexes it without a bounds check.
    dict: [u32; 256],
    /// The plans of a block's nonzero words: x, a, and p = the entry
    /// loaded | the entry stored << 8 | the word's position in the block
    /// << 16. 8 entries of room past the block for the last packed store.
    /// Each block reads only the entries it wrote.
    x: [MaybeUninit<u32>; BLOCK + 8],
    a: [MaybeUninit<u32>; BLOCK + 8],
    p: [MaybeUninit<u32>; BLOCK + 8],
}

/// Decodes `groups` groups of 8 words (at most `BLOCK / 8`) to `out`: plans
/// them, then runs the plans through the dictionary. With `PACKED`, only
/// the nonzero words' plans, packed, each with its position; else every
/// word's, in order.
///
/// # Safety
///
/// The CPU must support AVX2 and POPCNT; `tags` holds 2 bytes for each
/// group, `out` room for `8 * groups` words, and the tags take no more
/// entries of each segment than `st`'s buffers hold past its cursors.
#[inline]
#[target_feature(enable = "avx2,popcnt")]
unsafe fn decode_block<const PACKED: bool>(st: &mut State, tags: &[u8], out: *mut u32, groups: usize) {
    assert!(groups <= BLOCK / 8 && tags.len() >= 2 * groups);
    let lanes8 = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let scratch = _mm256_add_epi32(lanes8, _mm256_set1_epi32(SCRATCH));
    let tag_shift = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    let (zero, two, three) = (_mm256_setzero_si256(), _mm256_set1_epi32(2), _mm256_set1_epi32(3));
    let (ones, high) = (_mm256_set1_epi32(-1), _mm256_set1_epi32(!LOW_MASK as i32));
    let step = _mm256_set1_epi32(8 << 16);
    let unused = _mm256_set1_epi32(UNUSED);
    // In locals: the plan stores below could alias `st`'s fields.
    let (fullp, indexp, lowp) = (st.fullp, st.indexp, st.lowp);
    let (mut fp, mut ip, mut lp) = (st.fp, st.ip, st.lp);
    let (xp, ap, pp) =
        (st.x.as_mut_ptr().cast::<u32>(), st.a.as_mut_ptr().cast::<u32>(), st.p.as_mut_ptr().cast::<u32>());
    let mut k = 0; // packed plans so far
    let mut at = _mm256_slli_epi32::<16>(lanes8);
    for (c, t) in tags[..2 * groups].chunks_exact(2).enumerate() {
        // The masks of the kinds among the 8 words.
        let t = u16::from_le_bytes([t[0], t[1]]) as i32;
        let tv = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(t), tag_shift), three);
        let miss = _mm256_cmpeq_epi32(tv, three);
        let partial = _mm256_cmpeq_epi32(tv, two);
        let (mm, mp) = (mask8(miss), mask8(partial));
        let zv = _mm256_cmpeq_epi32(tv, zero);
        let nz = !mask8(zv) & 255;
        let mi = nz & !mm;
        // SAFETY: 8-entry loads at the cursors, within the buffers (this
        // function's contract); unaligned.
        let (f, ix, lw) = unsafe {
            (
                _mm256_loadu_si256(fullp.add(fp).cast()),
                _mm256_cvtepu8_epi32(_mm_loadl_epi64(indexp.add(ip).cast())),
                _mm256_cvtepu16_epi32(_mm_loadu_si128(lowp.add(lp).cast())),
            )
        };
        fp += mm.count_ones() as usize;
        ip += mi.count_ones() as usize;
        lp += mp.count_ones() as usize;
        // Spread each segment's entries over the words of its tag.
        let f = _mm256_and_si256(_mm256_permutevar8x32_epi32(f, lanes(&SPREAD, mm)), miss);
        let ix = _mm256_permutevar8x32_epi32(ix, lanes(&SPREAD, mi));
        let lw = _mm256_permutevar8x32_epi32(lw, lanes(&SPREAD, mp));
        // What each nonzero word ORs in: a miss its full word, a partial
        // match its low bits, an exact match nothing; and the bits of the
        // entry it keeps: none, the high 22, all. (Zero words' values are
        // the final ones; their plans are left out.)
        let xv = _mm256_or_si256(f, _mm256_and_si256(lw, partial));
        let keep_none = if PACKED { miss } else { _mm256_or_si256(miss, zv) };
        let av = _mm256_andnot_si256(keep_none, _mm256_blendv_epi8(ones, high, partial));
        // Stores: a miss to its slot, a partial match to its index, an
        // exact match to its lane's scratch entry; loads: exact and partial
        // matches from their index, misses from the UNUSED entry (the
        // value is masked off).
        let sv = _mm256_blendv_epi8(_mm256_blendv_epi8(scratch, ix, partial), slots(f), miss);
        let lv = _mm256_blendv_epi8(ix, unused, miss);
        let pv = _mm256_or_si256(lv, _mm256_slli_epi32::<8>(sv));
        if PACKED {
            let pv = _mm256_or_si256(pv, at);
            at = _mm256_add_epi32(at, step);
            // Every word's full value (the final one for zero words and
            // misses), then the nonzero words' plans packed.
            let pack = lanes(&PACK, nz);
            // SAFETY: out's words 8c..8c + 8 exist (c < groups, this
            // function's contract); c < BLOCK / 8 and k <= 8c, so entries
            // k..k + 8 are within the BLOCK + 8-entry plan arrays.
            // Unaligned.
            unsafe {
                _mm256_storeu_si256(out.add(8 * c).cast(), xv);
                _mm256_storeu_si256(xp.add(k).cast(), _mm256_permutevar8x32_epi32(xv, pack));
                _mm256_storeu_si256(ap.add(k).cast(), _mm256_permutevar8x32_epi32(av, pack));
                _mm256_storeu_si256(pp.add(k).cast(), _mm256_permutevar8x32_epi32(pv, pack));
            }
            k += nz.count_ones() as usize;
        } else {
            // SAFETY: entries 8c..8c + 8 of the BLOCK + 8-entry plan arrays
            // (c < BLOCK / 8); unaligned.
            unsafe {
                _mm256_storeu_si256(xp.add(8 * c).cast(), xv);
                _mm256_storeu_si256(ap.add(8 * c).cast(), av);
                _mm256_storeu_si256(pp.add(8 * c).cast(), pv);
            }
            k += 8;
        }
    }
    (st.fp, st.ip, st.lp) = (fp, ip, lp);
    // The plans in order: word `p >> 16` loads entry `p & 255`, keeps the
    // bits `a` of it and ORs in `x`; the result is the word, and it is
    // stored to entry `p >> 8 & 255`. Branch-free (a byte indexes the 256
    // entries without a bounds check); the bytes of `p` are read one by
    // one, four plans an iteration.
    let dict = &mut st.dict;
    let mut j = 0;
    let mut run = |dict: &mut [u32; 256], x: u32, a: u32, p: &[u8]| {
        let v = (dict[p[0] as usize] & a) | x;
        dict[p[1] as usize] = v;
        let at = if PACKED { p[2] as usize } else { j };
        // SAFETY: a packed plan's position is 8c + i for a group c <
        // groups and a lane i, and j < k = 8 * groups: within `out`.
        unsafe { out.add(at).write_unaligned(v.to_le()) };
        j += 1;
    };
    // SAFETY: the first k entries of each plan array were written above
    // (k <= BLOCK + 8); the bytes of `p` are read as bytes.
    let (x, a, p) = unsafe {
        (
            std::slice::from_raw_parts(xp, k),
            std::slice::from_raw_parts(ap, k),
            std::slice::from_raw_parts(pp.cast::<u8>(), 4 * k),
        )
    };
    let (x4, a4, p4) = (x.chunks_exact(4), a.chunks_exact(4), p.chunks_exact(16));
    let (xr, ar, pr) = (x4.remainder(), a4.remainder(), p4.remainder());
    for ((x, a), p) in x4.zip(a4).zip(p4) {
        run(dict, x[0], a[0], &p[..4]);
        run(dict, x[1], a[1], &p[4..8]);
        run(dict, x[2], a[2], &p[8..12]);
        run(dict, x[3], a[3], &p[12..]);
    }
    for ((&x, &a), p) in xr.iter().zip(ar).zip(pr.chunks_exact(4)) {
        run(dict, x, a, p);
    }
}
