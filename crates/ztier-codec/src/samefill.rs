//! Zero and same-filled page detection.
//!
//! A page whose 8-byte words are all equal (zero pages being the common
//! case) needs no codec: it is stored as metadata only — the 8-byte pattern —
//! and rebuilt by filling. zram and zswap do the same. Detection reads the
//! page once and stops at the first word that differs, so on ordinary pages
//! it costs a few nanoseconds.

/// What the scan found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// Every byte is zero.
    Zero,
    /// Every 8-byte word equals this pattern (read little-endian), not zero.
    Same(u64),
}

/// Returns the fill of `buf` if every aligned 8-byte word in it is equal.
/// `buf.len()` must be a multiple of 8 (pages are); other lengths are never
/// reported as filled.
#[inline]
pub fn detect(buf: &[u8]) -> Option<Fill> {
    if buf.is_empty() || buf.len() % 8 != 0 {
        return None;
    }
    let first = u64::from_le_bytes(buf[..8].try_into().expect("8 bytes"));
    // Compare 64 bytes at a time: the compiler turns the inner loop into
    // vector compares, and the early exit keeps the common case cheap.
    let mut chunks = buf.chunks_exact(64);
    for chunk in &mut chunks {
        let mut diff = 0u64;
        for w in chunk.chunks_exact(8) {
            diff |= u64::from_le_bytes(w.try_into().expect("8 bytes")) ^ first;
        }
        if diff != 0 {
            return None;
        }
    }
    for w in chunks.remainder().chunks_exact(8) {
        if u64::from_le_bytes(w.try_into().expect("8 bytes")) != first {
            return None;
        }
    }
    Some(if first == 0 { Fill::Zero } else { Fill::Same(first) })
}

/// Fills `buf` with the pattern (the inverse of [`detect`]).
#[inline]
pub fn fill(buf: &mut [u8], f: Fill) {
    match f {
        Fill::Zero => buf.fill(0),
        Fill::Same(p) => {
            let bytes = p.to_le_bytes();
            for (i, b) in buf.iter_mut().enumerate() {
                *b = bytes[i % 8];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_zero_same_and_mixed() {
        let mut p = vec![0u8; 4096];
        assert_eq!(detect(&p), Some(Fill::Zero));
        for (i, b) in p.iter_mut().enumerate() {
            *b = [1, 2, 3, 4, 5, 6, 7, 8][i % 8];
        }
        let pat = u64::from_le_bytes([1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(detect(&p), Some(Fill::Same(pat)));
        let mut q = vec![0u8; 4096];
        fill(&mut q, Fill::Same(pat));
        assert_eq!(p, q);
        // One differing byte anywhere (first chunk, middle, last word).
        for pos in [0usize, 9, 2047, 4095] {
            let mut r = p.clone();
            r[pos] ^= 0x80;
            assert_eq!(detect(&r), None, "byte {pos}");
        }
        // A 4-byte period that is not an 8-byte period is still same-filled.
        let mut s = vec![0u8; 4096];
        for (i, b) in s.iter_mut().enumerate() {
            *b = (i % 4) as u8 + 1;
        }
        assert!(matches!(detect(&s), Some(Fill::Same(_))));
        assert_eq!(detect(&[0u8; 12]), None);
    }
}
