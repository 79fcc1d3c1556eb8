//! `ztier trace ...`: page traces of real programs.

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use ztier_codec::CodecId;
use ztier_sim::{lackey, trace};

/// Page-trace commands.
#[derive(Subcommand, Debug)]
pub enum TraceCommand {
    /// Run a command under valgrind lackey and write its page trace, with
    /// the compressed sizes of its real pages (compression records).
    ///
    /// Every N references the recorder reads the pages the program touched
    /// since the last snapshot from /proc/PID/mem, compresses each with
    /// every codec column and records the sizes at that point of the trace;
    /// the codecs' measured costs per page go into the header. Exits with
    /// the command's exit status. Valgrind slows programs ~100×: trace
    /// small runs.
    Record(RecordArgs),
    /// Convert a lackey log (`valgrind --tool=lackey --trace-mem=yes
    /// --log-file=LOG`) into a trace. It carries no compression records.
    ImportLackey(ImportArgs),
    /// Convert a `ztier run --fault-log` file into a trace of that run's
    /// faults (what `ztier sim --fault-log` replays).
    ///
    /// A store, zero or lost row becomes a write reference to its first
    /// page, a pin row one to each of its pages; deferred and wp rows none.
    /// A fault log has no hits and no sizes: every page that came back
    /// from the store is taken to compress to --size bytes.
    ImportFaults(ImportFaultsArgs),
    /// Summarise a trace: references, writes, footprint, compression records.
    Info(InfoArgs),
}

/// Arguments of `ztier trace import-faults`.
#[derive(Args, Debug)]
pub struct ImportFaultsArgs {
    /// A fault log (`ztier run --fault-log DIR` writes DIR/PID.csv).
    #[arg(value_name = "LOG.csv")]
    pub input: PathBuf,
    /// Trace file to write.
    #[arg(short, long, value_name = "T.trace")]
    pub output: PathBuf,
    /// Compressed size of a page that came back from the store, bytes.
    #[arg(long, default_value_t = 2048, value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub size: u16,
}

/// Writes the trace of the fault log `log` to `out`.
pub fn import_faults(
    log: &std::path::Path,
    out: &std::path::Path,
    opts: ztier_sim::faults::FaultTraceOptions,
) -> Result<ztier_sim::faults::FaultImport> {
    let text = std::fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
    let rows = ztier_run_core::faultlog::parse(&text).with_context(|| format!("{}", log.display()))?;
    write_whole(out, |w| Ok(ztier_sim::faults::import(&rows, w, opts)?))
}

/// Writes a trace to `out` through `write`, all or nothing: into
/// `OUT.partial` first, renamed over `out` only when `write` succeeded, so
/// a failed import neither leaves half a trace nor clobbers a good one.
fn write_whole<T>(out: &std::path::Path, write: impl FnOnce(BufWriter<File>) -> Result<T>) -> Result<T> {
    let mut partial = out.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let f = File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
    match write(BufWriter::new(f)) {
        Ok(v) => {
            std::fs::rename(&partial, out)
                .with_context(|| format!("renaming {} to {}", partial.display(), out.display()))?;
            Ok(v)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            Err(e)
        }
    }
}

/// Arguments of `ztier trace record`.
#[derive(Args, Debug)]
pub struct RecordArgs {
    /// Trace file to write.
    #[arg(short, long, value_name = "T.trace")]
    pub output: PathBuf,
    /// Codec columns to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "wkdm,lz4,zstd", value_name = "LIST")]
    pub codecs: Vec<CodecId>,
    /// References between memory snapshots.
    #[arg(long, default_value_t = 1_000_000, value_name = "N")]
    pub snapshot_every: u64,
    /// Where the program's heap blocks lie in the trace: `run` puts them
    /// where `ztier run` does (its preload library's size classes,
    /// loaded in an allocation-only mode), `glibc` where glibc's malloc
    /// does. The library starts as in a run, after ZTIER_START_AFTER
    /// bytes (default 1 MiB; set 0 to compare with runs that set 0).
    #[arg(long, value_enum, default_value_t = Layout::Run)]
    pub layout: Layout,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<OsString>,
}

