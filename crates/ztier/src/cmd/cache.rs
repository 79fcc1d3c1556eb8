//! `ztier cache`: a compressed cache in front of slow storage (create,
//! serve over NBD, stats).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use ztier_blk::backing::{Backing, FileBacking};
use ztier_blk::client::ClientOptions;
use ztier_blk::live;
use ztier_blk::server::{self, ServeConfig, ServerStats};
use ztier_cache::backend::open_backing;
use ztier_cache::cache::{self, Admission, CacheOptions, Mode, Remote};
use ztier_cache::format::{Geometry, Placement, Policy, SbState, MAX_WAYS};
use ztier_cache::pressure::PressureConfig;
use ztier_cache::report::CacheReport;
use ztier_cache::Cache;
use ztier_codec::CodecId;
use ztier_remote::RemoteTier;

use super::serving;
use crate::remote_args::RemoteArgs;
use crate::units::parse_size;

/// `ztier cache` subcommands.
#[derive(Subcommand, Debug)]
pub enum CacheCommand {
    /// Make a cache device: a file (allocated now, in full) or a block device.
    ///
    /// Blocks are kept compressed in segments written whole; a directory
    /// in RAM (6 bytes per line) says where each cached block is. Lines
    /// are sized for `--lines-per-block` times the blocks the segments
    /// hold uncompressed (2: sized for 2x compression).
    Create(CreateArgs),
    /// Serve a backing through the cache over NBD until SIGINT/SIGTERM,
    /// then stop cleanly (the cache is warm on the next start).
    ///
    /// The backing is a file, a block device, or an NBD export
    /// (`nbd://HOST:PORT/NAME`, `nbd+unix:///NAME?socket=PATH`). Reads are
    /// served from the RAM cache, the cache device, or the backing (and
    /// then cached in the background); writes go to the backing before
    /// they are acknowledged, never only to a cache. After a crash the
    /// cache keeps every line that checks out and that no later write
    /// made stale.
    Serve(Box<ServeArgs>),
    /// Statistics of a cache: of a served one, the server answers (its
    /// control socket) — hits and misses per level, fills, bypasses,
    /// evictions, compression, metadata bytes, latencies, the RAM
    /// cache's budget; of a stopped one, what its device holds.
    Stats(StatsArgs),
}

/// Arguments of `ztier cache create`.
#[derive(Args, Debug)]
pub struct CreateArgs {
    /// Cache device: a file to create, or a block device.
    #[arg(value_name = "CACHE")]
    pub cache: PathBuf,
    /// Size (K/M/G/T); a block device's own size by default.
    #[arg(long, value_name = "SIZE")]
    pub size: Option<String>,
    /// Placement: `direct` (FlaZ: one line per block) or
    /// `assoc[:WAYS[:lru|clock]]` (sets of WAYS lines: 2, 4, 8, or 16, 32,
    /// 64 with clock). Wide sets let a compressed cache fill its lines.
    #[arg(long, default_value = DEFAULT_PLACEMENT, value_name = "P")]
    pub placement: String,
    /// Codec of the cached blocks (`raw`: none, the uncompressed peer).
    #[arg(long, default_value = "lz4", value_name = "C")]
    pub codec: CodecId,
    /// Segment size (a power of two, 16K to 16M).
    #[arg(long, default_value = "128K", value_name = "SIZE")]
    pub segment: String,
    /// Directory lines per 4 KiB of segment space (the compression ratio
    /// the directory is sized for).
    #[arg(long, default_value_t = 2.0, value_name = "F")]
    pub lines_per_block: f64,
    /// Overwrite an existing cache file (its contents are lost).
    #[arg(long)]
    pub force: bool,
}

