//! One module per subcommand.

pub mod bench;
pub mod bench_blk;
pub mod bench_cache;
pub mod bench_codecs;
pub mod bench_pressure;
pub mod bench_pressure_suite;
pub mod bench_remote;
pub mod bench_store;
pub mod bench_uffd;
pub mod blk;
pub mod cache;
pub mod demo;
pub mod docs;
pub mod faults;
pub mod hold;
pub mod remote;
pub mod run;
pub mod serving;
pub mod sim;
pub mod trace;
