//! [`Hub`]: one flusher for the remote tiers of one process that write
//! to the same single server (the proxy's tiers, one per process of a
//! `ztier run`; a benchmark's clients).
//!
//! ```text
//!  tier A ─┐ put: queued, sealed (its own keys, names, MAC)
//!  tier B ─┼─▶ the hub's thread: a round of each tier with work, packed
//!  tier C ─┘   into ONE pipeline (each tier's MSETs under its own
//!              names), on one of up to LINKS connections, a pipeline in
//!              flight on each; WAIT 1 after the pipeline (one at a time)
//!              when a tier's durability asks
//! ```
//!
//! Why: a tier's own flusher is a thread and a connection per tier, and
//! a wake-up per round of each; with many tiers on few CPUs the
//! hand-over between putting threads and flushers is most of the cost
//! (50 tiers: 100 threads). A hub makes it one thread and one pipeline
//! at a time.
//!
//! What does not change: each tier's index, queue, keys, names and MAC
//! (a tier's values stay its own: no tier can read or name another's);
//! a round is settled (the pages remote, or to the tier's fallback)
//! exactly as by the tier's own flusher, and with a durability that
//! waits (`replica`, `replica+local`) only after `WAIT 1` has answered
//! for the pipeline that carried it, one pipeline at a time. A failed
//! pipeline fails every tier's round in it (same server, same fate):
//! each goes to its own fallback and backs off. A cluster's tiers keep
//! their own flushers (their commands need routing per node).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ztier_store::tier::NextTier;

use crate::config::RemoteConfig;
use crate::link::Link;
use crate::tier::{Bell, Found, Inner, RemoteTier, Round};
use crate::RemoteError;

/// Connections the hub writes on, at most, each with one pipeline in
/// flight: opened as pipelines wait for one. A single server reads at
/// most 16 KiB from a connection per turn of its event loop: a deep
/// pipeline on one connection costs it about a fifth more CPU a page
/// than the same pages over several (see
/// `docs/measurements/2026-12-07-remote-puts-2.md`).
pub const LINKS: usize = 4;
/// Pages one pipeline carries, at most (of all tiers together; each
/// tier gives it a round of its own size at most: `batch_pages` ×
/// `batches_per_round`): the 1024 pages once carried by two pipelines
/// in flight, spread over the connections.
const PIPELINE_PAGES: usize = 2048 / LINKS;
/// An idle hub looks at its tiers this often (tiers dropped, backoffs).
const LOOK_EVERY: Duration = Duration::from_millis(500);

struct Shared {
    bell: Arc<Bell>,
    /// The servers of the tiers ([`Inner::servers`]); set by the first.
    servers: Mutex<Option<String>>,
    tiers: Mutex<Vec<Arc<Inner>>>,
    /// The hub was dropped: its thread ends when its last tier has.
    closing: AtomicBool,
}

/// A flusher shared by remote tiers (see the module docs). Tiers join
/// with [`crate::RemoteTier::connect_shared`]. Dropping the hub lets its
/// thread end once its tiers have been dropped.
pub struct Hub {
    shared: Arc<Shared>,
}

/// A pipeline sent whose replies are not read yet: each tier's round,
/// and how many replies.
struct Flight {
    rounds: Vec<(Arc<Inner>, Round)>,
    n: usize,
    sent_at: Instant,
}

impl Hub {
    /// Starts the hub's thread.
    pub fn new() -> Result<Hub, RemoteError> {
        let shared = Arc::new(Shared {
            bell: Arc::new(Bell::default()),
            servers: Mutex::new(None),
            tiers: Mutex::new(Vec::new()),
            closing: AtomicBool::new(false),
        });
        let s = shared.clone();
        std::thread::Builder::new()
            .name("ztier-remote-hub".into())
            .spawn(move || run(s))
            .map_err(|e| RemoteError::Config(format!("cannot start the shared flusher thread: {e}")))?;
        Ok(Hub { shared })
    }

