//! [`RemoteTier`]: the store's next tier in remote RAM.
//!
//! ```text
//!  store (evicts, under a shard's lock)
//!    │ put: sealed here (MAC, or AES-GCM), in the caller's thread,
//!    │      and queued (µs); the flusher only copies it out
//!    ▼
//!  pending queue ──flusher thread──▶ SET × batch_pages under one hash tag,
//!    │  (full: the remote is      │    batches of several tags in one pipeline
//!    │   slow → fallback)         │    (one per node), then WAIT 1 (replica)
//!    │                            ├──▶ acknowledged: the page is remote (and,
//!    │                            │    durability local, copied to the fallback)
//!    │                            └──▶ failed: the batch goes to the fallback;
//!    │                                 puts go there too for a while (backoff)
//!    ▼
//!  get: pending → copy; remote → GET in the caller's thread on a pooled
//!       connection, MAC checked; fallback → its get. Deletes are batched.
//! ```
//!
//! The tier keeps an index of its pages in local memory (about 60 bytes
//! a page: key, metadata, sequence number, where it is), so a put never
//! waits for the network, a miss costs no round trip, and a page's
//! value is accepted back only with the sequence number it was written
//! with ([`crate::seal`]).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ztier_store::tier::{NextTier, SpillMeta, TierError};
use ztier_store::Key;

use crate::config::{Durability, RemoteConfig};
use crate::getter::Getter;
use crate::link::{hash_tag, push_decimal, spread_tags, Connector, Link, Topology};
use crate::seal::{hex, Writer, OVERHEAD};
use crate::stats::{Stats, StatsSnapshot};
use crate::RemoteError;

/// Hash tags a tier spreads its batches over.
const TAGS: usize = 64;
/// Deletes sent with one batch, at most.
const UNLINKS_PER_ROUND: usize = 512;
/// Deletes kept for later while the remote is down, at most (beyond,
/// the values stay until the run's end removes them).
const UNLINKS_KEPT: usize = 1 << 20;
/// Idle flusher's look at the cluster's masters (failovers), this often.
const TOPOLOGY_EVERY: Duration = Duration::from_secs(1);

/// A page waiting to be written, sealed in the putting thread (so that
/// a flusher only copies it into a pipeline): its value and the id of
/// its name ([`Writer::name_id`]), both made by `writer`. Only a writer
/// that encrypts and keeps local copies (durability `local`,
/// `replica+local`) keeps the entry's bytes instead, sealed when
/// written: the local copy needs them, and opening each page again
/// would cost a second AES pass.
///
/// The index entry and the queue (then the round) hold the same bytes:
/// while the page is neither in a round nor replaced, two holders; a
/// page replaced or removed meanwhile has lost the index's
/// ([`Waiting::current`]).
#[derive(Clone)]
struct Waiting {
    bytes: Arc<Vec<u8>>,
    form: Form,
    writer: Arc<Writer>,
    id: [u8; 24],
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    /// The entry's bytes (sealed when written).
    Plain,
    /// Sealed with the MAC: its first `len - OVERHEAD` bytes are the
    /// entry's.
    Mac,
    /// Sealed and encrypted: the entry's bytes come back by opening it.
    Encrypted,
}

impl Waiting {
    /// The entry's length.
    fn plain_len(&self) -> usize {
        match self.form {
            Form::Plain => self.bytes.len(),
            Form::Mac | Form::Encrypted => self.bytes.len() - OVERHEAD,
        }
    }

    /// The entry's bytes, into `out` (emptied first). Opening a page
    /// sealed here fails only if its memory was changed.
    fn plain_into(&self, key: Key, meta: &SpillMeta, seq: u64, out: &mut Vec<u8>) -> Result<(), TierError> {
        out.clear();
        match self.form {
            Form::Plain => out.extend_from_slice(&self.bytes),
            Form::Mac => out.extend_from_slice(&self.bytes[..self.plain_len()]),
            Form::Encrypted => self
                .writer
                .open(key, meta, seq, &self.bytes, out)
                .map_err(|e| io_err(format!("a page waiting to be written: {e}")))?,
        }
        Ok(())
    }

    /// The entry's bytes, borrowed where they are kept plain.
    fn plain(&self, key: Key, meta: &SpillMeta, seq: u64) -> Result<std::borrow::Cow<'_, [u8]>, TierError> {
        match self.form {
            Form::Plain => Ok(std::borrow::Cow::Borrowed(&self.bytes)),
            Form::Mac => Ok(std::borrow::Cow::Borrowed(&self.bytes[..self.plain_len()])),
            Form::Encrypted => {
                let mut v = Vec::with_capacity(self.bytes.len());
                self.plain_into(key, meta, seq, &mut v)?;
                Ok(std::borrow::Cow::Owned(v))
            }
        }
    }

    /// Whether the page is still the one its index entry waits with
    /// (asked, under the tier's lock, by the queue's or the round's
    /// holder: the index holds the other).
    fn current(&self) -> bool {
        Arc::strong_count(&self.bytes) >= 2
    }
}

/// A page in the queue: key, metadata, sequence number, bytes.
type Queued = (Key, SpillMeta, u64, Waiting);

enum At {
    /// Waiting to be written.
    Pending(Waiting),
    /// On the remote, under tag `tag`, written by writer `gen`; `local`:
    /// a copy is in the fallback too.
    Remote { tag: u16, gen: u16, local: bool, vlen: u32 },
    /// In the fallback only.
    Local,
}

struct Entry {
    meta: SpillMeta,
    seq: u64,
    at: At,
}

struct State {
    writers: Vec<Arc<Writer>>,
    index: HashMap<Key, Entry>,
    queue: VecDeque<Queued>,
    /// Bytes of the pages waiting to be written (the room a put
    /// needs; a page replaced or removed gives its room back at once).
    pending_bytes: usize,
    /// Bytes of pages replaced or removed while waiting that the queue
    /// or a round still holds (until the flusher passes them; the queue
    /// is swept of them when they pass `pending_bytes`' limit).
    stale_bytes: usize,
    unlinks: Vec<Vec<u8>>,
    next_tag: usize,
    remote_bytes: u64,
    down_until: Option<Instant>,
    backoff: Duration,
    stop: bool,
    paused: bool,
    busy: bool,
    /// The page whose local copy the flusher is writing (without the
    /// lock): a put of it waits until that is done.
    copying: Option<Key>,
    last_error: Option<String>,
    /// Puts (and forks) waiting on `Inner::done` for a settled round:
    /// woken after every round.
    waiters: usize,
    /// `flush` calls waiting on `Inner::done`: woken only once the
    /// queue is empty (a wake-up per round was a switch per round for
    /// each flushing thread, most of them for nothing).
    flushers: usize,
}

/// How a flusher is woken: rung by a tier with work for it. A ring
/// while the flusher is not waiting costs no system call.
#[derive(Default)]
pub(crate) struct Bell {
    /// Rung, and whether the flusher waits.
    state: Mutex<(bool, bool)>,
    cv: Condvar,
}

impl Bell {
    pub(crate) fn ring(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.0 = true;
        if s.1 {
            self.cv.notify_one();
        }
    }

    /// Clears the bell (before looking for work: a ring after this is
    /// not lost).
    pub(crate) fn clear(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).0 = false;
    }

    /// Waits until rung or `d` has passed.
    pub(crate) fn wait(&self, d: Duration) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.1 = true;
        let mut s = self.cv.wait_timeout_while(s, d, |s| !s.0).unwrap_or_else(|p| p.into_inner()).0;
        s.1 = false;
    }
}

/// What a shared flusher finds at a tier.
pub(crate) enum Found {
    /// The tier is gone (dropped).
    Gone,
    /// Nothing to write (paused, or no work).
    Idle,
    /// Backing off until then.
    Down(Instant),
    /// A round to write (the tier is busy until it is settled).
    Round(Round),
}

