//! `ztier bench codecs`.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use ztier_codec::bench::{self, BenchConfig, Report};
use ztier_codec::corpus::{self, Corpus};
use ztier_codec::CodecId;

/// Arguments of `ztier bench codecs`.
#[derive(Args, Debug)]
pub struct CodecsArgs {
    /// `.pages` files (whole 4 KiB pages, concatenated) to use as the corpus.
    #[arg(long, num_args = 1.., value_name = "F.pages")]
    pub corpus: Vec<PathBuf>,
    /// Sample a live process's private writable pages as the corpus
    /// (needs root or ptrace rights over the process).
    #[arg(long, value_name = "PID", conflicts_with = "corpus")]
    pub pid: Option<u32>,
    /// Most pages to sample with --pid.
    #[arg(long, default_value_t = 16384, value_name = "N")]
    pub max_pages: usize,
    /// Codecs to measure, comma-separated (default: every codec):
    /// wkdm, wk4x4, wk64, lzo, lz4, zstd, deflate, hybrid, raw.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub codecs: Vec<CodecId>,
    /// Report each corpus file on its own instead of all files together.
    #[arg(long)]
    pub each: bool,
    /// Minimum seconds of timing per codec and direction.
    #[arg(long, default_value_t = 0.5, value_name = "S")]
    pub seconds: f64,
    /// Print one JSON object on stdout (schema in docs/json.md) instead of a table.
    /// With --each: `{"files": [report, ...]}`.
    #[arg(long)]
    pub json: bool,
}

pub(crate) fn progress_bar(steps: usize, label: &str) -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let pb = ProgressBar::new(steps as u64);
    pb.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    pb.set_prefix(label.to_string());
    Some(pb)
}

/// Measures `corpus` with a progress bar on a terminal.
pub fn measure(corpus: &Corpus, cfg: &BenchConfig) -> Result<Report> {
    let pb = progress_bar(cfg.codecs.len() + 1, "bench codecs");
    let report = bench::run(corpus, cfg, |name, step, steps| {
        if let Some(pb) = &pb {
            pb.set_length(steps as u64);
            pb.set_position(step as u64);
            pb.set_message(name.to_string());
        }
    })?;
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    Ok(report)
}

/// The corpora named by `--corpus`/`--pid`/`--each`, shared by the
/// benchmarks: one per file with `each`, else all files as one.
pub(crate) fn load_corpora(
    files: &[PathBuf],
    pid: Option<u32>,
    max_pages: usize,
    each: bool,
    verb: &str,
) -> Result<Vec<Corpus>> {
    if let Some(pid) = pid {
        return Ok(vec![corpus::sample_pid(pid, max_pages)?]);
    }
    if files.is_empty() {
        bail!("give the pages to {verb}: --corpus F.pages [F2.pages ...] or --pid PID");
    }
    if each {
        files
            .iter()
            .map(|p| Corpus::load(std::slice::from_ref(p)).with_context(|| "loading corpus"))
            .collect()
    } else {
        Ok(vec![Corpus::load(files).with_context(|| "loading corpus")?])
    }
}

/// Runs `ztier bench codecs`.
pub fn run(a: CodecsArgs) -> Result<i32> {
    let cfg = BenchConfig {
        codecs: if a.codecs.is_empty() { CodecId::MEASURED.to_vec() } else { a.codecs.clone() },
        min_seconds: a.seconds,
        ..BenchConfig::default()
    };
    let corpora = load_corpora(&a.corpus, a.pid, a.max_pages, a.each, "measure")?;
    let mut reports = Vec::new();
    for c in &corpora {
        reports.push(measure(c, &cfg)?);
    }
    if a.json {
        let v =
            if a.each { serde_json::json!({ "files": reports }) } else { serde_json::to_value(&reports[0])? };
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        for r in &reports {
            println!("{}", bench::render_table(r));
        }
    }
    Ok(0)
}
