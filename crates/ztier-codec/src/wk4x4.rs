//! Wk4x4 — work in progress (being written; see the WK codec work).

use crate::{Codec, CodecId, CompressError, DecompressError};

/// Wk4x4 codec.
#[derive(Debug, Default)]
pub struct Wk4x4 {}

impl Wk4x4 {
    /// A new codec.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Codec for Wk4x4 {
    fn id(&self) -> CodecId {
        CodecId::Wk4x4
    }
    fn compress(&mut self, _src: &[u8], _dst: &mut [u8]) -> Result<usize, CompressError> {
        unimplemented!("Wk4x4 is being written")
    }
    fn decompress(&mut self, _src: &[u8], _dst: &mut [u8]) -> Result<(), DecompressError> {
        unimplemented!("Wk4x4 is being written")
    }
    fn max_compressed_len(&self, len: usize) -> usize {
        len + 64
    }
}
