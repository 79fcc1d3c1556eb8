//! Sequential streams bypass the cache (bcache's `sequential_cutoff`):
//! a backup or a copy reading or writing a long run of blocks would
//! otherwise push the working set out for data read once.
//!
//! NBD requests carry no task identity, so streams are told apart by
//! where they continue: a request that starts within [`WINDOW`] of where
//! one of the last [`STREAMS`] streams ended extends it, the one that
//! ended nearest (clients keep several requests of one stream in flight,
//! so they arrive a little out of order). Once a stream has moved more
//! than the cutoff, its requests bypass; hits count too.

use parking_lot::Mutex;

/// Streams tracked at once.
pub const STREAMS: usize = 16;
/// How far from a stream's end a request may start and still extend it.
pub const WINDOW: u64 = 128 << 10;

#[derive(Clone, Copy, Default)]
struct Stream {
    end: u64,
    bytes: u64,
    used: u64,
}

/// The detector.
pub struct Sequential {
    cutoff: u64,
    st: Mutex<([Stream; STREAMS], u64)>,
}

impl Sequential {
    /// Bypass streams longer than `cutoff` bytes (0: never).
    pub fn new(cutoff: u64) -> Sequential {
        Sequential { cutoff, st: Mutex::new(([Stream::default(); STREAMS], 0)) }
    }

    /// Records a request; returns whether it should bypass the cache.
    pub fn observe(&self, off: u64, len: u64) -> bool {
        self.step(off, len, true)
    }

    /// Whether a request would bypass, recording nothing.
    pub fn peek(&self, off: u64, len: u64) -> bool {
        self.step(off, len, false)
    }

    fn step(&self, off: u64, len: u64, record: bool) -> bool {
        if self.cutoff == 0 {
            return false;
        }
        let mut g = self.st.lock();
        let (streams, clock) = &mut *g;
        // Of the streams it may continue, the one that ends nearest.
        let hit = (0..STREAMS)
            .filter(|&i| {
                let s = &streams[i];
                s.bytes > 0 && off + WINDOW >= s.end && off <= s.end + WINDOW
            })
            .min_by_key(|&i| (streams[i].end.abs_diff(off), u64::MAX - streams[i].bytes));
        if !record {
            return hit.map_or(0, |i| streams[i].bytes) + len > self.cutoff;
        }
        *clock += 1;
        let i = match hit {
            Some(i) => i,
            None => {
                let i = (0..STREAMS).min_by_key(|&i| streams[i].used).expect("streams");
                streams[i] = Stream::default();
                i
            }
        };
        let s = &mut streams[i];
        s.end = s.end.max(off + len);
        s.bytes += len;
        s.used = *clock;
        s.bytes > self.cutoff
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_runs_bypass_random_io_does_not() {
        let s = Sequential::new(4 << 20);
        let mut bypassed = 0;
        for i in 0..2048u64 {
            // Two interleaved sequential readers, a little out of order.
            let j = if i % 4 == 1 {
                i + 1
            } else if i % 4 == 2 {
                i - 1
            } else {
                i
            };
            bypassed += s.observe(j * 4096, 4096) as u32;
            bypassed += s.observe((1 << 30) + j * 4096, 4096) as u32;
        }
        assert!(bypassed > 2 * (2048 - 1024) - 10, "{bypassed}");
        let r = Sequential::new(4 << 20);
        let mut x = 7u64;
        let mut n = 0;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            n += r.observe((x % (1 << 18)) * 4096, 4096) as u32;
        }
        assert_eq!(n, 0, "random 4K I/O over 1 GiB never bypasses");
        assert!(!Sequential::new(0).observe(0, 1 << 30));
        // peek answers as observe would, and records nothing.
        let p = Sequential::new(1 << 20);
        assert!(!p.peek(0, 1 << 20) && p.peek(0, (1 << 20) + 1));
        assert!(!p.observe(0, 512 << 10));
        for _ in 0..3 {
            assert!(!p.peek(512 << 10, 512 << 10) && p.peek(512 << 10, (512 << 10) + 1));
        }
        assert!(!p.observe(512 << 10, 512 << 10) && p.observe(1 << 20, 4096));
    }
}
