//! What the NBD servers (`ztier blk serve`, `ztier cache serve`) share:
//! their listening flags and the listener they make, signals that stop
//! them, the unix socket (a stale one replaced), the loopback-only rule
//! for addresses.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use ztier_blk::server::Listener;

/// Where a server listens, and its metrics endpoint.
#[derive(Args, Debug)]
pub struct ListenArgs {
    /// Unix socket to listen on (default: the served file's path + `.sock`).
    #[arg(long, value_name = "PATH", conflicts_with = "listen")]
    pub socket: Option<PathBuf>,
    /// TCP address to listen on. Only loopback addresses unless
    /// --allow-remote is given (NBD has no authentication here).
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<String>,
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics (loopback
    /// only unless --allow-remote; port 0 picks one, printed at start).
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<String>,
    /// Allow non-loopback --listen and --metrics addresses.
    #[arg(long)]
    pub allow_remote: bool,
}

impl ListenArgs {
    /// `--metrics`, checked against the loopback rule.
    pub fn metrics_addr(&self) -> Result<Option<SocketAddr>> {
        self.metrics.as_deref().map(|m| loopback_or_allowed("metrics", m, self.allow_remote)).transpose()
    }

    /// Binds `--listen`, or the unix socket (`--socket`, or `served`'s
    /// path + `.sock`), for the export `name`: the listener, the URI
    /// clients reach it at, and what removes the socket at the end.
    pub fn bind(&self, who: &str, served: &Path, name: &str) -> Result<(Listener, String, Unbind)> {
        use std::os::unix::fs::MetadataExt;
        if let Some(addr) = &self.listen {
            let sa = loopback_or_allowed("listen", addr, self.allow_remote)?;
            let l = std::net::TcpListener::bind(sa).with_context(|| format!("listening on {addr}"))?;
            let local = l.local_addr()?;
            return Ok((Listener::Tcp(l), format!("nbd://{local}/{name}"), Unbind(None)));
        }
        let path = self.socket.clone().unwrap_or_else(|| {
            let mut p = served.as_os_str().to_owned();
            p.push(".sock");
            PathBuf::from(p)
        });
        let l = bind_unix(who, &path)?;
        let id = std::fs::symlink_metadata(&path).ok().map(|m| (m.dev(), m.ino()));
        let uri = format!("nbd+unix:///{name}?socket={}", path.display());
        Ok((Listener::Unix(l), uri, Unbind(Some((path, id)))))
    }
}

/// The unix socket a server bound (none for TCP).
pub struct Unbind(Option<(PathBuf, Option<(u64, u64)>)>);

impl Unbind {
    /// Removes the socket if it is still the one bound (dev, inode).
    pub fn remove(self) {
        if let Some((p, id)) = self.0 {
            if same_file(&p, id) {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

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
