//! `ztier demo`: the flagship end-to-end demonstration on built-in defaults.
//!
//! Today, on the real memory pages of the bundled corpus
//! (`../shared/corpus/*.pages` next to the repository, or `--corpus DIR`):
//! part 1 compares every page codec, one table per corpus file; part 2
//! runs the compressed page store with each allocator (cells of 1, 2 and
//! 4 pages, chunks, size classes) past its budget on the same pages. When
//! no corpus is found it uses its own process's and synthetic pages, and
//! says so.

use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Args;
use ztier_codec::bench::BenchConfig;
use ztier_codec::corpus::{synth, Corpus};

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
    println!("\neff.rat = original bytes / all memory used; vs.cod = store put+get / codec alone.");
    println!("More: ztier bench store --help, ztier bench codecs --help.");
    Ok(0)
}
