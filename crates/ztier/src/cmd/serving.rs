//! What the NBD servers (`ztier blk serve`, `ztier cache serve`) share:
//! signals that stop them, the unix socket (a stale one replaced), the
//! loopback-only rule for addresses.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};

/// Blocks SIGINT/SIGTERM/SIGHUP in this thread (and the threads it
/// starts) and sets `stop` from a waiter thread when one arrives.
pub fn stop_on_signals(who: &'static str, stop: Arc<AtomicBool>) {
    // SAFETY: sigset manipulation on a local value, then pthread_sigmask on it.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    std::thread::spawn(move || {
        let mut sig: libc::c_int = 0;
        // SAFETY: sigwait on the set blocked above.
        if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
            eprintln!("ztier {who}: signal {sig}: stopping");
            stop.store(true, Ordering::Release);
        }
    });
}

/// Binds the unix socket at `path`. A socket file nobody listens on (a
/// server that crashed left it: connecting is refused) is replaced; a live
/// one, or anything that is not a socket, is refused.
pub fn bind_unix(who: &str, path: &Path) -> Result<std::os::unix::net::UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if !m.file_type().is_socket() {
            bail!("{} exists and is not a socket: remove it or give another --socket", path.display());
        }
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => {
                bail!("{}: another server listens there: stop it or give another --socket", path.display())
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                eprintln!(
                    "ztier {who}: {}: nobody listens (a server that stopped without removing it): replacing it",
                    path.display()
                );
                std::fs::remove_file(path)
                    .with_context(|| format!("removing the stale {}", path.display()))?;
            }
            Err(e) => bail!(
                "{}: cannot tell whether a server listens there ({e}): remove it or give another --socket",
                path.display()
            ),
        }
    }
    std::os::unix::net::UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))
}

/// The socket file at `path` is still the one bound (dev, inode).
pub fn same_file(path: &Path, id: Option<(u64, u64)>) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino())) == id && id.is_some()
}

/// `addr` parsed; refused unless loopback or `allow`.
pub fn loopback_or_allowed(flag: &str, addr: &str, allow: bool) -> Result<std::net::SocketAddr> {
    let sa: std::net::SocketAddr = addr.parse().with_context(|| format!("--{flag} {addr}: not ADDR:PORT"))?;
    if !sa.ip().is_loopback() && !allow {
        bail!("--{flag} {addr} is not a loopback address: NBD and the metrics have no authentication; add --allow-remote to mean it");
    }
    Ok(sa)
}
