//! `ztier demo`: the flagship end-to-end demonstration on built-in defaults.
//!
//! Today, on the real memory pages of the bundled corpus
//! (`../shared/corpus/*.pages` next to the repository, or `--corpus DIR`):
//! part 1 compares every page codec, one table per corpus file; part 2
//! runs the compressed page store with each allocator (cells of 1, 2 and
//! 4 pages, chunks, size classes) past its budget on the same pages; part
//! 3 records a page trace of `sort` under valgrind lackey (with compressed
//! sizes from its real memory) and simulates no compression, a static
//! compressed region and the kaplan policy on it; part 4 writes system
//! files, a generated SQLite-like table and random data through the
//! compressed block device, simulates a crash that loses the unflushed
//! writes, recovers, audits and reads everything flushed back; part 5
//! runs a bundled memory-hungry Python job (`examples/workloads/pyapp.py`,
//! embedded) natively and under `ztier run` at a budget well below its
//! peak, checks the outputs are identical and prints the comparison, then
//! a pool of three forked workers (`examples/workloads/workers.py`)
//! under one budget for the whole command (the default tree scope) and
//! under one for each process. When no corpus is found
//! it uses its own process's and synthetic pages, and says so; without
//! valgrind part 3 says it is skipped and why.

use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Args;
use ztier_codec::bench::BenchConfig;
use ztier_codec::corpus::{synth, Corpus};
use ztier_run_core::names::{merged, stats};

use ztier_store::alloc::AllocatorKind;
use ztier_store::bench::StoreBenchConfig;

use super::bench_codecs::measure;
use super::bench_store;

/// Arguments of `ztier demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Folder holding `.pages` files (default: ../shared/corpus next to the
    /// repository root).
    #[arg(long, value_name = "DIR")]
    pub corpus: Option<PathBuf>,
    /// Seconds of timing per codec and direction.
    #[arg(long, default_value_t = 0.2, value_name = "S")]
    pub seconds: f64,
}

fn find_corpus_dir() -> Option<PathBuf> {
    let mut candidates = vec![PathBuf::from("../shared/corpus")];
    // Also relative to the source tree the binary was built from.
    candidates.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus"));
    candidates.into_iter().find(|p| p.is_dir())
}

fn pages_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "pages"))
        .collect();
    v.sort();
    v
}

/// Runs the demo.
pub fn run(a: DemoArgs) -> Result<i32> {
    let cfg = BenchConfig { min_seconds: a.seconds, min_passes: 3, ..BenchConfig::default() };
    println!("ztier demo, part 1: page codecs on real memory pages\n");
    println!("Each row compresses every page of the corpus with one codec, decompresses it and");
    println!("checks it byte for byte. ratio = bytes in / bytes stored; speeds in MB/s of");
    println!("uncompressed data; ×cpy = time relative to memcpy of the same pages.\n");
    let files = a.corpus.clone().or_else(find_corpus_dir).map(|d| pages_in(&d)).unwrap_or_default();
    let corpora: Vec<Corpus> = if files.is_empty() {
        println!("(no corpus found: using this process's own pages plus synthetic heap-like pages)\n");
        let mut data = synth::corpus(2048, 1).bytes().to_vec();
        if let Ok(own) = ztier_codec::corpus::sample_pid(std::process::id(), 2048) {
            data.extend_from_slice(own.bytes());
        }
        vec![Corpus::from_bytes("synthetic+self", data)]
    } else {
        files.iter().map(|f| Corpus::load(std::slice::from_ref(f))).collect::<Result<_, _>>()?
    };
    for c in &corpora {
        let r = measure(c, &cfg)?;
        println!("{}", ztier_codec::bench::render_table(&r));
    }

    println!("ztier demo, part 2: the compressed page store, three allocators on the same pages\n");
    println!("Each corpus goes into an LZ4 store whose budget is half its compressed size, so");
    println!("the store runs full and evicts; then put+get pairs and a skewed mixed workload.");
    println!("Every get is checked against what was put; memory counts all overhead.");
    let base = StoreBenchConfig { threads: 2, ..StoreBenchConfig::new(AllocatorKind::Classes) };
    let mut reports = Vec::new();
    for c in &corpora {
        reports.extend(bench_store::measure(c, &bench_store::ALL, &base)?);
    }
    print!("{}", ztier_store::bench::render_table(&reports));
    println!("\neff.rat = original bytes / all memory used; vs.cod = store put+get / codec alone.\n");

    println!("ztier demo, part 3: how much memory to compress, simulated on a real program's trace\n");
    println!("`sort` runs under valgrind lackey; every data reference is traced and the pages it");
    println!("touched are compressed from its real memory as it runs. The trace is then replayed");
    println!("through a memory of each size with no compression, a fixed 25% compressed region");
    println!("and the 1999 cost/benefit policy (kaplan), at a 5 ms disk and a 0.1 ms SSD.\n");
    if let Err(e) = trace_demo() {
        println!("(part 3 skipped: {e:#})");
    }
    println!("\nztier demo, part 4: the compressed block device (ZBD), a crash and its recovery\n");
    if let Err(e) = blk_demo() {
        println!("(part 4 failed: {e:#})");
        return Ok(1);
    }
    println!("\nztier demo, part 5: an unmodified Python program under a memory budget (ztier run)\n");
    if let Err(e) = run_demo() {
        println!("(part 5 failed: {e:#})");
        return Ok(1);
    }
    println!(
        "\nMore: ztier bench store --help, ztier bench codecs --help, ztier trace --help, ztier sim --help,\n\
         ztier blk --help, ztier bench blk --help, ztier run --help, ztier bench pressure --help."
    );
    Ok(0)
}

