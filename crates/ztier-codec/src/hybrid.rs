//! hybrid: a WK codec first, a second codec for the pages it does poorly on.
//!
//! This is xnu's idea: WK codecs are fastest on pages of 32-bit words
//! (integers, pointers), byte-oriented LZ codecs win on strings and code.
//!
//! ## Per page
//!
//! The page is compressed with the first codec (WKdm by default). If the
//! result is at most `threshold` bytes (xnu uses 2048 for a 4 KiB page;
//! scaled here with the input length) it is kept. Otherwise the second
//! codec (LZ4 by default) is tried with an output limit of one byte less
//! than the first codec's size, and the smaller output is kept. Both
//! attempts stop as soon as they exceed their output limit (early abort),
//! so an incompressible page costs one WK pass and one LZ4 pass that both
//! stop early, and then the caller stores it raw.
//!
//! ## Across pages (adaptive runs)
//!
//! Heaps come in stretches: on CPython's heap LZ4 beats WKdm on almost every
//! page, on cc1's WKdm wins often. Running both codecs on every page costs
//! more than either alone, so, as xnu's compressor does with its "LZ4 runs",
//! the codec remembers recent outcomes: after `RUN_TRIGGER` pages in a row,
//! among those tried with both, that the same codec won, the next
//! `RUN_LENGTH` pages go to that codec alone. A page whose output is still
//! large (above 3/4 of the page) is also tried with the other codec, and if
//! the other codec wins the run ends (after `RECHECK_GIVE_UP` losing
//! re-checks a run stops re-checking). After a run the next page is tried
//! with both; if the same codec wins again a new run starts at once, so a
//! steady stretch costs one double attempt per `RUN_LENGTH` pages and a
//! change in the data is noticed within `RUN_LENGTH` pages.
//!
//! Tried and left out: runs that double each time the same codec wins
//! again right after one (up to 64, 128 or 256 pages). On CPython's heaps,
//! where LZ4 wins nearly every page, they brought the compress speed from
//! 0.96–0.98× LZ4's to 0.95–1.03× (`ztier bench codecs --each --codecs
//! lz4,hybrid` over the three corpus files, three or four runs each), but
//! the ratio on python-dict.pages fell from 1.00002× LZ4's to
//! 0.9993–0.9995×: in a long run the few pages WKdm wins go to LZ4.
//!
//! ## Format
//!
//! The inner codec's output followed by one trailer byte that names it (the
//! trailer keeps the inner payload at the buffer's start):
//!
//! ```text
//! +------------------------------+-----------+
//! | inner payload (n bytes)      | inner tag |  tag: CodecId as u8 (1 = wkdm, 3 = wk64, 5 = lz4, ...)
//! +------------------------------+-----------+
//! ```
//!
//! The decoder accepts any inner tag this codec value can decode (its first
//! and second codec), so the adaptive choice never needs to be replayed.
//!
//! A caller that keeps a codec tag beside each page needs no trailer:
//! [`Codec::compress_tagged`] returns the inner payload alone with the
//! inner codec's id as the tag (the page store stores pages so, see
//! [`crate::page::PageEncoder::inner_tags`]), and
//! [`Codec::decompress_tagged`] decodes either form: tag `hybrid` is the
//! trailer form above, tag `wkdm`/`lz4` (this value's first or second
//! codec) a bare inner payload.

use crate::{check_input_len, check_output_len, new_codec, Codec, CodecId, CompressError, DecompressError};

/// Default threshold for a 4 KiB page, as in xnu.
pub const DEFAULT_THRESHOLD: usize = 1024;
/// Consecutive second-codec wins that start a run.
pub const RUN_TRIGGER: u32 = 4;
/// Pages compressed with the second codec alone during a run.
pub const RUN_LENGTH: u32 = 32;
/// During a run, a second-codec output above this fraction of the input
/// (3/4) is also tried with the first codec.
pub const RUN_RECHECK_NUM: usize = 3;
/// Denominator of the run re-check fraction.
pub const RUN_RECHECK_DEN: usize = 4;
/// Re-checks that may lose during one run before the run stops re-checking
/// (pages the run's codec leaves large are often large for both).
pub const RECHECK_GIVE_UP: u32 = 2;

