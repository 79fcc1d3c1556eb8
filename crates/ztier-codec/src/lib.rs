//! # ztier-codec — page codecs for compressed caching
//!
//! A *page codec* compresses one 4 KiB memory page (and, for the block
//! device, any buffer whose length is a multiple of 4 bytes, up to 64 KiB)
//! into a caller-provided buffer and decompresses into a caller-provided
//! buffer. Codec state (hash tables, zstd contexts, WK dictionaries) lives in
//! the codec value and is reused between calls, so the hot path allocates
//! nothing.
//!
//! Layers, bottom to top:
//!
//! * [`samefill`] — zero and same-filled pages (one repeated 8-byte pattern)
//!   are detected before any codec runs and are represented as metadata only.
//! * The codecs, one file each, all behind the [`Codec`] trait:
//!   [`wkdm`] (Wilson/Kaplan 1999), [`wk4x4`] (4 sets × 4 ways),
//!   [`wk64`] (a WK variant that models 64-bit words), [`lzo`] (LZO1X-1),
//!   [`lz4`] (LZ4 with acceleration), [`zstd`] (incl. negative levels),
//!   [`deflate`], [`hybrid`] (WKdm first, then a second codec for pages WKdm
//!   compresses poorly; its LZ4 is [`lz4page`]) and the trivial [`raw`] codec.
//! * [`page`] — the [`page::PageEncoder`]: same-fill detection, then the
//!   chosen codec, then the "raw" decision (pages that compress to more than a
//!   configurable fraction of their size are stored uncompressed).
//! * [`corpus`] — loading `.pages` files, sampling a live process's private
//!   writable pages, and synthetic word-structured pages for tests.
//! * [`mod@bench`] — the measurement behind `ztier bench codecs`.
//!
//! ## Which implementation, and why
//!
//! | codec   | implementation | why |
//! |---------|----------------|-----|
//! | wkdm, wk4x4, wk64 | hand-written here | they define the product; no maintained crate exists, and the decoder needs a branch-free loop to be fast |
//! | lzo     | C minilzo (LZO1X-1) built by the `minilzo-rs` crate, called directly with a reused work buffer | the pure-Rust `lzokay-native` compresses at ~25 MB/s here; C LZO1X-1 runs ~1.3 GB/s |
//! | lz4     | C liblz4 1.10 from `lz4-sys`, `LZ4_compress_fast_extState` with a reused state | it *is* the reference implementation, so the comparison peer and the codec are the same code |
//! | hybrid's LZ4 | [`lz4page`]: liblz4 1.10's block compressor ported for inputs of at most 4 KiB (liblz4 above that, and for decoding) | it writes liblz4's bytes exactly and, specialised for one page, runs a few per cent faster than `LZ4_compress_fast_extState`; on heaps where LZ4 wins nearly every page that is hybrid's only way to be faster than plain LZ4 |
//! | zstd    | C libzstd from the `zstd` crate's bulk API with a reused context | reference implementation; negative levels supported |
//! | deflate | C libdeflate from `libdeflater` with a reused compressor | buffer-to-buffer API, much faster than zlib; output is plain raw DEFLATE (RFC 1951) that zlib decodes |
//!
//! ## Contract shared by every codec
//!
//! * `compress(src, dst)`: `src.len()` is a non-zero multiple of 4 and at most
//!   [`MAX_INPUT`]. The output never exceeds `dst.len()`: if it would, the call
//!   returns [`CompressError::Overflow`] as soon as that is known (this is the
//!   *early abort* for incompressible data: pass a `dst` as large as the
//!   biggest output worth keeping).
//! * `decompress(src, dst)`: `dst.len()` is the original length. The call
//!   fills all of `dst` or returns a [`DecompressError`]; corrupt or truncated
//!   input never panics and never reads or writes out of bounds.
//! * Every codec has a stable `u8` tag ([`CodecId`]), recorded next to stored
//!   data so that old data is recognised.
//!
//! ## Cargo features
//!
//! Neither is on by default; the default build runs only code the CI
//! machines (x86-64 with AVX2, no AVX-512) execute.
//!
//! * `safe` — the WK codecs built from their safe twins alone (no `unsafe`
//!   in [`wkdm`], [`wk4x4`], [`wk64`]; the C-library codecs are unchanged).
//!   `make test` runs this crate's tests once more with it:
//!   `cargo test --release -p ztier-codec --features safe`.
//! * `avx512` — the WKdm AVX-512 kernel ([`wkdm::Kernel::Avx512`]; Rust
//!   1.89 or later). Test it on a CPU with AVX-512F and AVX-512CD:
//!   `cargo test --release -p ztier-codec --features avx512` (its tests
//!   fail there, rather than skip, when the CPU lacks them), and from
//!   `crates/ztier-codec`, `cargo fuzz run --features avx512 wkdm_kernels`.
//!   A build with it runs the kernel wherever the CPU has AVX-512; measure
//!   first (`cargo run --release -p ztier-codec --features avx512 --example
//!   wkdm_kernels -- FILE.pages...`): it was slower than the AVX2 kernel on
//!   an Intel Xeon.
//!
//! [`wkdm::KERNEL_ENV`] (`ZTIER_WKDM_KERNEL=safe|scalar|avx2|avx512`) picks
//! the WKdm kernel a process runs, for measurements and tests.

pub mod bench;
pub mod corpus;
pub mod deflate;
pub mod hybrid;
pub mod lz4;
pub mod lz4page;
pub mod lzo;
pub mod page;
pub mod raw;
pub mod samefill;
pub mod wk4x4;
pub mod wk64;
pub mod wkdm;
pub mod zstd;

mod id;
pub use id::{CodecId, UnknownCodec};

/// Size of a memory page, in bytes.
pub const PAGE_SIZE: usize = 4096;

