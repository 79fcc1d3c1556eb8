//! hybrid: a WK codec first, a second codec for the pages it does poorly on.
//!
//! This is xnu's idea: WK codecs are fastest on pages of 32-bit words
//! (integers, pointers), byte-oriented LZ codecs win on strings and code.
//!
//! ## Per page
//!
//! The page is compressed with the first codec (WKdm by default). If the
//! result is at most `threshold` bytes (xnu uses 2048 for a 4 KiB page;
//! scaled here with the input length) it is kept, unless a quarter or more
//! of the page's words are zero (counted from the WK output's header): WK
//! pays two bits for every zero word, LZ4 next to nothing for a run of
//! them, so on such pages a small WK output says little about LZ4's, and
//! LZ4 was smaller on most of them in the corpus files. Otherwise the second
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
//! re-checks a run stops re-checking). Losing re-checks add up over a chain
//! of second-codec runs that follow each other while the first codec wins
//! no page (kept without trying, tried with both, or re-checked): on
//! CPython's heaps LZ4 wins nearly every page and half its outputs are
//! large, so re-checking `RECHECK_GIVE_UP` of them per run cost a WKdm pass
//! every 64 pages and found nothing; now a chain re-checks that many in
//! all. A first-codec win, or a run of the first codec, starts the count
//! again. After a run the next page is tried
//! with both; if the same codec wins again a new run starts at once, so a
//! steady stretch costs one double attempt per run and a change in the
//! data is noticed within a run's length.
//!
//! Runs of the second codec double, up to `MAX_RUN_LENGTH` pages, while it
//! keeps winning clearly: when a second-codec run follows one and every
//! win of the streak that starts it was clear (the first codec's output at
//! least `CLEAR_NUM / CLEAR_DEN` = 1.1 times the second's). Pages of a
//! second-codec run cost exactly the second codec's bytes, so long runs
//! never make hybrid's output larger than LZ4's; they only give up pages
//! WKdm would have won, and where LZ4 wins nearly every page (CPython's
//! heaps) they save the double attempts. WKdm runs stay `RUN_LENGTH`
//! long: their pages are kept without trying LZ4, which can lose bytes.
//! (Before hybrid's tag moved out of the payload, runs doubling after any
//! win had cost python-dict.pages its ratio; with the trailer gone and
//! only clear wins doubling they no longer do: docs/measurements.)
//!
//! ## Its LZ4
//!
//! The LZ4 attempts go through [`crate::lz4page`], a port of liblz4's
//! compressor specialised for pages that writes liblz4's bytes exactly and
//! runs 1–5% faster than its entry point on the corpus pages (with the
//! `safe` feature, liblz4 itself). On CPython's heaps, where LZ4 wins
//! nearly every page, that is what puts hybrid ahead of plain LZ4: the
//! rules above only keep its extra WKdm work near 1%.
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

use crate::lz4page::Lz4Page;
use crate::{check_input_len, check_output_len, new_codec, Codec, CodecId, CompressError, DecompressError};

