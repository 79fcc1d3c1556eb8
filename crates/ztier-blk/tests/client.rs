//! The NBD client against nbdkit (structured and simple replies, plain
//! newstyle, injected errors, a server killed and restarted) and against
//! ztier's own server (holes, TCP, unknown exports, garbage).

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ztier_blk::backing::CrashBacking;
use ztier_blk::client::{Client, ClientError, ClientOptions};
use ztier_blk::engine::{CreateOptions, Engine};
use ztier_blk::server::{self, Listener, ServeConfig, ServerStats};

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ztier-blk-client-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn need(tool: &str) {
    let ok =
        Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output().unwrap().status.success();
    assert!(ok, "{tool} is needed (scripts/deb-packages/blk.txt; `make test` as root installs it)");
}

/// An nbdkit process, ended by PID when dropped.
struct Kit {
    child: Option<Child>,
    sock: PathBuf,
}

impl Kit {
    fn start(sock: &Path, args: &[&str]) -> Kit {
        need("nbdkit");
        let _ = std::fs::remove_file(sock);
        let child = Command::new("nbdkit")
            .args(["-f", "-U"])
            .arg(sock)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let t = Instant::now();
        while !sock.exists() {
            assert!(t.elapsed() < Duration::from_secs(30), "nbdkit did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        Kit { child: Some(child), sock: sock.to_path_buf() }
    }
    fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.sock.display())
    }
    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").arg("-KILL").arg(c.id().to_string()).status();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(&self.sock);
    }
}