/// Part 5: the bundled Python job natively, then under `ztier run`.
fn run_demo() -> Result<()> {
    use anyhow::{bail, Context};
    const JOB: &str = include_str!("../../../../examples/workloads/pyapp.py");
    const N: &str = "300000";
    const BUDGET: u64 = 48 << 20;
    let dir = std::env::temp_dir().join(format!("ztier-demo-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let _cleanup = crate::scratch::TempDir::adopt(dir.clone());
    let job = dir.join("pyapp.py");
    std::fs::write(&job, JOB)?;
    let python = which("python3").context("python3 is needed for this part")?;
    println!(
        "python3 pyapp.py {N}: builds {N} user records (dicts, strings, lists), then three passes over them."
    );
    let native_out = dir.join("native.out");
    let mut c = std::process::Command::new(&python);
    c.arg(&job).arg(N).stdout(std::fs::File::create(&native_out)?);
    let n = crate::launch::measure(&mut c)?;
    if n.code != 0 {
        bail!("the job failed natively (exit {})", n.code);
    }
    let mut ra = crate::launch::RunArgs::defaults(
        BUDGET,
        "lz4",
        vec![python.clone().into(), job.clone().into(), N.into()],
    );
    let managed_out = dir.join("managed.out");
    let r = crate::launch::run_program(&ra, Some(std::fs::File::create(&managed_out)?), None)?;
    let s = &r.stats;
    let same = std::fs::read(&native_out)? == std::fs::read(&managed_out)?;
    // The same with faults served in the faulting thread.
    ra.fault_path = "signal".into();
    let signal_out = dir.join("signal.out");
    let rs = crate::launch::run_program(&ra, Some(std::fs::File::create(&signal_out)?), None)?;
    let same_signal = rs.code == 0 && std::fs::read(&native_out)? == std::fs::read(&signal_out)?;
    let mb = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0) / 1e6;
    let sec = |k: &str| s[k].as_f64().unwrap_or(0.0);
    println!("{:<22} {:>9} {:>12} {:>16}", "", "wall s", "peak RSS", "heap in memory");
    println!("{:<22} {:>9.2} {:>9.0} MB {:>16}", "native", n.wall_s, n.maxrss as f64 / 1e6, "all of it");
    println!(
        "{:<22} {:>9.2} {:>9.0} MB {:>10.0} MB max",
        format!("ztier run --budget {}M", BUDGET >> 20),
        s[merged::WALL_S].as_f64().unwrap_or(0.0),
        mb(&s[merged::PEAK_RSS_BYTES]),
        mb(&s[stats::PEAK_RESIDENT_BYTES])
    );
    println!(
        "{:<22} {:>9.2} {:>9.0} MB {:>10.0} MB max   (faults served in the faulting thread; output {})",
        "  --fault-path signal",
        rs.stats[merged::WALL_S].as_f64().unwrap_or(0.0),
        mb(&rs.stats[merged::PEAK_RSS_BYTES]),
        mb(&rs.stats[stats::PEAK_RESIDENT_BYTES]),
        if same_signal { "identical" } else { "DIFFERENT" }
    );
    println!(
        "\nUnder ztier run: {} pages compressed and {} more evicted unchanged, without compression \
         ({:.0} MB held in {:.0} MB at the store's fullest), {} faults served \
         (p50 {} µs, p99 {} µs handler time; {:.2} s in all: {}), output {}.",
        s[stats::PAGES_COMPRESSED],
        s[stats::CLEAN_EVICTED],
        mb(&s[stats::ORIG_BYTES]),
        mb(&s[stats::STORED_BYTES]),
        s[stats::FAULTS],
        s[stats::FAULT_P50_US],
        s[stats::FAULT_P99_US],
        sec(merged::FAULT_SERVICE_S),
        crate::launch::service_parts(
            sec(merged::FAULT_SERVICE_S),
            sec(merged::FAULT_LOCK_WAIT_S),
            sec(merged::FAULT_STORE_READ_S),
            sec(merged::FAULT_INSTALL_S)
        ),
        if same { "identical to the native run" } else { "DIFFERENT from the native run" }
    );
    if !same || r.code != 0 {
        bail!("the managed run did not reproduce the native output (exit {})", r.code);
    }
    if !same_signal {
        bail!(
            "the managed run with --fault-path signal did not reproduce the native output (exit {})",
            rs.code
        );
    }
    println!("Kernel swap, zswap and zram side by side: sudo ztier bench pressure --budgets 256M -- python3 examples/workloads/pyapp.py");
    workers_demo(&python, &dir)
}

/// Part 5, second half: a pool of forked workers under one budget for
/// the whole command (the tree scope, the default), and with a budget
/// for each process.
fn workers_demo(python: &Path, dir: &Path) -> Result<()> {
    use anyhow::bail;
    const JOB: &str = include_str!("../../../../examples/workloads/workers.py");
    const N: &str = "100000";
    const BUDGET: u64 = 24 << 20;
    let job = dir.join("workers.py");
    std::fs::write(&job, JOB)?;
    println!(
        "\npython3 workers.py {N} 3: three forked workers at once, each building ~25 MB of records and \
         walking them twice."
    );
    let native_out = dir.join("workers-native.out");
    let mut c = std::process::Command::new(python);
    c.arg(&job).args([N, "3"]).stdout(std::fs::File::create(&native_out)?);
    let n = crate::launch::measure(&mut c)?;
    if n.code != 0 {
        bail!("the workers failed natively (exit {})", n.code);
    }
    println!("{:<26} {:>7} {:>30} {:>17}", "", "wall s", "resident at most, MB", "pages compressed");
    println!("{:<26} {:>7.2} {:>30} {:>17}", "native", n.wall_s, "all of it", 0);
    for scope in ["tree", "process"] {
        let mut ra = crate::launch::RunArgs::defaults(
            BUDGET,
            "lz4",
            vec![python.to_path_buf().into(), job.clone().into(), N.into(), "3".into()],
        );
        ra.budget_scope = Some(scope.into());
        let out = dir.join(format!("workers-{scope}.out"));
        let r = crate::launch::run_program(&ra, Some(std::fs::File::create(&out)?), None)?;
        let s = &r.stats;
        if r.code != 0 || std::fs::read(&native_out)? != std::fs::read(&out)? {
            bail!(
                "the workers under --budget-scope {scope} did not reproduce the native output (exit {})",
                r.code
            );
        }
        let per: Vec<u64> = s[stats::PER_PROCESS]
            .as_array()
            .map(|p| p.iter().filter_map(|p| p[stats::PEAK_RESIDENT_BYTES].as_u64()).collect())
            .unwrap_or_default();
        let (label, resident) = match scope {
            "tree" => (
                format!("ztier run --budget {}M", BUDGET >> 20),
                format!("{:.0} together", s[merged::TREE_PEAK_HELD_BYTES].as_f64().unwrap_or(0.0) / 1e6),
            ),
            _ => (
                "  --budget-scope process".to_string(),
                format!(
                    "{} each ({:.0} in all)",
                    per.iter().map(|b| format!("{:.0}", *b as f64 / 1e6)).collect::<Vec<_>>().join("+"),
                    per.iter().sum::<u64>() as f64 / 1e6
                ),
            ),
        };
        println!(
            "{label:<26} {:>7.2} {resident:>30} {:>17}",
            s[merged::WALL_S].as_f64().unwrap_or(0.0),
            s[stats::PAGES_COMPRESSED].as_u64().unwrap_or(0)
        );
    }
    println!(
        "Outputs identical. One budget covers every process of the command (the parent and its\n\
         workers), as a memory cgroup's limit does; with --budget-scope process each has {}M of its own.",
        BUDGET >> 20
    );
    Ok(())
}

fn which(prog: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(prog)).find(|p| p.is_file())
}

