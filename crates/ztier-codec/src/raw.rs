//! The trivial codec: stores the input as it is.
//!
//! Format: the input bytes, unchanged. Useful as the baseline in benchmarks
//! and as the form of pages that do not compress.

use crate::{check_input_len, check_output_len, Codec, CodecId, CompressError, DecompressError};

/// Copies input to output.
#[derive(Debug, Default, Clone, Copy)]
pub struct Raw;

impl Codec for Raw {
    fn id(&self) -> CodecId {
        CodecId::Raw
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, CompressError> {
        check_input_len(src.len())?;
        if dst.len() < src.len() {
            return Err(CompressError::Overflow { capacity: dst.len() });
        }
        dst[..src.len()].copy_from_slice(src);
        Ok(src.len())
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), DecompressError> {
        check_output_len(dst.len())?;
        if src.len() != dst.len() {
            return Err(DecompressError::LengthMismatch { expected: dst.len(), actual: src.len() });
        }
        dst.copy_from_slice(src);
        Ok(())
    }

    fn max_compressed_len(&self, len: usize) -> usize {
        len
    }
}
