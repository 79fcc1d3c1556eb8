//! `ztier blk`: the compressed block device (create, serve over NBD,
//! check, stats).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use ztier_blk::backing::FileBacking;
use ztier_blk::engine::{CreateOptions, Engine};
use ztier_blk::live;
use ztier_blk::server::{self, Live, ServeConfig, ServerStats};
use ztier_codec::CodecId;

use super::serving;
use crate::units::parse_size;

/// `ztier blk` subcommands.
#[derive(Subcommand, Debug)]
pub enum BlkCommand {
    /// Create an empty compressed image.
    ///
    /// The image is a sparse file: superblocks, two checkpoint areas for
    /// the logical-to-physical table, then fixed-size extents holding
    /// compressed blocks. By default it is provisioned (every block could
    /// be stored raw, so no write ever fails for space); `--physical`
    /// makes it thin (compression must make the data fit; writes can fail
    /// with ENOSPC).
    Create(CreateArgs),
    /// Serve an image over NBD (fixed newstyle, structured replies,
    /// base:allocation), until SIGINT/SIGTERM; then checkpoint and exit.
    ///
    /// Clients: `qemu-img`/`qemu-io` with `nbd+unix:///?socket=PATH`,
    /// `nbdcopy`, `nbdinfo`, fio's nbd engine, nbdfuse.
    Serve(ServeArgs),
    /// Audit an image: recover it, then read every block back (checksums
    /// and decompression) and cross-check the extent accounting. Exit 0
    /// only if clean.
    ///
    /// Of a served image, the server reads every block back while it
    /// serves (the accounting and recovery audit need the image stopped,
    /// and the output says so); exit 0 if every block reads back.
    Check(ImageArgs),
    /// Print statistics of an image: sizes, compression ratio, extents
    /// used and free.
    ///
    /// Of a served image the server answers (its control socket), adding
    /// live counters: requests, bytes, errors, latency p50/p99, cleaner
    /// and checkpoint activity.
    Stats(StatsArgs),
}

/// Arguments of `ztier blk create`.
#[derive(Args, Debug)]
pub struct CreateArgs {
    /// Image file to create (must not exist: an existing file is never
    /// overwritten).
    #[arg(value_name = "IMAGE")]
    pub image: PathBuf,
    /// Logical size (K/M/G/T suffixes).
    #[arg(long, value_name = "SIZE")]
    pub size: String,
    /// Codec for blocks.
    #[arg(long, default_value = "lz4", value_name = "C")]
    pub codec: CodecId,
    /// Extent size: a power of two up to 64K holding at least one raw block.
    #[arg(long, default_value = "32K", value_name = "SIZE")]
    pub extent: String,
    /// Logical block size: a power of two from 512 to 32K.
    #[arg(long, default_value = "4K", value_name = "SIZE")]
    pub block: String,
    /// Physical bytes for extents (thin image); default: provisioned.
    #[arg(long, value_name = "SIZE")]
    pub physical: Option<String>,
}

/// Arguments of `ztier blk serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Image to serve.
    #[arg(value_name = "IMAGE")]
    pub image: PathBuf,
    #[command(flatten)]
    pub at: serving::ListenArgs,
    /// Refuse writes.
    #[arg(long)]
    pub readonly: bool,
    /// Worker threads per connection (default: CPUs).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
    /// Export name (the empty name selects it too).
    #[arg(long, default_value = "ztier", value_name = "NAME")]
    pub name: String,
}

/// An image argument.
#[derive(Args, Debug)]
pub struct ImageArgs {
    /// The image.
    #[arg(value_name = "IMAGE")]
    pub image: PathBuf,
}

/// Arguments of `ztier blk stats`.
#[derive(Args, Debug)]
pub struct StatsArgs {
    /// The image.
    #[arg(value_name = "IMAGE")]
    pub image: PathBuf,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Takes an advisory lock on the image (one server or audit at a time).
fn lock(f: &File, path: &Path, exclusive: bool) -> Result<()> {
    let op = if exclusive { libc::LOCK_EX } else { libc::LOCK_SH } | libc::LOCK_NB;
    // SAFETY: flock on a file descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), op) } != 0 {
        bail!("{} is in use (a `ztier blk serve` has it open?)", path.display());
    }
    Ok(())
}

fn open_engine(path: &Path, read_only: bool) -> Result<Engine> {
    let f = OpenOptions::new()
        .read(true)
        .write(!read_only)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    lock(&f, path, !read_only)?;
    Engine::open(Box::new(FileBacking::new(f)), read_only)
        .with_context(|| format!("opening image {}", path.display()))
}

/// The control socket name of a server of `image`.
fn control(image: &Path) -> Result<String> {
    live::control_name("blk", image).with_context(|| format!("opening {}", image.display()))
}

