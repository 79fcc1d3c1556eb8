//! `ztier blk`: the compressed block device (create, serve over NBD,
//! check, stats).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use ztier_blk::backing::FileBacking;
use ztier_blk::engine::{CreateOptions, Engine};
use ztier_blk::server::{self, Listener, ServeConfig, ServerStats};
use ztier_codec::CodecId;

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
    /// Audit an image offline: recover it, then read every block back
    /// (checksums and decompression) and cross-check the extent accounting.
    /// Exit 0 only if clean.
    Check(ImageArgs),
    /// Print statistics of an image (offline): sizes, compression ratio,
    /// extents used and free.
    Stats(StatsArgs),
}

/// Arguments of `ztier blk create`.
#[derive(Args, Debug)]
pub struct CreateArgs {
    /// Image file to create (must not exist).
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
    /// Unix socket to listen on (default: IMAGE.sock).
    #[arg(long, value_name = "PATH", conflicts_with = "listen")]
    pub socket: Option<PathBuf>,
    /// TCP address to listen on. Only loopback addresses unless
    /// --allow-remote is given (NBD has no authentication here).
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<String>,
    /// Allow a non-loopback --listen address.
    #[arg(long)]
    pub allow_remote: bool,
    /// Refuse writes.
    #[arg(long)]
    pub readonly: bool,
    /// Worker threads per connection (default: CPUs).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
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

/// Runs a `blk` subcommand.
pub fn run(c: BlkCommand) -> Result<i32> {
    match c {
        BlkCommand::Create(a) => {
            let o = CreateOptions {
                logical_size: parse_size(&a.size)?,
                block_size: parse_size(&a.block)? as u32,
                extent_size: parse_size(&a.extent)? as u32,
                codec: a.codec,
                physical: a.physical.as_deref().map(parse_size).transpose()?,
            };
            if o.logical_size % o.block_size.max(1) as u64 != 0 {
                bail!("--size must be a multiple of the block size ({})", o.block_size);
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
            let e = open_engine(&a.image, true)?;
            let problems = e.check()?;
            if problems.is_empty() {
                let s = e.stats();
                println!(
                    "{}: clean ({} data blocks, {} zero blocks, {} extents used of {})",
                    a.image.display(),
                    s.data_blocks,
                    s.zero_blocks,
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
            let e = open_engine(&a.image, true)?;
            let s = e.stats();
            if a.json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                println!("logical        {} bytes ({} B blocks)", s.logical_size, s.block_size);
                println!("data           {} blocks, {} zero blocks", s.data_blocks, s.zero_blocks);
                println!("stored         {} bytes (ratio {:.3})", s.data_stored_bytes, s.ratio);
                println!(
                    "extents        {} of {} used ({} B each), {} free",
                    s.used_extents, s.extents_total, s.extent_size, s.extents_free
                );
                println!(
                    "physical       {} bytes; file allocated {} bytes",
                    s.physical_bytes_used, s.file_allocated_bytes
                );
                println!(
                    "codec          {}{}",
                    s.codec,
                    if s.provisioned { ", provisioned" } else { ", thin" }
                );
            }
            Ok(0)
        }
    }
}

/// Blocks SIGINT/SIGTERM/SIGHUP in this thread (and the threads it
/// starts) and sets `stop` from a waiter thread when one arrives.
fn stop_on_signals(stop: Arc<AtomicBool>) {
    // SAFETY: sigset manipulation on a local value, then pthread_sigmask on it.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    std::thread::spawn(move || {
        let mut sig: libc::c_int = 0;
        // SAFETY: sigwait on the set blocked above.
        if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
            eprintln!("ztier blk: signal {sig}: stopping");
            stop.store(true, Ordering::Release);
        }
    });
}

/// `--socket`, or IMAGE.sock.
fn socket_path(a: &ServeArgs) -> PathBuf {
    a.socket.clone().unwrap_or_else(|| {
        let mut p = a.image.clone().into_os_string();
        p.push(".sock");
        PathBuf::from(p)
    })
}

fn serve(a: ServeArgs) -> Result<i32> {
    let stop = Arc::new(AtomicBool::new(false));
    stop_on_signals(stop.clone());
    let engine = Arc::new(open_engine(&a.image, a.readonly)?);
    let (listener, where_) = if let Some(addr) = &a.listen {
        let sa: std::net::SocketAddr =
            addr.parse().with_context(|| format!("--listen {addr}: not ADDR:PORT"))?;
        if !sa.ip().is_loopback() && !a.allow_remote {
            bail!("--listen {addr} is not a loopback address: NBD has no authentication; add --allow-remote to mean it");
        }
        let l = std::net::TcpListener::bind(sa).with_context(|| format!("listening on {addr}"))?;
        let local = l.local_addr()?;
        (Listener::Tcp(l), format!("nbd://{local}/{}", a.name))
    } else {
        let path = socket_path(&a);
        if path.exists() {
            bail!("{} exists: remove it or give another --socket", path.display());
        }
        let l = std::os::unix::net::UnixListener::bind(&path)
            .with_context(|| format!("binding {}", path.display()))?;
        (Listener::Unix(l), format!("nbd+unix:///{}?socket={}", a.name, path.display()))
    };
    let cfg = ServeConfig {
        name: a.name.clone(),
        description: format!("ztier compressed image {}", a.image.display()),
        read_only: a.readonly,
        threads: a.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get())),
    };
    eprintln!("ztier blk: serving {} at {where_}", a.image.display());
    let stats = Arc::new(ServerStats::default());
    let r = server::serve(engine.clone(), listener, cfg, stop, stats.clone());
    if a.listen.is_none() {
        let _ = std::fs::remove_file(socket_path(&a));
    }
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