/// Arguments of `ztier cache serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// The slow storage: a file, a block device, or an NBD URI.
    #[arg(long, value_name = "B")]
    pub backing: String,
    /// The cache device (made with `ztier cache create`).
    #[arg(long, value_name = "CACHE")]
    pub cache: PathBuf,
    /// Also keep clean blocks compressed in RAM, up to SIZE (everything
    /// counted; less while the machine needs memory).
    #[arg(long, value_name = "SIZE")]
    pub ram_cache: Option<String>,
    /// Below the RAM cache, keep clean blocks (compressed, sealed) in Redis
    /// too: `redis://[USER@]HOST:PORT[,HOST:PORT...]` (rediss:// for TLS), a
    /// server or any nodes of a cluster. Ephemeral: a value the servers
    /// lose, or a server that does not answer within --remote-timeout, is
    /// a miss served by the SSD cache or the backing. The password comes
    /// from ZTIER_REMOTE_PASSWORD or --remote-auth, never from the URL.
    #[arg(long, value_name = "URLS", requires = "ram_cache")]
    pub remote: Option<String>,
    /// A file (mode 600) whose first line is PASSWORD or USER PASSWORD.
    #[arg(long, value_name = "FILE", requires = "remote")]
    pub remote_auth: Option<PathBuf>,
    /// on (the default): values encrypted and authenticated (AES-256-GCM);
    /// off: only authenticated (a keyed BLAKE3 MAC).
    #[arg(long, default_value = "on", value_parser = ["on", "off"], requires = "remote")]
    pub remote_encrypt: String,
    /// A PEM file of the certificate authorities to trust for rediss://.
    #[arg(long, value_name = "FILE", requires = "remote")]
    pub remote_tls_ca: Option<PathBuf>,
    /// Milliseconds a read waits for the remote before the backing answers it.
    #[arg(long, default_value_t = 200, value_name = "MS", requires = "remote")]
    pub remote_timeout: u64,
    /// writethrough: written blocks are cached once the backing has them;
    /// writearound: written blocks are only dropped from the caches;
    /// writeback: written blocks go to the SSD cache only (dirty) and to
    /// the backing behind — a FLUSH or FUA makes them durable on the cache
    /// device, not on the backing; losing the cache device loses them
    /// (see docs/cache.md).
    #[arg(long, default_value = "writethrough", value_name = "M")]
    pub mode: Mode,
    /// Write-back: threads copying dirty blocks to the backing (blocks in
    /// flight to it at most).
    #[arg(long, default_value_t = ztier_cache::cache::WRITEBACK_THREADS, value_name = "N")]
    pub writeback_threads: usize,
    #[command(flatten)]
    pub at: serving::ListenArgs,
    /// Refuse writes.
    #[arg(long)]
    pub readonly: bool,
    /// Worker threads per connection (each waits on the backing in turn).
    #[arg(long, default_value_t = 32, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: u16,
    /// Export name (the empty name selects it too).
    #[arg(long, default_value = "ztier", value_name = "NAME")]
    pub name: String,
    /// Sequential streams longer than this bypass the cache (0: never).
    #[arg(long, default_value = "4M", value_name = "SIZE")]
    pub sequential_cutoff: String,
    /// Sync the invalidation journal before each write reaches the
    /// backing: the cache then stays warm across a power loss too (else
    /// it restarts cold after a reboot that followed a crash).
    #[arg(long)]
    pub journal_sync: bool,
    /// Drop everything the cache holds and bind it to this backing.
    #[arg(long)]
    pub discard: bool,
    /// Connections to an NBD backing (if it allows several).
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub backing_connections: usize,
    /// Seconds before a backing request is given up (its connection is
    /// dropped and reopened).
    #[arg(long, default_value_t = 60, value_name = "S")]
    pub backing_timeout: u64,
    /// Threads that compress and insert lines.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub fillers: usize,
    /// Recycling a segment keeps all its lines when they fill at most
    /// PCT% of it (50–95; 50 copies only referenced lines): higher keeps
    /// more blocks under writes, for more copies per fill.
    #[arg(long, default_value_t = ztier_cache::cache::RECYCLE_KEEP, value_name = "PCT",
          value_parser = clap::value_parser!(u8).range(50..=95))]
    pub recycle_keep: u8,
    /// Which segment recycling takes: cost-benefit (most dead space for
    /// its age, as LFS's cleaner), greedy (most dead space), or oldest.
    #[arg(long, default_value = "cost-benefit", value_name = "P")]
    pub recycle_pick: ztier_cache::Pick,
    /// Which blocks the full SSD cache takes in: all, or only those asked
    /// for before, recently (seen; 4 bits of RAM per line).
    #[arg(long, default_value = "all", value_name = "A")]
    pub admission: Admission,
    /// Write the final statistics (as `cache stats --json` of a served
    /// cache gives them) to FILE at exit.
    #[arg(long, value_name = "FILE")]
    pub stats: Option<PathBuf>,
}

