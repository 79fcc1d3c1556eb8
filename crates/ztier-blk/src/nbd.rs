//! The NBD protocol, server side: fixed newstyle handshake and the
//! transmission phase with simple and structured replies (the protocol
//! document of the NetworkBlockDevice project, `doc/proto.md`). Everything
//! here is pure parsing and encoding, so the fuzzer drives it directly.
//!
//! ```text
//!  S: "NBDMAGIC" IHAVEOPT flags:u16(FIXED_NEWSTYLE|NO_ZEROES)
//!  C: flags:u32
//!  C: IHAVEOPT option:u32 length:u32 data            ─┐ repeated; each answered by
//!  S: 0x3e889045565a9 option:u32 type:u32 len:u32 data ┘ replies ending in ACK or an error
//!  … GO/EXPORT_NAME → transmission:
//!  C: 0x25609513 flags:u16 type:u16 cookie:u64 offset:u64 length:u32 [payload]
//!  S: 0x67446698 error:u32 cookie:u64 [payload]                    (simple)
//!  S: 0x668e33ef flags:u16 type:u16 cookie:u64 length:u32 payload  (structured chunk)
//! ```
//!
//! All numbers are big endian.

/// "NBDMAGIC".
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT".
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Option reply magic.
pub const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Request magic.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Simple reply magic.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Structured reply magic.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// No 124 zero bytes after EXPORT_NAME.
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flags.
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag: no zeroes.
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Transmission flags.
pub mod tflag {
    /// Always set.
    pub const HAS_FLAGS: u16 = 1 << 0;
    /// Read-only export.
    pub const READ_ONLY: u16 = 1 << 1;
    /// FLUSH supported.
    pub const SEND_FLUSH: u16 = 1 << 2;
    /// FUA supported.
    pub const SEND_FUA: u16 = 1 << 3;
    /// TRIM supported.
    pub const SEND_TRIM: u16 = 1 << 5;
    /// WRITE_ZEROES supported.
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    /// DF supported.
    pub const SEND_DF: u16 = 1 << 7;
    /// Flush is global across connections.
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
    /// FAST_ZERO supported.
    pub const SEND_FAST_ZERO: u16 = 1 << 11;
}

/// Option codes.
pub mod opt {
    /// EXPORT_NAME.
    pub const EXPORT_NAME: u32 = 1;
    /// ABORT.
    pub const ABORT: u32 = 2;
    /// LIST.
    pub const LIST: u32 = 3;
    /// STARTTLS.
    pub const STARTTLS: u32 = 5;
    /// INFO.
    pub const INFO: u32 = 6;
    /// GO.
    pub const GO: u32 = 7;
    /// STRUCTURED_REPLY.
    pub const STRUCTURED_REPLY: u32 = 8;
    /// LIST_META_CONTEXT.
    pub const LIST_META_CONTEXT: u32 = 9;
    /// SET_META_CONTEXT.
    pub const SET_META_CONTEXT: u32 = 10;
}

/// Option reply types.
pub mod rep {
    /// ACK.
    pub const ACK: u32 = 1;
    /// SERVER (LIST entry).
    pub const SERVER: u32 = 2;
    /// INFO.
    pub const INFO: u32 = 3;
    /// META_CONTEXT.
    pub const META_CONTEXT: u32 = 4;
    /// Unsupported option.
    pub const ERR_UNSUP: u32 = (1 << 31) + 1;
    /// Malformed option.
    pub const ERR_INVALID: u32 = (1 << 31) + 3;
    /// Unknown export.
    pub const ERR_UNKNOWN: u32 = (1 << 31) + 6;
    /// Too big.
    pub const ERR_TOO_BIG: u32 = (1 << 31) + 9;
}

/// Info types.
pub mod info {
    /// Size and flags.
    pub const EXPORT: u16 = 0;
    /// Name.
    pub const NAME: u16 = 1;
    /// Description.
    pub const DESCRIPTION: u16 = 2;
    /// Block sizes.
    pub const BLOCK_SIZE: u16 = 3;
}

/// Commands.
pub mod cmd {
    /// READ.
    pub const READ: u16 = 0;
    /// WRITE.
    pub const WRITE: u16 = 1;
    /// DISC.
    pub const DISC: u16 = 2;
    /// FLUSH.
    pub const FLUSH: u16 = 3;
    /// TRIM.
    pub const TRIM: u16 = 4;
    /// CACHE.
    pub const CACHE: u16 = 5;
    /// WRITE_ZEROES.
    pub const WRITE_ZEROES: u16 = 6;
    /// BLOCK_STATUS.
    pub const BLOCK_STATUS: u16 = 7;
}

