//! Live statistics of a running server, for any ztier server to reuse: a
//! control socket that answers `ztier ... stats` with one JSON object, a
//! Prometheus text endpoint, and a latency histogram to feed both.
//!
//! A server implements [`Report`] and starts [`serve_control`] (and, if
//! asked, [`serve_metrics`]); a client calls [`query`].
//!
//! The control socket is an abstract unix socket named after the file the
//! server holds ([`control_name`]: its device and inode), so a client finds
//! it from the same path the server was given, a crashed server leaves
//! nothing behind, and a second server on the same file is kept off by the
//! file's lock, not by the name. Abstract names have no permissions: the
//! server answers only its own user and root, and the client trusts only
//! an answer from its own user or root (`SO_PEERCRED` both ways).
//!
//! ```text
//!  client                                  server
//!  connect @ztier-KIND-DEV-INO ──────────▶ accept; peer uid ours or root?
//!  "stats\n" (or another command) ───────▶
//!                                   ◀──── one JSON object, then close
//! ```
//!
//! The metrics endpoint serves `GET /metrics` (any other path: 404) in the
//! Prometheus text format 0.0.4, with `tiny_http` as the HTTP layer.

use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// What a server tells: its statistics as JSON and as Prometheus metrics.
pub trait Report: Send + Sync + 'static {
    /// The answer to `stats`: one JSON object.
    fn stats(&self) -> serde_json::Value;
    /// The metrics, written with `w`.
    fn prometheus(&self, w: &mut Prom);
    /// The answer to another command, `None` if unknown.
    fn command(&self, _cmd: &str) -> Option<serde_json::Value> {
        None
    }
}

/// Buckets per power of two in [`Histogram`].
const SUB: usize = 4;
/// Powers of two covered, from 1 µs (2^10 ns) up.
const OCTAVES: usize = 28;

/// A latency histogram with ~19% wide buckets from 1 µs to ~4.5 min,
/// recorded with one atomic add.
pub struct Histogram {
    counts: Vec<AtomicU64>,
    sum_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: (0..OCTAVES * SUB + 1).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    fn bucket(ns: u64) -> usize {
        if ns < 1024 {
            return 0;
        }
        let o = 63 - ns.leading_zeros() as usize; // ≥ 10
        let frac = ((ns >> (o - 2)) & 3) as usize; // next two bits
        ((o - 10) * SUB + frac + 1).min(OCTAVES * SUB)
    }

    /// The upper bound of bucket `b`, ns.
    fn upper(b: usize) -> u64 {
        if b == 0 {
            return 1024;
        }
        let (o, frac) = ((b - 1) / SUB + 10, (b - 1) % SUB);
        (1u64 << o) + ((frac as u64 + 1) << (o - 2))
    }

    /// Records one duration.
    pub fn record(&self, d: Duration) {
        let ns = d.as_nanos().min(u64::MAX as u128) as u64;
        self.counts[Self::bucket(ns)].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Durations recorded.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// The `q` quantile (0..=1), in µs: the upper bound of its bucket
    /// (0 when nothing was recorded).
    pub fn quantile_us(&self, q: f64) -> f64 {
        let counts: Vec<u64> = self.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0.0;
        }
        let want = ((total as f64 * q).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (b, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return Self::upper(b) as f64 / 1000.0;
            }
        }
        Self::upper(counts.len() - 1) as f64 / 1000.0
    }

    /// Cumulative counts at each power of two (upper bound in seconds),
    /// the sum in seconds and the count: a Prometheus histogram.
    fn cumulative(&self) -> (Vec<(f64, u64)>, f64, u64) {
        let mut out = Vec::new();
        let mut seen = 0;
        for (b, c) in self.counts.iter().enumerate() {
            seen += c.load(Ordering::Relaxed);
            if b == 0 || b % SUB == 0 {
                out.push((Self::upper(b) as f64 / 1e9, seen));
            }
        }
        (out, self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9, seen)
    }
}

/// Writes the Prometheus text format: each metric once, with its HELP
/// and TYPE lines, names under a common prefix.
pub struct Prom {
    prefix: &'static str,
    out: String,
    last: String,
}

