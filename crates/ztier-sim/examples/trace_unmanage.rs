//! Copies a trace, marking unmanaged every managed page outside the given
//! address ranges: what the simulator predicts when only that memory is
//! managed (e.g. only the allocation-only heap and a program's `mmap`s,
//! as `ztier run` manages, leaving out glibc's heap and libraries' `.bss`).
//!
//! ```sh
//! cargo run --release -p ztier-sim --example trace_unmanage -- IN OUT LO HI [LO HI ...]   # hex addresses
//! ```

use std::collections::HashSet;
use std::io::{BufReader, BufWriter};

use ztier_sim::trace::{Event, TraceReader, TraceWriter};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 5 || a.len() % 2 == 0 {
        return Err("usage: trace_unmanage IN OUT LO HI [LO HI ...]".into());
    }
    let page = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).map(|v| v >> 12);
    let keep = a[3..]
        .chunks(2)
        .map(|c| Ok((page(&c[0])?, page(&c[1])?)))
        .collect::<Result<Vec<_>, std::num::ParseIntError>>()?;
    let mut r = TraceReader::new(BufReader::with_capacity(1 << 20, std::fs::File::open(&a[1])?))?;
    let columns = r.columns.clone();
    let mut w = TraceWriter::new(BufWriter::new(std::fs::File::create(&a[2])?), &columns)?;
    let (mut seen, mut unmanaged) = (HashSet::new(), HashSet::new());
    while let Some(e) = r.next_event()? {
        match e {
            Event::Ref { page, write } => {
                seen.insert(page);
                w.reference(page, write)?;
            }
            Event::Sizes { page, sizes } => w.sizes(page, &sizes)?,
            Event::Unmanaged { page } => {
                unmanaged.insert(page);
                w.unmanaged(page)?;
            }
            Event::Released { page } => w.released(page)?,
        }
    }
    let mut more: Vec<u64> = seen
        .into_iter()
        .filter(|p| !unmanaged.contains(p) && !keep.iter().any(|&(lo, hi)| (lo..hi).contains(p)))
        .collect();
    more.sort_unstable();
    for &p in &more {
        w.unmanaged(p)?;
    }
    w.finish()?;
    eprintln!("{} more pages marked unmanaged", more.len());
    Ok(())
}
