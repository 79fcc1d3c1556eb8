//! An NBD client, next to the server: fixed newstyle handshake (plain
//! newstyle and `EXPORT_NAME` for old servers), structured replies,
//! READ/WRITE/FLUSH/TRIM/WRITE_ZEROES with FUA, several connections with
//! requests pipelined on each, reconnection after the server went away,
//! and a timeout per request. Used by `ztier cache` to reach a backing
//! device exported by nbdkit, qemu-nbd or another `ztier` server.
//!
//! ```text
//!  caller threads ──► Client ──► connection k (round robin), each:
//!                                  writer lock: header [+ payload] ──► socket
//!                                  in flight: cookie → Slot (buffer, coverage)
//!                     reader thread ◄── replies, in any order, by cookie
//!                       simple:     magic 0x67446698 error:u32 cookie:u64 [data]
//!                       structured: magic 0x668e33ef flags:u16 type:u16
//!                                   cookie:u64 length:u32 payload
//! ```
//!
//! Every reply is checked before it is believed: the magic, a cookie that
//! is in flight, chunk types that fit the request, data and holes inside
//! the request's range and never overlapping, error chunks well formed,
//! and a successful read covered byte for byte. A reply that breaks the
//! protocol fails the connection (every request in flight on it gets an
//! error) — never the process, and never wrong data. The parsers below
//! are pure functions and [`read_reply`] runs on any `Read`, so the fuzzer
//! drives them directly (`fuzz/fuzz_targets/nbd_reply.rs`).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::nbd::{self, cflag, cmd, opt, rep, reply, tflag, Request};

/// Option reply: TLS required.
const ERR_TLS_REQD: u32 = (1 << 31) + 5;
/// Option reply: refused by policy.
const ERR_POLICY: u32 = (1 << 31) + 2;
/// Option reply: the server is shutting down.
const ERR_SHUTDOWN: u32 = (1 << 31) + 7;
/// Structured reply type ERROR_OFFSET.
const REPLY_ERROR_OFFSET: u16 = (1 << 15) + 2;
/// The oldstyle handshake's second magic.
const OLDSTYLE_MAGIC: u64 = 0x0000_4202_8186_1253;
/// Largest option reply accepted in the handshake.
const MAX_OPTION_REPLY: u32 = 1 << 20;
/// Largest error message kept.
const MAX_MESSAGE: usize = 4096;
/// A connection's receive buffer for replies.
const REPLY_BUFFER: usize = 64 << 10;

/// Errors of the client. Each message says what a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The URI is not one this client reads.
    #[error(
        "bad NBD URI '{uri}': {why} (expected nbd://HOST[:PORT]/EXPORT or nbd+unix:///EXPORT?socket=PATH)"
    )]
    BadUri {
        /// The URI.
        uri: String,
        /// What is wrong.
        why: String,
    },
    /// Connecting failed.
    #[error("connecting to {to}: {err}")]
    Connect {
        /// Where.
        to: String,
        /// The system's error.
        err: io::Error,
    },
    /// The handshake failed (the server refused or misbehaved).
    #[error("NBD handshake with {to}: {why}")]
    Handshake {
        /// Where.
        to: String,
        /// What happened.
        why: String,
    },
    /// The server broke the protocol; the connection was dropped.
    #[error("the NBD server sent a malformed reply: {0}")]
    Protocol(String),
    /// The server answered the request with an error.
    #[error("the NBD server answered {} ({errno}){}", errno_name(*errno), if msg.is_empty() { String::new() } else { format!(": {msg}") })]
    Server {
        /// NBD error value (errno numbering).
        errno: u32,
        /// The server's message, if it sent one.
        msg: String,
    },
    /// The connection is gone (server died, network, earlier protocol error).
    #[error("the connection to the NBD server is gone: {0}")]
    Disconnected(String),
    /// No reply within the timeout; the connection was dropped.
    #[error("no reply from the NBD server within {0:?}")]
    Timeout(Duration),
    /// The request is outside the export.
    #[error("request beyond the end of the export ({size} bytes)")]
    OutOfRange {
        /// Export size.
        size: u64,
    },
    /// The export is read-only.
    #[error("the NBD export is read-only")]
    ReadOnly,
}

fn errno_name(e: u32) -> &'static str {
    match e {
        nbd::errno::EPERM => "EPERM",
        nbd::errno::EIO => "EIO",
        nbd::errno::ENOMEM => "ENOMEM",
        nbd::errno::EINVAL => "EINVAL",
        nbd::errno::ENOSPC => "ENOSPC",
        nbd::errno::EOVERFLOW => "EOVERFLOW",
        nbd::errno::ENOTSUP => "ENOTSUP",
        nbd::errno::ESHUTDOWN => "ESHUTDOWN",
        _ => "an error",
    }
}

impl ClientError {
    /// The NBD errno a server relaying this error should answer with.
    pub fn errno(&self) -> u32 {
        match self {
            ClientError::Server { errno, .. } => match *errno {
                nbd::errno::EPERM
                | nbd::errno::EIO
                | nbd::errno::ENOMEM
                | nbd::errno::EINVAL
                | nbd::errno::ENOSPC
                | nbd::errno::EOVERFLOW
                | nbd::errno::ENOTSUP
                | nbd::errno::ESHUTDOWN => *errno,
                _ => nbd::errno::EIO,
            },
            ClientError::OutOfRange { .. } => nbd::errno::EINVAL,
            ClientError::ReadOnly => nbd::errno::EPERM,
            _ => nbd::errno::EIO,
        }
    }
}

impl From<ClientError> for io::Error {
    fn from(e: ClientError) -> io::Error {
        let kind = match e.errno() {
            nbd::errno::EPERM => io::ErrorKind::PermissionDenied,
            nbd::errno::ENOSPC => io::ErrorKind::StorageFull,
            nbd::errno::EINVAL => io::ErrorKind::InvalidInput,
            nbd::errno::ENOTSUP => io::ErrorKind::Unsupported,
            nbd::errno::ENOMEM => io::ErrorKind::OutOfMemory,
            _ => match e {
                ClientError::Timeout(_) => io::ErrorKind::TimedOut,
                ClientError::Disconnected(_) => io::ErrorKind::NotConnected,
                _ => io::ErrorKind::Other,
            },
        };
        io::Error::new(kind, e)
    }
}

// ---- URIs ----------------------------------------------------------------

/// Where an export is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// A unix socket.
    Unix(PathBuf),
    /// TCP `host:port`.
    Tcp(String),
}

/// A parsed NBD URI (the subset of the NBD URI specification without TLS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uri {
    /// How to connect.
    pub transport: Transport,
    /// Export name (percent-decoded).
    pub export: String,
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

