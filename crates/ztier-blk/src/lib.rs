//! # ztier-blk — a compressed block device served over NBD
//!
//! The ZBD design (Klonatos et al., "Transparent Online Storage
//! Compression at the Block-Level", ACM TOS 2012) in user space: every
//! logical block is compressed on its own and packed with others into
//! fixed-size extents written out of place; a logical-to-physical table in
//! RAM, persisted by checkpoints; a cleaner that compacts extents; recovery
//! that replays the log written since the last checkpoint.
//!
//! * [`format`](mod@format) — the image layout, drawn.
//! * [`engine`] — the engine: writes, reads, flush, trim, zeroes, cleaner,
//!   checkpoints, recovery, audit, statistics.
//! * [`backing`] — the image file, and a device that forgets unflushed
//!   writes for crash tests.
//! * [`nbd`] — the NBD protocol: handshake, options, requests, replies.
//! * [`server`] — the NBD server over a unix socket or loopback TCP, for
//!   any [`device::Device`], and what it reports live.
//! * [`live`] — live statistics for any ztier server: the control socket,
//!   the Prometheus endpoint, latency histograms.
//! * [`client`] — an NBD client (fixed newstyle, structured replies,
//!   several connections), for devices that sit on an NBD export.

pub mod backing;
pub mod client;
mod crc;
pub mod device;
pub mod engine;
pub mod format;
pub mod live;
pub mod nbd;
pub mod server;

pub use engine::{BlkError, CreateOptions, Engine, Stats};