/// Default threshold for a 4 KiB page, as in xnu.
pub const DEFAULT_THRESHOLD: usize = 1024;
/// Consecutive second-codec wins that start a run.
pub const RUN_TRIGGER: u32 = 4;
/// Pages compressed with the second codec alone during a run.
pub const RUN_LENGTH: u32 = 32;
/// The longest run of the second codec: its runs double up to this while
/// it keeps winning clearly (see the module docs).
pub const MAX_RUN_LENGTH: u32 = 128;
/// A second-codec win is clear when the first codec's output is at least
/// `CLEAR_NUM / CLEAR_DEN` (11/10) times the second's.
pub const CLEAR_NUM: usize = 11;
/// Denominator of the clear-win fraction.
pub const CLEAR_DEN: usize = 10;
/// A first-codec output under the threshold is kept without trying the
/// second codec only if fewer than `1 / ZERO_HEAVY_DEN` of the page's
/// words are zero (WK tallies from the output's header).
pub const ZERO_HEAVY_DEN: usize = 4;
/// During a run, a second-codec output above this fraction of the input
/// (3/4) is also tried with the first codec.
pub const RUN_RECHECK_NUM: usize = 3;
/// Denominator of the run re-check fraction.
pub const RUN_RECHECK_DEN: usize = 4;
/// Re-checks that may lose during one run, or one chain of second-codec
/// runs the first codec wins no page in, before re-checking stops (pages
/// the run's codec leaves large are often large for both).
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
    /// How many of the pages of the current streak were clear wins of the
    /// second codec.
    clear_streak: u32,
    /// The length of the next second-codec run if it follows one.
    run_len: u32,
    /// Pages left in the current run, and whether it is the second codec's.
    run_left: u32,
    run_second: bool,
    /// Re-checks with the other codec that lost during the current run,
    /// or during the current chain of second-codec runs (see the module
    /// docs).
    recheck_misses: u32,
    /// Whether the first codec won a page since the current run started
    /// (kept without trying the second, tried with both, or a re-check).
    first_won: bool,
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
    /// Pages whose first output was under the threshold but that were
    /// tried with the second codec too, as a quarter or more of their
    /// words are zero.
    pub zero_heavy: u64,
    /// Pages where both were tried and the first was smaller.
    pub first_after_try: u64,
    /// Pages where both were tried and the second was smaller.
    pub second_after_try: u64,
    /// Pages compressed by the leading codec of a run alone.
    pub in_run: u64,
    /// Pages during a run whose output was large and that were also tried
    /// with the other codec.
    pub rechecks: u64,
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
            first: inner_codec(first),
            second: inner_codec(second),
            threshold,
            streak: 0,
            streak_second: false,
            clear_streak: 0,
            run_len: RUN_LENGTH,
            run_left: 0,
            run_second: false,
            recheck_misses: 0,
            first_won: false,
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
            self.stats.rechecks += 1;
            if let Ok(m) = other.compress(src, &mut self.scratch[..limit]) {
                // The data changed: end the run.
                dst[..m].copy_from_slice(&self.scratch[..m]);
                self.stats.run_broken += 1;
                self.first_won |= !self.run_second;
                self.run_left = 0;
                self.streak = 0;
                self.run_len = RUN_LENGTH;
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
                // A small WK output says little about LZ4's on a page of
                // many zero words: WK pays two bits a zero word, LZ4 next
                // to nothing for a run of them.
                let zero_heavy = zero_words(&dst[..n]).is_some_and(|z| z * ZERO_HEAVY_DEN >= src.len() / 4);
                if !zero_heavy {
                    self.stats.first_fast += 1;
                    self.first_won = true;
                    self.streak = 0;
                    self.clear_streak = 0;
                    return Ok((n, first_id));
                }
                self.stats.zero_heavy += 1;
                Some(n)
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
        let clear = second_won && first.is_none_or(|n| n * CLEAR_DEN >= self.last_len * CLEAR_NUM);
        self.first_won |= !second_won;
        if self.streak > 0 && self.streak_second == second_won {
            self.streak += 1;
            self.clear_streak = if clear { self.clear_streak + 1 } else { 0 };
        } else {
            self.streak = 1;
            self.streak_second = second_won;
            self.clear_streak = u32::from(clear);
        }
        if self.streak >= RUN_TRIGGER {
            // A second-codec run right after one, every win of both clear:
            // twice as long (up to MAX_RUN_LENGTH).
            let again = second_won && self.run_second && self.clear_streak >= RUN_TRIGGER;
            self.run_len = if again { (self.run_len * 2).min(MAX_RUN_LENGTH) } else { RUN_LENGTH };
            self.run_left = if second_won { self.run_len } else { RUN_LENGTH };
            // Re-checks that lost stay counted while second-codec runs
            // follow each other and the first codec wins no page: where the
            // second codec wins every page tried (CPython's heaps), most
            // pages of its runs are large and re-checking them only costs.
            if !(second_won && self.run_second && !self.first_won) {
                self.recheck_misses = 0;
            }
            self.first_won = false;
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

/// An inner codec: LZ4 is [`Lz4Page`] (liblz4's bytes, faster on pages;
/// with the `safe` feature liblz4 itself), the others as [`new_codec`]
/// makes them.
fn inner_codec(id: CodecId) -> Box<dyn Codec> {
    match id {
        CodecId::Lz4 if !cfg!(feature = "safe") => Box::new(Lz4Page::new()),
        _ => new_codec(id),
    }
}

/// Zero words in a page a WK codec of the WKdm layout (WKdm, WK4x4)
/// encoded, from its header alone: `n_words - n_index - n_full` (see
/// [`crate::wkdm`]'s format). `None` for any other output (WK64's).
fn zero_words(encoded: &[u8]) -> Option<usize> {
    let h = encoded.get(..crate::wkdm::HEADER)?;
    if (h[0] != crate::wkdm::VERSION && h[0] != crate::wk4x4::VERSION) || h[1] != 0 {
        return None;
    }
    let at = |i: usize| u16::from_le_bytes([h[i], h[i + 1]]) as usize;
    at(2).checked_sub(at(6))?.checked_sub(at(4))
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

    /// A page whose first `zeros` words are zero and the rest a repeated
    /// pattern of 8 words (WKdm: exact matches; LZ4: one long match).
    fn words_with_zeros(zeros: usize, seed: u64) -> Vec<u8> {
        let mut rng = synth::Rng::new(seed);
        let pattern: Vec<u32> = (0..8).map(|_| 0x1000_0000 | rng.below(1 << 28) as u32).collect();
        let mut p = vec![0u8; 4096];
        for (i, w) in p.chunks_exact_mut(4).enumerate().skip(zeros) {
            w.copy_from_slice(&pattern[i % 8].to_le_bytes());
        }
        p
    }

    #[test]
    fn zero_words_reads_the_wk_header() {
        let mut out = vec![0u8; 8192];
        for zeros in [0, 100, 256, 700, 1023] {
            let p = words_with_zeros(zeros, 1);
            let n = new_codec(CodecId::Wkdm).compress(&p, &mut out).unwrap();
            assert_eq!(zero_words(&out[..n]), Some(zeros));
            let n = new_codec(CodecId::Wk4x4).compress(&p, &mut out).unwrap();
            assert_eq!(zero_words(&out[..n]), Some(zeros));
        }
        let n = new_codec(CodecId::Wk64).compress(&words_with_zeros(10, 1), &mut out).unwrap();
        assert_eq!(zero_words(&out[..n]), None, "WK64's header is not WKdm's");
        assert_eq!(zero_words(&out[..5]), None);
        // Counts that do not add up (corrupt or foreign bytes) are no count.
        let mut bad = [0u8; 10];
        bad[0] = crate::wkdm::VERSION;
        bad[2] = 4; // 4 words, 5 full
        bad[4] = 5;
        assert_eq!(zero_words(&bad), None);
    }

    #[test]
    fn small_wk_output_of_a_page_of_many_zero_words_is_tried_with_lz4() {
        let mut out = vec![0u8; 8192];
        let mut lz_out = vec![0u8; 8192];
        // Few zero words: WKdm's small output is kept without LZ4.
        let mut h = Hybrid::default();
        let p = words_with_zeros(8, 2);
        let (n, tag) = h.compress_tagged(&p, &mut out).unwrap();
        assert!(n <= DEFAULT_THRESHOLD, "{n}");
        assert_eq!((tag, h.stats.first_fast, h.stats.zero_heavy), (CodecId::Wkdm, 1, 0));
        // Half the page zero: WKdm's output is still under the threshold,
        // but LZ4 is tried, and wins (the zeros are one run for it).
        let mut h = Hybrid::default();
        let p = words_with_zeros(512, 2);
        let wk = new_codec(CodecId::Wkdm).compress(&p, &mut out).unwrap();
        let lz = new_codec(CodecId::Lz4).compress(&p, &mut lz_out).unwrap();
        assert!(wk <= DEFAULT_THRESHOLD && lz < wk, "wkdm {wk}, lz4 {lz}");
        let (n, tag) = h.compress_tagged(&p, &mut out).unwrap();
        assert_eq!((n, tag), (lz, CodecId::Lz4));
        assert_eq!((h.stats.first_fast, h.stats.zero_heavy, h.stats.second_after_try), (0, 1, 1));
    }

    #[test]
    fn clear_second_codec_runs_double_up_to_the_maximum_and_a_first_codec_win_resets_them() {
        let mut h = Hybrid::default();
        let mut out = vec![0u8; h.max_compressed_len(4096)];
        let text = |i: u64| synth::page(synth::Kind::Text, i);
        // Text: LZ4 wins every page clearly. Feed pages until each run's
        // length is seen at its start.
        let mut lengths = Vec::new();
        for i in 0..2000 {
            let before = h.run_left;
            h.compress_tagged(&text(i), &mut out).unwrap();
            if before == 0 && h.run_left > 0 {
                assert!(h.run_second);
                lengths.push(h.run_left);
            }
        }
        assert_eq!(&lengths[..4], &[RUN_LENGTH, 2 * RUN_LENGTH, 4 * RUN_LENGTH, MAX_RUN_LENGTH]);
        assert!(lengths[4..].iter().all(|&l| l == MAX_RUN_LENGTH), "{lengths:?}");
        // During the run every page is LZ4's, byte for byte.
        let mut lz = new_codec(CodecId::Lz4);
        let mut lz_out = vec![0u8; 8192];
        let p = text(5000);
        let (n, tag) = h.compress_tagged(&p, &mut out).unwrap();
        let m = lz.compress(&p, &mut lz_out).unwrap();
        assert_eq!((tag, &out[..n]), (CodecId::Lz4, &lz_out[..m]));
        // Pages WKdm wins (small integers) end the LZ4 runs; the next LZ4
        // run starts short again. (Pages left in a run whose re-checks gave
        // up still go to LZ4.)
        let mut last = CodecId::Lz4;
        for i in 0..2 * MAX_RUN_LENGTH as u64 {
            last = h.compress_tagged(&synth::page(synth::Kind::SmallInts, i), &mut out).unwrap().1;
        }
        assert_eq!(last, CodecId::Wkdm);
        let mut first_after = None;
        for i in 0..200 {
            let before = h.run_left;
            h.compress_tagged(&text(i), &mut out).unwrap();
            if before == 0 && h.run_left > 0 && h.run_second {
                first_after = Some(h.run_left);
                break;
            }
        }
        assert_eq!(first_after, Some(RUN_LENGTH));
    }

    /// A page both codecs leave large, LZ4 a little smaller: random bytes
    /// up to `3328` then zeros (fewer than a quarter of the words).
    fn large_for_both(seed: u64) -> Vec<u8> {
        let mut rng = synth::Rng::new(seed);
        let mut p = vec![0u8; 4096];
        for b in &mut p[..3328] {
            *b = rng.below(256) as u8;
        }
        p
    }

    #[test]
    fn losing_rechecks_stay_counted_across_second_codec_runs_until_the_first_codec_wins() {
        let mut out = vec![0u8; 8192];
        let p = large_for_both(0);
        let wk = new_codec(CodecId::Wkdm).compress(&p, &mut out).unwrap();
        let lz = new_codec(CodecId::Lz4).compress(&p, &mut out).unwrap();
        assert!(lz > 4096 * RUN_RECHECK_NUM / RUN_RECHECK_DEN && wk > lz, "wkdm {wk}, lz4 {lz}");
        let mut h = Hybrid::default();
        // Whole LZ4 runs of such pages, one after another: every page of
        // a run is large, but only the first RECHECK_GIVE_UP of the chain
        // are re-checked with WKdm (all lose), not that many per run.
        let mut seed = 0;
        let mut buf = vec![0u8; 8192];
        let mut feed = |h: &mut Hybrid, pages: usize| {
            for _ in 0..pages {
                seed += 1;
                assert_eq!(h.compress_tagged(&large_for_both(seed), &mut buf).unwrap().1, CodecId::Lz4);
            }
        };
        feed(&mut h, RUN_TRIGGER as usize + 5 * MAX_RUN_LENGTH as usize);
        assert!(h.stats.second_after_try > RUN_TRIGGER as u64 + 2, "several runs: {:?}", h.stats);
        assert_eq!((h.stats.rechecks, h.stats.run_broken), (u64::from(RECHECK_GIVE_UP), 0), "{:?}", h.stats);
        // A page the first codec wins (tried after a run) gives the next
        // chain its re-checks again.
        while h.run_left > 0 {
            feed(&mut h, 1);
        }
        let ints = synth::page(synth::Kind::SmallInts, 1);
        assert_eq!(h.compress_tagged(&ints, &mut out).unwrap().1, CodecId::Wkdm);
        feed(&mut h, RUN_TRIGGER as usize + 2 * MAX_RUN_LENGTH as usize);
        assert_eq!(h.stats.rechecks, 2 * u64::from(RECHECK_GIVE_UP), "{:?}", h.stats);
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
