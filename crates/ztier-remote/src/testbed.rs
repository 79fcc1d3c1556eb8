//! Local `redis-server` processes for tests and benchmarks: one server,
//! or a cluster of masters with replicas, on free loopback ports, each
//! in a folder of its own, stopped by PID (never by name).
//!
//! Debian's `redis-server` and `redis-tools` must be installed
//! (`scripts/deb-packages/remote.txt`); a missing one is an error that
//! says so, not a skip.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How the servers are set up.
#[derive(Debug, Clone)]
pub struct Options {
    /// An ACL user with every right and this password (the default user
    /// is switched off).
    pub auth: Option<(String, String)>,
    /// `cluster-node-timeout` in ms (a failover starts after it).
    pub node_timeout_ms: u64,
    /// `maxmemory` in bytes (with `noeviction`: a full server refuses writes).
    pub maxmemory: Option<u64>,
    /// TLS only (no plain port): the certificate, key and CA files.
    pub tls: Option<(PathBuf, PathBuf, PathBuf)>,
    /// Server threads for I/O.
    pub io_threads: usize,
    /// The CPU the servers are bound to (`taskset -c`), if any.
    pub cpu: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Options { auth: None, node_timeout_ms: 1000, maxmemory: None, tls: None, io_threads: 1, cpu: None }
    }
}

/// One `redis-server`.
pub struct Server {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Its folder.
    pub dir: PathBuf,
    child: Option<Child>,
}

impl Server {
    /// Its process id (while it runs).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Whether it was started and not yet stopped.
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// `SIGKILL`, then reaped.
    pub fn kill(&mut self) {
        self.signal(libc::SIGKILL);
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }

    /// Sends a signal (`SIGSTOP`, `SIGCONT`...).
    pub fn signal(&self, sig: i32) {
        if let Some(c) = &self.child {
            // SAFETY: kill(2) on our own child's pid; no memory involved.
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }
}

/// Servers started together, stopped when dropped.
pub struct Testbed {
    /// The servers, masters first for a cluster.
    pub servers: Vec<Server>,
    /// Whether they form a cluster.
    pub cluster: bool,
    /// How they were set up.
    pub opts: Options,
    dir: PathBuf,
}

/// A port `p` on 127.0.0.1 free now, with `p + 10000` (a cluster's bus)
/// free too.
fn free_port() -> io::Result<u16> {
    for _ in 0..200 {
        let l = TcpListener::bind("127.0.0.1:0")?;
        let p = l.local_addr()?.port();
        if p < 55000 && TcpListener::bind(("127.0.0.1", p + 10000)).is_ok() {
            return Ok(p);
        }
    }
    Err(io::Error::other("no free pair of loopback ports"))
}

fn need(tool: &str) -> io::Result<()> {
    match Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status() {
        Ok(_) => Ok(()),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("{tool}: {e} (install Debian's redis-server and redis-tools: scripts/deb-packages/remote.txt)"),
        )),
    }
}