impl Uri {
    /// Parses `nbd://HOST[:PORT][/EXPORT]` (port 10809 by default) or
    /// `nbd+unix:///[EXPORT]?socket=PATH`. TLS (`nbds`) is refused.
    pub fn parse(uri: &str) -> Result<Uri, ClientError> {
        let bad = |why: &str| ClientError::BadUri { uri: uri.to_string(), why: why.to_string() };
        let (scheme, rest) = uri.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let export = percent_decode(path).ok_or_else(|| bad("bad percent-encoding in the export name"))?;
        if export.len() > nbd::MAX_STRING {
            return Err(bad("export name longer than 4096 bytes"));
        }
        let param = |name: &str| {
            query.and_then(|q| {
                q.split('&').find_map(|kv| match kv.split_once('=') {
                    Some((k, v)) if k == name => Some(v.to_string()),
                    _ => None,
                })
            })
        };
        match scheme {
            "nbd" => {
                if authority.is_empty() {
                    return Err(bad("no host"));
                }
                let hostport = if authority.starts_with('[') {
                    // [v6] or [v6]:port
                    match authority.rfind("]:") {
                        Some(_) => authority.to_string(),
                        None => format!("{authority}:10809"),
                    }
                } else if authority.contains(':') {
                    authority.to_string()
                } else {
                    format!("{authority}:10809")
                };
                Ok(Uri { transport: Transport::Tcp(hostport), export })
            }
            "nbd+unix" => {
                if !authority.is_empty() {
                    return Err(bad("nbd+unix takes no host (nbd+unix:///EXPORT?socket=PATH)"));
                }
                let sock = param("socket").ok_or_else(|| bad("no socket= parameter"))?;
                let sock = percent_decode(&sock).ok_or_else(|| bad("bad percent-encoding in socket="))?;
                if sock.is_empty() {
                    return Err(bad("empty socket= parameter"));
                }
                Ok(Uri { transport: Transport::Unix(PathBuf::from(sock)), export })
            }
            "nbds" | "nbds+unix" => Err(bad("TLS is not supported by this client")),
            _ => Err(bad("unknown scheme")),
        }
    }

    /// Where it connects, for messages.
    pub fn describe(&self) -> String {
        match &self.transport {
            Transport::Unix(p) => format!("nbd+unix:///{}?socket={}", self.export, p.display()),
            Transport::Tcp(h) => format!("nbd://{h}/{}", self.export),
        }
    }
}

// ---- pure reply parsing ---------------------------------------------------

/// A reply header, simple or structured (one chunk).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyHeader {
    /// Simple reply (16 bytes).
    Simple {
        /// Cookie.
        cookie: u64,
        /// Error (0 = success).
        error: u32,
    },
    /// Structured reply chunk (20 bytes).
    Chunk {
        /// Chunk flags ([`reply::FLAG_DONE`]).
        flags: u16,
        /// Chunk type.
        kind: u16,
        /// Cookie.
        cookie: u64,
        /// Payload length.
        len: u32,
    },
}

/// How many bytes the reply header starting with this magic has: 16
/// (simple), 20 (structured), or an error for any other magic.
pub fn reply_header_len(magic: [u8; 4]) -> Result<usize, String> {
    match u32::from_be_bytes(magic) {
        nbd::SIMPLE_REPLY_MAGIC => Ok(16),
        nbd::STRUCTURED_REPLY_MAGIC => Ok(20),
        m => Err(format!("reply magic {m:#010x} is neither simple nor structured")),
    }
}

/// Parses a whole reply header (16 or 20 bytes, magic included).
pub fn parse_reply_header(b: &[u8]) -> Result<ReplyHeader, String> {
    let magic: [u8; 4] = b.get(..4).ok_or("short reply header")?.try_into().expect("4 bytes");
    let n = reply_header_len(magic)?;
    if b.len() != n {
        return Err(format!("reply header of {} bytes, expected {n}", b.len()));
    }
    let be64 = |o: usize| u64::from_be_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    let be32 = |o: usize| u32::from_be_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    let be16 = |o: usize| u16::from_be_bytes(b[o..o + 2].try_into().expect("2 bytes"));
    Ok(if n == 16 {
        ReplyHeader::Simple { error: be32(4), cookie: be64(8) }
    } else {
        ReplyHeader::Chunk { flags: be16(4), kind: be16(6), cookie: be64(8), len: be32(16) }
    })
}

/// A parsed error chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkError {
    /// errno (never 0).
    pub errno: u32,
    /// Message.
    pub msg: String,
    /// For ERROR_OFFSET: the offset the error is about.
    pub offset: Option<u64>,
}

/// Parses the payload of an error chunk (ERROR, ERROR_OFFSET, or an
/// unknown type with the error bit set).
pub fn parse_error_chunk(kind: u16, p: &[u8]) -> Result<ChunkError, String> {
    if p.len() < 6 {
        return Err(format!("error chunk of {} bytes (at least 6)", p.len()));
    }
    let errno = u32::from_be_bytes(p[0..4].try_into().expect("4 bytes"));
    let n = u16::from_be_bytes([p[4], p[5]]) as usize;
    if errno == 0 {
        return Err("error chunk with error 0".into());
    }
    if 6 + n > p.len() {
        return Err("error chunk message longer than the chunk".into());
    }
    let msg = String::from_utf8_lossy(&p[6..6 + n.min(MAX_MESSAGE)]).into_owned();
    let rest = &p[6 + n..];
    let offset = match kind {
        reply::ERROR if rest.is_empty() => None,
        reply::ERROR => return Err("error chunk with bytes after its message".into()),
        REPLY_ERROR_OFFSET if rest.len() == 8 => Some(u64::from_be_bytes(rest.try_into().expect("8 bytes"))),
        REPLY_ERROR_OFFSET => return Err("ERROR_OFFSET chunk without its 8-byte offset".into()),
        _ => None, // unknown error types: the payload after the message is theirs
    };
    Ok(ChunkError { errno, msg, offset })
}

/// The byte ranges a read's chunks covered: inside the request, never
/// overlapping (the protocol forbids it).
#[derive(Debug, Clone)]
pub struct Coverage {
    start: u64,
    end: u64,
    /// Sorted, disjoint.
    ranges: Vec<(u64, u64)>,
    covered: u64,
}

impl Coverage {
    /// For a read of `len` bytes at `offset`.
    pub fn new(offset: u64, len: u32) -> Coverage {
        Coverage { start: offset, end: offset + len as u64, ranges: Vec::new(), covered: 0 }
    }

