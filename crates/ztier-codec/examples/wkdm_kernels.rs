//! Every WKdm kernel this build and CPU run, against C LZ4, on corpus
//! files: compress and decompress speed as ratios to LZ4 measured in the
//! same run, interleaved pass by pass (kernel, LZ4, next kernel, ...), the
//! median of the passes reported.
//!
//! ```text
//! cargo run --release -p ztier-codec --example wkdm_kernels -- ../shared/corpus/*.pages
//! cargo run --release -p ztier-codec --features avx512 --example wkdm_kernels -- FILE...
//! ```
//!
//! `--passes N` sets the passes (default 15), `--kernels LIST` which
//! kernels run (default: all); `--decode-only KERNEL` runs
//! just that kernel's decoder (or `lz4`'s) over the pages, `--encode-only
//! KERNEL` its encoder, N times each (for instruction counts under valgrind, whose
//! CPU has no AVX-512).
//!
//! The official numbers are `ztier bench codecs --each`'s; this is for
//! comparing kernels in one process.

use std::hint::black_box;
use std::time::Instant;

use ztier_codec::corpus::Corpus;
use ztier_codec::lz4::Lz4;
use ztier_codec::samefill;
use ztier_codec::wkdm::{Kernel, Wkdm};
use ztier_codec::{Codec, PAGE_SIZE};

/// A codec's pages, compressed once.
struct Pages {
    data: Vec<u8>,
    sizes: Vec<usize>,
    bound: usize,
}

fn compress_all(c: &mut dyn Codec, pages: &[&[u8]]) -> Pages {
    let bound = c.max_compressed_len(PAGE_SIZE);
    let mut data = vec![0u8; bound * pages.len()];
    let sizes = pages
        .iter()
        .zip(data.chunks_exact_mut(bound))
        .map(|(p, out)| c.compress(p, out).expect("compress into a bound-sized buffer"))
        .collect();
    Pages { data, sizes, bound }
}

fn decompress_all(c: &mut dyn Codec, p: &Pages, back: &mut [u8]) {
    for (i, &n) in p.sizes.iter().enumerate() {
        c.decompress(black_box(&p.data[i * p.bound..i * p.bound + n]), back).expect("decompress");
        black_box(&mut *back);
    }
}

fn median(mut t: Vec<f64>) -> f64 {
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut passes = 15;
    let mut wanted: Option<Vec<Kernel>> = None;
    // (decode?, kernel; None for LZ4)
    let mut only: Option<(bool, Option<Kernel>)> = None;
    while let Some(i) = args.iter().position(|a| a.starts_with("--")) {
        let flag = args.remove(i);
        let value = args.remove(i);
        match flag.as_str() {
            "--passes" => passes = value.parse().expect("--passes N"),
            "--kernels" => {
                wanted = Some(value.split(',').map(|k| k.parse().expect("a kernel name")).collect())
            }
            "--decode-only" | "--encode-only" => {
                let k = (value != "lz4").then(|| value.parse().expect("a kernel name or lz4"));
                only = Some((flag == "--decode-only", k));
            }
            _ => panic!("unknown option {flag}"),
        }
    }
    assert!(
        !args.is_empty(),
        "usage: wkdm_kernels [--passes N] [--decode-only|--encode-only KERNEL] FILE..."
    );
    let kernels: Vec<Kernel> = Kernel::ALL
        .into_iter()
        .filter(|k| k.available() && wanted.as_ref().is_none_or(|w| w.contains(k)))
        .collect();
    println!("kernels this build and CPU run: {:?}", kernels.iter().map(|k| k.name()).collect::<Vec<_>>());
    for file in &args {
        let corpus = Corpus::load(&[file.into()]).expect("a .pages file");
        let pages: Vec<&[u8]> = corpus.pages().filter(|p| samefill::detect(p).is_none()).collect();
        let mut back = vec![0u8; PAGE_SIZE];
        if let Some((decode, k)) = only {
            let mut c: Box<dyn Codec> = match k {
                Some(k) => Box::new(Wkdm::with_kernel(k).expect("a kernel this build and CPU run")),
                None => Box::new(Lz4::new(1)),
            };
            let compressed = compress_all(c.as_mut(), &pages);
            for _ in 0..passes {
                if decode {
                    decompress_all(c.as_mut(), &compressed, &mut back);
                } else {
                    black_box(compress_all(c.as_mut(), &pages));
                }
            }
            continue;
        }
        let mut lz4 = Lz4::new(1);
        let lz = compress_all(&mut lz4, &pages);
        let mut codecs: Vec<(Wkdm, Pages)> = kernels
            .iter()
            .map(|&k| {
                let mut c = Wkdm::with_kernel(k).expect("available");
                let p = compress_all(&mut c, &pages);
                (c, p)
            })
            .collect();
        // Interleaved passes: per pass, each kernel then LZ4, both ways.
        let n = kernels.len();
        let (mut enc, mut dec) = (vec![Vec::new(); n], vec![Vec::new(); n]);
        let (mut lz_enc, mut lz_dec) = (vec![Vec::new(); n], vec![Vec::new(); n]);
        let time = |f: &mut dyn FnMut()| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        };
        for _ in 0..passes {
            for (i, (c, p)) in codecs.iter_mut().enumerate() {
                dec[i].push(time(&mut || decompress_all(c, p, &mut back)));
                lz_dec[i].push(time(&mut || decompress_all(&mut lz4, &lz, &mut back)));
                enc[i].push(time(&mut || drop(black_box(compress_all(c, &pages)))));
                lz_enc[i].push(time(&mut || drop(black_box(compress_all(&mut lz4, &pages)))));
            }
        }
        let mb = |t: f64| (pages.len() * PAGE_SIZE) as f64 / t / 1e6;
        println!("{file} ({} pages, {passes} passes)", pages.len());
        for (i, k) in kernels.iter().enumerate() {
            let (e, d) = (median(enc[i].clone()), median(dec[i].clone()));
            let (le, ld) = (median(lz_enc[i].clone()), median(lz_dec[i].clone()));
            println!(
                "  {:<7} compress {:>5.0} MB/s = {:.2}x LZ4 ({:.0}), decompress {:>5.0} MB/s = {:.2}x LZ4 ({:.0})",
                k.name(),
                mb(e),
                le / e,
                mb(le),
                mb(d),
                ld / d,
                mb(ld)
            );
        }
    }
}
