//! DEFLATE through libdeflate (the `libdeflater` crate).
//!
//! Format: raw DEFLATE (RFC 1951) with no zlib or gzip wrapper; zlib's
//! `inflateInit2(-15)` and every other inflater read it. The compressor (at
//! levels 1–12; 1 is fastest) and decompressor are created once per codec
//! value. libdeflate is chosen over zlib because it works buffer-to-buffer,
//! which is exactly a page codec, and is several times faster.

use libdeflater::{CompressionLvl, Compressor, DecompressionError, Decompressor};

use crate::{check_input_len, check_output_len, Codec, CodecId, CompressError, DecompressError};

/// Raw DEFLATE with reused libdeflate state.
pub struct Deflate {
    level: i32,
    c: Compressor,
    d: Decompressor,
}

impl std::fmt::Debug for Deflate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deflate").field("level", &self.level).finish()
    }
}

impl Deflate {
    /// A codec at `level`, clamped to 1..=12.
    pub fn new(level: i32) -> Self {
        let level = level.clamp(1, 12);
        let lvl = CompressionLvl::new(level).expect("level in 1..=12");
        Deflate { level, c: Compressor::new(lvl), d: Decompressor::new() }
    }
}

impl Default for Deflate {
    fn default() -> Self {
        Self::new(1)
    }
}

impl Codec for Deflate {
    fn id(&self) -> CodecId {
        CodecId::Deflate
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, CompressError> {
        check_input_len(src.len())?;
        match self.c.deflate_compress(src, dst) {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(CompressError::Overflow { capacity: dst.len() }),
        }
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), DecompressError> {
        check_output_len(dst.len())?;
        match self.d.deflate_decompress(src, dst) {
            Ok(n) if n == dst.len() => Ok(()),
            Ok(n) => Err(DecompressError::LengthMismatch { expected: dst.len(), actual: n }),
            Err(DecompressionError::InsufficientSpace) => {
                Err(DecompressError::LengthMismatch { expected: dst.len(), actual: dst.len() + 1 })
            }
            Err(DecompressionError::BadData) => Err(DecompressError::Corrupt("invalid DEFLATE stream")),
        }
    }

    fn max_compressed_len(&self, len: usize) -> usize {
        // libdeflate's bound for one buffer: stored blocks of at most 65535
        // bytes, 5 bytes of header each, plus slack.
        len + 5 * (len / 10000 + 1) + 64
    }
}