/// Arguments of `ztier cache stats`.
#[derive(Args, Debug)]
pub struct StatsArgs {
    /// The cache device.
    #[arg(value_name = "CACHE")]
    pub cache: PathBuf,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `ztier cache create`'s placement: 32-way sets. A compressed cache's
/// directory is sized for 2x compression and fills ~95% of its lines;
/// in 8-way sets that many lines overflow sets long before the segments
/// are full (docs/measurements/2026-12-06-cache-ways.md).
pub const DEFAULT_PLACEMENT: &str = "assoc:32:clock";

/// Parses `direct` or `assoc[:WAYS[:lru|clock]]`.
pub fn parse_placement(s: &str) -> Result<(Placement, u16, Policy)> {
    let mut it = s.split(':');
    match it.next() {
        Some("direct") if it.next().is_none() => Ok((Placement::Direct, 1, Policy::Clock)),
        Some("assoc") => {
            let ways: u16 = match it.next() {
                None => 8,
                Some(w) => {
                    w.parse().with_context(|| format!("--placement {s}: ways '{w}' is not a number"))?
                }
            };
            let policy = match it.next() {
                None | Some("clock") => Policy::Clock,
                Some("lru") => Policy::Lru,
                Some(p) => bail!("--placement {s}: policy '{p}' (lru or clock)"),
            };
            if it.next().is_some()
                || !(2..=MAX_WAYS).contains(&ways)
                || !ways.is_power_of_two()
                || (ways > 8 && policy == Policy::Lru)
            {
                bail!("--placement {s}: assoc:WAYS[:lru|clock] with WAYS 2, 4, 8 (or 16, 32, 64 with clock)");
            }
            Ok((Placement::Assoc, ways, policy))
        }
        _ => bail!("--placement {s}: direct, or assoc[:WAYS[:lru|clock]]"),
    }
}

fn lock(f: &File, path: &Path) -> Result<()> {
    // SAFETY: flock on a file descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        bail!("{} is in use (a `ztier cache serve` has it open?)", path.display());
    }
    Ok(())
}

fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn create(a: CreateArgs) -> Result<i32> {
    let (placement, ways, policy) = parse_placement(&a.placement)?;
    let segment = parse_size(&a.segment).context("--segment")?;
    if !segment.is_power_of_two() || !(16 << 10..=16 << 20).contains(&segment) {
        bail!("--segment {}: a power of two from 16K to 16M", a.segment);
    }
    if !(0.25..=16.0).contains(&a.lines_per_block) {
        bail!("--lines-per-block {}: from 0.25 to 16", a.lines_per_block);
    }
    use std::os::unix::fs::FileTypeExt;
    let is_dev = std::fs::metadata(&a.cache).map(|m| m.file_type().is_block_device()).unwrap_or(false);
    let (file, size, made) = if is_dev {
        let mut f = OpenOptions::new().read(true).write(true).open(&a.cache)?;
        use std::io::Seek;
        let dev_size = f.seek(std::io::SeekFrom::End(0))?;
        let size = match &a.size {
            Some(s) => parse_size(s)?,
            None => dev_size,
        };
        if size > dev_size {
            bail!("--size {} is larger than {} ({dev_size} bytes)", size, a.cache.display());
        }
        (f, size, false)
    } else {
        let size = parse_size(a.size.as_deref().context("--size is needed for a file")?).context("--size")?;
        if a.cache.exists() && !a.force {
            bail!("{} exists: give --force to overwrite it (its contents are lost)", a.cache.display());
        }
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(a.force)
            .open(&a.cache)
            .with_context(|| format!("creating {}", a.cache.display()))?;
        (f, size, true)
    };
    lock(&file, &a.cache)?;
    let geo = Geometry {
        size,
        segment_size: segment as u32,
        lines_per_block: a.lines_per_block,
        placement,
        ways,
        policy,
        codec: a.codec as u8,
        journal_size: None,
    };
    let fail = |e: anyhow::Error| {
        if made {
            let _ = std::fs::remove_file(&a.cache);
        }
        Err(e)
    };
    let sb = match geo.superblock(cache::random_u64(), now_unix()) {
        Ok(sb) => sb,
        Err(e) => return fail(anyhow::anyhow!("--size {}: {e}", size)),
    };
    if made {
        // The whole file now: the cache never runs out of room later.
        // SAFETY: fallocate on a descriptor we own.
        let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, sb.device_size() as libc::off_t) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            return fail(anyhow::anyhow!(
                "allocating {} bytes for {}: {e}",
                sb.device_size(),
                a.cache.display()
            ));
        }
    }
    let dev = FileBacking::new(file);
    if let Err(e) = cache::create(&dev, &sb) {
        return fail(anyhow::anyhow!("writing the cache's superblock: {e}"));
    }
    eprintln!(
        "ztier cache: created {}: {} bytes, {} segments of {}, {} lines ({}{}), codec {}, {} bytes of RAM for its directory",
        a.cache.display(),
        sb.device_size(),
        sb.segments,
        sb.segment_size,
        sb.lines,
        match placement {
            Placement::Direct => "direct".to_string(),
            Placement::Assoc => format!("{ways}-way"),
        },
        match (placement, policy) {
            (Placement::Direct, _) => "",
            (_, Policy::Lru) => ", lru",
            (_, Policy::Clock) => ", clock",
        },
        a.codec.name(),
        sb.lines * 6 + if ways > 1 { sb.lines / ways as u64 } else { 0 }
    );
    Ok(0)
}

