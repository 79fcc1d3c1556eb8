//! The remote tier (`ztier run --remote`): the store's next tier is the
//! run's proxy in the `ztier run` process ([`ztier_remote::ProxyTier`]),
//! reached through one unix socket, which is kept out of the program's
//! way like the library's other descriptors (`fds::keep`, handed in by
//! the manager, so that this module depends on none of the library's). The Redis
//! client, its connections, threads and keys, and the spill file that
//! is the remote's fallback, live in the `ztier run` process.

use std::io;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::os::unix::net::UnixStream;
use std::sync::OnceLock;

use ztier_remote::ProxyTier;
use ztier_store::tier::NextTier;

/// The tier, for its statistics (the store holds a clone).
static TIER: OnceLock<ProxyTier> = OnceLock::new();

/// The remote tier, if `ztier run --remote` set it up
/// (`ZTIER_REMOTE_SOCKET`, `ZTIER_REMOTE_TOKEN`): connected, and its
/// proxy has taken this process. `keep` moves the socket's descriptor
/// out of the program's way (`fds::keep`) and returns its number.
pub fn tier(keep: fn(i32) -> i32) -> io::Result<Option<Box<dyn NextTier>>> {
    let Some(name) = std::env::var(ztier_run_core::names::env::REMOTE_SOCKET).ok().filter(|s| !s.is_empty())
    else {
        return Ok(None);
    };
    let token = std::env::var(ztier_run_core::names::env::REMOTE_TOKEN).unwrap_or_default();
    let t = ProxyTier::connect(Box::new(move || connect(&name, keep)), token.as_bytes())
        .map_err(|e| io::Error::new(e.kind(), format!("the remote tier (ztier run --remote): {e}")))?;
    let _ = TIER.set(t.clone());
    Ok(Some(Box::new(t)))
}

fn connect(name: &str, keep: fn(i32) -> i32) -> io::Result<UnixStream> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let s = UnixStream::connect_addr(&addr)?;
    // SAFETY: the socket's descriptor, moved up and kept (`keep`): owned
    // by this stream alone.
    Ok(unsafe { UnixStream::from_raw_fd(keep(s.into_raw_fd())) })
}

/// `json` (one object, as `stats_json` makes it) with the remote tier's
/// statistics added as `"remote"` ([`stats::REMOTE`](ztier_run_core::names::stats::REMOTE)).
pub fn add_stats(json: String) -> String {
    let Some(t) = TIER.get() else { return json };
    let remote = match t.stats_json() {
        Ok(s) => s,
        Err(e) => format!("{{\"error\":{:?}}}", e.to_string()),
    };
    match json.trim_end().strip_suffix('}') {
        Some(head) => format!("{head},\"{}\":{remote}}}\n", ztier_run_core::names::stats::REMOTE),
        None => json,
    }
}
