//! Connections to the servers: a single server or a Redis Cluster, through
//! the `redis` crate's blocking client (its cluster client follows
//! `MOVED` and `ASK`, waits and retries on `TRYAGAIN`, `CLUSTERDOWN` and
//! `MASTERDOWN`, and refreshes its slot map when the cluster changes).
//!
//! Blocking, not async: a tier is called by the thread that needs the
//! page (a fault handler, under the store's lock), which can do no other
//! work until it has it; the thread that asks is the thread that reads
//! the reply, with no hand-over to a runtime's threads (a wake-up across
//! CPUs costs up to ~350 µs on the VMs measured, far above a loopback
//! round trip), no runtime threads or epoll descriptors inside the
//! program `ztier run` manages, and nothing to rebuild in a forked child
//! but the connections.

use std::collections::BTreeSet;
use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterClientBuilder, ClusterConnection};
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use redis::{Cmd, ConnectionLike, IntoConnectionInfo, RedisResult, Value};

use crate::config::RemoteConfig;
use crate::RemoteError;

/// What the servers turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// A Redis Cluster (else a single server).
    pub cluster: bool,
    /// Masters serving slots (`host:port`).
    pub masters: BTreeSet<String>,
    /// The fewest connected replicas any master has.
    pub min_replicas: usize,
}

/// Makes connections of one kind to one set of servers.
pub(crate) enum Connector {
    Single { client: redis::Client, timeout: Duration },
    Cluster(ClusterClient),
}

/// One connection (to every node, for a cluster).
pub(crate) enum Link {
    Single(redis::Connection),
    Cluster(Box<ClusterConnection>),
}

fn tcp() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

fn info_for(cfg: &RemoteConfig, node: &crate::config::Node) -> RedisResult<redis::ConnectionInfo> {
    let scheme = if cfg.tls { "rediss" } else { "redis" };
    let info = format!("{scheme}://{node}").as_str().into_connection_info()?;
    let mut rs = info.redis_settings().clone().set_skip_set_lib_name();
    if let Some(u) = &cfg.credentials.user {
        rs = rs.set_username(u);
    }
    if let Some(p) = &cfg.credentials.password {
        rs = rs.set_password(p);
    }
    Ok(info.set_redis_settings(rs).set_tcp_settings(tcp()))
}

fn certs(cfg: &RemoteConfig) -> Result<Option<redis::TlsCertificates>, RemoteError> {
    let Some(ca) = &cfg.tls_ca else { return Ok(None) };
    let pem = std::fs::read(ca).map_err(|e| RemoteError::Config(format!("{}: {e}", ca.display())))?;
    Ok(Some(redis::TlsCertificates { client_tls: None, root_cert: Some(pem) }))
}

/// What a connection error says, with the server named.
fn connect_error(node: &str, e: redis::RedisError) -> RemoteError {
    let auth = matches!(e.kind(), redis::ErrorKind::AuthenticationFailed)
        || e.code().is_some_and(|c| c == "WRONGPASS" || c == "NOAUTH" || c == "NOPERM");
    if auth {
        RemoteError::Auth(format!("{node}: {e}"))
    } else {
        RemoteError::Connect(format!("{node}: {e}"))
    }
}

