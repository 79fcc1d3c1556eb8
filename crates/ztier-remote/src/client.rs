//! [`ProxyTier`]: the next tier of a process under `ztier run --remote`,
//! which hands its pages to the remote tier's proxy in the `ztier run`
//! process over one unix socket ([`crate::wire`]).
//!
//! The process keeps no Redis client, no TLS, no thread and no key of
//! the remote tier: one descriptor (which the library hides from the
//! program) and a local index of the entries the proxy holds (about 24
//! bytes an entry), so that the store's checks for an entry (one per
//! page put) and the counts cost no round trip.
//!
//! ```text
//!  store ──put──▶ PUT (not waited for; queued, sent OUT_MAX bytes at a
//!                 time or ahead of a GET; acknowledged later, at most
//!                 WINDOW unacknowledged)       ──▶ proxy: RemoteTier::put
//!        ◀─get─── GET (the queue first), waits for its VALUE
//!                                             ◀──       RemoteTier::get
//!  a REFUSED put (no room anywhere) gives the page back: kept here
//!  ("returned"), served from here, and puts fail (Full) for a while
//! ```
//!
//! Fork: the child cannot use its parent's connection, nor its parent's
//! entries in the proxy. So before a fork every entry is taken back
//! (TAKE_ALL, in one stream) and the caller brings the pages back into
//! memory ([`NextTier::prepare_fork`] says `false`); the child connects
//! anew as a process of its own.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ztier_store::tier::{NextTier, SpillMeta, TierError};
use ztier_store::Key;

use crate::hist::Histogram;
use crate::wire::{self, op, reply, WireError, KEY, META};

/// Puts sent and not yet acknowledged, at most.
const WINDOW: usize = 64;
/// Frames that wait for no answer (puts, removes) are held back until
/// this many bytes are (or a request that waits for one goes out): one
/// write, and one wake-up of the proxy, for several pages, rather than a
/// switch to the proxy and back for each.
const OUT_MAX: usize = 32 << 10;
/// After a refused put, puts fail for this long (the store keeps its
/// pages) before the proxy is tried again.
const REFUSED_PAUSE: Duration = Duration::from_millis(250);

/// Makes a connection to the proxy (the library's: a descriptor it
/// hides from the program).
pub type Opener = Box<dyn Fn() -> io::Result<UnixStream> + Send + Sync>;

struct Client {
    sock: Option<UnixStream>,
    /// Bytes read and not yet taken as frames.
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    /// Frames written and not yet sent (see `OUT_MAX`).
    out: Vec<u8>,
    body: Vec<u8>,
    /// Puts not yet answered.
    unacked: usize,
    /// Entries the proxy holds: their lengths.
    held: HashMap<Key, u16>,
    held_bytes: u64,
    /// Entries given back (refused, or taken back before a fork).
    returned: HashMap<Key, (SpillMeta, Vec<u8>)>,
    returned_bytes: u64,
    refusing_until: Option<Instant>,
    last_error: Option<String>,
    /// Set once the connection failed: every call fails with it.
    broken: Option<String>,
    run: String,
}

/// A next tier in the `ztier run` process's remote tier (see the module
/// docs). A clone is the same tier (for its statistics, say).
#[derive(Clone)]
pub struct ProxyTier {
    open: Arc<Opener>,
    token: [u8; wire::TOKEN],
    st: Arc<Mutex<Client>>,
    /// Gets from the proxy, as this process waits for them (the round
    /// trip to the proxy and the proxy's get).
    get_ns: Arc<Histogram>,
    /// Those of them the proxy read from the servers.
    remote_get_ns: Arc<Histogram>,
    /// Puts as this process spent them (the frame sent, the answers come
    /// taken, and a wait for them when `WINDOW` are unanswered).
    put_ns: Arc<Histogram>,
}

fn io_err(msg: impl Into<String>) -> TierError {
    TierError::Io(io::Error::other(msg.into()))
}

