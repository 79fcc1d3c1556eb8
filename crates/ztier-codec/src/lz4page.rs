//! An LZ4 block compressor for inputs of at most one page, whose output is
//! byte for byte liblz4's.
//!
//! Hybrid's LZ4 attempts go through it: a port of
//! liblz4 1.10's `LZ4_compress_generic` for the case liblz4's
//! `LZ4_compress_fast_extState` (the [`crate::lz4::Lz4`] codec) takes on a
//! page (a `byU16` hash table of 2^13 entries zeroed on every call, no
//! dictionary, acceleration 1, output limited or not), specialised for
//! inputs of at most 4 KiB: a whole page's bounds are constants, and the
//! match search is a function of its own, so its loop keeps every value in
//! a register. The same candidates are tried in the same order, so every
//! output byte is liblz4's (the tests compare them on every kind of page,
//! on random inputs and buffers of every size, and on the corpus files);
//! on the corpus pages it runs 1–5% faster than liblz4's entry point
//! (docs/measurements). Inputs over [`MAX_LEN`] are left to liblz4, as is
//! decoding.
//!
//! The `lz4` codec stays liblz4's own entry point: the reference the
//! benchmarks compare against.

use crate::lz4::Lz4;
use crate::{check_input_len, Codec, CodecId, CompressError, DecompressError};

/// The longest input this compressor takes.
pub const MAX_LEN: usize = 4096;

const MINMATCH: usize = 4;
const LASTLITERALS: usize = 5;
const MFLIMIT: usize = 12;
/// Inputs shorter than this are stored as literals alone (liblz4's
/// `LZ4_minLength`).
const MIN_LENGTH: usize = MFLIMIT + 1;
const SKIP_TRIGGER: u32 = 6;
/// liblz4's `byU16` hash: `LZ4_HASHLOG + 1` bits, LZ4_MEMORY_USAGE 14.
const HASH_LOG: u32 = 13;
const ML_BITS: u32 = 4;
const ML_MASK: usize = (1 << ML_BITS) - 1;
const RUN_MASK: usize = (1 << (8 - ML_BITS)) - 1;

/// The worst-case output length for an input of `len` bytes
/// (`LZ4_compressBound`).
pub fn bound(len: usize) -> usize {
    len + len / 255 + 16
}

/// The compressor's state: the hash table. As a
/// [`Codec`] it is `lz4` (same id, same bytes), liblz4 decoding and
/// compressing inputs over [`MAX_LEN`].
pub struct Lz4Page {
    table: Box<[u16; 1 << HASH_LOG]>,
    lib: Lz4,
}

impl std::fmt::Debug for Lz4Page {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lz4Page").finish_non_exhaustive()
    }
}

impl Default for Lz4Page {
    fn default() -> Self {
        Self::new()
    }
}

/// The 4 bytes at `p + i`, little-endian (`p` may point outside the
/// input, `p + i` may not).
///
/// # Safety
///
/// `p + i .. p + i + 4` is readable.
#[inline(always)]
unsafe fn read32(p: *const u8, i: usize) -> u32 {
    // SAFETY: the caller vouches for the 4 bytes.
    u32::from_le(unsafe { p.wrapping_add(i).cast::<u32>().read_unaligned() })
}

/// The 8 bytes at `p + i`, little-endian.
///
/// # Safety
///
/// `p + i .. p + i + 8` is readable.
#[inline(always)]
unsafe fn read64(p: *const u8, i: usize) -> u64 {
    // SAFETY: the caller vouches for the 8 bytes.
    u64::from_le(unsafe { p.wrapping_add(i).cast::<u64>().read_unaligned() })
}

/// Copies `len` bytes from `from` to `to` in 8-byte steps (as liblz4's
/// `LZ4_wildCopy8`, up to 7 bytes past the end) when `room >= len + 8`,
/// else exactly.
///
/// # Safety
///
/// `from .. from + len` is readable (and, for the 8-byte steps, up to 7
/// bytes more), `to .. to + room` writable, `len <= room`, and the two do
/// not overlap.
#[inline(always)]
unsafe fn copy_literals(from: *const u8, to: *mut u8, len: usize, room: usize) {
    // SAFETY: as the caller vouches; the 8-byte steps write below
    // `to + len + 8 <= to + room`.
    unsafe {
        if room >= len + 8 {
            let mut i = 0;
            while i < len {
                to.add(i).cast::<u64>().write_unaligned(from.add(i).cast::<u64>().read_unaligned());
                i += 8;
            }
        } else {
            std::ptr::copy_nonoverlapping(from, to, len);
        }
    }
}