impl Connector {
    /// Connects once to learn what the servers are, and checks that the
    /// credentials work.
    pub(crate) fn new(cfg: &RemoteConfig) -> Result<(Connector, Topology), RemoteError> {
        // TLS: rustls with ring, the only crypto provider built in (this
        // crate's `rustls` dependency), which rustls then takes by itself.
        let first = &cfg.nodes[0];
        let info = info_for(cfg, first).map_err(|e| RemoteError::Config(format!("{first}: {e}")))?;
        let client = match certs(cfg)? {
            Some(c) => redis::Client::build_with_tls(info, c),
            None => redis::Client::open(info),
        }
        .map_err(|e| RemoteError::Config(format!("{first}: {e}")))?;
        let mut probe = None;
        let mut last = None;
        // Any of the given nodes will do to start.
        for n in &cfg.nodes {
            let c = if n == first {
                Ok(client.clone())
            } else {
                let info = info_for(cfg, n).map_err(|e| RemoteError::Config(format!("{n}: {e}")))?;
                match certs(cfg)? {
                    Some(c) => redis::Client::build_with_tls(info, c),
                    None => redis::Client::open(info),
                }
            };
            match c.and_then(|c| c.get_connection_with_timeout(cfg.timeout)) {
                Ok(conn) => {
                    probe = Some((n.clone(), conn));
                    break;
                }
                Err(e) => {
                    let e = connect_error(&n.to_string(), e);
                    if matches!(e, RemoteError::Auth(_)) {
                        return Err(e);
                    }
                    last = Some(e);
                }
            }
        }
        let Some((node, mut conn)) = probe else {
            return Err(last.unwrap_or_else(|| RemoteError::Connect("no server".into())));
        };
        let _ = conn.set_read_timeout(Some(cfg.timeout));
        let info: String = redis::cmd("INFO")
            .arg("cluster")
            .query(&mut conn)
            .map_err(|e| connect_error(&node.to_string(), e))?;
        let cluster = info.lines().any(|l| l.trim() == "cluster_enabled:1");
        if !cluster {
            let repl: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut conn)
                .map_err(|e| connect_error(&node.to_string(), e))?;
            let replicas = repl
                .lines()
                .find_map(|l| l.trim().strip_prefix("connected_slaves:"))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let topo = Topology { cluster, masters: [node.to_string()].into(), min_replicas: replicas };
            return Ok((Connector::Single { client, timeout: cfg.timeout }, topo));
        }
        let nodes: Vec<redis::ConnectionInfo> = cfg
            .nodes
            .iter()
            .map(|n| info_for(cfg, n))
            .collect::<RedisResult<_>>()
            .map_err(|e| RemoteError::Config(e.to_string()))?;
        let mut b = ClusterClientBuilder::new(nodes)
            .connection_timeout(cfg.timeout)
            .response_timeout(cfg.timeout)
            .tcp_settings(tcp())
            .retries(6)
            .min_retry_wait(20)
            .max_retry_wait(400);
        if let Some(u) = &cfg.credentials.user {
            b = b.username(u);
        }
        if let Some(p) = &cfg.credentials.password {
            b = b.password(p);
        }
        if cfg.tls {
            b = b.tls(redis::TlsMode::Secure);
        }
        if let Some(c) = certs(cfg)? {
            b = b.certs(c);
        }
        let cc = b.build().map_err(|e| RemoteError::Config(e.to_string()))?;
        let mut link =
            Link::Cluster(Box::new(cc.get_connection().map_err(|e| connect_error(&node.to_string(), e))?));
        let topo = link.topology().map_err(|e| connect_error(&node.to_string(), e))?;
        Ok((Connector::Cluster(cc), topo))
    }

    /// A new connection.
    pub(crate) fn connect(&self) -> RedisResult<Link> {
        match self {
            Connector::Single { client, timeout } => {
                let c = client.get_connection_with_timeout(*timeout)?;
                c.set_read_timeout(Some(*timeout))?;
                c.set_write_timeout(Some(*timeout))?;
                Ok(Link::Single(c))
            }
            Connector::Cluster(cc) => Ok(Link::Cluster(Box::new(cc.get_connection()?))),
        }
    }

    /// Whether this is a cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Connector::Cluster(_))
    }
}

