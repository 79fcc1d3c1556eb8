//! The AVX-512 kernel ([`super::Kernel::Avx512`]), for x86-64 CPUs with
//! AVX-512F, AVX-512CD, AVX2, BMI2 and POPCNT: 16 words at a time, the
//! dictionary included (`model` for the encoder; the decoder follows).
//!
//! Built only with the crate's `avx512` feature: the machines the tests
//! run on by default (AMD with AVX2 only) cannot execute it, and neither
//! can an emulator packaged for them (QEMU's user mode and valgrind both
//! stop at the first AVX-512 instruction with SIGILL). Test it on a CPU
//! with AVX-512: `cargo test --release -p ztier-codec --features avx512`
//! (the tests fail there, rather than skip, when the CPU lacks it), and
//! `cargo fuzz run --features avx512 wkdm_kernels` in `fuzz/`.
//!
//! It was measured faster than LZ4 on an AMD Zen 4 (the `vpconflictd`
//! it leans on is cheap there) but at about half the speed of the AVX2
//! kernel on an Intel Xeon (family 6, model 207): a build with the
//! feature runs it wherever the CPU has AVX-512, so measure before
//! enabling it, and `ZTIER_WKDM_KERNEL=avx2` picks the other.
//!
//! The `match` of [`decode_words_fast`] mispredicts often on real pages
//! (tag sequences are too irregular to learn), and a branch-free scalar
//! select costs more instructions than the mispredictions. Here masks of
//! the four tags come from the packed tag bits, and each segment's next
//! entries are loaded and spread over the words of their tag
//! (`vpexpandd`). What is left sequential is the dictionary, and its rules
//! make it parallel:
//!
//! - A word's slot is its index (exact and partial matches) or the hash of
//!   its full word (misses); zero words do not touch the dictionary.
//! - A partial match keeps the entry's high 22 bits, so an entry's high
//!   bits change only at a miss: a word's high bits are those of the
//!   nearest earlier miss of its slot among the 16, else those of the
//!   entry before the group.
//! - An exact match changes nothing, so an exact match's low 10 bits are
//!   those of the nearest earlier miss or partial match of its slot, else
//!   those of the entry before the group.
//!
//! `vpconflictd` on the slots gives each word the mask of the earlier words
//! of its slot; masked by the misses (or by the misses and partial
//! matches) `vplzcntd` finds the nearest, and a lane permutation brings its
//! bits over. The entries before the group come from the dictionary's
//! register, and after it each slot's entry is its last nonzero word
//! (`last_of_slots`).
// The AVX-512 intrinsics are stable since Rust 1.89; the workspace builds
// with 1.85 too, and build.rs refuses the `avx512` feature before 1.89.
#![allow(clippy::incompatible_msrv)]

use std::arch::x86_64::*;

use super::{Counts, LOW_MASK};

/// Whether this CPU can run [`decode`] and [`model`].
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512cd")
        && is_x86_feature_detected!("avx2")
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
pub(super) unsafe fn decode(tags: &[u8], n: usize, full: &[u8], index: &[u8], low: &[u16], dst: &mut [u8]) {
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
            _mm512_mask_storeu_epi32(out.as_mut_ptr().cast(), (1u32 << rest).wrapping_sub(1) as u16, words);
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
        let lw = _mm512_cvtepi32_epi16(_mm512_maskz_compress_epi32(partial, _mm512_and_si512(w, low_mask)));
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
