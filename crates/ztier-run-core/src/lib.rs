//! # ztier-run-core — the run library's parts that need no LD_PRELOAD
//!
//! `ztier run` is two programs that must agree: the command, which starts
//! the program and reads what it left, and the library preloaded into it
//! (`ztier-preload`). What they share lives here, testable with plain
//! `cargo test`:
//!
//! * [`classes`] — the size classes of the library's `malloc`: a
//!   block's class, a class's object size, its free list and span.
//! * [`faultlog`] — the fault log's rows, its CSV format, its writer and
//!   its parser (`ztier run --fault-log`, `ztier faults`, `ztier sim
//!   --fault-log`).
//! * [`counters`] — the counters each process keeps while it runs
//!   (`PID.json`, the control socket's `stats`) and the fault service
//!   time's histogram.
//! * [`names`] — the `ZTIER_*` environment variables the command sets
//!   for the library, and the control socket's requests.
//! * [`state`] — the page-state byte of the arena and its transitions
//!   (the page-state machine).
//! * [`budget`] — the arithmetic of a process's part of the tree budget
//!   (what it owes the pool, how long a run a fault installs, the budget
//!   its replacement policy follows).
//! * [`treewait`] — a process's wait for the tree budget's pool (waking
//!   the others' evictors, how long, when it counts as failed).
//! * [`inherit`] — a forked child's pages shared with its parent (the
//!   tree budget's fork bookkeeping) and the page-map look that finds
//!   those no longer shared.
//! * [`handshake`] — the eviction handshake: the evictions in flight,
//!   and the background evictor's batch (victims taken back by a write,
//!   the seal, early commits, the commit), through an [`handshake::Arena`]
//!   the manager implements.
//! * [`victims`] — victim choice: the manager's verdict on each page
//!   the replacement policy offers (taken, held, set aside, requeued,
//!   stale) and on its neighbours, for the policy crate's loop
//!   ([`ztier_policy::pick`]).
//! * [`pins`] — the books of what keeps pages resident (pins, memory
//!   locks, threads' kept pins, holds) and of what a forked child gets.
//! * [`manager`] — the manager that drives these: the arena's page
//!   states, fault service, eviction into the compressed store, the tree
//!   budget's waits, pins, fork bookkeeping; its unit tests run over a
//!   real userfaultfd, without `LD_PRELOAD`.
//! * [`host`] — what the manager asks of the library it runs in (its own
//!   system-call entry, kept descriptors, log, settings, core-dump hooks,
//!   the remote tier), set once by the library at start-up; a plain one
//!   stands in elsewhere (the tests).
//! * [`sys`] — plain system calls by `syscall(2)`, for the manager and the
//!   library.

pub mod budget;
pub mod classes;
pub mod counters;
pub mod faultlog;
pub mod handshake;
pub mod host;
pub mod inherit;
pub mod manager;
pub mod names;
pub mod pins;
pub mod state;
pub mod sys;
pub mod treewait;
pub mod victims;