/// The control socket name of a server of `cache`.
fn control(cache: &Path) -> Result<String> {
    live::control_name("cache", cache).with_context(|| format!("opening {}", cache.display()))
}

/// The remote RAM cache of `--remote`: durability none (ephemeral), no
/// local fallback, reads waiting at most --remote-timeout.
fn remote_tier(a: &ServeArgs) -> Result<Option<Remote>> {
    let r = RemoteArgs {
        remote: a.remote.clone(),
        remote_auth: a.remote_auth.clone(),
        remote_encrypt: a.remote_encrypt.clone(),
        remote_durability: "none".into(),
        remote_tls_ca: a.remote_tls_ca.clone(),
    };
    let Some(mut cfg) = r.config()? else { return Ok(None) };
    let wait = Duration::from_millis(a.remote_timeout.max(1));
    cfg.timeout = wait;
    cfg.get_deadline = wait;
    let tier = RemoteTier::connect(cfg, None).context("--remote")?;
    Ok(Some(Remote(Arc::new(tier))))
}

fn serve(a: ServeArgs) -> Result<i32> {
    let stop = Arc::new(AtomicBool::new(false));
    serving::stop_on_signals("cache", stop.clone());
    let metrics = a.at.metrics_addr()?;
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&a.cache)
        .with_context(|| format!("opening the cache {}", a.cache.display()))?;
    lock(&f, &a.cache)?;
    let dev: Arc<dyn Backing> = Arc::new(FileBacking::new(f));
    let copts = ClientOptions {
        connections: a.backing_connections.max(1),
        timeout: Some(Duration::from_secs(a.backing_timeout.max(1))),
        ..ClientOptions::default()
    };
    let backing = open_backing(&a.backing, a.readonly, copts)
        .with_context(|| format!("opening the backing {}", a.backing))?;
    let backing: Arc<dyn ztier_cache::backend::Backend> = Arc::from(backing);
    let ram = a.ram_cache.as_deref().map(parse_size).transpose().context("--ram-cache")?.unwrap_or(0);
    let opts = CacheOptions {
        mode: a.mode,
        ram_cache: ram,
        sequential_cutoff: parse_size(&a.sequential_cutoff).context("--sequential-cutoff")?,
        journal_sync: a.journal_sync,
        read_only: a.readonly,
        discard: a.discard,
        fillers: a.fillers.max(1),
        recycle_keep: a.recycle_keep,
        recycle_pick: a.recycle_pick,
        admission: a.admission,
        writeback_threads: a.writeback_threads.max(1),
        pressure: (ram > 0).then(PressureConfig::default),
        remote: remote_tier(&a)?,
        ..CacheOptions::default()
    };
    let cache = Arc::new(
        Cache::open(dev, backing.clone(), opts)
            .with_context(|| format!("opening the cache {}", a.cache.display()))?,
    );
    let r = cache.recovery();
    eprintln!(
        "ztier cache: {} in front of {} ({} bytes): {}{} — {} lines kept, {} dropped as stale, in {:.2} s",
        a.cache.display(),
        backing.describe(),
        cache.size(),
        r.kind,
        r.cold_reason.as_ref().map(|w| format!(" ({w})")).unwrap_or_default(),
        r.lines_loaded,
        r.lines_invalidated,
        r.seconds
    );
    if r.lines_dirty + r.dirty_written_back > 0 {
        eprintln!(
            "ztier cache: {} dirty blocks found (write-back): {} queued to be written back, {} written back at the start",
            r.lines_dirty + r.dirty_written_back,
            r.lines_dirty,
            r.dirty_written_back
        );
    }
    let (listener, where_, unbind) = a.at.bind("cache", &a.cache, &a.name)?;
    let cfg = ServeConfig {
        name: a.name.clone(),
        description: format!("ztier cache {} in front of {}", a.cache.display(), a.backing),
        read_only: a.readonly,
        threads: a.threads as usize,
    };
    let stats = Arc::new(ServerStats::default());
    let report = Arc::new(CacheReport {
        cache: cache.clone(),
        server: stats.clone(),
        path: a.cache.display().to_string(),
    });
    let ctl = live::serve_control(&control(&a.cache)?, report.clone(), stop.clone())
        .context("starting the control socket (`ztier cache stats` of this cache)")?;
    let metrics = match metrics {
        Some(sa) => Some(
            live::serve_metrics(sa, a.at.allow_remote, report, stop.clone())
                .with_context(|| format!("--metrics {sa}"))?,
        ),
        None => None,
    };
    eprintln!(
        "ztier cache: serving at {where_}{} ({} threads per connection)",
        metrics.as_ref().map(|(b, _)| format!(", metrics at http://{b}/metrics")).unwrap_or_default(),
        cfg.threads
    );
    let served = server::serve(cache.clone(), listener, cfg, stop.clone(), stats.clone());
    stop.store(true, Ordering::Release);
    let _ = ctl.join();
    if let Some((_, h)) = metrics {
        let _ = h.join();
    }
    unbind.remove();
    cache.close().context("stopping the cache cleanly")?;
    served.context("serving")?;
    let s = cache.stats();
    if let Some(p) = &a.stats {
        std::fs::write(p, serde_json::to_string(&s)? + "\n")
            .with_context(|| format!("writing {}", p.display()))?;
    }
    eprintln!(
        "ztier cache: stopped after {} requests: hit ratio {:.3} ({} RAM, {} SSD hits, {} misses), {} lines cached",
        stats.requests.load(Ordering::Relaxed),
        s.hit_ratio,
        s.ram_hits,
        s.ssd_hits,
        s.misses,
        s.lines_used
    );
    Ok(0)
}

