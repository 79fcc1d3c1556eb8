//! Gets from a single server over plain TCP, each value read from the
//! connection's read buffer straight into the caller's page buffer.
//!
//! The `redis` crate's client parses a reply into a `Value` (a parser
//! combinator, a fresh `Vec` per value, an array per `MGET`), which the
//! tier then moved into the caller's buffer, dropping the buffer it had:
//! on a pipelined get that parsing and the allocations cost the client
//! more than the decryption (see
//! `docs/measurements/2026-12-07-remote-gets.md`). Here a `GET` or an
//! `MGET` is packed by hand and its reply, bulk strings, is copied from
//! one reused read buffer into each caller's buffer, which keeps its
//! allocation. A TLS connection or a cluster's keeps the `redis` crate's
//! client ([`crate::link::Link`]).
//!
//! Only what a `GET`/`MGET` answers is understood: a bulk string, nil,
//! an array of those, or an error reply (an error). Anything else, a
//! length over [`MOST`], or a reply cut short is an error, and the
//! connection is dropped by the caller (it may be out of step).

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::config::{Credentials, Node};
use crate::link::{pack, push_decimal};

/// The longest value a reply may carry: an entry's length is a `u16`,
/// plus the seal's trailer and tag.
pub(crate) const MOST: usize = u16::MAX as usize + crate::seal::OVERHEAD;

/// The read buffer: a pipelined `MGET` of 32 pages fits.
const BUF: usize = 160 << 10;

/// The longest line (a length, an error message) read.
const LINE: usize = 1024;

/// A connection to a single server that reads `GET`/`MGET` replies
/// itself (see the module docs).
pub(crate) struct Getter {
    s: TcpStream,
    buf: Box<[u8]>,
    at: usize,
    end: usize,
    req: Vec<u8>,
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(80)]).into_owned()
}

/// The decimal number a RESP line carries after its type byte.
fn number(l: &[u8]) -> io::Result<i64> {
    std::str::from_utf8(&l[1..])
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(format!("a malformed reply: {:?}", lossy(l))))
}

impl Getter {
    /// Connects to `node` (`TCP_NODELAY`, `timeout` for each read and
    /// write) and authenticates if a password is given.
    pub(crate) fn connect(node: &Node, cred: &Credentials, timeout: Duration) -> io::Result<Getter> {
        let mut last = None;
        let mut s = None;
        for a in (node.host.as_str(), node.port).to_socket_addrs()? {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(c) => {
                    s = Some(c);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let s = match s {
            Some(s) => s,
            None => return Err(last.unwrap_or_else(|| io::Error::other(format!("{node}: no address")))),
        };
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        let mut g = Getter { s, buf: vec![0u8; BUF].into_boxed_slice(), at: 0, end: 0, req: Vec::new() };
        if let Some(p) = &cred.password {
            let mut args: Vec<&[u8]> = vec![b"AUTH"];
            if let Some(u) = &cred.user {
                args.push(u.as_bytes());
            }
            args.push(p.as_bytes());
            g.req.clear();
            pack(&mut g.req, &args);
            g.s.write_all(&g.req)?;
            let (a, b) = g.line()?;
            if &g.buf[a..b] != b"+OK" {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("{node}: AUTH refused: {}", lossy(&g.buf[a..b])),
                ));
            }
        }
        Ok(g)
    }