/// A WK codec with a fallback codec and adaptive runs.
pub struct Hybrid {
    first: Box<dyn Codec>,
    second: Box<dyn Codec>,
    /// Threshold for a 4 KiB input; scaled linearly for other lengths.
    threshold: usize,
    /// Consecutive pages, among those tried with both codecs, that the same
    /// codec won; `streak_second` says which.
    streak: u32,
    streak_second: bool,
    /// Pages left in the current run, and whether it is the second codec's.
    run_left: u32,
    run_second: bool,
    /// Re-checks with the other codec that lost during the current run.
    recheck_misses: u32,
    last_len: usize,
    scratch: Vec<u8>,
    /// Counters of which inner codec won (for diagnostics and benchmarks).
    pub stats: HybridStats,
}

/// How often each path was taken.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HybridStats {
    /// Pages kept as the first codec without trying the second.
    pub first_fast: u64,
    /// Pages where both were tried and the first was smaller.
    pub first_after_try: u64,
    /// Pages where both were tried and the second was smaller.
    pub second_after_try: u64,
    /// Pages compressed by the leading codec of a run alone.
    pub in_run: u64,
    /// Pages during a run where the other codec won (ending the run).
    pub run_broken: u64,
}

impl std::fmt::Debug for Hybrid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hybrid")
            .field("first", &self.first.id())
            .field("second", &self.second.id())
            .field("threshold", &self.threshold)
            .finish()
    }
}

impl Hybrid {
    /// WKdm first, then `second` for pages whose WKdm output exceeds
    /// `threshold` bytes (per 4 KiB of input).
    pub fn new(threshold: usize, second: CodecId) -> Self {
        Self::with_first(CodecId::Wkdm, threshold, second)
    }

    /// `first`, then `second` for pages whose first output exceeds
    /// `threshold` bytes (per 4 KiB of input). Neither may be hybrid, and
    /// they must differ.
    pub fn with_first(first: CodecId, threshold: usize, second: CodecId) -> Self {
        assert!(
            first != second && first != CodecId::Hybrid && second != CodecId::Hybrid,
            "hybrid needs two different non-hybrid codecs"
        );
        Hybrid {
            first: new_codec(first),
            second: new_codec(second),
            threshold,
            streak: 0,
            streak_second: false,
            run_left: 0,
            run_second: false,
            recheck_misses: 0,
            last_len: 0,
            scratch: vec![0; crate::MAX_INPUT + 1024],
            stats: HybridStats::default(),
        }
    }

    fn threshold_for(&self, len: usize) -> usize {
        self.threshold * len / crate::PAGE_SIZE
    }
}

impl Default for Hybrid {
    fn default() -> Self {
        Hybrid::new(DEFAULT_THRESHOLD, CodecId::Lz4)
    }
}

