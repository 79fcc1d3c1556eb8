//! # ztier-run-core — the run library's parts that need no LD_PRELOAD
//!
//! `ztier run` is two programs that must agree: the command, which starts
//! the program and reads what it left, and the library preloaded into it
//! (`ztier-preload`). What they share lives here, testable with plain
//! `cargo test`:
//!
//! * [`faultlog`] — the fault log's rows, its CSV format, its writer and
//!   its parser (`ztier run --fault-log`, `ztier faults`, `ztier sim
//!   --fault-log`).
//! * [`names`] — the `ZTIER_*` environment variables the command sets
//!   for the library, and the control socket's requests.

pub mod faultlog;
pub mod names;
