//! `ztier bench blk`: the compressed block device against `nbdkit file`
//! with the same client (fio's nbd engine), a space table per data type
//! next to `gzip -6`, and 4K write latency over a run that crosses
//! several checkpoints (this build, and another build's `ztier` if given,
//! as separate server processes, so builds before and after a change are
//! compared in one run).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use ztier_blk::backing::FileBacking;
use ztier_blk::engine::{CreateOptions, Engine};
use ztier_blk::server::{self, Listener, ServeConfig, ServerStats};
use ztier_codec::corpus::synth;
use ztier_codec::CodecId;

use crate::units::parse_size;

/// Arguments of `ztier bench blk`.
#[derive(Args, Debug)]
pub struct BlkBenchArgs {
    /// Device size for the fio runs (both servers).
    #[arg(long, default_value = "1G", value_name = "SIZE")]
    pub size: String,
    /// Seconds per random-I/O job.
    #[arg(long, default_value_t = 10, value_name = "S")]
    pub runtime: u64,
    /// How compressible fio's data is (fio --buffer_compress_percentage).
    #[arg(long, default_value_t = 50, value_name = "PCT")]
    pub compress_percentage: u32,
    /// Folder for the images and sockets (default: a new one under TMPDIR).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Codec of the ztier image.
    #[arg(long, default_value = "lz4", value_name = "C")]
    pub codec: CodecId,
    /// Skip the fio comparison (space table only).
    #[arg(long)]
    pub space_only: bool,
    /// MiB of each data type for the space table.
    #[arg(long, default_value_t = 64, value_name = "MIB")]
    pub space_mib: usize,
    /// Rounds of each fio job and checkpoint run, the two sides in turn
    /// (which goes first alternates); medians are reported.
    #[arg(long, default_value_t = 3, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=50))]
    pub rounds: u32,
    /// Seconds of each checkpoint-latency run (0: skip them).
    #[arg(long, default_value_t = 20, value_name = "S")]
    pub ckpt_runtime: u64,
    /// Logical size of the checkpoint-latency runs' device (default:
    /// `--size`). The table a full checkpoint writes grows with it (3 MiB
    /// per GiB).
    #[arg(long, value_name = "SIZE")]
    pub ckpt_size: Option<String>,
    /// The checkpoint runs' 4K writes go to the first SIZE bytes of the
    /// device (default: all of it), so a large device is written in a
    /// bounded span, as a thin device with a working set is.
    #[arg(long, value_name = "SIZE")]
    pub ckpt_span: Option<String>,
    /// Physical size of the checkpoint runs' image (`blk create
    /// --physical`: thin; default: provisioned). Checkpoints come after
    /// every 1/8 of the extents is sealed, so a smaller physical size
    /// crosses more of them in a run.
    #[arg(long, value_name = "SIZE")]
    pub ckpt_physical: Option<String>,
    /// Another build's `ztier` binary to run the checkpoint-latency run
    /// with too (the build before a change).
    #[arg(long, value_name = "PATH")]
    pub before_bin: Option<PathBuf>,
    /// Read from a cold page cache: before each pass of a read job, each
    /// server's image is synced and its cached pages dropped
    /// (`posix_fadvise(DONTNEED)`, that file only).
    #[arg(long)]
    pub cold: bool,
    /// Only the fio jobs whose names contain one of these (comma-separated,
    /// e.g. `seq-read`); `seq-write-1M` still runs first when a read job is
    /// chosen, since it writes the data they read.
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub jobs: Vec<String>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// 4K random writes (QD8, a FLUSH every 64 writes) over a run that
/// crosses checkpoints, on one build's server.
#[derive(Debug, Serialize)]
pub struct CkptRow {
    /// Which build: "this" or "before".
    pub build: String,
    /// Its binary.
    pub binary: String,
    /// Write IOPS.
    pub iops: f64,
    /// Write completion latency percentiles, µs.
    pub write_p50_us: f64,
    /// p99.
    pub write_p99_us: f64,
    /// p99.9.
    pub write_p999_us: f64,
    /// The slowest write.
    pub write_max_us: f64,
    /// FLUSH latency p99, µs.
    pub flush_p99_us: f64,
    /// Checkpoints taken during the run (superblock generations).
    pub checkpoints: u64,
    /// Table pages a checkpoint wrote on average (this build, from its
    /// live stats; `null` for another build).
    pub pages_per_checkpoint: Option<f64>,
    /// The longest checkpoint, µs (this build only).
    pub checkpoint_max_us: Option<f64>,
    /// Bytes a checkpoint wrote on average: table pages × 4 KiB (this
    /// build only, from its live stats).
    pub bytes_per_checkpoint: Option<f64>,
    /// The whole table (superblock's table pages × 4 KiB): what a full
    /// checkpoint writes each time.
    pub table_bytes: u64,
    /// Each round's write p99, µs (the fields above are medians).
    pub write_p99_us_rounds: Vec<f64>,
}

/// One fio job on both servers.
#[derive(Debug, Serialize)]
pub struct FioRow {
    /// Job name.
    pub job: String,
    /// ztier, MB/s.
    pub ztier_mb_s: f64,
    /// ztier, IOPS.
    pub ztier_iops: f64,
    /// nbdkit file, MB/s.
    pub nbdkit_mb_s: f64,
    /// nbdkit file, IOPS.
    pub nbdkit_iops: f64,
    /// Median of the rounds' ztier / nbdkit throughput ratios.
    pub ratio: f64,
    /// Each round's ratio.
    pub ratios: Vec<f64>,
    /// Whether each pass read from a cold page cache (`--cold`, read jobs).
    pub cold: bool,
    /// With `cold`: the largest fraction of an image's pages still cached
    /// right after a drop (0 when the drops work).
    pub resident_after_drop: Option<f64>,
    /// The ztier server's CPU time (user + system, every thread) per GiB
    /// moved, ms (median of the rounds). Less sensitive to other load on
    /// the machine than throughput.
    pub ztier_cpu_ms_per_gib: f64,
    /// The same for the nbdkit process.
    pub nbdkit_cpu_ms_per_gib: f64,
    /// Before this job's rounds: ms spent syncing both images and waiting
    /// for the ztier server's background work (the first read job after
    /// the write job; `null` for the others).
    pub settle_ms: Option<f64>,
    /// Whether an untimed pass on each server warmed the page cache
    /// before the rounds (the first warm read job).
    pub warmed: bool,
}

/// One data type in the space table.
#[derive(Debug, Serialize)]
pub struct SpaceRow {
    /// Data type.
    pub data: String,
    /// Where it came from.
    pub source: String,
    /// Logical bytes written.
    pub logical_bytes: u64,
    /// Bytes the blocks take in extents (data + records).
    pub stored_bytes: u64,
    /// Extents used × extent size.
    pub extent_bytes: u64,
    /// extent_bytes / logical.
    pub physical_fraction: f64,
    /// gzip -6 of the same bytes / logical.
    pub gzip6_fraction: f64,
}

/// The report.
#[derive(Debug, Serialize)]
pub struct BlkBenchReport {
    /// fio jobs.
    pub fio: Vec<FioRow>,
    /// Space per data type.
    pub space: Vec<SpaceRow>,
    /// Checkpoint latency runs.
    pub checkpoint: Vec<CkptRow>,
}

struct Kid(Child);
impl Drop for Kid {
    fn drop(&mut self) {
        // Ended by PID: SIGTERM, then reaped.
        let _ = Command::new("kill").arg(self.0.id().to_string()).status();
        let _ = self.0.wait();
    }
}

fn need(tool: &str, pkg: &str) -> Result<()> {
    let ok = Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output()?.status.success();
    if !ok {
        bail!("needs '{tool}' (Debian package {pkg})");
    }
    Ok(())
}

fn wait_for(path: &Path) -> Result<()> {
    let t = Instant::now();
    while !path.exists() {
        if t.elapsed() > Duration::from_secs(30) {
            bail!("{} did not appear", path.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// One fio pass: MB/s, IOPS, bytes moved.
#[derive(Debug, Clone, Copy, Default)]
struct Pass {
    mb_s: f64,
    iops: f64,
    bytes: f64,
    /// The server's CPU time during the pass, ms.
    cpu_ms: f64,
}

/// Runs one fio job.
fn fio(uri: &str, args: &[String]) -> Result<Pass> {
    let out = Command::new("fio")
        .args(["--ioengine=nbd", "--output-format=json", "--group_reporting"])
        .arg(format!("--uri={uri}"))
        .args(args)
        .output()
        .context("running fio")?;
    if !out.status.success() {
        bail!("fio failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    // fio may print notes before its JSON.
    let start = out.stdout.iter().position(|&b| b == b'{').unwrap_or(0);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout[start..])
        .with_context(|| format!("fio JSON: {}", String::from_utf8_lossy(&out.stdout[..start.min(500)])))?;
    let j = &v["jobs"][0];
    let (mut bw, mut iops, mut bytes) = (0.0, 0.0, 0.0);
    for d in ["read", "write"] {
        bw += j[d]["bw_bytes"].as_f64().unwrap_or(0.0);
        iops += j[d]["iops"].as_f64().unwrap_or(0.0);
        bytes += j[d]["io_bytes"].as_f64().unwrap_or(0.0);
    }
    if j["error"].as_i64().unwrap_or(0) != 0 {
        bail!("fio job reported error {}", j["error"]);
    }
    Ok(Pass { mb_s: bw / 1e6, iops, bytes, cpu_ms: 0.0 })
}

/// CPU time (user + system) of process `pid` so far, in ms. This process
/// (the ztier server runs in it) is read with `getrusage` (microseconds);
/// another one from `/proc/PID/stat`, in clock ticks (10 ms here): a job
/// that costs the peer less than a tick may read 0.
fn cpu_ms(pid: u32) -> Result<f64> {
    if pid == std::process::id() {
        // SAFETY: an all-zero rusage is a valid value for getrusage to fill.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: RUSAGE_SELF with a valid pointer to an rusage.
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        let ms = |t: libc::timeval| t.tv_sec as f64 * 1000.0 + t.tv_usec as f64 / 1000.0;
        return Ok(ms(ru.ru_utime) + ms(ru.ru_stime));
    }
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name, which is in parentheses.
    let rest = s.rsplit_once(')').map(|x| x.1).context("/proc/PID/stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|x| x.parse::<f64>().ok()).context("utime")?
        + f.get(12).and_then(|x| x.parse::<f64>().ok()).context("stime")?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(ticks * 1000.0 / hz)
}

/// Before the read jobs time anything: both images synced to disk (so
/// the kernel's writeback of the write job does not run during one
/// side's reads), then the ztier server's background work after the
/// write job (cleaner, checkpoint: `maintenance_pending` in its stats)
/// waited for. Returns the ms this took.
fn settle(engine: &Engine, imgs: &[&Path]) -> Result<f64> {
    let t = Instant::now();
    engine.flush()?;
    for img in imgs {
        std::fs::File::open(img)?.sync_all()?;
    }
    while engine.maintenance_pending() {
        if t.elapsed() > Duration::from_secs(300) {
            bail!("the ztier server's cleaner or checkpoint still runs after 300 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // What the cleaner and checkpoint wrote, synced too.
    std::fs::File::open(imgs[0])?.sync_all()?;
    Ok(t.elapsed().as_secs_f64() * 1000.0)
}

fn fio_jobs(size: u64, runtime: u64, pct: u32) -> Vec<(String, Vec<String>)> {
    let common = [format!("--buffer_compress_percentage={pct}"), "--refill_buffers".into()];
    let mk = |name: &str, extra: &[String]| {
        let mut v = vec![format!("--name={name}")];
        v.extend(common.iter().cloned());
        v.extend(extra.iter().cloned());
        (name.to_string(), v)
    };
    vec![
        mk(
            "seq-write-1M",
            &["--rw=write".into(), "--bs=1M".into(), "--iodepth=4".into(), format!("--size={size}")],
        ),
        mk(
            "seq-read-1M-qd4",
            &["--rw=read".into(), "--bs=1M".into(), "--iodepth=4".into(), format!("--size={size}")],
        ),
        mk(
            "seq-read-1M-qd16",
            &["--rw=read".into(), "--bs=1M".into(), "--iodepth=16".into(), format!("--size={size}")],
        ),
        mk(
            "randread-4K-qd32",
            &[
                "--rw=randread".into(),
                "--bs=4k".into(),
                "--iodepth=32".into(),
                format!("--size={size}"),
                "--time_based".into(),
                format!("--runtime={runtime}"),
            ],
        ),
        mk(
            "randwrite-4K-qd32",
            &[
                "--rw=randwrite".into(),
                "--bs=4k".into(),
                "--iodepth=32".into(),
                format!("--size={size}"),
                "--time_based".into(),
                format!("--runtime={runtime}"),
            ],
        ),
    ]
}

fn bench_fio(a: &BlkBenchArgs, dir: &Path) -> Result<Vec<FioRow>> {
    let chosen = |n: &str| a.jobs.is_empty() || a.jobs.iter().any(|j| n.contains(j.as_str()));
    if !fio_jobs(0, 0, 0).iter().any(|(n, _)| chosen(n)) {
        return Ok(Vec::new()); // e.g. `--jobs ckpt`: checkpoint runs only
    }
    need("fio", "fio")?;
    need("nbdkit", "nbdkit")?;
    let size = parse_size(&a.size)?;
    // ztier, in-process server on a unix socket.
    let zimg = dir.join("bench.ztb");
    let f = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&zimg)?;
    let o = CreateOptions {
        logical_size: size,
        block_size: 4096,
        extent_size: 32768,
        codec: a.codec,
        physical: None,
    };
    let engine = Arc::new(Engine::create(Box::new(FileBacking::new(f)), &o)?);
    let zsock = dir.join("z.sock");
    let listener = Listener::Unix(std::os::unix::net::UnixListener::bind(&zsock)?);
    let stop = Arc::new(AtomicBool::new(false));
    let cfg = ServeConfig {
        name: "ztier".into(),
        description: String::new(),
        read_only: false,
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
    };
    let server = {
        let (engine, stop) = (engine.clone(), stop.clone());
        std::thread::spawn(move || {
            server::serve(engine, listener, cfg, stop, Arc::new(ServerStats::default()))
        })
    };
    // nbdkit file on a sparse file of the same size, same folder.
    let kimg = dir.join("nbdkit.img");
    std::fs::File::create(&kimg)?.set_len(size)?;
    let ksock = dir.join("k.sock");
    let kit = Kid(Command::new("nbdkit")
        .args(["-f", "-U"])
        .arg(&ksock)
        .arg("file")
        .arg(&kimg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting nbdkit")?);
    wait_for(&ksock)?;
    // The ztier server runs in this process (its CPU time is this
    // process's: the main thread only waits for fio meanwhile).
    let (me, kit_pid) = (std::process::id(), kit.0.id());
    let zuri = format!("nbd+unix:///?socket={}", zsock.display());
    let kuri = format!("nbd+unix:///?socket={}", ksock.display());
    let mut rows = Vec::new();
    let jobs = fio_jobs(size, a.runtime, a.compress_percentage);
    let reads = jobs.iter().any(|(n, _)| n.contains("read") && chosen(n));
    for (name, args) in jobs {
        if !(chosen(&name) || reads && name == "seq-write-1M") {
            continue;
        }
        if !a.json {
            eprintln!("bench blk: {name}");
        }
        let cold = a.cold && name.contains("read");
        let read = name.contains("read");
        // The first read job after the write job: let both sides' writes
        // settle, then (warm reads) one untimed pass on each server.
        let first_read = read && !rows.iter().any(|r: &FioRow| r.job.contains("read"));
        let settle_ms = if first_read { Some(settle(&engine, &[&zimg, &kimg])?) } else { None };
        let warmed = first_read && !cold;
        if warmed {
            fio(&zuri, &args)?;
            fio(&kuri, &args)?;
        }
        let mut resident: f64 = 0.0;
        // One pass on one server (its CPU time measured around it): with
        // `cold`, its image's cache dropped first.
        let mut pass = |uri: &str, img: &Path, pid: u32| -> Result<Pass> {
            if cold {
                // The ztier server's reads map the image: let go of those
                // pages first, or they stay cached.
                engine.unmap_pages();
                resident = resident.max(drop_cache(img)?);
            }
            let c0 = cpu_ms(pid)?;
            let mut p = fio(uri, &args)?;
            p.cpu_ms = cpu_ms(pid)? - c0;
            Ok(p)
        };
        // Rounds of pairs; which server goes first alternates.
        let (mut zs, mut ks, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..a.rounds as usize {
            let (z, k) = if (rows.len() + round) % 2 == 0 {
                let z = pass(&zuri, &zimg, me)?;
                (z, pass(&kuri, &kimg, kit_pid)?)
            } else {
                let k = pass(&kuri, &kimg, kit_pid)?;
                (pass(&zuri, &zimg, me)?, k)
            };
            ratios.push(if k.mb_s > 0.0 { z.mb_s / k.mb_s } else { 0.0 });
            zs.push(z);
            ks.push(k);
        }
        let m = |v: &[Pass], f: fn(&Pass) -> f64| median(v.iter().map(f).collect());
        let per_gib = |p: &Pass| if p.bytes > 0.0 { p.cpu_ms * (1u64 << 30) as f64 / p.bytes } else { 0.0 };
        rows.push(FioRow {
            job: name,
            ztier_mb_s: m(&zs, |x| x.mb_s),
            ztier_iops: m(&zs, |x| x.iops),
            nbdkit_mb_s: m(&ks, |x| x.mb_s),
            nbdkit_iops: m(&ks, |x| x.iops),
            ratio: median(ratios.clone()),
            ratios,
            cold,
            resident_after_drop: cold.then_some(resident),
            ztier_cpu_ms_per_gib: median(zs.iter().map(per_gib).collect()),
            nbdkit_cpu_ms_per_gib: median(ks.iter().map(per_gib).collect()),
            settle_ms,
            warmed,
        });
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    server.join().map_err(|_| anyhow::anyhow!("server thread panicked"))??;
    engine.close()?;
    Ok(rows)
}

/// Syncs `img` and drops its pages from the page cache (that file only);
/// returns the fraction of its pages still cached right after. A file
/// whose pages cannot be dropped (tmpfs) is an error: its reads would not
/// be cold.
fn drop_cache(img: &Path) -> Result<f64> {
    use std::os::unix::io::AsRawFd;
    let f = std::fs::File::open(img).with_context(|| format!("opening {}", img.display()))?;
    f.sync_all()?;
    // SAFETY: a plain syscall on a descriptor this function owns.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        bail!("posix_fadvise(DONTNEED) on {}: {}", img.display(), std::io::Error::from_raw_os_error(rc));
    }
    let left = resident_fraction(&f)?;
    if left > 0.5 {
        bail!(
            "--cold: {:.0}% of {} stays cached after posix_fadvise(DONTNEED) (a tmpfs folder?); give --dir on a disk",
            left * 100.0,
            img.display()
        );
    }
    Ok(left)
}

/// The fraction of `f`'s pages in the page cache (`mincore` over a
/// read-only mapping that is never touched).
fn resident_fraction(f: &std::fs::File) -> Result<f64> {
    use std::os::unix::io::AsRawFd;
    let len = f.metadata()?.len() as usize;
    if len == 0 {
        return Ok(0.0);
    }
    // SAFETY: a fresh shared read-only mapping of an open file; it is only
    // passed to mincore (never read through) and unmapped below.
    let map =
        unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0) };
    if map == libc::MAP_FAILED {
        bail!("mmap for mincore: {}", std::io::Error::last_os_error());
    }
    let pages = len.div_ceil(4096);
    let mut vec = vec![0u8; pages];
    // SAFETY: `map` is a live mapping of `len` bytes and `vec` has one byte
    // per 4 KiB page of it; the mapping is unmapped once, right after.
    let rc = unsafe { libc::mincore(map, len, vec.as_mut_ptr()) };
    let err = std::io::Error::last_os_error();
    // SAFETY: unmaps the mapping made above, of `len` bytes.
    unsafe { libc::munmap(map, len) };
    if rc != 0 {
        bail!("mincore: {err}");
    }
    Ok(vec.iter().filter(|&&b| b & 1 != 0).count() as f64 / pages as f64)
}

/// The median (the mean of the middle two for an even count).
fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The highest generation of the two superblock slots of `img` (offset 40
/// of each 4 KiB slot in every format version so far) and the table's
/// size in bytes (its 4 KiB pages at offset 36 of that slot). Reads the two slots only
/// (an image is as large as its physical size).
fn generation(img: &Path) -> Result<(u64, u64)> {
    use std::io::Read;
    let mut b = Vec::with_capacity(8192);
    std::fs::File::open(img)?.take(8192).read_to_end(&mut b)?;
    if b.len() < 8192 {
        bail!("{}: too short for an image", img.display());
    }
    let g = |o: usize| u64::from_le_bytes(b[o + 40..o + 48].try_into().expect("8 bytes"));
    // The slot in use (a new image has written only one).
    let o = if g(4096) > g(0) { 4096 } else { 0 };
    let pages = u32::from_le_bytes(b[o + 36..o + 40].try_into().expect("4 bytes"));
    Ok((g(o), u64::from(pages) * 4096))
}

/// One checkpoint-latency run on the server of `bin`.
fn ckpt_run(a: &BlkBenchArgs, dir: &Path, build: &str, bin: &Path) -> Result<CkptRow> {
    let img = dir.join("ckpt.ztb");
    let sock = dir.join("c.sock");
    let _ = std::fs::remove_file(&img);
    let _ = std::fs::remove_file(&sock);
    let size = a.ckpt_size.as_deref().unwrap_or(&a.size);
    let mut create = Command::new(bin);
    create.args(["blk", "create"]).arg(&img).args(["--size", size]);
    if let Some(p) = &a.ckpt_physical {
        create.args(["--physical", p]);
    }
    let st = create.stderr(Stdio::null()).status().with_context(|| format!("running {}", bin.display()))?;
    if !st.success() {
        bail!("{} blk create failed", bin.display());
    }
    let (g0, table_bytes) = generation(&img)?;
    let srv = Kid(Command::new(bin)
        .args(["blk", "serve"])
        .arg(&img)
        .arg("--socket")
        .arg(&sock)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting the server")?);
    wait_for(&sock)?;
    let out = Command::new("fio")
        .args(["--ioengine=nbd", "--output-format=json", "--name=ckpt", "--rw=randwrite", "--bs=4k"])
        .args(["--iodepth=8", "--fsync=64", "--time_based", "--percentile_list=50:99:99.9"])
        .arg(format!("--runtime={}", a.ckpt_runtime))
        .arg(format!("--size={}", a.ckpt_span.as_deref().unwrap_or(size)))
        .arg(format!("--buffer_compress_percentage={}", a.compress_percentage))
        .arg("--refill_buffers")
        .arg(format!("--uri=nbd+unix:///?socket={}", sock.display()))
        .output()
        .context("running fio")?;
    // This build answers on its control socket (another may not).
    let live = ztier_blk::live::control_name("blk", &img)
        .ok()
        .and_then(|n| ztier_blk::live::query(&n, "stats", Duration::from_secs(10)).ok().flatten());
    drop(srv); // SIGTERM: a clean stop takes one more checkpoint
    if !out.status.success() {
        bail!("fio failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let checkpoints = generation(&img)?.0.saturating_sub(g0 + 1);
    let start = out.stdout.iter().position(|&b| b == b'{').unwrap_or(0);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout[start..]).context("fio JSON")?;
    let w = &v["jobs"][0]["write"];
    let pct = |x: &serde_json::Value, k: &str| x["percentile"][k].as_f64().unwrap_or(0.0) / 1000.0;
    Ok(CkptRow {
        build: build.into(),
        binary: bin.display().to_string(),
        iops: w["iops"].as_f64().unwrap_or(0.0),
        write_p50_us: pct(&w["clat_ns"], "50.000000"),
        write_p99_us: pct(&w["clat_ns"], "99.000000"),
        write_p999_us: pct(&w["clat_ns"], "99.900000"),
        write_max_us: w["clat_ns"]["max"].as_f64().unwrap_or(0.0) / 1000.0,
        flush_p99_us: pct(&v["jobs"][0]["sync"]["lat_ns"], "99.000000"),
        checkpoints,
        pages_per_checkpoint: live.as_ref().and_then(|l| {
            let c = l["checkpoints"].as_f64()?;
            (c > 0.0).then(|| l["checkpoint_pages_written"].as_f64().unwrap_or(0.0) / c)
        }),
        checkpoint_max_us: live.as_ref().and_then(|l| l["checkpoint_max_us"].as_f64()),
        bytes_per_checkpoint: live.as_ref().and_then(|l| {
            let c = l["checkpoints"].as_f64()?;
            (c > 0.0).then(|| l["checkpoint_pages_written"].as_f64().unwrap_or(0.0) * 4096.0 / c)
        }),
        table_bytes,
        write_p99_us_rounds: Vec::new(),
    })
}

/// The checkpoint-latency runs: this build, and `--before-bin` if given
/// (interleaved: before, this).
fn bench_checkpoints(a: &BlkBenchArgs, dir: &Path) -> Result<Vec<CkptRow>> {
    need("fio", "fio")?;
    let me = std::env::current_exe().context("this binary")?;
    let mut builds: Vec<(&str, PathBuf)> = Vec::new();
    if let Some(b) = &a.before_bin {
        builds.push(("before", b.clone()));
    }
    builds.push(("this", me));
    let mut runs: Vec<Vec<CkptRow>> = builds.iter().map(|_| Vec::new()).collect();
    for round in 0..a.rounds as usize {
        for i in 0..builds.len() {
            // Which build goes first alternates from round to round.
            let i = if round % 2 == 0 { i } else { builds.len() - 1 - i };
            let (name, bin) = &builds[i];
            if !a.json {
                eprintln!(
                    "bench blk: checkpoint latency, {name} build ({}), round {}",
                    bin.display(),
                    round + 1
                );
            }
            runs[i].push(ckpt_run(a, dir, name, bin)?);
        }
    }
    Ok(runs
        .into_iter()
        .map(|rs| {
            let m = |f: fn(&CkptRow) -> f64| median(rs.iter().map(f).collect());
            let opt = |f: fn(&CkptRow) -> Option<f64>| {
                let v: Vec<f64> = rs.iter().filter_map(f).collect();
                (!v.is_empty()).then(|| median(v))
            };
            CkptRow {
                build: rs[0].build.clone(),
                binary: rs[0].binary.clone(),
                iops: m(|r| r.iops),
                write_p50_us: m(|r| r.write_p50_us),
                write_p99_us: m(|r| r.write_p99_us),
                write_p999_us: m(|r| r.write_p999_us),
                write_max_us: m(|r| r.write_max_us),
                flush_p99_us: m(|r| r.flush_p99_us),
                checkpoints: median(rs.iter().map(|r| r.checkpoints as f64).collect()).round() as u64,
                pages_per_checkpoint: opt(|r| r.pages_per_checkpoint),
                checkpoint_max_us: opt(|r| r.checkpoint_max_us),
                bytes_per_checkpoint: opt(|r| r.bytes_per_checkpoint),
                table_bytes: rs[0].table_bytes,
                write_p99_us_rounds: rs.iter().map(|r| r.write_p99_us).collect(),
            }
        })
        .collect())
}

/// Up to `max` bytes of the regular files under `roots` (sorted walk).
fn gather(roots: &[&str], max: usize, filter: impl Fn(&Path) -> bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = roots.iter().map(PathBuf::from).collect();
    stack.reverse();
    while let Some(p) = stack.pop() {
        if out.len() >= max {
            break;
        }
        let Ok(md) = std::fs::symlink_metadata(&p) else { continue };
        if md.is_dir() {
            let Ok(rd) = std::fs::read_dir(&p) else { continue };
            let mut kids: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
            kids.sort();
            kids.reverse();
            stack.extend(kids);
        } else if md.is_file() && filter(&p) {
            if let Ok(b) = std::fs::read(&p) {
                out.extend_from_slice(&b[..b.len().min(max - out.len())]);
            }
        }
    }
    out
}

fn sqlite_db(dir: &Path, max: usize) -> Result<Vec<u8>> {
    need("sqlite3", "sqlite3")?;
    let db = dir.join("bench.db");
    let _ = std::fs::remove_file(&db);
    let rows = max / 120;
    let sql = format!(
        "CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, qty INTEGER, price REAL, note TEXT);\n\
         WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < {rows})\n\
         INSERT INTO t SELECT x, 'item-' || (x * 7919 % 100003), x % 97, (x % 1000) / 7.0,\n\
         'order ' || x || ' shipped to warehouse ' || (x % 13) FROM c;\n\
         CREATE INDEX ti ON t(name);\n"
    );
    let mut c = Command::new("sqlite3").arg(&db).stdin(Stdio::piped()).spawn()?;
    c.stdin.take().expect("stdin").write_all(sql.as_bytes())?;
    if !c.wait()?.success() {
        bail!("sqlite3 failed");
    }
    let mut b = std::fs::read(&db)?;
    b.truncate(max);
    Ok(b)
}

fn gzip6_len(data: &[u8]) -> Result<u64> {
    need("gzip", "gzip")?;
    let mut c =
        Command::new("gzip").args(["-6", "-c"]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
    let mut stdin = c.stdin.take().expect("stdin");
    let data = data.to_vec();
    let w = std::thread::spawn(move || stdin.write_all(&data));
    let out = c.wait_with_output()?;
    w.join().map_err(|_| anyhow::anyhow!("writer panicked"))??;
    Ok(out.stdout.len() as u64)
}

fn space_row(dir: &Path, codec: CodecId, data: &str, source: &str, mut bytes: Vec<u8>) -> Result<SpaceRow> {
    bytes.truncate(bytes.len() / 4096 * 4096);
    if bytes.is_empty() {
        bail!("no {data} data found in {source}");
    }
    let img = dir.join(format!("space-{data}.ztb"));
    let _ = std::fs::remove_file(&img);
    let f = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&img)?;
    let o = CreateOptions {
        logical_size: bytes.len() as u64,
        block_size: 4096,
        extent_size: 32768,
        codec,
        physical: None,
    };
    let e = Engine::create(Box::new(FileBacking::new(f)), &o)?;
    for (i, c) in bytes.chunks(1 << 20).enumerate() {
        e.write((i as u64) << 20, c, false)?;
    }
    e.close()?;
    let mut back = vec![0u8; bytes.len()];
    e.read(0, &mut back)?;
    if back != bytes {
        bail!("{data}: read back differs");
    }
    let s = e.stats();
    let extent_bytes = s.used_extents as u64 * s.extent_size as u64;
    let g = gzip6_len(&bytes)?;
    let _ = std::fs::remove_file(&img);
    Ok(SpaceRow {
        data: data.into(),
        source: source.into(),
        logical_bytes: bytes.len() as u64,
        stored_bytes: s.data_stored_bytes,
        extent_bytes,
        physical_fraction: extent_bytes as f64 / bytes.len() as f64,
        gzip6_fraction: g as f64 / bytes.len() as f64,
    })
}

fn bench_space(a: &BlkBenchArgs, dir: &Path) -> Result<Vec<SpaceRow>> {
    let max = a.space_mib << 20;
    let ext =
        |p: &Path, list: &[&str]| p.extension().and_then(|e| e.to_str()).is_some_and(|e| list.contains(&e));
    let mut rows = Vec::new();
    rows.push(space_row(
        dir,
        a.codec,
        "text",
        "/usr/share/doc, /usr/share/man (.txt, plain)",
        gather(&["/usr/share/doc", "/usr/share/common-licenses", "/usr/share/perl5"], max, |p| {
            !ext(p, &["gz", "xz", "bz2", "png", "jpg", "zst"])
        }),
    )?);
    rows.push(space_row(
        dir,
        a.codec,
        "source",
        "/usr/include (.h)",
        gather(&["/usr/include", "/usr/lib/python3"], max, |p| ext(p, &["h", "c", "py", "hpp"])),
    )?);
    rows.push(space_row(
        dir,
        a.codec,
        "binaries",
        "/usr/bin, /usr/lib (ELF)",
        gather(&["/usr/bin", "/usr/lib/x86_64-linux-gnu"], max, |p| !ext(p, &["py", "pl", "sh"])),
    )?);
    rows.push(space_row(
        dir,
        a.codec,
        "sqlite",
        "generated SQLite database (orders table + index)",
        sqlite_db(dir, max)?,
    )?);
    let mut random = vec![0u8; max];
    synth::fill(&mut random, synth::Kind::Random, &mut synth::Rng::new(1));
    // Half random, half text, in alternate 64 KiB pieces.
    let text = gather(&["/usr/share/doc", "/usr/share/common-licenses", "/usr/share/perl5"], max, |p| {
        !ext(p, &["gz", "xz", "bz2", "png", "jpg", "zst"])
    });
    let mut mixed = Vec::with_capacity(max);
    for (i, (r, t)) in random.chunks(64 << 10).zip(text.chunks(64 << 10)).enumerate() {
        mixed.extend_from_slice(if i % 2 == 0 { r } else { t });
    }
    rows.push(space_row(dir, a.codec, "random", "xorshift64*", random)?);
    rows.push(space_row(dir, a.codec, "mixed", "random and text, alternate 64 KiB", mixed)?);
    Ok(rows)
}

/// Runs `ztier bench blk`.
pub fn run(a: BlkBenchArgs) -> Result<i32> {
    let (dir, own) = match &a.dir {
        Some(d) => (d.clone(), false),
        None => {
            let d = std::env::temp_dir().join(format!("ztier-bench-blk-{}", std::process::id()));
            (d, true)
        }
    };
    std::fs::create_dir_all(&dir)?;
    let result = (|| -> Result<BlkBenchReport> {
        let fio = if a.space_only { Vec::new() } else { bench_fio(&a, &dir)? };
        let space = bench_space(&a, &dir)?;
        let checkpoint =
            if a.space_only || a.ckpt_runtime == 0 { Vec::new() } else { bench_checkpoints(&a, &dir)? };
        Ok(BlkBenchReport { fio, space, checkpoint })
    })();
    if own {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        for f in ["bench.ztb", "nbdkit.img", "z.sock", "k.sock", "bench.db", "ckpt.ztb", "c.sock"] {
            let _ = std::fs::remove_file(dir.join(f));
        }
    }
    let r = result?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(0);
    }
    if !r.fio.is_empty() {
        println!(
            "fio (nbd engine), ztier blk vs nbdkit file, {} size, {}% compressible data",
            a.size, a.compress_percentage
        );
        println!("(medians of {} rounds; ratio: the median of each round's paired ratio)", a.rounds);
        if a.cold {
            println!("(read jobs cold: each image's page cache dropped before each pass)");
        }
        println!(
            "(CPU ms/GiB: each server's CPU time per GiB moved; before the read jobs both images are synced, the ztier server's cleaner/checkpoint waited for, and warm reads get one untimed pass on each)"
        );
        println!(
            "{:<20} {:>11} {:>11} {:>11} {:>11} {:>7} {:>9} {:>9}  rounds",
            "job",
            "ztier MB/s",
            "ztier IOPS",
            "nbdkit MB/s",
            "nbdkit IOPS",
            "ratio",
            "z CPU/GiB",
            "k CPU/GiB"
        );
        for x in &r.fio {
            let rs: Vec<String> = x.ratios.iter().map(|r| format!("{r:.2}")).collect();
            println!(
                "{:<20} {:>11.1} {:>11.0} {:>11.1} {:>11.0} {:>7.2} {:>9.0} {:>9.0}  {}",
                x.job,
                x.ztier_mb_s,
                x.ztier_iops,
                x.nbdkit_mb_s,
                x.nbdkit_iops,
                x.ratio,
                x.ztier_cpu_ms_per_gib,
                x.nbdkit_cpu_ms_per_gib,
                rs.join(" ")
            );
        }
        println!();
    }
    if !r.checkpoint.is_empty() {
        let size = a.ckpt_size.as_deref().unwrap_or(&a.size);
        println!(
            "4K random writes, QD8, a FLUSH every 64 writes, {} s across checkpoints, {} device{}{}, {}% compressible (medians of {} rounds)",
            a.ckpt_runtime,
            size,
            a.ckpt_physical.as_ref().map_or(String::new(), |p| format!(" ({p} physical)")),
            a.ckpt_span.as_ref().map_or(String::new(), |s| format!(", writes in its first {s}")),
            a.compress_percentage,
            a.rounds
        );
        println!(
            "{:<8} {:>9} {:>9} {:>9} {:>10} {:>10} {:>11} {:>6} {:>12} {:>12}",
            "build",
            "IOPS",
            "p50 µs",
            "p99 µs",
            "p99.9 µs",
            "max µs",
            "flush p99",
            "ckpts",
            "bytes/ckpt",
            "table bytes"
        );
        for x in &r.checkpoint {
            println!(
                "{:<8} {:>9.0} {:>9.0} {:>9.0} {:>10.0} {:>10.0} {:>11.0} {:>6} {:>12} {:>12}",
                x.build,
                x.iops,
                x.write_p50_us,
                x.write_p99_us,
                x.write_p999_us,
                x.write_max_us,
                x.flush_p99_us,
                x.checkpoints,
                x.bytes_per_checkpoint.map_or("-".to_string(), |p| format!("{p:.0}")),
                x.table_bytes
            );
        }
        println!();
    }
    println!("space per data type ({} codec, 4K blocks, 32K extents) next to gzip -6", a.codec.name());
    println!(
        "{:<10} {:>12} {:>12} {:>12} {:>10} {:>10}",
        "data", "logical", "stored", "extents", "physical", "gzip -6"
    );
    for x in &r.space {
        println!(
            "{:<10} {:>12} {:>12} {:>12} {:>9.1}% {:>9.1}%",
            x.data,
            x.logical_bytes,
            x.stored_bytes,
            x.extent_bytes,
            x.physical_fraction * 100.0,
            x.gzip6_fraction * 100.0
        );
    }
    Ok(0)
}
