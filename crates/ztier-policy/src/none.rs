//! `none`: plain LRU memory, no compressed region. The baseline every
//! other policy is normalised to.

use crate::policy::{Policy, Reference};

/// No compressed region.
pub struct NoCompression;

impl Policy for NoCompression {
    fn name(&self) -> String {
        "none".into()
    }
    fn interest_depth(&self) -> usize {
        usize::MAX
    }
    fn reference(&mut self, _: &Reference) {}
    fn target(&self) -> usize {
        0
    }
}