impl Link {
    /// Runs `cmds` (each one that may run twice) as one pipeline (per
    /// node, for a cluster). Commands answered with a redirection
    /// (`MOVED`, `ASK` while a slot migrates) or asked to wait
    /// (`TRYAGAIN`, `CLUSTERDOWN`) are sent again one by one, through
    /// the cluster client's own following of redirections (its
    /// pipelines do not follow them), a key at a time: a command on
    /// several keys of a slot that is moving is refused (`TRYAGAIN`)
    /// until the move is over unless every key is on one side already,
    /// which new names never are. Any other error reply fails the whole.
    pub(crate) fn pipeline(&mut self, cmds: &[Cmd]) -> RedisResult<()> {
        let r = match self {
            Link::Single(c) => {
                let mut p = redis::pipe();
                for cmd in cmds {
                    p.add_command(cmd.clone());
                }
                p.exec(c)
            }
            Link::Cluster(c) => {
                let mut p = redis::cluster::cluster_pipe();
                for cmd in cmds {
                    p.add_command(cmd.clone());
                }
                p.exec(c.as_mut())
            }
        };
        let Err(e) = r else { return Ok(()) };
        let Link::Cluster(c) = self else { return Err(e) };
        let Some(errs) = e.clone().into_server_errors() else { return Err(e) };
        use redis::ServerErrorKind as K;
        let again = |k: Option<K>| matches!(k, Some(K::Moved | K::Ask | K::TryAgain | K::ClusterDown));
        if errs.is_empty() || !errs.iter().all(|(_, se)| again(se.kind())) {
            return Err(e);
        }
        for (i, _) in errs.iter() {
            let cmd = cmds.get(*i).ok_or(e.clone())?;
            for one in split_keys(cmd) {
                c.req_command(one.as_ref().unwrap_or(cmd))?.extract_error()?;
            }
        }
        Ok(())
    }

    /// Runs `cmds` (each its arguments; each one that may run twice, and
    /// each on one slot) as one pipeline: packed into `buf` by hand for a
    /// single server (one copy of each value), through the cluster
    /// client's pipeline (per node) for a cluster. Any error reply fails
    /// the whole (but redirections: see [`Link::pipeline`]).
    pub(crate) fn exec(&mut self, cmds: &[Vec<&[u8]>], buf: &mut Vec<u8>) -> RedisResult<()> {
        match self {
            Link::Single(_) => {
                buf.clear();
                for cmd in cmds {
                    pack(buf, cmd);
                }
                self.exec_packed(buf, cmds.len())
            }
            Link::Cluster(_) => {
                // The cluster client pipelines no command on several
                // keys: one per key.
                let mut one = Vec::new();
                for args in cmds {
                    let c = args.iter().fold(Cmd::new(), |mut c, a| {
                        c.arg(*a);
                        c
                    });
                    for s in split_keys(&c) {
                        one.push(s.unwrap_or_else(|| c.clone()));
                    }
                }
                self.pipeline(&one)
            }
        }
    }

    /// Whether this is a single server's connection (which takes
    /// commands packed by hand: [`Link::exec_packed`]).
    pub(crate) fn is_single(&self) -> bool {
        matches!(self, Link::Single(_))
    }