impl Prom {
    /// Metrics named `PREFIX_name`.
    pub fn new(prefix: &'static str) -> Prom {
        Prom { prefix, out: String::new(), last: String::new() }
    }

    fn head(&mut self, name: &str, help: &str, kind: &str) {
        if self.last != name {
            let _ = writeln!(self.out, "# HELP {}_{name} {help}", self.prefix);
            let _ = writeln!(self.out, "# TYPE {}_{name} {kind}", self.prefix);
            self.last = name.to_string();
        }
    }

    fn labels(labels: &[(&str, &str)]) -> String {
        if labels.is_empty() {
            return String::new();
        }
        let v: Vec<String> = labels
            .iter()
            .map(|(k, v)| {
                format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n"))
            })
            .collect();
        format!("{{{}}}", v.join(","))
    }

    /// A counter (monotonic).
    pub fn counter(&mut self, name: &str, help: &str, labels: &[(&str, &str)], v: f64) {
        self.head(name, help, "counter");
        let _ = writeln!(self.out, "{}_{name}{} {v}", self.prefix, Self::labels(labels));
    }

    /// A gauge.
    pub fn gauge(&mut self, name: &str, help: &str, labels: &[(&str, &str)], v: f64) {
        self.head(name, help, "gauge");
        let _ = writeln!(self.out, "{}_{name}{} {v}", self.prefix, Self::labels(labels));
    }

    /// A histogram of durations in seconds.
    pub fn histogram(&mut self, name: &str, help: &str, labels: &[(&str, &str)], h: &Histogram) {
        self.head(name, help, "histogram");
        let (buckets, sum, count) = h.cumulative();
        let p = self.prefix;
        for (le, c) in buckets {
            let mut l: Vec<(&str, &str)> = labels.to_vec();
            let le = format!("{le}");
            l.push(("le", &le));
            let _ = writeln!(self.out, "{p}_{name}_bucket{} {c}", Self::labels(&l));
        }
        let mut l: Vec<(&str, &str)> = labels.to_vec();
        l.push(("le", "+Inf"));
        let _ = writeln!(self.out, "{p}_{name}_bucket{} {count}", Self::labels(&l));
        let _ = writeln!(self.out, "{p}_{name}_sum{} {sum}", Self::labels(labels));
        let _ = writeln!(self.out, "{p}_{name}_count{} {count}", Self::labels(labels));
    }

    /// The text.
    pub fn finish(self) -> String {
        self.out
    }
}

/// The control socket name of a server of `kind` holding `path`.
pub fn control_name(kind: &str, path: &Path) -> io::Result<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    Ok(format!("ztier-{kind}-{:x}-{:x}", m.dev(), m.ino()))
}

fn peer_uid(s: &UnixStream) -> io::Result<u32> {
    // SAFETY: ucred is a plain C struct; all zeros is valid.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, which is that large.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

fn trusted(uid: u32) -> bool {
    // SAFETY: geteuid has no preconditions.
    uid == 0 || uid == unsafe { libc::geteuid() }
}

/// Answers commands on the abstract socket `name` until `stop` is set
/// (checked every 100 ms), one connection at a time (each answer is
/// computed in microseconds to a few seconds; a client that sends nothing
/// is dropped after 5 s).
pub fn serve_control(
    name: &str,
    report: Arc<dyn Report>,
    stop: Arc<AtomicBool>,
) -> io::Result<JoinHandle<()>> {
    let addr = UnixAddr::from_abstract_name(name.as_bytes())?;
    let l = UnixListener::bind_addr(&addr).map_err(|e| {
        if e.kind() == io::ErrorKind::AddrInUse {
            io::Error::new(e.kind(), format!("control socket @{name} is taken by another process"))
        } else {
            e
        }
    })?;
    l.set_nonblocking(true)?;
    Ok(std::thread::spawn(move || {
        while !stop.load(Ordering::Acquire) {
            match l.accept() {
                Ok((s, _)) => {
                    let _ = answer(s, &*report);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }))
}

fn answer(s: UnixStream, report: &dyn Report) -> io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut w = s.try_clone()?;
    if !trusted(peer_uid(&s)?) {
        let v = serde_json::json!({ "error": "denied: only the server's user and root are answered" });
        return writeln!(w, "{v}");
    }
    let mut line = String::new();
    BufReader::new(s.take(256)).read_line(&mut line)?;
    let cmd = line.trim();
    let v = match cmd {
        "stats" => report.stats(),
        _ => report
            .command(cmd)
            .unwrap_or_else(|| serde_json::json!({ "error": format!("unknown command '{cmd}'") })),
    };
    writeln!(w, "{v}")
}

/// Sends `cmd` to the control socket `name` and returns its answer;
/// `Ok(None)` when no server listens there.
pub fn query(name: &str, cmd: &str, timeout: Duration) -> io::Result<Option<serde_json::Value>> {
    let addr = UnixAddr::from_abstract_name(name.as_bytes())?;
    let mut s = match UnixStream::connect_addr(&addr) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => return Ok(None),
        Err(e) => return Err(e),
    };
    if !trusted(peer_uid(&s)?) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("@{name} belongs to another user: not trusted"),
        ));
    }
    s.set_read_timeout(Some(timeout))?;
    writeln!(s, "{cmd}")?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    let v: serde_json::Value = serde_json::from_str(line.trim())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("answer of @{name}: {e}")))?;
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        return Err(io::Error::other(e.to_string()));
    }
    Ok(Some(v))
}

