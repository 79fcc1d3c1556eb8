//! The remote tier's proxy: lives in the `ztier run` process and keeps,
//! for each process of the run, a [`RemoteTier`] (its keys, its index,
//! its Redis connections for gets, and its fallback: a spill file of its
//! own), which the process's library reaches through one unix socket
//! ([`crate::client::ProxyTier`], [`crate::wire`]). The tiers' writes go
//! out through one flusher shared by all ([`crate::hub::Hub`]) on a
//! single server; on a cluster each tier has its own.
//!
//! ```text
//!  process ─┐ @ztier-remote-PID-R (abstract unix socket; HELLO with the
//!  process ─┼─▶ run's token, from the environment)
//!  process ─┘      │ a thread per process: RemoteTier (+ spill file)
//!                  ▼
//!            Redis / Redis Cluster          zt:runs, zt:RUN:alive
//! ```
//!
//! Why here and not in the library: the library lives inside programs
//! that close descriptors they do not know, fork, and must not have
//! threads or allocations of ours in their way; a Redis client brings a
//! descriptor per server, threads, TLS and DNS. The cost is a round trip
//! over the socket per fault served from the remote (measured in
//! `docs/remote.md`). The keys of each process's values stay in this
//! process, never leave the machine, and die with the run.
//!
//! A process's tier ends with its connection (it exited or was killed):
//! its values are deleted then. The run is recorded on the servers
//! ([`crate::tier::RUNS_KEY`]) with a key that says it is alive, renewed
//! while it runs, so that the values of a run whose `ztier run` was
//! killed can be found and removed later ([`crate::tier::remove_dead_runs`],
//! `ztier remote gc`).

use std::io::{self, BufReader, BufWriter, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ztier_run_core::names::env;
use ztier_store::tier::{FileTier, NextTier, TierError};

use crate::config::RemoteConfig;
use crate::hub::Hub;
use crate::stats::{Stats, StatsSnapshot};
use crate::tier::{mark_run, remove_run, RemoteTier, ALIVE_FOR};
use crate::wire::{self, op, reply, KEY, META};
use crate::RemoteError;

/// Entries handed back per `get_many` before a fork.
const TAKE_CHUNK: usize = 64;

/// The local fallback of each process's tier: a spill file in `dir`.
#[derive(Debug, Clone)]
pub struct Spill {
    /// The folder.
    pub dir: PathBuf,
    /// The largest file per process.
    pub max_bytes: u64,
}

struct Shared {
    cfg: RemoteConfig,
    token: [u8; wire::TOKEN],
    spill: Option<Spill>,
    /// The flusher the processes' tiers share (one thread, one
    /// connection, one pipeline for all; a cluster's tiers have their own).
    hub: Hub,
    live: Mutex<Vec<(u64, Arc<RemoteTier>)>>,
    /// Counts of the tiers that ended.
    ended: Stats,
    conns: Mutex<usize>,
    conns_changed: Condvar,
    next_id: AtomicU64,
    stop: AtomicBool,
    /// Deletes that tiers could not send (values left on the servers).
    left: AtomicUsize,
    /// What went wrong with a process's connection (said at the end).
    problems: Mutex<Vec<String>>,
}

/// The proxy (see the module docs). Dropping it without
/// [`Proxy::finish`] stops it too, without the clean-up.
pub struct Proxy {
    shared: Arc<Shared>,
    name: String,
    accept: Option<JoinHandle<()>>,
    heartbeat: Option<JoinHandle<()>>,
    server_cpu: Option<crate::ServerCpu>,
}

/// What a run's end found.
#[derive(Debug, Clone)]
pub struct Ended {
    /// The totals over every process's tier.
    pub stats: StatsSnapshot,
    /// The processes served.
    pub processes: u64,
    /// Values removed at the end by a scan of the servers (those a tier
    /// could not delete itself).
    pub removed_at_end: u64,
    /// What went wrong, in words.
    pub problems: Vec<String>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A spill file in `dir` without a name (`O_TMPFILE`), or one unlinked
/// at once where the file system cannot make those.
fn spill_file(dir: &std::path::Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = std::fs::OpenOptions::new();
    o.read(true).write(true).mode(0o600);
    match o.clone().custom_flags(libc::O_TMPFILE).open(dir) {
        Ok(f) => Ok(f),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOENT | libc::ENOTDIR | libc::EACCES | libc::EROFS)
            ) =>
        {
            Err(io::Error::new(e.kind(), format!("spill directory {}: {e}", dir.display())))
        }
        Err(_) => {
            for n in 0..1000 {
                let path = dir.join(format!("remote-spill.{}.{n}", std::process::id()));
                match o.clone().create_new(true).open(&path) {
                    Ok(f) => {
                        let _ = std::fs::remove_file(&path);
                        return Ok(f);
                    }
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(e),
                }
            }
            Err(io::Error::other(format!("no free spill file name in {}", dir.display())))
        }
    }
}