impl ProxyTier {
    /// Connects (`open`) and introduces itself with the run's `token`.
    pub fn connect(open: Opener, token: &[u8]) -> io::Result<ProxyTier> {
        let token: [u8; wire::TOKEN] = token.try_into().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("remote token: {} bytes expected", wire::TOKEN),
            )
        })?;
        let t = ProxyTier {
            open: Arc::new(open),
            token,
            get_ns: Arc::new(Histogram::default()),
            remote_get_ns: Arc::new(Histogram::default()),
            put_ns: Arc::new(Histogram::default()),
            st: Arc::new(Mutex::new(Client {
                sock: None,
                rbuf: Vec::new(),
                wbuf: Vec::new(),
                out: Vec::new(),
                body: Vec::new(),
                unacked: 0,
                held: HashMap::new(),
                held_bytes: 0,
                returned: HashMap::new(),
                returned_bytes: 0,
                refusing_until: None,
                last_error: None,
                broken: None,
                run: String::new(),
            })),
        };
        {
            let mut c = t.lock();
            t.hello(&mut c)?;
        }
        Ok(t)
    }

    fn lock(&self) -> MutexGuard<'_, Client> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Connects and says HELLO (in a forked child, at its first call).
    fn hello(&self, c: &mut Client) -> io::Result<()> {
        c.sock = Some((self.open)()?);
        c.rbuf.clear();
        c.out.clear();
        c.unacked = 0;
        c.broken = None;
        let mut w = Vec::new();
        wire::frame(&mut w, op::HELLO, 0, &[&[wire::VERSION], &self.token]);
        c.send(&w)?;
        match c.next_reply()? {
            (reply::TEXT, _) => {
                c.run = String::from_utf8_lossy(&c.body).into_owned();
                Ok(())
            }
            (reply::ERROR, _) => Err(io::Error::other(format!(
                "the remote tier's proxy refused this process: {}",
                String::from_utf8_lossy(&c.body)
            ))),
            (k, _) => Err(WireError::Kind(k).into()),
        }
    }

    /// The run id the proxy gave (the namespace of its values).
    pub fn run_id(&self) -> String {
        self.lock().run.clone()
    }

    /// The remote tier's statistics for this process, as one JSON
    /// object: the proxy's (its tier's `StatsSnapshot`), and the gets as
    /// this process waited for them (`proxied_gets`,
    /// `proxied_get_p50_us`, `proxied_get_p99_us`: the round trip to the
    /// proxy included; `proxied_remote_*`: those the proxy read from the
    /// servers), and the time a put took this process
    /// (`proxied_put_p50_us`, `proxied_put_p99_us`: the send, and the
    /// wait for answers when too many are outstanding).
    pub fn stats_json(&self) -> io::Result<String> {
        let mut c = self.lock();
        c.usable()?;
        // A forked child that has not used the tier has nothing there.
        let text = if c.sock.is_none() {
            "{}".to_string()
        } else {
            let mut w = Vec::new();
            wire::frame(&mut w, op::STATS, 0, &[]);
            c.send(&w)?;
            match c.next_reply()? {
                (reply::TEXT, _) => String::from_utf8_lossy(&c.body).into_owned(),
                (k, _) => return Err(c.fail(WireError::Kind(k).into())),
            }
        };
        let h = &self.get_ns;
        let p = &self.put_ns;
        let r = &self.remote_get_ns;
        let mine = format!(
            "\"proxied_gets\":{},\"proxied_get_p50_us\":{},\"proxied_get_p99_us\":{},\
             \"proxied_remote_gets\":{},\"proxied_remote_get_p50_us\":{},\"proxied_remote_get_p99_us\":{},\
             \"proxied_put_p50_us\":{},\"proxied_put_p99_us\":{}",
            h.count(),
            h.quantile(0.5) as f64 / 1000.0,
            h.quantile(0.99) as f64 / 1000.0,
            r.count(),
            r.quantile(0.5) as f64 / 1000.0,
            r.quantile(0.99) as f64 / 1000.0,
            p.quantile(0.5) as f64 / 1000.0,
            p.quantile(0.99) as f64 / 1000.0
        );
        Ok(match text.trim_end().strip_suffix('}') {
            Some(head) if head.trim_end().ends_with('{') => format!("{head}{mine}}}"),
            Some(head) => format!("{head},{mine}}}"),
            None => format!("{{{mine}}}"),
        })
    }
}

