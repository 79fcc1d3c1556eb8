//! `ztier bench cache`: caches in front of a slow backing, with the same
//! client and the same backing for every row.
//!
//! The backing is `nbdkit --filter=log --filter=delay [--filter=cow]
//! file IMG rdelay=D wdelay=D` (cow keeps IMG unchanged under writes, so
//! every row starts from the same data; log counts what reaches the
//! backing). Rows: the backing alone; `nbdkit --filter=cache` over it (an
//! uncompressed cache of the same size, cache-on-read, write-through, 4K
//! blocks); `ztier cache serve` with codec raw, compressed (set
//! associative, and direct-mapped), compressed with a RAM cache, and with
//! a RAM cache over a remote one (`lz4-remote`: a `redis-server` on a
//! loopback port, started for the cell and stopped by PID). Each
//! row runs fio's nbd engine (4K, QD32, zipf) over a working set of 1×,
//! 2×, 4×, 8× the cache size, random reads and a 70/30 read/write mix,
//! on 50%-compressible data and on an ext4 image of system files. fio's
//! ramp time warms the cache; only the time after it is measured.
//!
//! The hit ratio of every row is measured the same way: 1 − the 4K
//! blocks the backing was asked to read after the ramp / the blocks the
//! client read after the ramp (from the log filter's timestamps).
//!
//! With `--rounds N` every point is run N times, the rows interleaved
//! (round 1 of every row, then round 2, …), and the report adds each
//! row's medians and the medians of the per-round paired ratios. Each
//! cell records the machine's load average when it started and ended,
//! and anything unusual its ztier server reported (errors, a degraded
//! cache device, its stderr).

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;

use crate::cmd::cache::DEFAULT_PLACEMENT;
use crate::units::{parse_size, parse_size_list};
use ztier_remote::testbed::{Options as RedisOptions, Testbed};

/// Arguments of `ztier bench cache`.
#[derive(Args, Debug)]
pub struct CacheBenchArgs {
    /// Cache size (the same for every cache row).
    #[arg(long, default_value = "128M", value_name = "SIZE")]
    pub cache_size: String,
    /// Working sets, as multiples of the cache size.
    #[arg(long, default_value = "1,2,4,8", value_name = "LIST")]
    pub ws: String,
    /// Data sets: `compressible` (fio, 50% compressible), `real` (an ext4
    /// image of files from /usr).
    #[arg(long, default_value = "compressible,real", value_name = "LIST")]
    pub data: String,
    /// Workloads: `randread`, `randrw` (70% reads).
    #[arg(long, default_value = "randread,randrw", value_name = "LIST")]
    pub workloads: String,
    /// Rows: backing, nbdkit-cache, raw, lz4, lz4-direct, lz4-ram,
    /// lz4-remote (lz4-ram over a local redis-server), raw-NWAY or
    /// lz4-NWAY (N-way CLOCK sets; raw and lz4 use `cache create`'s
    /// default), raw-keepPCT or lz4-keepPCT (`serve --recycle-keep PCT`),
    /// raw-seen or lz4-seen (`serve --admission seen`), raw-oldest or
    /// lz4-oldest (`serve --recycle-pick oldest`), raw-wb or lz4-wb
    /// (`serve --mode writeback`).
    #[arg(long, default_value = "backing,nbdkit-cache,raw,lz4,lz4-direct,lz4-ram", value_name = "LIST")]
    pub rows: String,
    /// fio's zipf theta.
    #[arg(long, default_value_t = 0.8, value_name = "THETA")]
    pub zipf: f64,
    /// The backing's delay per request (nbdkit's delay filter).
    #[arg(long, default_value = "2ms", value_name = "D")]
    pub delay: String,
    /// Seconds of warm-up (fio's ramp time) per run.
    #[arg(long, default_value_t = 20, value_name = "S")]
    pub warmup: u64,
    /// Seconds measured per run.
    #[arg(long, default_value_t = 20, value_name = "S")]
    pub runtime: u64,
    /// fio's queue depth.
    #[arg(long, default_value_t = 32, value_name = "N")]
    pub iodepth: u32,
    /// RAM cache of the lz4-ram row (default: a quarter of the cache size).
    #[arg(long, value_name = "SIZE")]
    pub ram_cache: Option<String>,
    /// Folder for images, caches and sockets (default: a new one under TMPDIR).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Runs of every point, the rows interleaved; medians reported.
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=99))]
    pub rounds: u32,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// One row at one point.
#[derive(Debug, Serialize, Clone)]
pub struct Row {
    /// Data set.
    pub data: String,
    /// Workload.
    pub workload: String,
    /// Working set / cache size.
    pub ws: u64,
    /// Row name.
    pub row: String,
    /// Round (1-based; rows of one round ran back to back).
    pub round: u32,
    /// The machine's 1-minute load average when the cell started and ended.
    pub load: [f64; 2],
    /// Anything unusual the cell showed (server errors, a degraded
    /// cache device, the server's stderr); empty when it ran clean.
    pub notes: Vec<String>,
    /// 1 − backing reads / client reads, after the ramp.
    pub hit_ratio: f64,
    /// Read + write IOPS after the ramp.
    pub iops: f64,
    /// Read completion latency p50, µs.
    pub read_p50_us: f64,
    /// Read completion latency p99, µs.
    pub read_p99_us: f64,
    /// Write completion latency p50, µs (randrw).
    pub write_p50_us: f64,
    /// Write completion latency p99, µs (randrw).
    pub write_p99_us: f64,
    /// CPU time of the cache server (the backing's for the backing row)
    /// after the ramp, as % of one CPU.
    pub cpu_pct: f64,
    /// ztier rows: the server's own statistics at exit.
    pub ztier: Option<ZtierFigures>,
}