impl Codec for Hybrid {
    fn id(&self) -> CodecId {
        CodecId::Hybrid
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, CompressError> {
        check_input_len(src.len())?;
        let capacity = dst.len();
        if capacity < 2 {
            return Err(CompressError::Overflow { capacity });
        }
        // One byte for the trailer.
        let (n, tag) = self.payload(src, dst, capacity - 1)?;
        dst[n] = tag as u8;
        Ok(n + 1)
    }

    fn compress_tagged(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(usize, CodecId), CompressError> {
        check_input_len(src.len())?;
        let room = dst.len();
        if room < 1 {
            return Err(CompressError::Overflow { capacity: room });
        }
        self.payload(src, dst, room)
    }

    fn decompress_tagged(&mut self, tag: CodecId, src: &[u8], dst: &mut [u8]) -> Result<(), DecompressError> {
        check_output_len(dst.len())?;
        if tag == CodecId::Hybrid {
            self.decompress(src, dst)
        } else if tag == self.first.id() {
            self.first.decompress(src, dst)
        } else if tag == self.second.id() {
            self.second.decompress(src, dst)
        } else {
            Err(DecompressError::WrongFormat { expected: CodecId::Hybrid as u8, found: tag as u8 })
        }
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), DecompressError> {
        check_output_len(dst.len())?;
        let (&tag, payload) = src.split_last().ok_or(DecompressError::Truncated("empty hybrid page"))?;
        if tag == self.first.id() as u8 {
            self.first.decompress(payload, dst)
        } else if tag == self.second.id() as u8 {
            self.second.decompress(payload, dst)
        } else {
            Err(DecompressError::WrongFormat { expected: self.first.id() as u8, found: tag })
        }
    }

    fn max_compressed_len(&self, len: usize) -> usize {
        self.first.max_compressed_len(len).max(self.second.max_compressed_len(len)) + 1
    }
}

impl Hybrid {
    /// Compresses `src` with the codec the page and the run call for into
    /// `dst[..room]` (`room <= dst.len()`; no trailer): the bytes written
    /// and the codec that wrote them.
    fn payload(
        &mut self,
        src: &[u8],
        dst: &mut [u8],
        room: usize,
    ) -> Result<(usize, CodecId), CompressError> {
        let capacity = dst.len();
        let large = src.len() * RUN_RECHECK_NUM / RUN_RECHECK_DEN;
        let (first_id, second_id) = (self.first.id(), self.second.id());

        if self.run_left > 0 {
            self.run_left -= 1;
            if self.run_left == 0 {
                // Re-arm: one more win by the same codec starts a new run.
                self.streak = RUN_TRIGGER - 1;
                self.streak_second = self.run_second;
            }
            // In a run: the codec that has been winning alone, unless its
            // output is large; then the other one gets a chance.
            let (lead, other) = if self.run_second {
                (&mut self.second, &mut self.first)
            } else {
                (&mut self.first, &mut self.second)
            };
            let (lead_id, other_id) = (lead.id(), other.id());
            let lead_n = match lead.compress(src, &mut dst[..room]) {
                Ok(n) if n <= large || self.recheck_misses >= RECHECK_GIVE_UP => {
                    self.stats.in_run += 1;
                    return Ok((n, lead_id));
                }
                Ok(n) => Some(n),
                Err(CompressError::Overflow { .. }) => None,
                Err(e) => return Err(e),
            };
            let limit = lead_n.map_or(room, |n| n.saturating_sub(1)).min(self.scratch.len());
            if let Ok(m) = other.compress(src, &mut self.scratch[..limit]) {
                // The data changed: end the run.
                dst[..m].copy_from_slice(&self.scratch[..m]);
                self.stats.run_broken += 1;
                self.run_left = 0;
                self.streak = 0;
                return Ok((m, other_id));
            }
            self.recheck_misses += 1;
            self.stats.in_run += 1;
            return match lead_n {
                Some(n) => Ok((n, lead_id)),
                None => Err(CompressError::Overflow { capacity }),
            };
        }

        let threshold = self.threshold_for(src.len());
        let first = match self.first.compress(src, &mut dst[..room]) {
            Ok(n) if n <= threshold => {
                self.stats.first_fast += 1;
                self.streak = 0;
                return Ok((n, first_id));
            }
            Ok(n) => Some(n),
            Err(CompressError::Overflow { .. }) => None,
            Err(e) => return Err(e),
        };
        // The first codec did poorly: try the second, limited to beating it.
        let limit = first.map_or(room, |n| n.saturating_sub(1)).min(self.scratch.len());
        let second_won = limit > 0 && {
            match self.second.compress(src, &mut self.scratch[..limit]) {
                Ok(m) => {
                    dst[..m].copy_from_slice(&self.scratch[..m]);
                    self.last_len = m;
                    true
                }
                Err(_) => false,
            }
        };
        // Streak of the same winner after trying both; RUN_TRIGGER in a row
        // starts a run of that codec.
        if self.streak > 0 && self.streak_second == second_won {
            self.streak += 1;
        } else {
            self.streak = 1;
            self.streak_second = second_won;
        }
        if self.streak >= RUN_TRIGGER {
            self.run_left = RUN_LENGTH;
            self.recheck_misses = 0;
            self.run_second = second_won;
            self.streak = 0;
        }
        if second_won {
            self.stats.second_after_try += 1;
            return Ok((self.last_len, second_id));
        }
        match first {
            Some(n) => {
                self.stats.first_after_try += 1;
                Ok((n, first_id))
            }
            None => Err(CompressError::Overflow { capacity }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::synth;

    #[test]
    fn keeps_the_smaller_inner_output_and_names_it() {
        let mut h = Hybrid::default();
        let mut lz = new_codec(CodecId::Lz4);
        let text = synth::page(synth::Kind::Text, 4);
        let mut out = vec![0u8; h.max_compressed_len(4096)];
        let n = h.compress(&text, &mut out).unwrap();
        let mut lz_out = vec![0u8; lz.max_compressed_len(4096)];
        let m = lz.compress(&text, &mut lz_out).unwrap();
        // Text is byte-oriented: WKdm does poorly, so the trailer names lz4
        // and the payload is LZ4's output.
        assert_eq!(out[n - 1], CodecId::Lz4 as u8);
        assert_eq!(&out[..n - 1], &lz_out[..m]);
        let ints = synth::page(synth::Kind::SmallInts, 4);
        let n = h.compress(&ints, &mut out).unwrap();
        assert_eq!(out[n - 1], CodecId::Wkdm as u8);
        let mut back = vec![0u8; 4096];
        h.decompress(&out[..n], &mut back).unwrap();
        assert_eq!(back, ints);
        // An unknown trailer is a format error.
        out[n - 1] = 200;
        assert!(h.decompress(&out[..n], &mut back).is_err());
        // Random data: neither fits under 3/4 of a page.
        let rnd = synth::page(synth::Kind::Random, 4);
        assert!(h.compress(&rnd, &mut out[..3072]).is_err());
    }

    #[test]
    fn a_stretch_of_second_codec_wins_starts_a_run_and_word_pages_end_it() {
        let mut h = Hybrid::default();
        let mut out = vec![0u8; h.max_compressed_len(4096)];
        for i in 0..RUN_TRIGGER {
            let p = synth::page(synth::Kind::Text, i as u64);
            h.compress(&p, &mut out).unwrap();
        }
        assert_eq!(h.stats.second_after_try, RUN_TRIGGER as u64);
        assert_eq!(h.run_left, RUN_LENGTH);
        assert!(h.run_second);
        let p = synth::page(synth::Kind::Text, 99);
        let n = h.compress(&p, &mut out).unwrap();
        assert_eq!(h.stats.in_run, 1, "text during a run goes to LZ4 alone");
        assert_eq!(out[n - 1], CodecId::Lz4 as u8);
        // Pages LZ4 leaves large are still tried with WKdm during a run.
        let mut words = vec![0u8; 4096];
        let mut rng = synth::Rng::new(3);
        for w in words.chunks_exact_mut(4) {
            let v = 0x4000_0000u32 | (rng.below(1 << 20) as u32) << 10 | 7;
            w.copy_from_slice(&v.to_le_bytes());
        }
        let n = h.compress(&words, &mut out).unwrap();
        let mut back = vec![0u8; 4096];
        h.decompress(&out[..n], &mut back).unwrap();
        assert_eq!(back, words);
        // Every path decodes.
        for kind in synth::KINDS {
            let p = synth::page(kind, 5);
            if let Ok(n) = h.compress(&p, &mut out) {
                h.decompress(&out[..n], &mut back).unwrap();
                assert_eq!(back, p);
            }
        }
    }

    #[test]
    fn tagged_output_is_the_inner_payload_without_a_trailer() {
        let mut h = Hybrid::default();
        let mut t = Hybrid::default();
        let mut out = vec![0u8; h.max_compressed_len(4096)];
        let mut tagged = vec![0u8; h.max_compressed_len(4096)];
        let mut back = vec![0u8; 4096];
        let mut seen = Vec::new();
        for (i, kind) in synth::KINDS.into_iter().enumerate() {
            let p = synth::page(kind, i as u64);
            let Ok(n) = h.compress(&p, &mut out) else { continue };
            let (m, tag) = t.compress_tagged(&p, &mut tagged).unwrap();
            // The same choice, one byte shorter, and the trailer's tag beside it.
            assert_eq!(m + 1, n, "{kind:?}");
            assert_eq!(&tagged[..m], &out[..m]);
            assert_eq!(tag as u8, out[n - 1]);
            seen.push(tag);
            t.decompress_tagged(tag, &tagged[..m], &mut back).unwrap();
            assert_eq!(back, p);
            // The trailer form stays readable under the hybrid tag.
            back.fill(0);
            t.decompress_tagged(CodecId::Hybrid, &out[..n], &mut back).unwrap();
            assert_eq!(back, p);
            // A tag naming a codec this value does not hold is refused.
            assert!(matches!(
                t.decompress_tagged(CodecId::Zstd, &tagged[..m], &mut back),
                Err(DecompressError::WrongFormat { .. })
            ));
        }
        assert!(seen.contains(&CodecId::Wkdm) && seen.contains(&CodecId::Lz4), "{seen:?}");
        // Room for the payload alone is enough without the trailer.
        let ints = synth::page(synth::Kind::SmallInts, 4);
        let (m, _) = Hybrid::default().compress_tagged(&ints, &mut tagged).unwrap();
        assert!(Hybrid::default().compress_tagged(&ints, &mut tagged[..m]).is_ok());
        assert!(Hybrid::default().compress(&ints, &mut out[..m]).is_err());
    }

    #[test]
    fn wk64_can_be_the_first_codec() {
        let mut h = Hybrid::with_first(CodecId::Wk64, DEFAULT_THRESHOLD, CodecId::Lz4);
        let p = synth::page(synth::Kind::Pointers, 1);
        let mut out = vec![0u8; h.max_compressed_len(4096)];
        let n = h.compress(&p, &mut out).unwrap();
        let mut back = vec![0u8; 4096];
        h.decompress(&out[..n], &mut back).unwrap();
        assert_eq!(back, p);
    }
}
