//! `ztier bench store`.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use ztier_codec::corpus::Corpus;
use ztier_codec::CodecId;
use ztier_store::alloc::AllocatorKind;
use ztier_store::bench::{self, StoreBenchConfig, StoreReport};

use super::bench_codecs::{load_corpora, progress_bar};
use crate::units::parse_size;

/// The allocators `--allocator all` compares (de Castro's cell1/cell2/cell4
/// view plus chunks and size classes).
pub const ALL: [AllocatorKind; 5] = [
    AllocatorKind::Cells(1),
    AllocatorKind::Cells(2),
    AllocatorKind::Cells(4),
    AllocatorKind::Chunks,
    AllocatorKind::Classes,
];

/// Arguments of `ztier bench store`.
#[derive(Args, Debug)]
pub struct StoreArgs {
    /// `.pages` files (whole 4 KiB pages, concatenated) to use as the corpus.
    #[arg(long, num_args = 1.., value_name = "F.pages")]
    pub corpus: Vec<PathBuf>,
    /// Sample a live process's private writable pages as the corpus.
    #[arg(long, value_name = "PID", conflicts_with = "corpus")]
    pub pid: Option<u32>,
    /// Most pages to sample with --pid.
    #[arg(long, default_value_t = 16384, value_name = "N")]
    pub max_pages: usize,
    /// Allocators, comma-separated: cells (2-page cells), cells1..cells16,
    /// chunks, classes, or `all` (cells1, cells2, cells4, chunks, classes).
    #[arg(long, value_delimiter = ',', default_value = "classes", value_name = "LIST")]
    pub allocator: Vec<String>,
    /// Page codec: wkdm, wk4x4, wk64, lzo, lz4, zstd, deflate, hybrid.
    #[arg(long, default_value = "lz4", value_name = "C")]
    pub codec: CodecId,
    /// Store budget (e.g. 8M, 512K); default: half the corpus's compressed
    /// size, so that the store runs full and evicts.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub budget: Option<u64>,
    /// Threads for the scaling run (default: CPUs).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Operations of the mixed workload (default: 4 × pages, at least 20000).
    #[arg(long, value_name = "N")]
    pub ops: Option<usize>,
    /// Keys per corpus page: a workload `scale` times the corpus (key k
    /// starts with page k mod pages), for steady state at larger budgets.
    #[arg(long, default_value_t = 1, value_name = "R")]
    pub scale: usize,
    /// Report each corpus file on its own instead of all files together.
    #[arg(long)]
    pub each: bool,
    /// Print JSON instead of a table: one object for one corpus and one
    /// allocator, else `{"results": [object, ...]}`.
    #[arg(long)]
    pub json: bool,
}

fn allocators(names: &[String]) -> Result<Vec<AllocatorKind>> {
    let mut v = Vec::new();
    for n in names {
        if n == "all" {
            v.extend(ALL);
        } else {
            v.push(n.parse::<AllocatorKind>().map_err(anyhow::Error::msg)?);
        }
    }
    if v.is_empty() {
        bail!("give at least one allocator");
    }
    Ok(v)
}

/// Runs the benchmark for each allocator on `corpus`, with progress.
pub fn measure(
    corpus: &Corpus,
    kinds: &[AllocatorKind],
    base: &StoreBenchConfig,
) -> Result<Vec<StoreReport>> {
    let pb = progress_bar(kinds.len() * 5, "store");
    let mut out = Vec::new();
    for &k in kinds {
        let cfg = StoreBenchConfig { allocator: k, ..base.clone() };
        let r = bench::run(corpus, &cfg, |phase| {
            if let Some(pb) = &pb {
                pb.inc(1);
                pb.set_message(format!("{} {phase}", k.name()));
            }
        })
        .with_context(|| format!("store benchmark with {}", k.name()))?;
        out.push(r);
    }
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    Ok(out)
}

/// Runs `ztier bench store`.
pub fn run(a: StoreArgs) -> Result<i32> {
    let kinds = allocators(&a.allocator)?;
    let corpora = load_corpora(&a.corpus, a.pid, a.max_pages, a.each, "store")?;
    if a.scale == 0 || a.scale > 1024 {
        bail!("--scale must be 1..=1024");
    }
    if a.threads == Some(0) {
        bail!("--threads must be at least 1");
    }
    let base = StoreBenchConfig {
        codec: a.codec,
        budget: a.budget.map(|b| b as usize),
        threads: a.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        mixed_ops: a.ops.unwrap_or(0),
        scale: a.scale,
        ..StoreBenchConfig::new(kinds[0])
    };
    let mut reports = Vec::new();
    for c in &corpora {
        reports.extend(measure(c, &kinds, &base)?);
    }
    if a.json {
        let v = if reports.len() == 1 {
            serde_json::to_value(&reports[0])?
        } else {
            serde_json::json!({ "results": reports })
        };
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", bench::render_table(&reports));
        println!(
            "\neff.rat = original bytes / all memory used; mem/cmp = memory used / compressed bytes; \
             alloc/c = the same without store entry metadata;\nmeta/p = metadata bytes per page; \
             put/s, get/s = 1 thread, mixed workload (gets that hit); vs.cod = put+get pairs / codec \
             encode+decode pairs;\nmixed1/s, mixedN/s = mixed workload ops/s on 1 and {} threads; \
             cmpct.ms = one full compaction at the end.",
            base.threads
        );
    }
    Ok(0)
}
