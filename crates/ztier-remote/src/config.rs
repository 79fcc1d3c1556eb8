//! What a remote tier is told: where the servers are, who it is to them,
//! how hard it tries to keep a page.
//!
//! The servers are given as a comma-separated list of URLs, as
//! `--remote` takes them: `redis://host:port` (plain TCP),
//! `rediss://host:port` (TLS), optionally with an ACL user
//! (`redis://ztier@host:port`). A list of several is a Redis Cluster
//! (any of its nodes will do: the others are found from it); one URL is
//! a single server or a cluster, whichever it says it is. An element
//! after the first may leave the scheme out (`host:port`).
//!
//! A password is never taken from a URL: URLs end up on command lines,
//! where every user of the machine can read them (`ps`). It comes from
//! the environment (`ZTIER_REMOTE_PASSWORD`, and `ZTIER_REMOTE_USER` for
//! the user) or from a file ([`Credentials::from_file`]: one line, `PASSWORD`
//! or `USER PASSWORD`, readable by its owner only).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::RemoteError;

/// One server: host and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Node {
    /// Host name or address.
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl std::fmt::Display for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// How a page put to the remote tier is kept against the loss of a
/// server. See `docs/remote.md` for what each one promises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// `replica+local` where every master has a replica, else `local`.
    Auto,
    /// Written to the master only: lost with it (for ephemeral data).
    None,
    /// Written to the master and acknowledged by one of its replicas
    /// (`WAIT 1`) before the page is let go locally: survives the loss
    /// of any one server.
    Replica,
    /// Written to the master, and a copy to the local spill file: survives
    /// the loss of every server.
    Local,
    /// Both.
    ReplicaLocal,
}

impl Durability {
    /// Whether a put waits for a replica.
    pub fn waits(self) -> bool {
        matches!(self, Durability::Replica | Durability::ReplicaLocal)
    }

    /// Whether a put keeps a local copy.
    pub fn local(self) -> bool {
        matches!(self, Durability::Local | Durability::ReplicaLocal)
    }

    /// The name `--remote-durability` takes.
    pub fn name(self) -> &'static str {
        match self {
            Durability::Auto => "auto",
            Durability::None => "none",
            Durability::Replica => "replica",
            Durability::Local => "local",
            Durability::ReplicaLocal => "replica+local",
        }
    }
}

impl std::str::FromStr for Durability {
    type Err = RemoteError;

    fn from_str(s: &str) -> Result<Self, RemoteError> {
        Ok(match s {
            "auto" => Durability::Auto,
            "none" => Durability::None,
            "replica" => Durability::Replica,
            "local" => Durability::Local,
            "replica+local" | "local+replica" => Durability::ReplicaLocal,
            _ => {
                return Err(RemoteError::Config(format!(
                    "unknown durability {s:?}: auto, none, replica, local or replica+local"
                )))
            }
        })
    }
}

/// An ACL user and password.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// The ACL user (`None`: the default user).
    pub user: Option<String>,
    /// The password.
    pub password: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "(hidden)"))
            .finish()
    }
}

/// The environment variable holding the password.
pub const ENV_PASSWORD: &str = "ZTIER_REMOTE_PASSWORD";
/// The environment variable holding the ACL user.
pub const ENV_USER: &str = "ZTIER_REMOTE_USER";

impl Credentials {
    /// From `ZTIER_REMOTE_USER` / `ZTIER_REMOTE_PASSWORD` (either may be
    /// unset).
    pub fn from_env() -> Self {
        let get = |v| std::env::var(v).ok().filter(|s: &String| !s.is_empty());
        Credentials { user: get(ENV_USER), password: get(ENV_PASSWORD) }
    }

