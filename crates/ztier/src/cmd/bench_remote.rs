//! `ztier bench remote`: the remote tier's puts and gets of 4 KiB pages
//! against `redis-benchmark -t set,get -d 4096` on the same server, at
//! the same concurrency and pipeline depth, in turn, round by round.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use ztier_remote::testbed::{Options, Testbed};
use ztier_remote::{Durability, RemoteConfig, RemoteTier};
use ztier_store::tier::{NextTier, SpillMeta};
use ztier_store::Key;

/// Arguments of `ztier bench remote`.
#[derive(Args, Debug)]
#[command(after_long_help = "Examples:\n  \
    ztier bench remote\n  \
    ztier bench remote --clients 1,50 --pipelines 1,16,32 --json\n\n\
Without --remote, a redis-server is started on a free loopback port for the run (Debian's\n\
redis-server; redis-benchmark from redis-tools). Each round runs redis-benchmark and then\n\
ztier at each concurrency and depth; the rates are the medians of the rounds, the ratios\n\
the medians of each round's ratio (ztier over redis-benchmark in that round), with their range;\n\
and the CPU time a request costs each client (all its threads) and the server (medians), which a\n\
loaded machine disturbs less than the rates; --json adds the server's minor faults per request and the flusher threads' CPU per put\n\
(ztier_put_flusher_cpu_us: one thread's, so 1e6 over it is the most puts a second it can carry).\n\
ztier's put is the tier's put of a 4 KiB page (sealed and named in the putting thread, written behind in\n\
batches of DEPTH pages, one batch per pipeline, until all are written); its get at depth 1\n\
is the get a fault makes (one GET, MAC checked), at a greater depth get_many (pipelined).\n\
Each client is a tier of its own (its keys, index, MAC key), as each process of a ztier run\n\
is; with --flusher shared (the default, what ztier run does) the tiers' writes go through\n\
one flusher thread and connection, one pipeline for all; with --flusher own each tier has\n\
its own flusher thread and connection. With --pending-pages N (default: the page buffers a\n\
process keeps, 1024) the clients' tiers hold at most N pages waiting to be written together (each\n\
at least two batches): a put waits for room, so the puts go at the writes' pace and the\n\
measurement is of a steady state, not of a burst queued in memory; 0 leaves each tier its default.\n\
A round's ztier pages are removed just before the next round's puts (which then reuse the memory\n\
the server freed, as redis-benchmark's SETs, over 100,000 keys, replace theirs).")]
pub struct RemoteBenchArgs {
    /// A server to use (redis://HOST:PORT, no password: ZTIER_REMOTE_PASSWORD); default: one started here.
    #[arg(long)]
    pub remote: Option<String>,
    /// Concurrencies (client threads; redis-benchmark -c).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub clients: Vec<usize>,
    /// Pipeline depths (redis-benchmark -P; ztier's batch size).
    #[arg(long, value_delimiter = ',', default_value = "1,16,32")]
    pub pipelines: Vec<usize>,
    /// Who writes the clients' tiers' pages: one flusher for all (`shared`) or one each (`own`).
    #[arg(long, value_enum, default_value_t = Flusher::Shared)]
    pub flusher: Flusher,
    /// Pages per measurement.
    #[arg(long, default_value_t = 40000)]
    pub requests: usize,
    /// Pages waiting to be written, all clients together, at most (a put waits for room, as evictions do; 0: each tier's default).
    #[arg(long, default_value_t = ztier_remote::pool::KEPT)]
    pub pending_pages: usize,
    /// Rounds (medians are reported).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Who writes the tiers' pages.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flusher {
    /// One flusher for all the tiers ([`ztier_remote::Hub`]).
    Shared,
    /// A flusher thread and connection per tier.
    Own,
}

/// Requests per second, and CPU seconds per request of the client (its
/// every thread) and of the server (0 if it is not ours to watch).
#[derive(Default)]
struct Rate {
    per_s: f64,
    client_cpu: f64,
    server_cpu: f64,
    /// Minor page faults of the client per request (ztier's only).
    client_faults: f64,
    /// Minor page faults of the server per request (0 if it is not
    /// ours): the first touch of memory its allocator takes fresh.
    server_faults: f64,
    /// CPU seconds per request of the flusher threads (ztier's puts
    /// only): one thread's share, so a rate it can carry at most.
    flusher_cpu: f64,
}

struct Rates {
    set: Rate,
    get: Rate,
}

/// User + system CPU seconds of `who` (`RUSAGE_SELF`: this process;
/// `RUSAGE_CHILDREN`: its children waited for).
fn rusage(who: i32) -> f64 {
    let u = rusage_of(who);
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// Minor page faults of this process so far.
fn minor_faults() -> f64 {
    rusage_of(libc::RUSAGE_SELF).ru_minflt as f64
}

fn rusage_of(who: i32) -> libc::rusage {
    // SAFETY: getrusage fills the plain struct it is given.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &mut u);
        u
    }
}

/// User + system CPU seconds of process `pid` so far (`None`: none to
/// watch, or gone).
fn proc_cpu(pid: Option<u32>) -> Option<f64> {
    stat_cpu(&std::fs::read_to_string(format!("/proc/{}/stat", pid?)).ok()?)
}

/// CPU seconds so far of each of this process's flusher threads (named
/// `ztier-remote…`: a hub's or a tier's own), by thread id, to the
/// nanosecond (their `/proc` stat counts 10 ms ticks).
fn flushers_cpu() -> Vec<(i32, f64)> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    tasks
        .filter_map(|t| {
            let t = t.ok()?;
            let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
            comm.starts_with("ztier-remote").then_some(())?;
            let tid = t.file_name().to_str()?.parse().ok()?;
            Some((tid, thread_cpu(tid)?))
        })
        .collect()
}

/// The flusher threads' CPU seconds from `before` to `after`
/// ([`flushers_cpu`]), of the threads alive at `after` (a thread that
/// ended meanwhile, the round before's, is left out: its time before
/// would count against the others').
fn flushers_between(before: &[(i32, f64)], after: &[(i32, f64)]) -> f64 {
    after.iter().map(|(t, b)| b - before.iter().find(|(u, _)| u == t).map_or(0.0, |(_, a)| *a)).sum()
}

/// CPU seconds of thread `tid` of this process: its CPU-time clock, the
/// id glibc's `pthread_getcpuclockid` makes from a thread id (the
/// kernel's per-thread scheduler clock, `(~tid << 3) | 6`).
fn thread_cpu(tid: i32) -> Option<f64> {
    let clock: libc::clockid_t = ((!tid) << 3) | 6;
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given; a clock of
    // a thread gone since is an error (EINVAL), not undefined behaviour.
    let r = unsafe { libc::clock_gettime(clock, &mut ts) };
    (r == 0).then(|| ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9)
}

/// Minor page faults of process `pid` so far (`None`: none to watch).
fn proc_faults(pid: Option<u32>) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid?)).ok()?;
    // minflt: the 8th field after the command.
    stat[stat.rfind(')')? + 2..].split_whitespace().nth(7)?.parse().ok()
}