pub(crate) struct Inner {
    cfg: RemoteConfig,
    pub(crate) conn: Connector,
    tags: Vec<String>,
    run: String,
    state: Mutex<State>,
    /// The writer of new pages (the last of `State::writers`).
    writer: Mutex<Arc<Writer>>,
    /// The last sequence number given to a put.
    seq: std::sync::atomic::AtomicU64,
    wake: Condvar,
    done: Condvar,
    links: Mutex<Vec<Link>>,
    /// Whether gets go through [`Getter`]s (a single server over plain
    /// TCP), and those kept for the next gets.
    direct: bool,
    getters: Mutex<Vec<Getter>>,
    fallback: Option<Box<dyn NextTier>>,
    stats: Stats,
    masters_seen: Mutex<BTreeSet<String>>,
    /// A shared flusher's bell (`None`: the tier's own flusher thread).
    bell: Mutex<Option<Arc<Bell>>>,
}

/// Where a single server's replies arrive ([`RemoteTier::server_cpu`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerCpu {
    /// The CPU (`SO_INCOMING_CPU`).
    pub cpu: u32,
    /// The server is reached over loopback (on this machine).
    pub loopback: bool,
    /// On loopback, whether the server's process is bound to one CPU
    /// (`taskset`, Redis's `server_cpulist`): then it stays there. `None`:
    /// not known (not on loopback, or its process not seen).
    pub held: Option<bool>,
}

impl ServerCpu {
    /// Whether a client does well to run on [`ServerCpu::cpu`]: a server
    /// on this machine bound to it stays there (one that is not moves
    /// away from a CPU its client keeps busy), and a network card's
    /// receive queue stays on its CPU.
    pub fn worth_following(&self) -> bool {
        !self.loopback || self.held == Some(true)
    }
}

/// How many CPUs process `pid` may run on (`None`: not known).
fn cpus_of(pid: u32) -> Option<u32> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity
    // fills the set it is given, of that size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let r = libc::sched_getaffinity(pid as libc::pid_t, std::mem::size_of::<libc::cpu_set_t>(), &mut set);
        (r == 0).then(|| libc::CPU_COUNT(&set) as u32)
    }
}

/// A next tier on Redis (see the module docs).
pub struct RemoteTier {
    inner: Arc<Inner>,
    flusher: Mutex<Option<JoinHandle<()>>>,
}

fn io_err(msg: String) -> TierError {
    TierError::Io(std::io::Error::other(msg))
}

impl RemoteTier {
    /// Connects (checking the credentials and what the servers are),
    /// settles the durability, and starts the flusher thread. `fallback`
    /// takes pages when the remote is down, full or slow, and the local
    /// copies of durability `local`.
    pub fn connect(cfg: RemoteConfig, fallback: Option<Box<dyn NextTier>>) -> Result<Self, RemoteError> {
        let t = Self::new(cfg, fallback)?;
        t.start_flusher()?;
        Ok(t)
    }

    /// The CPU on which the server's replies arrive (`SO_INCOMING_CPU`
    /// of a get connection after a round trip, the last of three): on
    /// loopback the CPU the server answered from, where a client is woken
    /// without a cross-CPU wake-up; over a network card its receive
    /// queue's. Only for a single server over plain TCP (`None`
    /// otherwise, or if the kernel does not say).
    pub fn server_cpu(&self) -> Option<ServerCpu> {
        self.inner.server_cpu()
    }

    /// Whether the tier's writes go through a shared flusher.
    pub fn shares_flusher(&self) -> bool {
        self.inner.bell.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// The tier, without a flusher yet.
    pub(crate) fn new(
        mut cfg: RemoteConfig,
        fallback: Option<Box<dyn NextTier>>,
    ) -> Result<Self, RemoteError> {
        let (conn, topo) = Connector::new(&cfg)?;
        cfg.durability = match (cfg.durability, topo.min_replicas > 0, fallback.is_some()) {
            (Durability::Auto, true, true) => Durability::ReplicaLocal,
            (Durability::Auto, true, false) => Durability::Replica,
            (Durability::Auto, false, true) => Durability::Local,
            (Durability::Auto, false, false) => Durability::None,
            (d, false, _) if d.waits() => return Err(RemoteError::NoReplicas(d.name())),
            (d, _, false) if d.local() => return Err(RemoteError::NoFallback(d.name())),
            (d, _, _) => d,
        };
        let run = match &cfg.run_id {
            Some(r) if r.len() == 12 && r.bytes().all(|b| b.is_ascii_hexdigit()) => r.to_ascii_lowercase(),
            Some(r) => return Err(RemoteError::Config(format!("run id {r:?}: 12 hex digits expected"))),
            None => random_run_id()?,
        };
        let writer = Arc::new(Writer::random(cfg.encrypt).map_err(|e| RemoteError::Config(e.to_string()))?);
        let (cfg_tls, conn_cluster) = (cfg.tls, conn.is_cluster());
        let inner = Arc::new(Inner {
            tags: spread_tags(TAGS),
            run,
            state: Mutex::new(State {
                writers: vec![writer.clone()],
                index: HashMap::new(),
                queue: VecDeque::new(),
                pending_bytes: 0,
                stale_bytes: 0,
                unlinks: Vec::new(),
                next_tag: 0,
                remote_bytes: 0,
                down_until: None,
                backoff: cfg.retry_after,
                stop: false,
                paused: false,
                busy: false,
                copying: None,
                last_error: None,
                waiters: 0,
                flushers: 0,
            }),
            writer: Mutex::new(writer),
            seq: std::sync::atomic::AtomicU64::new(0),
            cfg,
            conn,
            wake: Condvar::new(),
            done: Condvar::new(),
            links: Mutex::new(Vec::new()),
            direct: !cfg_tls && !conn_cluster,
            getters: Mutex::new(Vec::new()),
            fallback,
            stats: Stats::default(),
            masters_seen: Mutex::new(topo.masters.clone()),
            bell: Mutex::new(None),
        });
        Ok(RemoteTier { inner, flusher: Mutex::new(None) })
    }

    /// Its shared part (what a shared flusher holds).
    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// Starts the tier's own flusher thread.
    pub(crate) fn start_flusher(&self) -> Result<(), RemoteError> {
        let inner = self.inner.clone();
        let h = std::thread::Builder::new()
            .name("ztier-remote".into())
            .spawn(move || inner.flusher())
            .map_err(|e| RemoteError::Config(format!("cannot start the flusher thread: {e}")))?;
        *self.flusher.lock().unwrap_or_else(|p| p.into_inner()) = Some(h);
        Ok(())
    }

    /// The durability in force (never `Auto`).
    pub fn durability(&self) -> Durability {
        self.inner.cfg.durability
    }

    /// The run id in the keys' names.
    pub fn run_id(&self) -> &str {
        &self.inner.run
    }

    /// Counters and latencies.
    pub fn stats(&self) -> StatsSnapshot {
        self.inner.stats.snapshot()
    }

    /// The live counters (to merge into a run's totals).
    pub fn counters(&self) -> &Stats {
        &self.inner.stats
    }

    /// The entries held.
    pub fn keys(&self) -> Vec<Key> {
        self.inner.lock().index.keys().copied().collect()
    }

    /// Lets go of every entry (their values deleted on the servers, their
    /// local copies dropped) and waits until the deletes are sent (or
    /// kept for later while the remote is down, or the get deadline has
    /// passed). Returns how many deletes could not be sent: values left
    /// on the servers until the run's end removes them.
    pub fn close(&self) -> usize {
        {
            let mut s = self.inner.lock();
            let keys: Vec<Key> = s.index.keys().copied().collect();
            for k in keys {
                let e = s.index.remove(&k).expect("listed");
                self.inner.discard(&mut s, k, e);
            }
        }
        self.flush();
        self.inner.lock().unlinks.len()
    }

    /// Pages waiting to be written, and their bytes.
    pub fn pending(&self) -> (usize, usize) {
        let s = self.inner.lock();
        (s.queue.len(), s.pending_bytes)
    }

    /// Waits until every page put so far has been written (or fallen
    /// back) and every delete sent or kept for later, or the get
    /// deadline has passed.
    pub fn flush(&self) {
        let until = Instant::now() + self.inner.cfg.get_deadline;
        let mut s = self.inner.lock();
        while !s.stop
            && Instant::now() < until
            && (s.busy || !s.queue.is_empty() || (!s.unlinks.is_empty() && s.down_until.is_none()))
        {
            self.inner.kick();
            s.flushers += 1;
            s = self
                .inner
                .done
                .wait_timeout(s, Duration::from_millis(50))
                .unwrap_or_else(|p| p.into_inner())
                .0;
            s.flushers -= 1;
        }
    }

    /// What the servers are now.
    pub fn topology(&self) -> Result<Topology, RemoteError> {
        let mut link = self.inner.conn.connect().map_err(|e| RemoteError::Connect(e.to_string()))?;
        link.topology().map_err(|e| RemoteError::Connect(e.to_string()))
    }

    /// The name of `key`'s value on the server, if it is there (for tests
    /// that reach behind the tier's back).
    pub fn value_name(&self, key: Key) -> Option<Vec<u8>> {
        let s = self.inner.lock();
        let e = s.index.get(&key)?;
        match e.at {
            At::Remote { tag, gen, .. } => Some(self.inner.name(&s.writers[gen as usize], tag, key, e.seq)),
            _ => None,
        }
    }
}

fn random_run_id() -> Result<String, RemoteError> {
    let mut b = [0u8; 6];
    getrandom::getrandom(&mut b).map_err(|e| RemoteError::Config(e.to_string()))?;
    Ok(String::from_utf8(hex::<12>(&b).to_vec()).expect("hex"))
}

impl Drop for RemoteTier {
    fn drop(&mut self) {
        self.inner.lock().stop = true;
        self.inner.wake.notify_all();
        self.inner.kick();
        if let Some(h) = self.flusher.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = h.join();
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes the tier's flusher (its own, or the shared one).
    fn kick(&self) {
        match &*self.bell.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(b) => b.ring(),
            None => self.wake.notify_one(),
        }
    }

