//! Page buffers shared by all the remote tiers of a process.
//!
//! A put copies (or seals) its page into a buffer that stays with the
//! page until the page is written; the flusher hands the buffer back
//! here and the next put, of any tier, takes it. Buffers kept per tier
//! (as before) were reused only by the tier that made them: with many
//! short-lived or idle tiers (a `ztier run`'s proxy has one per process)
//! most puts took fresh memory, and the copy into it paid a page fault
//! per 4 KiB page (the kernel zeroing and charging the page) whenever the
//! allocator had given that memory back to the system.
//!
//! At most [`KEPT`] buffers (about 4 MiB) wait here: that is the memory
//! the process keeps for this when no page is being written.

use std::sync::Mutex;

use crate::seal::OVERHEAD;

/// Buffers kept, at most.
pub const KEPT: usize = 1024;
/// A buffer's capacity: a 4 KiB page and its seal.
pub const CAPACITY: usize = 4096 + OVERHEAD;

static FREE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// An empty buffer with room for a sealed 4 KiB page: one given back
/// before, or a new one.
pub fn take() -> Vec<u8> {
    let v = FREE.lock().unwrap_or_else(|p| p.into_inner()).pop();
    match v {
        Some(mut v) => {
            v.clear();
            v
        }
        None => Vec::with_capacity(CAPACITY),
    }
}

/// Gives a buffer back (dropped if too small or the pool is full).
pub fn give(v: Vec<u8>) {
    give_all([v]);
}

/// Gives buffers back, with one lock of the pool (those too small, or
/// beyond [`KEPT`], are dropped).
pub fn give_all(vs: impl IntoIterator<Item = Vec<u8>>) {
    let mut free = FREE.lock().unwrap_or_else(|p| p.into_inner());
    if free.capacity() == 0 {
        free.reserve_exact(KEPT);
    }
    for v in vs {
        if free.len() < KEPT && v.capacity() >= CAPACITY {
            free.push(v);
        }
    }
}

/// Buffers waiting now.
pub fn kept() -> usize {
    FREE.lock().unwrap_or_else(|p| p.into_inner()).len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_taken_again_empty_and_the_pool_is_bounded() {
        let mut v = take();
        assert!(v.capacity() >= CAPACITY);
        v.extend_from_slice(&[7u8; 100]);
        let at = v.as_ptr();
        give(v);
        // Other tests of this process may take it meanwhile: look for it
        // among a few.
        let mut got: Vec<Vec<u8>> = (0..64).map(|_| take()).collect();
        assert!(got.iter().all(|v| v.is_empty() && v.capacity() >= CAPACITY));
        assert!(got.iter().any(|v| v.as_ptr() == at) || kept() > 0);
        // Too small: not kept.
        let before = kept();
        give(Vec::with_capacity(16));
        assert!(kept() <= before);
        for _ in 0..KEPT + 10 {
            got.push(take());
        }
        for v in got {
            give(v);
        }
        assert!(kept() <= KEPT);
    }
}