    /// Records `[off, off + len)`; an error if empty, outside the request
    /// or overlapping an earlier chunk.
    pub fn add(&mut self, off: u64, len: u64) -> Result<(), String> {
        let end = off.checked_add(len).ok_or("chunk range overflows")?;
        if len == 0 {
            return Err("empty data or hole chunk".into());
        }
        if off < self.start || end > self.end {
            return Err(format!("chunk [{off}, {end}) outside the request [{}, {})", self.start, self.end));
        }
        let i = self.ranges.partition_point(|r| r.1 <= off);
        if i < self.ranges.len() && self.ranges[i].0 < end {
            return Err(format!("chunk [{off}, {end}) overlaps an earlier chunk"));
        }
        self.ranges.insert(i, (off, end));
        self.covered += len;
        Ok(())
    }

    /// Whether every byte of the request was covered.
    pub fn complete(&self) -> bool {
        self.covered == self.end - self.start
    }
}

// ---- in-flight requests ----------------------------------------------------

/// The state of one request in flight.
#[derive(Debug)]
pub struct SlotState {
    /// Command.
    pub kind: u16,
    /// Offset of the request.
    pub offset: u64,
    /// Read: where the data goes (request length).
    pub data: Vec<u8>,
    /// Read: what the chunks covered.
    pub coverage: Coverage,
    /// First error reported for it.
    pub error: Option<ClientError>,
    /// The final reply arrived (or the connection failed).
    pub done: bool,
}

/// A request in flight: its state and a condition variable for its caller.
#[derive(Debug)]
pub struct Slot {
    /// State.
    pub st: Mutex<SlotState>,
    cv: Condvar,
}

impl Slot {
    /// A slot for a request of `kind` over `[offset, offset + len)`.
    pub fn new(kind: u16, offset: u64, len: u32) -> Arc<Slot> {
        let data = if kind == cmd::READ { vec![0u8; len as usize] } else { Vec::new() };
        Arc::new(Slot {
            st: Mutex::new(SlotState {
                kind,
                offset,
                data,
                coverage: Coverage::new(offset, if kind == cmd::READ { len } else { 0 }),
                error: None,
                done: false,
            }),
            cv: Condvar::new(),
        })
    }

    fn finish(&self, err: Option<ClientError>) {
        let mut s = self.st.lock().expect("slot lock");
        if s.error.is_none() {
            s.error = err;
        }
        s.done = true;
        self.cv.notify_all();
    }
}

fn read_full<R: Read>(r: &mut R, b: &mut [u8]) -> Result<(), ClientError> {
    r.read_exact(b).map_err(|e| ClientError::Disconnected(e.to_string()))
}

/// Reads one reply (a simple reply, or one structured chunk) from `r`
/// and applies it to its request, found with `take(cookie, done)`: the
/// slot in flight under that cookie, removed from the table when `done`
/// (the final chunk). Returns `Err` for anything that breaks the
/// protocol; the caller then fails the connection. `structured`: whether
/// structured replies were negotiated.
pub fn read_reply<R: Read>(
    r: &mut R,
    structured: bool,
    mut take: impl FnMut(u64, bool) -> Option<Arc<Slot>>,
) -> Result<(), ClientError> {
    let proto = ClientError::Protocol;
    let mut h = [0u8; 20];
    read_full(r, &mut h[..4])?;
    let n = reply_header_len(h[..4].try_into().expect("4 bytes")).map_err(proto)?;
    read_full(r, &mut h[4..n])?;
    let hdr = parse_reply_header(&h[..n]).map_err(proto)?;
    match hdr {
        ReplyHeader::Simple { cookie, error } => {
            let slot = take(cookie, true)
                .ok_or_else(|| proto(format!("reply for cookie {cookie} not in flight")))?;
            let mut s = slot.st.lock().expect("slot lock");
            if error != 0 {
                drop(s);
                slot.finish(Some(ClientError::Server { errno: error, msg: String::new() }));
                return Ok(());
            }
            if s.kind == cmd::READ {
                // A simple reply to a read carries the whole range.
                let mut data = std::mem::take(&mut s.data);
                drop(s);
                let res = read_full(r, &mut data);
                let mut s = slot.st.lock().expect("slot lock");
                s.data = data;
                let len = s.data.len() as u64;
                let off = s.offset;
                if len > 0 {
                    s.coverage.add(off, len).map_err(proto)?;
                }
                drop(s);
                res?;
            } else {
                drop(s);
            }
            slot.finish(None);
            Ok(())
        }
        ReplyHeader::Chunk { flags, kind, cookie, len } => {
            if !structured {
                return Err(proto("structured reply chunk without structured replies negotiated".into()));
            }
            if flags & !reply::FLAG_DONE != 0 {
                return Err(proto(format!("unknown chunk flags {flags:#x}")));
            }
            let done = flags & reply::FLAG_DONE != 0;
            let slot = take(cookie, done)
                .ok_or_else(|| proto(format!("chunk for cookie {cookie} not in flight")))?;
            let fail = |slot: &Slot, e: String| {
                slot.finish(Some(ClientError::Protocol(e.clone())));
                Err(ClientError::Protocol(e))
            };
            let req_kind = slot.st.lock().expect("slot lock").kind;
            match kind {
                reply::NONE => {
                    if len != 0 || !done {
                        return fail(&slot, "NONE chunk with a payload or without DONE".into());
                    }
                }
                reply::OFFSET_DATA => {
                    if req_kind != cmd::READ {
                        return fail(&slot, "data chunk for a request that is not a read".into());
                    }
                    if len <= 8 || len > nbd::MAX_PAYLOAD + 8 {
                        return fail(&slot, format!("data chunk of {len} bytes"));
                    }
                    let mut o = [0u8; 8];
                    read_full(r, &mut o)?;
                    let off = u64::from_be_bytes(o);
                    let dlen = (len - 8) as u64;
                    let mut s = slot.st.lock().expect("slot lock");
                    if let Err(e) = s.coverage.add(off, dlen) {
                        drop(s);
                        return fail(&slot, e);
                    }
                    let at = (off - s.offset) as usize;
                    let mut data = std::mem::take(&mut s.data);
                    drop(s);
                    let res = read_full(r, &mut data[at..at + dlen as usize]);
                    slot.st.lock().expect("slot lock").data = data;
                    if let Err(e) = res {
                        slot.finish(Some(ClientError::Disconnected(
                            "connection lost in a data chunk".into(),
                        )));
                        return Err(e);
                    }
                }
                reply::OFFSET_HOLE => {
                    if req_kind != cmd::READ {
                        return fail(&slot, "hole chunk for a request that is not a read".into());
                    }
                    if len != 12 {
                        return fail(&slot, format!("hole chunk of {len} bytes (12 expected)"));
                    }
                    let mut p = [0u8; 12];
                    read_full(r, &mut p)?;
                    let off = u64::from_be_bytes(p[..8].try_into().expect("8 bytes"));
                    let hlen = u32::from_be_bytes(p[8..].try_into().expect("4 bytes")) as u64;
                    let mut s = slot.st.lock().expect("slot lock");
                    if let Err(e) = s.coverage.add(off, hlen) {
                        drop(s);
                        return fail(&slot, e);
                    }
                    let at = (off - s.offset) as usize;
                    s.data[at..at + hlen as usize].fill(0);
                }
                k if k & (1 << 15) != 0 => {
                    if len > (1 << 16) + 16 {
                        return fail(&slot, format!("error chunk of {len} bytes"));
                    }
                    let mut p = vec![0u8; len as usize];
                    read_full(r, &mut p)?;
                    let ce = match parse_error_chunk(k, &p) {
                        Ok(ce) => ce,
                        Err(e) => return fail(&slot, e),
                    };
                    if let Some(o) = ce.offset {
                        let s = slot.st.lock().expect("slot lock");
                        let end = s.offset + s.data.len() as u64;
                        if s.kind != cmd::READ || o < s.offset || o >= end {
                            drop(s);
                            return fail(&slot, "ERROR_OFFSET outside the request".into());
                        }
                    }
                    let mut s = slot.st.lock().expect("slot lock");
                    if s.error.is_none() {
                        s.error = Some(ClientError::Server { errno: ce.errno, msg: ce.msg });
                    }
                }
                other => {
                    return fail(&slot, format!("unexpected chunk type {other}"));
                }
            }
            if done {
                let mut s = slot.st.lock().expect("slot lock");
                if s.error.is_none() && s.kind == cmd::READ && !s.coverage.complete() {
                    drop(s);
                    return fail(&slot, "final chunk of a read that did not cover its range".into());
                }
                s.done = true;
                slot.cv.notify_all();
            }
            Ok(())
        }
    }
}

