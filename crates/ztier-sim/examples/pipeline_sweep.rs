//! The shipped policy's store faults and `taken_back` on a trace, with
//! the background evictor's pipeline modelled (as `ztier sim` does by
//! default) and without it, and how they move with the pipeline's clock:
//!
//! ```sh
//! cargo run --release -p ztier-sim --example pipeline_sweep -- TRACE 1M,2M,3M
//! ```
//!
//! One line per budget and setting: store faults, taken back, their sum.

use std::path::Path;

use ztier_codec::CodecId;
use ztier_policy::spec::Spec;
use ztier_policy::{Costs, Frontend};
use ztier_sim::pager::{replay, Layout, PagerOptions, Pipeline};
use ztier_sim::replay::summarize;

fn pages(s: &str) -> usize {
    let (n, unit) = s.split_at(s.len() - 1);
    let b: usize = match unit {
        "K" => n.parse::<usize>().unwrap() << 10,
        "M" => n.parse::<usize>().unwrap() << 20,
        _ => s.parse().unwrap(),
    };
    b / 4096
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(trace), Some(budgets)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: pipeline_sweep TRACE BUDGETS (e.g. 1M,2M,3M)");
        std::process::exit(2);
    };
    let path = Path::new(trace);
    let s = summarize(path, CodecId::Lz4).unwrap();
    let layout = Layout::of_trace(path).unwrap();
    let spec = Spec::parse("shipped", Frontend::Sim).unwrap();
    let costs = Costs { disk_ns: 5e6, compress_ns: s.compress_ns, decompress_ns: s.decompress_ns };
    let d = Pipeline::default();
    let settings: Vec<(String, Option<Pipeline>)> = vec![
        ("off".into(), None),
        ("default".into(), Some(d)),
        ("ref 0.5 ns".into(), Some(Pipeline { ref_ns: 0.5, ..d })),
        ("ref 2 ns".into(), Some(Pipeline { ref_ns: 2.0, ..d })),
        ("compress 1.5 us".into(), Some(Pipeline { compress_ns: 1500.0, ..d })),
        ("compress 6 us".into(), Some(Pipeline { compress_ns: 6000.0, ..d })),
        ("fault 10 us".into(), Some(Pipeline { fault_ns: 10_000.0, ..d })),
    ];
    for b in budgets.split(',') {
        for (name, pipeline) in &settings {
            let opts = PagerOptions { pipeline: *pipeline, ..PagerOptions::default() };
            let (c, _) = replay(path, &s, &layout, pages(b), &spec, costs, opts).unwrap();
            println!(
                "{trace} {b} {name:<16} store_faults {:>6} taken_back {:>5} sum {:>6}",
                c.store_faults,
                c.taken_back,
                c.store_faults + c.taken_back
            );
        }
    }
}