    /// From a file: its first line is `PASSWORD` or `USER PASSWORD`. The
    /// file must not be readable by its group or others (as ssh asks of
    /// a key), since the password is in it in clear.
    pub fn from_file(path: &Path) -> Result<Self, RemoteError> {
        use std::os::unix::fs::MetadataExt;
        let bad = |why: String| RemoteError::Config(format!("{}: {why}", path.display()));
        let md = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
        if md.mode() & 0o077 != 0 {
            return Err(bad(format!(
                "readable by others (mode {:o}): the password in it would be too; chmod 600 it",
                md.mode() & 0o777
            )));
        }
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let line = text.lines().next().unwrap_or("").trim();
        let words: Vec<&str> = line.split_whitespace().collect();
        match words[..] {
            [p] => Ok(Credentials { user: None, password: Some(p.to_string()) }),
            [u, p] => Ok(Credentials { user: Some(u.to_string()), password: Some(p.to_string()) }),
            _ => Err(bad("its first line must be PASSWORD or USER PASSWORD".into())),
        }
    }
}

/// Everything a [`crate::RemoteTier`] needs.
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// The servers (one: a single server or a cluster; several: a cluster).
    pub nodes: Vec<Node>,
    /// Connect with TLS (`rediss://`).
    pub tls: bool,
    /// A PEM file of the certificate authorities to trust for TLS (else
    /// the system's).
    pub tls_ca: Option<PathBuf>,
    /// ACL user and password.
    pub credentials: Credentials,
    /// Encrypt page contents (AES-256-GCM, which authenticates them too;
    /// the default), or only authenticate them (a BLAKE3 MAC; the server
    /// holds the pages in clear). With AES instructions (x86-64 AES-NI
    /// and PCLMULQDQ, Armv8 AES) encrypting a 4 KiB page takes less time
    /// than its MAC: 0.6 µs against 1.35 µs on the machine measured.
    pub encrypt: bool,
    /// How a page is kept against the loss of a server.
    pub durability: Durability,
    /// Pages written in one batch (one hash tag, so one slot and one server).
    pub batch_pages: usize,
    /// Batches (of different hash tags, so spread over the masters) sent
    /// in one pipeline, at most.
    pub batches_per_round: usize,
    /// Bytes of pages waiting to be written, at most; beyond, puts go to
    /// the fallback (the remote is too slow).
    pub pending_bytes: usize,
    /// How long one request may take before the server counts as slow or
    /// gone (connect, write, read).
    pub timeout: Duration,
    /// How long a get keeps trying (through a failover) before it fails.
    pub get_deadline: Duration,
    /// How long a batch waits for a replica's acknowledgement.
    pub wait_timeout: Duration,
    /// After a failure, puts go to the fallback for this long before the
    /// remote is tried again (doubling up to 16 times this while it fails).
    pub retry_after: Duration,
    /// The run this process belongs to (keys' namespace, shared by the
    /// processes of one `ztier run`, so the run can remove what they
    /// leave): 12 hex digits. `None`: a random one.
    pub run_id: Option<String>,
}

impl RemoteConfig {
    /// Parses a `--remote` list, with credentials from the environment.
    pub fn parse(list: &str) -> Result<Self, RemoteError> {
        let mut nodes = Vec::new();
        let mut tls = None;
        let mut user = None;
        for (i, part) in list.split(',').map(str::trim).enumerate() {
            if part.is_empty() {
                continue;
            }
            let (scheme, rest) = match part.split_once("://") {
                Some((s, r)) => (Some(s), r),
                None if i > 0 => (None, part),
                None => {
                    return Err(RemoteError::Config(format!(
                        "{part:?}: a remote is redis://HOST:PORT or rediss://HOST:PORT (TLS)"
                    )))
                }
            };
            let t = match scheme {
                Some("redis") => Some(false),
                Some("rediss") => Some(true),
                Some(s) => return Err(RemoteError::Config(format!("{part:?}: unknown scheme {s:?}"))),
                None => None,
            };
            if let Some(t) = t {
                if tls.is_some_and(|x| x != t) {
                    return Err(RemoteError::Config("the remotes mix redis:// and rediss://".into()));
                }
                tls = Some(t);
            }
            let rest = rest.trim_end_matches('/');
            let hostport = match rest.rsplit_once('@') {
                Some((auth, hp)) => {
                    if auth.contains(':') {
                        return Err(RemoteError::Config(format!(
                            "{}: a password on the command line is readable by every user of the \
                             machine; give it in {ENV_PASSWORD} or a file (--remote-auth FILE)",
                            part.replace(auth, "USER:***")
                        )));
                    }
                    if user.as_ref().is_some_and(|u: &String| u != auth) {
                        return Err(RemoteError::Config("the remotes name different users".into()));
                    }
                    user = Some(auth.to_string());
                    hp
                }
                None => rest,
            };
            nodes.push(parse_hostport(hostport)?);
        }
        if nodes.is_empty() {
            return Err(RemoteError::Config("no remote server given".into()));
        }
        let mut credentials = Credentials::from_env();
        if user.is_some() {
            credentials.user = user;
        }
        Ok(RemoteConfig {
            nodes,
            tls: tls.unwrap_or(false),
            tls_ca: None,
            credentials,
            encrypt: true,
            durability: Durability::Auto,
            batch_pages: 32,
            batches_per_round: 8,
            pending_bytes: 4 << 20,
            timeout: Duration::from_millis(500),
            get_deadline: Duration::from_secs(30),
            wait_timeout: Duration::from_millis(1000),
            retry_after: Duration::from_millis(250),
            run_id: None,
        })
    }