    /// The servers a shared flusher may write this tier's pages to
    /// together with another's: the same servers, user and TLS.
    pub(crate) fn servers(&self) -> String {
        let c = &self.cfg;
        format!("{}|{:?}|{}|{:?}", c.url_list(), c.credentials.user, c.tls, c.tls_ca)
    }

    /// Served by a shared flusher from now on, woken by `bell`.
    pub(crate) fn share(&self, bell: Arc<Bell>) {
        *self.bell.lock().unwrap_or_else(|p| p.into_inner()) = Some(bell);
    }

    /// Whether this tier's rounds wait for a replica.
    pub(crate) fn waits(&self) -> bool {
        self.cfg.durability.waits()
    }

    /// A shared flusher's look at the tier: a round (of the tier's size,
    /// at most `most` pages) if it has work (the tier busy until
    /// [`Inner::settled`]).
    pub(crate) fn take_round(&self, most: usize) -> Found {
        let mut s = self.lock();
        if s.stop {
            return Found::Gone;
        }
        if s.paused || (s.queue.is_empty() && s.unlinks.is_empty()) {
            return Found::Idle;
        }
        if let Some(t) = s.down_until.filter(|t| Instant::now() < *t) {
            return Found::Down(t);
        }
        let most = most.min(self.cfg.batch_pages.max(1) * self.cfg.batches_per_round.max(1));
        let r = self.collect_at_most(&mut s, most);
        if r.is_empty() {
            return Found::Idle;
        }
        s.busy = true;
        Found::Round(r)
    }

    /// The tier has no round in flight any more.
    pub(crate) fn settled(&self) {
        let mut s = self.lock();
        s.busy = false;
        self.wake_waiters(s);
    }

    /// After a round: wakes the threads waiting on `done` that may go
    /// on now (see [`State::waiters`], [`State::flushers`]).
    fn wake_waiters(&self, s: MutexGuard<'_, State>) {
        let wake = s.waiters > 0 || (s.flushers > 0 && s.queue.is_empty()) || s.stop;
        drop(s);
        if wake {
            self.done.notify_all();
        }
    }

    /// WAIT for a replica after a round's writes on `l`; a failure is
    /// counted by this tier and by each of `also` (the other tiers whose
    /// rounds waited in the same pipeline).
    pub(crate) fn wait_replica(&self, l: &mut Link, also: &[&Inner]) -> Result<(), String> {
        use std::sync::atomic::Ordering::Relaxed;
        let all = || std::iter::once(self).chain(also.iter().copied());
        let n = l.wait(1, self.cfg.wait_timeout, self.cfg.timeout).map_err(|e| {
            all().for_each(|t| {
                t.stats.errors.fetch_add(1, Relaxed);
            });
            format!("waiting for a replica failed: {e}")
        })?;
        if n < 1 {
            all().for_each(|t| {
                t.stats.wait_timeouts.fetch_add(1, Relaxed);
            });
            return Err(format!(
                "no replica acknowledged the writes within {} ms",
                self.cfg.wait_timeout.as_millis()
            ));
        }
        Ok(())
    }

    /// Counts a round written (its replies read `sent_at` after it was
    /// sent).
    pub(crate) fn landed(&self, r: &Round, sent_at: Instant) {
        use std::sync::atomic::Ordering::Relaxed;
        if !r.pages.is_empty() {
            self.stats.batch_ns.record(sent_at.elapsed().as_nanos() as u64);
            self.stats.batches.fetch_add(1, Relaxed);
        }
        self.stats.unlinks.fetch_add(r.unlinks.len() as u64, Relaxed);
    }

    /// `zt:RUN:PROC:{TAG}:ID`.
    fn name(&self, w: &Writer, tag: u16, key: Key, seq: u64) -> Vec<u8> {
        let mut n = Vec::with_capacity(64);
        self.name_into(w, tag, key, seq, &mut n);
        n
    }

    /// [`Inner::name`], appended to `n`.
    fn name_into(&self, w: &Writer, tag: u16, key: Key, seq: u64, n: &mut Vec<u8>) {
        self.name_with_id(w, tag, &w.name_id(key, seq), n);
    }

    /// [`Inner::name_into`] with the id made already ([`Writer::name_id`]).
    fn name_with_id(&self, w: &Writer, tag: u16, id: &[u8; 24], n: &mut Vec<u8>) {
        n.extend_from_slice(b"zt:");
        n.extend_from_slice(self.run.as_bytes());
        n.push(b':');
        n.extend_from_slice(&hex::<8>(&w.id[..4]));
        n.extend_from_slice(b":{");
        n.extend_from_slice(self.tags[tag as usize].as_bytes());
        n.extend_from_slice(b"}:");
        n.extend_from_slice(id);
    }

    /// Lets go of an entry replaced or removed: its value is deleted (in
    /// the next round), its copy in the fallback now.
    fn discard(&self, s: &mut State, key: Key, e: Entry) {
        match e.at {
            // Its bytes are held by the queue or a round too, which
            // lets them go when it comes to them.
            At::Pending(d) => {
                s.pending_bytes -= d.bytes.len();
                s.stale_bytes += d.bytes.len();
                drop(d);
                if s.stale_bytes > self.cfg.pending_bytes {
                    // The queue is not passed (the remote down, or
                    // slow): swept now, so that they stay bounded.
                    s.queue.retain(|q| q.3.current());
                    s.stale_bytes = 0;
                }
            }
            At::Remote { tag, gen, local, vlen } => {
                s.remote_bytes -= vlen as u64;
                if s.unlinks.len() < UNLINKS_KEPT {
                    let n = self.name(&s.writers[gen as usize], tag, key, e.seq);
                    s.unlinks.push(n);
                }
                if local {
                    if let Some(f) = &self.fallback {
                        f.remove(key);
                    }
                }
            }
            At::Local => {
                if let Some(f) = &self.fallback {
                    f.remove(key);
                }
            }
        }
    }

    /// A buffer for a sealed page: one written before (by any tier of
    /// the process, [`crate::pool`]), or a new one.
    fn buffer(&self) -> Vec<u8> {
        crate::pool::take()
    }

    /// Keeps a written page's buffer in `spare`, for
    /// [`crate::pool::give_all`] (one lock of the pool for a round).
    fn recycle(&self, w: Waiting, spare: &mut Vec<Vec<u8>>) {
        if let Ok(v) = Arc::try_unwrap(w.bytes) {
            spare.push(v);
        }
    }