// ---- the handshake ---------------------------------------------------------

/// What the handshake learned about the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportInfo {
    /// Size in bytes.
    pub size: u64,
    /// Transmission flags.
    pub flags: u16,
    /// Structured replies negotiated.
    pub structured: bool,
    /// Minimum block size (1 if not told).
    pub min_block: u32,
    /// Preferred block size (4096 if not told).
    pub pref_block: u32,
    /// Largest request payload (32 MiB if not told).
    pub max_block: u32,
}

impl ExportInfo {
    /// The export refuses writes.
    pub fn read_only(&self) -> bool {
        self.flags & tflag::READ_ONLY != 0
    }
    /// FLUSH supported.
    pub fn can_flush(&self) -> bool {
        self.flags & tflag::SEND_FLUSH != 0
    }
    /// FUA supported.
    pub fn can_fua(&self) -> bool {
        self.flags & tflag::SEND_FUA != 0
    }
    /// TRIM supported.
    pub fn can_trim(&self) -> bool {
        self.flags & tflag::SEND_TRIM != 0
    }
    /// WRITE_ZEROES supported.
    pub fn can_zero(&self) -> bool {
        self.flags & tflag::SEND_WRITE_ZEROES != 0
    }
    /// FAST_ZERO supported.
    pub fn can_fast_zero(&self) -> bool {
        self.flags & tflag::SEND_FAST_ZERO != 0
    }
    /// Several connections see one another's writes and flushes.
    pub fn can_multi_conn(&self) -> bool {
        self.flags & tflag::CAN_MULTI_CONN != 0
    }
}

/// A stream to the server, either kind.
enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn connect(uri: &Uri) -> Result<Stream, ClientError> {
        let to = uri.describe();
        match &uri.transport {
            Transport::Unix(p) => {
                UnixStream::connect(p).map(Stream::Unix).map_err(|err| ClientError::Connect { to, err })
            }
            Transport::Tcp(h) => {
                let s = TcpStream::connect(h).map_err(|err| ClientError::Connect { to, err })?;
                let _ = s.set_nodelay(true);
                Ok(Stream::Tcp(s))
            }
        }
    }
    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(t),
            Stream::Tcp(s) => s.set_read_timeout(t),
        }
    }
    fn shutdown(&self) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(std::net::Shutdown::Both),
            Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(b),
            Stream::Tcp(s) => s.read(b),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(b),
            Stream::Tcp(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.flush(),
            Stream::Tcp(s) => s.flush(),
        }
    }
}

