//! The protocol between a process under `ztier run --remote` (its
//! library's `ProxyTier`, in `client.rs`) and the remote tier's proxy in
//! the `ztier run` process (in `proxy.rs`), over one unix stream socket
//! per process.
//!
//! ```text
//!  frame: header (8 bytes) then body (len bytes, at most MAX_BODY)
//!  0      1       2       4               8
//! +------+-------+-------+---------------+---------------------+
//! | kind | flags | 0 0   | len (u32 LE)  | body ...            |
//! +------+-------+-------+---------------+---------------------+
//!
//!  requests (process → proxy)        replies (proxy → process), in order
//!  HELLO  version ‖ token (32)       TEXT  (run id)  |  ERROR message
//!  PUT    key ‖ meta ‖ bytes         ACK  |  REFUSED key ‖ meta ‖ bytes ‖ message
//!  GET    key ‖ cpu (u32 LE; flags 1: remove)
//!                                    VALUE meta ‖ bytes  |  ABSENT  |  ERROR message
//!  REMOVE key                        (none)
//!  REMOVE_OBJECT pool ‖ object       (none)
//!  REMOVE_POOL pool                  (none)
//!  STATS                             TEXT (JSON)
//!  TAKE_ALL                          VALUE key ‖ meta ‖ bytes ... then END  |  ERROR
//!
//!  key  = pool (u32 LE) ‖ object (u64 LE) ‖ index (u32 LE)          16 bytes
//!  meta = tag (u8) ‖ flags (u8) ‖ len (u16 LE) ‖ crc (u32 LE) ‖ pattern (u64 LE)  16
//! ```
//!
//! GET's `cpu` is the CPU of the thread that waits for the page: the
//! proxy's thread serves it there (a wake-up on another CPU costs up to
//! ~100 µs on the VMs measured, a switch on the same one a few).
//!
//! A PUT is not waited for: the process goes on, and reads its ACK (or
//! REFUSED, which gives the page back) with a later reply; every other
//! request that has a reply is answered after every PUT before it. A
//! frame that breaks these rules (an unknown kind, a body too long or too
//! short) is an error on either side ([`WireError`]), never a crash.

use std::io::{self, Read, Write};

use ztier_store::tier::SpillMeta;
use ztier_store::Key;

/// Protocol version (in HELLO).
pub const VERSION: u8 = 1;
/// Bytes of a frame's header.
pub const HEADER: usize = 8;
/// The longest body: a page and a message.
pub const MAX_BODY: usize = 64 << 10;
/// Bytes of an encoded key.
pub const KEY: usize = 16;
/// Bytes of encoded metadata.
pub const META: usize = 16;
/// Bytes of the token a process gives in HELLO.
pub const TOKEN: usize = 32;

/// Requests.
pub mod op {
    /// Who the process is: version and the run's token.
    pub const HELLO: u8 = 1;
    /// An entry to keep.
    pub const PUT: u8 = 2;
    /// An entry to read (flags bit 0: and remove).
    pub const GET: u8 = 3;
    /// An entry to drop.
    pub const REMOVE: u8 = 4;
    /// Every entry of an object to drop.
    pub const REMOVE_OBJECT: u8 = 5;
    /// Every entry of a pool to drop.
    pub const REMOVE_POOL: u8 = 6;
    /// The tier's statistics.
    pub const STATS: u8 = 7;
    /// Every entry, handed back and dropped (before a fork).
    pub const TAKE_ALL: u8 = 8;
}

/// Replies.
pub mod reply {
    /// A PUT was taken.
    pub const ACK: u8 = 0x81;
    /// A PUT was not taken: the page comes back, with why.
    pub const REFUSED: u8 = 0x82;
    /// An entry (GET: meta ‖ bytes; TAKE_ALL: key ‖ meta ‖ bytes).
    pub const VALUE: u8 = 0x83;
    /// No such entry.
    pub const ABSENT: u8 = 0x84;
    /// A request failed: why (UTF-8).
    pub const ERROR: u8 = 0x85;
    /// Text (UTF-8): HELLO's run id, STATS' JSON.
    pub const TEXT: u8 = 0x86;
    /// The last of TAKE_ALL's entries was sent.
    pub const END: u8 = 0x87;
}

/// A frame that breaks the protocol.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// A body longer than [`MAX_BODY`].
    #[error("remote proxy protocol: a frame of {0} bytes (at most {MAX_BODY})")]
    TooLong(usize),
    /// A body too short for its kind.
    #[error("remote proxy protocol: a frame of kind {kind:#x} with {len} bytes")]
    TooShort {
        /// The frame's kind.
        kind: u8,
        /// Its body's length.
        len: usize,
    },
    /// A kind not expected here.
    #[error("remote proxy protocol: unexpected frame kind {0:#x}")]
    Kind(u8),
}

impl From<WireError> for io::Error {
    fn from(e: WireError) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

/// Appends a frame to `out`.
pub fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, parts: &[&[u8]]) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    debug_assert!(len <= MAX_BODY);
    out.extend_from_slice(&[kind, flags, 0, 0]);
    out.extend_from_slice(&(len as u32).to_le_bytes());
    for p in parts {
        out.extend_from_slice(p);
    }
}

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, kind: u8, flags: u8, parts: &[&[u8]]) -> io::Result<()> {
    let mut b = Vec::with_capacity(HEADER + parts.iter().map(|p| p.len()).sum::<usize>());
    frame(&mut b, kind, flags, parts);
    w.write_all(&b)
}