fn print_live(v: &serde_json::Value) {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
    let srv = &v["server"];
    println!(
        "served         by pid {} for {:.0} s, {} connections open, in front of {} ({} bytes)",
        n("pid"),
        f("uptime_s"),
        srv["connections_open"].as_u64().unwrap_or(0),
        v["backing"].as_str().unwrap_or("?"),
        n("backing_size")
    );
    println!(
        "cache          {}, {} ways ({}), codec {}, {} of {} lines used, {} mode",
        v["placement"].as_str().unwrap_or("?"),
        n("ways"),
        v["policy"].as_str().unwrap_or("?"),
        v["codec"].as_str().unwrap_or("?"),
        n("lines_used"),
        n("lines"),
        v["mode"].as_str().unwrap_or("?")
    );
    println!(
        "reads          {} blocks: {} RAM hits, {} SSD hits, {} misses (hit ratio {:.3})",
        n("read_blocks"),
        n("ram_hits"),
        n("ssd_hits"),
        n("misses"),
        f("hit_ratio")
    );
    println!(
        "fills          {} SSD ({} write-through), {} RAM; dropped {} race, {} queue, {} space",
        n("ssd_fills"),
        n("write_through_fills"),
        n("ram_fills"),
        n("fills_dropped_race"),
        n("fills_dropped_queue"),
        n("fills_dropped_space")
    );
    println!(
        "bypassed       {} read, {} written blocks (sequential streams)",
        n("bypassed_read_blocks"),
        n("bypassed_write_blocks")
    );
    println!(
        "evictions      {} invalidated, {} conflict, {} capacity; {} reinserted",
        n("invalidated_lines"),
        n("conflict_evictions"),
        n("capacity_evictions"),
        n("reinserted")
    );
    println!(
        "space          {} bytes stored, ratio {:.2}, {} bytes saved",
        n("stored_bytes"),
        f("ratio"),
        n("bytes_saved")
    );
    println!(
        "metadata       {} bytes of RAM: {:.2} per line, {:.2} per cached block",
        n("metadata_bytes"),
        f("metadata_bytes_per_line"),
        f("metadata_bytes_per_cached_block")
    );
    let lat = &v["latency"];
    let l = |k: &str, q: &str| lat[k][q].as_f64().unwrap_or(0.0);
    println!(
        "latency        RAM hit p50 {:.1} µs, SSD hit p50 {:.1} µs, miss p50 {:.0} µs (p99 {:.0}), write p50 {:.0} µs",
        l("ram_hit", "p50_us"),
        l("ssd_hit", "p50_us"),
        l("miss", "p50_us"),
        l("miss", "p99_us"),
        l("write", "p50_us")
    );
    if let Some(r) = v["ram"].as_object() {
        let g = |k: &str| r.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
        println!(
            "RAM cache      {} of {} bytes budget ({} asked), {} blocks",
            g("memory_used"),
            g("budget_bytes"),
            g("configured_bytes"),
            g("blocks")
        );
    }
    if let Some(r) = v["remote"].as_object() {
        let g = |k: &str| r.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
        println!(
            "remote cache   {}: {} hits, {} puts ({} skipped), {} errors, {} blocks; hit p50 {:.1} µs",
            r.get("name").and_then(|x| x.as_str()).unwrap_or("?"),
            g("hits"),
            g("puts"),
            g("skipped"),
            g("errors"),
            g("entries"),
            l("remote_hit", "p50_us")
        );
    }
    println!(
        "errors         {} requests, {} verify, {} cache read, {} cache write, {} backing{}",
        n("errors"),
        n("verify_failures"),
        n("cache_read_errors"),
        n("cache_write_errors"),
        n("backing_errors"),
        v["degraded"].as_str().map(|d| format!("; degraded: {d}")).unwrap_or_default()
    );
}

