//! The prefetch interface: how many pages a fault brings in besides the
//! one it needs, for a pager that sees faults only.
//!
//! ```text
//!  fault on page i ──fault(i)──► Walk { sequential, stream }
//!    stored:         store_run(walk) ─► up to that many stored pages from i
//!    never touched:  zero_run()      ─► up to that many new pages from i, as zeros
//!  pages [i, last] installed ──ran_to(last)──► (the next fault after last is sequential)
//! ```
//!
//! A run stops at the first page that is not in the same state as the
//! faulting one; the pager decides that. Runs are at most
//! [`MAX_STORE_RUN`] and [`MAX_ZERO_RUN`] pages (the pager's buffers).

/// Most stored pages one fault brings in.
pub const MAX_STORE_RUN: usize = 64;
/// Most never-touched pages one fault fills with zeros.
pub const MAX_ZERO_RUN: usize = 16;

/// What walk a fault continues.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Walk {
    /// Right after the last fault's pages.
    pub sequential: bool,
    /// Shortly after one of the last faults (an interleaved walk).
    pub stream: bool,
}

impl Walk {
    /// Continues no walk: random access, or a walk lost over a resident
    /// stretch.
    pub fn lone(&self) -> bool {
        !self.sequential && !self.stream
    }
}

/// A prefetch policy.
pub trait Prefetch: Send {
    /// The name `--policy` gives it (`walk`).
    fn name(&self) -> &'static str;
    /// A fault at `page` (of any kind, served or not): the walk it
    /// continues.
    fn fault(&mut self, page: usize) -> Walk;
    /// Most stored pages to bring in from the faulting page (1 = it
    /// alone), for a fault that continues `walk`.
    fn store_run(&self, walk: Walk) -> usize;
    /// Most never-touched pages to fill with zeros from the faulting page.
    fn zero_run(&self) -> usize;
    /// The fault brought in pages up to `last`.
    fn ran_to(&mut self, last: usize);
}
