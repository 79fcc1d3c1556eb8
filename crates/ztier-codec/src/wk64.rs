//! WK64 — a WK codec that models 64-bit words.
//!
//! The WK codecs assume 32-bit words (the CCache paper points this out). On
//! a 64-bit heap the interesting values are 64 bits wide: pointers whose
//! high 32 bits are nearly constant across the whole process (and whose
//! 32-bit halves WKdm sees as two unrelated words), 64-bit counters and
//! sizes whose high half is zero. WK64 keeps WKdm's design and changes the
//! word:
//!
//! * words are 64-bit little-endian;
//! * a 16-entry direct-mapped dictionary indexed by a hash of the high
//!   bits;
//! * tags: zero, exact match, partial match — the same high
//!   `64 − LOW_BITS` bits as the dictionary entry, so a pointer into the
//!   same 64 KiB as a recent pointer, or any integer below 2^16, costs its
//!   16 low bits plus a 4-bit index — and miss (8 bytes).
//!
//! `LOW_BITS` = 16 was chosen by measurement on the three corpus files
//! (12, 16, 20 and 24 were tried; see the crate's benchmark notes).
//!
//! ## Format (version 0x31)
//!
//! ```text
//!  byte 0     1       2..4      4..6      6..8      8..10     10..12
//! +--------+-------+---------+---------+---------+---------+---------+
//! | 0x31   | flags | n_words | n_full  | n_index | n_low   | 0x0000  |  header, 12 bytes
//! +--------+-------+---------+---------+---------+---------+---------+
//! | tags: ceil(n_words / 4) bytes, 2 bits per 64-bit word, word i in  |
//! |       bits 2*(i%4).. of byte i/4 (0 zero, 1 exact, 2 partial,     |
//! |       3 miss)                                                     |
//! +-------------------------------------------------------------------+
//! | full words: n_full × 8 bytes                                      |
//! +-------------------------------------------------------------------+
//! | indices: ceil(n_index / 2) bytes, low nibble first                |
//! +-------------------------------------------------------------------+
//! | low bits: n_low × 2 bytes (16-bit little-endian)                  |
//! +-------------------------------------------------------------------+
//! | tail: 4 bytes, present when flags bit 0 is set (input length      |
//! |       ≡ 4 mod 8: the last 32-bit word, stored as it is)           |
//! +-------------------------------------------------------------------+
//! ```

#![forbid(unsafe_code)]

use crate::{check_input_len, check_output_len, Codec, CodecId, CompressError, DecompressError, MAX_INPUT};

/// Format version byte.
pub const VERSION: u8 = 0x31;
/// Header length in bytes.
pub const HEADER: usize = 12;
/// Width of the low-bits field of a partial match.
pub const LOW_BITS: u32 = 16;
const LOW_MASK: u64 = (1 << LOW_BITS) - 1;
const MAX_WORDS: usize = MAX_INPUT / 8;
const CHECK_EVERY: usize = 128;
const FLAG_TAIL: u8 = 1;

#[inline(always)]
fn slot(w: u64) -> usize {
    ((w >> LOW_BITS).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 60) as usize
}

fn packed_len(n: usize, nf: usize, ni: usize, nl: usize, tail: bool) -> usize {
    HEADER + n.div_ceil(4) + 8 * nf + ni.div_ceil(2) + 2 * nl + if tail { 4 } else { 0 }
}

/// WK64 with its work buffers.
pub struct Wk64 {
    tags: Vec<u8>,
    index: Vec<u8>,
    low: Vec<u16>,
    full: Vec<u64>,
}

impl std::fmt::Debug for Wk64 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Wk64")
    }
}

impl Default for Wk64 {
    fn default() -> Self {
        Self::new()
    }
}

impl Wk64 {
    /// A new codec.
    pub fn new() -> Self {
        Wk64 {
            tags: vec![0; MAX_WORDS + 4],
            index: vec![0; MAX_WORDS + 2],
            low: vec![0; MAX_WORDS + 1],
            full: vec![0; MAX_WORDS + 1],
        }
    }
}

