//! # ztier-sim — page traces and the trace-driven simulator
//!
//! * [`trace`] — the compact binary page-trace format (references plus
//!   compression records), writer, reader and summary.
//! * [`lackey`] — valgrind lackey import, and recording a program's trace
//!   together with the compressed sizes of its real pages.
//!
//! Still to come (issue "Adaptive sizing policies and the trace-driven
//! simulator"): the replay, cost model, sweep and plots behind `ztier sim`.

pub mod lackey;
pub mod trace;