impl Shared {
    fn fallback(&self) -> io::Result<Option<Box<dyn NextTier>>> {
        Ok(match &self.spill {
            Some(s) => Some(Box::new(FileTier::from_file(spill_file(&s.dir)?, s.max_bytes))),
            None => None,
        })
    }

    fn totals(&self) -> StatsSnapshot {
        let t = Stats::default();
        t.merge(&self.ended);
        for (_, tier) in self.live.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            t.merge(tier.counters());
        }
        t.snapshot()
    }

    fn problem(&self, what: String) {
        let mut p = self.problems.lock().unwrap_or_else(|p| p.into_inner());
        if p.len() < 16 {
            p.push(what);
        }
    }
}

impl Proxy {
    /// Checks the servers (reachable, the credentials, the durability
    /// asked; an error says what is wrong before any program runs),
    /// records the run on them, and starts listening.
    pub fn start(mut cfg: RemoteConfig, spill: Option<Spill>) -> Result<Proxy, RemoteError> {
        let mut token = [0u8; wire::TOKEN / 2];
        getrandom::getrandom(&mut token).map_err(|e| RemoteError::Config(e.to_string()))?;
        let token: [u8; wire::TOKEN] = hex(&token).into_bytes().try_into().expect("32 hex digits");
        let probe_fallback: Option<Box<dyn NextTier>> = match &spill {
            Some(s) => Some(Box::new(FileTier::from_file(
                spill_file(&s.dir).map_err(|e| RemoteError::Config(format!("--spill: {e}")))?,
                s.max_bytes,
            ))),
            None => None,
        };
        let probe = RemoteTier::connect(cfg.clone(), probe_fallback)?;
        cfg.durability = probe.durability();
        cfg.run_id = Some(probe.run_id().to_string());
        let server_cpu = probe.server_cpu();
        drop(probe);
        let run = cfg.run_id.clone().expect("set");
        mark_run(&cfg, &run, true)?;
        let mut name = [0u8; 6];
        getrandom::getrandom(&mut name).map_err(|e| RemoteError::Config(e.to_string()))?;
        let name = format!("ztier-remote-{}-{}", std::process::id(), hex(&name));
        let addr = {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
                .map_err(|e| RemoteError::Config(e.to_string()))?
        };
        let listener = UnixListener::bind_addr(&addr)
            .map_err(|e| RemoteError::Config(format!("the remote tier's socket @{name}: {e}")))?;
        let shared = Arc::new(Shared {
            cfg,
            token,
            spill,
            hub: Hub::new()?,
            live: Mutex::new(Vec::new()),
            ended: Stats::default(),
            conns: Mutex::new(0),
            conns_changed: Condvar::new(),
            next_id: AtomicU64::new(1),
            stop: AtomicBool::new(false),
            left: AtomicUsize::new(0),
            problems: Mutex::new(Vec::new()),
        });
        let accept = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("ztier-proxy".into())
                .spawn(move || accept_loop(shared, listener))
                .map_err(|e| RemoteError::Config(e.to_string()))?
        };
        let heartbeat = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("ztier-alive".into())
                .spawn(move || {
                    let mut last = Instant::now();
                    while !shared.stop.load(Ordering::Acquire) {
                        std::thread::sleep(Duration::from_millis(200));
                        if last.elapsed() >= ALIVE_FOR / 3 {
                            last = Instant::now();
                            let _ = mark_run(&shared.cfg, &run, true);
                        }
                    }
                })
                .map_err(|e| RemoteError::Config(e.to_string()))?
        };
        Ok(Proxy { shared, name, accept: Some(accept), heartbeat: Some(heartbeat), server_cpu })
    }

    /// The environment a process of the run needs to reach the proxy:
    /// [`env::REMOTE_SOCKET`] names the proxy's socket (abstract),
    /// [`env::REMOTE_TOKEN`] holds the run's token (hex).
    pub fn env(&self) -> [(&'static str, String); 2] {
        [
            (env::REMOTE_SOCKET, self.name.clone()),
            (env::REMOTE_TOKEN, String::from_utf8(self.shared.token.to_vec()).expect("hex")),
        ]
    }

    /// Where the server's replies arrived when the proxy started
    /// ([`RemoteTier::server_cpu`]; a single server over plain TCP only):
    /// if [worth following](crate::ServerCpu::worth_following), where the
    /// program's fault handler best runs, so that a get's round trip
    /// stays on one CPU.
    pub fn server_cpu(&self) -> Option<crate::ServerCpu> {
        self.server_cpu
    }

    /// The run id (the namespace of its values on the servers).
    pub fn run_id(&self) -> &str {
        self.shared.cfg.run_id.as_deref().expect("set")
    }

    /// The durability in force (never `auto`).
    pub fn durability(&self) -> crate::Durability {
        self.shared.cfg.durability
    }

    /// The totals over every process's tier so far.
    pub fn stats(&self) -> StatsSnapshot {
        self.shared.totals()
    }

    /// Processes connected now.
    pub fn connected(&self) -> usize {
        *self.shared.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends the run: waits for every process's connection to end (each
    /// tier deletes its values then; `say` is called every 10 s while
    /// some stay), removes what they could not delete, and says on the
    /// servers that the run has ended.
    pub fn finish(mut self, mut say: impl FnMut(usize)) -> Ended {
        {
            let mut n = self.shared.conns.lock().unwrap_or_else(|p| p.into_inner());
            let mut since = Instant::now();
            while *n > 0 {
                n = self
                    .shared
                    .conns_changed
                    .wait_timeout(n, Duration::from_millis(200))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
                if since.elapsed() >= Duration::from_secs(10) && *n > 0 {
                    say(*n);
                    since = Instant::now();
                }
            }
        }
        self.stop_threads();
        let run = self.run_id().to_string();
        let mut problems =
            std::mem::take(&mut *self.shared.problems.lock().unwrap_or_else(|p| p.into_inner()));
        let mut removed = 0;
        if self.shared.left.load(Ordering::Acquire) > 0 {
            match remove_run(&self.shared.cfg, &run) {
                Ok(n) => removed = n,
                Err(e) => problems.push(format!(
                    "the values of run {run} could not all be removed ({e}): `ztier remote gc` removes them later"
                )),
            }
        }
        if removed == 0 || self.shared.left.load(Ordering::Acquire) == 0 {
            if let Err(e) = mark_run(&self.shared.cfg, &run, false) {
                problems.push(format!("run {run} could not be marked as ended ({e})"));
            }
        }
        Ended {
            stats: self.shared.totals(),
            processes: self.shared.next_id.load(Ordering::Acquire) - 1,
            removed_at_end: removed,
            problems,
        }
    }

    fn stop_threads(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Wakes the accepting thread with a connection of our own.
        if self.accept.is_some() {
            use std::os::linux::net::SocketAddrExt;
            if let Ok(a) = std::os::unix::net::SocketAddr::from_abstract_name(self.name.as_bytes()) {
                let _ = UnixStream::connect_addr(&a);
            }
        }
        for h in [self.accept.take(), self.heartbeat.take()].into_iter().flatten() {
            let _ = h.join();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

fn accept_loop(shared: Arc<Shared>, listener: UnixListener) {
    for s in listener.incoming() {
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(s) = s else { continue };
        *shared.conns.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        let sh = shared.clone();
        let r = std::thread::Builder::new().name("ztier-proxy-conn".into()).spawn(move || {
            if let Err(e) = serve(&sh, s) {
                sh.problem(e);
            }
            *sh.conns.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
            sh.conns_changed.notify_all();
        });
        if r.is_err() {
            *shared.conns.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
            shared.problem("cannot start a thread for a process's connection".into());
        }
    }
}

/// The process at the other end of `s` (its PID, as the kernel says).
fn peer_pid(s: &UnixStream) -> i32 {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt fills `cred`, whose size is given.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r == 0 {
        cred.pid
    } else {
        0
    }
}

/// Serves one process: HELLO, then its requests until it closes the
/// connection (or breaks the protocol); its tier ends then.
fn serve(shared: &Shared, s: UnixStream) -> Result<(), String> {
    let pid = peer_pid(&s);
    let mut r = BufReader::with_capacity(256 << 10, s.try_clone().map_err(|e| e.to_string())?);
    let mut w = BufWriter::with_capacity(64 << 10, s);
    let mut body = Vec::new();
    match wire::read_frame(&mut r, &mut body) {
        Ok(Some((op::HELLO, _))) => {}
        // The proxy's own wake-up at the end, or a stranger.
        Ok(None) => return Ok(()),
        Ok(Some((k, _))) => return Err(format!("process {pid}: began with frame kind {k:#x}, not HELLO")),
        Err(e) => return Err(format!("process {pid}: {e}")),
    }
    // The token is compared in full (no early exit on a difference).
    let ok = body.len() == 1 + wire::TOKEN
        && body[0] == wire::VERSION
        && body[1..].iter().zip(shared.token.iter()).fold(0u8, |a, (x, y)| a | (x ^ y)) == 0;
    if !ok {
        let _ = wire::write_frame(&mut w, reply::ERROR, 0, &[b"wrong token or protocol version"]);
        let _ = w.flush();
        return Err(format!("process {pid}: refused (wrong token or protocol version)"));
    }
    let tier = shared.fallback().map_err(|e| e.to_string()).and_then(|f| {
        RemoteTier::connect_shared(shared.cfg.clone(), f, &shared.hub).map_err(|e| e.to_string())
    });
    let tier = match tier {
        Ok(t) => Arc::new(t),
        Err(e) => {
            let _ = wire::write_frame(&mut w, reply::ERROR, 0, &[e.as_bytes()]);
            let _ = w.flush();
            return Err(format!("process {pid}: {e}"));
        }
    };
    let id = shared.next_id.fetch_add(1, Ordering::AcqRel);
    shared.live.lock().unwrap_or_else(|p| p.into_inner()).push((id, tier.clone()));
    let r2 = wire::write_frame(&mut w, reply::TEXT, 0, &[tier.run_id().as_bytes()])
        .and_then(|()| w.flush())
        .and_then(|()| requests(&tier, pid, &mut r, &mut w, &mut body));
    // A process that exits with answers unread resets the connection:
    // an end like any other.
    let r2 = r2.or_else(|e| match e.kind() {
        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe | io::ErrorKind::UnexpectedEof => Ok(()),
        _ => Err(e),
    });
    let left = tier.close();
    shared.left.fetch_add(left, Ordering::AcqRel);
    shared.live.lock().unwrap_or_else(|p| p.into_inner()).retain(|(i, _)| *i != id);
    shared.ended.merge(tier.counters());
    r2.map_err(|e| format!("process {pid}: {e}"))
}

fn requests(
    tier: &RemoteTier,
    pid: i32,
    r: &mut BufReader<UnixStream>,
    w: &mut BufWriter<UnixStream>,
    body: &mut Vec<u8>,
) -> io::Result<()> {
    let mut out = Vec::with_capacity(4096);
    let mut on_cpu = Affinity::new();
    loop {
        // Answers go out when no request waits (puts' answers together).
        if r.buffer().is_empty() {
            w.flush()?;
        }
        let Some((kind, flags)) = wire::read_frame(r, body)? else { return Ok(()) };
        match kind {
            op::PUT => {
                // Not on the CPU of the last get: puts come mid-eviction,
                // whose CPU the faulting thread still needs.
                on_cpu.let_go();
                let key = wire::key_of(kind, body)?;
                let (meta, data) = wire::page_of(kind, &body[KEY..])?;
                match tier.put(key, meta, data) {
                    Ok(()) => wire::write_frame(w, reply::ACK, 0, &[])?,
                    Err(e) => {
                        let why = tier.last_error().unwrap_or_else(|| e.to_string());
                        let why = &why.as_bytes()[..why.len().min(1024)];
                        wire::write_frame(w, reply::REFUSED, 0, &[&body[..KEY + META + data.len()], why])?
                    }
                }
            }
            op::GET => {
                let key = wire::key_of(kind, body)?;
                if let Some(cpu) = body.get(KEY..KEY + 4) {
                    on_cpu.follow(u32::from_le_bytes(cpu.try_into().expect("4 bytes")));
                }
                let served = tier.counters().gets.load(Ordering::Relaxed);
                match tier.get(key, &mut out, flags & 1 != 0) {
                    Ok(Some(meta)) => {
                        // Flag 1: read from the servers (not the queue
                        // or the local copy), for the process's statistics.
                        let from = (tier.counters().gets.load(Ordering::Relaxed) != served) as u8;
                        wire::write_frame(w, reply::VALUE, from, &[&wire::meta_bytes(&meta), &out])?
                    }
                    Ok(None) => wire::write_frame(w, reply::ABSENT, 0, &[])?,
                    Err(e) => {
                        // The I/O error's own words: the library's side
                        // says "next tier I/O" once.
                        let why = match &e {
                            TierError::Io(io) => io.to_string(),
                            e => e.to_string(),
                        };
                        wire::write_frame(w, reply::ERROR, 0, &[&why.as_bytes()[..why.len().min(1024)]])?
                    }
                }
            }
            op::REMOVE => {
                tier.remove(wire::key_of(kind, body)?);
            }
            op::REMOVE_OBJECT => {
                let b: [u8; 12] =
                    body[..].try_into().map_err(|_| wire::WireError::TooShort { kind, len: body.len() })?;
                tier.remove_object(
                    u32::from_le_bytes(b[..4].try_into().expect("4")),
                    u64::from_le_bytes(b[4..].try_into().expect("8")),
                );
            }
            op::REMOVE_POOL => {
                let b: [u8; 4] =
                    body[..].try_into().map_err(|_| wire::WireError::TooShort { kind, len: body.len() })?;
                tier.remove_pool(u32::from_le_bytes(b));
            }
            op::STATS => {
                let mut v = serde_json::to_value(tier.stats()).unwrap_or_default();
                v["durability"] = tier.durability().name().into();
                v["run"] = tier.run_id().into();
                v["entries"] = tier.entries().into();
                v["bytes"] = tier.bytes_used().into();
                wire::write_frame(w, reply::TEXT, 0, &[v.to_string().as_bytes()])?
            }
            op::TAKE_ALL => take_all(tier, w)?,
            k => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("process {pid}: {}", wire::WireError::Kind(k)),
                ))
            }
        }
    }
}

/// The CPUs a proxy connection's thread runs on: the faulting thread's
/// while gets come (the value lands in that CPU's cache, and the wake-up
/// stays on one CPU), any it may use while puts come.
struct Affinity {
    /// The CPUs the thread may use (its mask when it started), if known.
    all: Option<libc::cpu_set_t>,
    /// The CPU it is held on, or `u32::MAX`.
    on: u32,
}

impl Affinity {
    fn new() -> Self {
        // SAFETY: a cpu_set_t is plain data, all zeros an empty set; the
        // calling thread's (0) mask is written into it.
        let all = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            (libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0).then_some(set)
        };
        Affinity { all, on: u32::MAX }
    }

    /// Moves this thread to `cpu` (that of the thread waiting for a get),
    /// if it is not there already and may run there.
    fn follow(&mut self, cpu: u32) {
        if self.all.is_none() || self.on == cpu || cpu as usize >= libc::CPU_SETSIZE as usize {
            return;
        }
        // SAFETY: a cpu_set_t is plain data, all zeros an empty set; the
        // affinity of the calling thread (0) is set from it.
        let ok = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu as usize, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        };
        // Not allowed there (another cpuset): stays where it may run, and
        // does not try again for this CPU.
        self.on = cpu;
        let _ = ok;
    }

    /// Lets the thread run on any of its CPUs again (if it was held on one).
    fn let_go(&mut self) {
        let Some(all) = &self.all else { return };
        if self.on == u32::MAX {
            return;
        }
        // SAFETY: `all` is the mask read at the start; the affinity of the
        // calling thread (0) is set from it.
        unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), all) };
        self.on = u32::MAX;
    }
}

