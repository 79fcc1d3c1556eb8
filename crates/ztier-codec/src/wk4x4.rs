//! WK4x4 — the set-associative member of the WK family (Kaplan's thesis;
//! Wilson, Kaplan and Smaragdakis 1999 §4.2).
//!
//! Like [`crate::wkdm`], words are 32-bit, split 22/10 into high and low
//! bits, and tagged zero / exact / partial / miss. The dictionary differs:
//! 16 entries as **4 sets × 4 ways**. A word's set is chosen by a hash of
//! its high 22 bits; the word is compared with all four ways of its set
//! (exact match first, then a partial match on the high bits), and the
//! ways are kept in **LRU order**: a hit moves the way to the front, a miss
//! replaces the least recently used way. The 4-bit index written for exact
//! and partial matches names `set * 4 + way`, so the decoder needs no hash
//! for matches, only for misses (to find the set to replace in).
//!
//! Compared with WKdm's direct-mapped dictionary, associativity finds
//! matches that a hash collision would have evicted, at the cost of four
//! compares and an LRU update per word.
//!
//! ## Format (version 0x21)
//!
//! Exactly WKdm's segment layout (see [`crate::wkdm`]): a 10-byte header
//! whose first byte is the version — `0x21` here, so WKdm data is never
//! decoded as WK4x4 or back — then tags, full words, 4-bit indices and
//! 10-bit low bits in packed segments.

#![forbid(unsafe_code)]

use crate::wkdm::{packed_len, Counts, Segments, CHECK_EVERY, LOW_MASK};
use crate::{check_input_len, Codec, CodecId, CompressError, DecompressError};

/// Format version byte.
pub const VERSION: u8 = 0x21;

/// Set of a word: a multiplicative hash of its high 22 bits, 2 bits.
#[inline(always)]
fn set_of(w: u32) -> usize {
    ((w >> 10).wrapping_mul(0x9E37_79B1) >> 30) as usize
}

/// The 4×4 dictionary. `ways[s][k]` is way `k` of set `s`; `order[s]` lists
/// the ways of set `s` from most to least recently used, 2 bits each
/// (bits 0..2 = MRU, bits 6..8 = LRU).
#[derive(Clone, Copy)]
struct Dict {
    ways: [[u32; 4]; 4],
    order: [u8; 4],
}

/// Initial LRU order: ways 0, 1, 2, 3.
const ORDER0: u8 = 0b11_10_01_00;

impl Dict {
    fn new() -> Self {
        Dict { ways: [[0; 4]; 4], order: [ORDER0; 4] }
    }

    /// Moves `way` of set `s` to the most recently used position.
    #[inline(always)]
    fn touch(&mut self, s: usize, way: u8) {
        let o = self.order[s];
        // Position of `way` in the order.
        let pos = (0..4).find(|&p| (o >> (2 * p)) & 3 == way).unwrap_or(3);
        // Entries before `pos` shift back by one; `way` goes to the front.
        let below = o & ((1u16 << (2 * pos)) - 1) as u8;
        let above = if pos == 3 { 0 } else { o & !(((1u16 << (2 * (pos + 1))) - 1) as u8) };
        self.order[s] = above | (below << 2) | way;
    }

    /// The least recently used way of set `s`.
    #[inline(always)]
    fn lru(&self, s: usize) -> u8 {
        self.order[s] >> 6
    }
}

/// WK4x4 with its work buffers.
pub struct Wk4x4 {
    seg: Segments,
}

impl std::fmt::Debug for Wk4x4 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Wk4x4")
    }
}

impl Default for Wk4x4 {
    fn default() -> Self {
        Self::new()
    }
}

impl Wk4x4 {
    /// A new codec.
    pub fn new() -> Self {
        Wk4x4 { seg: Segments::new() }
    }
}

