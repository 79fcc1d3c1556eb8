//! The `malloc` front-end's size classes ([`ztier_run_core::classes`]:
//! the classes, their spans and free lists) and what the library says of
//! a pointer it never handed out.

pub use ztier_run_core::classes::{class_of, class_size, Class, CLASSES, MAX_SMALL, SPAN};

/// A pointer the allocator never handed out, given to `what`: the
/// program's bug, said on stderr before the process aborts.
pub fn bad_pointer(what: &str, p: usize) -> ! {
    eprintln!("ztier: {what}(): invalid pointer {p:#x}: aborting");
    std::process::abort();
}