    fn down(&self, s: &State) -> bool {
        s.down_until.is_some_and(|t| Instant::now() < t)
    }

    fn to_fallback(
        &self,
        s: &mut State,
        key: Key,
        meta: SpillMeta,
        data: &[u8],
        why: &str,
    ) -> Result<(), TierError> {
        let Some(f) = &self.fallback else {
            s.last_error = Some(format!("{why}, and there is no local fallback"));
            return Err(TierError::Full);
        };
        match f.put(key, meta, data) {
            Ok(()) => {
                self.stats.fallback_puts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                s.index.insert(key, Entry { meta, seq: 0, at: At::Local });
                Ok(())
            }
            Err(e) => {
                s.last_error = Some(format!(
                    "{why}, and the fallback failed: {}",
                    f.last_error().unwrap_or(e.to_string())
                ));
                Err(e)
            }
        }
    }

    fn take_link(&self) -> redis::RedisResult<Link> {
        if let Some(l) = self.links.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            return Ok(l);
        }
        self.conn.connect()
    }

    fn give_link(&self, l: Link) {
        let mut v = self.links.lock().unwrap_or_else(|p| p.into_inner());
        if v.len() < 16 {
            v.push(l);
        }
    }

    /// See [`RemoteTier::server_cpu`].
    fn server_cpu(&self) -> Option<ServerCpu> {
        if !self.direct {
            return None;
        }
        let mut g = self.take_getter().ok()?;
        let mut cpu = None;
        for _ in 0..3 {
            cpu = g.incoming_cpu().ok()?;
        }
        let pid = g.local_server_pid();
        let loopback = g.is_loopback();
        // A connection whose `INFO` failed part-way may hold half a
        // reply: it is dropped, not handed back.
        if pid.is_ok() {
            self.give_getter(g);
        }
        let held = match pid {
            Ok(Some(pid)) => cpus_of(pid).map(|n| n == 1),
            _ => None,
        };
        Some(ServerCpu { cpu: cpu?, loopback, held })
    }

    fn take_getter(&self) -> std::io::Result<Getter> {
        if let Some(g) = self.getters.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            return Ok(g);
        }
        Getter::connect(&self.cfg.nodes[0], &self.cfg.credentials, self.cfg.timeout)
    }

    fn give_getter(&self, g: Getter) {
        let mut v = self.getters.lock().unwrap_or_else(|p| p.into_inner());
        if v.len() < 16 {
            v.push(g);
        }
    }

    /// GET into `out` (`false`: no such key), retried (through a
    /// failover) until `deadline`. On an error `out` holds nothing.
    fn fetch(&self, name: &[u8], deadline: Instant, out: &mut Vec<u8>) -> Result<bool, String> {
        use std::sync::atomic::Ordering::Relaxed;
        let mut wait = Duration::from_millis(5);
        loop {
            let t = Instant::now();
            // A connection that failed is dropped (it may be out of step).
            let r = if self.direct {
                self.take_getter()
                    .and_then(|mut g| {
                        let found = g.get(name, out)?;
                        self.give_getter(g);
                        Ok(found)
                    })
                    .map_err(|e| e.to_string())
            } else {
                self.take_link()
                    .and_then(|mut l| {
                        let v = l.get(name)?;
                        self.give_link(l);
                        Ok(v)
                    })
                    .map(|v| match v {
                        Some(v) => {
                            *out = v;
                            true
                        }
                        None => false,
                    })
                    .map_err(|e| e.to_string())
            };
            match r {
                Ok(found) => {
                    self.stats.get_ns.record(t.elapsed().as_nanos() as u64);
                    return Ok(found);
                }
                Err(e) => {
                    out.clear();
                    self.stats.errors.fetch_add(1, Relaxed);
                    if Instant::now() + wait > deadline {
                        return Err(e);
                    }
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(Duration::from_millis(200));
                }
            }
        }
    }

    /// The flusher thread's loop. On a single server without WAIT, two
    /// rounds are in flight: round N+1 is sent before round N's replies
    /// are read, so the server works on one while the flusher packs and
    /// seals the next.
    fn flusher(self: Arc<Self>) {
        let mut link: Option<Link> = None;
        let mut last_topology = Instant::now();
        let mut buf = Vec::new();
        // The round sent whose replies are not read yet.
        let mut flight: Option<Flight> = None;
        loop {
            let mut s = self.lock();
            loop {
                if s.stop {
                    return;
                }
                // A round in flight: the next goes out now, or, with
                // nothing to send, its replies are read.
                if flight.is_some() {
                    break;
                }
                let work = !s.queue.is_empty() || !s.unlinks.is_empty();
                if work && !s.paused {
                    match s.down_until {
                        // Backing off: try again when it ends.
                        Some(t) if Instant::now() < t => {
                            let d = t - Instant::now();
                            s = self.wake.wait_timeout(s, d).unwrap_or_else(|p| p.into_inner()).0;
                            continue;
                        }
                        _ => break,
                    }
                }
                if !s.paused && self.conn.is_cluster() && last_topology.elapsed() >= TOPOLOGY_EVERY {
                    break;
                }
                s = self.wake.wait_timeout(s, TOPOLOGY_EVERY).unwrap_or_else(|p| p.into_inner()).0;
            }
            s.busy = true;
            let round = self.collect(&mut s);
            drop(s);
            if link.is_none() {
                link = self.conn.connect().ok();
            }
            if self.conn.is_cluster() && last_topology.elapsed() >= TOPOLOGY_EVERY {
                last_topology = Instant::now();
                if let Some(l) = link.as_mut() {
                    self.look_at_masters(l);
                }
            }
            let early = !round.is_empty()
                && !self.cfg.durability.waits()
                && link.as_ref().is_some_and(|l| l.is_single());
            if early {
                let l = link.as_mut().expect("checked above");
                let sent_at = Instant::now();
                buf.clear();
                let n = self.pack_round(&round, &mut buf);
                let sent = l.send_packed(&buf).map_err(|e| self.refused(e));
                let mut step = sent.is_ok();
                if let Some(f) = flight.take() {
                    let ok = match &sent {
                        Ok(()) => self.land(l, &f),
                        Err(e) => Err(e.clone()),
                    };
                    step &= ok.is_ok();
                    self.finish(f.round, ok);
                }
                match sent {
                    Ok(()) if step => flight = Some(Flight { round, n, sent_at }),
                    Ok(()) => {
                        // Its replies are out of step with the requests.
                        link = None;
                        self.finish(round, Err("the round before it failed on the same connection".into()));
                    }
                    Err(e) => {
                        link = None;
                        self.finish(round, Err(e));
                    }
                }
            } else {
                if let Some(f) = flight.take() {
                    let ok = match link.as_mut() {
                        Some(l) => self.land(l, &f),
                        None => Err("cannot connect".to_string()),
                    };
                    if ok.is_err() {
                        link = None;
                    }
                    self.finish(f.round, ok);
                }
                let ok = match (&round, link.as_mut()) {
                    (r, _) if r.is_empty() => Ok(()),
                    (r, Some(l)) => self.write(l, r, &mut buf),
                    (_, None) => Err("cannot connect".to_string()),
                };
                if ok.is_err() {
                    // Its replies may be out of step: a new connection next time.
                    link = None;
                }
                self.finish(round, ok);
            }
            if flight.is_none() {
                let mut s = self.lock();
                s.busy = false;
                self.wake_waiters(s);
            }
        }
    }

    /// A round's pages are settled: local copies written if it went
    /// well ([`Inner::copy_locally`]), then [`Inner::settle`].
    pub(crate) fn finish(&self, round: Round, ok: Result<(), String>) {
        let copied = if ok.is_ok() { self.copy_locally(&round) } else { Vec::new() };
        let mut s = self.lock();
        self.settle(&mut s, round, ok, &copied);
        self.wake_waiters(s);
    }

    /// Reads the replies of a round in flight (and counts it).
    fn land(&self, l: &mut Link, f: &Flight) -> Result<(), String> {
        l.replies(f.n).map_err(|e| self.refused(e))?;
        self.landed(&f.round, f.sent_at);
        Ok(())
    }

    /// An error counted.
    pub(crate) fn count_error(&self) {
        self.stats.errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// A write refused or lost: counted, and said.
    pub(crate) fn refused(&self, e: redis::RedisError) -> String {
        self.stats.errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("the remote refused or lost a write: {e}")
    }

    /// Failovers: a master that was not one before (a replica promoted).
    fn look_at_masters(&self, l: &mut Link) {
        let Ok(t) = l.topology() else { return };
        let mut seen = self.masters_seen.lock().unwrap_or_else(|p| p.into_inner());
        let new = t.masters.iter().filter(|m| !seen.contains(*m)).count();
        if new > 0 {
            self.stats.failovers.fetch_add(new as u64, std::sync::atomic::Ordering::Relaxed);
            seen.extend(t.masters);
        }
    }
}