    /// Reads more from the connection into the buffer (after `end`,
    /// moving what is unread to its start first if it must).
    fn fill(&mut self) -> io::Result<()> {
        if self.at == self.end {
            self.at = 0;
            self.end = 0;
        } else if self.end == self.buf.len() {
            self.buf.copy_within(self.at..self.end, 0);
            self.end -= self.at;
            self.at = 0;
        }
        let n = self.s.read(&mut self.buf[self.end..])?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the server closed the connection"));
        }
        self.end += n;
        Ok(())
    }

    /// The next line's place in the buffer (without its CRLF, which is
    /// passed).
    fn line(&mut self) -> io::Result<(usize, usize)> {
        let mut from = self.at;
        loop {
            if let Some(i) = self.buf[from..self.end].windows(2).position(|w| w == b"\r\n") {
                let (a, b) = (self.at, from + i);
                self.at = b + 2;
                return Ok((a, b));
            }
            if self.end - self.at > LINE {
                return Err(bad(format!("a malformed reply: {:?}", lossy(&self.buf[self.at..self.end]))));
            }
            // The CR may be the last byte read.
            from = self.end.saturating_sub(1).max(self.at);
            let before = self.at;
            self.fill()?;
            from -= before - self.at;
        }
    }

    /// One bulk string into `out` (its bytes only); `false`: nil (`out`
    /// cleared).
    fn bulk(&mut self, out: &mut Vec<u8>) -> io::Result<bool> {
        out.clear();
        let (a, b) = self.line()?;
        let l = &self.buf[a..b];
        match l.first() {
            Some(b'$') => {}
            Some(b'-') => return Err(io::Error::other(format!("the server answered {}", lossy(&l[1..])))),
            _ => return Err(bad(format!("not a string reply: {:?}", lossy(l)))),
        }
        let n = number(l)?;
        if n == -1 {
            return Ok(false);
        }
        let n = usize::try_from(n).map_err(|_| bad(format!("a malformed reply: {:?}", lossy(l))))?;
        if n > MOST {
            return Err(bad(format!("a value length of {n} bytes, over the {MOST} a page can be")));
        }
        out.reserve(n);
        let mut left = n + 2;
        while left > 0 {
            if self.at == self.end {
                self.fill()?;
            }
            let k = left.min(self.end - self.at);
            out.extend_from_slice(&self.buf[self.at..self.at + k]);
            self.at += k;
            left -= k;
        }
        if !out.ends_with(b"\r\n") {
            out.clear();
            return Err(bad("a string reply without its CRLF".into()));
        }
        out.truncate(n);
        Ok(true)
    }

    /// `GET name` into `out`; `false`: there is no such key.
    pub(crate) fn get(&mut self, name: &[u8], out: &mut Vec<u8>) -> io::Result<bool> {
        self.req.clear();
        pack(&mut self.req, &[b"GET", name]);
        self.s.write_all(&self.req)?;
        self.bulk(out)
    }

    /// The CPU on which the server's replies arrive: a `PING` answered,
    /// then `SO_INCOMING_CPU` of the connection (the CPU whose network
    /// processing last delivered to it: on loopback the server's own, on
    /// a network card the receive queue's). `None` if the kernel does
    /// not say.
    pub(crate) fn incoming_cpu(&mut self) -> io::Result<Option<u32>> {
        self.req.clear();
        pack(&mut self.req, &[b"PING"]);
        self.s.write_all(&self.req)?;
        let (a, b) = self.line()?;
        if &self.buf[a..b] != b"+PONG" {
            return Err(bad(format!("PING answered {:?}", lossy(&self.buf[a..b]))));
        }
        Ok(incoming_cpu(&self.s))
    }

    /// Whether the server is reached over loopback.
    pub(crate) fn is_loopback(&self) -> bool {
        self.s.peer_addr().is_ok_and(|a| a.ip().is_loopback())
    }

    /// The server's process on this machine, if the connection is over
    /// loopback and `INFO server` names a process that is there (its
    /// `process_id`, whose name is that of the `executable` it reports:
    /// a server in another PID namespace is not mistaken for a process
    /// of ours). `Ok(None)` otherwise.
    pub(crate) fn local_server_pid(&mut self) -> io::Result<Option<u32>> {
        if !self.s.peer_addr()?.ip().is_loopback() {
            return Ok(None);
        }
        self.req.clear();
        pack(&mut self.req, &[b"INFO", b"server"]);
        self.s.write_all(&self.req)?;
        let mut info = Vec::new();
        if !self.bulk(&mut info)? {
            return Ok(None);
        }
        let info = String::from_utf8_lossy(&info);
        let field = |k: &str| info.lines().find_map(|l| l.strip_prefix(k)).map(str::trim);
        let Some(pid) = field("process_id:").and_then(|p| p.parse::<u32>().ok()) else { return Ok(None) };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let exe = field("executable:").and_then(|e| e.rsplit('/').next()).unwrap_or("redis-server");
        // The kernel keeps 15 bytes of a process's name.
        let same = !comm.trim_end().is_empty() && exe.as_bytes().starts_with(comm.trim_end().as_bytes());
        Ok(same.then_some(pid))
    }

    /// `MGET names` (one command): the value of `names[j]` into
    /// `outs[into[j]]` (left empty for no such key, or an empty value:
    /// [`Getter::get`] tells them apart). On an error, the buffers hold
    /// nothing to use (some may be partly written).
    pub(crate) fn mget(&mut self, names: &[&[u8]], into: &[usize], outs: &mut [Vec<u8>]) -> io::Result<()> {
        self.req.clear();
        pack_mget(&mut self.req, names);
        self.s.write_all(&self.req)?;
        let (a, b) = self.line()?;
        let l = &self.buf[a..b];
        match l.first() {
            Some(b'*') => {}
            Some(b'-') => return Err(io::Error::other(format!("the server answered {}", lossy(&l[1..])))),
            _ => return Err(bad(format!("not an array reply: {:?}", lossy(l)))),
        }
        if number(l)? != names.len() as i64 {
            return Err(bad(format!("{} values for {} names", lossy(&l[1..]), names.len())));
        }
        for &i in into {
            self.bulk(&mut outs[i])?;
        }
        Ok(())
    }
}