/// The heap layout `ztier trace record` traces.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `ztier run`'s (the preload library's allocator).
    Run,
    /// glibc's malloc.
    Glibc,
}

/// Arguments of `ztier trace import-lackey`.
#[derive(Args, Debug)]
pub struct ImportArgs {
    /// Lackey log (`-` for stdin).
    #[arg(value_name = "LOG")]
    pub input: PathBuf,
    /// Trace file to write.
    #[arg(short, long, value_name = "T.trace")]
    pub output: PathBuf,
}

/// Arguments of `ztier trace info`.
#[derive(Args, Debug)]
pub struct InfoArgs {
    /// The trace.
    #[arg(value_name = "T.trace")]
    pub trace: PathBuf,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs a trace command.
pub fn run(c: TraceCommand) -> Result<i32> {
    match c {
        TraceCommand::Record(a) => {
            if a.snapshot_every == 0 {
                bail!("--snapshot-every must be at least 1");
            }
            let out = File::create(&a.output).with_context(|| format!("creating {}", a.output.display()))?;
            let opts = lackey::RecordOptions {
                codecs: a.codecs,
                snapshot_every: a.snapshot_every,
                output_path: Some(a.output.clone()),
                preload: match a.layout {
                    Layout::Run => Some(crate::launch::preload_path()?),
                    Layout::Glibc => None,
                },
            };
            let st = lackey::record(&a.cmd, out, &opts)?;
            eprintln!(
                "ztier trace: {} references, {} compression records -> {}",
                st.references,
                st.size_records,
                a.output.display()
            );
            Ok(st.exit_code.unwrap_or(1))
        }
        TraceCommand::ImportLackey(a) => {
            let input: Box<dyn std::io::BufRead> = if a.input.as_os_str() == "-" {
                Box::new(std::io::stdin().lock())
            } else {
                let f = File::open(&a.input).with_context(|| format!("opening {}", a.input.display()))?;
                Box::new(BufReader::with_capacity(1 << 20, f))
            };
            let st = write_whole(&a.output, |out| Ok(lackey::import(input, out)?))?;
            eprintln!(
                "ztier trace: {} lines, {} references -> {}",
                st.lines,
                st.references,
                a.output.display()
            );
            Ok(0)
        }
        TraceCommand::ImportFaults(a) => {
            let opts = ztier_sim::faults::FaultTraceOptions { size: a.size, ..Default::default() };
            let st = import_faults(&a.input, &a.output, opts)?;
            eprintln!(
                "ztier trace: {} rows, {} references, {} pages sized -> {}",
                st.rows,
                st.references,
                st.stored_pages,
                a.output.display()
            );
            Ok(0)
        }
        TraceCommand::Info(a) => {
            let f = File::open(&a.trace).with_context(|| format!("opening {}", a.trace.display()))?;
            let i = trace::info(BufReader::with_capacity(1 << 20, f))
                .with_context(|| format!("reading {}", a.trace.display()))?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&i)?);
            } else {
                println!("references      {}", i.references);
                println!("writes          {}", i.writes);
                println!("distinct pages  {}", i.distinct_pages);
                println!("size records    {}", i.size_records);
                if i.unmanaged_pages > 0 {
                    println!(
                        "unmanaged pages {} (mapped from files, or the stack: not ztier run's)",
                        i.unmanaged_pages
                    );
                }
                for (k, c) in i.codecs.iter().enumerate() {
                    let m = i.mean_sizes[k];
                    println!(
                        "{c:<8} mean size {m:.0} B (ratio {:.2}), {} ns/page compress, {} ns/page decompress",
                        4096.0 / m.max(1.0),
                        i.compress_ns[k],
                        i.decompress_ns[k]
                    );
                }
            }
            Ok(0)
        }
    }
}