/// The deletes `unlinks`, an `UNLINK` per hash tag: `emit` gets each
/// command's arguments. Returns how many commands.
fn unlinks_by_tag<'a>(unlinks: &'a [Vec<u8>], mut emit: impl FnMut(Vec<&'a [u8]>)) -> usize {
    let mut by_tag: Vec<&[u8]> = unlinks.iter().map(|n| &n[..]).collect();
    // Each name's tag found once (not at every comparison).
    by_tag.sort_by_cached_key(|n| hash_tag(n));
    let (mut n, mut i) = (0, 0);
    while i < by_tag.len() {
        let t = hash_tag(by_tag[i]);
        let j = i + by_tag[i..].iter().take_while(|x| hash_tag(x) == t).count();
        let mut args: Vec<&[u8]> = Vec::with_capacity(1 + j - i);
        args.push(b"UNLINK");
        args.extend_from_slice(&by_tag[i..j]);
        emit(args);
        n += 1;
        i = j;
    }
    n
}

/// A page in a round: key, metadata, sequence number, hash tag, bytes.
type RoundPage = (Key, SpillMeta, u64, u16, Waiting);

/// One flusher round: the pages to write and the deletes to send.
#[derive(Default)]
pub(crate) struct Round {
    pages: Vec<RoundPage>,
    writer: Option<(u16, Arc<Writer>)>,
    unlinks: Vec<Vec<u8>>,
}

/// A round sent ([`Link::send_packed`]) whose `n` replies are not read
/// yet.
struct Flight {
    round: Round,
    n: usize,
    sent_at: Instant,
}

impl Round {
    pub(crate) fn is_empty(&self) -> bool {
        self.pages.is_empty() && self.unlinks.is_empty()
    }

    /// Pages it writes.
    pub(crate) fn pages(&self) -> usize {
        self.pages.len()
    }
}

impl Inner {
    /// Takes a round's work from the queue (the pages stay in the index,
    /// pending, until the round is settled).
    fn collect(&self, s: &mut State) -> Round {
        let most = self.cfg.batch_pages.max(1) * self.cfg.batches_per_round.max(1);
        self.collect_at_most(s, most)
    }

    /// [`Inner::collect`], at most `most` pages.
    fn collect_at_most(&self, s: &mut State, most: usize) -> Round {
        let mut r = Round::default();
        if s.paused {
            return r;
        }
        let per = self.cfg.batch_pages.max(1);
        let mut in_batch = 0;
        let mut tag = s.next_tag;
        while r.pages.len() < most {
            let Some((key, meta, seq, d)) = s.queue.pop_front() else { break };
            // Replaced or removed since: nothing to write (no look in
            // the index: its entry is far away in memory by now).
            if !d.current() {
                s.stale_bytes = s.stale_bytes.saturating_sub(d.bytes.len());
                continue;
            }
            if in_batch == per {
                in_batch = 0;
                tag = (tag + 1) % self.tags.len();
            }
            r.pages.push((key, meta, seq, tag as u16, d));
            in_batch += 1;
        }
        s.next_tag = (tag + 1) % self.tags.len();
        if !r.pages.is_empty() {
            let gen = s.writers.len() - 1;
            r.writer = Some((gen as u16, s.writers[gen].clone()));
        }
        if !self.down(s) || !r.pages.is_empty() {
            let n = s.unlinks.len().min(UNLINKS_PER_ROUND);
            r.unlinks = s.unlinks.drain(..n).collect();
        }
        r
    }

    /// Writes a round: an `MSET` per batch (one hash tag) and an
    /// `UNLINK` per hash tag of the deletes, in one pipeline, then, if
    /// the durability asks, WAIT for a replica. `buf`: the flusher's
    /// buffer for the packed commands.
    fn write(&self, l: &mut Link, r: &Round, buf: &mut Vec<u8>) -> Result<(), String> {
        use std::sync::atomic::Ordering::Relaxed;
        let t = Instant::now();
        let sent = if l.is_single() {
            buf.clear();
            let n = self.pack_round(r, buf);
            l.exec_packed(buf, n)
        } else {
            self.send_cmds(l, r, buf)
        };
        sent.map_err(|e| self.refused(e))?;
        if !r.pages.is_empty() && self.cfg.durability.waits() {
            self.wait_replica(l, &[])?;
        }
        if !r.pages.is_empty() {
            self.stats.batch_ns.record(t.elapsed().as_nanos() as u64);
            self.stats.batches.fetch_add(1, Relaxed);
        }
        self.stats.unlinks.fetch_add(r.unlinks.len() as u64, Relaxed);
        Ok(())
    }

    /// A single server: the round's commands packed straight into `buf`
    /// (names formatted there, each value sealed there: no copy of a
    /// page but the one into the buffer), to go as one pipeline. Returns
    /// how many commands. (Appended: a shared flusher packs several
    /// tiers' rounds into one buffer.)
    pub(crate) fn pack_round(&self, r: &Round, buf: &mut Vec<u8>) -> usize {
        let mut n = 0;
        if let Some((_, w)) = &r.writer {
            let mut i = 0;
            while i < r.pages.len() {
                let tag = r.pages[i].3;
                let j = i + r.pages[i..].iter().take_while(|p| p.3 == tag).count();
                buf.push(b'*');
                push_decimal(buf, 1 + 2 * (j - i));
                buf.extend_from_slice(b"\r\n$4\r\nMSET\r\n");
                for (key, meta, seq, tag, d) in &r.pages[i..j] {
                    debug_assert!(Arc::ptr_eq(w, &d.writer), "a round's pages are its writer's");
                    let at = buf.len();
                    // The name's length is a fixed width's: written after.
                    buf.extend_from_slice(b"$00\r\n");
                    self.name_with_id(w, *tag, &d.id, buf);
                    let len = buf.len() - at - 5;
                    assert!((10..100).contains(&len), "a value's name is two digits long");
                    buf[at + 1] = b'0' + (len / 10) as u8;
                    buf[at + 2] = b'0' + (len % 10) as u8;
                    buf.extend_from_slice(b"\r\n$");
                    push_decimal(buf, d.plain_len() + OVERHEAD);
                    buf.extend_from_slice(b"\r\n");
                    if d.form == Form::Plain {
                        w.seal(*key, meta, *seq, &d.bytes, buf);
                    } else {
                        buf.extend_from_slice(&d.bytes);
                    }
                    buf.extend_from_slice(b"\r\n");
                }
                n += 1;
                i = j;
            }
        }
        n + unlinks_by_tag(&r.unlinks, |args| crate::link::pack(buf, &args))
    }