impl Drop for Kit {
    /// SIGTERM by PID; SIGKILL if it has not exited within 5 s (nbdkit
    /// waits for its clients to go).
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").arg(c.id().to_string()).status();
            let t = Instant::now();
            while c.try_wait().ok().flatten().is_none() {
                if t.elapsed() > Duration::from_secs(5) {
                    let _ = Command::new("kill").arg("-KILL").arg(c.id().to_string()).status();
                    let _ = c.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len).map(|_| (common::xorshift(&mut x) >> 24) as u8).collect()
}

/// Many threads over four pipelined connections against nbdkit's memory
/// plugin, checked against a model of the export.
#[test]
fn round_trips_against_nbdkit_from_many_threads() {
    let d = tmpdir("mem");
    let kit = Kit::start(&d.join("k.sock"), &["memory", "64M"]);
    let c = Arc::new(Client::connect(&kit.uri(), ClientOptions::default()).unwrap());
    let i = *c.info();
    assert_eq!(i.size, 64 << 20);
    assert!(i.structured && i.can_flush() && i.can_trim() && i.can_zero() && i.can_multi_conn(), "{i:?}");
    assert_eq!(c.connections(), 4);
    // Each thread owns its own 4 MiB region; writes and reads interleave.
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                let base = t * (4 << 20);
                let mut model = vec![0u8; 4 << 20];
                for k in 0..200u64 {
                    let off = (k * 7919 * 512) % ((4 << 20) - 65536);
                    let len = 512 * (1 + (k % 100) as usize);
                    match k % 5 {
                        0..=2 => {
                            let p = pattern(t * 1000 + k, len);
                            c.write(base + off, &p, k % 7 == 0).unwrap();
                            model[off as usize..off as usize + len].copy_from_slice(&p);
                        }
                        3 => {
                            c.write_zeroes(base + off, len as u64, false, false).unwrap();
                            model[off as usize..off as usize + len].fill(0);
                        }
                        _ => {
                            let mut b = vec![0u8; len];
                            c.read(base + off, &mut b).unwrap();
                            assert!(b == model[off as usize..off as usize + len], "thread {t} op {k}");
                        }
                    }
                }
                c.flush().unwrap();
                let mut all = vec![0u8; 4 << 20];
                c.read(base, &mut all).unwrap();
                assert!(all == model, "thread {t} final contents");
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // Out of range: refused locally.
    let mut b = [0u8; 10];
    assert!(matches!(c.read((64 << 20) - 5, &mut b), Err(ClientError::OutOfRange { .. })));
    // A 40 MiB read (above the 32 MiB request limit) is split.
    let mut big = vec![1u8; 40 << 20];
    c.read(0, &mut big).unwrap();
    std::fs::remove_dir_all(&d).unwrap();
}

/// Without structured replies (simple replies carry read data) and
/// without fixed newstyle (EXPORT_NAME, no options).
#[test]
fn simple_replies_and_plain_newstyle() {
    let d = tmpdir("simple");
    for extra in [&["--no-sr"][..], &["--mask-handshake=0"][..]] {
        let mut args: Vec<&str> = extra.to_vec();
        args.extend(["memory", "8M"]);
        let kit = Kit::start(&d.join("k.sock"), &args);
        let c = Client::connect(&kit.uri(), ClientOptions::default()).unwrap();
        assert!(!c.info().structured, "{extra:?}");
        let p = pattern(5, 100_000);
        c.write(12345, &p, true).unwrap();
        let mut b = vec![0u8; 100_000];
        c.read(12345, &mut b).unwrap();
        assert!(b == p, "{extra:?}");
        c.trim(0, 8 << 20, false).unwrap();
        c.flush().unwrap();
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// nbdkit's error filter: the server's errors reach the caller as
/// errors with their errno; the connection stays usable.
#[test]
fn server_errors_are_reported_with_their_errno() {
    let d = tmpdir("errors");
    let kit = Kit::start(
        &d.join("k.sock"),
        &["--filter=error", "memory", "8M", "error=ENOSPC", "error-pwrite-rate=100%", "error-pread-rate=0"],
    );
    let c = Client::connect(&kit.uri(), ClientOptions::default()).unwrap();
    let e = c.write(0, &[1u8; 4096], false).unwrap_err();
    assert_eq!(e.errno(), 28, "{e}");
    assert_eq!(std::io::Error::from(e).kind(), std::io::ErrorKind::StorageFull);
    let mut b = [9u8; 4096];
    c.read(0, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0));
    drop(c);
    drop(kit);
    let kit = Kit::start(
        &d.join("k.sock"),
        &["--filter=error", "memory", "8M", "error=EIO", "error-pread-rate=100%"],
    );
    let c = Client::connect(&kit.uri(), ClientOptions::default()).unwrap();
    let e = c.read(0, &mut b).unwrap_err();
    assert_eq!(e.errno(), 5, "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// kill -9 of the server with requests in flight: they fail (never hang,
/// never return data); once a server listens again, the client reconnects.
#[test]
fn server_killed_mid_run_then_back() {
    let d = tmpdir("kill");
    let img = d.join("img");
    std::fs::File::create(&img).unwrap().set_len(16 << 20).unwrap();
    let sock = d.join("k.sock");
    // Every read takes 200 ms, so some are in flight at the kill.
    let mut kit = Kit::start(&sock, &["--filter=delay", "file", img.to_str().unwrap(), "rdelay=200ms"]);
    let opts = ClientOptions { reconnect_every: Duration::from_millis(50), ..ClientOptions::default() };
    let c = Arc::new(Client::connect(&kit.uri(), opts).unwrap());
    c.write(0, &pattern(1, 65536), false).unwrap();
    let readers: Vec<_> = (0..8)
        .map(|k| {
            let c = c.clone();
            std::thread::spawn(move || {
                let mut b = vec![0u8; 4096];
                c.read(k * 4096, &mut b).map(|_| b)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    kit.kill9();
    let mut failed = 0;
    for r in readers {
        match r.join().unwrap() {
            Ok(b) => assert_eq!(b.len(), 4096),
            Err(e) => {
                assert!(matches!(e, ClientError::Disconnected(_)), "{e}");
                failed += 1;
            }
        }
    }
    assert!(failed > 0, "reads in flight at the kill must fail");
    let mut b = vec![0u8; 4096];
    assert!(c.read(0, &mut b).is_err(), "no server: an error");
    let kit = Kit::start(&sock, &["file", img.to_str().unwrap()]);
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    loop {
        match c.read(0, &mut b) {
            Ok(()) => break,
            Err(e) => assert!(t.elapsed() < Duration::from_secs(10), "no reconnection: {e}"),
        }
        std::thread::sleep(Duration::from_millis(60));
    }
    assert!(b == pattern(1, 65536)[..4096]);
    assert!(c.reconnects() >= 1);
    drop(c);
    drop(kit);
    std::fs::remove_dir_all(&d).unwrap();
}

/// A request with no reply within the timeout fails, and the connection
/// is dropped rather than left with a reply that may come later.
#[test]
fn requests_time_out() {
    let d = tmpdir("timeout");
    let kit = Kit::start(&d.join("k.sock"), &["--filter=delay", "memory", "1M", "rdelay=3"]);
    let opts =
        ClientOptions { timeout: Some(Duration::from_millis(300)), connections: 1, ..Default::default() };
    let c = Client::connect(&kit.uri(), opts).unwrap();
    let mut b = [0u8; 512];
    let t = Instant::now();
    assert!(matches!(c.read(0, &mut b), Err(ClientError::Timeout(_))));
    assert!(t.elapsed() < Duration::from_secs(2));
    std::fs::remove_dir_all(&d).unwrap();
}

fn ztier_server(d: &Path, tcp: bool) -> (String, Arc<AtomicBool>) {
    let o = CreateOptions {
        logical_size: 8 << 20,
        block_size: 4096,
        extent_size: 32768,
        codec: ztier_codec::CodecId::Lz4,
        physical: None,
    };
    let e = Arc::new(Engine::create(Box::new(CrashBacking::new()), &o).unwrap());
    let (listener, uri) = if tcp {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        (Listener::Tcp(l), format!("nbd://{a}/ztier"))
    } else {
        let p = d.join("z.sock");
        (
            Listener::Unix(std::os::unix::net::UnixListener::bind(&p).unwrap()),
            format!("nbd+unix:///ztier?socket={}", p.display()),
        )
    };
    let stop = Arc::new(AtomicBool::new(false));
    let cfg = ServeConfig { name: "ztier".into(), description: String::new(), read_only: false, threads: 2 };
    let s = stop.clone();
    std::thread::spawn(move || server::serve(e, listener, cfg, s, Arc::new(ServerStats::default())));
    (uri, stop)
}

/// ztier's server answers reads of unwritten blocks with hole chunks:
/// the client assembles data and holes; TCP works; an unknown export is
/// refused with the server's reason.
#[test]
fn against_ztier_server_holes_tcp_unknown_export() {
    let d = tmpdir("ztier");
    for tcp in [false, true] {
        let (uri, stop) = ztier_server(&d, tcp);
        let c = Client::connect(&uri, ClientOptions::default()).unwrap();
        assert!(c.info().structured);
        assert_eq!(c.info().pref_block, 4096);
        c.write(8192, &pattern(3, 4096), false).unwrap();
        let mut b = vec![0xffu8; 16384];
        c.read(0, &mut b).unwrap();
        assert!(b[..8192].iter().all(|&x| x == 0) && b[8192..12288] == pattern(3, 4096)[..]);
        assert!(b[12288..].iter().all(|&x| x == 0));
        let bad = uri.replacen("/ztier", "/nope", 1);
        let e = Client::connect(&bad, ClientOptions::default()).unwrap_err();
        assert!(e.to_string().contains("no export named 'nope'"), "{e}");
        stop.store(true, std::sync::atomic::Ordering::Release);
        let _ = std::fs::remove_file(d.join("z.sock"));
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// Servers that are not NBD servers, or stop in the handshake: a clear
/// error, no hang.
#[test]
fn garbage_and_silent_servers_fail_the_handshake() {
    let d = tmpdir("garbage");
    let sock = d.join("g.sock");
    let l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let srv = std::thread::spawn(move || {
        for (i, s) in l.incoming().take(3).enumerate() {
            let mut s = s.unwrap();
            match i {
                0 => {
                    let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
                }
                1 => {
                    // The greeting, then the connection closes mid-option.
                    let mut m = b"NBDMAGICIHAVEOPT".to_vec();
                    m.extend_from_slice(&3u16.to_be_bytes());
                    let _ = s.write_all(&m);
                    let mut f = [0u8; 4];
                    let _ = s.read_exact(&mut f);
                }
                _ => {
                    // The greeting, then an option reply with a wrong magic.
                    let mut m = b"NBDMAGICIHAVEOPT".to_vec();
                    m.extend_from_slice(&3u16.to_be_bytes());
                    let _ = s.write_all(&m);
                    let mut f = [0u8; 20];
                    let _ = s.read_exact(&mut f);
                    let _ = s.write_all(&[0x55; 20]);
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    });
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    for want in ["not an NBD server", "connection lost", "reply magic"] {
        let e = Client::connect(&uri, ClientOptions::default()).unwrap_err();
        assert!(e.to_string().contains(want), "{e} (wanted '{want}')");
    }
    srv.join().unwrap();
    std::fs::remove_dir_all(&d).unwrap();
}
