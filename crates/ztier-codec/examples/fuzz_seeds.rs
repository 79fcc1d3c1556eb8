//! Writes the seed inputs of the codec fuzz targets (`fuzz/seeds/TARGET/`)
//! from corpus files: real pages, and real output of every codec on them.
//!
//! ```text
//! cargo run --release -p ztier-codec --example fuzz_seeds -- OUT_DIR F.pages...
//! ```
//!
//! From each file, `PAGES` pages evenly spread over it (zero and
//! same-filled pages left out: no codec sees those):
//!
//! - `roundtrip`, `decode_mutated`, `dirty_output`: the pages as they are;
//! - `decode_any`: a selector byte, then one codec's output, for every
//!   codec but `raw` (whose output is the page) on `COMPRESSED` of the
//!   pages;
//! - `wkdm_kernels`: the pages, and a selector byte then WKdm's output of
//!   `COMPRESSED` of them.
//!
//! A file's name says where it came from: `FILE-PAGE` or
//! `FILE-PAGE-CODEC`. The same input for two targets is the same file
//! content (one object in git).

use std::path::{Path, PathBuf};

use ztier_codec::corpus::Corpus;
use ztier_codec::{new_codec, samefill, CodecId};

/// Pages taken from each corpus file.
const PAGES: usize = 32;
/// Of those, how many each codec's output is taken of.
const COMPRESSED: usize = 16;

fn write(dir: &Path, target: &str, name: &str, data: &[u8]) {
    let d = dir.join(target);
    std::fs::create_dir_all(&d).expect("create the seed directory");
    std::fs::write(d.join(name), data).expect("write a seed");
}

fn main() {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let (out, files) = args.split_first().expect("usage: fuzz_seeds OUT_DIR F.pages...");
    assert!(!files.is_empty(), "usage: fuzz_seeds OUT_DIR F.pages...");
    let mut codecs: Vec<_> =
        CodecId::ALL.into_iter().filter(|&id| id != CodecId::Raw).map(new_codec).collect();
    let mut written = 0;
    for f in files {
        let corpus = Corpus::load(std::slice::from_ref(f)).expect("a .pages file");
        let stem = f.file_stem().and_then(|s| s.to_str()).unwrap_or("pages").to_string();
        let pages: Vec<(usize, &[u8])> =
            corpus.pages().enumerate().filter(|(_, p)| samefill::detect(p).is_none()).collect();
        let step = (pages.len() / PAGES).max(1);
        for (k, &(i, page)) in pages.iter().step_by(step).take(PAGES).enumerate() {
            let name = format!("{stem}-{i}");
            for target in ["roundtrip", "decode_mutated", "dirty_output", "wkdm_kernels"] {
                write(out, target, &name, page);
                written += 1;
            }
            if k % (PAGES / COMPRESSED) != 0 {
                continue;
            }
            for c in codecs.iter_mut() {
                let mut buf = vec![0u8; 1 + c.max_compressed_len(page.len())];
                // The selector: decode_any's fifth output length (1 KiB
                // here), wkdm_kernels' short output buffer (a share of the
                // bound that varies by page).
                buf[0] = if c.id() == CodecId::Wkdm { (37 * k % 256) as u8 } else { 255 };
                let n = c.compress(page, &mut buf[1..]).expect("compress into a bound-sized buffer");
                let name = format!("{name}-{}", c.id().name());
                write(out, "decode_any", &name, &buf[..1 + n]);
                written += 1;
                if c.id() == CodecId::Wkdm {
                    write(out, "wkdm_kernels", &name, &buf[..1 + n]);
                    written += 1;
                }
            }
        }
    }
    println!("{written} seeds written under {}", out.display());
}
