//! # ztier-policy — sizing policies and the recency they need
//!
//! How much memory to keep compressed decides whether compressed caching
//! helps or hurts. The policies here are event-driven state machines
//! ([`policy::Policy`]): they are fed references and never do I/O, so the
//! simulator and the live frontends run the same code.
//!
//! * [`registry`] — the policies' names and [`build`], which makes one
//!   from its name.
//! * [`recency::Recency`] — exact LRU stack distances in O(log n) per
//!   reference over the pages it tracks (resident pages plus recently
//!   evicted "ghosts"), the measure every policy here is built on.
//! * [`none`] — plain LRU, no compressed region; [`static_size`] — a fixed
//!   fraction of memory compressed (`static:F`).
//! * [`kaplan`] — Wilson/Kaplan/Smaragdakis 1999 cost/benefit sizing.
//! * [`castro`] — de Castro et al. 2003 expense/profit sizing.
//! * [`pressure`] — a feedback controller balancing refault and
//!   compression-stall costs (TMO/Senpai style).
//! * [`clean_disable`] — de Castro 2003's switch that stops compressing
//!   clean pages while it does not pay; wraps any of the above
//!   (`kaplan+clean-disable`).

pub mod castro;
pub mod clean_disable;
pub mod kaplan;
pub mod none;
pub mod policy;
pub mod pressure;
pub mod recency;
pub mod registry;
pub mod static_size;

pub use policy::{Costs, Outcome, Policy, Reference};
pub use registry::{build, NAMES};
