//! `single`: no prefetch — every fault brings in its own page only, new
//! pages included. The trivial prefetch, to measure the others against.

use crate::prefetch::{Prefetch, Walk};

/// One page per fault.
pub struct Single;

impl Prefetch for Single {
    fn name(&self) -> &'static str {
        "single"
    }
    fn fault(&mut self, _page: usize) -> Walk {
        Walk::default()
    }
    fn store_run(&self, _walk: Walk) -> usize {
        1
    }
    fn zero_run(&self) -> usize {
        1
    }
    fn ran_to(&mut self, _last: usize) {}
}
