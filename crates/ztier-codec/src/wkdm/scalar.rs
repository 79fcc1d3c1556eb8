//! The scalar kernel ([`super::Kernel::Scalar`]): WKdm's loops without
//! bounds checks, for CPUs without the vector kernels. The vector kernels
//! use its encoder for the words of a block that do not fill a group.
//!
//! Each function has a safe twin in the parent module
//! (`model_block_safe`, `decode_words_safe`); tests check they agree.

use super::{slot, Counts, LOW_MASK};

/// Models one block of words: writes each word's tag to `tags` and appends
/// its index, low bits and full word to the segments its tag selects.
///
/// Branch-free: every candidate is written at the segment's cursor and only
/// the cursors the tag selects advance (tags of real pages are too
/// irregular to predict). Zero words "write" dictionary slot 16, a scratch
/// slot, so a dictionary store's data is always the input word and no chain
/// of dependent loads and stores forms through the dictionary.
#[inline]
pub(super) fn model_block(
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
        let w = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
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
    *c = Counts { full: nf as usize, index: ni as usize, low: nl as usize };
}

/// The decoder's main loop without bounds checks, over tags unpacked one
/// per byte: a plain `match` on the tag, as xnu's decoder does (see
/// `decode_words_safe` for the algorithm).
///
/// `full`, `index` and `low` hold exactly as many entries as there are miss,
/// exact-or-partial and partial tags in `tags` (the caller checked the
/// counts). The `match` mispredicts often on real pages, but a branch-free
/// scalar select is slower still, because it executes every candidate's
/// loads, stores and selects (measured on python-dict.pages, unpacking
/// included: 2.3 GB/s against 1.7 GB/s; a 2-way branch with selects
/// inside, 2.3 GB/s; a jump table per 2 or 4 tags, 1.7 and 2.2 GB/s). The
/// vector kernels do the selecting in vector registers instead, where it
/// is cheap.
///
/// # Safety
///
/// `full`, `index` and `low` must hold at least as many entries as `tags`
/// has miss, exact-or-partial and partial tags (as [`super::Layout::check`]
/// makes sure).
pub(super) unsafe fn decode_words(tags: &[u8], full: &[u32], index: &[u8], low: &[u16], dst: &mut [u8]) {
    assert!(dst.len() >= 4 * tags.len());
    let mut dict = [0u32; 16];
    let (mut fp, mut ip, mut lp) = (full.as_ptr(), index.as_ptr(), low.as_ptr());
    let out = dst.as_mut_ptr();
    for (i, &t) in tags.iter().enumerate() {
        // SAFETY: the caller guarantees that the segments hold as many
        // entries as the tags take (this function's contract), and each
        // cursor advances only on its tag, so every read is
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