impl Client {
    /// The connection, made now if this is a forked child's first call.
    fn ready(&mut self, t: &ProxyTier) -> io::Result<()> {
        self.usable()?;
        if self.sock.is_none() {
            t.hello(self).map_err(|e| self.fail(e))?;
        }
        Ok(())
    }

    fn usable(&self) -> io::Result<()> {
        match &self.broken {
            Some(why) => Err(io::Error::other(why.clone())),
            None => Ok(()),
        }
    }

    /// The connection failed: closed, and said from now on.
    fn fail(&mut self, e: io::Error) -> io::Error {
        self.sock = None;
        self.out.clear();
        let why = format!("the connection to the remote tier's proxy (the ztier run process) failed: {e}");
        self.broken = Some(why.clone());
        self.last_error = Some(why.clone());
        io::Error::other(why)
    }

    /// Queues frame `b`; sent once `OUT_MAX` bytes are queued, or before
    /// this process waits for an answer ([`Client::fill`]).
    fn send(&mut self, b: &[u8]) -> io::Result<()> {
        if self.sock.is_none() {
            return Err(self.fail(io::ErrorKind::NotConnected.into()));
        }
        self.out.extend_from_slice(b);
        if self.out.len() >= OUT_MAX {
            self.write_out().map_err(|e| self.fail(e))?;
        }
        Ok(())
    }

    /// Sends the frames queued.
    fn write_out(&mut self) -> io::Result<()> {
        if self.out.is_empty() {
            return Ok(());
        }
        let r = match self.sock.as_mut() {
            Some(s) => s.write_all(&self.out),
            None => Err(io::ErrorKind::NotConnected.into()),
        };
        self.out.clear();
        r
    }