/// `SO_INCOMING_CPU` of a connection (`None`: not known: never
/// received, or an old kernel).
pub(crate) fn incoming_cpu(s: &TcpStream) -> Option<u32> {
    use std::os::fd::AsRawFd;
    let mut cpu: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cpu`, an int
    // of that size, on a descriptor `s` keeps open.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_INCOMING_CPU,
            (&mut cpu as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    (r == 0 && cpu >= 0).then_some(cpu as u32)
}

/// `MGET` of `names`, packed as [`pack`] would, without a slice of
/// arguments.
fn pack_mget(buf: &mut Vec<u8>, names: &[&[u8]]) {
    buf.push(b'*');
    push_decimal(buf, names.len() + 1);
    buf.extend_from_slice(b"\r\n$4\r\nMGET\r\n");
    for n in names {
        buf.push(b'$');
        push_decimal(buf, n.len());
        buf.extend_from_slice(b"\r\n");
        buf.extend_from_slice(n);
        buf.extend_from_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mget_packs_as_resp() {
        let mut a = Vec::new();
        pack_mget(&mut a, &[b"k1", b"key2"]);
        let mut b = Vec::new();
        pack(&mut b, &[b"MGET", b"k1", b"key2"]);
        assert_eq!(a, b);
    }

    /// A server that answers any request with `reply`, once.
    fn answering(reply: &'static [u8]) -> (Node, std::thread::JoinHandle<()>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let t = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut b = [0u8; 4096];
            let _ = c.read(&mut b).unwrap();
            // In small pieces: the reader must put them together.
            for piece in reply.chunks(3) {
                c.write_all(piece).unwrap();
                c.flush().unwrap();
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        (Node { host: "127.0.0.1".into(), port }, t)
    }

    fn getter(n: &Node) -> Getter {
        Getter::connect(n, &Credentials::default(), Duration::from_secs(5)).unwrap()
    }

    #[test]
    fn replies_in_pieces_parse_into_the_callers_buffers() {
        let (n, t) = answering(b"*3\r\n$5\r\nhello\r\n$-1\r\n$0\r\n\r\n");
        let mut g = getter(&n);
        let mut outs = vec![b"old".to_vec(), b"old".to_vec(), Vec::new(), b"old".to_vec()];
        g.mget(&[b"a", b"b", b"c"], &[3, 0, 2], &mut outs).unwrap();
        assert_eq!(outs[3], b"hello");
        assert!(outs[0].is_empty());
        assert!(outs[2].is_empty());
        assert_eq!(outs[1], b"old");
        t.join().unwrap();
    }

    #[test]
    fn wrong_replies_are_errors() {
        for reply in [
            &b"*2\r\n$1\r\na\r\n"[..],
            b"*1\r\n:5\r\n",
            b"$3\r\nabc\r\n",
            b"-ERR no\r\n",
            b"*1\r\n$3\r\nabcd\r\n",
            b"*1\r\n$70000\r\n",
            b"*1\r\n$-2\r\n",
        ] {
            let (n, t) = answering(reply);
            let mut g = getter(&n);
            let mut outs = vec![Vec::new()];
            let e = g.mget(&[b"a"], &[0], &mut outs).expect_err("refused");
            assert!(!e.to_string().is_empty());
            t.join().unwrap();
        }
        // Cut short: the server closes the connection mid-value.
        let (n, t) = answering(b"$10\r\nabc");
        let mut g = getter(&n);
        let mut out = Vec::new();
        assert!(g.get(b"a", &mut out).is_err());
        t.join().unwrap();
        let (n, t) = answering(b"$-1\r\n");
        assert!(!getter(&n).get(b"a", &mut out).unwrap());
        t.join().unwrap();
    }
}
