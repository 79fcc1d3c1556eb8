//! Stable codec tags.

use std::fmt;
use std::str::FromStr;

/// The stable `u8` tag of each codec. These values are stored next to
/// compressed data (page store entries, block headers) and never change
/// meaning; new codecs get new values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum CodecId {
    /// Stored uncompressed.
    Raw = 0,
    /// WKdm (Wilson/Kaplan, 1999): 16-entry direct-mapped dictionary.
    Wkdm = 1,
    /// WK4x4: 4 sets × 4 ways, LRU within a set.
    Wk4x4 = 2,
    /// WK variant over 64-bit words.
    Wk64 = 3,
    /// LZO1X-1.
    Lzo = 4,
    /// LZ4 block format.
    Lz4 = 5,
    /// Zstandard frame.
    Zstd = 6,
    /// Raw DEFLATE (RFC 1951).
    Deflate = 7,
    /// WKdm, falling back to a second codec for poorly compressed pages.
    Hybrid = 8,
}

impl CodecId {
    /// Every codec, in the order reports list them.
    pub const ALL: [CodecId; 9] = [
        CodecId::Wkdm,
        CodecId::Wk4x4,
        CodecId::Wk64,
        CodecId::Lzo,
        CodecId::Lz4,
        CodecId::Zstd,
        CodecId::Deflate,
        CodecId::Hybrid,
        CodecId::Raw,
    ];

    /// The codecs measured by `ztier bench codecs` when none are named.
    pub const MEASURED: [CodecId; 8] = [
        CodecId::Wkdm,
        CodecId::Wk4x4,
        CodecId::Wk64,
        CodecId::Lzo,
        CodecId::Lz4,
        CodecId::Zstd,
        CodecId::Deflate,
        CodecId::Hybrid,
    ];

    /// The name used on command lines and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            CodecId::Raw => "raw",
            CodecId::Wkdm => "wkdm",
            CodecId::Wk4x4 => "wk4x4",
            CodecId::Wk64 => "wk64",
            CodecId::Lzo => "lzo",
            CodecId::Lz4 => "lz4",
            CodecId::Zstd => "zstd",
            CodecId::Deflate => "deflate",
            CodecId::Hybrid => "hybrid",
        }
    }
}

impl fmt::Display for CodecId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A codec tag or name that no codec has.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown codec {0} (known: raw, wkdm, wk4x4, wk64, lzo, lz4, zstd, deflate, hybrid)")]
pub struct UnknownCodec(pub String);

impl TryFrom<u8> for CodecId {
    type Error = UnknownCodec;
    fn try_from(v: u8) -> Result<Self, Self::Error> {
        CodecId::ALL.into_iter().find(|c| *c as u8 == v).ok_or_else(|| UnknownCodec(format!("tag {v}")))
    }
}

impl FromStr for CodecId {
    type Err = UnknownCodec;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CodecId::ALL
            .into_iter()
            .find(|c| c.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownCodec(format!("'{s}'")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_and_unknown_tags_are_errors() {
        for c in CodecId::ALL {
            assert_eq!(CodecId::try_from(c as u8).unwrap(), c);
            assert_eq!(c.name().parse::<CodecId>().unwrap(), c);
        }
        assert!(CodecId::try_from(200).is_err());
        assert!("nope".parse::<CodecId>().is_err());
    }
}
