//! # ztier-sim — page traces and the trace-driven simulator
//!
//! * [`trace`] — the compact binary page-trace format (references plus
//!   compression records), writer, reader and summary.
//! * [`lackey`] — valgrind lackey import, and recording a program's trace
//!   together with the compressed sizes of its real pages.
//! * [`sim`] — the replay (the 1999 cost model: one LRU stack split into
//!   uncompressed and compressed regions by a policy), sweeps over memory
//!   sizes, policies and disk costs, and the table behind `ztier sim`.
//! * [`plot`] — the sweep as SVG plots.

pub mod lackey;
pub mod plot;
pub mod sim;
pub mod trace;
