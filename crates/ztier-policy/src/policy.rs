//! The sizing interface: a state machine fed references, answering how
//! much memory the compressed region should take (the replacement and
//! prefetch interfaces are [`crate::replacement`] and [`crate::prefetch`];
//! the crate root builds policies by name: [`crate::build`]).
//!
//! The simulator and the live frontends call it the same way: for every
//! reference deeper in the LRU stack than [`Policy::interest_depth`] (the
//! others cannot change any decision) they pass a [`Reference`], and after
//! every reference that was not a plain hit they read [`Policy::target`]
//! and resize the compressed region towards it.

/// Where a reference landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// In the uncompressed region.
    Hit,
    /// In the compressed region: decompressed (and another page compressed).
    CompressedHit,
    /// Not in memory: read from the backing store.
    Fault,
}

/// One reference as a policy sees it.
#[derive(Debug, Clone, Copy)]
pub struct Reference {
    /// LRU stack depth before the reference (1 = most recent), `None` for
    /// a page not seen (or forgotten) before.
    pub depth: Option<usize>,
    /// What happened.
    pub outcome: Outcome,
    /// Compressed size of the page's content in bytes (current estimate).
    pub size: u16,
}

/// Costs the policy weighs, per page.
#[derive(Debug, Clone, Copy)]
pub struct Costs {
    /// Reading a page from the backing store (a fault), ns.
    pub disk_ns: f64,
    /// Compressing a page, ns.
    pub compress_ns: f64,
    /// Decompressing a page, ns.
    pub decompress_ns: f64,
}

/// A sizing policy.
pub trait Policy: Send {
    /// The name as given on the command line (`static:0.25`).
    fn name(&self) -> String;
    /// References at or above this depth are not passed (they cannot
    /// change the policy's view); `usize::MAX` = none are needed.
    fn interest_depth(&self) -> usize;
    /// Feeds one reference.
    fn reference(&mut self, r: &Reference);
    /// Pages of memory the compressed region should take now.
    fn target(&self) -> usize;

    /// A page was compressed into the region at `size` bytes (the
    /// compressibility of what the region really holds).
    fn compressed(&mut self, _size: u16) {}

    /// Whether the policy wants the clean-page events below (the caller
    /// then tracks which pages are clean: read from the backing store and
    /// not written since).
    fn tracks_clean(&self) -> bool {
        false
    }
    /// Whether a clean page leaving uncompressed memory is compressed
    /// (`true`) or dropped (its backing-store copy is valid).
    fn compress_clean(&self) -> bool {
        true
    }
    /// A clean page was read back from the compressed region.
    fn clean_reclaimed(&mut self) {}
    /// A clean page left memory: evicted unread from the compressed region
    /// (`was_compressed`), or dropped instead of compressed because
    /// [`Policy::compress_clean`] said no. `region_pages` = pages the
    /// compressed region holds now.
    fn clean_dropped(&mut self, _page: u64, _was_compressed: bool, _region_pages: usize) {}
    /// A page was read from the backing store (tracking policies only).
    fn faulted(&mut self, _page: u64) {}
}
