//! LZ4 block format through the reference C library (liblz4, from `lz4-sys`).
//!
//! Format: a plain LZ4 *block* (no frame, no length prefix) — the original
//! length is known to the caller. Any LZ4 block decoder reads it.
//!
//! Compression uses `LZ4_compress_fast_extState` with a state allocated once
//! per codec value, so no call allocates or re-initialises a hash table from
//! scratch. `acceleration` trades ratio for speed (1 = default; larger is
//! faster). Decompression is `LZ4_decompress_safe`, which never reads or
//! writes outside the buffers it is given, whatever the input.

use std::os::raw::{c_char, c_int, c_void};

use crate::{check_input_len, check_output_len, Codec, CodecId, CompressError, DecompressError};

// lz4-sys links liblz4 but does not declare the ext-state entry points.
extern "C" {
    fn LZ4_sizeofState() -> c_int;
    fn LZ4_compress_fast_extState(
        state: *mut c_void,
        src: *const c_char,
        dst: *mut c_char,
        src_size: c_int,
        dst_capacity: c_int,
        acceleration: c_int,
    ) -> c_int;
}

/// LZ4 with a reused compression state.
pub struct Lz4 {
    state: Vec<u64>,
    acceleration: i32,
}

impl std::fmt::Debug for Lz4 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lz4").field("acceleration", &self.acceleration).finish()
    }
}

impl Lz4 {
    /// A codec with the given acceleration (1 = LZ4's default; values below
    /// 1 are treated as 1).
    pub fn new(acceleration: i32) -> Self {
        // SAFETY: LZ4_sizeofState only returns a constant.
        let size = unsafe { LZ4_sizeofState() } as usize;
        // u64 elements keep the state 8-byte aligned, as liblz4 requires.
        Lz4 { state: vec![0u64; size.div_ceil(8)], acceleration: acceleration.max(1) }
    }

    /// The configured acceleration.
    pub fn acceleration(&self) -> i32 {
        self.acceleration
    }
}

impl Default for Lz4 {
    fn default() -> Self {
        Self::new(1)
    }
}

impl Codec for Lz4 {
    fn id(&self) -> CodecId {
        CodecId::Lz4
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, CompressError> {
        check_input_len(src.len())?;
        let cap = dst.len().min(i32::MAX as usize) as c_int;
        // SAFETY: `state` is LZ4_sizeofState() bytes, 8-byte aligned and owned
        // by self; src/dst are valid for src.len()/cap bytes, and liblz4
        // writes at most `cap` bytes to dst (it returns 0 instead).
        let n = unsafe {
            LZ4_compress_fast_extState(
                self.state.as_mut_ptr().cast(),
                src.as_ptr().cast(),
                dst.as_mut_ptr().cast(),
                src.len() as c_int,
                cap,
                self.acceleration,
            )
        };
        if n <= 0 {
            Err(CompressError::Overflow { capacity: dst.len() })
        } else {
            Ok(n as usize)
        }
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), DecompressError> {
        check_output_len(dst.len())?;
        if src.is_empty() {
            return Err(DecompressError::Truncated("empty LZ4 block"));
        }
        let src_len = src.len().min(i32::MAX as usize) as c_int;
        // SAFETY: LZ4_decompress_safe reads at most src_len bytes from src and
        // writes at most dst.len() bytes to dst, for any input.
        let n = unsafe {
            lz4_sys::LZ4_decompress_safe(
                src.as_ptr().cast(),
                dst.as_mut_ptr().cast(),
                src_len,
                dst.len() as c_int,
            )
        };
        if n < 0 {
            Err(DecompressError::Corrupt("invalid LZ4 block"))
        } else if n as usize != dst.len() {
            Err(DecompressError::LengthMismatch { expected: dst.len(), actual: n as usize })
        } else {
            Ok(())
        }
    }

    fn max_compressed_len(&self, len: usize) -> usize {
        len + len / 255 + 16
    }
}
