//! RAMster on Redis: a next tier ([`ztier_store::tier::NextTier`]) that
//! keeps the store's evicted pages, still compressed, in the RAM of other
//! machines — a Redis server or a Redis Cluster — with the local spill
//! file as the fallback when the remote is unreachable, full or slow.
//!
//! * [`config`] — the servers, credentials (never from a URL), durability.
//! * [`link`] — connections: single server or cluster (the `redis`
//!   crate's blocking client: `MOVED`/`ASK`/`TRYAGAIN`/`CLUSTERDOWN`);
//!   `getter` — a single server's gets over plain TCP, read straight
//!   into the caller's page buffers.
//! * [`seal`] — the value format: keyed MAC (BLAKE3) or encryption
//!   (AES-256-GCM), and names that reveal nothing.
//! * [`tier`] — [`RemoteTier`]: the index, the pending queue and the
//!   flusher thread that writes batches per hash tag, pipelined.
//! * [`hub`] — [`hub::Hub`]: one flusher (a thread, a connection, one
//!   pipeline) for the tiers of a process that write to one server.
//! * [`stats`] — counters and latency histograms.
//! * [`testbed`] — local `redis-server` processes (a server, a cluster)
//!   for tests and benchmarks.
//! * [`proxy`] — the tiers of a `ztier run`'s processes, kept in the
//!   `ztier run` process, served over a unix socket each;
//!   [`client`] — the next tier a process under `ztier run --remote`
//!   uses to reach it ([`wire`]: their protocol).
//!
//! Without the `server` feature (on by default) only [`wire`] and
//! [`client`] are built: what the run library links (no Redis client,
//! TLS or ciphers in a managed program).
//!
//! What is promised on the loss of a server, a slow network or a full
//! cluster is written in `docs/remote.md`.

pub mod client;
#[cfg(feature = "server")]
pub mod config;
#[cfg(feature = "server")]
pub(crate) mod getter;
pub mod hist;
#[cfg(feature = "server")]
pub mod hub;
#[cfg(feature = "server")]
pub mod link;
#[cfg(feature = "server")]
pub mod pool;
#[cfg(feature = "server")]
pub mod proxy;
#[cfg(feature = "server")]
pub mod seal;
#[cfg(feature = "server")]
pub mod stats;
#[cfg(feature = "server")]
pub mod testbed;
#[cfg(feature = "server")]
pub mod tier;
pub mod wire;

pub use client::ProxyTier;
#[cfg(feature = "server")]
pub use config::{Credentials, Durability, RemoteConfig};
#[cfg(feature = "server")]
pub use hub::Hub;
#[cfg(feature = "server")]
pub use proxy::{Proxy, Spill};
#[cfg(feature = "server")]
pub use stats::StatsSnapshot;
#[cfg(feature = "server")]
pub use tier::{remove_dead_runs, remove_run, RemoteTier, ServerCpu};

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