/// liblz4's search for the next match from `ip` (whose hash is
/// `forward_h`), stepping faster the longer it finds none: the position
/// and the earlier one it matches, or `usize::MAX` once the step passes
/// `mflimit_plus_one`. Not inlined: the loop gets the registers to itself.
///
/// # Safety
///
/// `s .. s + mflimit_plus_one + 4` is readable; every position in the
/// table is below `ip`.
#[inline(never)]
unsafe fn find(
    table: &mut [u16; 1 << HASH_LOG],
    s: *const u8,
    ip: usize,
    mut forward_h: usize,
    mflimit_plus_one: usize,
) -> (usize, usize) {
    let mut forward_ip = ip;
    let mut step = 1usize;
    let mut search_nb = 1u32 << SKIP_TRIGGER;
    loop {
        let h = forward_h & ((1 << HASH_LOG) - 1);
        let current = forward_ip;
        let m = usize::from(table[h]);
        forward_ip += step;
        step = (search_nb >> SKIP_TRIGGER) as usize;
        search_nb += 1;
        if forward_ip > mflimit_plus_one {
            return (usize::MAX, 0);
        }
        // SAFETY: `forward_ip`, `current` and `m` are at most
        // `mflimit_plus_one`, as the caller vouches.
        unsafe {
            forward_h = hash(read32(s, forward_ip));
            table[h] = current as u16;
            if read32(s, m) == read32(s, current) {
                return (current, m);
            }
        }
    }
}

/// Writes a literal length `lit` into the token at `d + token` and, from
/// 15 on, the extra bytes from `d + op`: the position after them.
///
/// # Safety
///
/// `d + token` and `d + op .. d + op + lit / 255 + 1` are writable.
#[inline(always)]
unsafe fn literal_length(d: *mut u8, token: usize, mut op: usize, lit: usize) -> usize {
    // SAFETY: as the caller vouches.
    unsafe {
        if lit < RUN_MASK {
            *d.add(token) = (lit << ML_BITS) as u8;
            return op;
        }
        *d.add(token) = (RUN_MASK << ML_BITS) as u8;
        let mut len = lit - RUN_MASK;
        while len >= 255 {
            *d.add(op) = 255;
            op += 1;
            len -= 255;
        }
        *d.add(op) = len as u8;
        op + 1
    }
}

#[inline(always)]
fn hash(seq: u32) -> usize {
    (seq.wrapping_mul(2_654_435_761) >> (32 - HASH_LOG)) as usize
}

/// How many bytes at `a` equal those at `b` (`b < a`), not reaching
/// `limit` (liblz4's `LZ4_count`).
///
/// # Safety
///
/// `p + b .. p + limit` is readable and `b < a`.
#[inline(always)]
unsafe fn count(p: *const u8, mut a: usize, mut b: usize, limit: usize) -> usize {
    let start = a;
    // SAFETY: every read stays below `limit` (checked before it), and
    // `b < a`.
    unsafe {
        while a + 8 <= limit {
            let diff = read64(p, a) ^ read64(p, b);
            if diff != 0 {
                return a + (diff.trailing_zeros() / 8) as usize - start;
            }
            a += 8;
            b += 8;
        }
        if a + 4 <= limit && read32(p, a) == read32(p, b) {
            a += 4;
            b += 4;
        }
        if a + 2 <= limit
            && *p.wrapping_add(a) == *p.wrapping_add(b)
            && *p.wrapping_add(a + 1) == *p.wrapping_add(b + 1)
        {
            a += 2;
            b += 2;
        }
        if a < limit && *p.wrapping_add(a) == *p.wrapping_add(b) {
            a += 1;
        }
    }
    a - start
}

impl Lz4Page {
    /// A compressor (and liblz4's state, for longer inputs).
    pub fn new() -> Self {
        Lz4Page { table: Box::new([0; 1 << HASH_LOG]), lib: Lz4::new(1) }
    }