/// User + system CPU seconds in a `/proc/.../stat` line.
fn stat_cpu(stat: &str) -> Option<f64> {
    // Fields after the command's closing parenthesis: utime and stime
    // are the 12th and 13th.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some((f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / hz)
}

/// CPU seconds of the client (`who`) and the server, and the server's
/// minor faults, while `f` runs.
fn cpu_of<T>(who: i32, server: Option<u32>, f: impl FnOnce() -> Result<T>) -> Result<(T, f64, f64, f64)> {
    let (c, s, sf) = (rusage(who), proc_cpu(server), proc_faults(server));
    let r = f()?;
    let d = |a: Option<f64>, b: Option<f64>| a.zip(b).map_or(0.0, |(a, b)| b - a);
    Ok((r, rusage(who) - c, d(s, proc_cpu(server)), d(sf, proc_faults(server))))
}

/// `redis-benchmark -t TEST` (each test a run of its own, so that each
/// has its CPU time: `set` first, so that `get` finds the keys).
fn redis_benchmark(
    port: u16,
    host: &str,
    c: usize,
    p: usize,
    n: usize,
    server: Option<u32>,
) -> Result<Rates> {
    let one = |t: &str| -> Result<Rate> {
        let mut cmd = Command::new("redis-benchmark");
        cmd.args(["-h", host, "-p", &port.to_string(), "-t", t, "-d", "4096"]);
        cmd.args(["-c", &c.to_string(), "-P", &p.to_string(), "-n", &n.to_string(), "-r", "100000", "--csv"]);
        if let Ok(pw) = std::env::var(ztier_remote::config::ENV_PASSWORD) {
            // redis-benchmark takes it from the environment like redis-cli.
            cmd.env("REDISCLI_AUTH", pw);
        }
        let (out, client, srv, srv_faults) = cpu_of(libc::RUSAGE_CHILDREN, server, || {
            cmd.output().context("running redis-benchmark (Debian's redis-tools)")
        })?;
        if !out.status.success() {
            bail!("redis-benchmark failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let name = t.to_uppercase();
        let per_s: f64 = text
            .lines()
            .find(|l| l.starts_with(&format!("\"{name}\"")))
            .and_then(|l| l.split(',').nth(1))
            .and_then(|v| v.trim_matches('"').parse().ok())
            .with_context(|| format!("no {name} rate in redis-benchmark's output:\n{text}"))?;
        Ok(Rate {
            per_s,
            client_cpu: client / n as f64,
            server_cpu: srv / n as f64,
            client_faults: 0.0,
            server_faults: srv_faults / n as f64,
            flusher_cpu: 0.0,
        })
    };
    Ok(Rates { set: one("set")?, get: one("get")? })
}

fn page(i: usize) -> Vec<u8> {
    // Incompressible bytes (the store's codecs have had their go already).
    let mut x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// ztier's put and get rates (and CPU: this process's, the server's) at
/// `c` threads and depth `p`, with the get latencies at depth 1 (ns).
///
/// `last`: the tiers of the round before, whose pages are removed just
/// before this round's puts (and this round's tiers are left there for
/// the next): the puts then take memory the server has just freed, as
/// redis-benchmark's SETs (100,000 keys, written over from its second
/// round on) take the memory of the values they replace. Pages removed
/// at the end of a round left the server's allocator time to give their
/// memory back to the system, and the next puts paid a page fault per
/// value (1.3 a put) that the SETs never did.
#[allow(clippy::too_many_arguments)]
fn ztier(
    cfg: &RemoteConfig,
    flusher: Flusher,
    pending_pages: usize,
    c: usize,
    p: usize,
    n: usize,
    lat: &mut Vec<u64>,
    server: Option<u32>,
    last: &mut Vec<Arc<RemoteTier>>,
) -> Result<Rates> {
    let per = n / c;
    for tier in last.drain(..) {
        tier.close();
    }
    let mut tiers = Vec::new();
    let hub = ztier_remote::Hub::new()?;
    for _ in 0..c {
        let mut cfg = cfg.clone();
        cfg.batch_pages = p;
        cfg.batches_per_round = 1;
        if pending_pages > 0 {
            cfg.pending_bytes = (pending_pages / c).max(2 * p) * ztier_remote::pool::CAPACITY;
        }
        tiers.push(Arc::new(match flusher {
            Flusher::Shared => RemoteTier::connect_shared(cfg, None, &hub)?,
            Flusher::Own => RemoteTier::connect(cfg, None)?,
        }));
    }
    let pages: Arc<Vec<Vec<u8>>> = Arc::new((0..per).map(page).collect());
    // The metadata comes with a page from the store (its checksum
    // computed there): made before the clock starts.
    let metas: Arc<Vec<SpillMeta>> = Arc::new(
        pages.iter().map(|d| SpillMeta { tag: 0, flags: 0, len: 4096, crc: crc32c(d), pattern: 0 }).collect(),
    );
    let (c0, s0, f0, h0) = (rusage(libc::RUSAGE_SELF), proc_cpu(server), minor_faults(), flushers_cpu());
    let sf0 = proc_faults(server);
    let t = Instant::now();
    let hs: Vec<_> = tiers
        .iter()
        .map(|tier| {
            let (tier, pages, metas) = (tier.clone(), pages.clone(), metas.clone());
            // Named, so that a profile tells puts from gets.
            std::thread::Builder::new().name("bench-put".into()).spawn(move || {
                for (i, (d, m)) in pages.iter().zip(metas.iter()).enumerate() {
                    tier.put(Key { pool: 0, object: 0, index: i as u32 }, *m, d).expect("put");
                }
                tier.flush();
            })
        })
        .collect::<std::io::Result<_>>()
        .context("starting the put threads")?;
    for h in hs {
        h.join().map_err(|_| anyhow::anyhow!("a put thread panicked"))?;
    }
    let set = (per * c) as f64 / t.elapsed().as_secs_f64();
    let total = (per * c) as f64;
    let (c1, s1, f1, h1) = (rusage(libc::RUSAGE_SELF), proc_cpu(server), minor_faults(), flushers_cpu());
    let sf1 = proc_faults(server);
    let srv = |a: Option<f64>, b: Option<f64>| a.zip(b).map_or(0.0, |(a, b)| (b - a) / total);
    let set = Rate {
        per_s: set,
        client_cpu: (c1 - c0) / total,
        server_cpu: srv(s0, s1),
        client_faults: (f1 - f0) / total,
        server_faults: srv(sf0, sf1),
        flusher_cpu: flushers_between(&h0, &h1) / total,
    };
    for tier in &tiers {
        let s = tier.stats();
        if s.remote_puts != per as u64 {
            bail!("{} of {per} pages written: {:?}", s.remote_puts, tier.last_error());
        }
    }
    let t = Instant::now();
    let hs: Vec<_> = tiers
        .iter()
        .map(|tier| {
            let (tier, pages) = (tier.clone(), pages.clone());
            std::thread::Builder::new().name("bench-get".into()).spawn(move || -> Result<Vec<u64>, String> {
                let mut lat = Vec::new();
                let mut outs = vec![Vec::with_capacity(4096); p];
                for first in (0..per).step_by(p) {
                    let keys: Vec<Key> = (first..(first + p).min(per))
                        .map(|i| Key { pool: 0, object: 0, index: i as u32 })
                        .collect();
                    if p == 1 {
                        let t = Instant::now();
                        tier.get(keys[0], &mut outs[0], false).map_err(|e| e.to_string())?;
                        lat.push(t.elapsed().as_nanos() as u64);
                    } else {
                        tier.get_many(&keys, &mut outs[..keys.len()]).map_err(|e| e.to_string())?;
                    }
                    for (k, o) in keys.iter().zip(&outs) {
                        if *o != pages[k.index as usize] {
                            return Err(format!("page {} came back wrong", k.index));
                        }
                    }
                }
                Ok(lat)
            })
        })
        .collect::<std::io::Result<_>>()
        .context("starting the get threads")?;
    for h in hs {
        lat.extend(
            h.join().map_err(|_| anyhow::anyhow!("a get thread panicked"))?.map_err(anyhow::Error::msg)?,
        );
    }
    let get = (per * c) as f64 / t.elapsed().as_secs_f64();
    let (c2, s2, f2) = (rusage(libc::RUSAGE_SELF), proc_cpu(server), minor_faults());
    let sf2 = proc_faults(server);
    let get = Rate {
        per_s: get,
        client_cpu: (c2 - c1) / total,
        server_cpu: srv(s1, s2),
        client_faults: (f2 - f1) / total,
        server_faults: srv(sf1, sf2),
        flusher_cpu: 0.0,
    };
    *last = tiers;
    Ok(Rates { set, get })
}

fn crc32c(d: &[u8]) -> u32 {
    // Only carried: the tier does not check it (the store does).
    d.iter().fold(0u32, |a, &b| a.rotate_left(5) ^ b as u32)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn quantile(v: &mut [u64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_unstable();
    v[((v.len() as f64 * q) as usize).min(v.len() - 1)] as f64 / 1000.0
}

/// `ztier bench remote`.
pub fn run(a: RemoteBenchArgs) -> Result<i32> {
    let (bed, cfg) = match &a.remote {
        Some(url) => (None, RemoteConfig::parse(url)?),
        None => {
            let bed = Testbed::single(&Options::default()).context("starting a local redis-server")?;
            let cfg = RemoteConfig::parse(&bed.url())?;
            (Some(bed), cfg)
        }
    };
    // The server's CPU is watched only if it is ours.
    let server = bed.as_ref().and_then(|b| b.servers[0].pid());
    let mut cfg = cfg;
    cfg.durability = Durability::None;
    cfg.timeout = Duration::from_secs(5);
    let node = cfg.nodes[0].clone();
    let mut rows = Vec::new();
    for &c in &a.clients {
        for &p in &a.pipelines {
            // Per round: redis-benchmark's set and get, ztier's put and get.
            let mut sides: [Vec<Rate>; 4] = Default::default();
            let mut lat = Vec::new();
            let mut last = Vec::new();
            for round in 0..a.rounds {
                eprintln!("round {}/{}: {c} clients, depth {p}", round + 1, a.rounds);
                let r = redis_benchmark(node.port, &node.host, c, p, a.requests, server)?;
                let z =
                    ztier(&cfg, a.flusher, a.pending_pages, c, p, a.requests, &mut lat, server, &mut last)?;
                for (v, x) in sides.iter_mut().zip([r.set, r.get, z.set, z.get]) {
                    v.push(x);
                }
            }
            for tier in last {
                tier.close();
            }
            let [rs, rg, zs, zg] = &sides;
            // Each round's ratio: both sides of a round ran back to back,
            // so a machine that slows for a while slows both.
            let ratios = |z: &[Rate], r: &[Rate]| -> Vec<f64> {
                z.iter().zip(r).map(|(z, r)| z.per_s / r.per_s).collect()
            };
            let (mut put, mut get) = (ratios(zs, rs), ratios(zg, rg));
            let range = |v: &[f64]| {
                let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
                [lo, v.iter().copied().fold(lo, f64::max)]
            };
            let med = |v: &[Rate], f: fn(&Rate) -> f64| median(&mut v.iter().map(f).collect::<Vec<_>>());
            let rate = |v: &[Rate]| med(v, |r| r.per_s);
            // CPU microseconds per request (medians of the rounds).
            let client = |v: &[Rate]| med(v, |r| r.client_cpu) * 1e6;
            let srv = |v: &[Rate]| med(v, |r| r.server_cpu) * 1e6;
            rows.push(serde_json::json!({
                "clients": c, "pipeline": p,
                "redis_benchmark_set_s": rate(rs), "redis_benchmark_get_s": rate(rg),
                "ztier_put_s": rate(zs), "ztier_get_s": rate(zg),
                "put_ratio": median(&mut put), "get_ratio": median(&mut get),
                "put_ratio_range": range(&put), "get_ratio_range": range(&get),
                "redis_benchmark_set_cpu_us": client(rs), "redis_benchmark_get_cpu_us": client(rg),
                "ztier_put_cpu_us": client(zs), "ztier_get_cpu_us": client(zg),
                "server_set_cpu_us": srv(rs), "server_get_cpu_us": srv(rg),
                "server_put_cpu_us": srv(zs), "server_ztier_get_cpu_us": srv(zg),
                "ztier_put_faults": med(zs, |r| r.client_faults),
                "server_set_faults": med(rs, |r| r.server_faults), "server_put_faults": med(zs, |r| r.server_faults),
                "server_get_faults": med(rg, |r| r.server_faults), "server_ztier_get_faults": med(zg, |r| r.server_faults),
                "ztier_put_flusher_cpu_us": med(zs, |r| r.flusher_cpu) * 1e6, "ztier_get_faults": med(zg, |r| r.client_faults),
                "get_p50_us": quantile(&mut lat, 0.5), "get_p99_us": quantile(&mut lat, 0.99),
            }));
        }
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "server": node.to_string(), "page_bytes": 4096, "requests": a.requests,
                "rounds": a.rounds, "rows": rows, "pending_pages": a.pending_pages,
                "flusher": if a.flusher == Flusher::Shared { "shared" } else { "own" },
            }))?
        );
        return Ok(0);
    }
    println!(
        "4 KiB pages against redis-benchmark -t set,get -d 4096 on {node}, {} requests, median of {} rounds\n\
         (×: the median of the rounds' ratios, [its range]; cpu: CPU µs a request of redis-benchmark/of ztier,\n\
         the clients' only: the server's are in --json)",
        a.requests, a.rounds
    );
    println!(
        "{:>7} {:>5} {:>9} {:>11} {:>17} {:>11} {:>9} {:>11} {:>17} {:>11} {:>9} {:>9}",
        "clients",
        "depth",
        "SET/s",
        "ztier put/s",
        "×",
        "cpu SET/put",
        "GET/s",
        "ztier get/s",
        "×",
        "cpu GET/get",
        "get p50",
        "get p99"
    );
    for r in &rows {
        let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
        let lat = |k: &str| if r["pipeline"] == 1 { format!("{:.1} µs", f(k)) } else { "-".into() };
        let ratio = |k: &str| {
            let g = |i: usize| r[format!("{k}_range")][i].as_f64().unwrap_or(0.0);
            format!("{:.2} [{:.2}–{:.2}]", f(k), g(0), g(1))
        };
        println!(
            "{:>7} {:>5} {:>9.0} {:>11.0} {:>17} {:>11} {:>9.0} {:>11.0} {:>17} {:>11} {:>9} {:>9}",
            r["clients"].as_u64().unwrap_or(0),
            r["pipeline"].as_u64().unwrap_or(0),
            f("redis_benchmark_set_s"),
            f("ztier_put_s"),
            ratio("put_ratio"),
            format!("{:.1}/{:.1}", f("redis_benchmark_set_cpu_us"), f("ztier_put_cpu_us")),
            f("redis_benchmark_get_s"),
            f("ztier_get_s"),
            ratio("get_ratio"),
            format!("{:.1}/{:.1}", f("redis_benchmark_get_cpu_us"), f("ztier_get_cpu_us")),
            lat("get_p50_us"),
            lat("get_p99_us")
        );
    }
    Ok(0)
}