/// Asks the server of `image`, if one runs, `cmd`.
fn ask_server(image: &Path, cmd: &str, timeout: Duration) -> Result<Option<serde_json::Value>> {
    let name = control(image)?;
    live::query(&name, cmd, timeout).with_context(|| format!("asking the server of {}", image.display()))
}

fn create_options(a: &CreateArgs) -> Result<CreateOptions> {
    let small = |what: &str, s: &str| -> Result<u32> {
        let v = parse_size(s).with_context(|| format!("--{what}"))?;
        u32::try_from(v)
            .map_err(|_| anyhow::anyhow!("--{what} {s}: {v} bytes does not fit (at most 64K here)"))
    };
    let o = CreateOptions {
        logical_size: parse_size(&a.size).context("--size")?,
        block_size: small("block", &a.block)?,
        extent_size: small("extent", &a.extent)?,
        codec: a.codec,
        physical: a.physical.as_deref().map(parse_size).transpose().context("--physical")?,
    };
    if !o.block_size.is_power_of_two() || !(512..=32768).contains(&o.block_size) {
        bail!("--block {}: a power of two from 512 to 32K", a.block);
    }
    if !o.extent_size.is_power_of_two() || o.extent_size > 65536 || o.extent_size < 2 * o.block_size {
        bail!("--extent {}: a power of two up to 64K, at least two blocks (--block {})", a.extent, a.block);
    }
    if o.logical_size == 0 || o.logical_size % o.block_size as u64 != 0 {
        bail!("--size {}: a positive multiple of the block size ({})", a.size, o.block_size);
    }
    if o.physical == Some(0) {
        bail!("--physical 0: no room for any extent");
    }
    Ok(o)
}

fn print_stats(s: &serde_json::Value) {
    let n = |k: &str| s[k].as_u64().unwrap_or(0);
    println!("logical        {} bytes ({} B blocks)", n("logical_size"), n("block_size"));
    println!(
        "data           {} blocks, {} zero blocks, {} same-filled blocks",
        n("data_blocks"),
        n("zero_blocks"),
        n("same_blocks")
    );
    println!(
        "stored         {} bytes (ratio {:.3})",
        n("data_stored_bytes"),
        s["ratio"].as_f64().unwrap_or(0.0)
    );
    println!(
        "extents        {} of {} used ({} B each, {} raw), {} free",
        n("used_extents"),
        n("extents_total"),
        n("extent_size"),
        n("raw_extents"),
        n("extents_free")
    );
    println!(
        "physical       {} bytes; file allocated {} bytes",
        n("physical_bytes_used"),
        n("file_allocated_bytes")
    );
    println!(
        "codec          {}{}",
        s["codec"].as_str().unwrap_or("?"),
        if s["provisioned"].as_bool().unwrap_or(false) { ", provisioned" } else { ", thin" }
    );
    if s["served"].as_bool() == Some(true) {
        let f = |k: &str| s[k].as_f64().unwrap_or(0.0);
        println!(
            "served         by pid {} for {:.0} s, {} connections open",
            n("pid"),
            f("uptime_s"),
            n("connections_open")
        );
        println!(
            "requests       {} ({} read, {} write, {} flush, {} other), {} errors",
            n("requests"),
            n("read_requests"),
            n("write_requests"),
            n("flush_requests"),
            n("other_requests"),
            n("errors")
        );
        println!("bytes          {} read, {} written", n("bytes_read"), n("bytes_written"));
        println!(
            "latency        p50 {:.0} µs, p99 {:.0} µs (read p99 {:.0}, write p99 {:.0}, flush p99 {:.0})",
            f("latency_p50_us"),
            f("latency_p99_us"),
            f("read_latency_p99_us"),
            f("write_latency_p99_us"),
            f("flush_latency_p99_us")
        );
        println!(
            "checkpoints    {} ({} pages written, longest {:.1} ms)",
            n("checkpoints"),
            n("checkpoint_pages_written"),
            f("checkpoint_max_us") / 1000.0
        );
        println!(
            "cleaner        {} runs, {} extents freed, {} blocks moved, {:.1} s",
            n("cleaner_runs"),
            n("extents_cleaned"),
            n("blocks_relocated"),
            f("cleaner_us") / 1e6
        );
    }
}

