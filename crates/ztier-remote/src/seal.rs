//! A page as it is kept on the server: sealed with a keyed MAC (or
//! encrypted and authenticated), under a name that says nothing about it.
//!
//! ```text
//!  value (version 2)
//!  0             n     n+1   n+2   n+3     n+4              n+12       n+28
//! +-------------+-----+-----+-----+-------+----------------+----------+
//! | payload (n) | 'Z' | 'R' | ver | flags | seq (u64 LE)   | tag (16) |
//! +-------------+-----+-----+-----+-------+----------------+----------+
//!  ver = 2; flags bit 0: the payload is encrypted (AES-256-GCM, nonce =
//!  seq LE ‖ 4 zero bytes, AD as below ‖ trailer, tag = its GCM tag);
//!  otherwise the payload is the entry's bytes as the store held them and
//!  tag is the first 16 bytes of BLAKE3 keyed with the writer's MAC key
//!  over payload ‖ trailer (the 12 bytes after it) ‖ AD.
//!
//!  AD (authenticated, never sent) = "ztier-remote v2" ‖ writer id (16)
//!     ‖ pool (u32 LE) ‖ object (u64 LE) ‖ index (u32 LE)
//!     ‖ meta: tag (u8) flags (u8) len (u16 LE) crc (u32 LE) pattern (u64 LE)
//!  (with encryption, the trailer is part of the AD too)
//! ```
//!
//! The payload comes first so that the MAC's input starts at a BLAKE3
//! chunk boundary and all of a page's chunks are hashed side by side
//! (SIMD), and so that a value read back becomes the entry's bytes by
//! cutting its trailer off, without a copy (version 1 put a 12-byte
//! header first: 2.5 times the hashing time per page, and a copy).
//!
//! `seq` is a number the writer never uses twice; the writer keeps, for
//! each page it has out, the `seq` it wrote it with, and accepts only
//! that value back: a server cannot hand back another page, another
//! process's page or an older version of the same page (a replay), and a
//! changed byte anywhere is refused ([`SealError::Mac`]), never returned.
//!
//! Names: `zt:RUN:PROC:{TAG}:ID` — `RUN` (12 hex digits) is shared by the
//! processes of one `ztier run` (so the run can remove what a killed
//! process left), `PROC` (8) is random per process, `TAG` is the hash tag
//! choosing the slot (and so the server) of the page's batch, and `ID`
//! (24 hex digits) is BLAKE3 keyed with the writer's naming key over
//! (pool, object, index, seq): neither the page's address nor its pool
//! nor which names are versions of one page can be read from the names.
//!
//! The keys are drawn at random for each process when its tier is made,
//! never leave the machine, and are drawn again for a forked child's
//! writes (a child inherits its parent's pages, so it can still read
//! what the parent wrote before the fork).

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use ztier_store::tier::SpillMeta;
use ztier_store::Key;

/// Bytes of the trailer after the payload (magic, version, flags, seq).
pub const TRAILER: usize = 12;
/// Bytes of the tag after the trailer.
pub const TAG: usize = 16;
/// Bytes a sealed value has beyond its payload.
pub const OVERHEAD: usize = TRAILER + TAG;
/// The format's version.
pub const VERSION: u8 = 2;
const F_ENCRYPTED: u8 = 1;
const AD_LABEL: &[u8] = b"ztier-remote v2";
/// Bytes of the authenticated data (without the trailer).
const AD: usize = 63;

/// Why a value read back was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// Not a value in this format (too short, wrong magic).
    #[error("not a ztier page (bad trailer or {0} bytes)")]
    Format(usize),
    /// A version this build does not read.
    #[error("page format version {0}, this build reads version 2")]
    Version(u8),
    /// Encrypted where plain was written, or the other way round.
    #[error("page encryption flag does not match the writer's")]
    Flags,
    /// Another sequence number than the one written (a replay of an
    /// older value or another page's).
    #[error("page sequence number {found}, expected {expected} (a replayed or swapped value)")]
    Seq {
        /// What the value says.
        found: u64,
        /// What the writer wrote.
        expected: u64,
    },
    /// The payload's length is not the entry's.
    #[error("page length {found}, expected {expected}")]
    Length {
        /// What the value holds.
        found: usize,
        /// What was written.
        expected: usize,
    },
    /// The MAC (or the AEAD tag) does not match: the value was changed.
    #[error("page MAC mismatch: the value was changed on the server")]
    Mac,
}

/// One writer's identity and keys.
pub struct Writer {
    /// Random id, part of every page's authenticated data.
    pub id: [u8; 16],
    mac_key: [u8; 32],
    name_key: [u8; 32],
    cipher: Option<LessSafeKey>,
}

