//! Copies a trace without its unmanaged-page and released-page records:
//! every page it references counts as managed and none is ever released,
//! so the model of `ztier run`'s pager replays the same pages the LRU
//! policies do (they keep every page they see). The research table
//! (docs/research-table.md) compares the two on such copies.
//!
//! ```sh
//! cargo run --release -p ztier-sim --example trace_all_managed -- IN OUT
//! ```

use std::io::{BufReader, BufWriter};

use ztier_sim::trace::{Event, TraceReader, TraceWriter};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 3 {
        return Err("usage: trace_all_managed IN OUT".into());
    }
    let mut r = TraceReader::new(BufReader::with_capacity(1 << 20, std::fs::File::open(&a[1])?))?;
    let columns = r.columns.clone();
    let mut w = TraceWriter::new(BufWriter::new(std::fs::File::create(&a[2])?), &columns)?;
    while let Some(e) = r.next_event()? {
        match e {
            Event::Ref { page, write } => w.reference(page, write)?,
            Event::Sizes { page, sizes } => w.sizes(page, &sizes)?,
            Event::Unmanaged { .. } | Event::Released { .. } => {}
        }
    }
    w.finish()?;
    Ok(())
}
