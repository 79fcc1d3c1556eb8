//! `ztier sim`: the trace-driven simulator.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use ztier_codec::CodecId;
use ztier_sim::sim::{self, SweepConfig};

use crate::units::parse_size_list;

/// Arguments of `ztier sim`.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["trace", "fault_log"])))]
#[command(after_long_help = "Examples:\n  \
    ztier sim --trace python-dict.trace --policy none,static:0.25,kaplan,shipped,shipped+kaplan\n  \
    ztier run --budget 64M --fault-log faults -- python3 job.py\n  \
    ztier sim --fault-log faults/12345.csv --memory 64M,96M,128M --policy shipped,fifo\n\n\
A policy is a replacement, a prefetch and a sizing policy joined by '+', in any\n\
order (see --policy); shipped = segmented+walk, what `ztier run` does. Fault-driven\n\
policies (segmented, fifo) are replayed through a model of ztier run's pager, which\n\
sees faults only; lru sees every reference (the 1999 model). Without a sizing\n\
policy a fault-driven pager's store is beside the memory (as ztier run's --store\n\
is beside --budget); with one the memory holds both, split by it.\n\
A fault log (ztier run --fault-log) holds the run's misses only: replayed, it\n\
predicts what a fault-driven policy does at its budget and above, not what lru\n\
would do, nor a smaller budget; it has no sizes (a page is taken to compress\n\
to half).")]
pub struct SimArgs {
    /// Trace recorded with `ztier trace record` (it must carry compression
    /// records for the codec).
    #[arg(long, value_name = "T.trace")]
    pub trace: Option<PathBuf>,
    /// A `ztier run --fault-log` file (DIR/PID.csv), replayed as a trace of
    /// that run's faults (see `ztier trace import-faults`).
    #[arg(long, value_name = "LOG.csv")]
    pub fault_log: Option<PathBuf>,
    /// Memory sizes: a list (`1M,2M,4M`) or a range `A..B:STEP` (`1M..8M:1M`).
    /// Default: 10 sizes from 10% to 100% of the trace's footprint.
    #[arg(long, value_name = "LIST")]
    pub memory: Option<String>,
    /// Policies, comma-separated, each a replacement, a prefetch and a
    /// sizing policy joined by '+' (any part may be left out). Replacement:
    /// segmented (the one `ztier run` ships), fifo, lru (sees every
    /// reference; the default when only a sizing policy is named).
    /// Prefetch: walk (shipped), single. Sizing: none, static:FRACTION (of
    /// memory kept compressed), kaplan (1999 cost/benefit), castro (2003
    /// expense/profit; castro-aggressive and castro-sluggish: the paper's
    /// two other variants), pressure (refault vs stall feedback); SIZING+
    /// clean-disable adds de Castro's switch that stops compressing clean
    /// pages while it does not pay (`kaplan+clean-disable`). shipped =
    /// segmented+walk.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "none,static:0.25,kaplan,castro",
        value_name = "LIST"
    )]
    pub policy: Vec<String>,
    /// Codec whose compressed sizes and measured costs to use.
    #[arg(long, default_value = "lz4", value_name = "C")]
    pub codec: CodecId,
    /// Cost of a fault in milliseconds, comma-separated (the 1999
    /// sensitivity study: 5, 2.5, 1.25, 0.625; 0.1 for an SSD).
    #[arg(long, value_delimiter = ',', default_value = "5,2.5,1.25,0.625,0.1", value_name = "LIST")]
    pub disk_ms: Vec<f64>,
    /// Replays run in parallel (default: CPUs).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Estimated run time per traced data reference without paging, in
    /// nanoseconds: marks the interesting range (memory sizes where no
    /// compression spends 1%..90% of its time paging) and is the program's
    /// clock for the background evictor's pipeline (fault-driven policies).
    #[arg(long, default_value_t = 1.0, value_name = "NS")]
    pub ref_ns: f64,
    /// Fault-driven policies: evict the background evictor's victims the
    /// moment they are chosen, instead of modelling its pipeline (victims
    /// stay in memory until their batch is compressed; a write takes one
    /// back, counted as `taken_back`).
    #[arg(long)]
    pub no_pipeline: bool,
    /// Fault-driven policies: the background evictor never runs, every
    /// eviction is a fault's, inline (down to the budget less one batch
    /// instead of less the reserve): what a machine too loaded to give
    /// the evictor a CPU does to `ztier run`. The default and this bound
    /// the run's store faults on a loaded machine.
    #[arg(long)]
    pub no_background: bool,
    /// Stored pages a sequential walk brings in, as `ztier run --prefetch`
    /// (fault-driven policies).
    #[arg(long, default_value_t = ztier_policy::walk::SHIPPED_PREFETCH as u32,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub prefetch: u32,
    /// As `ztier run --clean`: verify (pages faulted back into probation
    /// keep their stored copies, and cost no compression when evicted
    /// unwritten) or off (fault-driven policies; wp counts as verify).
    #[arg(long, default_value = "verify", value_parser = ["verify", "wp", "off"])]
    pub clean: String,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also write the plots (paging time and normalised paging time
    /// against memory) to this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

/// Runs `ztier sim`.
pub fn run(a: SimArgs) -> Result<i32> {
    // A fault log is replayed as a trace of its faults, written aside.
    let _converted;
    let trace = match (&a.trace, &a.fault_log) {
        (Some(t), _) => t.clone(),
        (None, Some(log)) => {
            let d = crate::scratch::TempDir::new("sim-faults")?;
            let t = d.path().join("faults.trace");
            super::trace::import_faults(log, &t, ztier_sim::faults::FaultTraceOptions::default())?;
            _converted = d;
            t
        }
        (None, None) => bail!("give --trace or --fault-log"),
    };
    let memory_pages: Vec<usize> = match &a.memory {
        Some(list) => parse_size_list(list)?
            .into_iter()
            .map(|b| {
                if b < 2 * 4096 {
                    bail!("memory size {b} bytes: at least 8K (2 pages)");
                }
                Ok((b / 4096) as usize)
            })
            .collect::<Result<_>>()?,
        None => {
            let f = std::fs::File::open(&trace).with_context(|| format!("opening {}", trace.display()))?;
            let i = ztier_sim::trace::info(std::io::BufReader::with_capacity(1 << 20, f))
                .with_context(|| format!("reading {}", trace.display()))?;
            let fp = i.distinct_pages as usize;
            let mut v: Vec<usize> = (1..=10).map(|k| (fp * k / 10).max(2)).collect();
            v.dedup();
            v
        }
    };
    if let Some(p) = &a.plot {
        if p.extension().is_none_or(|e| e != "svg") {
            bail!("--plot writes SVG: give a FILE.svg");
        }
    }
    let cfg = SweepConfig {
        memory_pages,
        policies: a.policy.clone(),
        disk_ms: a.disk_ms.clone(),
        codec: a.codec,
        threads: a.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        ref_ns: a.ref_ns,
        pager: ztier_sim::pager::PagerOptions {
            prefetch: a.prefetch as usize,
            verify: a.clean != "off",
            pipeline: (!a.no_pipeline).then(|| ztier_sim::pager::Pipeline {
                ref_ns: a.ref_ns,
                ..ztier_sim::pager::Pipeline::default()
            }),
            background: !a.no_background,
        },
    };
    let pb = std::io::stderr().is_terminal().then(|| {
        let pb = ProgressBar::new(0);
        pb.set_style(
            ProgressStyle::with_template("sim [{bar:30}] {pos}/{len} replays {elapsed}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        pb
    });
    let report = sim::sweep(&trace, &cfg, |done, total| {
        if let Some(pb) = &pb {
            pb.set_length(total as u64);
            pb.set_position(done as u64);
        }
    })
    .with_context(|| format!("simulating {}", a.fault_log.as_ref().unwrap_or(&trace).display()))?;
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    if let Some(p) = &a.plot {
        ztier_sim::plot::write_svg(&report, p).map_err(anyhow::Error::msg)?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", sim::render_table(&report));
    }
    Ok(0)
}