fn stats(a: StatsArgs) -> Result<i32> {
    let name = control(&a.cache)?;
    if let Some(v) = live::query(&name, "stats", Duration::from_secs(5))
        .with_context(|| format!("asking the server of {}", a.cache.display()))?
    {
        if a.json {
            println!("{v}");
        } else {
            print_live(&v);
        }
        return Ok(0);
    }
    let f = OpenOptions::new()
        .read(true)
        .open(&a.cache)
        .with_context(|| format!("opening the cache {}", a.cache.display()))?;
    let dev = FileBacking::new(f);
    let s = ztier_cache::cache::inspect(&dev).with_context(|| format!("reading {}", a.cache.display()))?;
    if a.json {
        println!("{}", serde_json::to_string(&s)?);
        return Ok(0);
    }
    println!(
        "cache          {} bytes, {} segments of {} ({} in use)",
        s.device_bytes, s.segments, s.segment_size, s.segments_valid
    );
    println!(
        "directory      {} lines, {} ({} ways{}), {} bytes of RAM when served",
        s.lines,
        s.placement,
        s.ways,
        if s.ways > 1 { format!(", {}", s.policy) } else { String::new() },
        s.directory_bytes
    );
    println!(
        "state          {}{}",
        s.state,
        if s.state == SbState::Clean { " (stopped cleanly: warm on restart)" } else { "" }
    );
    println!(
        "holds          {} items of {} bytes stored (ratio {:.2}), codec {}",
        s.items, s.stored_bytes, s.ratio, s.codec
    );
    println!("backing        {} bytes (0: not bound yet)", s.backing_size);
    Ok(0)
}

/// Runs a `cache` subcommand.
pub fn run(c: CacheCommand) -> Result<i32> {
    match c {
        CacheCommand::Create(a) => create(a),
        CacheCommand::Serve(a) => serve(*a),
        CacheCommand::Stats(a) => stats(a),
    }
}
