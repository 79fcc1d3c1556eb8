//! Hybrid's compression against C LZ4, paired finely enough to tell a few
//! per cent apart on a loaded machine.
//!
//! ```text
//! cargo run --release -p ztier-codec --example hybrid_vs_lz4 -- [--passes N] FILE.pages...
//! ```
//!
//! Per file (zero and same-filled pages left out, as `ztier bench codecs`
//! does): each pass walks the pages in chunks of 32 and compresses each
//! chunk with LZ4 and with hybrid (tagged form, as the page store stores
//! it), alternating which goes first. Time is the thread's CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`), so time spent waiting for a CPU on a
//! shared machine is not counted, and the two codecs see the same load
//! within a millisecond of each other. Prints hybrid's ratio over LZ4's,
//! its compress speed over LZ4's (all passes together and the median
//! pass), and how hybrid chose ([`HybridStats`] over all passes).
//! `ztier bench codecs` stays the reference measurement (whole passes,
//! every codec, both directions); this one answers "is hybrid's
//! compression as fast as LZ4's" where that one's passes are too far apart
//! in time.

use std::path::PathBuf;

use ztier_codec::corpus::Corpus;
use ztier_codec::hybrid::{Hybrid, HybridStats};
use ztier_codec::{new_codec, samefill, Codec, CodecId};

/// The calling thread's CPU time in nanoseconds.
fn thread_ns() -> u128 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a
    // constant the kernel knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}

/// Compresses `pages` with `codec` into `out`: (CPU ns, bytes stored, a
/// page costing at most its size).
fn timed(codec: &mut dyn Codec, pages: &[&[u8]], out: &mut [u8]) -> (u128, usize) {
    let start = thread_ns();
    let mut bytes = 0;
    for p in pages {
        let (n, _) = codec.compress_tagged(p, out).expect("compress into a buffer of the codec's bound");
        bytes += n.min(p.len());
    }
    (thread_ns() - start, bytes)
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut passes = 7usize;
    if let Some(i) = args.iter().position(|a| a == "--passes") {
        passes = args.get(i + 1).and_then(|v| v.parse().ok()).expect("--passes N");
        args.drain(i..i + 2);
    }
    assert!(!args.is_empty(), "usage: hybrid_vs_lz4 [--passes N] FILE.pages...");
    for file in args.iter().map(PathBuf::from) {
        let corpus = Corpus::load(std::slice::from_ref(&file)).expect("read the corpus file");
        let work: Vec<&[u8]> = corpus.pages().filter(|p| samefill::detect(p).is_none()).collect();
        let mut lz4 = new_codec(CodecId::Lz4);
        let mut hybrid = Hybrid::default();
        let mut out_l = vec![0u8; lz4.max_compressed_len(ztier_codec::PAGE_SIZE)];
        let mut out_h = vec![0u8; hybrid.max_compressed_len(ztier_codec::PAGE_SIZE)];
        let (mut all_l, mut all_h) = (0u128, 0u128);
        let (mut bytes_l, mut bytes_h) = (0usize, 0usize);
        let mut per_pass = Vec::new();
        for pass in 0..passes {
            let (mut tl, mut th) = (0u128, 0u128);
            (bytes_l, bytes_h) = (0, 0);
            for (k, chunk) in work.chunks(32).enumerate() {
                let ((a, na), (b, nb)) = if (k + pass) % 2 == 0 {
                    let l = timed(lz4.as_mut(), chunk, &mut out_l);
                    (l, timed(&mut hybrid, chunk, &mut out_h))
                } else {
                    let h = timed(&mut hybrid, chunk, &mut out_h);
                    (timed(lz4.as_mut(), chunk, &mut out_l), h)
                };
                (tl, th) = (tl + a, th + b);
                (bytes_l, bytes_h) = (bytes_l + na, bytes_h + nb);
            }
            (all_l, all_h) = (all_l + tl, all_h + th);
            per_pass.push(tl as f64 / th as f64);
        }
        per_pass.sort_by(f64::total_cmp);
        let HybridStats {
            first_fast,
            zero_heavy,
            first_after_try,
            second_after_try,
            in_run,
            rechecks,
            run_broken,
        } = hybrid.stats;
        println!(
            "{}: {} pages; hybrid ratio x LZ4 {:.6} ({} bytes against {} in the last pass); \
             compress x LZ4 {:.3} over {passes} passes, median pass {:.3} (range {:.3}-{:.3}); \
             first_fast {first_fast} zero_heavy {zero_heavy} first_after_try {first_after_try} \
             second_after_try {second_after_try} in_run {in_run} rechecks {rechecks} run_broken {run_broken}",
            file.display(),
            work.len(),
            bytes_l as f64 / bytes_h as f64,
            bytes_h,
            bytes_l,
            all_l as f64 / all_h as f64,
            per_pass[per_pass.len() / 2],
            per_pass[0],
            per_pass[per_pass.len() - 1],
        );
    }
}
