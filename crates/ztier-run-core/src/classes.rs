//! Size classes of small `malloc` blocks (≤ 32 KiB): 16-byte steps up to
//! 128 bytes, then four classes per power of two. Each class carves
//! 256 KiB spans of the arena's span region into equal objects; freed
//! objects go on an intrusive list (the next pointer lives in the freed
//! object). A span's class is recorded per 256 KiB granule, so `free`
//! finds it from the address alone.
//!
//! ```text
//!  span region: | span (class 3) | span (class 17) | span (class 3) | ...
//!  class 3 (64 B): free -> obj -> obj -> 0     bump ... end (current span)
//! ```

/// Number of classes.
pub const CLASSES: usize = 40;
/// Largest small block.
pub const MAX_SMALL: usize = 32768;
/// Span size (one granule of the span region).
pub const SPAN: usize = 256 * 1024;

/// The class of a block of `size` bytes (`size <= MAX_SMALL`).
#[inline]
pub fn class_of(size: usize) -> usize {
    if size <= 128 {
        return size.max(1).div_ceil(16) - 1;
    }
    let s = size - 1;
    let k = (usize::BITS - 1 - s.leading_zeros()) as usize;
    let sub = (s >> (k - 2)) & 3;
    8 + (k - 7) * 4 + sub
}

/// Object size of class `c`.
#[inline]
pub fn class_size(c: usize) -> usize {
    if c < 8 {
        return (c + 1) * 16;
    }
    let k = (c - 8) / 4 + 7;
    let sub = (c - 8) % 4;
    (1 << k) + (sub + 1) * (1 << (k - 2))
}

/// One class: its free list and the unused tail of its current span.
#[derive(Default)]
pub struct Class {
    /// Head of the free list (0 = empty).
    pub free: usize,
    /// Next never-used object of the current span.
    pub bump: usize,
    /// End of the current span.
    pub end: usize,
}

impl Class {
    /// An object of `size` bytes (the class's): the head of the free list,
    /// else the next object of the current span; when that span is used
    /// up, `new_span` gives the start of a fresh one (`None`: no room).
    ///
    /// # Safety
    /// The free list holds only objects of this class freed by
    /// [`Class::give`] (their first word is the link), readable.
    #[inline]
    pub unsafe fn take(&mut self, size: usize, new_span: impl FnOnce() -> Option<usize>) -> Option<usize> {
        if self.free != 0 {
            let p = self.free;
            // SAFETY: p is a freed object of this class (the caller's
            // contract); its first word holds the next free object.
            self.free = unsafe { *(p as *const usize) };
            return Some(p);
        }
        if self.bump + size > self.end {
            let span = new_span()?;
            self.bump = span;
            self.end = span + SPAN;
        }
        let p = self.bump;
        self.bump += size;
        Some(p)
    }

    /// Puts the freed object `p` on the free list.
    ///
    /// # Safety
    /// `p` is a live object of this class, writable, no longer used by
    /// the program: its first word becomes the link.
    #[inline]
    pub unsafe fn give(&mut self, p: usize) {
        // SAFETY: the caller's contract.
        unsafe { *(p as *mut usize) = self.free };
        self.free = p;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_every_size_tightly() {
        let mut last = 0;
        for c in 0..CLASSES {
            let s = class_size(c);
            assert!(s > last && s % 16 == 0, "class {c} size {s}");
            assert_eq!(class_of(s), c);
            assert_eq!(class_of(last + 1), c);
            // Worst-case waste of a class is under 25% above 128 bytes.
            assert!(last < 128 || (s - last - 1) * 4 <= s, "class {c}");
            last = s;
        }
        assert_eq!(last, MAX_SMALL);
        for p in 4..=15 {
            assert_eq!(class_size(class_of(1 << p)), 1 << p, "powers of two are exact classes");
        }
    }

    /// Objects come off the current span in turn, then a fresh span when
    /// it is used up (none: no object); a freed one is handed out first,
    /// last freed first out.
    #[test]
    fn a_class_takes_from_its_free_list_then_its_span() {
        // Two spans of memory, 8-byte aligned, for the free-list links.
        let mut mem = vec![0u64; 2 * SPAN / 8];
        let base = mem.as_mut_ptr() as usize;
        let size = class_size(class_of(4096));
        let mut c = Class::default();
        let mut spans = vec![base + SPAN, base];
        let mut taken = Vec::new();
        // SAFETY: the spans are `mem`'s, live and writable; the free list
        // holds only objects given back here.
        unsafe {
            for _ in 0..2 * SPAN / size {
                taken.push(c.take(size, || spans.pop()).unwrap());
            }
            assert_eq!(c.take(size, || spans.pop()), None, "both spans used up");
            let want: Vec<usize> = (0..2 * SPAN / size).map(|i| base + i * size).collect();
            assert_eq!(taken, want);
            c.give(taken[3]);
            c.give(taken[7]);
            assert_eq!(c.take(size, || None), Some(taken[7]));
            assert_eq!(c.take(size, || None), Some(taken[3]));
            assert_eq!(c.take(size, || None), None);
        }
    }
}