    /// A cluster: the round's commands through the cluster client.
    fn send_cmds(&self, l: &mut Link, r: &Round, buf: &mut Vec<u8>) -> redis::RedisResult<()> {
        let mut names = Vec::with_capacity(r.pages.len());
        // Values a writer that encrypts seals now.
        let mut sealed: Vec<Vec<u8>> = Vec::new();
        if let Some((_, w)) = &r.writer {
            for (key, meta, seq, tag, d) in &r.pages {
                let mut n = Vec::with_capacity(64);
                self.name_with_id(w, *tag, &d.id, &mut n);
                names.push(n);
                if d.form == Form::Plain {
                    let mut v = Vec::with_capacity(d.bytes.len() + OVERHEAD);
                    w.seal(*key, meta, *seq, &d.bytes, &mut v);
                    sealed.push(v);
                }
            }
        }
        let mut cmds: Vec<Vec<&[u8]>> = Vec::new();
        let mut unsealed = sealed.iter();
        for (i, (_, _, _, tag, d)) in r.pages.iter().enumerate() {
            if i == 0 || r.pages[i - 1].3 != *tag {
                cmds.push(vec![b"MSET"]);
            }
            let value: &[u8] =
                if d.form != Form::Plain { &d.bytes } else { unsealed.next().expect("sealed above") };
            let c = cmds.last_mut().expect("pushed");
            c.push(&names[i]);
            c.push(value);
        }
        unlinks_by_tag(&r.unlinks, |args| cmds.push(args));
        l.exec(&cmds, buf)
    }

    /// Writes the local copies of a round's pages written (durability
    /// `local`), without the lock: a get or put waits for none of them.
    /// A page replaced or removed meanwhile gets none; a put of the page
    /// being copied waits for that copy (so that the copy never lands
    /// over a newer page in the fallback). Says which were copied.
    fn copy_locally(&self, r: &Round) -> Vec<bool> {
        let Some(f) = self.fallback.as_ref().filter(|_| self.cfg.durability.local()) else {
            return Vec::new();
        };
        let copied = r
            .pages
            .iter()
            .map(|(key, meta, seq, _, data)| {
                {
                    let mut s = self.lock();
                    if !data.current() {
                        return false;
                    }
                    s.copying = Some(*key);
                }
                let ok = data.plain(*key, meta, *seq).is_ok_and(|d| f.put(*key, *meta, &d).is_ok());
                self.lock().copying = None;
                self.done.notify_all();
                ok
            })
            .collect();
        copied
    }

    /// After a round: pages written are remote now (or were replaced
    /// meanwhile: their values go); on failure they go to the fallback.
    /// `copied[i]`: page `i` has its local copy
    /// ([`Inner::copy_locally`]).
    fn settle(&self, s: &mut State, r: Round, ok: Result<(), String>, copied: &[bool]) {
        use std::sync::atomic::Ordering::Relaxed;
        let Some((gen, w)) = r.writer else {
            if let Err(e) = ok {
                s.unlinks.extend(r.unlinks);
                self.failed(s, e);
            }
            return;
        };
        match ok {
            Ok(()) => {
                s.down_until = None;
                s.backoff = self.cfg.retry_after;
                let mut spare = Vec::with_capacity(r.pages.len());
                for (i, (key, _, seq, tag, data)) in r.pages.into_iter().enumerate() {
                    let vlen = (data.plain_len() + OVERHEAD) as u32;
                    let local = copied.get(i).copied().unwrap_or(false);
                    // Still current: its entry is looked up once, to say
                    // it is remote now.
                    let entry =
                        if data.current() { s.index.get_mut(&key).filter(|e| e.seq == seq) } else { None };
                    let Some(e) = entry else {
                        s.stale_bytes = s.stale_bytes.saturating_sub(data.bytes.len());
                        s.unlinks.push(self.name(&w, tag, key, seq));
                        // Its copy is stale, unless a newer page went to
                        // the fallback since (written after the copy).
                        if local && !s.index.get(&key).is_some_and(|e| matches!(e.at, At::Local)) {
                            if let Some(f) = &self.fallback {
                                f.remove(key);
                            }
                        }
                        self.recycle(data, &mut spare);
                        continue;
                    };
                    e.at = At::Remote { tag, gen, local, vlen };
                    self.stats.puts.fetch_add(1, Relaxed);
                    self.stats.put_bytes.fetch_add(data.plain_len() as u64, Relaxed);
                    if local {
                        self.stats.local_copies.fetch_add(1, Relaxed);
                    }
                    s.pending_bytes -= data.bytes.len();
                    s.remote_bytes += vlen as u64;
                    self.recycle(data, &mut spare);
                }
                crate::pool::give_all(spare);
            }
            Err(why) => {
                // The names written may exist: deleted later.
                for (key, _, seq, tag, _) in &r.pages {
                    s.unlinks.push(self.name(&w, *tag, *key, *seq));
                }
                s.unlinks.extend(r.unlinks);
                for (key, meta, seq, _, data) in r.pages {
                    if !(data.current() && s.index.get(&key).is_some_and(|e| e.seq == seq)) {
                        s.stale_bytes = s.stale_bytes.saturating_sub(data.bytes.len());
                    } else {
                        s.pending_bytes -= data.bytes.len();
                        s.index.remove(&key);
                        let fell_back = match data.plain(key, &meta, seq) {
                            Ok(d) => self.to_fallback(s, key, meta, &d, &why).is_ok(),
                            Err(e) => {
                                s.last_error = Some(e.to_string());
                                false
                            }
                        };
                        if !fell_back {
                            // No room anywhere: it waits for the remote again.
                            s.pending_bytes += data.bytes.len();
                            s.index.insert(key, Entry { meta, seq, at: At::Pending(data.clone()) });
                            s.queue.push_back((key, meta, seq, data));
                        }
                    }
                }
                self.failed(s, why);
            }
        }
    }

    fn failed(&self, s: &mut State, why: String) {
        s.last_error = Some(why);
        s.down_until = Some(Instant::now() + s.backoff);
        s.backoff = (s.backoff * 2).min(self.cfg.retry_after * 16);
    }
}

impl NextTier for RemoteTier {
    fn name(&self) -> String {
        format!("remote ({})", self.inner.cfg.url_list())
    }

    /// Seals the page here, in the caller's thread (the flusher only
    /// writes), except for a writer that encrypts: that one's pages are
    /// kept plain until written, so that a get of a page still waiting,
    /// or the fallback, has the entry's bytes.
    fn put(&self, key: Key, meta: SpillMeta, data: &[u8]) -> Result<(), TierError> {
        let inner = &self.inner;
        let seq = inner.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let w = inner.writer.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut v = inner.buffer();
        let form = if w.encrypts() && inner.cfg.durability.local() {
            v.extend_from_slice(data);
            Form::Plain
        } else {
            w.seal(key, &meta, seq, data, &mut v);
            if w.encrypts() {
                Form::Encrypted
            } else {
                Form::Mac
            }
        };
        let id = w.name_id(key, seq);
        let waiting = Waiting { bytes: Arc::new(v), form, writer: w, id };
        let size = waiting.bytes.len();
        let mut s = inner.lock();
        // Its last page's local copy lands first (see `copy_locally`).
        while s.copying == Some(key) {
            s.waiters += 1;
            s = inner.done.wait(s).unwrap_or_else(|p| p.into_inner());
            s.waiters -= 1;
        }
        if let Some(old) = s.index.remove(&key) {
            inner.discard(&mut s, key, old);
        }
        if inner.down(&s) && inner.fallback.is_some() {
            let why = format!("the remote is unavailable ({})", s.last_error.clone().unwrap_or_default());
            return inner.to_fallback(&mut s, key, meta, data, &why);
        }
        if s.pending_bytes + size > inner.cfg.pending_bytes {
            if inner.fallback.is_some() {
                return inner.to_fallback(&mut s, key, meta, data, "the remote is slower than the evictions");
            }
            // Nowhere else to go: wait for room (the evictions slow down
            // to the remote's pace), as long as a get would wait.
            let until = Instant::now() + inner.cfg.get_deadline;
            while s.pending_bytes + size > inner.cfg.pending_bytes && Instant::now() < until {
                inner.kick();
                s.waiters += 1;
                s = inner
                    .done
                    .wait_timeout(s, Duration::from_millis(10))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
                s.waiters -= 1;
            }
            if s.pending_bytes + size > inner.cfg.pending_bytes {
                s.last_error =
                    Some("the remote is slower than the evictions, and there is no local fallback".into());
                return Err(TierError::Full);
            }
        }
        s.pending_bytes += size;
        s.index.insert(key, Entry { meta, seq, at: At::Pending(waiting.clone()) });
        s.queue.push_back((key, meta, seq, waiting));
        // The flusher sleeps only with nothing to do. Woken after the
        // lock is let go: woken under it, it would wake only to wait
        // for the lock (a second switch per round).
        let first = s.queue.len() == 1;
        drop(s);
        if first {
            inner.kick();
        }
        Ok(())
    }