    /// Reads more bytes into `rbuf`; `wait`: blocks until some come.
    /// Returns whether any came.
    fn fill(&mut self, wait: bool) -> io::Result<bool> {
        if wait {
            // What is waited for may be an answer to a frame queued.
            self.write_out()?;
        }
        let Some(s) = self.sock.as_mut() else { return Err(io::ErrorKind::NotConnected.into()) };
        let at = self.rbuf.len();
        self.rbuf.resize(at + (64 << 10), 0);
        let r = if wait {
            loop {
                match s.read(&mut self.rbuf[at..]) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    r => break r,
                }
            }
        } else {
            // SAFETY: recv into the tail of our buffer, which is that long.
            let n = unsafe {
                libc::recv(
                    s.as_raw_fd(),
                    self.rbuf[at..].as_mut_ptr().cast(),
                    self.rbuf.len() - at,
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(usize::MAX),
                    _ => Err(e),
                }
            } else {
                Ok(n as usize)
            }
        };
        match r {
            Ok(usize::MAX) => {
                self.rbuf.truncate(at);
                Ok(false)
            }
            Ok(0) => {
                self.rbuf.truncate(at);
                Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the proxy closed the connection"))
            }
            Ok(n) => {
                self.rbuf.truncate(at + n);
                Ok(true)
            }
            Err(e) => {
                self.rbuf.truncate(at);
                Err(e)
            }
        }
    }

    /// The next whole frame in `rbuf` (its body moved into `body`), if
    /// there is one.
    fn take_frame(&mut self) -> io::Result<Option<(u8, u8)>> {
        if self.rbuf.len() < wire::HEADER {
            return Ok(None);
        }
        let h: [u8; wire::HEADER] = self.rbuf[..wire::HEADER].try_into().expect("8 bytes");
        let (kind, flags, len) = wire::parse_header(&h)?;
        if self.rbuf.len() < wire::HEADER + len {
            return Ok(None);
        }
        self.body.clear();
        self.body.extend_from_slice(&self.rbuf[wire::HEADER..wire::HEADER + len]);
        self.rbuf.drain(..wire::HEADER + len);
        Ok(Some((kind, flags)))
    }

    /// Takes a put's answer (ACK or REFUSED) from `body`.
    fn put_answered(&mut self, kind: u8) -> io::Result<()> {
        self.unacked = self.unacked.saturating_sub(1);
        if kind == reply::ACK {
            return Ok(());
        }
        // REFUSED: key ‖ meta ‖ bytes ‖ message. The page is kept here.
        let key = wire::key_of(kind, &self.body)?;
        let (meta, data) = wire::page_of(kind, &self.body[KEY..])?;
        let data = data.to_vec();
        let why = String::from_utf8_lossy(&self.body[KEY + META + data.len()..]).into_owned();
        if let Some(len) = self.held.remove(&key) {
            self.held_bytes -= len as u64;
        }
        self.returned_bytes += data.len() as u64;
        if let Some((_, old)) = self.returned.insert(key, (meta, data)) {
            self.returned_bytes -= old.len() as u64;
        }
        self.refusing_until = Some(Instant::now() + REFUSED_PAUSE);
        self.last_error = Some(why);
        Ok(())
    }

    /// The next reply that is not a put's answer (those are taken on the
    /// way), blocking.
    fn next_reply(&mut self) -> io::Result<(u8, u8)> {
        loop {
            match self.take_frame() {
                Ok(Some((k, _))) if k == reply::ACK || k == reply::REFUSED => {
                    self.put_answered(k).map_err(|e| self.fail(e))?;
                }
                Ok(Some(f)) => return Ok(f),
                Ok(None) => {
                    self.fill(true).map_err(|e| self.fail(e))?;
                }
                Err(e) => return Err(self.fail(e)),
            }
        }
    }

    /// Takes the puts' answers that have come; `until`: blocks until at
    /// most that many puts are unanswered.
    fn drain(&mut self, until: usize) -> io::Result<()> {
        loop {
            while let Some((k, _)) = self.take_frame().map_err(|e| self.fail(e))? {
                if k != reply::ACK && k != reply::REFUSED {
                    return Err(self.fail(WireError::Kind(k).into()));
                }
                self.put_answered(k).map_err(|e| self.fail(e))?;
            }
            if self.unacked <= until {
                if !self.fill(false).map_err(|e| self.fail(e))? {
                    return Ok(());
                }
            } else {
                self.fill(true).map_err(|e| self.fail(e))?;
            }
        }
    }

    fn forget(&mut self, key: Key) -> bool {
        let mut found = false;
        if let Some((_, d)) = self.returned.remove(&key) {
            self.returned_bytes -= d.len() as u64;
            found = true;
        }
        if let Some(len) = self.held.remove(&key) {
            self.held_bytes -= len as u64;
            found = true;
        }
        found
    }
}

impl NextTier for ProxyTier {
    fn name(&self) -> String {
        "remote (through ztier run)".into()
    }

    fn put(&self, key: Key, meta: SpillMeta, data: &[u8]) -> Result<(), TierError> {
        let mut c = self.lock();
        c.ready(self)?;
        if let Some((_, d)) = c.returned.remove(&key) {
            c.returned_bytes -= d.len() as u64;
        }
        if c.refusing_until.is_some_and(|t| Instant::now() < t) {
            return Err(TierError::Full);
        }
        let t = Instant::now();
        let mut w = std::mem::take(&mut c.wbuf);
        w.clear();
        wire::frame(&mut w, op::PUT, 0, &[&wire::key_bytes(key), &wire::meta_bytes(&meta), data]);
        let r = c.send(&w);
        c.wbuf = w;
        r?;
        c.unacked += 1;
        if let Some(old) = c.held.insert(key, data.len() as u16) {
            c.held_bytes -= old as u64;
        }
        c.held_bytes += data.len() as u64;
        // Answers are looked for when frames went out (or too many wait).
        if c.out.is_empty() || c.unacked > WINDOW {
            c.drain(WINDOW)?;
        }
        self.put_ns.record(t.elapsed().as_nanos() as u64);
        Ok(())
    }