/// Part 4: engine on an in-memory device that forgets unflushed writes.
fn blk_demo() -> Result<()> {
    use std::sync::Arc;
    use ztier_blk::backing::CrashBacking;
    use ztier_blk::engine::{CreateOptions, Engine};
    // 16 MiB of files from /usr/share (text) and /usr/bin (binaries), 4 MiB random.
    let mut text = Vec::new();
    for dir in ["/usr/share/doc", "/usr/share/perl5", "/usr/share/common-licenses"] {
        collect(Path::new(dir), &mut text, 12 << 20);
    }
    let mut bins = Vec::new();
    collect(Path::new("/usr/bin"), &mut bins, 4 << 20);
    let mut random = vec![0u8; 4 << 20];
    synth::fill(&mut random, synth::Kind::Random, &mut synth::Rng::new(4));
    let dev = Arc::new(CrashBacking::new());
    let o = CreateOptions {
        logical_size: 64 << 20,
        block_size: 4096,
        extent_size: 32768,
        codec: ztier_codec::CodecId::Lz4,
        physical: None,
    };
    let e = Engine::create(Box::new(dev.clone()), &o)?;
    let mut at = 0u64;
    let mut regions = Vec::new();
    for (name, data) in [("text", &text), ("binaries", &bins), ("random", &random)] {
        let len = data.len() / 4096 * 4096;
        e.write(at, &data[..len], false)?;
        regions.push((name, at, len));
        at += len as u64;
    }
    e.flush()?;
    let s = e.stats();
    println!(
        "wrote {:.1} MiB (text {:.1}, binaries {:.1}, random {:.1}) and flushed: {:.1} MiB stored, ratio {:.2}",
        at as f64 / 1048576.0,
        regions[0].2 as f64 / 1048576.0,
        regions[1].2 as f64 / 1048576.0,
        regions[2].2 as f64 / 1048576.0,
        s.data_stored_bytes as f64 / 1048576.0,
        s.ratio
    );
    // More writes, not flushed, then a crash that keeps none of them.
    e.write(0, &random[..1 << 20], false)?;
    let img = dev.crash(|_, _| 0);
    drop(e);
    let dev2 = Arc::new(CrashBacking::from_image(img));
    let t = std::time::Instant::now();
    let e2 = Engine::open(Box::new(dev2), false)?;
    let took = t.elapsed();
    let problems = e2.check()?;
    let mut ok = true;
    for (name, off, len) in &regions {
        let mut back = vec![0u8; *len];
        e2.read(*off, &mut back)?;
        let want = match *name {
            "text" => &text[..*len],
            "binaries" => &bins[..*len],
            _ => &random[..*len],
        };
        ok &= back == want;
    }
    println!(
        "crash after 1 MiB of unflushed writes: recovered in {:.1} ms ({} extents replayed), audit {}, \
         flushed data {}",
        took.as_secs_f64() * 1e3,
        e2.stats().recovered_extents,
        if problems.is_empty() { "clean".to_string() } else { format!("{} problems", problems.len()) },
        if ok { "intact" } else { "DIFFERS" }
    );
    if !ok || !problems.is_empty() {
        anyhow::bail!("recovery check failed");
    }
    println!("serve an image to NBD clients with: ztier blk create img --size 1G; ztier blk serve img");
    Ok(())
}

