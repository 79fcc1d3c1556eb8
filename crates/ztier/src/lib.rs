//! The `ztier` command's library part: launching a program under `ztier
//! run`'s preloaded library and measuring it ([`launch`]: what `ztier
//! run`, `ztier demo`, `ztier bench pressure` and `ztier hold` share),
//! the remote tier's options and proxy around a run ([`remote_args`]),
//! the argument conventions ([`units`]) and scratch folders
//! ([`scratch`]). The binary (`main.rs`, `cmd/`) parses the command line
//! and calls into it; nothing here calls a command module.

pub mod launch;
pub mod remote_args;
pub mod scratch;
pub mod units;
