//! The shipped policy's replay of a trace at one budget, as rows of a
//! `ztier run --fault-log` (`t_ns,kind,addr,pages`): its store and zero
//! faults and take-backs in order, the program's clock of the pipeline
//! model as the time, to set beside a run's own log of the same budget
//! (`ztier faults`, or page by page).
//!
//! ```sh
//! cargo run --release -p ztier-sim --example fault_stream -- TRACE 8M > sim.csv
//! cargo run --release -p ztier-sim --example fault_stream -- TRACE 8M inline   # no background evictor
//! ```

use std::path::Path;

use ztier_codec::CodecId;
use ztier_policy::spec::Spec;
use ztier_policy::{Costs, Frontend};
use ztier_sim::pager::{replay_logged, Layout, LogKind, PagerOptions};
use ztier_sim::replay::summarize;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(trace), Some(budget)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: fault_stream TRACE BUDGET (e.g. 8M)");
        std::process::exit(2);
    };
    let (n, unit) = budget.split_at(budget.len() - 1);
    let bytes: usize = match unit {
        "K" => n.parse::<usize>().unwrap() << 10,
        "M" => n.parse::<usize>().unwrap() << 20,
        _ => budget.parse().unwrap(),
    };
    let path = Path::new(trace);
    let s = summarize(path, CodecId::Lz4).unwrap();
    let layout = Layout::of_trace(path).unwrap();
    let spec = Spec::parse("shipped", Frontend::Sim).unwrap();
    let costs = Costs { disk_ns: 5e6, compress_ns: s.compress_ns, decompress_ns: s.decompress_ns };
    let opts =
        PagerOptions { background: args.get(3).is_none_or(|a| a != "inline"), ..PagerOptions::default() };
    let (c, log) = replay_logged(path, &s, &layout, bytes / 4096, &spec, costs, opts).unwrap();
    println!("t_ns,kind,addr,pages,reference");
    for r in log {
        let kind = match r.kind {
            LogKind::Store => "store",
            LogKind::Zero => "zero",
            LogKind::TakenBack => "taken",
        };
        println!("{:.0},{kind},{:#x},{},{}", r.clock_ns, r.page << 12, r.pages, r.reference);
    }
    eprintln!(
        "store_faults {} zero_faults {} taken_back {} evicted_inline {} compressions {}",
        c.store_faults, c.zero_faults, c.taken_back, c.evicted_inline, c.compressions
    );
}
