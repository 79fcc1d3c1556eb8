//! `static:F`: a fixed fraction F of memory holds compressed pages,
//! whatever the program does (the policy the 1999 paper compares against,
//! and Douglis's 1993 fixed-size cache).

use crate::policy::{Policy, Reference};

/// A fixed-size compressed region.
pub struct Static {
    name: String,
    pages: usize,
}

impl Static {
    /// `fraction` of `memory_pages`, rounded, leaving at least one
    /// uncompressed page.
    pub fn new(name: String, fraction: f64, memory_pages: usize) -> Self {
        let pages = ((fraction * memory_pages as f64).round() as usize).min(memory_pages.saturating_sub(1));
        Static { name, pages }
    }
}

impl Policy for Static {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn interest_depth(&self) -> usize {
        usize::MAX
    }
    fn reference(&mut self, _: &Reference) {}
    fn target(&self) -> usize {
        self.pages
    }
}