fn send_option(s: &mut impl Write, option: u32, data: &[u8]) -> io::Result<()> {
    let mut m = Vec::with_capacity(16 + data.len());
    m.extend_from_slice(&nbd::IHAVEOPT.to_be_bytes());
    m.extend_from_slice(&option.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(data);
    s.write_all(&m)
}

/// Reads one option reply: (type, data). Checks the magic and the option.
fn read_option_reply(s: &mut impl Read, option: u32) -> Result<(u32, Vec<u8>), String> {
    let mut h = [0u8; 20];
    s.read_exact(&mut h).map_err(|e| format!("connection lost reading an option reply: {e}"))?;
    if u64::from_be_bytes(h[..8].try_into().expect("8 bytes")) != nbd::REPLY_MAGIC {
        return Err("option reply without the reply magic".into());
    }
    let o = u32::from_be_bytes(h[8..12].try_into().expect("4 bytes"));
    if o != option {
        return Err(format!("reply to option {o} while option {option} was asked"));
    }
    let kind = u32::from_be_bytes(h[12..16].try_into().expect("4 bytes"));
    let len = u32::from_be_bytes(h[16..20].try_into().expect("4 bytes"));
    if len > MAX_OPTION_REPLY {
        return Err(format!("option reply of {len} bytes"));
    }
    let mut d = vec![0u8; len as usize];
    s.read_exact(&mut d).map_err(|e| format!("connection lost reading an option reply: {e}"))?;
    Ok((kind, d))
}

fn option_error(kind: u32, d: &[u8], export: &str) -> String {
    let msg = String::from_utf8_lossy(&d[..d.len().min(MAX_MESSAGE)]).into_owned();
    let what = match kind {
        rep::ERR_UNKNOWN => format!("the server has no export named '{export}'"),
        ERR_TLS_REQD => "the server requires TLS, which this client does not speak".to_string(),
        ERR_POLICY => "refused by the server's policy".to_string(),
        ERR_SHUTDOWN => "the server is shutting down".to_string(),
        rep::ERR_UNSUP => "option not supported".to_string(),
        k => format!("option refused (reply type {k:#x})"),
    };
    if msg.is_empty() {
        what
    } else {
        format!("{what}: {msg}")
    }
}

/// Parses an `NBD_INFO_EXPORT` or `NBD_INFO_BLOCK_SIZE` reply into `info`
/// (others are ignored). Returns whether the export information was seen.
pub fn parse_info(d: &[u8], info: &mut ExportInfo) -> Result<bool, String> {
    if d.len() < 2 {
        return Err("INFO reply without its type".into());
    }
    match u16::from_be_bytes([d[0], d[1]]) {
        nbd::info::EXPORT => {
            if d.len() != 12 {
                return Err(format!("INFO_EXPORT of {} bytes (12 expected)", d.len()));
            }
            info.size = u64::from_be_bytes(d[2..10].try_into().expect("8 bytes"));
            info.flags = u16::from_be_bytes([d[10], d[11]]);
            Ok(true)
        }
        nbd::info::BLOCK_SIZE => {
            if d.len() != 14 {
                return Err(format!("INFO_BLOCK_SIZE of {} bytes (14 expected)", d.len()));
            }
            let g = |o: usize| u32::from_be_bytes(d[o..o + 4].try_into().expect("4 bytes"));
            let (min, pref, max) = (g(2), g(6), g(10));
            if !min.is_power_of_two() || min > 65536 || !pref.is_power_of_two() || pref < min || max < pref {
                return Err(format!("block sizes min {min} preferred {pref} max {max} are not valid"));
            }
            info.min_block = min;
            info.pref_block = pref;
            info.max_block = max;
            Ok(false)
        }
        _ => Ok(false),
    }
}

/// The fixed newstyle handshake on `s` for `export`: structured replies
/// when the server has them, then GO (or EXPORT_NAME for servers without
/// it). `to` names the server in errors.
fn handshake<S: Read + Write>(s: &mut S, export: &str, to: &str) -> Result<ExportInfo, ClientError> {
    let err = |why: String| ClientError::Handshake { to: to.to_string(), why };
    let io = |e: io::Error| err(format!("connection lost: {e}"));
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello[..16]).map_err(io)?;
    if u64::from_be_bytes(hello[..8].try_into().expect("8 bytes")) != nbd::NBDMAGIC {
        return Err(err("not an NBD server (no NBDMAGIC)".into()));
    }
    let second = u64::from_be_bytes(hello[8..16].try_into().expect("8 bytes"));
    if second == OLDSTYLE_MAGIC {
        return Err(err("oldstyle NBD servers are not supported".into()));
    }
    if second != nbd::IHAVEOPT {
        return Err(err("unknown NBD handshake".into()));
    }
    s.read_exact(&mut hello[16..18]).map_err(io)?;
    let sflags = u16::from_be_bytes([hello[16], hello[17]]);
    let fixed = sflags & nbd::FLAG_FIXED_NEWSTYLE != 0;
    let no_zeroes = sflags & nbd::FLAG_NO_ZEROES != 0;
    let mut cflags = 0u32;
    if fixed {
        cflags |= nbd::FLAG_C_FIXED_NEWSTYLE;
    }
    if no_zeroes {
        cflags |= nbd::FLAG_C_NO_ZEROES;
    }
    s.write_all(&cflags.to_be_bytes()).map_err(io)?;
    let mut info = ExportInfo {
        size: 0,
        flags: 0,
        structured: false,
        min_block: 1,
        pref_block: 4096,
        max_block: nbd::MAX_PAYLOAD,
    };
    if fixed {
        send_option(s, opt::STRUCTURED_REPLY, &[]).map_err(io)?;
        let (k, d) = read_option_reply(s, opt::STRUCTURED_REPLY).map_err(err)?;
        match k {
            rep::ACK => info.structured = true,
            k if k & (1 << 31) != 0 => {}
            k => return Err(err(format!("unexpected reply {k} to STRUCTURED_REPLY ({} bytes)", d.len()))),
        }
        let mut g = (export.len() as u32).to_be_bytes().to_vec();
        g.extend_from_slice(export.as_bytes());
        g.extend_from_slice(&1u16.to_be_bytes());
        g.extend_from_slice(&nbd::info::BLOCK_SIZE.to_be_bytes());
        send_option(s, opt::GO, &g).map_err(io)?;
        let mut have_export = false;
        for _ in 0..1024 {
            let (k, d) = read_option_reply(s, opt::GO).map_err(err)?;
            match k {
                rep::INFO => have_export |= parse_info(&d, &mut info).map_err(err)?,
                rep::ACK => {
                    if !have_export {
                        return Err(err("GO acknowledged without the export's size".into()));
                    }
                    return finish_info(info).map_err(err);
                }
                rep::ERR_UNSUP => break, // an old server: EXPORT_NAME below
                k if k & (1 << 31) != 0 => return Err(err(option_error(k, &d, export))),
                k => return Err(err(format!("unexpected reply {k} to GO"))),
            }
        }
    }
    // EXPORT_NAME: no error reply is possible; an unknown name closes the connection.
    send_option(s, opt::EXPORT_NAME, export.as_bytes()).map_err(io)?;
    let mut b = [0u8; 10];
    s.read_exact(&mut b).map_err(|e| {
        err(format!("the server closed the connection after EXPORT_NAME '{export}' (no such export?): {e}"))
    })?;
    info.size = u64::from_be_bytes(b[..8].try_into().expect("8 bytes"));
    info.flags = u16::from_be_bytes([b[8], b[9]]);
    if !no_zeroes {
        let mut z = [0u8; 124];
        s.read_exact(&mut z).map_err(io)?;
    }
    finish_info(info).map_err(err)
}

fn finish_info(mut info: ExportInfo) -> Result<ExportInfo, String> {
    if info.flags & tflag::HAS_FLAGS == 0 {
        info.flags = tflag::HAS_FLAGS; // no optional features
    }
    info.max_block = info.max_block.min(nbd::MAX_PAYLOAD);
    if info.size > i64::MAX as u64 {
        return Err(format!("export size {} is not valid", info.size));
    }
    Ok(info)
}

// ---- connections -----------------------------------------------------------