impl Writer {
    /// A writer with fresh random keys; `encrypt` also encrypts payloads.
    pub fn random(encrypt: bool) -> std::io::Result<Self> {
        let mut seed = [0u8; 48];
        getrandom::getrandom(&mut seed).map_err(std::io::Error::other)?;
        let mut id = [0u8; 16];
        id.copy_from_slice(&seed[32..]);
        let master: [u8; 32] = seed[..32].try_into().expect("32 bytes");
        let w = Writer {
            id,
            mac_key: blake3::derive_key("ztier-remote 2026 page mac", &master),
            name_key: blake3::derive_key("ztier-remote 2026 key names", &master),
            cipher: encrypt.then(|| {
                let k = blake3::derive_key("ztier-remote 2026 page encryption", &master);
                LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &k).expect("a 256-bit key"))
            }),
        };
        Ok(w)
    }

    /// Whether payloads are encrypted.
    pub fn encrypts(&self) -> bool {
        self.cipher.is_some()
    }

    /// The opaque id (24 hex digits) of `key`'s value written with `seq`.
    pub fn name_id(&self, key: Key, seq: u64) -> [u8; 24] {
        let mut b = [0u8; 24];
        b[..4].copy_from_slice(&key.pool.to_le_bytes());
        b[4..12].copy_from_slice(&key.object.to_le_bytes());
        b[12..16].copy_from_slice(&key.index.to_le_bytes());
        b[16..].copy_from_slice(&seq.to_le_bytes());
        let h = blake3::keyed_hash(&self.name_key, &b);
        hex(&h.as_bytes()[..12])
    }

    fn ad(&self, key: Key, meta: &SpillMeta) -> [u8; AD + TRAILER] {
        let mut ad = [0u8; AD + TRAILER];
        let mut at = 0;
        for part in [
            AD_LABEL,
            &self.id[..],
            &key.pool.to_le_bytes(),
            &key.object.to_le_bytes(),
            &key.index.to_le_bytes(),
            &[meta.tag, meta.flags],
            &meta.len.to_le_bytes(),
            &meta.crc.to_le_bytes(),
            &meta.pattern.to_le_bytes(),
        ] {
            ad[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        debug_assert_eq!(at, AD);
        ad
    }

    /// The MAC of `body` (payload ‖ trailer) and `ad`: one pass, the
    /// payload at a chunk boundary.
    fn mac(&self, body: &[u8], ad: &[u8]) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(&self.mac_key);
        h.update(body);
        h.update(ad);
        h.finalize()
    }

    /// The value that keeps `data` (the entry of `key` with `meta`)
    /// written with `seq`, appended to `out`.
    pub fn seal(&self, key: Key, meta: &SpillMeta, seq: u64, data: &[u8], out: &mut Vec<u8>) {
        let flags = if self.cipher.is_some() { F_ENCRYPTED } else { 0 };
        let mut trailer = [0u8; TRAILER];
        trailer[..4].copy_from_slice(&[b'Z', b'R', VERSION, flags]);
        trailer[4..].copy_from_slice(&seq.to_le_bytes());
        let mut ad = self.ad(key, meta);
        let start = out.len();
        out.reserve(data.len() + OVERHEAD);
        out.extend_from_slice(data);
        out.extend_from_slice(&trailer);
        let tag: [u8; TAG] = match &self.cipher {
            Some(c) => {
                ad[AD..].copy_from_slice(&trailer);
                let end = start + data.len();
                let tag = c
                    .seal_in_place_separate_tag(nonce(seq), Aad::from(&ad[..]), &mut out[start..end])
                    .expect("a page is far below AES-GCM's length limit");
                tag.as_ref().try_into().expect("16 bytes")
            }
            None => self.mac(&out[start..], &ad[..AD]).as_bytes()[..TAG].try_into().expect("16 bytes"),
        };
        out.extend_from_slice(&tag);
    }

    /// Checks `value` (read back for `key`, written with `meta` and
    /// `seq`) and puts the entry's bytes in `out` (emptied on failure).
    pub fn open(
        &self,
        key: Key,
        meta: &SpillMeta,
        seq: u64,
        value: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), SealError> {
        out.clear();
        out.extend_from_slice(value);
        self.open_in_place(key, meta, seq, out)
    }

    /// As [`Writer::open`], in place: `value` becomes the entry's bytes
    /// (its trailer cut off, decrypted), or is emptied on failure.
    pub fn open_in_place(
        &self,
        key: Key,
        meta: &SpillMeta,
        seq: u64,
        value: &mut Vec<u8>,
    ) -> Result<(), SealError> {
        let r = self.check(key, meta, seq, value);
        if r.is_err() {
            value.clear();
        }
        r
    }

    fn check(&self, key: Key, meta: &SpillMeta, seq: u64, value: &mut Vec<u8>) -> Result<(), SealError> {
        let len = value.len();
        if len < OVERHEAD {
            return Err(SealError::Format(len));
        }
        let n = len - OVERHEAD;
        let trailer: [u8; TRAILER] = value[n..n + TRAILER].try_into().expect("12 bytes");
        if trailer[..2] != *b"ZR" {
            return Err(SealError::Format(len));
        }
        if trailer[2] != VERSION {
            return Err(SealError::Version(trailer[2]));
        }
        if (trailer[3] & F_ENCRYPTED != 0) != self.cipher.is_some() || trailer[3] & !F_ENCRYPTED != 0 {
            return Err(SealError::Flags);
        }
        let found = u64::from_le_bytes(trailer[4..].try_into().expect("8 bytes"));
        if found != seq {
            return Err(SealError::Seq { found, expected: seq });
        }
        if n != meta.len as usize {
            return Err(SealError::Length { found: n, expected: meta.len as usize });
        }
        let tag: [u8; TAG] = value[n + TRAILER..].try_into().expect("16 bytes");
        let mut ad = self.ad(key, meta);
        match &self.cipher {
            Some(c) => {
                ad[AD..].copy_from_slice(&trailer);
                // ring's `open_in_place` takes the tag after the bytes:
                // the trailer moves out of its way (the cipher text is
                // `value[..n]`, the tag follows it then).
                value.copy_within(n + TRAILER.., n);
                value.truncate(n + TAG);
                c.open_in_place(nonce(seq), Aad::from(&ad[..]), &mut value[..])
                    .map_err(|_| SealError::Mac)?;
            }
            None => {
                // Compared in constant time (blake3's Hash equality).
                let want = self.mac(&value[..n + TRAILER], &ad[..AD]);
                let mut got = [0u8; 32];
                got[..TAG].copy_from_slice(&tag);
                got[TAG..].copy_from_slice(&want.as_bytes()[TAG..]);
                if blake3::Hash::from(got) != want {
                    return Err(SealError::Mac);
                }
            }
        }
        value.truncate(n);
        Ok(())
    }
}