/// Largest input any codec accepts (the block device's largest block).
pub const MAX_INPUT: usize = 64 * 1024;

/// Why a compression did not produce output.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompressError {
    /// The input length is not a non-zero multiple of 4 of at most 64 KiB.
    #[error("input of {len} bytes: codecs take a non-zero multiple of 4 bytes up to 65536")]
    InvalidLength {
        /// The rejected input length.
        len: usize,
    },
    /// The compressed form would not fit in the output buffer (the data is
    /// incompressible at the size the caller was willing to keep).
    #[error("compressed output does not fit in the {capacity}-byte buffer")]
    Overflow {
        /// Size of the output buffer the caller offered.
        capacity: usize,
    },
}

/// Why a decompression failed. The output buffer's contents are unspecified
/// after an error; the caller must not use them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecompressError {
    /// The compressed data ends before the format says it should.
    #[error("compressed data is truncated ({0})")]
    Truncated(&'static str),
    /// The compressed data is not valid for this codec.
    #[error("compressed data is corrupt ({0})")]
    Corrupt(&'static str),
    /// The data decodes to a different length than the caller expects.
    #[error("compressed data decodes to {actual} bytes, expected {expected}")]
    LengthMismatch {
        /// Length the caller asked for (the output buffer's length).
        expected: usize,
        /// Length the data describes.
        actual: usize,
    },
    /// The output length is not one a codec can have produced.
    #[error("output length {len} is not a non-zero multiple of 4 up to 65536")]
    InvalidLength {
        /// The rejected output length.
        len: usize,
    },
    /// The data was written by a different codec or format version.
    #[error("compressed data has tag/version {found:#04x}, this codec reads {expected:#04x}")]
    WrongFormat {
        /// The version/tag byte this decoder understands.
        expected: u8,
        /// The byte found in the data.
        found: u8,
    },
}

/// A page codec: compresses and decompresses buffers of 4-byte words.
///
/// Implementations keep their working state (dictionaries, hash tables,
/// contexts) inside `self` and reuse it between calls. See the crate docs for
/// the contract on buffer sizes and errors.
pub trait Codec: Send {
    /// The stable tag of this codec.
    fn id(&self) -> CodecId;

    /// Compresses `src` into `dst`, returning the number of bytes written.
    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, CompressError>;

    /// Decompresses `src` into all of `dst` (whose length is the original
    /// length).
    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), DecompressError>;

    /// An output-buffer size that is always enough for `len` input bytes.
    fn max_compressed_len(&self, len: usize) -> usize;

    /// Compresses `src` into `dst` for a caller that stores a codec tag
    /// beside the data (the page store's entry tag): returns the bytes
    /// written and the tag to store. Every codec but hybrid returns its
    /// [`Codec::compress`] output and its own id; hybrid returns the inner
    /// codec's output with no trailer byte and the inner codec's id.
    /// [`Codec::decompress_tagged`] with that tag decodes it.
    fn compress_tagged(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(usize, CodecId), CompressError> {
        let n = self.compress(src, dst)?;
        Ok((n, self.id()))
    }

    /// Decompresses data stored under `tag` (see [`Codec::compress_tagged`]).
    /// A tag this codec cannot decode is [`DecompressError::WrongFormat`].
    fn decompress_tagged(&mut self, tag: CodecId, src: &[u8], dst: &mut [u8]) -> Result<(), DecompressError> {
        if tag != self.id() {
            return Err(DecompressError::WrongFormat { expected: self.id() as u8, found: tag as u8 });
        }
        self.decompress(src, dst)
    }
}

/// Checks the input-length contract shared by every codec.
#[inline]
pub fn check_input_len(len: usize) -> Result<(), CompressError> {
    if len == 0 || len % 4 != 0 || len > MAX_INPUT {
        Err(CompressError::InvalidLength { len })
    } else {
        Ok(())
    }
}

/// Checks the output-length contract shared by every decoder.
#[inline]
pub fn check_output_len(len: usize) -> Result<(), DecompressError> {
    if len == 0 || len % 4 != 0 || len > MAX_INPUT {
        Err(DecompressError::InvalidLength { len })
    } else {
        Ok(())
    }
}

/// Creates a codec with its default settings.
pub fn new_codec(id: CodecId) -> Box<dyn Codec> {
    match id {
        CodecId::Raw => Box::new(raw::Raw),
        CodecId::Wkdm => Box::new(wkdm::Wkdm::new()),
        CodecId::Wk4x4 => Box::new(wk4x4::Wk4x4::new()),
        CodecId::Wk64 => Box::new(wk64::Wk64::new()),
        CodecId::Lzo => Box::new(lzo::Lzo::new()),
        CodecId::Lz4 => Box::new(lz4::Lz4::new(1)),
        CodecId::Zstd => Box::new(zstd::Zstd::new(1)),
        CodecId::Deflate => Box::new(deflate::Deflate::new(1)),
        CodecId::Hybrid => Box::new(hybrid::Hybrid::default()),
    }
}

/// Helpers shared by the codecs' unit tests.
#[cfg(test)]
pub(crate) mod testutil {
    use super::Codec;

    /// Compresses `src` with `c`, checks it decompresses back, and returns
    /// the compressed bytes.
    pub fn round_trip(c: &mut dyn Codec, src: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; c.max_compressed_len(src.len())];
        let n = c.compress(src, &mut out).unwrap();
        out.truncate(n);
        let mut back = vec![0u8; src.len()];
        c.decompress(&out, &mut back).unwrap();
        assert_eq!(back, src);
        out
    }

    /// Little-endian bytes of 32-bit words.
    pub fn words(w: &[u32]) -> Vec<u8> {
        w.iter().flat_map(|w| w.to_le_bytes()).collect()
    }
}
