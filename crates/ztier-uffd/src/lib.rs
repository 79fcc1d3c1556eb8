//! # ztier-uffd — userfaultfd, the mechanism under `ztier run`
//!
//! The foundation of the issue "`ztier run`: transparent compressed memory
//! for unmodified programs": a safe wrapper of the userfaultfd API
//! ([`uffd`]). `ztier run`'s library (`crates/ztier-preload`) uses the
//! API with missing + write-protect registration over its own arena.
//! [`floor`] measures what the mechanism itself costs on the machine (a
//! fault's round trip, a further page of a run), the floor under any
//! fault service built on it. [`tree`] is the budget the processes of one
//! `ztier run --budget-scope tree` share. [`ctl`] carries `ztier stats`
//! requests and answers with their senders.

pub mod ctl;
pub mod floor;
mod sys;
pub mod tree;
pub mod uffd;