/// A frame's header: kind, flags, body length (checked).
pub fn parse_header(h: &[u8; HEADER]) -> Result<(u8, u8, usize), WireError> {
    let len = u32::from_le_bytes(h[4..8].try_into().expect("4 bytes")) as usize;
    if len > MAX_BODY {
        return Err(WireError::TooLong(len));
    }
    Ok((h[0], h[1], len))
}

/// Reads one frame into `body`: its kind and flags; `None` at the end
/// of the stream before a frame.
pub fn read_frame(r: &mut impl Read, body: &mut Vec<u8>) -> io::Result<Option<(u8, u8)>> {
    let mut h = [0u8; HEADER];
    let mut got = 0;
    while got < HEADER {
        match r.read(&mut h[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let (kind, flags, len) = parse_header(&h)?;
    body.clear();
    body.resize(len, 0);
    r.read_exact(body)?;
    Ok(Some((kind, flags)))
}

/// Encodes a key.
pub fn key_bytes(k: Key) -> [u8; KEY] {
    let mut b = [0u8; KEY];
    b[..4].copy_from_slice(&k.pool.to_le_bytes());
    b[4..12].copy_from_slice(&k.object.to_le_bytes());
    b[12..].copy_from_slice(&k.index.to_le_bytes());
    b
}

/// Decodes a key (the first [`KEY`] bytes of `b`).
pub fn key_of(kind: u8, b: &[u8]) -> Result<Key, WireError> {
    let b: &[u8; KEY] =
        b.get(..KEY).and_then(|s| s.try_into().ok()).ok_or(WireError::TooShort { kind, len: b.len() })?;
    Ok(Key {
        pool: u32::from_le_bytes(b[..4].try_into().expect("4")),
        object: u64::from_le_bytes(b[4..12].try_into().expect("8")),
        index: u32::from_le_bytes(b[12..].try_into().expect("4")),
    })
}

/// Encodes metadata.
pub fn meta_bytes(m: &SpillMeta) -> [u8; META] {
    let mut b = [0u8; META];
    b[0] = m.tag;
    b[1] = m.flags;
    b[2..4].copy_from_slice(&m.len.to_le_bytes());
    b[4..8].copy_from_slice(&m.crc.to_le_bytes());
    b[8..].copy_from_slice(&m.pattern.to_le_bytes());
    b
}

/// Decodes metadata (the first [`META`] bytes of `b`).
pub fn meta_of(kind: u8, b: &[u8]) -> Result<SpillMeta, WireError> {
    let b: &[u8; META] =
        b.get(..META).and_then(|s| s.try_into().ok()).ok_or(WireError::TooShort { kind, len: b.len() })?;
    Ok(SpillMeta {
        tag: b[0],
        flags: b[1],
        len: u16::from_le_bytes(b[2..4].try_into().expect("2")),
        crc: u32::from_le_bytes(b[4..8].try_into().expect("4")),
        pattern: u64::from_le_bytes(b[8..].try_into().expect("8")),
    })
}

/// A page's metadata and bytes from a body `meta ‖ bytes`, checked
/// against each other (the bytes are `meta.len` long).
pub fn page_of(kind: u8, b: &[u8]) -> Result<(SpillMeta, &[u8]), WireError> {
    let m = meta_of(kind, b)?;
    let data = &b[META..];
    if data.len() < m.len as usize {
        return Err(WireError::TooShort { kind, len: b.len() });
    }
    Ok((m, &data[..m.len as usize]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_bad_ones_are_errors() {
        let k = Key { pool: 3, object: 1 << 40, index: 77 };
        let m = SpillMeta { tag: 2, flags: 1, len: 5, crc: 0xfeed, pattern: 9 };
        let mut b = Vec::new();
        frame(&mut b, op::PUT, 0, &[&key_bytes(k), &meta_bytes(&m), b"hello"]);
        frame(&mut b, reply::ACK, 0, &[]);
        let mut r = &b[..];
        let mut body = Vec::new();
        assert_eq!(read_frame(&mut r, &mut body).unwrap(), Some((op::PUT, 0)));
        assert_eq!(key_of(op::PUT, &body).unwrap(), k);
        let (m2, d) = page_of(op::PUT, &body[KEY..]).unwrap();
        assert_eq!((m2, d), (m, &b"hello"[..]));
        assert_eq!(read_frame(&mut r, &mut body).unwrap(), Some((reply::ACK, 0)));
        assert!(body.is_empty());
        assert_eq!(read_frame(&mut r, &mut body).unwrap(), None);
        // Too long, cut short, too short for its kind.
        let mut h = [op::GET, 0, 0, 0, 0, 0, 0, 0];
        h[4..].copy_from_slice(&(MAX_BODY as u32 + 1).to_le_bytes());
        assert!(read_frame(&mut &h[..], &mut body).is_err());
        assert!(read_frame(&mut &b[..5], &mut body).is_err());
        assert!(read_frame(&mut &b[..20], &mut body).is_err());
        assert!(key_of(op::GET, &[1, 2, 3]).is_err());
        let short = meta_bytes(&SpillMeta { len: 100, ..m });
        assert!(page_of(reply::VALUE, &short).is_err());
    }
}