    /// A single server: sends `n` commands packed in `buf` (RESP arrays,
    /// as [`pack`] makes them) as one pipeline; any error reply fails the
    /// whole. A cluster's connection refuses (its commands need routing:
    /// [`Link::exec`]).
    pub(crate) fn exec_packed(&mut self, buf: &[u8], n: usize) -> RedisResult<()> {
        let Link::Single(c) = self else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "commands packed by hand go to a single server only",
            )));
        };
        for v in c.req_packed_commands(buf, 0, n)? {
            v.extract_error()?;
        }
        Ok(())
    }

    /// A single server: sends the commands packed in `buf` without
    /// reading their replies ([`Link::replies`] reads them later; the
    /// flusher sends its next round first). A cluster's connection
    /// refuses.
    pub(crate) fn send_packed(&mut self, buf: &[u8]) -> RedisResult<()> {
        let Link::Single(c) = self else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "commands packed by hand go to a single server only",
            )));
        };
        c.send_packed_command(buf)
    }

    /// A single server: reads the replies of `n` commands sent by
    /// [`Link::send_packed`]; any error reply fails the whole (after
    /// every reply is read, so the connection stays in step).
    pub(crate) fn replies(&mut self, n: usize) -> RedisResult<()> {
        let Link::Single(c) = self else {
            return Err(redis::RedisError::from((redis::ErrorKind::Client, "no replies wait on a cluster")));
        };
        let mut first = Ok(());
        for _ in 0..n {
            let r = c.recv_response()?.extract_error();
            if first.is_ok() {
                first = r.map(|_| ());
            }
        }
        first
    }

    /// Several values (`None`: no such key), in order: one `MGET` for a
    /// single server, a `GET` each for a cluster (whose client pipelines
    /// no command on several keys), in one pipeline (per node). Any
    /// error fails the whole (the caller gets them one by one then).
    pub(crate) fn get_many(&mut self, names: &[&[u8]]) -> RedisResult<Vec<Option<Vec<u8>>>> {
        let bad = || {
            redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "GET answered with something else than strings",
            ))
        };
        let vals: Vec<Value> = match self {
            Link::Single(c) => {
                let v: Value = redis::cmd("MGET").arg(names).query(c)?;
                let Value::Array(v) = v else { return Err(bad()) };
                v
            }
            Link::Cluster(c) => {
                let mut p = redis::cluster::cluster_pipe();
                for n in names {
                    p.cmd("GET").arg(*n);
                }
                p.query(c.as_mut())?
            }
        };
        if vals.len() != names.len() {
            return Err(bad());
        }
        vals.into_iter()
            .map(|v| match v {
                Value::Nil => Ok(None),
                Value::BulkString(b) => Ok(Some(b)),
                _ => Err(bad()),
            })
            .collect()
    }

    /// `WAIT n timeout` on every master this link wrote to (all masters,
    /// for a cluster): the fewest replicas that acknowledged. The server
    /// answers when `timeout` is up at the latest, so the link's reads
    /// wait `timeout` plus `io_timeout` for it, then go back to
    /// `io_timeout`: a read timeout shorter than the WAIT's (the defaults:
    /// 500 ms against 1 s) made a slow replica an I/O error with the
    /// reply still on its way.
    pub(crate) fn wait(&mut self, n: usize, timeout: Duration, io_timeout: Duration) -> RedisResult<i64> {
        self.set_read_timeout(timeout + io_timeout)?;
        let r = self.wait_inner(n, timeout);
        let back = self.set_read_timeout(io_timeout);
        let got = r?;
        back?;
        Ok(got)
    }

    fn set_read_timeout(&self, t: Duration) -> RedisResult<()> {
        match self {
            Link::Single(c) => c.set_read_timeout(Some(t)),
            Link::Cluster(c) => c.set_read_timeout(Some(t)),
        }
    }

    fn wait_inner(&mut self, n: usize, timeout: Duration) -> RedisResult<i64> {
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(n).arg(timeout.as_millis().max(1) as u64);
        match self {
            Link::Single(c) => cmd.query(c),
            Link::Cluster(c) => {
                let v = c.route_command(
                    &cmd,
                    RoutingInfo::MultiNode((
                        MultipleNodeRoutingInfo::AllMasters,
                        Some(ResponsePolicy::Aggregate(redis::cluster_routing::AggregateOp::Min)),
                    )),
                )?;
                Ok(redis::from_redis_value(v)?)
            }
        }
    }

    /// One value, or `None` if there is no such key.
    pub(crate) fn get(&mut self, name: &[u8]) -> RedisResult<Option<Vec<u8>>> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(name);
        let v = match self {
            Link::Single(c) => c.req_command(&cmd)?,
            Link::Cluster(c) => c.req_command(&cmd)?,
        };
        match v {
            Value::Nil => Ok(None),
            Value::BulkString(b) => Ok(Some(b)),
            other => Err(redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "GET answered with something else than a string",
                format!("{other:?}").chars().take(80).collect::<String>(),
            ))),
        }
    }

    /// A command on its key's node.
    pub(crate) fn keyed(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Link::Single(c) => c.req_command(cmd),
            Link::Cluster(c) => c.req_command(cmd),
        }
    }

    /// A command on any node (one that touches no key).
    pub(crate) fn any(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Link::Single(c) => c.req_command(cmd),
            Link::Cluster(c) => c.route_command(
                cmd,
                RoutingInfo::SingleNode(redis::cluster_routing::SingleNodeRoutingInfo::Random),
            ),
        }
    }

    /// What the servers are now (for a cluster, from `CLUSTER NODES`).
    pub(crate) fn topology(&mut self) -> RedisResult<Topology> {
        match self {
            Link::Single(c) => {
                let repl: String = redis::cmd("INFO").arg("replication").query(c)?;
                let replicas = repl
                    .lines()
                    .find_map(|l| l.trim().strip_prefix("connected_slaves:"))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                Ok(Topology { cluster: false, masters: BTreeSet::new(), min_replicas: replicas })
            }
            Link::Cluster(_) => {
                let v = self.any(redis::cmd("CLUSTER").arg("NODES"))?;
                let text: String = redis::from_redis_value(v).map_err(redis::RedisError::from)?;
                Ok(parse_cluster_nodes(&text))
            }
        }
    }
}

