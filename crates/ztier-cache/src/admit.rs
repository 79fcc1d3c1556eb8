//! Admission to the SSD cache once it is full: a block is filled only if
//! it was asked for before, recently (TinyLFU's doorkeeper, Einziger et
//! al. 2017; bcache and dm-cache's smq likewise keep one-touch blocks
//! from pushing out reused ones).
//!
//! ```text
//!  bits: 4 per directory line (half a byte of RAM per line), a Bloom
//!        filter of 2 hashes of the block number
//!  seen(lba): sets lba's bits; true if both were set already
//!  window:    after lines / 2 blocks newly recorded (8 bits each) the
//!             filter is emptied, so "before" means within about half
//!             a cache's worth of other blocks
//! ```
//!
//! A false positive admits a block as before; nothing here decides what
//! is served, only what is cached (lock-free; a race of two threads
//! recording or emptying loses at most a record).

use std::sync::atomic::{AtomicU64, Ordering};

/// The doorkeeper.
pub struct Doorkeeper {
    words: Box<[AtomicU64]>,
    /// Blocks newly recorded since the filter was last emptied.
    recorded: AtomicU64,
    window: u64,
}

fn mix(mut x: u64) -> u64 {
    // splitmix64's finaliser, another constant than the directory's tags
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Doorkeeper {
    /// A doorkeeper for a directory of `lines` lines: 4 bits per line,
    /// emptied after `lines / 2` new blocks.
    pub fn new(lines: u64) -> Doorkeeper {
        let words = (lines.max(128) / 16) as usize;
        Doorkeeper {
            words: (0..words).map(|_| AtomicU64::new(0)).collect(),
            recorded: AtomicU64::new(0),
            window: (lines / 2).max(1),
        }
    }

    fn bits(&self, lba: u64) -> [(usize, u64); 2] {
        let h = mix(lba);
        let n = self.words.len() as u64 * 64;
        let a = h % n;
        let b = (h >> 32 ^ h.rotate_left(17)) % n;
        [((a / 64) as usize, 1 << (a % 64)), ((b / 64) as usize, 1 << (b % 64))]
    }

    /// Records `lba`; whether it was recorded before (since the filter
    /// was last emptied).
    pub fn seen(&self, lba: u64) -> bool {
        let mut before = true;
        for (w, bit) in self.bits(lba) {
            if self.words[w].fetch_or(bit, Ordering::Relaxed) & bit == 0 {
                before = false;
            }
        }
        if !before && self.recorded.fetch_add(1, Ordering::Relaxed) + 1 >= self.window {
            self.recorded.store(0, Ordering::Relaxed);
            for w in self.words.iter() {
                w.store(0, Ordering::Relaxed);
            }
        }
        before
    }

    /// Bytes of RAM it takes.
    pub fn memory_bytes(&self) -> u64 {
        (self.words.len() * 8) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_seen_the_second_time_until_the_window_ends() {
        let d = Doorkeeper::new(8192);
        assert_eq!(d.memory_bytes(), 4096);
        assert!(!d.seen(7));
        assert!(d.seen(7));
        // Of 2,000 other blocks (half the window), few look seen already.
        let fp = (1000..3000u64).filter(|&b| d.seen(b)).count();
        assert!(fp < 60, "{fp} false positives of 2000");
        assert!(d.seen(7) && d.seen(1500));
        // 4,096 new blocks in all empty the filter.
        let mut b = 1_000_000u64;
        while d.recorded.load(Ordering::Relaxed) != 0 {
            d.seen(b);
            b += 1;
        }
        assert!(!d.seen(7), "forgotten once the window ended");
    }
}