/// Command flags.
pub mod cflag {
    /// Force unit access.
    pub const FUA: u16 = 1 << 0;
    /// WRITE_ZEROES: do not punch a hole.
    pub const NO_HOLE: u16 = 1 << 1;
    /// READ: do not fragment the reply.
    pub const DF: u16 = 1 << 2;
    /// BLOCK_STATUS: one descriptor.
    pub const REQ_ONE: u16 = 1 << 3;
    /// WRITE_ZEROES: fail if not fast.
    pub const FAST_ZERO: u16 = 1 << 4;
}

/// Structured reply types and flags.
pub mod reply {
    /// Final chunk.
    pub const FLAG_DONE: u16 = 1 << 0;
    /// No payload.
    pub const NONE: u16 = 0;
    /// Data at an offset.
    pub const OFFSET_DATA: u16 = 1;
    /// Zeros at an offset.
    pub const OFFSET_HOLE: u16 = 2;
    /// Block status descriptors.
    pub const BLOCK_STATUS: u16 = 5;
    /// Error.
    pub const ERROR: u16 = (1 << 15) + 1;
}

/// Error values.
pub mod errno {
    /// Operation not permitted.
    pub const EPERM: u32 = 1;
    /// I/O error.
    pub const EIO: u32 = 5;
    /// Out of memory.
    pub const ENOMEM: u32 = 12;
    /// Invalid argument.
    pub const EINVAL: u32 = 22;
    /// No space.
    pub const ENOSPC: u32 = 28;
    /// Value too large.
    pub const EOVERFLOW: u32 = 75;
    /// Not supported (FAST_ZERO refused).
    pub const ENOTSUP: u32 = 95;
    /// Shutting down.
    pub const ESHUTDOWN: u32 = 108;
}

/// base:allocation flags.
pub const STATE_HOLE: u32 = 1 << 0;
/// Reads as zeros.
pub const STATE_ZERO: u32 = 1 << 1;
/// The id this server gives `base:allocation`.
pub const BASE_ALLOCATION_ID: u32 = 1;
/// Its name.
pub const BASE_ALLOCATION: &str = "base:allocation";

/// Largest payload accepted (the spec's interoperable maximum).
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// Largest option data accepted before a hard disconnect.
pub const MAX_OPTION: u32 = 64 << 10;
/// Longest string (export names, queries).
pub const MAX_STRING: usize = 4096;

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().expect("4 bytes"))
}
fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().expect("8 bytes"))
}

/// The data of INFO/GO: export name and information requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoRequest {
    /// Export name.
    pub name: String,
    /// Information types asked for.
    pub infos: Vec<u16>,
}

/// Parses INFO/GO data; `None` = malformed (reply ERR_INVALID).
pub fn parse_go(d: &[u8]) -> Option<GoRequest> {
    if d.len() < 6 {
        return None;
    }
    let n = be32(d) as usize;
    if n > d.len() - 6 || n > MAX_STRING {
        return None;
    }
    let name = std::str::from_utf8(&d[4..4 + n]).ok()?.to_string();
    let k = be16(&d[4 + n..]) as usize;
    let rest = &d[6 + n..];
    if rest.len() != 2 * k {
        return None;
    }
    Some(GoRequest { name, infos: rest.chunks(2).map(be16).collect() })
}

/// The data of LIST/SET_META_CONTEXT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaRequest {
    /// Export name.
    pub name: String,
    /// Queries.
    pub queries: Vec<String>,
}

/// Parses LIST/SET_META_CONTEXT data; `None` = malformed.
pub fn parse_meta(d: &[u8]) -> Option<MetaRequest> {
    if d.len() < 8 {
        return None;
    }
    let n = be32(d) as usize;
    if n > MAX_STRING || n > d.len() - 8 {
        return None;
    }
    let name = std::str::from_utf8(&d[4..4 + n]).ok()?.to_string();
    let count = be32(&d[4 + n..]) as usize;
    let mut at = 8 + n;
    let mut queries = Vec::new();
    for _ in 0..count {
        if d.len() < at + 4 {
            return None;
        }
        let q = be32(&d[at..]) as usize;
        at += 4;
        if q > MAX_STRING || d.len() < at + q {
            return None;
        }
        queries.push(std::str::from_utf8(&d[at..at + q]).ok()?.to_string());
        at += q;
    }
    (at == d.len()).then_some(MetaRequest { name, queries })
}