    /// Takes `tier` in, if its servers are the hub's (the first tier's).
    pub(crate) fn join(&self, tier: &Arc<Inner>) -> bool {
        let mut servers = self.shared.servers.lock().unwrap_or_else(|p| p.into_inner());
        let mine = tier.servers();
        match &*servers {
            Some(s) if *s != mine => return false,
            Some(_) => {}
            None => *servers = Some(mine),
        }
        tier.share(self.shared.bell.clone());
        self.shared.tiers.lock().unwrap_or_else(|p| p.into_inner()).push(tier.clone());
        self.shared.bell.ring();
        true
    }

    /// Tiers served now.
    pub fn tiers(&self) -> usize {
        self.shared.tiers.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl RemoteTier {
    /// [`RemoteTier::connect`], its writes made by `hub`'s flusher
    /// together with those of the hub's other tiers (one pipeline, one
    /// connection, one thread for all). A cluster, or servers other than
    /// the hub's, get a flusher of their own.
    pub fn connect_shared(
        cfg: RemoteConfig,
        fallback: Option<Box<dyn NextTier>>,
        hub: &Hub,
    ) -> Result<Self, RemoteError> {
        let t = Self::new(cfg, fallback)?;
        if t.inner().conn.is_cluster() || !hub.join(t.inner()) {
            t.start_flusher()?;
        }
        Ok(t)
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::Release);
        self.shared.bell.ring();
    }
}

/// The hub's thread.
fn run(sh: Arc<Shared>) {
    // Connection `i` and the pipeline sent on it whose replies are not
    // read yet (at most one each), oldest first.
    let mut links: Vec<Option<Link>> = Vec::new();
    let mut flights: VecDeque<(usize, Flight)> = VecDeque::new();
    let mut buf = Vec::new();
    // Which tier goes first this time (each in turn).
    let mut first = 0usize;
    loop {
        sh.bell.clear();
        let tiers: Vec<Arc<Inner>> = sh.tiers.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if tiers.is_empty() && flights.is_empty() && sh.closing.load(Ordering::Acquire) {
            return;
        }
        // A round of each tier with work.
        let mut rounds: Vec<(Arc<Inner>, Round)> = Vec::new();
        let mut gone = Vec::new();
        let mut wake_at: Option<Instant> = None;
        let (mut pages, k) = (0, tiers.len().max(1));
        first = (first + 1) % k;
        for i in 0..tiers.len() {
            let t = &tiers[(first + i) % k];
            if pages >= PIPELINE_PAGES {
                break;
            }
            match t.take_round(PIPELINE_PAGES - pages) {
                Found::Gone => gone.push(t.clone()),
                Found::Idle => {}
                Found::Down(at) => wake_at = Some(wake_at.map_or(at, |w| w.min(at))),
                Found::Round(r) => {
                    pages += r.pages();
                    rounds.push((t.clone(), r));
                }
            }
        }
        if !gone.is_empty() {
            sh.tiers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|t| !gone.iter().any(|g| Arc::ptr_eq(t, g)));
        }
        if rounds.is_empty() && flights.is_empty() {
            let d =
                wake_at.map_or(LOOK_EVERY, |w| w.saturating_duration_since(Instant::now()).min(LOOK_EVERY));
            sh.bell.wait(d);
            continue;
        }
        let waits = rounds.iter().any(|(t, r)| r.pages() > 0 && t.waits());
        // The tiers whose rounds are settled in this turn.
        let mut touched: Vec<Arc<Inner>> = flights.iter().flat_map(|(_, f)| tier_list(&f.rounds)).collect();
        touched.extend(tier_list(&rounds));
        if rounds.is_empty() || waits {
            // Nothing to send, or a round that waits for a replica: the
            // pipelines in flight are answered first (the oldest now;
            // all, before a pipeline that waits).
            while let Some((i, f)) = flights.pop_front() {
                land_on(&mut links[i], f);
                if !waits {
                    break;
                }
            }
        }
        if !rounds.is_empty() && waits {
            // One pipeline, answered, then WAIT, on the first connection.
            if links.is_empty() {
                links.push(None);
            }
            connect(&mut links[0], &rounds);
            let ok = match links[0].as_mut() {
                Some(l) => write(l, &rounds, &mut buf),
                None => Err("cannot connect".to_string()),
            };
            if ok.is_err() {
                links[0] = None;
            }
            finish(rounds, ok);
        } else if !rounds.is_empty() {
            // On a connection with nothing in flight: a new one while
            // there are fewer than LINKS, else the oldest pipeline's,
            // once its replies are read.
            let free = (0..links.len()).find(|i| !flights.iter().any(|(j, _)| j == i));
            let i = match free {
                Some(i) => i,
                None if links.len() < LINKS => {
                    links.push(None);
                    links.len() - 1
                }
                None => {
                    let (i, f) = flights.pop_front().expect("every connection has a pipeline in flight");
                    land_on(&mut links[i], f);
                    i
                }
            };
            connect(&mut links[i], &rounds);
            match links[i].as_mut() {
                Some(l) => {
                    buf.clear();
                    let n: usize = rounds.iter().map(|(t, r)| t.pack_round(r, &mut buf)).sum();
                    let sent_at = Instant::now();
                    match l.send_packed(&buf) {
                        Ok(()) => flights.push_back((i, Flight { rounds, n, sent_at })),
                        Err(e) => {
                            links[i] = None;
                            let e = refused(&rounds, e);
                            finish(rounds, Err(e));
                        }
                    }
                }
                None => finish(rounds, Err("cannot connect".to_string())),
            }
        }
        // Tiers with no round in flight any more are settled (their
        // `flush` may return).
        let now: Vec<Arc<Inner>> = flights.iter().flat_map(|(_, f)| tier_list(&f.rounds)).collect();
        for t in &touched {
            if !now.iter().any(|x| Arc::ptr_eq(x, t)) {
                t.settled();
            }
        }
    }
}