    /// Compresses `src` (at most [`MAX_LEN`] bytes) into `dst`: the output
    /// length, or `None` if it does not fit in `dst` (liblz4 returns 0
    /// then). The bytes are liblz4's `LZ4_compress_fast_extState(state,
    /// src, dst, src.len(), dst.len(), 1)`'s.
    ///
    /// # Panics
    ///
    /// If `src` is longer than [`MAX_LEN`].
    pub fn compress_block(&mut self, src: &[u8], dst: &mut [u8]) -> Option<usize> {
        assert!(src.len() <= MAX_LEN, "lz4page takes at most {MAX_LEN} bytes");
        self.table.fill(0);
        match (dst.len() >= bound(src.len()), src.len() == MAX_LEN) {
            (true, true) => self.run::<false, true>(src, dst),
            (true, false) => self.run::<false, false>(src, dst),
            (false, true) => self.run::<true, true>(src, dst),
            (false, false) => self.run::<true, false>(src, dst),
        }
    }

    /// liblz4's `LZ4_compress_generic_validated` for a `byU16` table, no
    /// dictionary, acceleration 1; `LIMITED` is its `limitedOutput` (else
    /// `dst` holds at least [`bound`] bytes).
    #[inline(always)]
    fn run<const LIMITED: bool, const FULL: bool>(&mut self, src: &[u8], dst: &mut [u8]) -> Option<usize> {
        // A whole page: the bounds below are constants (fewer registers
        // in the hot loop).
        let n = if FULL { MAX_LEN } else { src.len() };
        debug_assert_eq!(n, src.len());
        let olimit = dst.len();
        debug_assert!(n <= MAX_LEN && (LIMITED || olimit >= bound(n)));
        let table = &mut *self.table;
        let put =
            |t: &mut [u16; 1 << HASH_LOG], h: usize, pos: usize| t[h & ((1 << HASH_LOG) - 1)] = pos as u16;
        let get = |t: &[u16; 1 << HASH_LOG], h: usize| usize::from(t[h & ((1 << HASH_LOG) - 1)]);
        let s = src.as_ptr();
        let d = dst.as_mut_ptr();
        let mut anchor = 0usize;
        let mut op = 0usize;

        // SAFETY: reads of `s`: every position read is below `n` — the
        // 4-byte reads are at positions up to `mflimit_plus_one` = n - 11,
        // match candidates come from the table, zeroed at the call's start
        // and given only positions already passed, and `count` stops at
        // `matchlimit` = n - 5. Writes to `d`: liblz4's own argument — without `LIMITED`, `dst` holds
        // `bound(n)` bytes, more than any output plus the 8 bytes a
        // literal copy may run over; with it, every write is checked
        // against `olimit` first, with the same margins as liblz4's, and a
        // literal copy runs over only if 8 bytes of room are left. Every
        // table index is masked to the table.
        let end = unsafe {
            'body: {
                if n < MIN_LENGTH {
                    break 'body;
                }
                let mflimit_plus_one = n - MFLIMIT + 1;
                let matchlimit = n - LASTLITERALS;
                put(table, hash(read32(s, 0)), 0);
                let mut ip = 1;
                let mut forward_h = hash(read32(s, ip));
                loop {
                    // Find a match.
                    let (found, mut m) = find(table, s, ip, forward_h, mflimit_plus_one);
                    if found == usize::MAX {
                        break 'body;
                    }
                    ip = found;
                    // Catch up.
                    while ip > anchor && m > 0 && *s.wrapping_add(ip - 1) == *s.wrapping_add(m - 1) {
                        ip -= 1;
                        m -= 1;
                    }
                    // Literals.
                    let lit = ip - anchor;
                    let mut token = op;
                    op += 1;
                    if LIMITED && op + lit + (2 + 1 + LASTLITERALS) + lit / 255 > olimit {
                        return None;
                    }
                    op = literal_length(d, token, op, lit);
                    copy_literals(s.wrapping_add(anchor), d.add(op), lit, olimit - op);
                    op += lit;
                    // Matches, as long as the next position starts one.
                    loop {
                        let offset = (ip - m) as u16;
                        d.add(op).cast::<[u8; 2]>().write_unaligned(offset.to_le_bytes());
                        op += 2;
                        let mut code = count(s, ip + MINMATCH, m + MINMATCH, matchlimit);
                        ip += code + MINMATCH;
                        if LIMITED && op + (1 + LASTLITERALS) + (code + 240) / 255 > olimit {
                            return None;
                        }
                        if code >= ML_MASK {
                            *d.add(token) += ML_MASK as u8;
                            code -= ML_MASK;
                            // As liblz4: 255s four at a time (the
                            // margins above leave room for the fourth).
                            d.add(op).cast::<u32>().write_unaligned(u32::MAX);
                            while code >= 4 * 255 {
                                op += 4;
                                d.add(op).cast::<u32>().write_unaligned(u32::MAX);
                                code -= 4 * 255;
                            }
                            op += code / 255;
                            *d.add(op) = (code % 255) as u8;
                            op += 1;
                        } else {
                            *d.add(token) += code as u8;
                        }
                        anchor = ip;
                        if ip >= mflimit_plus_one {
                            break 'body;
                        }
                        put(table, hash(read32(s, ip - 2)), ip - 2);
                        let h = hash(read32(s, ip));
                        m = get(table, h);
                        put(table, h, ip);
                        if read32(s, m) == read32(s, ip) {
                            token = op;
                            *d.add(op) = 0;
                            op += 1;
                            continue;
                        }
                        break;
                    }
                    ip += 1;
                    forward_h = hash(read32(s, ip));
                }
            }
            // Last literals.
            let last = n - anchor;
            if LIMITED && op + last + 1 + (last + 255 - RUN_MASK) / 255 > olimit {
                return None;
            }
            op = literal_length(d, op, op + 1, last);
            std::ptr::copy_nonoverlapping(s.wrapping_add(anchor), d.add(op), last);
            op + last
        };
        Some(end)
    }
}