/// Serves `GET /metrics` at `addr` until `stop` is set; refuses an address
/// that is not loopback unless `allow_remote`. Returns the bound address
/// (port 0 picks one).
pub fn serve_metrics(
    addr: SocketAddr,
    allow_remote: bool,
    report: Arc<dyn Report>,
    stop: Arc<AtomicBool>,
) -> io::Result<(SocketAddr, JoinHandle<()>)> {
    if !addr.ip().is_loopback() && !allow_remote {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{addr} is not a loopback address: metrics would be readable by any host; allow remote addresses to mean it"),
        ));
    }
    let server =
        tiny_http::Server::http(addr).map_err(|e| io::Error::other(format!("listening on {addr}: {e}")))?;
    let bound = server
        .server_addr()
        .to_ip()
        .ok_or_else(|| io::Error::other("metrics endpoint bound to a non-IP address"))?;
    let h = std::thread::spawn(move || {
        while !stop.load(Ordering::Acquire) {
            let req = match server.recv_timeout(Duration::from_millis(100)) {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(_) => continue,
            };
            let path = req.url().split('?').next().unwrap_or("");
            let r = if *req.method() == tiny_http::Method::Get && path == "/metrics" {
                let mut p = Prom::new("ztier");
                report.prometheus(&mut p);
                let ct =
                    tiny_http::Header::from_bytes(&b"Content-Type"[..], &b"text/plain; version=0.0.4"[..])
                        .expect("a valid header");
                req.respond(tiny_http::Response::from_string(p.finish()).with_header(ct))
            } else {
                req.respond(
                    tiny_http::Response::from_string("only GET /metrics here\n").with_status_code(404),
                )
            };
            let _ = r;
        }
    });
    Ok((bound, h))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_and_quantiles() {
        for ns in [0u64, 1023, 1024, 1500, 4096, 1_000_000, 123_456_789] {
            let b = Histogram::bucket(ns);
            assert!(Histogram::upper(b) >= ns, "{ns} in bucket {b} up to {}", Histogram::upper(b));
            if b > 0 {
                assert!(
                    Histogram::upper(b - 1) <= ns,
                    "{ns}: the bucket below ends at {}",
                    Histogram::upper(b - 1)
                );
            }
        }
        let h = Histogram::default();
        for _ in 0..98 {
            h.record(Duration::from_micros(10));
        }
        h.record(Duration::from_millis(5));
        h.record(Duration::from_millis(5));
        assert_eq!(h.count(), 100);
        let p50 = h.quantile_us(0.5);
        assert!((10.0..12.5).contains(&p50), "{p50}");
        let p99 = h.quantile_us(0.99);
        assert!((5000.0..6250.0).contains(&p99), "{p99}");
        let mut p = Prom::new("t");
        p.histogram("lat_seconds", "latency", &[("op", "read")], &h);
        let text = p.finish();
        assert!(text.contains("t_lat_seconds_count{op=\"read\"} 100"), "{text}");
        assert!(text.contains("le=\"+Inf\"} 100"), "{text}");
    }
}
