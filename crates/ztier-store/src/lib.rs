//! # ztier-store — the compressed page store
//!
//! Where compressed pages live. This crate is being built in steps; what is
//! here today:
//!
//! * [`alloc`] — the three allocators the seeds argued about, behind one
//!   [`alloc::Allocator`] trait so they can be compared on the same pages:
//!   de Castro's cells, CCache's chunks and zsmalloc-style size classes,
//!   each with compaction that reports every move to its caller, and
//!   honest memory accounting (backing pages plus metadata).
//!
//! Still to come (issue "Compressed page store"): the store itself (byte
//! budget over everything, FIFO/LRU order, per-entry checksums, clean/dirty
//! and anon/file kinds with separate caps), the next-tier trait, tmem pools
//! and `ztier bench store`.

pub mod alloc;
