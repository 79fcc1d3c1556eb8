//! A page as it is kept on the server: sealed with a keyed MAC (or
//! encrypted and authenticated), under a name that says nothing about it.
//!
//! ```text
//!  value (version 1)
//!  0     1     2     3       4                 12              12+n      12+n+16
//! +-----+-----+-----+-------+-----------------+---------------+---------+
//! | 'Z' | 'R' | ver | flags | seq (u64 LE)    | payload (n)   | tag (16)|
//! +-----+-----+-----+-------+-----------------+---------------+---------+
//!  ver = 1; flags bit 0: the payload is encrypted (ChaCha20-Poly1305,
//!  nonce = seq LE ‖ 4 zero bytes, tag = its Poly1305 tag); otherwise the
//!  payload is the entry's bytes as the store held them and tag is the
//!  first 16 bytes of BLAKE3 keyed with the writer's MAC key over
//!  AD ‖ payload.
//!
//!  AD (authenticated, never sent) = "ztier-remote v1" ‖ writer id (16)
//!     ‖ pool (u32 LE) ‖ object (u64 LE) ‖ index (u32 LE)
//!     ‖ meta: tag (u8) flags (u8) len (u16 LE) crc (u32 LE) pattern (u64 LE)
//!     ‖ the value's first 12 bytes
//! ```
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
//! The keys are drawn at random by each process when its tier is made,
//! never leave it, and are drawn again in a forked child for what it
//! writes (a child inherits its parent's memory, so it can still read
//! what the parent wrote before the fork).

use chacha20poly1305::aead::AeadInPlace;
use chacha20poly1305::{ChaCha20Poly1305, KeyInit};
use ztier_store::tier::SpillMeta;
use ztier_store::Key;

/// Bytes before the payload.
pub const HEADER: usize = 12;
/// Bytes after the payload.
pub const TAG: usize = 16;
/// The format's version.
pub const VERSION: u8 = 1;
const F_ENCRYPTED: u8 = 1;
const AD_LABEL: &[u8] = b"ztier-remote v1";

/// Why a value read back was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// Not a value in this format (too short, wrong magic).
    #[error("not a ztier page (bad header or {0} bytes)")]
    Format(usize),
    /// A version this build does not read.
    #[error("page format version {0}, this build reads version 1")]
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
    cipher: Option<ChaCha20Poly1305>,
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
                ChaCha20Poly1305::new((&k).into())
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
        let mut h = blake3::Hasher::new_keyed(&self.name_key);
        h.update(&key.pool.to_le_bytes());
        h.update(&key.object.to_le_bytes());
        h.update(&key.index.to_le_bytes());
        h.update(&seq.to_le_bytes());
        hex(&h.finalize().as_bytes()[..12])
    }

    fn ad(&self, key: Key, meta: &SpillMeta, header: &[u8; HEADER]) -> [u8; 75] {
        let mut ad = [0u8; 75];
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
            &header[..],
        ] {
            ad[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        debug_assert_eq!(at, ad.len());
        ad
    }

    fn mac(&self, ad: &[u8], payload: &[u8]) -> [u8; TAG] {
        let mut h = blake3::Hasher::new_keyed(&self.mac_key);
        h.update(ad);
        h.update(payload);
        h.finalize().as_bytes()[..TAG].try_into().expect("16 bytes")
    }

    /// The value that keeps `data` (the entry of `key` with `meta`)
    /// written with `seq`, appended to `out`.
    pub fn seal(&self, key: Key, meta: &SpillMeta, seq: u64, data: &[u8], out: &mut Vec<u8>) {
        let flags = if self.cipher.is_some() { F_ENCRYPTED } else { 0 };
        let mut header = [0u8; HEADER];
        header[..4].copy_from_slice(&[b'Z', b'R', VERSION, flags]);
        header[4..].copy_from_slice(&seq.to_le_bytes());
        let ad = self.ad(key, meta, &header);
        let start = out.len();
        out.extend_from_slice(&header);
        out.extend_from_slice(data);
        let tag: [u8; TAG] = match &self.cipher {
            Some(c) => c
                .encrypt_in_place_detached(&nonce(seq), &ad, &mut out[start + HEADER..])
                .expect("a page is far below ChaCha20's length limit")
                .into(),
            None => self.mac(&ad, data),
        };
        out.extend_from_slice(&tag);
    }

    /// Checks `value` (read back for `key`, written with `meta` and
    /// `seq`) and puts the entry's bytes in `out`.
    pub fn open(
        &self,
        key: Key,
        meta: &SpillMeta,
        seq: u64,
        value: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), SealError> {
        out.clear();
        if value.len() < HEADER + TAG || value[..2] != *b"ZR" {
            return Err(SealError::Format(value.len()));
        }
        if value[2] != VERSION {
            return Err(SealError::Version(value[2]));
        }
        if (value[3] & F_ENCRYPTED != 0) != self.cipher.is_some() || value[3] & !F_ENCRYPTED != 0 {
            return Err(SealError::Flags);
        }
        let header: [u8; HEADER] = value[..HEADER].try_into().expect("12 bytes");
        let found = u64::from_le_bytes(header[4..].try_into().expect("8 bytes"));
        if found != seq {
            return Err(SealError::Seq { found, expected: seq });
        }
        let payload = &value[HEADER..value.len() - TAG];
        if payload.len() != meta.len as usize {
            return Err(SealError::Length { found: payload.len(), expected: meta.len as usize });
        }
        let tag = &value[value.len() - TAG..];
        let ad = self.ad(key, meta, &header);
        out.extend_from_slice(payload);
        match &self.cipher {
            Some(c) => c.decrypt_in_place_detached(&nonce(seq), &ad, out, tag.into()).map_err(|_| {
                out.clear();
                SealError::Mac
            }),
            None => {
                // Compared in constant time (blake3's Hash equality).
                let want = blake3::Hasher::new_keyed(&self.mac_key).update(&ad).update(payload).finalize();
                let mut got = [0u8; 32];
                got[..TAG].copy_from_slice(tag);
                got[TAG..].copy_from_slice(&want.as_bytes()[TAG..]);
                if blake3::Hash::from(got) == want {
                    Ok(())
                } else {
                    out.clear();
                    Err(SealError::Mac)
                }
            }
        }
    }
}

fn nonce(seq: u64) -> chacha20poly1305::Nonce {
    let mut n = [0u8; 12];
    n[..8].copy_from_slice(&seq.to_le_bytes());
    n.into()
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
            assert_eq!(v.len(), HEADER + 1500 + TAG);
            assert_eq!(encrypt, v[HEADER..HEADER + 1500] != data[..]);
            let mut out = Vec::new();
            w.open(key, &meta(1500), 42, &v, &mut out).unwrap();
            assert_eq!(out, data);
            // Any flipped bit anywhere: refused.
            for at in [0, 2, 3, 5, HEADER, HEADER + 700, v.len() - 1] {
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