    /// The list as `--remote` takes it (no password in it).
    pub fn url_list(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let user = self.credentials.user.as_ref().map(|u| format!("{u}@")).unwrap_or_default();
        self.nodes.iter().map(|n| format!("{scheme}://{user}{n}")).collect::<Vec<_>>().join(",")
    }
}

fn parse_hostport(s: &str) -> Result<Node, RemoteError> {
    let bad = || RemoteError::Config(format!("{s:?}: expected HOST:PORT"));
    let (host, port) = if let Some(r) = s.strip_prefix('[') {
        let (h, p) = r.split_once("]:").ok_or_else(bad)?;
        (h, p)
    } else {
        s.rsplit_once(':').ok_or_else(bad)?
    };
    if host.is_empty() || host.contains('/') {
        return Err(bad());
    }
    let port: u16 = port.parse().map_err(|_| bad())?;
    if port == 0 {
        return Err(bad());
    }
    Ok(Node { host: host.to_string(), port })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_and_passwords_are_refused() {
        let c = RemoteConfig::parse("redis://127.0.0.1:7000,127.0.0.1:7001, redis://h:7002").unwrap();
        assert_eq!(c.nodes.len(), 3);
        assert_eq!(c.nodes[2], Node { host: "h".into(), port: 7002 });
        assert!(!c.tls);
        let c = RemoteConfig::parse("rediss://ztier@[::1]:6380").unwrap();
        assert!(c.tls);
        assert_eq!(c.credentials.user.as_deref(), Some("ztier"));
        assert_eq!(c.nodes[0].to_string(), "[::1]:6380");
        assert_eq!(c.url_list(), "rediss://ztier@[::1]:6380");
        let e = RemoteConfig::parse("redis://u:secret@h:1").unwrap_err().to_string();
        assert!(e.contains("readable by every user") && !e.contains("secret"), "{e}");
        for bad in
            ["", "h:1", "http://h:1", "redis://h", "redis://h:0", "redis://h:x", "redis://h:1,rediss://g:2"]
        {
            assert!(RemoteConfig::parse(bad).is_err(), "{bad}");
        }
        assert_eq!("replica+local".parse::<Durability>().unwrap(), Durability::ReplicaLocal);
        assert!("twice".parse::<Durability>().is_err());
    }

    #[test]
    fn a_password_file_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("ztier-remote-cred-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("auth");
        std::fs::write(&f, "ztier s3cret\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Credentials::from_file(&f).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = Credentials::from_file(&f).unwrap();
        assert_eq!((c.user.as_deref(), c.password.as_deref()), (Some("ztier"), Some("s3cret")));
        assert!(!format!("{c:?}").contains("s3cret"));
        std::fs::write(&f, "only\n").unwrap();
        assert_eq!(Credentials::from_file(&f).unwrap().user, None);
        std::fs::write(&f, "a b c\n").unwrap();
        assert!(Credentials::from_file(&f).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