impl Testbed {
    fn new(opts: &Options, cluster: bool) -> io::Result<Testbed> {
        need("redis-server")?;
        need("redis-cli")?;
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ztier-redis-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)?;
        Ok(Testbed { servers: Vec::new(), cluster, opts: opts.clone(), dir })
    }

    /// One server.
    pub fn single(opts: &Options) -> io::Result<Testbed> {
        let mut t = Testbed::new(opts, false)?;
        t.start_server()?;
        Ok(t)
    }

    /// A cluster of `masters` masters with `replicas` replicas each,
    /// serving every slot, its replicas in sync.
    pub fn cluster(masters: usize, replicas: usize, opts: &Options) -> io::Result<Testbed> {
        let mut t = Testbed::new(opts, true)?;
        for _ in 0..masters * (1 + replicas) {
            t.start_server()?;
        }
        let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
        args.extend(t.servers.iter().map(|s| format!("127.0.0.1:{}", s.port)));
        args.extend(["--cluster-replicas".into(), replicas.to_string(), "--cluster-yes".into()]);
        let out = t.cli_at(t.servers[0].port, &args)?;
        if !out.contains("[OK] All 16384 slots covered") {
            return Err(io::Error::other(format!("redis-cli --cluster create failed:\n{out}")));
        }
        t.wait_cluster_ok(masters, replicas, Duration::from_secs(20))?;
        Ok(t)
    }

    fn start_server(&mut self) -> io::Result<()> {
        let mut last = None;
        for _ in 0..5 {
            let port = free_port()?;
            let dir = self.dir.join(port.to_string());
            std::fs::create_dir_all(&dir)?;
            let mut conf = format!(
                "bind 127.0.0.1\nport {port}\ndir {}\nsave \"\"\nappendonly no\nlogfile {}\n\
                 daemonize no\nprotected-mode yes\n",
                dir.display(),
                dir.join("log").display()
            );
            if self.opts.io_threads > 1 {
                conf += &format!("io-threads {}\nio-threads-do-reads yes\n", self.opts.io_threads);
            }
            if let Some((cert, key, ca)) = &self.opts.tls {
                conf = conf.replace(&format!("port {port}\n"), "port 0\n");
                conf += &format!(
                    "tls-port {port}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n\
                     tls-auth-clients no\ntls-replication yes\ntls-cluster yes\n",
                    cert.display(),
                    key.display(),
                    ca.display()
                );
            }
            if self.cluster {
                conf += &format!(
                    "cluster-enabled yes\ncluster-config-file nodes.conf\ncluster-node-timeout {}\n\
                     cluster-replica-validity-factor 0\n",
                    self.opts.node_timeout_ms
                );
            }
            if let Some(m) = self.opts.maxmemory {
                conf += &format!("maxmemory {m}\nmaxmemory-policy noeviction\n");
            }
            if let Some((u, p)) = &self.opts.auth {
                conf += &format!(
                    "user default off\nuser {u} on >{p} ~* &* +@all\nmasteruser {u}\nmasterauth {p}\n"
                );
            }
            let conf_path = dir.join("redis.conf");
            write_private(&conf_path, conf.as_bytes())?;
            let mut c = match self.opts.cpu {
                Some(cpu) => {
                    need("taskset")?;
                    let mut c = Command::new("taskset");
                    c.args(["-c", &cpu.to_string(), "redis-server"]);
                    c
                }
                None => Command::new("redis-server"),
            };
            let child =
                c.arg(&conf_path).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn()?;
            let mut s = Server { port, dir, child: Some(child) };
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(5) {
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    break;
                }
                if let Some(Ok(Some(_))) = s.child.as_mut().map(|c| c.try_wait()) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                self.servers.push(s);
                return Ok(());
            }
            let log = std::fs::read_to_string(s.dir.join("log")).unwrap_or_default();
            s.kill();
            last = Some(io::Error::other(format!("redis-server on port {port} did not start:\n{log}")));
        }
        Err(last.expect("tried"))
    }

    /// `redis-cli` at `port` with `args` (authenticated through the
    /// environment, TLS if the servers use it); its output.
    pub fn cli_at(&self, port: u16, args: &[String]) -> io::Result<String> {
        let mut c = Command::new("redis-cli");
        c.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
        if let Some((u, p)) = &self.opts.auth {
            c.args(["--user", u]).env("REDISCLI_AUTH", p);
        }
        if let Some((cert, key, ca)) = &self.opts.tls {
            c.arg("--tls").arg("--cert").arg(cert).arg("--key").arg(key).arg("--cacert").arg(ca);
        }
        let out = c.args(args).stdin(Stdio::null()).output()?;
        let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
        s.push_str(&String::from_utf8_lossy(&out.stderr));
        Ok(s)
    }

    /// [`Testbed::cli_at`] with `&str` arguments.
    pub fn cli(&self, port: u16, args: &[&str]) -> io::Result<String> {
        self.cli_at(port, &args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    /// Until every running node says `cluster_state:ok`, `masters`
    /// masters serve slots and each has `replicas` replicas linked.
    pub fn wait_cluster_ok(&self, masters: usize, replicas: usize, limit: Duration) -> io::Result<()> {
        let t = Instant::now();
        loop {
            let mut ok = true;
            for s in self.servers.iter().filter(|s| s.running()) {
                if !self.cli(s.port, &["CLUSTER", "INFO"])?.contains("cluster_state:ok") {
                    ok = false;
                }
            }
            if ok {
                let nodes = self.cluster_nodes()?;
                let topo = crate::link::parse_cluster_nodes(&nodes);
                let linked = self
                    .servers
                    .iter()
                    .filter(|s| s.running())
                    .filter(|s| {
                        self.cli(s.port, &["INFO", "replication"])
                            .is_ok_and(|r| r.contains("master_link_status:up"))
                    })
                    .count();
                if topo.masters.len() == masters
                    && topo.min_replicas >= replicas
                    && linked >= masters * replicas
                {
                    return Ok(());
                }
            }
            if t.elapsed() > limit {
                return Err(io::Error::other(format!(
                    "the cluster is not ready after {limit:?}:\n{}",
                    self.cluster_nodes()?
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `CLUSTER NODES` from a running node.
    pub fn cluster_nodes(&self) -> io::Result<String> {
        let s =
            self.servers.iter().find(|s| s.running()).ok_or_else(|| io::Error::other("no server runs"))?;
        self.cli(s.port, &["CLUSTER", "NODES"])
    }

    /// The ports of the masters now serving slots.
    pub fn master_ports(&self) -> io::Result<Vec<u16>> {
        let topo = crate::link::parse_cluster_nodes(&self.cluster_nodes()?);
        Ok(topo.masters.iter().filter_map(|m| m.rsplit_once(':')?.1.parse().ok()).collect())
    }

    /// The server on `port`.
    pub fn server(&mut self, port: u16) -> Option<&mut Server> {
        self.servers.iter_mut().find(|s| s.port == port)
    }

    /// The `--remote` list naming every server.
    pub fn url(&self) -> String {
        let scheme = if self.opts.tls.is_some() { "rediss" } else { "redis" };
        let user = self.opts.auth.as_ref().map(|(u, _)| format!("{u}@")).unwrap_or_default();
        self.servers
            .iter()
            .map(|s| format!("{scheme}://{user}127.0.0.1:{}", s.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Moves `slots` slots from the master on `from` to the master on
    /// `to` (`redis-cli --cluster reshard`), the keys with them.
    pub fn reshard(&self, from: u16, to: u16, slots: usize) -> io::Result<String> {
        // The nodes must agree on the slots first (after an earlier move).
        let t = Instant::now();
        loop {
            let check =
                self.cli_at(from, &["--cluster".into(), "check".into(), format!("127.0.0.1:{from}")])?;
            if !check.contains("[ERR]") {
                break;
            }
            if t.elapsed() > Duration::from_secs(20) {
                return Err(io::Error::other(format!("the nodes do not agree:\n{check}")));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let id = |p: u16| -> io::Result<String> { Ok(self.cli(p, &["CLUSTER", "MYID"])?.trim().to_string()) };
        let args: Vec<String> = vec![
            "--cluster".into(),
            "reshard".into(),
            format!("127.0.0.1:{from}"),
            "--cluster-from".into(),
            id(from)?,
            "--cluster-to".into(),
            id(to)?,
            "--cluster-slots".into(),
            slots.to_string(),
            "--cluster-yes".into(),
            "--cluster-pipeline".into(),
            "100".into(),
        ];
        let out = self.cli_at(from, &args)?;
        if out.contains("ERR") || out.contains("[ERR]") {
            return Err(io::Error::other(format!("reshard failed:\n{out}")));
        }
        Ok(out)
    }

    /// Keys on the server on `port` (`DBSIZE`).
    pub fn dbsize(&self, port: u16) -> io::Result<u64> {
        self.cli(port, &["DBSIZE"])?.trim().parse().map_err(|_| io::Error::other("DBSIZE: not a number"))
    }

    /// The folder the servers live in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

fn write_private(path: &Path, data: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.write_all(data)
}

impl Drop for Testbed {
    fn drop(&mut self) {
        for s in &mut self.servers {
            s.signal(libc::SIGCONT);
            s.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A fake server on a loopback port that speaks enough RESP to pass a
/// client's handshake and take writes (`INFO` says it is a single
/// server without replicas, other commands get `+OK`), but answers every
/// `GET` with `get_reply` (raw bytes: malformed RESP, an oversized
/// length, a wrong type); stops when dropped.
pub struct FakeServer {
    /// Its port.
    pub port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The commands of a buffer of pipelined RESP requests, by name
/// (upper-cased); `None` if the buffer does not parse (yet).
fn commands(buf: &[u8]) -> Option<(Vec<String>, usize)> {
    let mut names = Vec::new();
    let mut at = 0;
    let line = |at: usize| -> Option<(&[u8], usize)> {
        let end = buf[at..].windows(2).position(|w| w == b"\r\n")? + at;
        Some((&buf[at..end], end + 2))
    };
    while at < buf.len() {
        let (l, next) = line(at)?;
        let n: usize = std::str::from_utf8(l.strip_prefix(b"*")?).ok()?.parse().ok()?;
        at = next;
        for i in 0..n {
            let (l, next) = line(at)?;
            let len: usize = std::str::from_utf8(l.strip_prefix(b"$")?).ok()?.parse().ok()?;
            if buf.len() < next + len + 2 {
                return None;
            }
            if i == 0 {
                names.push(String::from_utf8_lossy(&buf[next..next + len]).to_ascii_uppercase());
            }
            at = next + len + 2;
        }
    }
    Some((names, at))
}

impl FakeServer {
    /// Starts it (see the type's docs).
    pub fn start(get_reply: Vec<u8>) -> io::Result<FakeServer> {
        let l = TcpListener::bind("127.0.0.1:0")?;
        let port = l.local_addr()?.port();
        l.set_nonblocking(true)?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let st = stop.clone();
        let thread = std::thread::spawn(move || {
            while !st.load(std::sync::atomic::Ordering::Relaxed) {
                match l.accept() {
                    Ok((mut c, _)) => {
                        let reply = get_reply.clone();
                        let st = st.clone();
                        std::thread::spawn(move || {
                            let _ = c.set_nonblocking(false);
                            let _ = c.set_read_timeout(Some(Duration::from_millis(100)));
                            let mut pending = Vec::new();
                            let mut buf = [0u8; 65536];
                            while !st.load(std::sync::atomic::Ordering::Relaxed) {
                                match c.read(&mut buf) {
                                    Ok(0) => break,
                                    Ok(n) => {
                                        pending.extend_from_slice(&buf[..n]);
                                        let Some((names, used)) = commands(&pending) else { continue };
                                        pending.drain(..used);
                                        let mut out = Vec::new();
                                        for name in names {
                                            match name.as_str() {
                                                "GET" => out.extend_from_slice(&reply),
                                                "INFO" => {
                                                    let body = "cluster_enabled:0\r\nconnected_slaves:0\r\n";
                                                    out.extend_from_slice(
                                                        format!("${}\r\n{body}\r\n", body.len()).as_bytes(),
                                                    );
                                                }
                                                "WAIT" | "UNLINK" => out.extend_from_slice(b":1\r\n"),
                                                _ => out.extend_from_slice(b"+OK\r\n"),
                                            }
                                        }
                                        if c.write_all(&out).is_err() {
                                            break;
                                        }
                                    }
                                    Err(e)
                                        if e.kind() == io::ErrorKind::WouldBlock
                                            || e.kind() == io::ErrorKind::TimedOut => {}
                                    Err(_) => break,
                                }
                            }
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Ok(FakeServer { port, stop, thread: Some(thread) })
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
