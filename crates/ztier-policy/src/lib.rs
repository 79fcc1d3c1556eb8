//! # ztier-policy — the policies of compressed caching, as state machines
//!
//! A policy here is fed events and answers decisions; it never does I/O,
//! so the simulator (`ztier sim`) and the live pager (`ztier run`) run
//! the same objects. Three parts make a policy, each a trait with one
//! file per implementation:
//!
//! * **replacement** ([`replacement::Replacement`]) — which resident pages
//!   leave memory, for a pager that sees faults only:
//!   [`segmented`] (the one `ztier run` ships: protected and probation
//!   segments, promotion by refault distance, adaptive aging) and
//!   [`fifo`] (oldest first); [`pick`] is the pager's loop over its
//!   candidates (victim choice, live and simulated alike). The simulator's `lru` sees every reference
//!   instead ([`recency::Recency`]: exact LRU stack distances in O(log n)
//!   per reference, the measure the sizing policies are built on).
//! * **prefetch** ([`prefetch::Prefetch`]) — what a fault brings in
//!   besides its page: [`walk`] (shipped: sequential and interleaved
//!   walks, zero runs) and [`single`].
//! * **sizing** ([`policy::Policy`]) — how much of the memory holds
//!   compressed pages: [`none`] (plain LRU, no compressed region),
//!   [`static_size`] (`static:F`), [`kaplan`] (Wilson/Kaplan/Smaragdakis
//!   1999 cost/benefit), [`castro`] (de Castro et al. 2003 expense/profit,
//!   and its aggressive and sluggish variants), [`pressure`] (refault
//!   feedback, TMO/Senpai style), and [`clean_disable`] (de Castro 2003's
//!   clean-page switch, around any of them). Live, [`split::Split`] feeds
//!   one with faults.
//!
//! [`registry`] names the sizing policies and builds one ([`build`]);
//! [`spec`] parses the names `--policy` takes, a replacement, a prefetch
//! and a sizing policy joined by '+' (`segmented+walk+kaplan`), and builds
//! the parts; [`pacing`] says when a fault-driven pager evicts and how
//! many pages.

pub mod castro;
pub mod clean_disable;
pub mod fifo;
pub mod kaplan;
pub mod none;
pub mod pacing;
pub mod pick;
pub mod policy;
pub mod prefetch;
pub mod pressure;
pub mod recency;
pub mod registry;
pub mod replacement;
pub mod segmented;
pub mod single;
pub mod spec;
pub mod split;
pub mod static_size;
pub mod walk;

pub use policy::{Costs, Outcome, Policy, Reference};
pub use registry::{build, NAMES};
pub use spec::{Frontend, Spec};