/// What a ztier server said at exit (whole run, ramp included).
#[derive(Debug, Serialize, Clone)]
pub struct ZtierFigures {
    /// Its own hit ratio (RAM + SSD hits / blocks looked up).
    pub hit_ratio: f64,
    /// Compression ratio of the cache device's items.
    pub ratio: f64,
    /// Lines holding a block at exit.
    pub lines_used: u64,
    /// RAM for metadata per cached block.
    pub metadata_bytes_per_cached_block: f64,
    /// Reads served wholly from RAM: p50 inside the server, µs.
    pub ram_hit_p50_us: f64,
    /// SSD-cache hits: p50 inside the server, µs.
    pub ssd_hit_p50_us: f64,
    /// Fills dropped for want of a free segment.
    pub fills_dropped_space: u64,
    /// Fills dropped because the fill queue was full.
    pub fills_dropped_queue: u64,
    /// Blocks answered from RAM, from the SSD cache, from the backing.
    pub ram_hits: u64,
    /// See `ram_hits`.
    pub ssd_hits: u64,
    /// See `ram_hits`.
    pub misses: u64,
    /// Checkpoints written.
    pub checkpoints: u64,
    /// Lines a fill evicted from a full set.
    pub conflict_evictions: u64,
    /// Blocks answered by the remote RAM cache (lz4-remote).
    pub remote_hits: u64,
    /// Remote hits: p50 inside the server, µs.
    pub remote_hit_p50_us: f64,
    /// Writes: p50 inside the server, µs (the backing's write included:
    /// what is above the backing's delay is the cache's own cost).
    pub write_p50_us: f64,
    /// Writes: p50 of the server's own part (the backing's write left
    /// out), µs.
    pub write_cache_p50_us: f64,
    /// The same, p99.
    pub write_cache_p99_us: f64,
    /// Lines dropped by writes.
    pub invalidated_lines: u64,
    /// Blocks cached by write-through.
    pub write_through_fills: u64,
    /// Fills dropped because a write of the block overlapped them.
    pub fills_dropped_race: u64,
    /// Lines dropped when their segment was recycled (not referenced).
    pub capacity_evictions: u64,
}

/// Compressed against uncompressed at one point.
#[derive(Debug, Serialize)]
pub struct Ratio {
    /// Data set.
    pub data: String,
    /// Workload.
    pub workload: String,
    /// Working set / cache size.
    pub ws: u64,
    /// Row compared (a compressed row).
    pub row: String,
    /// The peer: nbdkit-cache, ztier's own raw row, or lz4-8way,
    /// lz4-keep50 or lz4-oldest (for lz4).
    pub peer: String,
    /// Its hit ratio / the peer's.
    pub hit_ratio_x: f64,
    /// Its IOPS / the peer's.
    pub iops_x: f64,
    /// The round both ran in.
    pub round: u32,
}

/// One row at one point over every round.
#[derive(Debug, Serialize)]
pub struct Median {
    /// Data set.
    pub data: String,
    /// Workload.
    pub workload: String,
    /// Working set / cache size.
    pub ws: u64,
    /// Row name.
    pub row: String,
    /// Hit ratio per round.
    pub hit_ratios: Vec<f64>,
    /// IOPS per round.
    pub iops: Vec<f64>,
    /// Median hit ratio.
    pub hit_ratio: f64,
    /// Median IOPS.
    pub iops_median: f64,
    /// Median read p50, µs.
    pub read_p50_us: f64,
    /// Median read p99, µs.
    pub read_p99_us: f64,
    /// Median CPU %.
    pub cpu_pct: f64,
}

/// Paired ratios of one row against a peer over every round.
#[derive(Debug, Serialize)]
pub struct MedianRatio {
    /// Data set.
    pub data: String,
    /// Workload.
    pub workload: String,
    /// Working set / cache size.
    pub ws: u64,
    /// Row compared.
    pub row: String,
    /// The peer.
    pub peer: String,
    /// Hit ratio / the peer's, per round.
    pub hit_ratio_x: Vec<f64>,
    /// IOPS / the peer's, per round.
    pub iops_x: Vec<f64>,
    /// Median of `hit_ratio_x`.
    pub hit_ratio_x_median: f64,
    /// Median of `iops_x`.
    pub iops_x_median: f64,
}