    fn get(&self, key: Key, out: &mut Vec<u8>, remove: bool) -> Result<Option<SpillMeta>, TierError> {
        use std::sync::atomic::Ordering::Relaxed;
        let inner = &self.inner;
        let mut s = inner.lock();
        let Some(e) = s.index.get(&key) else { return Ok(None) };
        let meta = e.meta;
        let seq = e.seq;
        let (tag, gen, local) = match &e.at {
            At::Pending(d) => {
                d.plain_into(key, &meta, seq, out)?;
                inner.stats.pending_hits.fetch_add(1, Relaxed);
                if remove {
                    let e = s.index.remove(&key).expect("found");
                    inner.discard(&mut s, key, e);
                }
                return Ok(Some(meta));
            }
            At::Local => {
                let f = inner.fallback.as_ref().expect("a local entry has a fallback");
                let r = f.get(key, out, remove)?;
                if r.is_some() {
                    inner.stats.fallback_gets.fetch_add(1, Relaxed);
                }
                if remove {
                    s.index.remove(&key);
                }
                return Ok(r);
            }
            At::Remote { tag, gen, local, .. } => (*tag, *gen, *local),
        };
        let w = s.writers[gen as usize].clone();
        let name = inner.name(&w, tag, key, seq);
        let down = inner.down(&s);
        drop(s);
        // With a local copy, the remote is not waited for.
        let deadline = Instant::now() + if local { inner.cfg.timeout } else { inner.cfg.get_deadline };
        let fetched = if down && local {
            Err("the remote is unavailable".to_string())
        } else {
            inner.fetch(&name, deadline, out)
        };
        let from_local = |why: String, out: &mut Vec<u8>| -> Result<Option<SpillMeta>, TierError> {
            let f = inner.fallback.as_ref().expect("a local copy has a fallback");
            match f.get(key, out, false)? {
                Some(m) if m == meta => {
                    inner.stats.fallback_gets.fetch_add(1, Relaxed);
                    Ok(Some(m))
                }
                _ => {
                    out.clear();
                    Err(io_err(format!("{why}; and its local copy is gone")))
                }
            }
        };
        // The value was read into `out`: it is used only once its MAC
        // (or AEAD tag) is checked; `open_in_place` clears it otherwise.
        let r = match fetched {
            Ok(true) => match w.open_in_place(key, &meta, seq, out) {
                Ok(()) => {
                    inner.stats.gets.fetch_add(1, Relaxed);
                    inner.stats.get_bytes.fetch_add(out.len() as u64, Relaxed);
                    Ok(Some(meta))
                }
                Err(e) => {
                    inner.stats.mac_errors.fetch_add(1, Relaxed);
                    let msg = format!(
                        "remote page (pool {} object {} index {}): {e}",
                        key.pool, key.object, key.index
                    );
                    inner.lock().last_error = Some(msg.clone());
                    return Err(TierError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, msg)));
                }
            },
            Ok(false) => {
                inner.stats.lost.fetch_add(1, Relaxed);
                let why = format!(
                    "remote page (pool {} object {} index {}) is gone from the server",
                    key.pool, key.object, key.index
                );
                if local {
                    from_local(why, out)
                } else {
                    inner.lock().last_error = Some(why.clone());
                    Err(io_err(why))
                }
            }
            Err(e) => {
                let why = format!("the remote did not answer for a page: {e}");
                if local {
                    from_local(why, out)
                } else {
                    inner.lock().last_error = Some(why.clone());
                    Err(io_err(why))
                }
            }
        };
        if remove && r.as_ref().is_ok_and(|m| m.is_some()) {
            let mut s = inner.lock();
            if s.index.get(&key).is_some_and(|e| e.seq == seq) {
                let e = s.index.remove(&key).expect("found");
                inner.discard(&mut s, key, e);
            }
        }
        r
    }

    fn remove(&self, key: Key) -> bool {
        let mut s = self.inner.lock();
        match s.index.remove(&key) {
            Some(e) => {
                self.inner.discard(&mut s, key, e);
                true
            }
            None => false,
        }
    }

    fn remove_object(&self, pool: u32, object: u64) -> usize {
        let mut s = self.inner.lock();
        let keys: Vec<Key> =
            s.index.keys().filter(|k| k.pool == pool && k.object == object).copied().collect();
        for k in &keys {
            let e = s.index.remove(k).expect("listed");
            self.inner.discard(&mut s, *k, e);
        }
        keys.len()
    }

    fn remove_pool(&self, pool: u32) -> usize {
        let mut s = self.inner.lock();
        let keys: Vec<Key> = s.index.keys().filter(|k| k.pool == pool).copied().collect();
        for k in &keys {
            let e = s.index.remove(k).expect("listed");
            self.inner.discard(&mut s, *k, e);
        }
        keys.len()
    }

    fn entries(&self) -> usize {
        self.inner.lock().index.len()
    }

    fn bytes_used(&self) -> u64 {
        let s = self.inner.lock();
        s.remote_bytes
            + (s.pending_bytes + s.stale_bytes) as u64
            + self.inner.fallback.as_ref().map_or(0, |f| f.bytes_used())
    }

    fn last_error(&self) -> Option<String> {
        self.inner.lock().last_error.clone()
    }

    /// Pauses the flusher (no lock held across the fork). The entries
    /// are not copied for the child (`Ok(false)`): the caller takes them
    /// back first.
    fn prepare_fork(&self) -> Result<bool, TierError> {
        let mut s = self.inner.lock();
        s.paused = true;
        while s.busy {
            s.waiters += 1;
            s = self.inner.done.wait(s).unwrap_or_else(|p| p.into_inner());
            s.waiters -= 1;
        }
        Ok(false)
    }

    fn parent_after_fork(&self) {
        self.inner.lock().paused = false;
        self.inner.wake.notify_all();
        self.inner.kick();
    }

    /// The child's own: new keys and names, new connections, its own
    /// flusher thread and fallback; it must hold no entries.
    fn after_fork(&self) -> Result<(), TierError> {
        let mut s = self.inner.lock();
        if !s.index.is_empty() {
            return Err(io_err(format!(
                "the remote tier holds {} entries at fork; a child cannot keep them",
                s.index.len()
            )));
        }
        let w = Writer::random(self.inner.cfg.encrypt)?;
        let w = Arc::new(w);
        s.writers = vec![w.clone()];
        *self.inner.writer.lock().unwrap_or_else(|p| p.into_inner()) = w;
        s.queue.clear();
        s.unlinks.clear();
        s.pending_bytes = 0;
        s.stale_bytes = 0;
        s.remote_bytes = 0;
        s.paused = false;
        s.busy = false;
        s.copying = None;
        s.last_error = None;
        drop(s);
        // The parent's sockets: the child closes its copies only.
        self.inner.links.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.inner.getters.lock().unwrap_or_else(|p| p.into_inner()).clear();
        if let Some(f) = &self.inner.fallback {
            f.after_fork()?;
        }
        // The parent's flusher does not exist here.
        if let Some(h) = self.flusher.lock().unwrap_or_else(|p| p.into_inner()).take() {
            std::mem::forget(h);
        }
        // Nor does a shared one: the child's tier has its own.
        *self.inner.bell.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.start_flusher().map_err(|e| io_err(e.to_string()))
    }
}

