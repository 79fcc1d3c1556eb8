//! A `ztier run --fault-log` recording as a trace of faults, for `ztier
//! sim --fault-log` (and `ztier trace import-faults`).
//!
//! A fault log holds what userfaultfd showed the run: its page-ins, never
//! its hits. As a trace it is the run's **misses at the budget it ran
//! with**, in order:
//!
//! ```text
//!  row kind     becomes
//!  store        a write reference to its first page (the pages the
//!               run prefetched with it are not referenced: the log does
//!               not say whether the program touched them)
//!  zero, lost   a write reference to its first page
//!  pin          a write reference to each of its pages (a system call
//!               needed them all)
//!  deferred, wp nothing (a later row serves the deferred fault; a write
//!               that took a victim back found its page in memory)
//! ```
//!
//! What it can tell: at budgets above the recorded one, the faults a
//! policy that sees faults only (the shipped one, `fifo`) would have had,
//! since a reference that hit at the recorded budget would have hit with
//! more memory too (nearly: the shipped policy is not a stack algorithm).
//! Its counts are a lower bound, even at the recorded budget: wherever
//! the model evicts other pages than the run did, the run's faults on
//! pages the model kept become hits, while the model's faults on pages
//! the run kept are not in the log (a python3 run at 4M with 9475 store
//! faults replays to 3550: the model's divergences are not symmetric
//! here as they are over a full trace). What it cannot tell: the
//! hits, so not how an `lru` policy (which needs every reference) or a
//! smaller budget would have done; the order of references between two
//! faults; which pages were written (every reference is taken as a
//! write); how the pages compress (a log has no sizes: every page that
//! ever came back from the store is taken to compress to
//! [`FaultTraceOptions::size`] bytes, any other page to hold zeros unless
//! referenced) — so its compressions and paging times are estimates,
//! its fault counts are not.

use std::io::Write;

use ztier_codec::CodecId;
use ztier_run_core::faultlog::{Kind, Row};

use crate::trace::{CodecColumn, TraceError, TraceWriter};

/// How the pages of a fault log are taken to compress.
#[derive(Clone, Copy, Debug)]
pub struct FaultTraceOptions {
    /// The codec column of the trace.
    pub codec: CodecId,
    /// Compressed size of a page that came back from the store, bytes.
    pub size: u16,
    /// Nanoseconds to compress a page.
    pub compress_ns: u32,
    /// Nanoseconds to decompress a page.
    pub decompress_ns: u32,
}

impl Default for FaultTraceOptions {
    /// lz4, half a page, and the costs `ztier run` tells its sizing
    /// policies (this machine's profile with lz4, rounded).
    fn default() -> Self {
        FaultTraceOptions { codec: CodecId::Lz4, size: 2048, compress_ns: 7_000, decompress_ns: 2_000 }
    }
}

/// What an import made.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FaultImport {
    /// Rows read.
    pub rows: u64,
    /// References written.
    pub references: u64,
    /// Pages that came back from the store at least once (sized).
    pub stored_pages: u64,
}

/// Writes the trace of `rows` (one process's fault log, in order) to `out`.
pub fn import<W: Write>(rows: &[Row], out: W, opts: FaultTraceOptions) -> Result<FaultImport, TraceError> {
    let col =
        CodecColumn { codec: opts.codec, compress_ns: opts.compress_ns, decompress_ns: opts.decompress_ns };
    let mut w = TraceWriter::new(out, &[col])?;
    let mut st = FaultImport { rows: rows.len() as u64, ..FaultImport::default() };
    // Pages that came back from the store had content: sized from the start.
    let mut stored: Vec<u64> = rows
        .iter()
        .filter(|r| r.kind == Kind::Store)
        .flat_map(|r| (0..r.pages as u64).map(move |k| (r.addr >> 12) + k))
        .collect();
    stored.sort_unstable();
    stored.dedup();
    for &p in &stored {
        w.sizes(p, &[opts.size])?;
    }
    st.stored_pages = stored.len() as u64;
    for r in rows {
        let first = r.addr >> 12;
        let pages = match r.kind {
            Kind::Store | Kind::Zero | Kind::Lost => 1,
            Kind::Pin => r.pages as u64,
            Kind::Deferred | Kind::Wp => 0,
        };
        for p in first..first + pages {
            w.reference(p, true)?;
            st.references += 1;
        }
    }
    w.finish()?;
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Event, TraceReader};

    fn row(kind: Kind, addr: u64, pages: u16) -> Row {
        Row { t_ns: 0, addr, service_ns: 0, distance: u32::MAX, evictions: 0, pages, kind, hot: false }
    }

    #[test]
    fn rows_become_references_and_stored_pages_are_sized() {
        let rows = [
            row(Kind::Zero, 0x10000, 16),
            row(Kind::Store, 0x10000, 3),
            row(Kind::Deferred, 0x20000, 0),
            row(Kind::Pin, 0x30000, 2),
            row(Kind::Wp, 0x10000, 0),
            row(Kind::Store, 0x12000, 1),
        ];
        let mut out = Vec::new();
        let st = import(&rows, &mut out, FaultTraceOptions::default()).unwrap();
        assert_eq!(st, FaultImport { rows: 6, references: 5, stored_pages: 3 });
        let mut t = TraceReader::new(&out[..]).unwrap();
        let mut events = Vec::new();
        while let Some(e) = t.next_event().unwrap() {
            events.push(e);
        }
        let sized: Vec<u64> = events
            .iter()
            .filter_map(|e| if let Event::Sizes { page, .. } = e { Some(*page) } else { None })
            .collect();
        assert_eq!(sized, vec![0x10, 0x11, 0x12]);
        let refs: Vec<u64> = events
            .iter()
            .filter_map(|e| if let Event::Ref { page, .. } = e { Some(*page) } else { None })
            .collect();
        assert_eq!(refs, vec![0x10, 0x10, 0x30, 0x31, 0x12]);
    }
}