impl Codec for Wk64 {
    fn id(&self) -> CodecId {
        CodecId::Wk64
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, CompressError> {
        check_input_len(src.len())?;
        let n = src.len() / 8;
        let tail = src.len() % 8 == 4;
        let cap = dst.len();
        let overflow = Err(CompressError::Overflow { capacity: cap });
        if packed_len(n, 0, 0, 0, tail) > cap {
            return overflow;
        }
        // Slot 16 is a scratch slot that zero words write, as in WKdm.
        let mut dict = [0u64; 17];
        let (mut nf, mut ni, mut nl) = (0usize, 0usize, 0usize);
        for (bi, block) in src[..8 * n].chunks(8 * CHECK_EVERY).enumerate() {
            for (j, w) in block.chunks_exact(8).enumerate() {
                let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
                let h = slot(w);
                let d = dict[h];
                let nonzero = (w != 0) as u8;
                let exact = (d == w) as u8;
                let partial = ((d ^ w) <= LOW_MASK) as u8;
                let t = nonzero * (3 - partial - exact);
                self.tags[bi * CHECK_EVERY + j] = t;
                self.index[ni] = h as u8;
                ni += (((t >> 1) ^ t) & 1) as usize;
                self.low[nl] = (w & LOW_MASK) as u16;
                nl += ((t >> 1) & !t & 1) as usize;
                self.full[nf] = w;
                nf += ((t >> 1) & t & 1) as usize;
                dict[h | (16 * (1 - nonzero as usize))] = w;
            }
            if packed_len(n, nf, ni, nl, tail) > cap {
                return overflow;
            }
        }
        let total = packed_len(n, nf, ni, nl, tail);
        let out = &mut dst[..total];
        out[0] = VERSION;
        out[1] = if tail { FLAG_TAIL } else { 0 };
        for (k, v) in [n, nf, ni, nl, 0].into_iter().enumerate() {
            out[2 + 2 * k..4 + 2 * k].copy_from_slice(&(v as u16).to_le_bytes());
        }
        let mut at = HEADER;
        for (o, t) in out[at..at + n.div_ceil(4)].iter_mut().zip(self.tags[..n].chunks(4)) {
            *o = t.iter().enumerate().fold(0u8, |b, (k, &x)| b | (x << (2 * k)));
        }
        at += n.div_ceil(4);
        for (o, w) in out[at..at + 8 * nf].chunks_exact_mut(8).zip(&self.full[..nf]) {
            o.copy_from_slice(&w.to_le_bytes());
        }
        at += 8 * nf;
        for (o, p) in out[at..at + ni.div_ceil(2)].iter_mut().zip(self.index[..ni].chunks(2)) {
            *o = p[0] | p.get(1).map_or(0, |x| x << 4);
        }
        at += ni.div_ceil(2);
        for (o, l) in out[at..at + 2 * nl].chunks_exact_mut(2).zip(&self.low[..nl]) {
            o.copy_from_slice(&l.to_le_bytes());
        }
        at += 2 * nl;
        if tail {
            out[at..at + 4].copy_from_slice(&src[8 * n..]);
        }
        Ok(total)
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), DecompressError> {
        check_output_len(dst.len())?;
        if src.len() < HEADER {
            return Err(DecompressError::Truncated("WK64 header"));
        }
        if src[0] != VERSION {
            return Err(DecompressError::WrongFormat { expected: VERSION, found: src[0] });
        }
        let rd = |k: usize| u16::from_le_bytes([src[2 + 2 * k], src[3 + 2 * k]]) as usize;
        let (n, nf, ni, nl, zero) = (rd(0), rd(1), rd(2), rd(3), rd(4));
        let tail = src[1] & FLAG_TAIL != 0;
        if 8 * n + if tail { 4 } else { 0 } != dst.len() {
            return Err(DecompressError::LengthMismatch {
                expected: dst.len(),
                actual: 8 * n + if tail { 4 } else { 0 },
            });
        }
        if src[1] & !FLAG_TAIL != 0 || zero != 0 || nl > ni || nf + ni > n {
            return Err(DecompressError::Corrupt("WK64 header is inconsistent"));
        }
        let total = packed_len(n, nf, ni, nl, tail);
        if src.len() < total {
            return Err(DecompressError::Truncated("WK64 segments"));
        }
        if src.len() > total {
            return Err(DecompressError::Corrupt("trailing bytes after WK64 segments"));
        }
        let mut at = HEADER;
        let packed_tags = &src[at..at + n.div_ceil(4)];
        let mut counts = [0usize; 4];
        for (i, t) in self.tags[..n].iter_mut().enumerate() {
            *t = (packed_tags[i / 4] >> (2 * (i % 4))) & 3;
            counts[*t as usize] += 1;
        }
        if counts[3] != nf || counts[1] + counts[2] != ni || counts[2] != nl {
            return Err(DecompressError::Corrupt("WK64 tag counts disagree with the header"));
        }
        at += n.div_ceil(4);
        let fulls = &src[at..at + 8 * nf];
        at += 8 * nf;
        let idx = &src[at..at + ni.div_ceil(2)];
        at += ni.div_ceil(2);
        let lows = &src[at..at + 2 * nl];
        at += 2 * nl;
        let mut dict = [0u64; 16];
        let (mut fp, mut ip, mut lp) = (0usize, 0usize, 0usize);
        for (&t, out) in self.tags[..n].iter().zip(dst.chunks_exact_mut(8)) {
            let v = match t {
                0 => 0,
                1 | 2 => {
                    let ix = ((idx[ip / 2] >> (4 * (ip % 2))) & 15) as usize;
                    ip += 1;
                    let mut v = dict[ix];
                    if t == 2 {
                        v = (v & !LOW_MASK) | u16::from_le_bytes([lows[2 * lp], lows[2 * lp + 1]]) as u64;
                        lp += 1;
                        dict[ix] = v;
                    }
                    v
                }
                _ => {
                    let f = u64::from_le_bytes(fulls[8 * fp..8 * fp + 8].try_into().expect("8 bytes"));
                    fp += 1;
                    dict[slot(f)] = f;
                    f
                }
            };
            out.copy_from_slice(&v.to_le_bytes());
        }
        if tail {
            dst[8 * n..].copy_from_slice(&src[at..at + 4]);
        }
        Ok(())
    }

    fn max_compressed_len(&self, len: usize) -> usize {
        packed_len(len / 8, len / 8, 0, 0, true) + 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(words: &[u64], tail: Option<u32>) -> Vec<u8> {
        let mut src: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        if let Some(t) = tail {
            src.extend_from_slice(&t.to_le_bytes());
        }
        crate::testutil::round_trip(&mut Wk64::new(), &src)
    }

    #[test]
    fn golden_vectors() {
        // A pointer (a miss), the next object's pointer (a partial match:
        // same high 48 bits), the first pointer again (partial too: the
        // previous partial replaced the dictionary entry), zero, and a
        // 4-byte tail.
        let p = 0x0000_5555_1234_0010u64;
        let h = slot(p) as u8;
        let out = enc(&[p, p + 0x20, p, 0], Some(0xdead_beef));
        assert_eq!(
            out,
            vec![
                VERSION,
                FLAG_TAIL,
                4,
                0,
                1,
                0,
                2,
                0,
                2,
                0,
                0,
                0,                       // header
                3 | (2 << 2) | (2 << 4), // tags: miss, partial, partial, zero
                0x10,
                0x00,
                0x34,
                0x12,
                0x55,
                0x55,
                0x00,
                0x00,         // full word
                h | (h << 4), // indices
                0x30,
                0x00,
                0x10,
                0x00, // low bits 0x0030, 0x0010
                0xef,
                0xbe,
                0xad,
                0xde, // tail
            ]
        );
        // Small integers partially match the zero-initialised slot of 0.
        let out = enc(&[7, 7], None);
        assert_eq!(out[12], 2 | (1 << 2));
    }

    #[test]
    fn bad_headers_are_errors() {
        let out = enc(&[1, 2, 3, 0x1_0000_0000], None);
        let mut back = vec![0u8; 32];
        let mut c = Wk64::new();
        let mut bad = out.clone();
        bad[1] = 2;
        assert!(c.decompress(&bad, &mut back).is_err());
        let mut bad = out.clone();
        bad[10] = 1;
        assert!(c.decompress(&bad, &mut back).is_err());
        assert!(c.decompress(&out[..out.len() - 1], &mut back).is_err());
        let mut back36 = vec![0u8; 36];
        assert!(c.decompress(&out, &mut back36).is_err());
    }
}