    fn get(&self, key: Key, out: &mut Vec<u8>, remove: bool) -> Result<Option<SpillMeta>, TierError> {
        let mut c = self.lock();
        if let Some((meta, d)) = c.returned.get(&key) {
            let meta = *meta;
            out.clear();
            out.extend_from_slice(d);
            if remove {
                c.forget(key);
            }
            return Ok(Some(meta));
        }
        if !c.held.contains_key(&key) {
            return Ok(None);
        }
        c.ready(self)?;
        let t = Instant::now();
        let mut w = std::mem::take(&mut c.wbuf);
        w.clear();
        // The CPU this thread runs on: the proxy serves the get there,
        // so that neither waits for a wake-up on another CPU.
        // SAFETY: sched_getcpu has no preconditions.
        let cpu = unsafe { libc::sched_getcpu() };
        wire::frame(&mut w, op::GET, remove as u8, &[&wire::key_bytes(key), &(cpu as u32).to_le_bytes()]);
        let r = c.send(&w);
        c.wbuf = w;
        r?;
        let (kind, flags) = c.next_reply()?;
        let ns = t.elapsed().as_nanos() as u64;
        self.get_ns.record(ns);
        if kind == reply::VALUE && flags & 1 != 0 {
            self.remote_get_ns.record(ns);
        }
        match kind {
            reply::VALUE => {
                let meta = match wire::page_of(kind, &c.body) {
                    Ok((meta, data)) => {
                        out.clear();
                        out.extend_from_slice(data);
                        meta
                    }
                    Err(e) => return Err(c.fail(e.into()).into()),
                };
                if remove {
                    c.forget(key);
                }
                Ok(Some(meta))
            }
            reply::ABSENT => {
                c.forget(key);
                let why = format!(
                    "the remote tier lost page (pool {} object {} index {})",
                    key.pool, key.object, key.index
                );
                c.last_error = Some(why.clone());
                Err(io_err(why))
            }
            reply::ERROR => {
                let why = String::from_utf8_lossy(&c.body).into_owned();
                c.last_error = Some(why.clone());
                Err(io_err(why))
            }
            k => Err(c.fail(WireError::Kind(k).into()).into()),
        }
    }

    fn remove(&self, key: Key) -> bool {
        let mut c = self.lock();
        let held = c.held.contains_key(&key);
        let found = c.forget(key);
        if held && c.usable().is_ok() {
            let mut w = Vec::with_capacity(wire::HEADER + KEY);
            wire::frame(&mut w, op::REMOVE, 0, &[&wire::key_bytes(key)]);
            let _ = c.send(&w);
        }
        found
    }

    /// Held by the proxy (as far as this process knows: a page the
    /// remote lost is found out by its get) or given back.
    fn contains(&self, key: Key) -> bool {
        let c = self.lock();
        c.held.contains_key(&key) || c.returned.contains_key(&key)
    }

    fn remove_object(&self, pool: u32, object: u64) -> usize {
        let mut c = self.lock();
        let keys: Vec<Key> = c
            .held
            .keys()
            .chain(c.returned.keys())
            .filter(|k| k.pool == pool && k.object == object)
            .copied()
            .collect();
        let held = keys.iter().any(|k| c.held.contains_key(k));
        let n = keys.iter().filter(|&&k| c.forget(k)).count();
        if held && c.usable().is_ok() {
            let mut w = Vec::new();
            wire::frame(&mut w, op::REMOVE_OBJECT, 0, &[&pool.to_le_bytes(), &object.to_le_bytes()]);
            let _ = c.send(&w);
        }
        n
    }