/// A writer's nonce for `seq`: a writer never uses a `seq` twice.
fn nonce(seq: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[..8].copy_from_slice(&seq.to_le_bytes());
    Nonce::assume_unique_for_key(n)
}

/// Lower-case hex of `N/2` bytes.
pub(crate) fn hex<const N: usize>(b: &[u8]) -> [u8; N] {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; N];
    for (i, x) in b.iter().take(N / 2).enumerate() {
        out[2 * i] = D[(x >> 4) as usize];
        out[2 * i + 1] = D[(x & 15) as usize];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(len: u16) -> SpillMeta {
        SpillMeta { tag: 3, flags: 1, len, crc: 0xdead_beef, pattern: 0 }
    }

    #[test]
    fn a_sealed_page_opens_only_as_written() {
        for encrypt in [false, true] {
            let w = Writer::random(encrypt).unwrap();
            let key = Key { pool: 1, object: 7, index: 9 };
            let data: Vec<u8> = (0..1500u32).map(|i| (i * 7) as u8).collect();
            let mut v = Vec::new();
            w.seal(key, &meta(1500), 42, &data, &mut v);
            assert_eq!(v.len(), 1500 + OVERHEAD);
            assert_eq!(encrypt, v[..1500] != data[..]);
            let mut out = Vec::new();
            w.open(key, &meta(1500), 42, &v, &mut out).unwrap();
            assert_eq!(out, data);
            // Any flipped bit anywhere: refused.
            for at in [0, 700, 1499, 1500, 1502, 1503, 1505, v.len() - 1] {
                let mut bad = v.clone();
                bad[at] ^= 0x10;
                assert!(w.open(key, &meta(1500), 42, &bad, &mut out).is_err(), "{encrypt} {at}");
                assert!(out.is_empty());
            }
            // Another page, an older version, other metadata, another writer.
            assert_eq!(w.open(Key { index: 10, ..key }, &meta(1500), 42, &v, &mut out), Err(SealError::Mac));
            assert_eq!(
                w.open(key, &meta(1500), 41, &v, &mut out),
                Err(SealError::Seq { found: 42, expected: 41 })
            );
            let mut m = meta(1500);
            m.crc ^= 1;
            assert_eq!(w.open(key, &m, 42, &v, &mut out), Err(SealError::Mac));
            let other = Writer::random(encrypt).unwrap();
            assert_eq!(other.open(key, &meta(1500), 42, &v, &mut out), Err(SealError::Mac));
            assert_eq!(w.open(key, &meta(1500), 42, &v[..20], &mut out), Err(SealError::Format(20)));
            assert!(w.open(key, &meta(1499), 42, &v, &mut out).is_err());
            // Names: one per (page, version), none alike.
            assert_ne!(w.name_id(key, 1), w.name_id(key, 2));
            assert_ne!(w.name_id(key, 1), other.name_id(key, 1));
        }
        let (a, b) = (Writer::random(false).unwrap(), Writer::random(true).unwrap());
        let mut v = Vec::new();
        a.seal(Key { pool: 0, object: 0, index: 0 }, &meta(0), 1, &[], &mut v);
        assert_eq!(
            b.open(Key { pool: 0, object: 0, index: 0 }, &meta(0), 1, &v, &mut Vec::new()),
            Err(SealError::Flags)
        );
    }
}