struct Conn {
    writer: Mutex<Stream>,
    /// Kept to shut the socket down (wakes the reader).
    control: Stream,
    inflight: Arc<Mutex<HashMap<u64, Arc<Slot>>>>,
    /// Why the connection failed, once it has.
    dead: Arc<Mutex<Option<String>>>,
    next_cookie: AtomicU64,
    info: ExportInfo,
    /// The reader thread, joined when the connection is dropped (its
    /// socket shut down first), so no thread outlives its client.
    reader: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Conn {
    fn open(uri: &Uri, handshake_timeout: Duration) -> Result<Arc<Conn>, ClientError> {
        let to = uri.describe();
        let mut s = Stream::connect(uri)?;
        s.set_read_timeout(Some(handshake_timeout))
            .map_err(|err| ClientError::Connect { to: to.clone(), err })?;
        let info = handshake(&mut s, &uri.export, &to)?;
        s.set_read_timeout(None).map_err(|err| ClientError::Connect { to: to.clone(), err })?;
        let clone = |s: &Stream| s.try_clone().map_err(|err| ClientError::Connect { to: to.clone(), err });
        // Replies are read through a buffer: one receive takes every reply
        // (header, offset, data) the server has sent, not one per field.
        let mut reader = io::BufReader::with_capacity(REPLY_BUFFER, clone(&s)?);
        let control = clone(&s)?;
        let inflight = Arc::new(Mutex::new(HashMap::new()));
        let dead = Arc::new(Mutex::new(None));
        let (conn_inflight, conn_dead) = (inflight.clone(), dead.clone());
        let structured = info.structured;
        let handle = std::thread::Builder::new()
            .name("nbd-client-reader".into())
            .spawn(move || {
                let why = loop {
                    let r = read_reply(&mut reader, structured, |cookie, done| {
                        let mut m = inflight.lock().expect("inflight lock");
                        if done {
                            m.remove(&cookie)
                        } else {
                            m.get(&cookie).cloned()
                        }
                    });
                    if let Err(e) = r {
                        break e.to_string();
                    }
                };
                // Fail everything in flight, and what comes after.
                *dead.lock().expect("dead lock") = Some(why.clone());
                reader.get_ref().shutdown();
                let pending: Vec<_> =
                    inflight.lock().expect("inflight lock").drain().map(|(_, s)| s).collect();
                for s in pending {
                    s.finish(Some(ClientError::Disconnected(why.clone())));
                }
            })
            .map_err(|err| ClientError::Connect { to, err })?;
        Ok(Arc::new(Conn {
            writer: Mutex::new(s),
            control,
            inflight: conn_inflight,
            dead: conn_dead,
            next_cookie: AtomicU64::new(1),
            info,
            reader: Mutex::new(Some(handle)),
        }))
    }

    fn dead(&self) -> Option<String> {
        self.dead.lock().expect("dead lock").clone()
    }

    fn kill(&self, why: &str) {
        {
            let mut d = self.dead.lock().expect("dead lock");
            if d.is_none() {
                *d = Some(why.to_string());
            }
        }
        self.control.shutdown();
    }

    /// Sends one request and waits for its reply. Returns the read data.
    fn call(
        &self,
        kind: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: &[u8],
        timeout: Option<Duration>,
    ) -> Result<Vec<u8>, ClientError> {
        if let Some(why) = self.dead() {
            return Err(ClientError::Disconnected(why));
        }
        let cookie = self.next_cookie.fetch_add(1, Ordering::Relaxed);
        let slot = Slot::new(kind, offset, len);
        self.inflight.lock().expect("inflight lock").insert(cookie, slot.clone());
        // A connection that failed after the check above: its reader has
        // drained the table already, so fail this request here.
        if let Some(why) = self.dead() {
            self.inflight.lock().expect("inflight lock").remove(&cookie);
            return Err(ClientError::Disconnected(why));
        }
        let req = Request { flags, kind, cookie, offset, length: len };
        let sent = {
            let mut w = self.writer.lock().expect("writer lock");
            w.write_all(&req.encode()).and_then(|_| w.write_all(payload))
        };
        if let Err(e) = sent {
            self.kill(&format!("sending a request: {e}"));
            self.inflight.lock().expect("inflight lock").remove(&cookie);
            return Err(ClientError::Disconnected(e.to_string()));
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut s = slot.st.lock().expect("slot lock");
        while !s.done {
            match deadline {
                None => s = slot.cv.wait(s).expect("slot lock"),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        drop(s);
                        let t = timeout.expect("deadline has a timeout");
                        self.kill(&format!("no reply within {t:?}"));
                        self.inflight.lock().expect("inflight lock").remove(&cookie);
                        return Err(ClientError::Timeout(t));
                    }
                    s = slot.cv.wait_timeout(s, d - now).expect("slot lock").0;
                }
            }
        }
        match s.error.take() {
            Some(e) => Err(e),
            None => Ok(std::mem::take(&mut s.data)),
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Tell the server we leave, then wake the reader.
        if self.dead().is_none() {
            if let Ok(mut w) = self.writer.lock() {
                let req = Request { flags: 0, kind: cmd::DISC, cookie: 0, offset: 0, length: 0 };
                let _ = w.write_all(&req.encode());
            }
        }
        self.control.shutdown();
        // The reader holds no reference to this connection (only its table
        // and its failure cell), so this never runs on the reader thread;
        // the shutdown above ends its blocking read.
        let handle = self.reader.get_mut().ok().and_then(Option::take);
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

/// Options of a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Connections to open (only one unless the server allows multi-conn).
    pub connections: usize,
    /// Give up on a request (and its connection) after this long.
    pub timeout: Option<Duration>,
    /// Timeout of the handshake.
    pub handshake_timeout: Duration,
    /// Least time between two reconnection attempts of one connection.
    pub reconnect_every: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            connections: 4,
            timeout: Some(Duration::from_secs(60)),
            handshake_timeout: Duration::from_secs(30),
            reconnect_every: Duration::from_secs(1),
        }
    }
}

struct ConnSlot {
    conn: Mutex<Option<Arc<Conn>>>,
    last_attempt: Mutex<Option<Instant>>,
}

/// An NBD client over one or more connections. Every method takes `&self`
/// and may be called from many threads: requests are pipelined on each
/// connection and spread over the connections in turn.
pub struct Client {
    uri: Uri,
    opts: ClientOptions,
    info: ExportInfo,
    conns: Vec<ConnSlot>,
    next: AtomicUsize,
    reconnects: AtomicU64,
    closed: AtomicBool,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("uri", &self.uri).field("info", &self.info).finish()
    }
}

impl Client {
    /// Connects to `uri` (see [`Uri::parse`]).
    pub fn connect(uri: &str, opts: ClientOptions) -> Result<Client, ClientError> {
        Self::connect_to(Uri::parse(uri)?, opts)
    }

    /// Connects to a parsed URI.
    pub fn connect_to(uri: Uri, opts: ClientOptions) -> Result<Client, ClientError> {
        let first = Conn::open(&uri, opts.handshake_timeout)?;
        let info = first.info;
        let n = if info.can_multi_conn() { opts.connections.max(1) } else { 1 };
        let mut conns = vec![ConnSlot { conn: Mutex::new(Some(first)), last_attempt: Mutex::new(None) }];
        for _ in 1..n {
            let c = Conn::open(&uri, opts.handshake_timeout)?;
            check_same(&info, &c.info, &uri)?;
            conns.push(ConnSlot { conn: Mutex::new(Some(c)), last_attempt: Mutex::new(None) });
        }
        Ok(Client {
            uri,
            opts,
            info,
            conns,
            next: AtomicUsize::new(0),
            reconnects: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        })
    }

