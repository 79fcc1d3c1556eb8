//! The page encoder: same-fill detection, the codec, and the raw decision.
//!
//! Every frontend (page store, `ztier run`, the block device, the simulator's
//! compression traces) turns a page into an [`Encoded`] the same way:
//!
//! ```text
//!   page ──► samefill::detect ──► Zero / Same(pattern)      (metadata only, 0 bytes)
//!                 │ no
//!                 ▼
//!          codec.compress(page, dst[..limit])   limit = raw_fraction × page
//!                 │ Ok(n)                │ Overflow (early abort)
//!                 ▼                      ▼
//!          Compressed(codec, n)        Raw (page copied, page-size bytes)
//! ```
//!
//! `raw_fraction` (default 3/4) is the largest compressed size worth
//! keeping, as a fraction of the page: a page that compresses to more is
//! stored uncompressed, which costs the same memory but nothing to read back.

use crate::samefill::{self, Fill};
use crate::{new_codec, Codec, CodecId, CompressError, DecompressError};

/// How a page is represented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// All bytes zero; nothing stored.
    Zero,
    /// Every 8-byte word equals the pattern; nothing stored.
    Same(u64),
    /// Stored uncompressed (it did not compress below the raw threshold).
    Raw,
    /// Compressed by this codec.
    Compressed(CodecId),
}

impl Form {
    /// The codec tag recorded for this form (`Raw` for zero/same/raw).
    pub fn codec_tag(self) -> u8 {
        match self {
            Form::Compressed(c) => c as u8,
            _ => CodecId::Raw as u8,
        }
    }
}

/// The result of encoding one page: its form and how many bytes of the
/// output buffer hold it (0 for zero and same-filled pages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoded {
    /// How the page is represented.
    pub form: Form,
    /// Bytes written to the output buffer.
    pub len: usize,
}

/// Encodes and decodes pages with one codec, reusing its state.
pub struct PageEncoder {
    codec: Box<dyn Codec>,
    raw_num: usize,
    raw_den: usize,
    inner_tags: bool,
}

impl PageEncoder {
    /// An encoder using `codec` and the default raw threshold (3/4).
    pub fn new(codec: CodecId) -> Self {
        Self::with_codec(new_codec(codec))
    }

    /// An encoder around an already configured codec.
    pub fn with_codec(codec: Box<dyn Codec>) -> Self {
        PageEncoder { codec, raw_num: 3, raw_den: 4, inner_tags: false }
    }

    /// Sets the raw threshold: outputs larger than `num/den` of the input are
    /// stored raw. `num/den` must be in (0, 1].
    pub fn raw_fraction(mut self, num: usize, den: usize) -> Self {
        assert!(den > 0 && num > 0 && num <= den, "raw fraction must be in (0, 1]");
        self.raw_num = num;
        self.raw_den = den;
        self
    }

    /// Encodes for a caller that stores the form's codec tag beside each
    /// page: `Compressed(tag)` then names the codec that wrote the bytes
    /// ([`Codec::compress_tagged`]: for hybrid, the inner codec, with no
    /// trailer byte). Without it, `Compressed` names this encoder's codec
    /// and the bytes describe themselves. [`PageEncoder::decode`] reads
    /// both.
    pub fn inner_tags(mut self) -> Self {
        self.inner_tags = true;
        self
    }

    /// Whether [`PageEncoder::inner_tags`] is set.
    pub fn has_inner_tags(&self) -> bool {
        self.inner_tags
    }

    /// The codec this encoder uses.
    pub fn codec_id(&self) -> CodecId {
        self.codec.id()
    }

    /// The largest compressed size kept for an input of `len` bytes.
    pub fn limit(&self, len: usize) -> usize {
        len * self.raw_num / self.raw_den
    }

    /// Encodes `src` into `dst`. `dst` must be at least `src.len()` bytes (a
    /// raw page is copied there).
    pub fn encode(&mut self, src: &[u8], dst: &mut [u8]) -> Result<Encoded, CompressError> {
        crate::check_input_len(src.len())?;
        if dst.len() < src.len() {
            return Err(CompressError::Overflow { capacity: dst.len() });
        }
        match samefill::detect(src) {
            Some(Fill::Zero) => return Ok(Encoded { form: Form::Zero, len: 0 }),
            Some(Fill::Same(p)) => return Ok(Encoded { form: Form::Same(p), len: 0 }),
            None => {}
        }
        let limit = self.limit(src.len());
        let out = if self.inner_tags {
            self.codec.compress_tagged(src, &mut dst[..limit])
        } else {
            self.codec.compress(src, &mut dst[..limit]).map(|n| (n, self.codec.id()))
        };
        match out {
            Ok((n, tag)) => Ok(Encoded { form: Form::Compressed(tag), len: n }),
            Err(CompressError::Overflow { .. }) => {
                dst[..src.len()].copy_from_slice(src);
                Ok(Encoded { form: Form::Raw, len: src.len() })
            }
            Err(e) => Err(e),
        }
    }

    /// Decodes a page of form `form` from `src` into all of `dst`.
    ///
    /// A `Compressed` form naming a codec this encoder's codec cannot
    /// decode ([`Codec::decompress_tagged`]: its own, and for hybrid also
    /// its two inner codecs) is an error ([`DecompressError::WrongFormat`]).
    pub fn decode(&mut self, form: Form, src: &[u8], dst: &mut [u8]) -> Result<(), DecompressError> {
        crate::check_output_len(dst.len())?;
        match form {
            Form::Zero => {
                samefill::fill(dst, Fill::Zero);
                Ok(())
            }
            Form::Same(p) => {
                if dst.len() % 8 != 0 {
                    return Err(DecompressError::InvalidLength { len: dst.len() });
                }
                samefill::fill(dst, if p == 0 { Fill::Zero } else { Fill::Same(p) });
                Ok(())
            }
            Form::Raw => {
                if src.len() != dst.len() {
                    return Err(DecompressError::LengthMismatch { expected: dst.len(), actual: src.len() });
                }
                dst.copy_from_slice(src);
                Ok(())
            }
            Form::Compressed(c) => self.codec.decompress_tagged(c, src, dst),
        }
    }
}