    fn remove_pool(&self, pool: u32) -> usize {
        let mut c = self.lock();
        let keys: Vec<Key> =
            c.held.keys().chain(c.returned.keys()).filter(|k| k.pool == pool).copied().collect();
        let held = keys.iter().any(|k| c.held.contains_key(k));
        let n = keys.iter().filter(|&&k| c.forget(k)).count();
        if held && c.usable().is_ok() {
            let mut w = Vec::new();
            wire::frame(&mut w, op::REMOVE_POOL, 0, &[&pool.to_le_bytes()]);
            let _ = c.send(&w);
        }
        n
    }

    fn entries(&self) -> usize {
        let c = self.lock();
        c.held.len() + c.returned.len()
    }

    fn bytes_used(&self) -> u64 {
        let c = self.lock();
        c.held_bytes + c.returned_bytes
    }

    fn last_error(&self) -> Option<String> {
        self.lock().last_error.clone()
    }

    /// Takes every entry back from the proxy (the child cannot reach
    /// its parent's), and says `false`: the caller brings the pages back
    /// into memory, from here.
    fn prepare_fork(&self) -> Result<bool, TierError> {
        let mut c = self.lock();
        c.ready(self)?;
        c.drain(0)?;
        if c.held.is_empty() {
            return Ok(false);
        }
        let mut w = Vec::new();
        wire::frame(&mut w, op::TAKE_ALL, 0, &[]);
        c.send(&w)?;
        loop {
            let (kind, _) = c.next_reply()?;
            match kind {
                reply::VALUE => {
                    let key = wire::key_of(kind, &c.body).map_err(|e| c.fail(e.into()))?;
                    let (meta, data) = match wire::page_of(kind, &c.body[KEY..]) {
                        Ok((meta, data)) => (meta, data.to_vec()),
                        Err(e) => return Err(c.fail(e.into()).into()),
                    };
                    c.forget(key);
                    c.returned_bytes += data.len() as u64;
                    c.returned.insert(key, (meta, data));
                }
                reply::END => break,
                reply::ERROR => {
                    let why = String::from_utf8_lossy(&c.body).into_owned();
                    c.last_error = Some(why.clone());
                    return Err(io_err(why));
                }
                k => return Err(c.fail(WireError::Kind(k).into()).into()),
            }
        }
        Ok(false)
    }