    /// What the handshake said about the export.
    pub fn info(&self) -> &ExportInfo {
        &self.info
    }

    /// Export size in bytes.
    pub fn size(&self) -> u64 {
        self.info.size
    }

    /// The URI, for messages.
    pub fn describe(&self) -> String {
        self.uri.describe()
    }

    /// Connections open now (dead ones not counted).
    pub fn connections(&self) -> usize {
        self.conns
            .iter()
            .filter(|c| c.conn.lock().expect("conn lock").as_ref().is_some_and(|c| c.dead().is_none()))
            .count()
    }

    /// Times a lost connection was opened again.
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    /// A live connection, reconnecting slot `i` if its connection died
    /// (at most once per `reconnect_every`).
    fn conn(&self, i: usize) -> Result<Arc<Conn>, ClientError> {
        let slot = &self.conns[i];
        let mut g = slot.conn.lock().expect("conn lock");
        let why = match g.as_ref() {
            Some(c) => match c.dead() {
                None => return Ok(c.clone()),
                Some(why) => why,
            },
            None => "closed".to_string(),
        };
        if self.closed.load(Ordering::Acquire) {
            return Err(ClientError::Disconnected("the client was closed".into()));
        }
        {
            let mut last = slot.last_attempt.lock().expect("attempt lock");
            if last.is_some_and(|t| t.elapsed() < self.opts.reconnect_every) {
                return Err(ClientError::Disconnected(why));
            }
            *last = Some(Instant::now());
        }
        let c = Conn::open(&self.uri, self.opts.handshake_timeout)
            .map_err(|e| ClientError::Disconnected(format!("{why}; reconnecting: {e}")))?;
        check_same(&self.info, &c.info, &self.uri)
            .map_err(|e| ClientError::Disconnected(format!("{why}; reconnecting: {e}")))?;
        self.reconnects.fetch_add(1, Ordering::Relaxed);
        *g = Some(c.clone());
        Ok(c)
    }

    fn pick(&self) -> Result<Arc<Conn>, ClientError> {
        let n = self.conns.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let mut last = None;
        for k in 0..n {
            match self.conn((start + k) % n) {
                Ok(c) => return Ok(c),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("at least one connection"))
    }

    fn check(&self, off: u64, len: u64) -> Result<(), ClientError> {
        match off.checked_add(len) {
            Some(end) if end <= self.info.size => Ok(()),
            _ => Err(ClientError::OutOfRange { size: self.info.size }),
        }
    }

    fn max_request(&self) -> usize {
        let m = self.info.max_block.max(self.info.min_block).max(4096) as usize;
        // Keep requests whole multiples of the minimum block size.
        m / self.info.min_block as usize * self.info.min_block as usize
    }

    /// Reads `buf.len()` bytes at `off`.
    pub fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), ClientError> {
        self.check(off, buf.len() as u64)?;
        let max = self.max_request();
        let mut done = 0;
        while done < buf.len() {
            let n = (buf.len() - done).min(max);
            let c = self.pick()?;
            let data = c.call(cmd::READ, 0, off + done as u64, n as u32, &[], self.opts.timeout)?;
            if data.len() != n {
                return Err(ClientError::Protocol(format!("read returned {} bytes of {n}", data.len())));
            }
            buf[done..done + n].copy_from_slice(&data);
            done += n;
        }
        Ok(())
    }

    /// Writes `data` at `off`; with `fua`, durable on return (FUA, or a
    /// flush after it when the server has no FUA).
    pub fn write(&self, off: u64, data: &[u8], fua: bool) -> Result<(), ClientError> {
        if self.info.read_only() {
            return Err(ClientError::ReadOnly);
        }
        self.check(off, data.len() as u64)?;
        let max = self.max_request();
        let flags = if fua && self.info.can_fua() { cflag::FUA } else { 0 };
        let mut done = 0;
        while done < data.len() {
            let n = (data.len() - done).min(max);
            let c = self.pick()?;
            c.call(cmd::WRITE, flags, off + done as u64, n as u32, &data[done..done + n], self.opts.timeout)?;
            done += n;
        }
        if fua && !self.info.can_fua() {
            self.flush()?;
        }
        Ok(())
    }

    /// Makes every completed write durable (a no-op if the server has no FLUSH).
    pub fn flush(&self) -> Result<(), ClientError> {
        if !self.info.can_flush() {
            return Ok(());
        }
        // With multi-conn one flush covers every connection's completed
        // writes; otherwise there is only one connection.
        let c = self.pick()?;
        c.call(cmd::FLUSH, 0, 0, 0, &[], self.opts.timeout).map(|_| ())
    }