/// Appends regular files under `dir` to `out` until it holds `max` bytes.
fn collect(dir: &Path, out: &mut Vec<u8>, max: usize) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    let mut kids: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
    kids.sort();
    for k in kids {
        if out.len() >= max {
            return;
        }
        let Ok(md) = std::fs::symlink_metadata(&k) else { continue };
        if md.is_dir() {
            collect(&k, out, max);
        } else if md.is_file() && k.extension().is_none_or(|e| e != "gz" && e != "xz") {
            if let Ok(b) = std::fs::read(&k) {
                out.extend_from_slice(&b[..b.len().min(max - out.len())]);
            }
        }
    }
}

fn trace_demo() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("ztier-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = (|| -> Result<()> {
        let input = dir.join("lines.txt");
        let text: Vec<String> = (0..4_000u64)
            .map(|i| format!("{:016x} line {i}", i.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
            .collect();
        std::fs::write(&input, text.join("\n"))?;
        let trace = dir.join("sort.trace");
        let out = std::fs::File::create(&trace)?;
        let cmd: Vec<std::ffi::OsString> = vec!["sort".into(), "-o".into(), "/dev/null".into(), input.into()];
        let opts = ztier_sim::lackey::RecordOptions { snapshot_every: 20_000, ..Default::default() };
        let st = ztier_sim::lackey::record(&cmd, out, &opts)?;
        println!("recorded {} references and {} compression records\n", st.references, st.size_records);
        let info = ztier_sim::trace::info(std::io::BufReader::new(std::fs::File::open(&trace)?))?;
        let fp = info.distinct_pages as usize;
        let cfg = ztier_sim::sim::SweepConfig {
            memory_pages: (1..=5).map(|k| (fp * k / 5).max(2)).collect(),
            policies: vec!["none".into(), "static:0.25".into(), "kaplan".into()],
            disk_ms: vec![5.0, 0.1],
            codec: ztier_codec::CodecId::Lz4,
            threads: 2,
            ref_ns: 1.0,
            pager: Default::default(),
        };
        let r = ztier_sim::sim::sweep(&trace, &cfg, |_, _| {})?;
        print!("{}", ztier_sim::sim::render_table(&r));
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}