    /// A child of its own: a connection of its own, made at its first
    /// call (a child that only execs makes none; the parent's is left
    /// alone: closing this copy sends nothing), and none of its parent's
    /// entries in the proxy (all were taken back before the fork).
    fn after_fork(&self) -> Result<(), TierError> {
        let mut c = self.lock();
        // Dropping the parent's connection closes the child's copy only.
        c.sock = None;
        c.rbuf.clear();
        // The parent's frames not sent yet are the parent's to send.
        c.out.clear();
        c.unacked = 0;
        c.held.clear();
        c.held_bytes = 0;
        c.refusing_until = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn meta(len: u16) -> SpillMeta {
        SpillMeta { tag: 1, flags: 0, len, crc: 7, pattern: 0 }
    }

    fn key(i: u32) -> Key {
        Key { pool: 1, object: 0, index: i }
    }

    /// A client whose proxy is `script`, run on the other end of a
    /// socket pair in a thread.
    fn with_proxy(
        script: impl FnOnce(&mut UnixStream) + Send + 'static,
    ) -> (ProxyTier, std::thread::JoinHandle<()>) {
        let (a, mut b) = UnixStream::pair().unwrap();
        let a = Mutex::new(Some(a));
        let h = std::thread::spawn(move || {
            let mut body = Vec::new();
            assert_eq!(wire::read_frame(&mut b, &mut body).unwrap(), Some((op::HELLO, 0)));
            assert_eq!(&body[1..], &[b'x'; wire::TOKEN]);
            wire::write_frame(&mut b, reply::TEXT, 0, &[b"0123456789ab"]).unwrap();
            script(&mut b);
        });
        let open: Opener =
            Box::new(move || a.lock().unwrap().take().ok_or_else(|| io::Error::other("connected once")));
        (ProxyTier::connect(open, &[b'x'; wire::TOKEN]).unwrap(), h)
    }

    /// Puts go out without a wait; a refused one comes back and is
    /// served from here; puts are refused for a while after; a get of
    /// an entry the proxy holds asks it; a removed one is said.
    #[test]
    fn puts_refusals_and_gets() {
        let (t, h) = with_proxy(|s| {
            let mut body = Vec::new();
            // Put 0 taken, put 1 refused (given back).
            for i in 0..2 {
                assert_eq!(wire::read_frame(s, &mut body).unwrap(), Some((op::PUT, 0)));
                assert_eq!(wire::key_of(op::PUT, &body).unwrap(), key(i));
                if i == 0 {
                    wire::write_frame(s, reply::ACK, 0, &[]).unwrap();
                } else {
                    let b = body.clone();
                    wire::write_frame(s, reply::REFUSED, 0, &[&b, b"no room anywhere"]).unwrap();
                }
            }
            assert_eq!(wire::read_frame(s, &mut body).unwrap().map(|f| f.0), Some(op::GET));
            assert_eq!(wire::key_of(op::GET, &body).unwrap(), key(0));
            wire::write_frame(s, reply::VALUE, 0, &[&wire::meta_bytes(&meta(3)), b"abc"]).unwrap();
            assert_eq!(wire::read_frame(s, &mut body).unwrap(), Some((op::REMOVE, 0)));
            assert_eq!(wire::key_of(op::REMOVE, &body).unwrap(), key(0));
            // Then a reply of a kind a get cannot have.
            assert_eq!(wire::read_frame(s, &mut body).unwrap().map(|f| f.0), Some(op::PUT));
            wire::write_frame(s, reply::ACK, 0, &[]).unwrap();
            assert_eq!(wire::read_frame(s, &mut body).unwrap().map(|f| f.0), Some(op::GET));
            wire::write_frame(s, reply::END, 0, &[]).unwrap();
            let _ = s.read(&mut [0u8; 1]);
        });
        t.put(key(0), meta(3), b"abc").unwrap();
        t.put(key(1), meta(3), b"xyz").unwrap();
        let mut out = Vec::new();
        // The refusal is read with the get's reply; key 1 is here then.
        assert_eq!(t.get(key(0), &mut out, false).unwrap(), Some(meta(3)));
        assert_eq!(out, b"abc");
        assert_eq!(t.get(key(1), &mut out, false).unwrap(), Some(meta(3)));
        assert_eq!(out, b"xyz");
        assert_eq!(t.last_error().as_deref(), Some("no room anywhere"));
        assert!(matches!(t.put(key(2), meta(1), b"q"), Err(TierError::Full)));
        assert_eq!((t.entries(), t.bytes_used()), (2, 6));
        // Absent here: no round trip.
        assert_eq!(t.get(key(9), &mut out, false).unwrap(), None);
        assert!(t.remove(key(0)));
        assert!(!t.remove(key(0)));
        std::thread::sleep(REFUSED_PAUSE);
        t.put(key(3), meta(1), b"q").unwrap();
        let e = t.get(key(3), &mut out, false).unwrap_err().to_string();
        assert!(e.contains("unexpected frame kind"), "{e}");
        // The connection is given up on, and says so.
        let e = t.put(key(4), meta(1), b"q").unwrap_err().to_string();
        assert!(e.contains("proxy") && e.contains("failed"), "{e}");
        h.join().unwrap();
    }

    /// Puts are queued: none reaches the proxy until a request that
    /// waits (here a get) goes out, and then all of them, in order,
    /// ahead of it; `OUT_MAX` bytes of puts go out without one.
    #[test]
    fn puts_are_queued_until_a_get_or_enough_bytes() {
        let (queued_tx, queued_rx) = std::sync::mpsc::channel::<()>();
        let (seen_tx, seen_rx) = std::sync::mpsc::channel::<()>();
        let big = vec![7u8; 4000];
        let n_big = OUT_MAX / big.len() + 1;
        let (t, h) = with_proxy(move |s| {
            let mut body = Vec::new();
            queued_rx.recv().unwrap();
            s.set_nonblocking(true).unwrap();
            let mut b = [0u8; 1];
            let e = s.read(&mut b).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "a put was sent before a get");
            s.set_nonblocking(false).unwrap();
            seen_tx.send(()).unwrap();
            for i in 0..3 {
                assert_eq!(wire::read_frame(s, &mut body).unwrap(), Some((op::PUT, 0)));
                assert_eq!(wire::key_of(op::PUT, &body).unwrap(), key(i));
                wire::write_frame(s, reply::ACK, 0, &[]).unwrap();
            }
            assert_eq!(wire::read_frame(s, &mut body).unwrap().map(|f| f.0), Some(op::GET));
            wire::write_frame(s, reply::VALUE, 0, &[&wire::meta_bytes(&meta(3)), b"abc"]).unwrap();
            // Then big puts, with no get: they go out on their own.
            for i in 0..n_big as u32 {
                assert_eq!(wire::read_frame(s, &mut body).unwrap(), Some((op::PUT, 0)));
                assert_eq!(wire::key_of(op::PUT, &body).unwrap(), key(10 + i));
            }
            // Until the client goes away.
            let _ = s.read(&mut [0u8; 1]);
        });
        for i in 0..3 {
            t.put(key(i), meta(3), b"abc").unwrap();
        }
        queued_tx.send(()).unwrap();
        // The proxy has looked (and found nothing) before the get.
        seen_rx.recv().unwrap();
        let mut out = Vec::new();
        assert_eq!(t.get(key(1), &mut out, false).unwrap(), Some(meta(3)));
        assert_eq!(out, b"abc");
        for i in 0..n_big as u32 {
            t.put(key(10 + i), meta(4000), &big).unwrap();
        }
        drop(t);
        h.join().unwrap();
    }

