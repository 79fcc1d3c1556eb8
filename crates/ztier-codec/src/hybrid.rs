//! hybrid: WKdm first, a second codec for the pages WKdm does poorly on.
//!
//! This is xnu's idea: WK codecs are fastest on pages of 32-bit words
//! (integers, pointers), byte-oriented LZ codecs win on strings and code.
//! Each page is compressed with WKdm; if the result is larger than
//! `threshold` bytes (xnu uses 2048 for 4 KiB pages, scaled here with the
//! input length), the secondary codec (LZ4 by default) is tried with an
//! output limit of the WKdm size, and the smaller output is kept. Both
//! attempts stop as soon as they exceed the caller's output limit (early
//! abort), so incompressible pages cost one short WKdm pass plus one LZ4 pass.
//!
//! Format — the inner codec's output followed by one trailer byte that names
//! it (the trailer keeps the inner payload at the buffer's start, so its
//! alignment is the caller's):
//!
//! ```text
//! +------------------------------+-----------+
//! | inner payload (n bytes)      | inner tag |  tag: CodecId as u8 (1 = wkdm, 5 = lz4, ...)
//! +------------------------------+-----------+
//! ```

use crate::{
    check_input_len, check_output_len, new_codec, wkdm::Wkdm, Codec, CodecId, CompressError, DecompressError,
};

/// Default threshold for a 4 KiB page, as in xnu.
pub const DEFAULT_THRESHOLD: usize = 2048;

/// WKdm with a fallback codec.
pub struct Hybrid {
    wk: Wkdm,
    second: Box<dyn Codec>,
    /// Threshold for a 4 KiB input; scaled linearly for other lengths.
    threshold: usize,
    /// Counters of which inner codec won (for diagnostics and benchmarks).
    pub stats: HybridStats,
}

/// How often each inner codec was kept.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HybridStats {
    /// Pages kept as WKdm without trying the second codec.
    pub wk_fast: u64,
    /// Pages where the second codec was tried but WKdm was still smaller.
    pub wk_after_try: u64,
    /// Pages kept as the second codec.
    pub second: u64,
}

impl std::fmt::Debug for Hybrid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hybrid")
            .field("second", &self.second.id())
            .field("threshold", &self.threshold)
            .finish()
    }
}

impl Hybrid {
    /// WKdm, then `second` for pages whose WKdm output exceeds `threshold`
    /// bytes (per 4 KiB of input).
    pub fn new(threshold: usize, second: CodecId) -> Self {
        assert!(
            !matches!(second, CodecId::Hybrid | CodecId::Wkdm),
            "the second codec of hybrid must differ from wkdm and hybrid"
        );
        Hybrid { wk: Wkdm::new(), second: new_codec(second), threshold, stats: HybridStats::default() }
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
        let room = capacity - 1; // keep one byte for the trailer
        let wk = match self.wk.compress(src, &mut dst[..room]) {
            Ok(n) if n <= self.threshold_for(src.len()) => {
                dst[n] = CodecId::Wkdm as u8;
                self.stats.wk_fast += 1;
                return Ok(n + 1);
            }
            Ok(n) => Some(n),
            Err(CompressError::Overflow { .. }) => None,
            Err(e) => return Err(e),
        };
        // WKdm did poorly: try the second codec, limited to beating WKdm.
        let limit = wk.map_or(room, |n| n.saturating_sub(1));
        let mut scratch = [0u8; crate::MAX_INPUT];
        let limit = limit.min(scratch.len());
        if limit > 0 {
            if let Ok(m) = self.second.compress(src, &mut scratch[..limit]) {
                dst[..m].copy_from_slice(&scratch[..m]);
                dst[m] = self.second.id() as u8;
                self.stats.second += 1;
                return Ok(m + 1);
            }
        }
        match wk {
            Some(n) => {
                dst[n] = CodecId::Wkdm as u8;
                self.stats.wk_after_try += 1;
                Ok(n + 1)
            }
            None => Err(CompressError::Overflow { capacity }),
        }
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), DecompressError> {
        check_output_len(dst.len())?;
        let (&tag, payload) = src.split_last().ok_or(DecompressError::Truncated("empty hybrid page"))?;
        if tag == CodecId::Wkdm as u8 {
            self.wk.decompress(payload, dst)
        } else if tag == self.second.id() as u8 {
            self.second.decompress(payload, dst)
        } else {
            Err(DecompressError::WrongFormat { expected: self.second.id() as u8, found: tag })
        }
    }

    fn max_compressed_len(&self, len: usize) -> usize {
        self.wk.max_compressed_len(len).max(self.second.max_compressed_len(len)) + 1
    }
}
