//! The cost of `Store::get_run` a page, the way `ztier run` reads a
//! prefetched run: runs of R pages at random places in a store of N
//! pages, each run taken out (`exclusive`) and put back after (the put
//! not timed).
//!
//! ```text
//! cargo run --release -p ztier-store --example get_run -- CORPUS.pages [N [R [REPS]]]
//! ```
//!
//! The N pages are the corpus's pages over and over (N = 150,000 and
//! R = 8 by default: about the corpus builder's store at 256M, and its
//! prefetch). They are put in a shuffled order, so that neighbours in a
//! run are not neighbours in the store's slab, as after a real run's
//! evictions and faults.

use std::time::Instant;

use ztier_store::{Key, PoolKind, PoolOptions, PutFlags, Store, StoreConfig};

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(corpus) = args.next() else {
        eprintln!("usage: get_run CORPUS.pages [N [R [REPS]]]");
        std::process::exit(2);
    };
    let mut num = |default: usize| args.next().map_or(default, |s| s.parse().expect("a number"));
    let (n, run, reps) = (num(150_000), num(8), num(100_000));
    let corpus = std::fs::read(&corpus).unwrap_or_else(|e| panic!("reading {corpus}: {e}"));
    let pages: Vec<&[u8]> = corpus.chunks_exact(4096).collect();
    assert!(!pages.is_empty() && n > run, "an empty corpus, or N not above R");

    let store = Store::new(StoreConfig::new(1 << 30));
    let pool =
        store.create_pool(PoolOptions { store_raw: true, ..PoolOptions::new(PoolKind::Persistent) }).unwrap();
    let key = |i: usize| Key { pool, object: 1, index: i as u32 };
    let mut x: u64 = 88172645463325252;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as usize
    };
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, rnd() % (i + 1));
    }
    for &i in &order {
        store.put(key(i), pages[i % pages.len()], PutFlags::default()).unwrap();
    }

    let mut out = vec![0u8; run * 4096];
    let mut ns = 0u128;
    for _ in 0..reps {
        let first = rnd() % (n - run);
        let t = Instant::now();
        let got = store.get_run(key(first), run, &mut out, true).unwrap();
        ns += t.elapsed().as_nanos();
        assert_eq!(got, run);
        for (j, page) in out.chunks_exact(4096).enumerate() {
            assert_eq!(page, pages[(first + j) % pages.len()], "page {} read back wrong", first + j);
            store.put(key(first + j), page, PutFlags::default()).unwrap();
        }
    }
    println!("{n} pages, runs of {run}: {:.3} µs a page", ns as f64 / 1e3 / (reps * run) as f64);
}