/// Runs a `blk` subcommand.
pub fn run(c: BlkCommand) -> Result<i32> {
    match c {
        BlkCommand::Create(a) => {
            let o = create_options(&a)?;
            if a.image.exists() {
                bail!(
                    "{} exists: `blk create` never overwrites a file; remove it or name another",
                    a.image.display()
                );
            }
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&a.image)
                .with_context(|| format!("creating {}", a.image.display()))?;
            match Engine::create(Box::new(FileBacking::new(f)), &o) {
                Ok(e) => {
                    let g = e.geometry();
                    eprintln!(
                        "ztier blk: created {}: {} bytes logical, {} extents of {} ({}), codec {}",
                        a.image.display(),
                        g.logical_size,
                        g.extents,
                        g.extent_size,
                        if g.provisioned { "provisioned" } else { "thin" },
                        a.codec.name()
                    );
                    Ok(0)
                }
                Err(e) => {
                    let _ = std::fs::remove_file(&a.image);
                    Err(e).context("creating the image")
                }
            }
        }
        BlkCommand::Serve(a) => serve(a),
        BlkCommand::Check(a) => {
            if let Some(v) = ask_server(&a.image, "verify", Duration::from_secs(24 * 3600))? {
                let problems: Vec<String> = v["problems"]
                    .as_array()
                    .map(|p| p.iter().filter_map(|x| x.as_str().map(String::from)).collect())
                    .unwrap_or_default();
                let why = "the extent accounting and recovery audit need the image not served: stop the server and check again";
                for p in &problems {
                    println!("{}: {p}", a.image.display());
                }
                if problems.is_empty() {
                    println!(
                        "{}: served: every mapped block reads back ({} data blocks, checked online); {why}",
                        a.image.display(),
                        v["data_blocks"]
                    );
                    return Ok(0);
                }
                println!(
                    "{}: served: {} damaged blocks (checked online); {why}",
                    a.image.display(),
                    problems.len()
                );
                return Ok(1);
            }
            let e = open_engine(&a.image, true)?;
            let problems = e.check()?;
            if problems.is_empty() {
                let s = e.stats();
                println!(
                    "{}: clean ({} data blocks, {} zero blocks, {} same-filled blocks, {} extents used of {})",
                    a.image.display(),
                    s.data_blocks,
                    s.zero_blocks,
                    s.same_blocks,
                    s.used_extents,
                    s.extents_total
                );
                Ok(0)
            } else {
                for p in &problems {
                    println!("{}: {p}", a.image.display());
                }
                println!("{}: {} problems", a.image.display(), problems.len());
                Ok(1)
            }
        }
        BlkCommand::Stats(a) => {
            let v = match ask_server(&a.image, "stats", Duration::from_secs(30))? {
                Some(v) => v,
                None => serde_json::to_value(open_engine(&a.image, true)?.stats())?,
            };
            if a.json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print_stats(&v);
            }
            Ok(0)
        }
    }
}

fn serve(a: ServeArgs) -> Result<i32> {
    let stop = Arc::new(AtomicBool::new(false));
    serving::stop_on_signals("blk", stop.clone());
    let engine = Arc::new(open_engine(&a.image, a.readonly)?);
    let metrics = a.at.metrics_addr()?;
    let (listener, where_, unbind) = a.at.bind("blk", &a.image, &a.name)?;
    let cfg = ServeConfig {
        name: a.name.clone(),
        description: format!("ztier compressed image {}", a.image.display()),
        read_only: a.readonly,
        threads: a
            .threads
            .map_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()), |t| t as usize),
    };
    let stats = Arc::new(ServerStats::default());
    let report = Arc::new(Live {
        engine: engine.clone(),
        stats: stats.clone(),
        image: a.image.display().to_string(),
        started: std::time::Instant::now(),
    });
    let ctl = live::serve_control(&control(&a.image)?, report.clone(), stop.clone())
        .context("starting the control socket (`ztier blk stats` of this image)")?;
    let metrics = match metrics {
        Some(sa) => {
            let (bound, h) = live::serve_metrics(sa, a.at.allow_remote, report, stop.clone())
                .with_context(|| format!("--metrics {sa}"))?;
            Some((bound, h))
        }
        None => None,
    };
    eprintln!(
        "ztier blk: serving {} at {where_}{} ({} threads per connection)",
        a.image.display(),
        metrics.as_ref().map(|(b, _)| format!(", metrics at http://{b}/metrics")).unwrap_or_default(),
        cfg.threads
    );
    let r = server::serve(engine.clone(), listener, cfg, stop.clone(), stats.clone());
    stop.store(true, Ordering::Release);
    let _ = ctl.join();
    if let Some((_, h)) = metrics {
        let _ = h.join();
    }
    unbind.remove();
    engine.close().context("checkpointing the image at shutdown")?;
    r.context("serving")?;
    eprintln!(
        "ztier blk: stopped after {} connections, {} requests ({} errors, {} protocol violations)",
        stats.connections.load(Ordering::Relaxed),
        stats.requests.load(Ordering::Relaxed),
        stats.errors.load(Ordering::Relaxed),
        stats.protocol_errors.load(Ordering::Relaxed)
    );
    Ok(0)
}