impl Codec for Wk4x4 {
    fn id(&self) -> CodecId {
        CodecId::Wk4x4
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, CompressError> {
        check_input_len(src.len())?;
        let n = src.len() / 4;
        let cap = dst.len();
        let overflow = Err(CompressError::Overflow { capacity: cap });
        if packed_len(n, 0, 0, 0) > cap {
            return overflow;
        }
        let mut dict = Dict::new();
        let seg = &mut self.seg;
        let mut c = Counts::default();
        for (bi, block) in src.chunks(4 * CHECK_EVERY).enumerate() {
            for (j, w) in block.chunks_exact(4).enumerate() {
                let w = u32::from_le_bytes(w.try_into().expect("4 bytes"));
                let i = bi * CHECK_EVERY + j;
                if w == 0 {
                    seg.tags[i] = 0;
                    continue;
                }
                let s = set_of(w);
                let ways = &dict.ways[s];
                let exact = ways.iter().position(|&d| d == w);
                let partial = || ways.iter().position(|&d| (d ^ w) <= LOW_MASK);
                if let Some(k) = exact {
                    seg.tags[i] = 1;
                    seg.index[c.index] = (s * 4 + k) as u8;
                    c.index += 1;
                    dict.touch(s, k as u8);
                } else if let Some(k) = partial() {
                    seg.tags[i] = 2;
                    seg.index[c.index] = (s * 4 + k) as u8;
                    c.index += 1;
                    seg.low[c.low] = (w & LOW_MASK) as u16;
                    c.low += 1;
                    dict.ways[s][k] = w;
                    dict.touch(s, k as u8);
                } else {
                    seg.tags[i] = 3;
                    seg.full[c.full] = w;
                    c.full += 1;
                    let k = dict.lru(s);
                    dict.ways[s][k as usize] = w;
                    dict.touch(s, k);
                }
            }
            if packed_len(n, c.full, c.index, c.low) > cap {
                return overflow;
            }
        }
        Ok(seg.pack(VERSION, n, c, dst))
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), DecompressError> {
        let c = self.seg.unpack(VERSION, src, dst.len())?;
        let seg = &self.seg;
        let mut dict = Dict::new();
        let (mut fp, mut ip, mut lp) = (0usize, 0usize, 0usize);
        // The counts were checked against the tags by `unpack`, so the
        // cursors stay within their segments; indexing stays checked here
        // (WK4x4 is the slower, higher-ratio member of the family).
        for (&t, out) in seg.tags[..dst.len() / 4].iter().zip(dst.chunks_exact_mut(4)) {
            let v = match t {
                0 => 0,
                1 | 2 => {
                    let ix = seg.index[..c.index][ip] as usize;
                    ip += 1;
                    let (s, k) = (ix >> 2, (ix & 3) as u8);
                    let mut v = dict.ways[s][k as usize];
                    if t == 2 {
                        v = (v & !LOW_MASK) | seg.low[..c.low][lp] as u32;
                        lp += 1;
                        // The partial match must have matched its set's hash.
                        if set_of(v) != s {
                            return Err(DecompressError::Corrupt(
                                "WK4x4 index names a set the word does not hash to",
                            ));
                        }
                        dict.ways[s][k as usize] = v;
                    }
                    dict.touch(s, k);
                    v
                }
                _ => {
                    let f = seg.full[..c.full][fp];
                    fp += 1;
                    let s = set_of(f);
                    let k = dict.lru(s);
                    dict.ways[s][k as usize] = f;
                    dict.touch(s, k);
                    f
                }
            };
            out.copy_from_slice(&v.to_le_bytes());
        }
        Ok(())
    }

    fn max_compressed_len(&self, len: usize) -> usize {
        let n = len / 4;
        packed_len(n, n, 0, 0) + 6
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(words: &[u32]) -> Vec<u8> {
        crate::testutil::round_trip(&mut Wk4x4::new(), &crate::testutil::words(words))
    }

    #[test]
    fn lru_order_moves_touched_way_to_front() {
        let mut d = Dict::new();
        assert_eq!(d.lru(0), 3);
        d.touch(0, 3);
        assert_eq!(d.order[0], 0b10_01_00_11);
        assert_eq!(d.lru(0), 2);
        d.touch(0, 1);
        assert_eq!(d.order[0], 0b10_00_11_01);
        d.touch(0, 1);
        assert_eq!(d.order[0], 0b10_00_11_01);
        d.touch(0, 2);
        assert_eq!(d.order[0], 0b00_11_01_10);
        assert_eq!(d.lru(0), 0);
    }

    #[test]
    fn golden_vectors() {
        // Small integers share the zero-initialised high bits of way 0 of
        // set_of(0): a partial match naming set s, way 0; the repeat is an
        // exact match of the same way.
        let s = set_of(5) as u8;
        assert_eq!(
            enc(&[5, 5, 0]),
            vec![
                VERSION,
                0,
                3,
                0,
                0,
                0,
                2,
                0,
                1,
                0,                        // header: 3 words, 0 full, 2 indices, 1 low
                2 | (1 << 2),             // tags: partial, exact, zero
                (s * 4) | ((s * 4) << 4), // indices
                5,
                0,
                0,
                0,
                0, // low bits
            ]
        );
        // Two words in the same set with different high bits both stay in
        // the dictionary (a direct-mapped dictionary would have lost the
        // first): the third word is an exact match of way 3 — misses fill
        // the LRU ways 3, then 2.
        let a = 0x1234_5400u32;
        let mut b = 0x7000_0000u32;
        while set_of(b) != set_of(a) {
            b += 0x400;
        }
        let out = enc(&[a, b, a]);
        assert_eq!(out[10], 3 | (3 << 2) | (1 << 4));
        let sa = set_of(a) as u8;
        assert_eq!(out[19], sa * 4 + 3);
    }

    #[test]
    fn corrupt_set_index_is_an_error() {
        let out = enc(&[5, 5, 0]);
        let mut bad = out.clone();
        // Point the partial match at another set.
        bad[11] = ((set_of(5) as u8 + 1) % 4) * 4;
        let mut back = vec![0u8; 12];
        assert!(Wk4x4::new().decompress(&bad, &mut back).is_err());
    }
}
