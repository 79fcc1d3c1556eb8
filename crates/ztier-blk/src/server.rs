//! The NBD server: one thread reads each connection's requests, a pool of
//! workers per connection runs them on the engine (reads first), replies
//! go out under a per-connection writer lock in completion order.
//!
//! Malformed input never takes the server down: a bad option is answered
//! with an error reply, a bad request with an error reply, a wrong magic or
//! an oversized payload ends that connection only.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::device::Device;
use crate::engine::{BlkError, BlockState};
use crate::nbd::{self, cflag, cmd, errno, info, opt, rep, reply, tflag, Request, Session};

/// How the export is offered.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Export name (the empty name also selects it).
    pub name: String,
    /// Description sent on request.
    pub description: String,
    /// Refuse writes.
    pub read_only: bool,
    /// Worker threads per connection.
    pub threads: usize,
}

/// Where to listen.
pub enum Listener {
    /// A unix socket.
    Unix(UnixListener),
    /// TCP.
    Tcp(TcpListener),
}

/// A connection, either kind.
pub enum Conn {
    /// Unix.
    Unix(UnixStream),
    /// TCP.
    Tcp(TcpStream),
}

impl Conn {
    fn try_clone(&self) -> io::Result<Conn> {
        Ok(match self {
            Conn::Unix(s) => Conn::Unix(s.try_clone()?),
            Conn::Tcp(s) => Conn::Tcp(s.try_clone()?),
        })
    }
    fn shutdown(&self) {
        let _ = match self {
            Conn::Unix(s) => s.shutdown(std::net::Shutdown::Both),
            Conn::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

impl Read for Conn {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Unix(s) => s.read(b),
            Conn::Tcp(s) => s.read(b),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Unix(s) => s.write(b),
            Conn::Tcp(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Conn::Unix(s) => s.flush(),
            Conn::Tcp(s) => s.flush(),
        }
    }
}

/// Server-wide counters.
#[derive(Debug, Default)]
pub struct ServerStats {
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Requests answered.
    pub requests: AtomicU64,
    /// Requests answered with an error.
    pub errors: AtomicU64,
    /// Connections dropped for protocol violations.
    pub protocol_errors: AtomicU64,
}

/// Accepts connections until `stop` is set, each on its own thread. A
/// maintenance thread calls [`Device::maintain`] (for the engine: seals
/// aged extent buffers and runs the cleaner).
pub fn serve<D: Device + ?Sized>(
    engine: Arc<D>,
    listener: Listener,
    cfg: ServeConfig,
    stop: Arc<AtomicBool>,
    stats: Arc<ServerStats>,
) -> io::Result<()> {
    let maint = {
        let (engine, stop) = (engine.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(100));
                engine.maintain();
            }
        })
    };
    match &listener {
        Listener::Unix(l) => l.set_nonblocking(true)?,
        Listener::Tcp(l) => l.set_nonblocking(true)?,
    }
    while !stop.load(Ordering::Acquire) {
        let conn = match &listener {
            Listener::Unix(l) => l.accept().map(|(s, _)| Conn::Unix(s)),
            Listener::Tcp(l) => l.accept().map(|(s, _)| {
                let _ = s.set_nodelay(true);
                Conn::Tcp(s)
            }),
        };
        match conn {
            Ok(c) => {
                match &c {
                    Conn::Unix(s) => s.set_nonblocking(false)?,
                    Conn::Tcp(s) => s.set_nonblocking(false)?,
                }
                stats.connections.fetch_add(1, Ordering::Relaxed);
                let (engine, cfg, stats) = (engine.clone(), cfg.clone(), stats.clone());
                std::thread::spawn(move || {
                    if let Err(e) = handle(c, &engine, &cfg, &stats) {
                        if e.kind() != io::ErrorKind::UnexpectedEof && e.kind() != io::ErrorKind::BrokenPipe {
                            eprintln!("ztier blk: connection ended: {e}");
                        }
                    }
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(20)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let _ = maint.join();
    Ok(())
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

fn protocol_error(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

/// Serves one connection: handshake, then transmission.
pub fn handle<D: Device + ?Sized>(
    mut c: Conn,
    engine: &Arc<D>,
    cfg: &ServeConfig,
    stats: &ServerStats,
) -> io::Result<()> {
    let r = match negotiate(&mut c, &**engine, cfg) {
        Ok(Some(s)) => transmission(c, engine, s, cfg, stats),
        Ok(None) => Ok(()),
        Err(e) => {
            c.shutdown();
            Err(e)
        }
    };
    if let Err(e) = &r {
        if e.kind() == io::ErrorKind::InvalidData {
            stats.protocol_errors.fetch_add(1, Ordering::Relaxed);
        }
    }
    r
}

fn transmission_flags<D: Device + ?Sized>(engine: &D, cfg: &ServeConfig, structured: bool) -> u16 {
    let mut f = tflag::HAS_FLAGS | tflag::SEND_FLUSH | tflag::SEND_FUA | tflag::CAN_MULTI_CONN;
    if cfg.read_only || engine.read_only() {
        f |= tflag::READ_ONLY;
    } else {
        f |= tflag::SEND_TRIM | tflag::SEND_WRITE_ZEROES | tflag::SEND_FAST_ZERO;
    }
    if structured {
        f |= tflag::SEND_DF;
    }
    f
}

/// The handshake. `Ok(None)`: the client aborted.
fn negotiate<D: Device + ?Sized>(c: &mut Conn, engine: &D, cfg: &ServeConfig) -> io::Result<Option<Session>> {
    let mut hello = Vec::with_capacity(18);
    hello.extend_from_slice(&nbd::NBDMAGIC.to_be_bytes());
    hello.extend_from_slice(&nbd::IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(nbd::FLAG_FIXED_NEWSTYLE | nbd::FLAG_NO_ZEROES).to_be_bytes());
    c.write_all(&hello)?;
    let cflags = read_u32(c)?;
    if cflags & !(nbd::FLAG_C_FIXED_NEWSTYLE | nbd::FLAG_C_NO_ZEROES) != 0 {
        return Err(protocol_error("unknown client flags"));
    }
    let no_zeroes = cflags & nbd::FLAG_C_NO_ZEROES != 0;
    let mut structured = false;
    let mut base_allocation = false;
    let known = |name: &str| name.is_empty() || name == cfg.name;
    for _ in 0..10_000 {
        let mut h = [0u8; 16];
        c.read_exact(&mut h)?;
        if u64::from_be_bytes(h[0..8].try_into().expect("8")) != nbd::IHAVEOPT {
            return Err(protocol_error("option without IHAVEOPT"));
        }
        let option = u32::from_be_bytes(h[8..12].try_into().expect("4"));
        let len = u32::from_be_bytes(h[12..16].try_into().expect("4"));
        if len > nbd::MAX_OPTION {
            return Err(protocol_error("option data too large"));
        }
        let mut d = vec![0u8; len as usize];
        c.read_exact(&mut d)?;
        let send = |c: &mut Conn, kind: u32, data: &[u8]| c.write_all(&nbd::option_reply(option, kind, data));
        match option {
            opt::EXPORT_NAME => {
                let name = String::from_utf8_lossy(&d).to_string();
                if !known(&name) {
                    return Err(protocol_error("unknown export (EXPORT_NAME cannot report errors)"));
                }
                let flags = transmission_flags(engine, cfg, structured);
                let mut b = Vec::new();
                b.extend_from_slice(&engine.size().to_be_bytes());
                b.extend_from_slice(&flags.to_be_bytes());
                if !no_zeroes {
                    b.extend_from_slice(&[0u8; 124]);
                }
                c.write_all(&b)?;
                return Ok(Some(Session { size: engine.size(), flags, structured, base_allocation }));
            }
            opt::ABORT => {
                let _ = send(c, rep::ACK, &[]);
                return Ok(None);
            }
            opt::LIST => {
                if !d.is_empty() {
                    send(c, rep::ERR_INVALID, b"LIST takes no data")?;
                    continue;
                }
                let mut e = (cfg.name.len() as u32).to_be_bytes().to_vec();
                e.extend_from_slice(cfg.name.as_bytes());
                send(c, rep::SERVER, &e)?;
                send(c, rep::ACK, &[])?;
            }
            opt::INFO | opt::GO => {
                let Some(g) = nbd::parse_go(&d) else {
                    send(c, rep::ERR_INVALID, b"malformed INFO/GO request")?;
                    continue;
                };
                if !known(&g.name) {
                    send(c, rep::ERR_UNKNOWN, b"no such export")?;
                    continue;
                }
                let flags = transmission_flags(engine, cfg, structured);
                let mut e = info::EXPORT.to_be_bytes().to_vec();
                e.extend_from_slice(&engine.size().to_be_bytes());
                e.extend_from_slice(&flags.to_be_bytes());
                send(c, rep::INFO, &e)?;
                // Block sizes are always sent: min 1 (partial blocks are
                // read-modify-written), preferred = the engine's block.
                let mut b = info::BLOCK_SIZE.to_be_bytes().to_vec();
                b.extend_from_slice(&1u32.to_be_bytes());
                b.extend_from_slice(&(engine.block_size() as u32).to_be_bytes());
                b.extend_from_slice(&nbd::MAX_PAYLOAD.to_be_bytes());
                send(c, rep::INFO, &b)?;
                if g.infos.contains(&info::NAME) {
                    let mut n = info::NAME.to_be_bytes().to_vec();
                    n.extend_from_slice(cfg.name.as_bytes());
                    send(c, rep::INFO, &n)?;
                }
                if g.infos.contains(&info::DESCRIPTION) {
                    let mut n = info::DESCRIPTION.to_be_bytes().to_vec();
                    n.extend_from_slice(cfg.description.as_bytes());
                    send(c, rep::INFO, &n)?;
                }
                send(c, rep::ACK, &[])?;
                if option == opt::GO {
                    return Ok(Some(Session { size: engine.size(), flags, structured, base_allocation }));
                }
            }
            opt::STRUCTURED_REPLY => {
                if !d.is_empty() {
                    send(c, rep::ERR_INVALID, b"STRUCTURED_REPLY takes no data")?;
                    continue;
                }
                structured = true;
                send(c, rep::ACK, &[])?;
            }
            opt::LIST_META_CONTEXT | opt::SET_META_CONTEXT => {
                let set = option == opt::SET_META_CONTEXT;
                if set {
                    base_allocation = false; // replaced even on failure
                }
                if !structured {
                    send(c, rep::ERR_INVALID, b"negotiate structured replies first")?;
                    continue;
                }
                let Some(m) = nbd::parse_meta(&d) else {
                    send(c, rep::ERR_INVALID, b"malformed meta context request")?;
                    continue;
                };
                if !known(&m.name) {
                    send(c, rep::ERR_UNKNOWN, b"no such export")?;
                    continue;
                }
                let hit = if m.queries.is_empty() {
                    !set
                } else {
                    m.queries.iter().any(|q| nbd::selects_base_allocation(q, !set))
                };
                if hit {
                    let id = if set { nbd::BASE_ALLOCATION_ID } else { 0 };
                    let mut b = id.to_be_bytes().to_vec();
                    b.extend_from_slice(nbd::BASE_ALLOCATION.as_bytes());
                    send(c, rep::META_CONTEXT, &b)?;
                    if set {
                        base_allocation = true;
                    }
                }
                send(c, rep::ACK, &[])?;
            }
            _ => {
                send(c, rep::ERR_UNSUP, b"option not supported")?;
            }
        }
    }
    Err(protocol_error("too many options"))
}

struct Job {
    req: Request,
    payload: Vec<u8>,
}

#[derive(Default)]
struct Queue {
    reads: VecDeque<Job>,
    others: VecDeque<Job>,
    closed: bool,
}

fn errno_of(e: &BlkError) -> u32 {
    match e {
        BlkError::NoSpace => errno::ENOSPC,
        BlkError::OutOfRange => errno::EINVAL,
        BlkError::NotFast => errno::ENOTSUP,
        BlkError::Io(io) if io.kind() == io::ErrorKind::PermissionDenied => errno::EPERM,
        _ => errno::EIO,
    }
}

fn transmission<D: Device + ?Sized>(
    mut c: Conn,
    engine: &Arc<D>,
    s: Session,
    cfg: &ServeConfig,
    stats: &ServerStats,
) -> io::Result<()> {
    let writer = Arc::new(Mutex::new(c.try_clone()?));
    let queue = Arc::new((Mutex::new(Queue::default()), Condvar::new()));
    let failed = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..cfg.threads.max(1))
        .map(|_| {
            let (engine, writer, queue, failed) =
                (engine.clone(), writer.clone(), queue.clone(), failed.clone());
            std::thread::spawn(move || -> (u64, u64) {
                let (mut done, mut errors) = (0, 0);
                loop {
                    let job = {
                        let (m, cv) = &*queue;
                        let mut q = m.lock().expect("queue lock");
                        loop {
                            if let Some(j) = q.reads.pop_front().or_else(|| q.others.pop_front()) {
                                break Some(j);
                            }
                            if q.closed {
                                break None;
                            }
                            q = cv.wait(q).expect("queue lock");
                        }
                    };
                    let Some(job) = job else { break };
                    let (out, err) = run(&*engine, &s, &job);
                    done += 1;
                    errors += u64::from(err);
                    let mut w = writer.lock().expect("writer lock");
                    if w.write_all(&out).is_err() {
                        failed.store(true, Ordering::Release);
                    }
                }
                (done, errors)
            })
        })
        .collect();
    let push = |job: Job| {
        let (m, cv) = &*queue;
        let mut q = m.lock().expect("queue lock");
        if job.req.kind == cmd::READ {
            q.reads.push_back(job);
        } else {
            q.others.push_back(job);
        }
        cv.notify_one();
    };
    let result = (|| -> io::Result<()> {
        loop {
            if failed.load(Ordering::Acquire) {
                return Err(io::Error::new(io::ErrorKind::BrokenPipe, "reply write failed"));
            }
            let mut h = [0u8; nbd::REQUEST_LEN];
            match c.read_exact(&mut h) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()), // client went away
                Err(e) => return Err(e),
            }
            let req =
                Request::parse(&h).ok_or_else(|| protocol_error("request without the request magic"))?;
            let mut payload = Vec::new();
            if req.kind == cmd::WRITE {
                if req.length > nbd::MAX_PAYLOAD {
                    return Err(protocol_error("write payload above 32 MiB"));
                }
                payload.resize(req.length as usize, 0);
                c.read_exact(&mut payload)?;
            }
            if let Err(e) = nbd::validate(&req, &s) {
                let out = error_reply(&s, &req, e, "invalid request");
                stats.errors.fetch_add(1, Ordering::Relaxed);
                writer.lock().expect("writer lock").write_all(&out)?;
                continue;
            }
            if req.kind == cmd::DISC {
                return Ok(());
            }
            push(Job { req, payload });
        }
    })();
    {
        let (m, cv) = &*queue;
        m.lock().expect("queue lock").closed = true;
        cv.notify_all();
    }
    for w in workers {
        if let Ok((done, errors)) = w.join() {
            stats.requests.fetch_add(done, Ordering::Relaxed);
            stats.errors.fetch_add(errors, Ordering::Relaxed);
        }
    }
    c.shutdown();
    result
}

fn error_reply(s: &Session, req: &Request, e: u32, msg: &str) -> Vec<u8> {
    if s.structured {
        nbd::error_chunk(req.cookie, e, msg)
    } else {
        nbd::simple_reply(req.cookie, e).to_vec()
    }
}

/// Runs one request; returns the reply bytes and whether it is an error.
fn run<D: Device + ?Sized>(engine: &D, s: &Session, job: &Job) -> (Vec<u8>, bool) {
    let r = &job.req;
    let res: Result<Vec<u8>, BlkError> = match r.kind {
        cmd::READ => read_reply(engine, s, r),
        cmd::WRITE => engine.write(r.offset, &job.payload, r.flags & cflag::FUA != 0).map(|_| ok(s, r)),
        cmd::FLUSH => engine.flush().map(|_| ok(s, r)),
        cmd::TRIM => engine.trim(r.offset, r.length as u64, r.flags & cflag::FUA != 0).map(|_| ok(s, r)),
        cmd::WRITE_ZEROES => engine
            .write_zeroes(
                r.offset,
                r.length as u64,
                r.flags & cflag::FAST_ZERO != 0,
                r.flags & cflag::FUA != 0,
            )
            .map(|_| ok(s, r)),
        cmd::BLOCK_STATUS => Ok(status_reply(engine, r)),
        _ => Err(BlkError::OutOfRange),
    };
    match res {
        Ok(out) => (out, false),
        Err(e) => (error_reply(s, r, errno_of(&e), &e.to_string()), true),
    }
}

fn ok(s: &Session, r: &Request) -> Vec<u8> {
    if s.structured {
        nbd::chunk_header(r.cookie, reply::FLAG_DONE, reply::NONE, 0).to_vec()
    } else {
        nbd::simple_reply(r.cookie, 0).to_vec()
    }
}

fn read_reply<D: Device + ?Sized>(engine: &D, s: &Session, r: &Request) -> Result<Vec<u8>, BlkError> {
    // The data is read straight into the reply buffer, after its header.
    if !s.structured {
        let mut out = nbd::simple_reply(r.cookie, 0).to_vec();
        out.resize(16 + r.length as usize, 0);
        engine.read(r.offset, &mut out[16..])?;
        return Ok(out);
    }
    // Content chunks: holes for whole blocks that read as zeros (unless DF).
    let bs = engine.block_size() as u64;
    let (off, len) = (r.offset, r.length as u64);
    let mut chunks: Vec<(u64, u64, bool)> = Vec::new(); // start, len, hole
    if len > 0 && r.flags & cflag::DF == 0 {
        let first = off / bs;
        let last = (off + len - 1) / bs;
        let states = engine.block_states(first, last - first + 1);
        let mut pos = off;
        for (i, st) in states.iter().enumerate() {
            let b = first + i as u64;
            let (bstart, bend) = (b * bs, (b + 1) * bs);
            let stop = bend.min(off + len);
            let hole = *st != BlockState::Data && bstart >= off && bend <= off + len;
            match chunks.last_mut() {
                Some(c) if c.2 == hole => c.1 += stop - pos,
                _ => chunks.push((pos, stop - pos, hole)),
            }
            pos = stop;
        }
    } else {
        chunks.push((off, len, false));
    }
    let data_len: u64 = chunks.iter().filter(|c| !c.2).map(|c| c.1).sum();
    let mut out = Vec::with_capacity(data_len as usize + 32 * chunks.len());
    let n = chunks.len();
    for (i, (start, clen, hole)) in chunks.into_iter().enumerate() {
        let flags = if i + 1 == n { reply::FLAG_DONE } else { 0 };
        if hole {
            out.extend_from_slice(&nbd::chunk_header(r.cookie, flags, reply::OFFSET_HOLE, 12));
            out.extend_from_slice(&start.to_be_bytes());
            out.extend_from_slice(&(clen as u32).to_be_bytes());
        } else if clen == 0 {
            out.extend_from_slice(&nbd::chunk_header(r.cookie, flags, reply::NONE, 0));
        } else {
            out.extend_from_slice(&nbd::chunk_header(r.cookie, flags, reply::OFFSET_DATA, 8 + clen as u32));
            out.extend_from_slice(&start.to_be_bytes());
            let at = out.len();
            out.resize(at + clen as usize, 0);
            engine.read(start, &mut out[at..])?;
        }
    }
    Ok(out)
}

fn status_reply<D: Device + ?Sized>(engine: &D, r: &Request) -> Vec<u8> {
    let bs = engine.block_size() as u64;
    let first = r.offset / bs;
    let last = (r.offset + r.length as u64 - 1) / bs;
    let provisioned = engine.provisioned();
    let flags: Vec<u32> = engine
        .block_states(first, last - first + 1)
        .into_iter()
        .map(|st| match (st, provisioned) {
            (BlockState::Unmapped, _) => nbd::STATE_HOLE | nbd::STATE_ZERO,
            (BlockState::Zero, true) => nbd::STATE_ZERO,
            (BlockState::Zero, false) => nbd::STATE_HOLE | nbd::STATE_ZERO,
            // On a thin image any overwrite may need space it cannot get.
            (BlockState::Data, true) => 0,
            (BlockState::Data, false) => nbd::STATE_HOLE,
        })
        .collect();
    let d = nbd::status_descriptors(r.offset, r.length, bs, &flags, r.flags & cflag::REQ_ONE != 0);
    let mut out =
        nbd::chunk_header(r.cookie, reply::FLAG_DONE, reply::BLOCK_STATUS, 4 + 8 * d.len() as u32).to_vec();
    out.extend_from_slice(&nbd::BASE_ALLOCATION_ID.to_be_bytes());
    for (len, f) in d {
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&f.to_be_bytes());
    }
    out
}