/// Hands every entry back (and drops it here), then END; ERROR on the
/// first that cannot be read.
fn take_all(tier: &RemoteTier, w: &mut BufWriter<UnixStream>) -> io::Result<()> {
    let keys = tier.keys();
    let mut outs = vec![Vec::new(); TAKE_CHUNK];
    for chunk in keys.chunks(TAKE_CHUNK) {
        let got = tier.get_many(chunk, &mut outs[..chunk.len()]);
        let metas = match got {
            Ok(m) => m,
            Err(e) => {
                let why = format!("taking the pages back before a fork: {e}");
                return wire::write_frame(w, reply::ERROR, 0, &[why.as_bytes()]);
            }
        };
        for ((k, m), d) in chunk.iter().zip(metas).zip(&outs) {
            let Some(m) = m else {
                let why = format!(
                    "taking the pages back before a fork: page (pool {} object {} index {}) is gone",
                    k.pool, k.object, k.index
                );
                return wire::write_frame(w, reply::ERROR, 0, &[why.as_bytes()]);
            };
            wire::write_frame(w, reply::VALUE, 0, &[&wire::key_bytes(*k), &wire::meta_bytes(&m), d])?;
        }
        w.flush()?;
        for k in chunk {
            tier.remove(*k);
        }
    }
    wire::write_frame(w, reply::END, 0, &[])
}
