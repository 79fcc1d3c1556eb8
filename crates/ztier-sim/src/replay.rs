//! What every replay shares: its errors, what a trace offers
//! ([`summarize`]) and the counts a replay gives ([`Counts`]).

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use serde::Serialize;
use ztier_codec::CodecId;

use crate::trace::{self, TraceError, TraceReader};

/// Errors of the simulator.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The trace could not be read.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// I/O failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The trace cannot answer the question.
    #[error("{0}")]
    Unusable(String),
    /// A policy name did not parse.
    #[error("{0}")]
    Policy(String),
}

/// What a trace offers for one codec column.
#[derive(Debug, Clone)]
pub struct TraceSummary {
    /// Data references.
    pub references: u64,
    /// Distinct pages.
    pub distinct_pages: u64,
    /// Column of the chosen codec.
    pub column: usize,
    /// Mean compressed size of the column's records.
    pub mean_size: u16,
    /// Per-page costs of the codec, from the trace header.
    pub compress_ns: f64,
    /// Per-page decompress cost.
    pub decompress_ns: f64,
}

/// Reads the trace once to find the codec column, footprint and mean size.
pub fn summarize(path: &Path, codec: CodecId) -> Result<TraceSummary, SimError> {
    let f = BufReader::with_capacity(1 << 20, File::open(path)?);
    let t = TraceReader::new(f)?;
    let column = t.columns.iter().position(|c| c.codec == codec).ok_or_else(|| {
        let have: Vec<&str> = t.columns.iter().map(|c| c.codec.name()).collect();
        SimError::Unusable(if have.is_empty() {
            "the trace has no compression records (an imported lackey log?): record it with `ztier trace record` \
             so that compressed sizes come from the program's real pages"
                .to_string()
        } else {
            format!("the trace has no compression records for {}; it has: {}", codec.name(), have.join(", "))
        })
    })?;
    let col = t.columns[column];
    drop(t);
    let i = trace::info(BufReader::with_capacity(1 << 20, File::open(path)?))?;
    if i.size_records == 0 {
        return Err(SimError::Unusable("the trace has no compression records".into()));
    }
    if col.compress_ns == 0 || col.decompress_ns == 0 {
        return Err(SimError::Unusable(format!("the trace has no measured costs for {}", codec.name())));
    }
    Ok(TraceSummary {
        references: i.references,
        distinct_pages: i.distinct_pages,
        column,
        mean_size: i.mean_sizes[column].round() as u16,
        compress_ns: col.compress_ns as f64,
        decompress_ns: col.decompress_ns as f64,
    })
}

/// Counts of one replay.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Counts {
    /// References replayed.
    pub references: u64,
    /// Faults (reads from the backing store), first references included.
    pub disk_faults: u64,
    /// Hits in the compressed region (with a fault-driven policy: faults
    /// served from the store in memory, a run of pages each).
    pub compressed_hits: u64,
    /// Pages compressed.
    pub compressions: u64,
    /// Pages decompressed.
    pub decompressions: u64,
    /// Compressions of pages that had no compression record yet.
    pub unsized_compressions: u64,
    /// Mean compressed-region target over the misses, in pages.
    pub mean_target_pages: f64,
    /// Page-ins of a fault-driven pager: store faults and zero faults
    /// (what `ztier run --stats` calls `faults`, less pins); 0 for `lru`.
    pub faults: u64,
    /// Faults on pages that were evicted: served from the store (in memory
    /// or spilled), as `ztier run --stats` counts `store_faults`. For
    /// `lru`: references that missed the uncompressed region on a page
    /// seen before.
    pub store_faults: u64,
    /// Faults on pages with nothing stored (first touches, pages evicted
    /// as zeros), zeros installed; 0 for `lru`.
    pub zero_faults: u64,
    /// Stored pages brought in by prefetch besides the faulting ones.
    pub prefetched: u64,
    /// Store faults that continued no walk (one page, no prefetch).
    pub lone_faults: u64,
    /// Victims of the background evictor's batch in flight that a write
    /// took back before they left memory (`ztier run --stats`'
    /// `taken_back`; fault-driven policies with the pipeline modelled).
    pub taken_back: u64,
    /// Pages evicted inline, by a fault that found no room (`ztier run
    /// --stats`' `evicted_inline`); the rest the background evictor
    /// evicted. Fault-driven policies.
    pub evicted_inline: u64,
    /// Pages released by the program (a trace's released-page records)
    /// while resident or stored. Fault-driven policies.
    pub released: u64,
}
