//! # ztier-policy — sizing policies and the recency they need
//!
//! How much memory to keep compressed decides whether compressed caching
//! helps or hurts. The policies here are event-driven state machines: they
//! are fed references, hits, misses and evictions and never do I/O, so the
//! simulator and the live frontends run the same code.
//!
//! Built so far:
//!
//! * [`recency::Recency`] — exact LRU stack distances in O(log n) per
//!   reference over the pages it tracks (resident pages plus recently
//!   evicted "ghosts"), the measure every policy here is built on.
//!
//! Still to come (issue "Adaptive sizing policies and the trace-driven
//! simulator"): `none`, `static`, `kaplan`, `castro`, `clean-disable` and
//! `pressure`.

pub mod recency;