/// Masters with slots, and the fewest replicas (connected, not failed)
/// of any of them, from `CLUSTER NODES`.
pub(crate) fn parse_cluster_nodes(text: &str) -> Topology {
    struct N<'a> {
        id: &'a str,
        addr: &'a str,
        master: bool,
        of: &'a str,
        ok: bool,
        slots: bool,
    }
    let nodes: Vec<N> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            let flags = f[2];
            Some(N {
                id: f[0],
                addr: f[1].split('@').next().unwrap_or(f[1]),
                master: flags.split(',').any(|x| x == "master"),
                of: f[3],
                ok: !flags.contains("fail") && f[7] == "connected",
                slots: f.len() > 8,
            })
        })
        .collect();
    let masters: Vec<&N> = nodes.iter().filter(|n| n.master && n.slots && n.ok).collect();
    let min_replicas = masters
        .iter()
        .map(|m| nodes.iter().filter(|r| !r.master && r.of == m.id && r.ok).count())
        .min()
        .unwrap_or(0);
    Topology { cluster: true, masters: masters.iter().map(|m| m.addr.to_string()).collect(), min_replicas }
}

/// `MSET` (of any number of keys: the cluster client refuses it in a
/// pipeline even with one) as a `SET` per key, and `UNLINK` of several
/// keys as one per key (`None`: the command as it is).
fn split_keys(cmd: &Cmd) -> Vec<Option<Cmd>> {
    let args: Vec<&[u8]> = cmd
        .args_iter()
        .filter_map(|a| match a {
            redis::Arg::Simple(b) => Some(b),
            _ => None,
        })
        .collect();
    let each = match args.first().map(|a| a.to_ascii_uppercase()) {
        Some(n) if n == b"MSET" && args.len() >= 3 => 2,
        Some(n) if n == b"UNLINK" && args.len() > 2 => 1,
        _ => return vec![None],
    };
    let single: &[u8] = if each == 2 { b"SET" } else { b"UNLINK" };
    args[1..]
        .chunks(each)
        .map(|kv| {
            let mut c = redis::cmd(std::str::from_utf8(single).expect("ascii"));
            for a in kv {
                c.arg(*a);
            }
            Some(c)
        })
        .collect()
}

/// The part of `key` that chooses its cluster slot: its hash tag (the
/// text between its first `{` and the next `}`, if not empty), else all
/// of it.
pub fn hash_tag(key: &[u8]) -> &[u8] {
    match key.iter().position(|&b| b == b'{') {
        Some(o) => match key[o + 1..].iter().position(|&b| b == b'}') {
            Some(c) if c > 0 => &key[o + 1..o + 1 + c],
            _ => key,
        },
        None => key,
    }
}

/// The cluster slot of `key` (CRC16-XMODEM of its hash tag, mod 16384).
pub fn slot_of(key: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(hash_tag(key)) % 16384
}