impl RemoteTier {
    /// Reads several entries at once (one pipeline for those on the
    /// remote), as [`NextTier::get`] without removing them: `outs[i]`
    /// gets `keys[i]`'s bytes, and the result its metadata (`None`: not
    /// held). Where the pipeline fails, the entries are read one by one.
    pub fn get_many(&self, keys: &[Key], outs: &mut [Vec<u8>]) -> Result<Vec<Option<SpillMeta>>, TierError> {
        use std::sync::atomic::Ordering::Relaxed;
        let inner = &self.inner;
        let mut res = vec![None; keys.len()];
        // Those on the remote: their place in `keys`, writer, metadata,
        // sequence number; their names one after another in `names`,
        // each ending at `ends[j]`.
        let mut remote = Vec::with_capacity(keys.len());
        let mut names = Vec::with_capacity(keys.len() * 64);
        let mut ends = Vec::with_capacity(keys.len());
        {
            let s = inner.lock();
            for (i, k) in keys.iter().enumerate() {
                if let Some(e) = s.index.get(k) {
                    if let At::Remote { tag, gen, .. } = e.at {
                        let w = s.writers[gen as usize].clone();
                        inner.name_into(&w, tag, *k, e.seq, &mut names);
                        ends.push(names.len());
                        remote.push((i, w, e.meta, e.seq));
                    }
                }
            }
        }
        let mut start = 0;
        let names: Vec<&[u8]> = ends
            .iter()
            .map(|&end| {
                let n = &names[start..end];
                start = end;
                n
            })
            .collect();
        let into: Vec<usize> = remote.iter().map(|r| r.0).collect();
        let t = Instant::now();
        // Each value into its caller's buffer (left empty: none).
        let got: Result<(), String> = if names.is_empty() {
            Ok(())
        } else if inner.direct {
            inner
                .take_getter()
                .and_then(|mut g| {
                    g.mget(&names, &into, outs)?;
                    inner.give_getter(g);
                    Ok(())
                })
                .map_err(|e| e.to_string())
        } else {
            inner
                .take_link()
                .and_then(|mut l| {
                    let v = l.get_many(&names)?;
                    inner.give_link(l);
                    Ok(v)
                })
                .map(|vals| {
                    for (&i, v) in into.iter().zip(vals) {
                        outs[i] = v.unwrap_or_default();
                    }
                })
                .map_err(|e| e.to_string())
        };
        match got {
            Ok(()) => {
                if !names.is_empty() {
                    inner.stats.get_ns.record(t.elapsed().as_nanos() as u64);
                }
                for (i, w, meta, seq) in &remote {
                    // Empty: no such key (or an empty value): asked again
                    // below, one by one, which tells them apart.
                    if outs[*i].is_empty() {
                        continue;
                    }
                    // Used only once its MAC is checked (cleared if not).
                    if w.open_in_place(keys[*i], meta, *seq, &mut outs[*i]).is_ok() {
                        inner.stats.gets.fetch_add(1, Relaxed);
                        inner.stats.get_bytes.fetch_add(outs[*i].len() as u64, Relaxed);
                        res[*i] = Some(*meta);
                    }
                }
            }
            Err(_) => {
                for &i in &into {
                    outs[i].clear();
                }
                inner.stats.errors.fetch_add(1, Relaxed);
            }
        }
        // The rest (pending, local, failed): one by one.
        for (i, k) in keys.iter().enumerate() {
            if res[i].is_none() {
                res[i] = self.get(*k, &mut outs[i], false)?;
            }
        }
        Ok(res)
    }
}

/// Deletes every value of run `run_id` (what its processes left, killed
/// ones included) from every master; returns how many.
pub fn remove_run(cfg: &RemoteConfig, run_id: &str) -> Result<u64, RemoteError> {
    if run_id.len() != 12 || !run_id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(RemoteError::Config(format!("run id {run_id:?}: 12 hex digits expected")));
    }
    let (conn, topo) = Connector::new(cfg)?;
    let err = |e: redis::RedisError| RemoteError::Connect(e.to_string());
    let pattern = format!("zt:{run_id}:*");
    let mut removed = 0u64;
    let masters: Vec<Option<(String, u16)>> = if topo.cluster {
        topo.masters
            .iter()
            .filter_map(|m| {
                m.rsplit_once(':').and_then(|(h, p)| Some(Some((h.to_string(), p.parse().ok()?))))
            })
            .collect()
    } else {
        vec![None]
    };
    let mut link = conn.connect().map_err(err)?;
    for m in masters {
        let mut cursor = 0u64;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor).arg("MATCH").arg(&pattern).arg("COUNT").arg(1000);
            let v = match (&mut link, &m) {
                (Link::Cluster(c), Some((host, port))) => c
                    .route_command(
                        &scan,
                        redis::cluster_routing::RoutingInfo::SingleNode(
                            redis::cluster_routing::SingleNodeRoutingInfo::ByAddress {
                                host: host.clone(),
                                port: *port,
                            },
                        ),
                    )
                    .map_err(err)?,
                (l, _) => l.any(&scan).map_err(err)?,
            };
            let (next, keys): (u64, Vec<Vec<u8>>) = redis::from_redis_value(v).map_err(|e| err(e.into()))?;
            if !keys.is_empty() {
                let cmds: Vec<redis::Cmd> = keys
                    .iter()
                    .map(|k| {
                        let mut c = redis::cmd("UNLINK");
                        c.arg(&k[..]);
                        c
                    })
                    .collect();
                link.pipeline(&cmds).map_err(err)?;
                removed += keys.len() as u64;
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    Ok(removed)
}

/// The set of runs that may have values on the servers (their ids).
pub const RUNS_KEY: &str = "zt:runs";

/// The key that says run `run_id` is alive (it expires unless renewed).
pub fn alive_key(run_id: &str) -> String {
    format!("zt:{run_id}:alive")
}

/// How a run says it is alive: [`alive_key`] for this long, renewed
/// every third of it.
pub const ALIVE_FOR: Duration = Duration::from_secs(60);

/// Says that run `run_id` is alive (for [`ALIVE_FOR`]) and records it in
/// [`RUNS_KEY`]; with `alive` false, that it has ended (its records
/// removed).
pub fn mark_run(cfg: &RemoteConfig, run_id: &str, alive: bool) -> Result<(), RemoteError> {
    let (conn, _) = Connector::new(cfg)?;
    let err = |e: redis::RedisError| RemoteError::Connect(e.to_string());
    let mut link = conn.connect().map_err(err)?;
    let alive_key = alive_key(run_id);
    let cmds = if alive {
        [
            redis::cmd("SET")
                .arg(&alive_key)
                .arg(std::process::id())
                .arg("EX")
                .arg(ALIVE_FOR.as_secs())
                .clone(),
            redis::cmd("SADD").arg(RUNS_KEY).arg(run_id).clone(),
        ]
    } else {
        [redis::cmd("DEL").arg(&alive_key).clone(), redis::cmd("SREM").arg(RUNS_KEY).arg(run_id).clone()]
    };
    for c in &cmds {
        link.keyed(c).and_then(|v| v.extract_error()).map_err(err)?;
    }
    Ok(())
}

/// Removes the values of every run recorded in [`RUNS_KEY`] whose
/// [`alive_key`] has expired (its `ztier run` was killed, or its machine
/// lost): `(run id, values removed)` for each.
pub fn remove_dead_runs(cfg: &RemoteConfig) -> Result<Vec<(String, u64)>, RemoteError> {
    let (conn, _) = Connector::new(cfg)?;
    let err = |e: redis::RedisError| RemoteError::Connect(e.to_string());
    let mut link = conn.connect().map_err(err)?;
    let runs: Vec<String> =
        redis::from_redis_value(link.keyed(redis::cmd("SMEMBERS").arg(RUNS_KEY)).map_err(err)?)
            .map_err(|e| err(e.into()))?;
    let mut out = Vec::new();
    for run in runs {
        let alive: bool =
            redis::from_redis_value(link.keyed(redis::cmd("EXISTS").arg(alive_key(&run))).map_err(err)?)
                .map_err(|e| err(e.into()))?;
        if alive {
            continue;
        }
        let removed = if run.len() == 12 && run.bytes().all(|b| b.is_ascii_hexdigit()) {
            remove_run(cfg, &run)?
        } else {
            0
        };
        link.keyed(redis::cmd("SREM").arg(RUNS_KEY).arg(&run)).map_err(err)?;
        out.push((run, removed));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::push_decimal;

    #[test]
    fn lengths_are_written_in_decimal() {
        for n in [0usize, 7, 10, 99, 4124, 1 << 20, usize::MAX] {
            let mut b = b"x".to_vec();
            push_decimal(&mut b, n);
            assert_eq!(b, format!("x{n}").into_bytes());
        }
    }
}
