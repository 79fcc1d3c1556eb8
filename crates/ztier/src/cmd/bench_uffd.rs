//! `ztier bench uffd`: what userfaultfd itself costs on this machine —
//! the kernel's own anonymous fault, a missing-page fault's round trip
//! through a handler on the same CPU, and each further page of a run —
//! with nothing to look up or decompress (see `ztier_uffd::floor`).

use anyhow::{Context, Result};
use clap::Args;
use ztier_uffd::floor::{self, Floor};

/// Arguments of `ztier bench uffd`.
#[derive(Args, Debug)]
#[command(after_long_help = "Example:\n  \
    ztier bench uffd\n\n\
A program under `ztier run` that took F faults and P pages beyond the first of each\n\
run (its --stats: faults, prefetched) spent at least about F x round trip + P x page\n\
in fault service on this machine, before any decompression or eviction; `ztier bench\n\
pressure` prints that figure next to each run.")]
pub struct UffdArgs {
    /// Pages touched per timing (each timing is repeated 3 times; the median is reported).
    #[arg(long, default_value_t = 16384)]
    pub pages: usize,
    /// Pages per fault for the per-page cost (runs of this many pages).
    #[arg(long, default_value_t = 8)]
    pub run: usize,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// The floor's JSON object (the `--json` output, and a part of `bench pressure`'s rows).
pub fn floor_json(f: &Floor) -> serde_json::Value {
    serde_json::json!({
        "cpu": f.cpu, "pages": f.pages, "run": f.run,
        "anon_fault_us": f.anon_fault_us, "fault_us": f.fault_us, "page_us": f.page_us,
    })
}

/// One line saying what the floor is.
pub fn floor_line(f: &Floor) -> String {
    format!(
        "userfaultfd on this machine (CPU {}): a fault's round trip {:.2} µs, each further page of a run {:.2} µs \
         (the kernel's own anonymous fault {:.2} µs)",
        f.cpu, f.fault_us, f.page_us, f.anon_fault_us
    )
}

/// `ztier bench uffd`.
pub fn run(a: UffdArgs) -> Result<i32> {
    let f = floor::measure(a.pages, a.run).context("measuring userfaultfd's costs")?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&floor_json(&f))?);
        return Ok(0);
    }
    println!(
        "userfaultfd on this machine: handler and faulting thread on CPU {}, {} pages a timing, median of {}",
        f.cpu,
        f.pages,
        floor::ROUNDS
    );
    println!("  {:<44} {:>8.2} µs a page", "kernel's own anonymous fault (no uffd)", f.anon_fault_us);
    println!("  {:<44} {:>8.2} µs a fault", "missing-page fault, one page (round trip)", f.fault_us);
    println!("  {:<44} {:>8.2} µs a page", format!("each further page of a run of {}", f.run), f.page_us);
    Ok(0)
}
