//! Wk64 — work in progress (being written; see the WK codec work).

use crate::{Codec, CodecId, CompressError, DecompressError};

/// Wk64 codec.
#[derive(Debug, Default)]
pub struct Wk64 {}

impl Wk64 {
    /// A new codec.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Codec for Wk64 {
    fn id(&self) -> CodecId {
        CodecId::Wk64
    }
    fn compress(&mut self, _src: &[u8], _dst: &mut [u8]) -> Result<usize, CompressError> {
        unimplemented!("Wk64 is being written")
    }
    fn decompress(&mut self, _src: &[u8], _dst: &mut [u8]) -> Result<(), DecompressError> {
        unimplemented!("Wk64 is being written")
    }
    fn max_compressed_len(&self, len: usize) -> usize {
        len + 64
    }
}
