//! Zstandard through the reference C library (the `zstd` crate's bulk API).
//!
//! Format: one zstd frame (RFC 8878) without checksum; any zstd decoder reads
//! it. A compression and a decompression context are created once per codec
//! value and reused. Levels run from the negative "fast" levels (−1, −5, …:
//! faster, lower ratio) to 22; page caching wants −1..3.

use crate::{check_input_len, check_output_len, Codec, CodecId, CompressError, DecompressError};

/// zstd with reused contexts.
pub struct Zstd {
    level: i32,
    cctx: zstd::bulk::Compressor<'static>,
    dctx: zstd::bulk::Decompressor<'static>,
}

impl std::fmt::Debug for Zstd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Zstd").field("level", &self.level).finish()
    }
}

impl Zstd {
    /// A codec at `level` (negative levels allowed).
    pub fn new(level: i32) -> Self {
        let mut cctx = zstd::bulk::Compressor::new(level).expect("zstd context");
        // Pages are small and their length is known: no checksum, no
        // content size, no dictionary id in the frame header.
        let _ = cctx.include_checksum(false);
        let _ = cctx.include_contentsize(false);
        let _ = cctx.include_dictid(false);
        let dctx = zstd::bulk::Decompressor::new().expect("zstd context");
        Zstd { level, cctx, dctx }
    }

    /// The configured level.
    pub fn level(&self) -> i32 {
        self.level
    }
}

impl Default for Zstd {
    fn default() -> Self {
        Self::new(1)
    }
}

impl Codec for Zstd {
    fn id(&self) -> CodecId {
        CodecId::Zstd
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, CompressError> {
        check_input_len(src.len())?;
        self.cctx.compress_to_buffer(src, dst).map_err(|_| CompressError::Overflow { capacity: dst.len() })
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), DecompressError> {
        check_output_len(dst.len())?;
        match self.dctx.decompress_to_buffer(src, dst) {
            Ok(n) if n == dst.len() => Ok(()),
            Ok(n) => Err(DecompressError::LengthMismatch { expected: dst.len(), actual: n }),
            Err(_) => Err(DecompressError::Corrupt("invalid zstd frame")),
        }
    }

    fn max_compressed_len(&self, len: usize) -> usize {
        zstd::zstd_safe::compress_bound(len)
    }
}