impl Codec for Lz4Page {
    fn id(&self) -> CodecId {
        CodecId::Lz4
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, CompressError> {
        check_input_len(src.len())?;
        if src.len() > MAX_LEN {
            return self.lib.compress(src, dst);
        }
        self.compress_block(src, dst).ok_or(CompressError::Overflow { capacity: dst.len() })
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), DecompressError> {
        self.lib.decompress(src, dst)
    }

    fn max_compressed_len(&self, len: usize) -> usize {
        self.lib.max_compressed_len(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::synth;

    /// liblz4's output for `src` into a buffer of `cap` bytes.
    fn reference(src: &[u8], cap: usize) -> Option<Vec<u8>> {
        let mut out = vec![0u8; cap];
        Lz4::new(1).compress(src, &mut out).ok().map(|n| out[..n].to_vec())
    }

    fn check(z: &mut Lz4Page, src: &[u8], cap: usize) {
        let mut out = vec![0xa5u8; cap];
        let ours = z.compress_block(src, &mut out).map(|n| out[..n].to_vec());
        assert_eq!(ours, reference(src, cap), "len {} cap {cap}", src.len());
    }

    #[test]
    fn output_is_liblz4s_on_every_kind_of_page_limited_or_not() {
        let mut z = Lz4Page::new();
        for round in 0..3u64 {
            for (i, kind) in synth::KINDS.into_iter().enumerate() {
                let p = synth::page(kind, round * 100 + i as u64);
                check(&mut z, &p, bound(p.len()));
                let full = reference(&p, bound(p.len())).unwrap().len();
                // Exactly enough room, one byte short, and far too little.
                for cap in [full, full - 1, full / 2, 1] {
                    check(&mut z, &p, cap);
                }
            }
        }
    }

    #[test]
    fn output_is_liblz4s_on_random_inputs_of_every_length() {
        let mut rng = synth::Rng::new(7);
        let mut z = Lz4Page::new();
        for _ in 0..3000 {
            let len = 4 * (1 + rng.below(MAX_LEN as u64 / 4) as usize);
            // Runs of a few symbols: plenty of matches of every length.
            let alphabet = 1 + rng.below(4) as u8;
            let mut p = vec![0u8; len];
            let mut i = 0;
            while i < len {
                let run = 1 + rng.below(40) as usize;
                let b = rng.below(u64::from(alphabet)) as u8;
                let copy = rng.below(3) == 0 && i > 64;
                for j in i..(i + run).min(len) {
                    p[j] = if copy { p[j - 64] } else { b.wrapping_mul(37).wrapping_add(rng.below(2) as u8) };
                }
                i += run;
            }
            let cap = if rng.below(2) == 0 { bound(len) } else { 1 + rng.below(bound(len) as u64) as usize };
            check(&mut z, &p, cap);
        }
    }
}
