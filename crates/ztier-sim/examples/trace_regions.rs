//! The managed pages of a trace grouped by address: one line per run of
//! pages with gaps of at most 1 MiB (256 pages), with its page and
//! reference counts, then the totals. Shows which memory a trace counts
//! as managed (the allocation-only heap, a program's `mmap`s, a library's
//! `.bss`, glibc's heap) to compare with what `ztier run` manages.
//!
//! ```sh
//! cargo run --release -p ztier-sim --example trace_regions -- sort.trace
//! ```

use std::collections::{HashMap, HashSet};
use std::io::BufReader;

use ztier_sim::trace::{Event, TraceReader};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: trace_regions TRACE")?;
    let mut r = TraceReader::new(BufReader::with_capacity(1 << 20, std::fs::File::open(path)?))?;
    let mut refs: HashMap<u64, u64> = HashMap::new();
    let mut unmanaged: HashSet<u64> = HashSet::new();
    while let Some(e) = r.next_event()? {
        match e {
            Event::Ref { page, .. } => *refs.entry(page).or_default() += 1,
            Event::Unmanaged { page } => {
                unmanaged.insert(page);
            }
            Event::Sizes { .. } | Event::Released { .. } => {}
        }
    }
    let mut pages: Vec<u64> = refs.keys().copied().filter(|p| !unmanaged.contains(p)).collect();
    pages.sort_unstable();
    let mut i = 0;
    while i < pages.len() {
        let mut j = i + 1;
        while j < pages.len() && pages[j] - pages[j - 1] <= 256 {
            j += 1;
        }
        let n: u64 = pages[i..j].iter().map(|p| refs[p]).sum();
        println!("{:#x}-{:#x} pages {} refs {}", pages[i] << 12, (pages[j - 1] + 1) << 12, j - i, n);
        i = j;
    }
    println!("managed {} unmanaged {}", pages.len(), unmanaged.len());
    Ok(())
}
