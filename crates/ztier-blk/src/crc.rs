//! CRC-32C of several stored blocks at once.
//!
//! A read checks every stored block before decoding it. Blocks are a few
//! KiB, and one block's CRC is a chain of dependent `crc32` instructions
//! (3 cycles each on current x86): one block at a time runs at a third of
//! the instruction's throughput, and the `crc32c` crate's three-way split
//! leaves up to 767 bytes of a short buffer to one chain. Three blocks
//! interleaved keep three independent chains busy with no combining step.

/// CRC-32C (the `crc32c` crate's value) of each of `a`, `b` and `c`.
pub fn crc32c_x3(a: &[u8], b: &[u8], c: &[u8]) -> [u32; 3] {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("sse4.2") {
            // SAFETY: the CPU has SSE4.2 (checked just above).
            return unsafe { x3_sse42(a, b, c) };
        }
    }
    [crc32c::crc32c(a), crc32c::crc32c(b), crc32c::crc32c(c)]
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn x3_sse42(a: &[u8], b: &[u8], c: &[u8]) -> [u32; 3] {
    use std::arch::x86_64::_mm_crc32_u64;
    let words = a.len().min(b.len()).min(c.len()) / 8;
    let (mut ca, mut cb, mut cc) = (!0u32 as u64, !0u32 as u64, !0u32 as u64);
    let (pa, pb, pc) = (a.as_ptr(), b.as_ptr(), c.as_ptr());
    for i in 0..words {
        // SAFETY: `i * 8 + 8 <= words * 8 <=` each slice's length; the
        // reads are unaligned loads of plain bytes.
        let (wa, wb, wc) = unsafe {
            (
                (pa.add(i * 8) as *const u64).read_unaligned(),
                (pb.add(i * 8) as *const u64).read_unaligned(),
                (pc.add(i * 8) as *const u64).read_unaligned(),
            )
        };
        ca = _mm_crc32_u64(ca, wa);
        cb = _mm_crc32_u64(cb, wb);
        cc = _mm_crc32_u64(cc, wc);
    }
    let done = words * 8;
    // The rest of each (the longer blocks' tails) one by one; the crate
    // takes and gives the finished (inverted) value.
    [
        crc32c::crc32c_append(!(ca as u32), &a[done..]),
        crc32c::crc32c_append(!(cb as u32), &b[done..]),
        crc32c::crc32c_append(!(cc as u32), &c[done..]),
    ]
}

/// Asks the CPU to bring `bytes` into its caches (a hint; no effect on
/// other architectures). A span's stored blocks lie in page-cache pages
/// that are not neighbours in memory, so the hardware prefetcher, which
/// stops at page boundaries, starts over at every 4 KiB.
pub fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        for line in bytes.chunks(64) {
            // SAFETY: a prefetch is a hint that never faults; the address
            // is inside `bytes`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_at_once_equals_one_at_a_time_for_every_length_mix() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        for la in [0, 1, 7, 8, 9, 63, 1000, 2047, 4096] {
            for lb in [0, 5, 8, 777, 2048, 4100] {
                for lc in [3, 16, 2049] {
                    let (a, b, c) = (&data[..la], &data[3..3 + lb], &data[11..11 + lc]);
                    assert_eq!(
                        crc32c_x3(a, b, c),
                        [crc32c::crc32c(a), crc32c::crc32c(b), crc32c::crc32c(c)],
                        "lengths {la} {lb} {lc}"
                    );
                }
            }
        }
    }
}