/// Whether a metadata query selects `base:allocation` (for LIST, the
/// namespace alone `base:` also does).
pub fn selects_base_allocation(q: &str, list: bool) -> bool {
    q == BASE_ALLOCATION || (list && q == "base:")
}

/// One transmission request header (28 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Command flags.
    pub flags: u16,
    /// Command.
    pub kind: u16,
    /// Cookie echoed in replies.
    pub cookie: u64,
    /// Offset.
    pub offset: u64,
    /// Length.
    pub length: u32,
}

/// Request header size.
pub const REQUEST_LEN: usize = 28;

impl Request {
    /// Parses a header; `None` if the magic is wrong (hard disconnect).
    pub fn parse(b: &[u8; REQUEST_LEN]) -> Option<Request> {
        (be32(b) == REQUEST_MAGIC).then(|| Request {
            flags: be16(&b[4..]),
            kind: be16(&b[6..]),
            cookie: be64(&b[8..]),
            offset: be64(&b[16..]),
            length: be32(&b[24..]),
        })
    }

    /// Encodes (for tests and clients).
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.kind.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }
}

/// What the transmission phase was negotiated with.
#[derive(Debug, Clone, Copy)]
pub struct Session {
    /// Export size.
    pub size: u64,
    /// Transmission flags sent.
    pub flags: u16,
    /// Structured replies negotiated.
    pub structured: bool,
    /// base:allocation selected.
    pub base_allocation: bool,
}

/// Checks a request against the session: `Err(errno)` to reply with.
/// WRITE payloads must be read (or the connection dropped) by the caller
/// before replying, whatever this says.
pub fn validate(r: &Request, s: &Session) -> Result<(), u32> {
    use errno::*;
    let known = match r.kind {
        cmd::READ => cflag::DF,
        cmd::WRITE => cflag::FUA,
        cmd::WRITE_ZEROES => cflag::FUA | cflag::NO_HOLE | cflag::FAST_ZERO,
        cmd::TRIM => cflag::FUA,
        cmd::BLOCK_STATUS => cflag::REQ_ONE,
        cmd::FLUSH | cmd::DISC => 0,
        _ => return Err(EINVAL),
    };
    if r.flags & !known != 0 {
        return Err(EINVAL);
    }
    if r.flags & cflag::DF != 0 && !s.structured {
        return Err(EINVAL);
    }
    let writes = matches!(r.kind, cmd::WRITE | cmd::WRITE_ZEROES | cmd::TRIM);
    if writes && s.flags & tflag::READ_ONLY != 0 {
        return Err(EPERM);
    }
    match r.kind {
        cmd::FLUSH | cmd::DISC => {
            if r.offset != 0 || r.length != 0 {
                return Err(EINVAL);
            }
        }
        cmd::BLOCK_STATUS if !s.base_allocation => return Err(EINVAL),
        _ => {
            if (r.kind == cmd::READ || r.kind == cmd::WRITE) && r.length > MAX_PAYLOAD {
                return Err(EOVERFLOW);
            }
            if r.kind == cmd::BLOCK_STATUS && r.length == 0 {
                return Err(EINVAL);
            }
            match r.offset.checked_add(r.length as u64) {
                Some(end) if end <= s.size => {}
                _ => return Err(EINVAL),
            }
        }
    }
    Ok(())
}