/// A connection in `link` if there is none (through the first tier of
/// `rounds`: all are to the same servers).
fn connect(link: &mut Option<Link>, rounds: &[(Arc<Inner>, Round)]) {
    if link.is_none() {
        *link = rounds.first().and_then(|(t, _)| t.conn.connect().ok());
    }
}

/// Reads the replies of pipeline `f`, sent on `link`, and settles its
/// rounds; a connection that failed is dropped (its replies may be out
/// of step).
fn land_on(link: &mut Option<Link>, f: Flight) {
    let ok = match link.as_mut() {
        Some(l) => land(l, &f),
        None => Err("the connection was lost".to_string()),
    };
    if ok.is_err() {
        *link = None;
    }
    finish(f.rounds, ok);
}

fn tier_list(rounds: &[(Arc<Inner>, Round)]) -> Vec<Arc<Inner>> {
    rounds.iter().map(|(t, _)| t.clone()).collect()
}

/// Reads a pipeline's replies, and counts each tier's round.
fn land(l: &mut Link, f: &Flight) -> Result<(), String> {
    match l.replies(f.n) {
        Ok(()) => {
            for (t, r) in &f.rounds {
                t.landed(r, f.sent_at);
            }
            Ok(())
        }
        Err(e) => Err(refused(&f.rounds, e)),
    }
}

/// One pipeline at a time, answered, then `WAIT 1` if a tier's
/// durability asks: for the whole pipeline, on the connection that
/// carried it.
fn write(l: &mut Link, rounds: &[(Arc<Inner>, Round)], buf: &mut Vec<u8>) -> Result<(), String> {
    buf.clear();
    let n: usize = rounds.iter().map(|(t, r)| t.pack_round(r, buf)).sum();
    let sent_at = Instant::now();
    l.exec_packed(buf, n).map_err(|e| refused(rounds, e))?;
    // Each tier whose round waited counts a failed WAIT.
    let waited: Vec<&Inner> =
        rounds.iter().filter(|(t, r)| r.pages() > 0 && t.waits()).map(|(t, _)| &**t).collect();
    if let Some((t, also)) = waited.split_first() {
        t.wait_replica(l, also)?;
    }
    for (t, r) in rounds {
        t.landed(r, sent_at);
    }
    Ok(())
}

/// A pipeline refused or lost: counted by each tier in it.
fn refused(rounds: &[(Arc<Inner>, Round)], e: redis::RedisError) -> String {
    for (t, _) in rounds {
        t.count_error();
    }
    format!("the remote refused or lost a write: {e}")
}

/// Each tier's round settled with the pipeline's outcome.
fn finish(rounds: Vec<(Arc<Inner>, Round)>, ok: Result<(), String>) {
    for (t, r) in rounds {
        t.finish(r, ok.clone());
    }
}
