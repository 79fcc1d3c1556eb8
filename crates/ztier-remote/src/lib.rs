//! RAMster on Redis: a next tier ([`ztier_store::tier::NextTier`]) that
//! keeps the store's evicted pages, still compressed, in the RAM of other
//! machines — a Redis server or a Redis Cluster — with the local spill
//! file as the fallback when the remote is unreachable, full or slow.
//!
//! * [`config`] — the servers, credentials (never from a URL), durability.
//! * [`link`] — connections: single server or cluster (the `redis`
//!   crate's blocking client: `MOVED`/`ASK`/`TRYAGAIN`/`CLUSTERDOWN`).
//! * [`seal`] — the value format: keyed MAC (BLAKE3) or encryption
//!   (AES-256-GCM), and names that reveal nothing.
//! * [`tier`] — [`RemoteTier`]: the index, the pending queue and the
//!   flusher thread that writes batches per hash tag, pipelined.
//! * [`stats`] — counters and latency histograms.
//! * [`testbed`] — local `redis-server` processes (a server, a cluster)
//!   for tests and benchmarks.
//!
//! What is promised on the loss of a server, a slow network or a full
//! cluster is written in `docs/remote.md`.

pub mod config;
pub mod link;
pub mod seal;
pub mod stats;
pub mod testbed;
pub mod tier;

pub use config::{Credentials, Durability, RemoteConfig};
pub use stats::StatsSnapshot;
pub use tier::{remove_run, RemoteTier};

/// Why a remote tier could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The configuration is wrong (a URL, a file, an option).
    #[error("remote: {0}")]
    Config(String),
    /// The servers refused the credentials.
    #[error("remote: authentication failed: {0} (the user and password come from ZTIER_REMOTE_USER/ZTIER_REMOTE_PASSWORD or --remote-auth FILE)")]
    Auth(String),
    /// No server could be reached.
    #[error("remote: cannot connect: {0}")]
    Connect(String),
    /// Durability `replica` asked of servers some master of which has no replica.
    #[error("remote: durability {0} needs a replica for every master, and one has none (use --remote-durability local or none)")]
    NoReplicas(&'static str),
    /// Durability `local` asked without a local fallback.
    #[error("remote: durability {0} keeps a local copy, which needs a spill folder (--spill DIR)")]
    NoFallback(&'static str),
}