/// An option reply header + data.
pub fn option_reply(option: u32, kind: u32, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(20 + data.len());
    b.extend_from_slice(&REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}

/// A simple reply header.
pub fn simple_reply(cookie: u64, error: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// A structured chunk header for `len` payload bytes.
pub fn chunk_header(cookie: u64, flags: u16, kind: u16, len: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&kind.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..20].copy_from_slice(&len.to_be_bytes());
    b
}

/// A final structured error chunk with a message.
pub fn error_chunk(cookie: u64, error: u32, msg: &str) -> Vec<u8> {
    let msg = &msg.as_bytes()[..msg.len().min(MAX_STRING)];
    let mut b = chunk_header(cookie, reply::FLAG_DONE, reply::ERROR, 6 + msg.len() as u32).to_vec();
    b.extend_from_slice(&error.to_be_bytes());
    b.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    b.extend_from_slice(msg);
    b
}

/// Merges per-block base:allocation flags into descriptors covering
/// `[offset, offset + length)`, blocks of `bs` bytes starting at block
/// `offset / bs`; with `one`, only the first descriptor (clipped to the
/// request). At most 2^20 descriptors.
pub fn status_descriptors(offset: u64, length: u32, bs: u64, flags: &[u32], one: bool) -> Vec<(u32, u32)> {
    let end = offset + length as u64;
    let mut out: Vec<(u32, u32)> = Vec::new();
    let mut pos = offset;
    let first = offset / bs;
    while pos < end {
        let b = pos / bs;
        let f = flags[(b - first) as usize];
        let stop = ((b + 1) * bs).min(end);
        let n = (stop - pos) as u32;
        match out.last_mut() {
            Some(last) if last.1 == f && last.0 as u64 + n as u64 <= u32::MAX as u64 => last.0 += n,
            _ => {
                if out.len() == 1 << 20 {
                    break;
                }
                out.push((n, f));
            }
        }
        pos = stop;
        if one && out.len() > 1 {
            out.pop();
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_and_meta_and_rejects_garbage() {
        let mut d = Vec::new();
        d.extend_from_slice(&5u32.to_be_bytes());
        d.extend_from_slice(b"ztier");
        d.extend_from_slice(&2u16.to_be_bytes());
        d.extend_from_slice(&3u16.to_be_bytes());
        d.extend_from_slice(&0u16.to_be_bytes());
        assert_eq!(parse_go(&d), Some(GoRequest { name: "ztier".into(), infos: vec![3, 0] }));
        assert_eq!(parse_go(&d[..d.len() - 1]), None);
        assert_eq!(parse_go(&[0, 0, 0, 9, 0, 0]), None);
        let mut m = Vec::new();
        m.extend_from_slice(&0u32.to_be_bytes());
        m.extend_from_slice(&1u32.to_be_bytes());
        m.extend_from_slice(&15u32.to_be_bytes());
        m.extend_from_slice(b"base:allocation");
        assert_eq!(
            parse_meta(&m),
            Some(MetaRequest { name: String::new(), queries: vec![BASE_ALLOCATION.into()] })
        );
        assert_eq!(parse_meta(&m[..m.len() - 2]), None);
        let mut long = m.clone();
        long.push(0);
        assert_eq!(parse_meta(&long), None);
    }

    #[test]
    fn validates_requests() {
        let s = Session { size: 1 << 20, flags: tflag::HAS_FLAGS, structured: false, base_allocation: false };
        let r = |kind, flags, offset, length| Request { flags, kind, cookie: 1, offset, length };
        assert_eq!(validate(&r(cmd::READ, 0, 0, 4096), &s), Ok(()));
        assert_eq!(validate(&r(cmd::READ, 0, (1 << 20) - 1, 2), &s), Err(errno::EINVAL));
        assert_eq!(validate(&r(cmd::READ, 0, u64::MAX, 2), &s), Err(errno::EINVAL));
        assert_eq!(validate(&r(cmd::READ, cflag::DF, 0, 1), &s), Err(errno::EINVAL));
        assert_eq!(validate(&r(cmd::WRITE, 1 << 9, 0, 1), &s), Err(errno::EINVAL));
        assert_eq!(validate(&r(cmd::BLOCK_STATUS, 0, 0, 1), &s), Err(errno::EINVAL));
        assert_eq!(validate(&r(99, 0, 0, 1), &s), Err(errno::EINVAL));
        assert_eq!(validate(&r(cmd::FLUSH, 0, 0, 1), &s), Err(errno::EINVAL));
        let ro = Session { flags: tflag::READ_ONLY, ..s };
        assert_eq!(validate(&r(cmd::TRIM, 0, 0, 1), &ro), Err(errno::EPERM));
        let hdr = r(cmd::WRITE, cflag::FUA, 4096, 512).encode();
        assert_eq!(Request::parse(&hdr), Some(r(cmd::WRITE, cflag::FUA, 4096, 512)));
        let mut bad = hdr;
        bad[0] ^= 1;
        assert_eq!(Request::parse(&bad), None);
    }

    #[test]
    fn merges_status_descriptors() {
        let f = [3, 3, 0, 0, 2];
        assert_eq!(status_descriptors(0, 5 * 4096, 4096, &f, false), vec![(8192, 3), (8192, 0), (4096, 2)]);
        assert_eq!(status_descriptors(100, 8192, 4096, &f[..3], false), vec![(8092, 3), (100, 0)]);
        assert_eq!(status_descriptors(0, 5 * 4096, 4096, &f, true), vec![(8192, 3)]);
    }
}