    /// A proxy that sends garbage, a frame too long, or goes away: errors,
    /// not a crash or a hang; a refusal of HELLO is said.
    #[test]
    fn bad_proxies_are_errors() {
        for bad in
            [&b"\x83\x00\x00\x00\xff\xff\xff\x7f"[..], &b"\x83\x00\x00\x00\x02\x00\x00\x00x"[..], &b""[..]]
        {
            let (t, h) = with_proxy(move |s| {
                let mut body = Vec::new();
                assert_eq!(wire::read_frame(s, &mut body).unwrap().map(|f| f.0), Some(op::PUT));
                wire::write_frame(s, reply::ACK, 0, &[]).unwrap();
                assert_eq!(wire::read_frame(s, &mut body).unwrap().map(|f| f.0), Some(op::GET));
                s.write_all(bad).unwrap();
                let _ = s.shutdown(std::net::Shutdown::Write);
            });
            t.put(key(0), meta(3), b"abc").unwrap();
            assert!(t.get(key(0), &mut Vec::new(), false).is_err());
            h.join().unwrap();
        }
        let (a, mut b) = UnixStream::pair().unwrap();
        let h = std::thread::spawn(move || {
            let mut body = Vec::new();
            wire::read_frame(&mut b, &mut body).unwrap();
            wire::write_frame(&mut b, reply::ERROR, 0, &[b"wrong token or protocol version"]).unwrap();
        });
        let a = Mutex::new(Some(a));
        let open: Opener = Box::new(move || a.lock().unwrap().take().ok_or_else(|| io::Error::other("once")));
        let e = ProxyTier::connect(open, &[b'y'; wire::TOKEN]).err().unwrap().to_string();
        assert!(e.contains("refused this process") && e.contains("wrong token"), "{e}");
        h.join().unwrap();
    }
}
