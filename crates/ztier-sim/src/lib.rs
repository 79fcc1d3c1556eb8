//! # ztier-sim — page traces and the trace-driven simulator
//!
//! * [`trace`] — the compact binary page-trace format (references plus
//!   compression records), writer, reader and summary.
//! * [`lackey`] — valgrind lackey import, and recording a program's trace
//!   together with the compressed sizes of its real pages.
//! * [`sim`] — the replay (the 1999 cost model: one LRU stack split into
//!   uncompressed and compressed regions by a sizing policy), sweeps over
//!   memory sizes, policies and disk costs, and the table behind `ztier sim`.
//! * [`pager`] — the replay of a fault-driven policy (the shipped one:
//!   `segmented+walk`) through a model of `ztier run`'s pager, which sees
//!   faults only.
//! * [`faults`] — a `ztier run --fault-log` recording as a trace of faults.
//! * [`plot`] — the sweep as SVG plots.

pub mod faults;
pub mod lackey;
pub mod pager;
pub mod plot;
pub mod replay;
pub mod sim;
pub mod trace;
