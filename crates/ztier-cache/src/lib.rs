//! # ztier-cache — compressed caches in front of slow storage
//!
//! Two seed systems, over a backing that is a file, a block device or an
//! NBD export (a remote or cloud volume through nbdkit's curl/ssh/S3
//! plugins, reached with `ztier_blk::client`):
//!
//! * **FlaZ** (Klonatos et al. 2012, §2.2): an SSD used as a cache in front
//!   of the backing, every cached block kept compressed, so the same SSD
//!   holds more of the working set. Placement is chosen at creation:
//!   FlaZ's direct-mapped cache (one block per line), or set-associative
//!   with pseudo-LRU or CLOCK within a set.
//! * **cleancache/zcache** (Magenheimer 2012): clean blocks kept compressed
//!   in RAM, in an ephemeral pool of `ztier-store` that shrinks when the
//!   machine needs memory.
//!
//! Modules:
//!
//! * [`format`](mod@format) — the cache device's layout, drawn.
//! * [`dir`] — the directory: 6 bytes of RAM per line.
//! * [`log`] — the line store: compressed lines in segments written whole,
//!   recycled as a ring with second chances.
//! * [`admit`] — which blocks a full cache takes in (`--admission seen`).
//! * [`journal`] — invalidations recorded before writes reach the backing.
//! * [`cache`] — reads, writes, fills, the never-stale rule, recovery.
//! * [`ram`] and [`pressure`] — the RAM cache and how it notices pressure.
//! * [`seq`] — sequential streams that bypass.
//! * [`backend`] — the backing: file, block device, NBD, memory.
//! * [`stats`] — counters and latency histograms; [`report`] — what a
//!   served cache reports live (control socket, Prometheus).
//!
//! The cache is served over NBD by `ztier_blk::server` through the
//! [`ztier_blk::device::Device`] implementation at the end of this file.

pub mod admit;
pub mod backend;
pub mod cache;
pub mod dir;
pub mod format;
pub mod journal;
pub mod log;
pub mod pressure;
pub mod ram;
pub mod report;
pub mod seq;
pub mod stats;

use std::io;

use ztier_blk::engine::{BlkError, BlockState};

pub use cache::{Admission, Cache, CacheOptions, CacheStats, Mode};
pub use log::Pick;

/// Errors opening or creating a cache.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The device holds no cache (or both superblocks are damaged).
    #[error("not a ztier cache: {0}")]
    NotACache(String),
    /// The cache's metadata is damaged beyond use.
    #[error("the cache is damaged: {0}")]
    Damaged(String),
    /// The cache holds blocks of another backing.
    #[error(
        "the cache holds blocks of a backing of {cached} bytes, this one has {given}: give the backing it was made for, \
         or --discard to drop its contents and bind it to this one"
    )]
    WrongBacking {
        /// Size of the backing the cache was bound to.
        cached: u64,
        /// Size of the one given.
        given: u64,
    },
    /// The backing failed.
    #[error("backing: {0}")]
    Backing(String),
    /// The cache device failed.
    #[error("cache device: {0}")]
    Io(#[from] io::Error),
    /// Options that do not go together.
    #[error("{0}")]
    Options(String),
}

fn blk_err(e: io::Error) -> BlkError {
    match e.kind() {
        io::ErrorKind::StorageFull => BlkError::NoSpace,
        io::ErrorKind::Unsupported => BlkError::NotFast,
        io::ErrorKind::InvalidInput => BlkError::OutOfRange,
        _ => BlkError::Io(e),
    }
}

impl ztier_blk::device::Device for Cache {
    fn size(&self) -> u64 {
        Cache::size(self)
    }
    fn block_size(&self) -> usize {
        format::BLOCK
    }
    fn read_only(&self) -> bool {
        Cache::read_only(self)
    }
    /// Its fills run in [`ztier_blk::device::Device::after_reply`], on the same thread.
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), BlkError> {
        Cache::read_deferring_fills(self, off, buf).map_err(blk_err)
    }
    fn after_reply(&self) {
        Cache::run_deferred_fills(self)
    }
    fn write(&self, off: u64, data: &[u8], fua: bool) -> Result<(), BlkError> {
        Cache::write(self, off, data, fua).map_err(blk_err)
    }
    fn flush(&self) -> Result<(), BlkError> {
        Cache::flush(self).map_err(blk_err)
    }
    fn trim(&self, off: u64, len: u64, fua: bool) -> Result<(), BlkError> {
        Cache::trim(self, off, len, fua).map_err(blk_err)
    }
    fn write_zeroes(&self, off: u64, len: u64, fast: bool, fua: bool) -> Result<(), BlkError> {
        Cache::write_zeroes(self, off, len, fast, fua).map_err(blk_err)
    }
    fn block_states(&self, _lba: u64, n: u64) -> Vec<BlockState> {
        vec![BlockState::Data; n as usize]
    }
    fn read_fast(&self, off: u64, buf: &mut [u8]) -> Option<Result<(), BlkError>> {
        Cache::read_fast(self, off, buf).map(|r| r.map_err(blk_err))
    }
    fn write_fast(&self, off: u64, data: &[u8], fua: bool) -> Option<Result<(), BlkError>> {
        Cache::write_fast(self, off, data, fua).map(|r| r.map_err(blk_err))
    }
}