/// Appends a command (its arguments) to `buf` as the protocol (RESP)
/// sends it: an array of bulk strings.
pub(crate) fn pack(buf: &mut Vec<u8>, args: &[&[u8]]) {
    use std::io::Write;
    let _ = write!(buf, "*{}\r\n", args.len());
    for a in args {
        let _ = write!(buf, "${}\r\n", a.len());
        buf.extend_from_slice(a);
        buf.extend_from_slice(b"\r\n");
    }
}

/// `n` in decimal, appended to `buf` (the protocol's lengths, for
/// every page of a round: no formatting machinery).
pub(crate) fn push_decimal(buf: &mut Vec<u8>, n: usize) {
    let mut d = [0u8; 20];
    let (mut i, mut n) = (d.len(), n);
    loop {
        i -= 1;
        d[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf.extend_from_slice(&d[i..]);
}

/// `n` hash tags whose slots are spread evenly over the 16384 (so over
/// the masters, which hold ranges of them).
pub fn spread_tags(n: usize) -> Vec<String> {
    let n = n.clamp(1, 16384);
    let mut tags = vec![String::new(); n];
    let mut left = n;
    let mut t = 0u32;
    while left > 0 {
        let s = format!("{t:x}");
        let slot = slot_of(s.as_bytes()) as usize;
        let bucket = slot * n / 16384;
        if tags[bucket].is_empty() {
            tags[bucket] = s;
            left -= 1;
        }
        t += 1;
    }
    tags
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_key_commands_split() {
        let mset = redis::cmd("MSET").arg("a").arg("1").arg("b").arg("2").clone();
        let one: Vec<Vec<u8>> =
            split_keys(&mset).into_iter().map(|c| c.expect("split").get_packed_command()).collect();
        assert_eq!(
            one,
            [
                redis::cmd("SET").arg("a").arg("1").get_packed_command(),
                redis::cmd("SET").arg("b").arg("2").get_packed_command()
            ]
        );
        assert_eq!(split_keys(&redis::cmd("UNLINK").arg("a").arg("b").clone()).len(), 2);
        assert!(split_keys(&redis::cmd("GET").arg("a").clone())[0].is_none());
        assert!(split_keys(&redis::cmd("UNLINK").arg("a").clone())[0].is_none());
        // A batch of one page is still an MSET, which the cluster
        // client's pipeline refuses: a SET.
        let one = split_keys(&redis::cmd("MSET").arg("a").arg("1").clone());
        assert_eq!(one.len(), 1);
        assert_eq!(
            one[0].as_ref().expect("split").get_packed_command(),
            redis::cmd("SET").arg("a").arg("1").get_packed_command()
        );
    }

    #[test]
    fn commands_pack_as_resp() {
        let mut b = Vec::new();
        pack(&mut b, &[b"MSET", b"k", b""]);
        assert_eq!(b, b"*3\r\n$4\r\nMSET\r\n$1\r\nk\r\n$0\r\n\r\n");
        assert_eq!(redis::cmd("MSET").arg("k").arg("").get_packed_command(), b);
    }

    #[test]
    fn slots_and_tags() {
        // From the cluster specification's examples.
        assert_eq!(slot_of(b"123456789"), 0x31c3);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(slot_of(b"foo{}{bar}"), slot_of(b"foo{}{bar}"));
        let tags = spread_tags(16);
        for (i, t) in tags.iter().enumerate() {
            assert_eq!(slot_of(t.as_bytes()) as usize * 16 / 16384, i);
        }
    }

    #[test]
    fn cluster_nodes_parse() {
        let text = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
a2 127.0.0.1:7001@17001 master - 0 0 2 connected 5461-10922
a3 127.0.0.1:7002@17002 master,fail - 0 0 3 disconnected 10923-16383
b1 127.0.0.1:7003@17003 slave a1 0 0 1 connected
b2 127.0.0.1:7004@17004 slave a2 0 0 2 connected
b3 127.0.0.1:7005@17005 slave,fail a2 0 0 2 connected
";
        let t = parse_cluster_nodes(text);
        assert_eq!(t.masters, ["127.0.0.1:7000".to_string(), "127.0.0.1:7001".to_string()].into());
        assert_eq!(t.min_replicas, 1);
    }
}