    /// Discards `[off, off + len)` (advisory: a no-op if the server has no TRIM).
    pub fn trim(&self, off: u64, len: u64, fua: bool) -> Result<(), ClientError> {
        if self.info.read_only() {
            return Err(ClientError::ReadOnly);
        }
        self.check(off, len)?;
        if !self.info.can_trim() {
            return Ok(());
        }
        let flags = if fua && self.info.can_fua() { cflag::FUA } else { 0 };
        let step = (u32::MAX as u64 / 2) / self.info.min_block as u64 * self.info.min_block as u64;
        let mut at = off;
        while at < off + len {
            let n = (off + len - at).min(step);
            self.pick()?.call(cmd::TRIM, flags, at, n as u32, &[], self.opts.timeout)?;
            at += n;
        }
        if fua && !self.info.can_fua() {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes zeros over `[off, off + len)`: WRITE_ZEROES when the server
    /// has it, else zero-filled writes (refused with `fast`).
    pub fn write_zeroes(&self, off: u64, len: u64, fast: bool, fua: bool) -> Result<(), ClientError> {
        if self.info.read_only() {
            return Err(ClientError::ReadOnly);
        }
        self.check(off, len)?;
        if self.info.can_zero() && (!fast || self.info.can_fast_zero()) {
            let mut flags = if fua && self.info.can_fua() { cflag::FUA } else { 0 };
            if fast {
                flags |= cflag::FAST_ZERO;
            }
            let step = (u32::MAX as u64 / 2) / self.info.min_block as u64 * self.info.min_block as u64;
            let mut at = off;
            while at < off + len {
                let n = (off + len - at).min(step);
                self.pick()?.call(cmd::WRITE_ZEROES, flags, at, n as u32, &[], self.opts.timeout)?;
                at += n;
            }
            if fua && !self.info.can_fua() {
                self.flush()?;
            }
            return Ok(());
        }
        if fast {
            return Err(ClientError::Server { errno: nbd::errno::ENOTSUP, msg: "no fast zeroing".into() });
        }
        let zeros = vec![0u8; self.max_request().min(1 << 20)];
        let mut at = off;
        while at < off + len {
            let n = ((off + len - at) as usize).min(zeros.len());
            self.write(at, &zeros[..n], false)?;
            at += n as u64;
        }
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    /// Disconnects every connection (later requests fail).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        for c in &self.conns {
            c.conn.lock().expect("conn lock").take();
        }
    }
}

fn check_same(a: &ExportInfo, b: &ExportInfo, uri: &Uri) -> Result<(), ClientError> {
    if a.size != b.size {
        return Err(ClientError::Handshake {
            to: uri.describe(),
            why: format!("the export's size changed from {} to {} bytes", a.size, b.size),
        });
    }
    if a.read_only() != b.read_only() {
        return Err(ClientError::Handshake {
            to: uri.describe(),
            why: "the export's read-only flag changed".into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_uris() {
        let u = Uri::parse("nbd+unix:///exp%20a?socket=/tmp/s.sock").unwrap();
        assert_eq!(u, Uri { transport: Transport::Unix("/tmp/s.sock".into()), export: "exp a".into() });
        let u = Uri::parse("nbd+unix:///?socket=/tmp/s").unwrap();
        assert_eq!(u.export, "");
        let u = Uri::parse("nbd://127.0.0.1:10900/name").unwrap();
        assert_eq!(u, Uri { transport: Transport::Tcp("127.0.0.1:10900".into()), export: "name".into() });
        assert_eq!(
            Uri::parse("nbd://localhost").unwrap().transport,
            Transport::Tcp("localhost:10809".into())
        );
        assert_eq!(Uri::parse("nbd://[::1]/x").unwrap().transport, Transport::Tcp("[::1]:10809".into()));
        for bad in [
            "nbds://h/x",
            "nbd+unix:///x",
            "nbd://",
            "http://x",
            "nbd+unix://h/x?socket=/s",
            "nope",
            "nbd://h/%zz",
        ] {
            assert!(Uri::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn coverage_rejects_overlap_and_outside() {
        let mut c = Coverage::new(100, 50);
        c.add(100, 10).unwrap();
        c.add(130, 20).unwrap();
        assert!(c.add(105, 10).is_err());
        assert!(c.add(120, 11).is_err());
        assert!(c.add(90, 5).is_err());
        assert!(c.add(149, 2).is_err());
        assert!(c.add(110, 0).is_err());
        assert!(!c.complete());
        c.add(110, 20).unwrap();
        assert!(c.complete());
    }

    fn chunk(cookie: u64, flags: u16, kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = nbd::chunk_header(cookie, flags, kind, payload.len() as u32).to_vec();
        v.extend_from_slice(payload);
        v
    }

    fn run(bytes: &[u8], slots: &[(u64, Arc<Slot>)]) -> Result<(), ClientError> {
        let mut map: HashMap<u64, Arc<Slot>> = slots.iter().cloned().collect();
        let mut r = io::Cursor::new(bytes.to_vec());
        while (r.position() as usize) < bytes.len() {
            read_reply(&mut r, true, |c, done| if done { map.remove(&c) } else { map.get(&c).cloned() })?;
        }
        Ok(())
    }

    #[test]
    fn assembles_reads_from_data_and_holes_in_any_order() {
        let s = Slot::new(cmd::READ, 4096, 8192);
        let mut b = Vec::new();
        let mut d = (8192u64).to_be_bytes().to_vec();
        d.extend_from_slice(&[7u8; 4096]);
        b.extend(chunk(5, 0, reply::OFFSET_DATA, &d));
        let mut h = 4096u64.to_be_bytes().to_vec();
        h.extend_from_slice(&4096u32.to_be_bytes());
        b.extend(chunk(5, reply::FLAG_DONE, reply::OFFSET_HOLE, &h));
        s.st.lock().unwrap().data.fill(0xee);
        run(&b, &[(5, s.clone())]).unwrap();
        let st = s.st.lock().unwrap();
        assert!(st.done && st.error.is_none());
        assert!(st.data[..4096].iter().all(|&x| x == 0) && st.data[4096..].iter().all(|&x| x == 7));
    }

    #[test]
    fn rejects_malformed_replies() {
        let read = || Slot::new(cmd::READ, 0, 4096);
        // Final chunk of a read that left a gap.
        let mut d = 0u64.to_be_bytes().to_vec();
        d.extend_from_slice(&[1u8; 100]);
        let s = read();
        assert!(matches!(
            run(&chunk(1, reply::FLAG_DONE, reply::OFFSET_DATA, &d), &[(1, s.clone())]),
            Err(ClientError::Protocol(_))
        ));
        assert!(s.st.lock().unwrap().error.is_some());
        // Data past the request.
        let mut d = 4000u64.to_be_bytes().to_vec();
        d.extend_from_slice(&[1u8; 200]);
        assert!(run(&chunk(1, reply::FLAG_DONE, reply::OFFSET_DATA, &d), &[(1, read())]).is_err());
        // Unknown cookie, bad magic, NONE with payload, unknown flags, error 0.
        assert!(run(&chunk(9, reply::FLAG_DONE, reply::NONE, &[]), &[(1, read())]).is_err());
        assert!(run(&[0u8; 20], &[(1, read())]).is_err());
        assert!(run(&chunk(1, reply::FLAG_DONE, reply::NONE, &[1]), &[(1, read())]).is_err());
        assert!(run(&chunk(1, 0x80 | reply::FLAG_DONE, reply::NONE, &[]), &[(1, read())]).is_err());
        let mut e = 0u32.to_be_bytes().to_vec();
        e.extend_from_slice(&0u16.to_be_bytes());
        assert!(run(&chunk(1, reply::FLAG_DONE, reply::ERROR, &e), &[(1, read())]).is_err());
        // A well-formed error: the request fails, the stream goes on.
        let mut e = 5u32.to_be_bytes().to_vec();
        e.extend_from_slice(&3u16.to_be_bytes());
        e.extend_from_slice(b"bad");
        let s = read();
        run(&chunk(1, reply::FLAG_DONE, reply::ERROR, &e), &[(1, s.clone())]).unwrap();
        let st = s.st.lock().unwrap();
        assert!(matches!(&st.error, Some(ClientError::Server { errno: 5, msg }) if msg == "bad"));
        // Truncated stream.
        assert!(run(&chunk(1, reply::FLAG_DONE, reply::NONE, &[])[..10], &[(1, read())]).is_err());
    }
}