/// The report.
#[derive(Debug, Serialize)]
pub struct CacheBenchReport {
    /// Cache size in bytes.
    pub cache_size: u64,
    /// fio zipf theta.
    pub zipf: f64,
    /// Backing delay.
    pub delay: String,
    /// Warm-up and measured seconds per run.
    pub warmup_s: u64,
    /// Measured seconds per run.
    pub runtime_s: u64,
    /// Every row.
    pub rows: Vec<Row>,
    /// Compressed vs uncompressed, per round.
    pub ratios: Vec<Ratio>,
    /// Rounds per point.
    pub rounds: u32,
    /// Each row's medians over the rounds.
    pub medians: Vec<Median>,
    /// The paired ratios' medians over the rounds.
    pub median_ratios: Vec<MedianRatio>,
}

/// A child process, ended by PID when dropped (SIGTERM, then SIGKILL after 10 s).
struct Kid {
    child: Option<Child>,
    what: String,
}

impl Kid {
    fn spawn(mut c: Command, what: &str) -> Result<Kid> {
        let child = c.stdout(Stdio::null()).spawn().with_context(|| format!("starting {what}"))?;
        Ok(Kid { child: Some(child), what: what.to_string() })
    }
    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }
    /// Stops it (SIGTERM) and waits; an error if it did not exit cleanly.
    fn stop(mut self) -> Result<()> {
        let Some(mut c) = self.child.take() else { return Ok(()) };
        let _ = Command::new("kill").arg(c.id().to_string()).status();
        let t = Instant::now();
        loop {
            if let Some(st) = c.try_wait()? {
                if !st.success() {
                    bail!("{} exited with {st}", self.what);
                }
                return Ok(());
            }
            if t.elapsed() > Duration::from_secs(60) {
                let _ = Command::new("kill").arg("-KILL").arg(c.id().to_string()).status();
                let _ = c.wait();
                bail!("{} did not stop within 60 s", self.what);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").arg(c.id().to_string()).status();
            let t = Instant::now();
            while c.try_wait().ok().flatten().is_none() {
                if t.elapsed() > Duration::from_secs(10) {
                    let _ = Command::new("kill").arg("-KILL").arg(c.id().to_string()).status();
                    let _ = c.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn need(tool: &str, pkg: &str) -> Result<()> {
    let ok = Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output()?.status.success();
    if !ok {
        bail!("needs '{tool}' (Debian package {pkg})");
    }
    Ok(())
}

fn wait_for(path: &Path, kid: &mut Kid) -> Result<()> {
    let t = Instant::now();
    while !path.exists() {
        if let Some(c) = kid.child.as_mut() {
            if let Some(st) = c.try_wait()? {
                bail!("{} exited ({st}) before listening", kid.what);
            }
        }
        if t.elapsed() > Duration::from_secs(120) {
            bail!("{} did not appear", path.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// CPU seconds (user + system) of a process so far.
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
    // Fields after the command (which is in parentheses).
    let Some(rest) = s.rsplit_once(')').map(|x| x.1) else { return 0.0 };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 (11 and 12 after the command and state).
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(11) + ticks(12)) / hz
}

/// Builds the image for a data set.
fn make_image(data: &str, img: &Path, size: u64, dir: &Path) -> Result<()> {
    match data {
        "compressible" => {
            let out = Command::new("fio")
                .args(["--name=fill", "--ioengine=psync", "--rw=write", "--bs=1M", "--iodepth=1"])
                .arg(format!("--filename={}", img.display()))
                .arg(format!("--size={size}"))
                .args(["--buffer_compress_percentage=50", "--refill_buffers", "--output-format=terse"])
                .output()
                .context("running fio to fill the image")?;
            if !out.status.success() {
                bail!("fio fill: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
        "real" => {
            need("mkfs.ext4", "e2fsprogs")?;
            // Files from /usr, hard-linked into a staging folder (no copy);
            // as full as mkfs.ext4 -d manages (from 80% of the image down).
            let mut fill = 80;
            loop {
                let stage = dir.join("stage");
                let _ = std::fs::remove_dir_all(&stage);
                std::fs::create_dir_all(&stage)?;
                stage_files(&stage, size * fill / 100)?;
                let _ = std::fs::remove_file(img);
                let out = Command::new("mkfs.ext4")
                    .args(["-q", "-F", "-b", "4096", "-d"])
                    .arg(&stage)
                    .arg(img)
                    .arg(format!("{}K", size / 1024))
                    .output()?;
                let _ = std::fs::remove_dir_all(&stage);
                if out.status.success() {
                    break;
                }
                if fill <= 40 {
                    bail!("mkfs.ext4 -d: {}", String::from_utf8_lossy(&out.stderr));
                }
                fill -= 10;
            }
        }
        d => bail!("unknown data set '{d}' (compressible, real)"),
    }
    Ok(())
}

/// Hard-links directories of /usr into `stage` up to about `budget` bytes.
fn stage_files(stage: &Path, mut budget: u64) -> Result<()> {
    let mut picked = 0u64;
    let floor = budget / 50;
    for root in ["/usr/lib", "/usr/share", "/usr/bin", "/usr/libexec", "/usr/include"] {
        let Ok(rd) = std::fs::read_dir(root) else { continue };
        let mut kids: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
        kids.sort();
        for k in kids {
            if budget < floor {
                return Ok(());
            }
            let du = Command::new("du").arg("-sb").arg(&k).output()?;
            let n: u64 = String::from_utf8_lossy(&du.stdout)
                .split_whitespace()
                .next()
                .and_then(|x| x.parse().ok())
                .unwrap_or(0);
            if n == 0 || n > budget {
                continue;
            }
            let to = stage.join(format!("{}-{picked}", root.trim_start_matches('/').replace('/', "-")));
            let linked =
                Command::new("cp").arg("-al").arg(&k).arg(&to).stderr(Stdio::null()).status()?.success();
            if linked || Command::new("cp").arg("-a").arg(&k).arg(&to).status()?.success() {
                budget -= n;
                picked += 1;
            }
        }
    }
    Ok(())
}

/// Starts the backing: nbdkit with log + delay (+ cow for writes) over IMG.
fn start_backing(img: &Path, sock: &Path, log: &Path, delay: &str, cow: bool) -> Result<Kid> {
    let _ = std::fs::remove_file(sock);
    let _ = std::fs::remove_file(log);
    let mut c = Command::new("nbdkit");
    c.env("TZ", "UTC").args(["-f", "--threads=64", "-U"]).arg(sock).args(["--filter=log", "--filter=delay"]);
    if cow {
        c.arg("--filter=cow");
    }
    c.arg("file").arg(img).arg(format!("logfile={}", log.display()));
    c.arg(format!("rdelay={delay}")).arg(format!("wdelay={delay}"));
    if !cow {
        c.arg("--readonly");
    }
    let mut k = Kid::spawn(c, "the backing nbdkit")?;
    wait_for(sock, &mut k)?;
    Ok(k)
}

/// Blocks the backing was asked to read at or after `since` (UTC,
/// seconds since the epoch), from the log filter's file.
fn backing_reads_since(log: &Path, since: f64) -> Result<f64> {
    let f = std::fs::File::open(log).with_context(|| format!("reading {}", log.display()))?;
    let mut blocks = 0.0;
    for line in std::io::BufReader::new(f).lines() {
        let line = line?;
        let Some(i) = line.find(" Read id=") else { continue };
        if line[i..].starts_with(" ...") {
            continue;
        }
        let Some(t) = parse_log_time(&line) else { continue };
        if t < since {
            continue;
        }
        let count = line[i..]
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix("count=0x"))
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .unwrap_or(0);
        blocks += count as f64 / 4096.0;
    }
    Ok(blocks)
}

/// `YYYY-MM-DD HH:MM:SS.ffffff` (UTC) as seconds since the epoch.
fn parse_log_time(line: &str) -> Option<f64> {
    let d = line.get(..10)?;
    let t = line.get(11..26)?;
    let mut dp = d.split('-').map(|x| x.parse::<i64>().ok());
    let (y, m, dd) = (dp.next()??, dp.next()??, dp.next()??);
    let mut tp = t.split(':');
    let (h, mi) = (tp.next()?.parse::<i64>().ok()?, tp.next()?.parse::<i64>().ok()?);
    let s: f64 = tp.next()?.parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = if y2 >= 0 { y2 } else { y2 - 399 } / 400;
    let yoe = y2 - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + dd - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    Some((days * 86400 + h * 3600 + mi * 60) as f64 + s)
}

struct Fio {
    read_ios: f64,
    iops: f64,
    read_p50: f64,
    read_p99: f64,
    write_p50: f64,
    write_p99: f64,
}

fn run_fio(uri: &str, a: &CacheBenchArgs, workload: &str, ws: u64, started: &mut f64) -> Result<Fio> {
    let mut c = Command::new("fio");
    c.args([
        "--name=bench",
        "--ioengine=nbd",
        "--bs=4k",
        "--output-format=json",
        "--time_based",
        "--norandommap",
    ])
    .arg(format!("--uri={uri}"))
    .arg(format!("--iodepth={}", a.iodepth))
    .arg(format!("--size={ws}"))
    .arg(format!("--random_distribution=zipf:{}", a.zipf))
    .arg(format!("--ramp_time={}", a.warmup))
    .arg(format!("--runtime={}", a.runtime))
    .args(["--buffer_compress_percentage=50", "--refill_buffers"]);
    match workload {
        "randread" => c.arg("--rw=randread"),
        "randrw" => c.args(["--rw=randrw", "--rwmixread=70"]),
        w => bail!("unknown workload '{w}' (randread, randrw)"),
    };
    *started = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH)?.as_secs_f64();
    let out = c.output().context("running fio")?;
    if !out.status.success() {
        bail!("fio failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let start = out.stdout.iter().position(|&b| b == b'{').unwrap_or(0);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout[start..]).context("fio's JSON")?;
    let j = &v["jobs"][0];
    if j["error"].as_i64().unwrap_or(0) != 0 {
        bail!("fio job error {}", j["error"]);
    }
    let pct = |d: &str, p: &str| j[d]["clat_ns"]["percentile"][p].as_f64().unwrap_or(0.0) / 1000.0;
    Ok(Fio {
        read_ios: j["read"]["total_ios"].as_f64().unwrap_or(0.0),
        iops: j["read"]["iops"].as_f64().unwrap_or(0.0) + j["write"]["iops"].as_f64().unwrap_or(0.0),
        read_p50: pct("read", "50.000000"),
        read_p99: pct("read", "99.000000"),
        write_p50: pct("write", "50.000000"),
        write_p99: pct("write", "99.000000"),
    })
}

/// One row at one point: starts the cache (if any), runs fio, measures.
#[allow(clippy::too_many_arguments)]
fn run_row(
    a: &CacheBenchArgs,
    dir: &Path,
    img: &Path,
    data: &str,
    workload: &str,
    ws_x: u64,
    row: &str,
    round: u32,
    cache_size: u64,
    ram: u64,
) -> Result<Row> {
    let load_start = load_average();
    let mut notes = Vec::new();
    let bsock = dir.join("backing.sock");
    let log = dir.join("backing.log");
    let cow = workload != "randread";
    let backing = start_backing(img, &bsock, &log, &a.delay, cow)?;
    let buri = format!("nbd+unix:///?socket={}", bsock.display());
    let csock = dir.join("cache.sock");
    let _ = std::fs::remove_file(&csock);
    let stats_file = dir.join("ztier-stats.json");
    let _ = std::fs::remove_file(&stats_file);
    let stderr_file = dir.join("ztier-stderr.txt");
    let _ = std::fs::remove_file(&stderr_file);
    let ztier = std::env::current_exe()?;
    let mut server: Option<Kid> = None;
    // The lz4-remote row's redis-server: stopped by PID when dropped,
    // after the cache server.
    let mut redis: Option<Testbed> = None;
    match row {
        "backing" => {}
        "nbdkit-cache" => {
            let mut c = Command::new("nbdkit");
            c.env("TMPDIR", dir).args(["-f", "-U"]).arg(&csock).args(["--filter=cache", "nbd"]);
            c.arg(format!("socket={}", bsock.display()));
            c.args(["cache=writethrough", "cache-on-read=true", "cache-min-block-size=4096"]);
            c.arg(format!("cache-max-size={cache_size}"));
            let mut k = Kid::spawn(c, "nbdkit --filter=cache")?;
            wait_for(&csock, &mut k)?;
            server = Some(k);
        }
        _ if ZtierRow::parse(row).is_some() => {
            let z = ZtierRow::parse(row).expect("a ztier row");
            let cf = dir.join("cache.ztc");
            let _ = std::fs::remove_file(&cf);
            let mut c = Command::new(&ztier);
            c.args(["cache", "create"]).arg(&cf).arg("--size").arg(cache_size.to_string());
            c.args(["--codec", z.codec, "--placement", &z.placement]);
            let out = c.output()?;
            if !out.status.success() {
                bail!("ztier cache create: {}", String::from_utf8_lossy(&out.stderr));
            }
            let mut c = Command::new(&ztier);
            c.args(["cache", "serve", "--backing"])
                .arg(&buri)
                .arg("--cache")
                .arg(&cf)
                .arg("--socket")
                .arg(&csock);
            c.arg("--stats").arg(&stats_file);
            if !cow {
                c.arg("--readonly"); // the backing is read-only for read-only workloads
            }
            if z.ram {
                c.arg("--ram-cache").arg(ram.to_string());
            }
            if let Some(k) = z.keep {
                c.arg("--recycle-keep").arg(k.to_string());
            }
            if z.seen {
                c.args(["--admission", "seen"]);
            }
            if z.oldest {
                c.args(["--recycle-pick", "oldest"]);
            }
            if z.wb {
                c.args(["--mode", "writeback"]);
            }
            if z.remote {
                let bed =
                    Testbed::single(&RedisOptions::default()).context("starting a local redis-server")?;
                c.arg("--remote").arg(format!("redis://127.0.0.1:{}", bed.servers[0].port));
                redis = Some(bed);
            }
            c.stderr(std::fs::File::create(&stderr_file)?);
            let mut k = Kid::spawn(c, "ztier cache serve")?;
            wait_for(&csock, &mut k)?;
            server = Some(k);
        }
        r => bail!("unknown row '{r}'"),
    }
    let uri =
        if row == "backing" { buri.clone() } else { format!("nbd+unix:///?socket={}", csock.display()) };
    let pid = server.as_ref().map_or(backing.pid(), |k| k.pid());
    // CPU over the measured part: sampled when the ramp ends.
    let cpu = std::sync::Arc::new(std::sync::Mutex::new((0.0f64, 0.0f64)));
    let sampler = {
        let (cpu, warm) = (cpu.clone(), a.warmup);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(warm));
            cpu.lock().expect("cpu").0 = cpu_seconds(pid);
        })
    };
    let mut started = 0.0;
    let f = run_fio(&uri, a, workload, ws_x * cache_size, &mut started)?;
    let _ = sampler.join();
    let cpu_end = cpu_seconds(pid);
    let cpu_pct = (cpu_end - cpu.lock().expect("cpu").0) / a.runtime as f64 * 100.0;
    let mut figures = None;
    if let Some(k) = server {
        k.stop()?;
        if ZtierRow::parse(row).is_some() {
            let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats_file)?)?;
            let n = |k: &str| s[k].as_u64().unwrap_or(0);
            for k in
                ["errors", "verify_failures", "cache_read_errors", "cache_write_errors", "backing_errors"]
            {
                if n(k) > 0 {
                    notes.push(format!("server {k}: {}", n(k)));
                }
            }
            if n("dirty_writes") > 0 {
                notes.push(format!(
                    "write-back: {} blocks written dirty, {} written back ({} superseded), {} written through, {} write-back errors",
                    n("dirty_writes"),
                    n("written_back"),
                    n("writeback_superseded"),
                    n("writeback_fallbacks"),
                    n("writeback_errors")
                ));
            }
            for k in ["degraded", "writes_refused", "writeback_lost"] {
                if let Some(why) = s[k].as_str() {
                    notes.push(format!("server {k}: {why}"));
                }
            }
            let err = std::fs::read_to_string(&stderr_file).unwrap_or_default();
            notes.extend(
                err.lines()
                    .filter(|l| !l.is_empty() && !ROUTINE.iter().any(|r| l.contains(r)))
                    .take(5)
                    .map(|l| format!("server stderr: {l}")),
            );
            figures = Some(ZtierFigures {
                hit_ratio: s["hit_ratio"].as_f64().unwrap_or(0.0),
                ratio: s["ratio"].as_f64().unwrap_or(0.0),
                lines_used: s["lines_used"].as_u64().unwrap_or(0),
                metadata_bytes_per_cached_block: s["metadata_bytes_per_cached_block"].as_f64().unwrap_or(0.0),
                ram_hit_p50_us: s["latency"]["ram_hit"]["p50_us"].as_f64().unwrap_or(0.0),
                ssd_hit_p50_us: s["latency"]["ssd_hit"]["p50_us"].as_f64().unwrap_or(0.0),
                fills_dropped_space: n("fills_dropped_space"),
                fills_dropped_queue: n("fills_dropped_queue"),
                ram_hits: n("ram_hits"),
                ssd_hits: n("ssd_hits"),
                misses: n("misses"),
                checkpoints: n("checkpoints"),
                conflict_evictions: n("conflict_evictions"),
                remote_hits: s["remote"]["hits"].as_u64().unwrap_or(0),
                remote_hit_p50_us: s["latency"]["remote_hit"]["p50_us"].as_f64().unwrap_or(0.0),
                write_p50_us: s["latency"]["write"]["p50_us"].as_f64().unwrap_or(0.0),
                write_cache_p50_us: s["latency"]["write_cache"]["p50_us"].as_f64().unwrap_or(0.0),
                write_cache_p99_us: s["latency"]["write_cache"]["p99_us"].as_f64().unwrap_or(0.0),
                invalidated_lines: n("invalidated_lines"),
                write_through_fills: n("write_through_fills"),
                fills_dropped_race: n("fills_dropped_race"),
                capacity_evictions: n("capacity_evictions"),
            });
        }
    }
    drop(redis);
    backing.stop()?;
    let backing_reads = backing_reads_since(&log, started + a.warmup as f64)?;
    let hit_ratio =
        if row == "backing" || f.read_ios == 0.0 { 0.0 } else { (1.0 - backing_reads / f.read_ios).max(0.0) };
    Ok(Row {
        data: data.into(),
        workload: workload.into(),
        ws: ws_x,
        row: row.into(),
        round,
        load: [load_start, load_average()],
        notes,
        hit_ratio,
        iops: f.iops,
        read_p50_us: f.read_p50,
        read_p99_us: f.read_p99,
        write_p50_us: f.write_p50,
        write_p99_us: f.write_p99,
        cpu_pct,
        ztier: figures,
    })
}

/// How a ztier row's cache is made and served.
struct ZtierRow {
    codec: &'static str,
    placement: String,
    ram: bool,
    remote: bool,
    /// `serve --recycle-keep` (the server's default if `None`).
    keep: Option<u8>,
    /// `serve --admission seen`.
    seen: bool,
    /// `serve --recycle-pick oldest`.
    oldest: bool,
    /// `serve --mode writeback`.
    wb: bool,
}

impl ZtierRow {
    /// `raw`, `lz4`, `lz4-direct`, `lz4-ram`, `lz4-remote`, `raw-NWAY`,
    /// `lz4-NWAY`, `raw-keepPCT`, `lz4-keepPCT`, `raw-seen`, `lz4-seen`,
    /// `raw-oldest`, `lz4-oldest`, `raw-wb`, `lz4-wb` (write-back);
    /// `None` for another row.
    fn parse(row: &str) -> Option<ZtierRow> {
        let (codec, rest) = match row.split_once('-') {
            None => (row, ""),
            Some((c, r)) => (c, r),
        };
        let codec = match codec {
            "raw" => "raw",
            "lz4" => "lz4",
            _ => return None,
        };
        let mut z = ZtierRow {
            codec,
            placement: DEFAULT_PLACEMENT.into(),
            ram: false,
            remote: false,
            keep: None,
            seen: false,
            oldest: false,
            wb: false,
        };
        match rest {
            "" => {}
            "direct" if codec == "lz4" => z.placement = "direct".into(),
            "ram" if codec == "lz4" => z.ram = true,
            "remote" if codec == "lz4" => (z.ram, z.remote) = (true, true),
            "seen" => z.seen = true,
            "oldest" => z.oldest = true,
            "wb" => z.wb = true,
            w if w.starts_with("keep") => {
                let n: u8 = w["keep".len()..].parse().ok()?;
                z.keep = Some(n);
            }
            w => {
                let n: u16 = w.strip_suffix("way")?.parse().ok()?;
                z.placement = format!("assoc:{n}:clock");
            }
        }
        Some(z)
    }
}

/// What every `ztier cache serve` says on stderr (not notes).
const ROUTINE: [&str; 4] = [" lines kept, ", "serving at ", ": stopping", "stopped after "];

/// The machine's 1-minute load average.
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(0.0)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn list(s: &str) -> Vec<String> {
    s.split(',').map(|x| x.trim().to_string()).filter(|x| !x.is_empty()).collect()
}

/// Runs `ztier bench cache`.
pub fn run(a: CacheBenchArgs) -> Result<i32> {
    for (t, p) in [("fio", "fio"), ("nbdkit", "nbdkit")] {
        need(t, p)?;
    }
    let cache_size = parse_size(&a.cache_size).context("--cache-size")?;
    let ram = match &a.ram_cache {
        Some(s) => parse_size(s).context("--ram-cache")?,
        None => cache_size / 4,
    };
    let ws: Vec<u64> = parse_size_list(&a.ws).context("--ws")?;
    if ws.contains(&0) {
        bail!("--ws: multiples of at least 1");
    }
    let (dir, own) = match &a.dir {
        Some(d) => (d.clone(), false),
        None => (std::env::temp_dir().join(format!("ztier-bench-cache-{}", std::process::id())), true),
    };
    std::fs::create_dir_all(&dir)?;
    let result = (|| -> Result<CacheBenchReport> {
        let mut rows = Vec::new();
        let max_ws = *ws.iter().max().expect("a working set");
        for data in list(&a.data) {
            let img = dir.join(format!("backing-{data}.img"));
            if !a.json {
                eprintln!("bench cache: building the {data} image ({} MiB)", (max_ws * cache_size) >> 20);
            }
            make_image(&data, &img, max_ws * cache_size, &dir)?;
            for workload in list(&a.workloads) {
                for &w in &ws {
                    for round in 1..=a.rounds {
                        for row in list(&a.rows) {
                            if !a.json {
                                eprint!("bench cache: {data} {workload} {w}x {row} (round {round}) … ");
                            }
                            let r =
                                run_row(&a, &dir, &img, &data, &workload, w, &row, round, cache_size, ram)?;
                            if !a.json {
                                eprintln!(
                                    "hit {:.3}, {:.0} IOPS, read p50 {:.0} µs, load {:.1}–{:.1}",
                                    r.hit_ratio, r.iops, r.read_p50_us, r.load[0], r.load[1]
                                );
                                for n in &r.notes {
                                    eprintln!("bench cache:   {n}");
                                }
                            }
                            rows.push(r);
                        }
                    }
                }
            }
            let _ = std::fs::remove_file(&img);
        }
        let mut ratios = Vec::new();
        // Every compressed row against the uncompressed peers; lz4 against
        // lz4-8way (the default before 32-way sets), lz4-remote against
        // lz4-ram (what the remote adds), lz4-seen against raw-seen (the
        // same admission) and lz4 (what admission adds).
        let peers = |row: &str| -> Vec<&'static str> {
            let mut p = vec!["nbdkit-cache", "raw"];
            match row {
                "lz4" => p.extend(["lz4-8way", "lz4-keep50", "lz4-oldest"]),
                "lz4-remote" => p.push("lz4-ram"),
                "lz4-seen" => p.extend(["raw-seen", "lz4"]),
                "lz4-wb" => p.extend(["raw-wb", "lz4"]),
                _ => {}
            }
            p
        };
        for peer in [
            "nbdkit-cache",
            "raw",
            "lz4-8way",
            "lz4-keep50",
            "lz4-oldest",
            "lz4-ram",
            "raw-seen",
            "lz4",
            "raw-wb",
        ] {
            for r in rows.iter().filter(|r| r.row.starts_with("lz4") && peers(&r.row).contains(&peer)) {
                if let Some(k) = rows.iter().find(|k| {
                    k.row == peer
                        && k.data == r.data
                        && k.workload == r.workload
                        && k.ws == r.ws
                        && k.round == r.round
                }) {
                    ratios.push(Ratio {
                        data: r.data.clone(),
                        workload: r.workload.clone(),
                        ws: r.ws,
                        row: r.row.clone(),
                        peer: peer.to_string(),
                        hit_ratio_x: if k.hit_ratio > 0.0 { r.hit_ratio / k.hit_ratio } else { 0.0 },
                        iops_x: if k.iops > 0.0 { r.iops / k.iops } else { 0.0 },
                        round: r.round,
                    });
                }
            }
        }
        let same =
            |x: &Row, y: &Row| x.data == y.data && x.workload == y.workload && x.ws == y.ws && x.row == y.row;
        let mut medians: Vec<Median> = Vec::new();
        for r in rows.iter().filter(|r| r.round == 1) {
            let all: Vec<&Row> = rows.iter().filter(|x| same(x, r)).collect();
            let m = |f: &dyn Fn(&Row) -> f64| median(&all.iter().map(|x| f(x)).collect::<Vec<_>>());
            medians.push(Median {
                data: r.data.clone(),
                workload: r.workload.clone(),
                ws: r.ws,
                row: r.row.clone(),
                hit_ratios: all.iter().map(|x| x.hit_ratio).collect(),
                iops: all.iter().map(|x| x.iops).collect(),
                hit_ratio: m(&|x| x.hit_ratio),
                iops_median: m(&|x| x.iops),
                read_p50_us: m(&|x| x.read_p50_us),
                read_p99_us: m(&|x| x.read_p99_us),
                cpu_pct: m(&|x| x.cpu_pct),
            });
        }
        let mut median_ratios: Vec<MedianRatio> = Vec::new();
        for r in ratios.iter().filter(|r| r.round == 1) {
            let all: Vec<&Ratio> = ratios
                .iter()
                .filter(|x| {
                    x.data == r.data
                        && x.workload == r.workload
                        && x.ws == r.ws
                        && x.row == r.row
                        && x.peer == r.peer
                })
                .collect();
            let hit_ratio_x: Vec<f64> = all.iter().map(|x| x.hit_ratio_x).collect();
            let iops_x: Vec<f64> = all.iter().map(|x| x.iops_x).collect();
            median_ratios.push(MedianRatio {
                data: r.data.clone(),
                workload: r.workload.clone(),
                ws: r.ws,
                row: r.row.clone(),
                peer: r.peer.clone(),
                hit_ratio_x_median: median(&hit_ratio_x),
                iops_x_median: median(&iops_x),
                hit_ratio_x,
                iops_x,
            });
        }
        Ok(CacheBenchReport {
            rounds: a.rounds,
            medians,
            median_ratios,
            cache_size,
            zipf: a.zipf,
            delay: a.delay.clone(),
            warmup_s: a.warmup,
            runtime_s: a.runtime,
            rows,
            ratios,
        })
    })();
    if own {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let r = result?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(0);
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "caches of {} MiB in front of nbdkit file + delay {} (fio nbd, 4K, QD{}, zipf:{}; {} s warm-up, {} s measured)",
        cache_size >> 20,
        a.delay,
        a.iodepth,
        a.zipf,
        a.warmup,
        a.runtime
    )?;
    let mut last = (String::new(), String::new());
    for x in &r.rows {
        if (x.data.clone(), x.workload.clone()) != last {
            writeln!(out, "\n{} data, {}", x.data, x.workload)?;
            writeln!(
                out,
                "{:>3} {:<13} {:>5} {:>6} {:>9} {:>9} {:>9} {:>6} {:>6} {:>9} {:>11}",
                "ws", "row", "round", "hit", "IOPS", "p50 µs", "p99 µs", "CPU%", "ratio", "RAM p50", "load"
            )?;
            last = (x.data.clone(), x.workload.clone());
        }
        let (ratio, ramp50) = x.ztier.as_ref().map_or((String::new(), String::new()), |z| {
            (
                format!("{:.2}", z.ratio),
                if z.ram_hit_p50_us > 0.0 { format!("{:.1} µs", z.ram_hit_p50_us) } else { String::new() },
            )
        });
        writeln!(
            out,
            "{:>2}x {:<13} {:>5} {:>6.3} {:>9.0} {:>9.0} {:>9.0} {:>6.1} {:>6} {:>9} {:>11}",
            x.ws,
            x.row,
            x.round,
            x.hit_ratio,
            x.iops,
            x.read_p50_us,
            x.read_p99_us,
            x.cpu_pct,
            ratio,
            ramp50,
            format!("{:.1}–{:.1}", x.load[0], x.load[1])
        )?;
        for n in &x.notes {
            writeln!(out, "    note: {n}")?;
        }
    }
    if !r.ratios.is_empty() {
        writeln!(out, "\ncompressed / uncompressed of the same size, same run")?;
        for x in &r.ratios {
            writeln!(
                out,
                "{} {} {}x {:<10} vs {:<12} (round {}): hit ratio {:.2}x, IOPS {:.2}x",
                x.data, x.workload, x.ws, x.row, x.peer, x.round, x.hit_ratio_x, x.iops_x
            )?;
        }
    }
    if r.rounds > 1 {
        writeln!(out, "\nmedians of {} rounds", r.rounds)?;
        for x in &r.medians {
            writeln!(
                out,
                "{} {} {}x {:<13} hit {:.3}, IOPS {:.0}, read p50 {:.0} µs, p99 {:.0} µs, CPU {:.1}%",
                x.data,
                x.workload,
                x.ws,
                x.row,
                x.hit_ratio,
                x.iops_median,
                x.read_p50_us,
                x.read_p99_us,
                x.cpu_pct
            )?;
        }
        for x in &r.median_ratios {
            let l = |v: &[f64]| v.iter().map(|y| format!("{y:.2}")).collect::<Vec<_>>().join(" ");
            writeln!(
                out,
                "{} {} {}x {:<10} vs {:<12}: hit ratio {} -> {:.2}x, IOPS {} -> {:.2}x",
                x.data,
                x.workload,
                x.ws,
                x.row,
                x.peer,
                l(&x.hit_ratio_x),
                x.hit_ratio_x_median,
                l(&x.iops_x),
                x.iops_x_median
            )?;
        }
    }
    Ok(0)
}
