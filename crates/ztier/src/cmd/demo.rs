//! `ztier demo`: the flagship end-to-end demonstration on built-in defaults.
//!
//! Today it compares every page codec on the real memory pages of the
//! bundled corpus (`../shared/corpus/*.pages` next to the repository, or
//! `--corpus DIR`), one table per corpus file. When no corpus is found it
//! samples its own process and synthetic pages, and says so.

use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Args;
use ztier_codec::bench::BenchConfig;
use ztier_codec::corpus::{synth, Corpus};

use super::bench_codecs::measure;

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
    println!("ztier demo: page codecs on real memory pages\n");
    println!("Each row compresses every page of the corpus with one codec, decompresses it and");
    println!("checks it byte for byte. ratio = bytes in / bytes stored; speeds in MB/s of");
    println!("uncompressed data; ×cpy = time relative to memcpy of the same pages.\n");
    let files = a.corpus.clone().or_else(find_corpus_dir).map(|d| pages_in(&d)).unwrap_or_default();
    if files.is_empty() {
        println!("(no corpus found: using this process's own pages plus synthetic heap-like pages)\n");
        let mut data = synth::corpus(2048, 1).bytes().to_vec();
        if let Ok(own) = ztier_codec::corpus::sample_pid(std::process::id(), 2048) {
            data.extend_from_slice(own.bytes());
        }
        let r = measure(&Corpus::from_bytes("synthetic+self", data), &cfg)?;
        println!("{}", ztier_codec::bench::render_table(&r));
        return Ok(0);
    }
    for f in files {
        let c = Corpus::load(std::slice::from_ref(&f))?;
        let r = measure(&c, &cfg)?;
        println!("{}", ztier_codec::bench::render_table(&r));
    }
    Ok(0)
}
