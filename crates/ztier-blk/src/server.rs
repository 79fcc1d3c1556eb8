//! The NBD server: one thread reads each connection's requests (through a
//! buffer), a pool of workers per connection runs them on the engine
//! (reads first), replies go out under a per-connection writer lock in
//! completion order. Requests the device serves without waiting
//! ([`Device::read_fast`], [`Device::write_fast`]) are answered by the
//! reading thread itself, their replies sent together once no more
//! requests are buffered.
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
use std::time::{Duration, Instant};

use crate::device::Device;
use crate::engine::{BlkError, BlockState, Engine};
use crate::live::{Histogram, Prom, Report};
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
    /// Asks for a send buffer that holds a few 1 MiB replies (the kernel
    /// caps it at `net.core.wmem_max`): a worker then queues a large read's
    /// reply without sleeping until the client drains the socket, which
    /// held the reply lock and cost a context switch per buffer's worth.
    fn grow_send_buffer(&self) {
        use std::os::fd::AsRawFd;
        let fd = match self {
            Conn::Unix(s) => s.as_raw_fd(),
            Conn::Tcp(s) => s.as_raw_fd(),
        };
        let size: libc::c_int = 4 << 20;
        // SAFETY: a valid option value of its own size on a socket we own;
        // failure only leaves the default size.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
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

/// Server-wide counters, updated as each request is answered.
#[derive(Default)]
pub struct ServerStats {
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Connections open now.
    pub connections_open: AtomicU64,
    /// Requests answered.
    pub requests: AtomicU64,
    /// Requests answered with an error.
    pub errors: AtomicU64,
    /// Connections dropped for protocol violations.
    pub protocol_errors: AtomicU64,
    /// READ requests.
    pub reads: AtomicU64,
    /// WRITE requests.
    pub writes: AtomicU64,
    /// FLUSH requests.
    pub flushes: AtomicU64,
    /// TRIM, WRITE_ZEROES, BLOCK_STATUS and other requests.
    pub others: AtomicU64,
    /// Bytes read by clients.
    pub bytes_read: AtomicU64,
    /// Bytes written by clients.
    pub bytes_written: AtomicU64,
    /// Latency (request read to reply sent) of every request.
    pub latency: Histogram,
    /// Of READ requests.
    pub read_latency: Histogram,
    /// Of WRITE requests.
    pub write_latency: Histogram,
    /// Of FLUSH requests.
    pub flush_latency: Histogram,
}

impl ServerStats {
    fn record(&self, req: &Request, took: Duration, error: bool) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.errors.fetch_add(u64::from(error), Ordering::Relaxed);
        self.latency.record(took);
        let len = req.length as u64;
        match req.kind {
            cmd::READ => {
                self.reads.fetch_add(1, Ordering::Relaxed);
                self.read_latency.record(took);
                if !error {
                    self.bytes_read.fetch_add(len, Ordering::Relaxed);
                }
            }
            cmd::WRITE => {
                self.writes.fetch_add(1, Ordering::Relaxed);
                self.write_latency.record(took);
                if !error {
                    self.bytes_written.fetch_add(len, Ordering::Relaxed);
                }
            }
            cmd::FLUSH => {
                self.flushes.fetch_add(1, Ordering::Relaxed);
                self.flush_latency.record(took);
            }
            _ => {
                self.others.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl ServerStats {
    /// The live counters as JSON fields (`served`, `pid`, connections,
    /// requests, bytes, latency p50/p99 by command), for a server's stats.
    pub fn json(&self) -> serde_json::Map<String, serde_json::Value> {
        let s = self;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let v = serde_json::json!({
            "served": true,
            "pid": std::process::id(),
            "connections": g(&s.connections),
            "connections_open": g(&s.connections_open),
            "requests": g(&s.requests),
            "errors": g(&s.errors),
            "protocol_errors": g(&s.protocol_errors),
            "read_requests": g(&s.reads),
            "write_requests": g(&s.writes),
            "flush_requests": g(&s.flushes),
            "other_requests": g(&s.others),
            "bytes_read": g(&s.bytes_read),
            "bytes_written": g(&s.bytes_written),
            "latency_p50_us": s.latency.quantile_us(0.5),
            "latency_p99_us": s.latency.quantile_us(0.99),
            "read_latency_p50_us": s.read_latency.quantile_us(0.5),
            "read_latency_p99_us": s.read_latency.quantile_us(0.99),
            "write_latency_p50_us": s.write_latency.quantile_us(0.5),
            "write_latency_p99_us": s.write_latency.quantile_us(0.99),
            "flush_latency_p50_us": s.flush_latency.quantile_us(0.5),
            "flush_latency_p99_us": s.flush_latency.quantile_us(0.99),
        });
        match v {
            serde_json::Value::Object(m) => m,
            _ => serde_json::Map::new(),
        }
    }

    /// The counters and request latencies as metrics named `KIND_...`
    /// (`blk_requests_total`, `cache_request_duration_seconds`, …).
    pub fn prometheus(&self, w: &mut Prom, kind: &str, labels: &[(&str, &str)]) {
        let s = self;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        let n = |x: &str| format!("{kind}_{x}");
        let with = |op: &'static str| {
            let mut l = labels.to_vec();
            l.push(("op", op));
            l
        };
        w.counter(&n("requests_total"), "NBD requests answered", labels, g(&s.requests));
        w.counter(&n("request_errors_total"), "NBD requests answered with an error", labels, g(&s.errors));
        w.counter(
            &n("protocol_errors_total"),
            "connections dropped for protocol violations",
            labels,
            g(&s.protocol_errors),
        );
        w.counter(&n("connections_total"), "connections accepted", labels, g(&s.connections));
        w.gauge(&n("connections_open"), "connections open", labels, g(&s.connections_open));
        for (op, v) in [("read", &s.reads), ("write", &s.writes), ("flush", &s.flushes), ("other", &s.others)]
        {
            w.counter(&n("requests_by_op_total"), "NBD requests by command", &with(op), g(v));
        }
        w.counter(&n("read_bytes_total"), "bytes read by clients", labels, g(&s.bytes_read));
        w.counter(&n("written_bytes_total"), "bytes written by clients", labels, g(&s.bytes_written));
        for (op, h) in [
            ("all", &s.latency),
            ("read", &s.read_latency),
            ("write", &s.write_latency),
            ("flush", &s.flush_latency),
        ] {
            w.histogram(&n("request_duration_seconds"), "request read to reply sent", &with(op), h);
        }
    }
}

/// What `ztier blk stats` of a served image and the metrics endpoint
/// report: the engine's statistics plus the server's live counters.
pub struct Live {
    /// The engine served.
    pub engine: Arc<Engine>,
    /// The server's counters.
    pub stats: Arc<ServerStats>,
    /// The image's path, as given.
    pub image: String,
    /// When serving started.
    pub started: std::time::Instant,
}

impl Report for Live {
    fn stats(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self.engine.stats()).unwrap_or_default();
        let mut live = self.stats.json();
        live.insert("image".into(), self.image.clone().into());
        live.insert("uptime_s".into(), self.started.elapsed().as_secs_f64().into());
        if let Some(o) = v.as_object_mut() {
            o.extend(live);
        }
        v
    }

    fn prometheus(&self, w: &mut Prom) {
        let e = self.engine.stats();
        let img = [("image", self.image.as_str())];
        self.stats.prometheus(w, "blk", &img);
        w.gauge("blk_logical_bytes", "logical size", &img, e.logical_size as f64);
        w.gauge(
            "blk_mapped_bytes",
            "logical bytes of blocks holding data",
            &img,
            e.logical_bytes_mapped as f64,
        );
        w.gauge(
            "blk_stored_bytes",
            "bytes the data blocks take in extents",
            &img,
            e.data_stored_bytes as f64,
        );
        w.gauge(
            "blk_physical_bytes",
            "physical bytes of the image in use",
            &img,
            e.physical_bytes_used as f64,
        );
        w.gauge("blk_compression_ratio", "mapped / stored bytes", &img, e.ratio);
        w.gauge("blk_extents", "extents in the image", &img, e.extents_total as f64);
        w.gauge("blk_extents_free", "extents free", &img, e.extents_free as f64);
        w.gauge("blk_zero_blocks", "blocks written as zeros", &img, e.zero_blocks as f64);
        w.gauge("blk_same_blocks", "blocks filled with a repeated pattern", &img, e.same_blocks as f64);
        w.counter("blk_checkpoints_total", "checkpoints written", &img, e.checkpoints as f64);
        w.counter(
            "blk_checkpoint_pages_total",
            "table pages written by checkpoints",
            &img,
            e.checkpoint_pages_written as f64,
        );
        w.counter(
            "blk_checkpoint_seconds_total",
            "time spent in checkpoints",
            &img,
            e.checkpoint_us as f64 / 1e6,
        );
        w.gauge(
            "blk_checkpoint_max_seconds",
            "the longest checkpoint",
            &img,
            e.checkpoint_max_us as f64 / 1e6,
        );
        w.counter("blk_cleaner_runs_total", "cleaner passes", &img, e.cleaner_runs as f64);
        w.counter(
            "blk_cleaner_extents_total",
            "extents freed by the cleaner",
            &img,
            e.extents_cleaned as f64,
        );
        w.counter(
            "blk_cleaner_blocks_moved_total",
            "blocks moved by the cleaner",
            &img,
            e.blocks_relocated as f64,
        );
        w.counter("blk_cleaner_seconds_total", "time spent cleaning", &img, e.cleaner_us as f64 / 1e6);
        w.counter("blk_enospc_total", "writes refused for lack of space", &img, e.enospc as f64);
        w.counter("blk_corrupt_reads_total", "reads that found damaged data", &img, e.corrupt_reads as f64);
    }

    fn command(&self, cmd: &str) -> Option<serde_json::Value> {
        (cmd == "verify").then(|| match self.engine.verify_blocks() {
            Ok(p) => serde_json::json!({ "problems": p, "data_blocks": self.engine.stats().data_blocks }),
            Err(e) => serde_json::json!({ "error": format!("verifying: {e}") }),
        })
    }
}

/// Accepts connections until `stop` is set, each on its own thread. A
/// maintenance thread calls [`Device::maintain`] (for the engine: seals
/// aged extent buffers, runs the cleaner and takes due checkpoints, so a
/// FLUSH does not wait for one).
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
                c.grow_send_buffer();
                stats.connections.fetch_add(1, Ordering::Relaxed);
                let (engine, cfg, stats) = (engine.clone(), cfg.clone(), stats.clone());
                std::thread::spawn(move || {
                    stats.connections_open.fetch_add(1, Ordering::Relaxed);
                    if let Err(e) = handle(c, &engine, &cfg, &stats) {
                        if e.kind() != io::ErrorKind::UnexpectedEof && e.kind() != io::ErrorKind::BrokenPipe {
                            eprintln!("ztier blk: connection ended: {e}");
                        }
                    }
                    stats.connections_open.fetch_sub(1, Ordering::Relaxed);
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
    stats: &Arc<ServerStats>,
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

/// Write payload buffers a connection keeps for reuse.
const SPARE_PAYLOADS: usize = 8;
/// The largest payload buffer kept (bigger ones are freed).
const SPARE_MAX: usize = 4 << 20;

struct Job {
    req: Request,
    payload: Vec<u8>,
    /// When its header was read.
    at: Instant,
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
    c: Conn,
    engine: &Arc<D>,
    s: Session,
    cfg: &ServeConfig,
    stats: &Arc<ServerStats>,
) -> io::Result<()> {
    let writer = Arc::new(Mutex::new(c.try_clone()?));
    let queue = Arc::new((Mutex::new(Queue::default()), Condvar::new()));
    let failed = Arc::new(AtomicBool::new(false));
    // Write payload buffers, back from the workers: a large write then
    // does not allocate, zero and fault in a new buffer each time.
    let spare: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let workers: Vec<_> = (0..cfg.threads.max(1))
        .map(|_| {
            let (engine, writer, queue, failed, stats, spare) =
                (engine.clone(), writer.clone(), queue.clone(), failed.clone(), stats.clone(), spare.clone());
            let mut buf = Vec::new();
            std::thread::spawn(move || loop {
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
                let (n, err) = run(&*engine, &s, &job, &mut buf);
                let mut w = writer.lock().expect("writer lock");
                if w.write_all(&buf[..n]).is_err() {
                    failed.store(true, Ordering::Release);
                }
                drop(w);
                stats.record(&job.req, job.at.elapsed(), err);
                engine.after_reply();
                give_back(&spare, job.payload);
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
    // Requests the device serves at once are answered from this thread.
    // Requests are read through a buffer (one receive takes all the client
    // has sent) and the replies answered here go out together once the
    // buffer is empty (one send for the lot), before this thread waits.
    let mut rd = io::BufReader::with_capacity(READ_BUFFER, c.try_clone()?);
    let mut fast = Vec::new();
    let mut out: Vec<u8> = Vec::new();
    let mut answered: Vec<(Request, Instant, bool)> = Vec::new();
    let send_answered = |out: &mut Vec<u8>, answered: &mut Vec<(Request, Instant, bool)>| -> io::Result<()> {
        if out.is_empty() {
            return Ok(());
        }
        let r = writer.lock().expect("writer lock").write_all(out);
        out.clear();
        for (req, at, err) in answered.drain(..) {
            stats.record(&req, at.elapsed(), err);
        }
        r
    };
    let result = (|| -> io::Result<()> {
        loop {
            if failed.load(Ordering::Acquire) {
                return Err(io::Error::new(io::ErrorKind::BrokenPipe, "reply write failed"));
            }
            if rd.buffer().len() < nbd::REQUEST_LEN || out.len() >= SEND_BATCH_MAX {
                send_answered(&mut out, &mut answered)?;
            }
            let mut h = [0u8; nbd::REQUEST_LEN];
            match rd.read_exact(&mut h) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()), // client went away
                Err(e) => return Err(e),
            }
            let at = Instant::now();
            let req =
                Request::parse(&h).ok_or_else(|| protocol_error("request without the request magic"))?;
            let mut payload = Vec::new();
            if req.kind == cmd::WRITE {
                if req.length > nbd::MAX_PAYLOAD {
                    return Err(protocol_error("write payload above 32 MiB"));
                }
                if let Some(b) = spare.lock().expect("spare lock").pop() {
                    payload = b;
                }
                // Zeroes only bytes a recycled buffer never held.
                payload.resize(req.length as usize, 0);
                if rd.buffer().len() < payload.len() {
                    send_answered(&mut out, &mut answered)?;
                }
                rd.read_exact(&mut payload)?;
            }
            if let Err(e) = nbd::validate(&req, &s) {
                out.extend_from_slice(&error_reply(&s, &req, e, "invalid request"));
                answered.push((req, at, true));
                continue;
            }
            if req.kind == cmd::DISC {
                return Ok(());
            }
            if req.kind == cmd::READ {
                if let Some((n, err)) = fast_read(&**engine, &s, &req, &mut fast) {
                    out.extend_from_slice(&fast[..n]);
                    answered.push((req, at, err));
                    continue;
                }
            }
            // Writes the device takes at once, likewise (a worker's wake-up
            // and its hand-back cost more than the write).
            if req.kind == cmd::WRITE && req.length as usize <= FAST_WRITE_MAX {
                let fua = req.flags & cflag::FUA != 0;
                if let Some(r) = engine.write_fast(req.offset, &payload, fua) {
                    let (n, err) = match r {
                        Ok(()) => (ok(&s, &req, &mut fast), false),
                        Err(e) => {
                            (put(&mut fast, &error_reply(&s, &req, errno_of(&e), &e.to_string())), true)
                        }
                    };
                    out.extend_from_slice(&fast[..n]);
                    answered.push((req, at, err));
                    give_back(&spare, payload);
                    continue;
                }
            }
            push(Job { req, payload, at });
        }
    })();
    // What was answered here goes out even when the client left (it may
    // only have shut down its sending side).
    let _ = send_answered(&mut out, &mut answered);
    {
        let (m, cv) = &*queue;
        m.lock().expect("queue lock").closed = true;
        cv.notify_all();
    }
    for w in workers {
        let _ = w.join();
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

/// `buf[..n]`, growing `buf` if needed. The buffer is kept by its worker
/// from request to request: a large reply does not allocate, zero and
/// free a buffer each time.
fn room(buf: &mut Vec<u8>, n: usize) -> &mut [u8] {
    if buf.len() < n {
        buf.resize(n, 0);
    }
    &mut buf[..n]
}

fn put(buf: &mut Vec<u8>, bytes: &[u8]) -> usize {
    room(buf, bytes.len()).copy_from_slice(bytes);
    bytes.len()
}

/// Runs one request; its reply is `buf[..n]`. Returns `n` and whether the
/// reply is an error.
fn run<D: Device + ?Sized>(engine: &D, s: &Session, job: &Job, buf: &mut Vec<u8>) -> (usize, bool) {
    let r = &job.req;
    let res: Result<usize, BlkError> = match r.kind {
        cmd::READ => read_reply(engine, s, r, buf),
        cmd::WRITE => engine.write(r.offset, &job.payload, r.flags & cflag::FUA != 0).map(|_| ok(s, r, buf)),
        cmd::FLUSH => engine.flush().map(|_| ok(s, r, buf)),
        cmd::TRIM => engine.trim(r.offset, r.length as u64, r.flags & cflag::FUA != 0).map(|_| ok(s, r, buf)),
        cmd::WRITE_ZEROES => engine
            .write_zeroes(
                r.offset,
                r.length as u64,
                r.flags & cflag::FAST_ZERO != 0,
                r.flags & cflag::FUA != 0,
            )
            .map(|_| ok(s, r, buf)),
        cmd::BLOCK_STATUS => Ok(put(buf, &status_reply(engine, r))),
        _ => Err(BlkError::OutOfRange),
    };
    match res {
        Ok(n) => (n, false),
        Err(e) => (put(buf, &error_reply(s, r, errno_of(&e), &e.to_string())), true),
    }
}

/// Keeps a write's payload buffer for a later request's, if it is one
/// worth keeping and fewer than [`SPARE_PAYLOADS`] are kept.
fn give_back(spare: &Mutex<Vec<Vec<u8>>>, payload: Vec<u8>) {
    if payload.capacity() > 0 && payload.capacity() <= SPARE_MAX {
        let mut sp = spare.lock().expect("spare lock");
        if sp.len() < SPARE_PAYLOADS {
            sp.push(payload);
        }
    }
}

/// Largest read tried on [`Device::read_fast`].
const FAST_READ_MAX: u32 = 64 << 10;
/// Largest write tried on [`Device::write_fast`].
const FAST_WRITE_MAX: usize = 64 << 10;
/// The connection's receive buffer.
const READ_BUFFER: usize = 128 << 10;
/// Replies answered by the reader thread are sent once they reach this
/// many bytes, even with more requests buffered.
const SEND_BATCH_MAX: usize = 256 << 10;

/// A read the device serves at once (see [`Device::read_fast`]): the
/// reply in `buf[..n]` (one data chunk, or a simple reply) and whether it
/// is an error; `None` to run it on a worker.
fn fast_read<D: Device + ?Sized>(
    dev: &D,
    s: &Session,
    r: &Request,
    buf: &mut Vec<u8>,
) -> Option<(usize, bool)> {
    if r.length == 0 || r.length > FAST_READ_MAX {
        return None;
    }
    let len = r.length as usize;
    let head = if s.structured { 28 } else { 16 };
    let out = room(buf, head + len);
    match dev.read_fast(r.offset, &mut out[head..])? {
        Ok(()) => {
            if s.structured {
                out[..20].copy_from_slice(&nbd::chunk_header(
                    r.cookie,
                    reply::FLAG_DONE,
                    reply::OFFSET_DATA,
                    8 + r.length,
                ));
                out[20..28].copy_from_slice(&r.offset.to_be_bytes());
            } else {
                out[..16].copy_from_slice(&nbd::simple_reply(r.cookie, 0));
            }
            Some((head + len, false))
        }
        Err(e) => Some((put(buf, &error_reply(s, r, errno_of(&e), &e.to_string())), true)),
    }
}

fn ok(s: &Session, r: &Request, buf: &mut Vec<u8>) -> usize {
    if s.structured {
        put(buf, &nbd::chunk_header(r.cookie, reply::FLAG_DONE, reply::NONE, 0))
    } else {
        put(buf, &nbd::simple_reply(r.cookie, 0))
    }
}

fn read_reply<D: Device + ?Sized>(
    engine: &D,
    s: &Session,
    r: &Request,
    buf: &mut Vec<u8>,
) -> Result<usize, BlkError> {
    // The data is read straight into the reply buffer, after its header.
    if !s.structured {
        let n = 16 + r.length as usize;
        let out = room(buf, n);
        out[..16].copy_from_slice(&nbd::simple_reply(r.cookie, 0));
        engine.read(r.offset, &mut out[16..])?;
        return Ok(n);
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
    let total: usize = chunks
        .iter()
        .map(|&(_, clen, hole)| {
            if hole {
                32
            } else if clen == 0 {
                20
            } else {
                28 + clen as usize
            }
        })
        .sum();
    let out = room(buf, total);
    let n = chunks.len();
    let mut at = 0;
    for (i, (start, clen, hole)) in chunks.into_iter().enumerate() {
        let flags = if i + 1 == n { reply::FLAG_DONE } else { 0 };
        if hole {
            out[at..at + 20].copy_from_slice(&nbd::chunk_header(r.cookie, flags, reply::OFFSET_HOLE, 12));
            out[at + 20..at + 28].copy_from_slice(&start.to_be_bytes());
            out[at + 28..at + 32].copy_from_slice(&(clen as u32).to_be_bytes());
            at += 32;
        } else if clen == 0 {
            out[at..at + 20].copy_from_slice(&nbd::chunk_header(r.cookie, flags, reply::NONE, 0));
            at += 20;
        } else {
            out[at..at + 20].copy_from_slice(&nbd::chunk_header(
                r.cookie,
                flags,
                reply::OFFSET_DATA,
                8 + clen as u32,
            ));
            out[at + 20..at + 28].copy_from_slice(&start.to_be_bytes());
            at += 28;
            engine.read(start, &mut out[at..at + clen as usize])?;
            at += clen as usize;
        }
    }
    Ok(total)
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
