//! Wkdm — work in progress (being written; see the WK codec work).

use crate::{Codec, CodecId, CompressError, DecompressError};

/// Wkdm codec.
#[derive(Debug, Default)]
pub struct Wkdm {}

impl Wkdm {
    /// A new codec.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Codec for Wkdm {
    fn id(&self) -> CodecId {
        CodecId::Wkdm
    }
    fn compress(&mut self, _src: &[u8], _dst: &mut [u8]) -> Result<usize, CompressError> {
        unimplemented!("Wkdm is being written")
    }
    fn decompress(&mut self, _src: &[u8], _dst: &mut [u8]) -> Result<(), DecompressError> {
        unimplemented!("Wkdm is being written")
    }
    fn max_compressed_len(&self, len: usize) -> usize {
        len + 64
    }
}
