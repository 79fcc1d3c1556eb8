//! LZO1X-1 through the C minilzo library (built by the `minilzo-rs` crate).
//!
//! Format: a plain LZO1X stream as written by `lzo1x_1_compress`; any LZO1X
//! decompressor reads it. We call the C entry points directly (the crate's
//! safe API allocates a `Vec` per call) with a work buffer allocated once per
//! codec value. Decompression uses `lzo1x_decompress_safe`, which checks
//! every read and write against the buffer bounds.
//!
//! Why C: the pure-Rust `lzokay-native` compresses at ~25 MB/s on this kind
//! of machine; C LZO1X-1 runs at ~1.3 GB/s.

use std::os::raw::{c_int, c_uchar, c_ulong, c_void};

use crate::{check_input_len, check_output_len, Codec, CodecId, CompressError, DecompressError};

// Keep the crate (and so the static minilzo library it builds) linked.
use minilzo_rs as _;

/// `LZO1X_1_MEM_COMPRESS` for 64-bit targets: 16384 dictionary entries of 8 bytes.
const WORK_BYTES: usize = 16384 * 8;

extern "C" {
    fn lzo1x_1_compress(
        src: *const c_uchar,
        src_len: c_ulong,
        dst: *mut c_uchar,
        dst_len: *mut c_ulong,
        wrkmem: *mut c_void,
    ) -> c_int;
    fn lzo1x_decompress_safe(
        src: *const c_uchar,
        src_len: c_ulong,
        dst: *mut c_uchar,
        dst_len: *mut c_ulong,
        wrkmem: *mut c_void,
    ) -> c_int;
}

/// LZO error codes we distinguish (lzoconf.h).
const LZO_E_OK: c_int = 0;
const LZO_E_INPUT_OVERRUN: c_int = -4;
const LZO_E_OUTPUT_OVERRUN: c_int = -5;
const LZO_E_INPUT_NOT_CONSUMED: c_int = -8;

/// LZO1X-1 with a reused work buffer.
pub struct Lzo {
    work: Vec<u64>,
    scratch: Vec<u8>,
}

impl std::fmt::Debug for Lzo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Lzo")
    }
}

impl Lzo {
    /// A new codec.
    pub fn new() -> Self {
        // minilzo must be initialised once per process; the crate's init does it.
        let _ = minilzo_rs::LZO::init();
        Lzo { work: vec![0u64; WORK_BYTES / 8], scratch: Vec::new() }
    }
}

impl Default for Lzo {
    fn default() -> Self {
        Self::new()
    }
}

/// Worst-case LZO1X output size for `len` input bytes (from minilzo's docs).
fn bound(len: usize) -> usize {
    len + len / 16 + 64 + 3
}

impl Codec for Lzo {
    fn id(&self) -> CodecId {
        CodecId::Lzo
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, CompressError> {
        check_input_len(src.len())?;
        // lzo1x_1_compress does not take an output bound: it may write up to
        // bound(len) bytes. Compress straight into dst when it is that large,
        // otherwise into a scratch buffer and copy if the result fits.
        let need = bound(src.len());
        let direct = dst.len() >= need;
        if !direct && self.scratch.len() < need {
            self.scratch.resize(need, 0);
        }
        let out: &mut [u8] = if direct { dst } else { &mut self.scratch[..need] };
        let mut out_len: c_ulong = 0;
        // SAFETY: `out` has at least bound(src.len()) bytes, the most LZO1X-1
        // can write; `work` is LZO1X_1_MEM_COMPRESS bytes, 8-byte aligned.
        let rc = unsafe {
            lzo1x_1_compress(
                src.as_ptr(),
                src.len() as c_ulong,
                out.as_mut_ptr(),
                &mut out_len,
                self.work.as_mut_ptr().cast(),
            )
        };
        assert_eq!(rc, LZO_E_OK, "lzo1x_1_compress cannot fail on valid buffers");
        let n = out_len as usize;
        if direct {
            return Ok(n);
        }
        if n > dst.len() {
            return Err(CompressError::Overflow { capacity: dst.len() });
        }
        dst[..n].copy_from_slice(&self.scratch[..n]);
        Ok(n)
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), DecompressError> {
        check_output_len(dst.len())?;
        let mut out_len = dst.len() as c_ulong;
        // SAFETY: lzo1x_decompress_safe checks every input read against
        // src.len() and every output write against out_len = dst.len().
        let rc = unsafe {
            lzo1x_decompress_safe(
                src.as_ptr(),
                src.len() as c_ulong,
                dst.as_mut_ptr(),
                &mut out_len,
                std::ptr::null_mut(),
            )
        };
        match rc {
            LZO_E_OK if out_len as usize == dst.len() => Ok(()),
            LZO_E_OK => {
                Err(DecompressError::LengthMismatch { expected: dst.len(), actual: out_len as usize })
            }
            LZO_E_INPUT_OVERRUN => Err(DecompressError::Truncated("LZO1X stream ends early")),
            LZO_E_OUTPUT_OVERRUN => {
                Err(DecompressError::LengthMismatch { expected: dst.len(), actual: dst.len() + 1 })
            }
            LZO_E_INPUT_NOT_CONSUMED => Err(DecompressError::Corrupt("trailing bytes after LZO1X stream")),
            _ => Err(DecompressError::Corrupt("invalid LZO1X stream")),
        }
    }

    fn max_compressed_len(&self, len: usize) -> usize {
        bound(len)
    }
}
