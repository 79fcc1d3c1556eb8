//! `ztier cache` with real NBD clients (qemu-img, qemu-io, nbdcopy, fio,
//! nbdfuse + mkfs + mount) in front of nbdkit and of a file; kill -9 of
//! the cache server and of the backing's server mid-run; a backing that
//! is full or unreadable (nbdkit's error filter); malformed replies from
//! the backing; restarts; a short benchmark run.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::nbd::{go, mount_image_ro, run, simple_read, sums, text, Mounted};
use common::{require as need, tmp as tmpdir};

fn ztier() -> Command {
    Command::new(common::ztier())
}

fn wait_socket(p: &Path, child: &mut Child, what: &str) {
    let t = Instant::now();
    // Until a connection is taken: the socket's file exists from its
    // bind, before the server listens (a connection then is refused).
    while std::os::unix::net::UnixStream::connect(p).is_err() {
        if let Some(st) = child.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            panic!("{what} exited ({st}) before listening: {err}");
        }
        assert!(t.elapsed() < Duration::from_secs(30), "{what} did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A process ended by PID (SIGTERM, SIGKILL after 10 s) when dropped.
struct Proc {
    child: Option<Child>,
    sock: PathBuf,
}

impl Proc {
    fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.sock.display())
    }
    fn alive(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.try_wait().unwrap().is_none())
    }
    fn signal(&mut self, sig: &str) -> Option<std::process::ExitStatus> {
        let mut c = self.child.take()?;
        let _ = Command::new("kill").arg(sig).arg(c.id().to_string()).status();
        let t = Instant::now();
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                return Some(st);
            }
            if t.elapsed() > Duration::from_secs(20) {
                let _ = Command::new("kill").arg("-KILL").arg(c.id().to_string()).status();
                return c.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    /// SIGTERM: a clean stop; the exit status.
    fn stop(mut self) -> std::process::ExitStatus {
        self.signal("-TERM").unwrap()
    }
    /// SIGKILL: a crash.
    fn kill9(mut self) {
        self.signal("-KILL");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.signal("-TERM");
    }
}

/// nbdkit on a unix socket with `args`.
fn nbdkit(sock: &Path, args: &[&str]) -> Proc {
    need("nbdkit");
    let _ = std::fs::remove_file(sock);
    let mut c = Command::new("nbdkit")
        .args(["-f", "--threads=32", "-U"])
        .arg(sock)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_socket(sock, &mut c, "nbdkit");
    Proc { child: Some(c), sock: sock.to_path_buf() }
}

fn create_cache(d: &Path, size: &str, extra: &[&str]) -> PathBuf {
    let c = d.join("cache.ztc");
    let _ = std::fs::remove_file(&c);
    run(ztier().args(["cache", "create"]).arg(&c).args(["--size", size]).args(extra));
    c
}

/// `ztier cache serve` of `cache` in front of `backing`, once it says it
/// serves (a killed server's socket may still be there); its stderr goes
/// to `d/serve.log` (appended).
fn serve(d: &Path, cache: &Path, backing: &str, extra: &[&str]) -> Proc {
    let sock = d.join("cache.sock");
    let before = serve_log(d).matches("serving at").count();
    let log = std::fs::OpenOptions::new().create(true).append(true).open(d.join("serve.log")).unwrap();
    let mut c = ztier()
        .args(["cache", "serve", "--backing", backing, "--cache"])
        .arg(cache)
        .arg("--socket")
        .arg(&sock)
        .args(extra)
        .stderr(log)
        .spawn()
        .unwrap();
    let t = Instant::now();
    while serve_log(d).matches("serving at").count() == before {
        if let Some(st) = c.try_wait().unwrap() {
            panic!("ztier cache serve exited ({st}) before serving: {}", serve_log(d));
        }
        assert!(t.elapsed() < Duration::from_secs(60), "ztier cache serve did not start: {}", serve_log(d));
        std::thread::sleep(Duration::from_millis(20));
    }
    Proc { child: Some(c), sock }
}

fn serve_log(d: &Path) -> String {
    std::fs::read_to_string(d.join("serve.log")).unwrap_or_default()
}

/// Reads the whole export at `uri` with nbdcopy.
fn read_all(d: &Path, uri: &str) -> Vec<u8> {
    let out = d.join("readback");
    let _ = std::fs::remove_file(&out);
    run(Command::new("nbdcopy").arg(uri).arg(&out));
    std::fs::read(&out).unwrap()
}

fn stats_file(d: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(d.join("stats.json")).unwrap()).unwrap()
}

/// qemu-img convert onto the cache (nbdkit backing), compare through the
/// cache and on the backing itself; nbdcopy out twice (the second from
/// the cache); qemu-io patterns, trims and zeroes.
#[test]
fn qemu_img_nbdcopy_qemu_io_through_the_cache() {
    for t in ["qemu-img", "qemu-io", "nbdcopy"] {
        need(t);
    }
    let d = tmpdir("clients");
    let img = d.join("backing.img");
    std::fs::File::create(&img).unwrap().set_len(64 << 20).unwrap();
    let kit = nbdkit(
        &d.join("b.sock"),
        &["--filter=delay", "file", img.to_str().unwrap(), "rdelay=1ms", "wdelay=1ms"],
    );
    let cache = create_cache(&d, "16M", &[]);
    let stats = d.join("stats.json");
    let srv = serve(
        &d,
        &cache,
        &kit.uri(),
        &["--ram-cache", "4M", "--stats", stats.to_str().unwrap(), "--metrics", "127.0.0.1:0"],
    );
    let src = d.join("src.img");
    let mut data = text(24 << 20, 5);
    data.resize(32 << 20, 0);
    std::fs::write(&src, &data).unwrap();
    run(Command::new("qemu-img").args(["convert", "-n", "-f", "raw", "-O", "raw"]).arg(&src).arg(srv.uri()));
    let out =
        run(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw"]).arg(&src).arg(srv.uri()));
    assert!(out.contains("identical"), "{out}");
    // Twice: the second read is mostly from the cache.
    let a = read_all(&d, &srv.uri());
    let b = read_all(&d, &srv.uri());
    assert!(a[..data.len()] == data[..] && a == b);
    let out = run(Command::new("qemu-io")
        .args(["-f", "raw"])
        .args([
            "-c",
            "write -P 0xab 0 1M",
            "-c",
            "read -P 0xab 0 1M",
            "-c",
            "write -P 0xcd 4097 10000",
            "-c",
            "read -P 0xcd 4097 10000",
            "-c",
            "read -P 0xab 14097 1034479",
            "-c",
            "discard 2M 1M",
            "-c",
            "write -z 3M 64k",
            "-c",
            "read -P 0 3M 64k",
            "-c",
            "flush",
        ])
        .arg(srv.uri()));
    assert!(!out.contains("failed") && !out.contains("error"), "{out}");
    // Live statistics from the server, and its Prometheus metrics.
    let live: serde_json::Value =
        serde_json::from_str(&run(ztier().args(["cache", "stats", "--json"]).arg(&cache))).unwrap();
    assert_eq!(live["served"], true, "{live}");
    assert!(live["ssd_hits"].as_u64().unwrap() + live["ram_hits"].as_u64().unwrap() > 1000, "{live}");
    assert!(live["server"]["requests"].as_u64().unwrap() > 10, "{live}");
    for k in
        ["hit_ratio", "misses", "ssd_fills", "bypassed_read_blocks", "bytes_saved", "ratio", "metadata_bytes"]
    {
        assert!(live[k].is_number(), "{k}: {live}");
    }
    assert!(live["latency"]["ram_hit"]["p50_us"].is_number(), "{live}");
    let human = run(ztier().args(["cache", "stats"]).arg(&cache));
    assert!(human.contains("RAM hits") && human.contains("per cached block"), "{human}");
    let log = serve_log(&d);
    let port = log.split("metrics at http://").nth(1).and_then(|r| r.split('/').next()).unwrap().to_string();
    let mut h = std::net::TcpStream::connect(&port).unwrap();
    h.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut body = String::new();
    h.read_to_string(&mut body).unwrap();
    for m in [
        "ztier_cache_blocks_read_total{",
        "ztier_cache_requests_total{",
        "ztier_cache_request_duration_seconds_bucket{",
        "ztier_cache_compression_ratio{",
        "ztier_cache_ram_budget_bytes{",
        "ztier_cache_read_service_seconds_bucket{",
    ] {
        assert!(body.contains(m), "{m} missing:\n{body}");
    }
    assert_eq!(srv.stop().code(), Some(0));
    drop(kit);
    // The backing holds every write: the cache never kept data to itself.
    let on_backing = std::fs::read(&img).unwrap();
    assert!(on_backing[(1 << 20) + 20000..(2 << 20)] == data[(1 << 20) + 20000..(2 << 20)]);
    assert!(on_backing[..4097].iter().all(|&x| x == 0xab));
    assert!(on_backing[4097..14097].iter().all(|&x| x == 0xcd));
    assert!(on_backing[3 << 20..(3 << 20) + 65536].iter().all(|&x| x == 0));
    let s = stats_file(&d);
    assert!(s["ssd_hits"].as_u64().unwrap() + s["ram_hits"].as_u64().unwrap() > 1000, "{s}");
    assert!(s["ratio"].as_f64().unwrap() > 1.5, "{s}");
    assert!(s["metadata_bytes_per_line"].as_f64().unwrap() < 8.0, "{s}");
    assert_eq!(s["errors"], 0, "{s}");
    // Offline stats: stopped cleanly, holds items.
    let o: serde_json::Value =
        serde_json::from_str(&run(ztier().args(["cache", "stats", "--json"]).arg(&cache))).unwrap();
    assert_eq!(o["state"], "clean", "{o}");
    assert!(o["items"].as_u64().unwrap() > 100, "{o}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// fio writes with verification through the cache, the backing a file.
#[test]
fn fio_verify_through_the_cache_on_a_file_backing() {
    need("fio");
    let d = tmpdir("fio");
    let img = d.join("backing.img");
    std::fs::File::create(&img).unwrap().set_len(96 << 20).unwrap();
    let cache = create_cache(&d, "16M", &["--placement", "direct"]);
    let srv = serve(&d, &cache, img.to_str().unwrap(), &[]);
    let out = run(Command::new("fio")
        .current_dir(&d)
        .args(["--name=v", "--ioengine=nbd", "--rw=randwrite", "--bs=4k", "--size=64M", "--iodepth=16"])
        .args(["--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--output-format=terse"])
        .args(["--buffer_compress_percentage=50", "--refill_buffers"])
        .arg(format!("--uri={}", srv.uri())));
    assert_eq!(out.split(';').nth(4), Some("0"), "{out}");
    assert_eq!(srv.stop().code(), Some(0));
    std::fs::remove_dir_all(&d).unwrap();
}

/// kill -9 of the cache server during writes: restarted, it recovers
/// (warm), and every block read through it equals the backing's — no
/// line a write made stale survives. Then a clean stop and a warm start.
#[test]
fn kill_9_of_the_cache_server_then_nothing_stale() {
    for t in ["fio", "nbdcopy"] {
        need(t);
    }
    let d = tmpdir("kill-cache");
    let img = d.join("backing.img");
    std::fs::File::create(&img).unwrap().set_len(64 << 20).unwrap();
    let kit = nbdkit(&d.join("b.sock"), &["file", img.to_str().unwrap()]);
    let cache = create_cache(&d, "16M", &[]);
    let srv = serve(&d, &cache, &kit.uri(), &[]);
    // Fill the cache: write then read everything.
    run(Command::new("fio")
        .current_dir(&d)
        .args(["--name=w", "--ioengine=nbd", "--rw=write", "--bs=64k", "--size=48M", "--iodepth=8"])
        .args(["--buffer_compress_percentage=60", "--refill_buffers", "--output=/dev/null"])
        .arg(format!("--uri={}", srv.uri())));
    read_all(&d, &srv.uri());
    std::thread::sleep(Duration::from_millis(300));
    // Random overwrites of cached blocks, killed mid-run.
    let mut fio = Command::new("fio")
        .current_dir(&d)
        .args(["--name=r", "--ioengine=nbd", "--rw=randrw", "--bs=4k", "--size=48M", "--iodepth=16"])
        .args(["--time_based", "--runtime=30", "--randseed=7", "--output=/dev/null"])
        .args(["--buffer_compress_percentage=60", "--refill_buffers"])
        .arg(format!("--uri={}", srv.uri()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    srv.kill9();
    let st = fio.wait().unwrap();
    assert!(!st.success(), "fio went on after the server died: {st}");
    let srv = serve(&d, &cache, &kit.uri(), &[]);
    let log = serve_log(&d);
    assert!(log.contains(": crash — "), "{log}");
    let kept: u64 = log
        .rsplit(": crash — ")
        .next()
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(kept > 1000, "lines kept after kill -9: {kept}\n{log}");
    let through = read_all(&d, &srv.uri());
    let backing = std::fs::read(&img).unwrap();
    if through != backing {
        let i = through.iter().zip(&backing).position(|(a, b)| a != b).unwrap();
        panic!("block {} differs from the backing after kill -9 and restart", i / 4096);
    }
    assert_eq!(srv.stop().code(), Some(0));
    // Warm after a clean stop: the restart keeps the lines and serves hits.
    let stats = d.join("stats.json");
    let srv = serve(&d, &cache, &kit.uri(), &["--stats", stats.to_str().unwrap()]);
    assert!(serve_log(&d).contains(": clean — "), "{}", serve_log(&d));
    assert!(read_all(&d, &srv.uri()) == backing);
    assert_eq!(srv.stop().code(), Some(0));
    let s = stats_file(&d);
    assert!(s["ssd_hits"].as_u64().unwrap() > 1000, "{s}");
    drop(kit);
    std::fs::remove_dir_all(&d).unwrap();
}

/// Write-back: nbdcopy writes a file through the cache and flushes; the
/// server is killed (-9) at once, while the slow backing (50 ms a write)
/// still lacks most blocks. Restarted, it finds them dirty and serves
/// them; a clean stop writes them all back, and the backing then equals
/// the file. Then qemu-img compare through the cache in write-back mode.
#[test]
fn write_back_kill_9_after_a_flush_loses_nothing() {
    for t in ["nbdcopy", "qemu-img"] {
        need(t);
    }
    let d = tmpdir("kill-wb");
    let img = d.join("backing.img");
    std::fs::File::create(&img).unwrap().set_len(16 << 20).unwrap();
    let kit = nbdkit(&d.join("b.sock"), &["--filter=delay", "file", img.to_str().unwrap(), "wdelay=50ms"]);
    let cache = create_cache(&d, "32M", &[]);
    let wb = ["--mode", "writeback", "--writeback-threads", "2"];
    let srv = serve(&d, &cache, &kit.uri(), &wb);
    // 8 MiB of half-compressible data.
    let src = d.join("src.img");
    let mut data = vec![0u8; 8 << 20];
    let mut x = 0x1234_5678_9abc_def0u64;
    for (i, c) in data.chunks_mut(8).enumerate() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if i % 2 == 0 {
            c.copy_from_slice(&x.to_le_bytes());
        }
    }
    std::fs::write(&src, &data).unwrap();
    run(Command::new("nbdcopy").arg("--flush").arg(&src).arg(srv.uri()));
    srv.kill9();
    let on_backing = std::fs::read(&img).unwrap();
    assert!(on_backing[..8 << 20] != data[..], "the backing has it all already: the test proves nothing");
    let stats = d.join("stats.json");
    // More threads now: the clean stop writes every dirty block back.
    let args = ["--mode", "writeback", "--writeback-threads", "32", "--stats", stats.to_str().unwrap()];
    let srv = serve(&d, &cache, &kit.uri(), &args);
    let log = serve_log(&d);
    assert!(log.contains(" dirty blocks found (write-back)"), "{log}");
    let through = read_all(&d, &srv.uri());
    assert!(through[..8 << 20] == data[..], "what was flushed reads back after kill -9");
    run(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw"]).arg(&src).arg(srv.uri()));
    assert_eq!(srv.stop().code(), Some(0));
    let s = stats_file(&d);
    assert_eq!(s["dirty_blocks"].as_u64(), Some(0), "{s}");
    assert!(s["written_back"].as_u64().unwrap() > 0, "{s}");
    let on_backing = std::fs::read(&img).unwrap();
    assert!(on_backing[..8 << 20] == data[..], "a clean stop writes every dirty block back");
    drop(kit);
    std::fs::remove_dir_all(&d).unwrap();
}

/// kill -9 of the backing's server mid-run: I/O errors reach the client;
/// once it is back, the cache reconnects and nothing read is stale.
#[test]
fn kill_9_of_the_backing_server() {
    for t in ["qemu-io", "nbdcopy"] {
        need(t);
    }
    let d = tmpdir("kill-backing");
    let img = d.join("backing.img");
    std::fs::write(&img, text(16 << 20, 9)).unwrap();
    let bsock = d.join("b.sock");
    let kit = nbdkit(&bsock, &["file", img.to_str().unwrap()]);
    let cache = create_cache(&d, "8M", &[]);
    let srv = serve(&d, &cache, &kit.uri(), &["--backing-timeout", "5"]);
    // Cache the first 4 MiB.
    run(Command::new("qemu-io").args(["-f", "raw", "-c", "read 0 4M"]).arg(srv.uri()));
    std::thread::sleep(Duration::from_millis(300));
    kit.kill9();
    // Uncached reads and writes fail with an error, not wrong data.
    let out = Command::new("qemu-io")
        .args(["-f", "raw", "-c", "read 8M 64k", "-c", "write -P 0x77 12M 4k"])
        .arg(srv.uri())
        .output()
        .unwrap();
    let all = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(all.contains("Input/output error") || all.contains("failed"), "{all}");
    // Cached blocks are still served.
    let out = run(Command::new("qemu-io").args(["-f", "raw", "-c", "read 0 64k"]).arg(srv.uri()));
    assert!(!out.contains("failed"), "{out}");
    // The backing comes back: reconnected, right data.
    let kit = nbdkit(&bsock, &["file", img.to_str().unwrap()]);
    std::thread::sleep(Duration::from_millis(1200));
    let t = Instant::now();
    loop {
        let o = Command::new("qemu-io")
            .args(["-f", "raw", "-c", "write -P 0x42 12M 4k"])
            .arg(srv.uri())
            .output()
            .unwrap();
        let s = String::from_utf8_lossy(&o.stdout).to_string();
        if o.status.success() && !s.contains("failed") {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "no reconnection: {s}");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        read_all(&d, &srv.uri()) == std::fs::read(&img).unwrap(),
        "stale data after the backing came back"
    );
    assert_eq!(srv.stop().code(), Some(0));
    drop(kit);
    std::fs::remove_dir_all(&d).unwrap();
}

/// A full backing (ENOSPC on writes) and an unreadable one (EIO on
/// reads), switched on while the cache serves (nbdkit's error filter
/// with trigger files): the errors reach the client, cached blocks are
/// still served, and the cache never answers with data the backing does
/// not hold. (Write-around, so that a write leaves its blocks uncached
/// whatever the reads before cached.)
#[test]
fn backing_full_or_unreadable() {
    need("qemu-io");
    let d = tmpdir("errors");
    let img = d.join("backing.img");
    let mut want = text(8 << 20, 3);
    std::fs::write(&img, &want).unwrap();
    let cache = create_cache(&d, "8M", &[]);
    let (full, bad) = (d.join("full"), d.join("unreadable"));
    let kit = nbdkit(
        &d.join("b.sock"),
        &[
            "--filter=error",
            "file",
            img.to_str().unwrap(),
            "error-pwrite=ENOSPC",
            "error-pwrite-rate=100%",
            &format!("error-pwrite-file={}", full.display()),
            "error-pread=EIO",
            "error-pread-rate=100%",
            &format!("error-pread-file={}", bad.display()),
        ],
    );
    let srv = serve(&d, &cache, &kit.uri(), &["--mode", "writearound"]);
    let qio = |cmds: &[&str]| {
        let mut c = Command::new("qemu-io");
        c.args(["-f", "raw"]);
        for x in cmds {
            c.args(["-c", x]);
        }
        let out = c.arg(srv.uri()).output().unwrap();
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
    };
    // Cache the first MiB.
    let out = qio(&["read 0 1M"]);
    assert!(!out.contains("failed"), "{out}");
    std::thread::sleep(Duration::from_millis(300));
    // Full: the write fails with ENOSPC; the block still reads as before.
    std::fs::write(&full, b"").unwrap();
    let out = qio(&["write -P 0x11 4096 8192"]);
    assert!(out.contains("No space left on device"), "{out}");
    std::fs::remove_file(&full).unwrap();
    assert!(read_all(&d, &srv.uri()) == want, "after a failed write the cache serves what the backing holds");
    // Written (so not cached, whatever the read above cached), then
    // unreadable: uncached blocks fail with EIO, cached ones are served.
    let out = qio(&["write -P 0x22 7M 64k"]);
    assert!(!out.contains("failed"), "{out}");
    want[7 << 20..(7 << 20) + (64 << 10)].fill(0x22);
    std::fs::write(&bad, b"").unwrap();
    let out = qio(&["read 7M 64k"]);
    assert!(out.contains("Input/output error"), "{out}");
    let out = qio(&["read -v 0 512"]);
    assert!(out.contains("line.") && !out.contains("failed"), "a cached block: {out}");
    std::fs::remove_file(&bad).unwrap();
    assert!(read_all(&d, &srv.uri()) == want);
    assert_eq!(srv.stop().code(), Some(0));
    drop(kit);
    std::fs::remove_dir_all(&d).unwrap();
}

/// A backing that answers with malformed replies: the client gets an
/// error, the cache server keeps running and serves what it has cached.
#[test]
fn malformed_replies_from_the_backing() {
    need("qemu-io");
    let d = tmpdir("malformed");
    let bsock = d.join("b.sock");
    let l = UnixListener::bind(&bsock).unwrap();
    let size = 8u64 << 20;
    // A server with a good handshake whose replies go wrong in turn:
    // a bad magic, a chunk for an unknown cookie, data past the request.
    std::thread::spawn(move || {
        for (n, s) in l.incoming().enumerate() {
            let Ok(mut s) = s else { break };
            std::thread::spawn(move || fake_backing(&mut s, size, n));
        }
    });
    let cache = create_cache(&d, "8M", &[]);
    let srv = serve(
        &d,
        &cache,
        &format!("nbd+unix:///?socket={}", bsock.display()),
        &["--backing-connections", "1"],
    );
    for _ in 0..3 {
        let out =
            Command::new("qemu-io").args(["-f", "raw", "-c", "read 0 4k"]).arg(srv.uri()).output().unwrap();
        let all = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(all.contains("Input/output error"), "{all}");
        std::thread::sleep(Duration::from_millis(1100));
    }
    // Still alive, and answering (with errors) one connection after another.
    let mut srv = srv;
    assert!(srv.alive(), "{}", serve_log(&d));
    let out =
        Command::new("qemu-io").args(["-f", "raw", "-c", "read 4096 4k"]).arg(srv.uri()).output().unwrap();
    let all = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(all.contains("Input/output error"), "{all}");
    assert!(srv.alive());
    // Its last flush to the backing fails too: said, and the exit status says so.
    assert_eq!(srv.stop().code(), Some(1));
    assert!(serve_log(&d).contains("flushing at the stop"), "{}", serve_log(&d));
    std::fs::remove_dir_all(&d).unwrap();
}

fn fake_backing(s: &mut std::os::unix::net::UnixStream, size: u64, n: usize) {
    let mut w = |b: &[u8]| s.write_all(b);
    let mut hello = b"NBDMAGICIHAVEOPT".to_vec();
    hello.extend_from_slice(&3u16.to_be_bytes());
    if w(&hello).is_err() {
        return;
    }
    let mut f = [0u8; 4];
    if s.read_exact(&mut f).is_err() {
        return;
    }
    loop {
        let mut h = [0u8; 16];
        if s.read_exact(&mut h).is_err() {
            return;
        }
        let opt = u32::from_be_bytes(h[8..12].try_into().unwrap());
        let len = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let mut data = vec![0u8; len as usize];
        if s.read_exact(&mut data).is_err() {
            return;
        }
        let reply = |s: &mut std::os::unix::net::UnixStream, kind: u32, d: &[u8]| {
            let mut m = 0x0003_e889_0455_65a9u64.to_be_bytes().to_vec();
            m.extend_from_slice(&opt.to_be_bytes());
            m.extend_from_slice(&kind.to_be_bytes());
            m.extend_from_slice(&(d.len() as u32).to_be_bytes());
            m.extend_from_slice(d);
            s.write_all(&m)
        };
        match opt {
            8 => {
                let _ = reply(s, 1, &[]);
            }
            7 => {
                let mut info = 0u16.to_be_bytes().to_vec();
                info.extend_from_slice(&size.to_be_bytes());
                info.extend_from_slice(&(1u16 | 4).to_be_bytes());
                let _ = reply(s, 3, &info);
                let _ = reply(s, 1, &[]);
                break;
            }
            _ => {
                let _ = reply(s, (1 << 31) + 1, &[]);
            }
        }
    }
    // Transmission: every request gets a malformed reply.
    let mut req = [0u8; 28];
    while s.read_exact(&mut req).is_ok() {
        let cookie = u64::from_be_bytes(req[8..16].try_into().unwrap());
        let bad: Vec<u8> = match n % 3 {
            0 => vec![0xde; 20],
            1 => {
                let mut b = 0x668e_33efu32.to_be_bytes().to_vec();
                b.extend_from_slice(&1u16.to_be_bytes());
                b.extend_from_slice(&0u16.to_be_bytes());
                b.extend_from_slice(&(cookie + 99).to_be_bytes());
                b.extend_from_slice(&0u32.to_be_bytes());
                b
            }
            _ => {
                let mut b = 0x668e_33efu32.to_be_bytes().to_vec();
                b.extend_from_slice(&1u16.to_be_bytes());
                b.extend_from_slice(&1u16.to_be_bytes());
                b.extend_from_slice(&cookie.to_be_bytes());
                b.extend_from_slice(&(8u32 + 16).to_be_bytes());
                b.extend_from_slice(&(1u64 << 40).to_be_bytes());
                b.extend_from_slice(&[1u8; 16]);
                b
            }
        };
        if s.write_all(&bad).is_err() {
            return;
        }
    }
}

/// Bad arguments and devices: clear errors, nothing lost.
#[test]
fn refusals() {
    let d = tmpdir("refusals");
    let c = create_cache(&d, "8M", &[]);
    // An existing cache is not overwritten without --force.
    let out = ztier().args(["cache", "create"]).arg(&c).args(["--size", "8M"]).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--force"));
    for (p, why) in [
        ("assoc:3", "WAYS"),
        ("assoc:16:lru", "WAYS"),
        ("assoc:128", "WAYS"),
        ("fully", "direct"),
        ("assoc:8:mru", "policy"),
    ] {
        let out = ztier()
            .args(["cache", "create"])
            .arg(d.join("x"))
            .args(["--size", "8M", "--placement", p])
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && e.contains(why), "{p}: {e}");
    }
    let out = ztier().args(["cache", "create"]).arg(d.join("x")).args(["--size", "100K"]).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("too small"));
    assert!(!d.join("x").exists(), "a failed create leaves no file");
    // Not a cache.
    let junk = d.join("junk");
    std::fs::write(&junk, vec![7u8; 1 << 20]).unwrap();
    let b = d.join("b.img");
    std::fs::File::create(&b).unwrap().set_len(1 << 20).unwrap();
    let out =
        ztier().args(["cache", "serve", "--backing"]).arg(&b).arg("--cache").arg(&junk).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a ztier cache"), "{out:?}");
    // Options out of range: refused before anything is opened.
    let refused = |opt: &str, val: &str| {
        let out = ztier()
            .args(["cache", "serve", opt, val, "--backing"])
            .arg(&b)
            .arg("--cache")
            .arg(&c)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{opt} {val}: {out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // --recycle-keep outside 50-95.
    for bad in ["40", "96"] {
        let err = refused("--recycle-keep", bad);
        assert!(err.contains("--recycle-keep") && err.contains("50..=95"), "{err}");
    }
    // An unknown admission.
    let err = refused("--admission", "twice");
    assert!(err.contains("unknown admission 'twice' (all, seen)"), "{err}");
    // Bound to one backing: another size is refused, --discard rebinds.
    let srv = serve(&d, &c, b.to_str().unwrap(), &[]);
    assert_eq!(srv.stop().code(), Some(0));
    let b2 = d.join("b2.img");
    std::fs::File::create(&b2).unwrap().set_len(2 << 20).unwrap();
    let out = ztier().args(["cache", "serve", "--backing"]).arg(&b2).arg("--cache").arg(&c).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("--discard"), "{out:?}");
    let srv = serve(&d, &c, b2.to_str().unwrap(), &["--discard"]);
    // A second server on the same cache is refused; a stale socket is replaced.
    let out = ztier()
        .args(["cache", "serve", "--backing"])
        .arg(&b2)
        .arg("--cache")
        .arg(&c)
        .arg("--socket")
        .arg(d.join("other.sock"))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use"), "{out:?}");
    srv.kill9();
    assert!(d.join("cache.sock").exists(), "a killed server leaves its socket");
    let srv = serve(&d, &c, b2.to_str().unwrap(), &[]);
    assert!(serve_log(&d).contains("nobody listens"), "{}", serve_log(&d));
    assert_eq!(srv.stop().code(), Some(0));
    std::fs::remove_dir_all(&d).unwrap();
}

/// As root: the cached device as a block device (nbdfuse + a loop
/// device), mkfs.ext4, mount, copy files, unmount, fsck clean, the
/// backing then holds the same files.
#[test]
fn nbdfuse_loop_mkfs_mount_as_root() {
    let d = tmpdir("fuse");
    let img = d.join("backing.img");
    std::fs::File::create(&img).unwrap().set_len(192 << 20).unwrap();
    let kit = nbdkit(
        &d.join("b.sock"),
        &["--filter=delay", "file", img.to_str().unwrap(), "rdelay=1ms", "wdelay=1ms"],
    );
    let cache = create_cache(&d, "32M", &[]);
    let srv = serve(&d, &cache, &kit.uri(), &["--ram-cache", "8M"]);
    let fs = Mounted::mkfs(&d, &srv.sock);
    let want = fs.copy_files();
    // Drop the page cache's copy: reads come back through the cache.
    fs.remount();
    assert_eq!(sums(&fs.mnt), want, "files differ read back through the cache");
    let m = fs.mnt.clone();
    fs.finish();
    assert_eq!(srv.stop().code(), Some(0));
    drop(kit);
    // The backing alone holds the file system.
    let undo = mount_image_ro(&img, &m);
    assert_eq!(sums(&m), want, "the backing misses writes");
    drop(undo);
    std::fs::remove_dir_all(&d).unwrap();
}

/// Reads answered at once from the connection's thread (blocks in RAM or
/// in the cache device's page cache) and those left to the workers (a
/// miss, or longer than 64 KiB) give the same simple replies (no
/// structured replies negotiated): right cookie, right data; a read past
/// the end an error.
#[test]
fn simple_replies_of_hits_and_misses() {
    let d = tmpdir("simple");
    let img = d.join("backing.img");
    let want = text(4 << 20, 11);
    std::fs::write(&img, &want).unwrap();
    let cache = create_cache(&d, "8M", &[]);
    let stats = d.join("stats.json");
    let srv = serve(
        &d,
        &cache,
        img.to_str().unwrap(),
        &["--ram-cache", "2M", "--sequential-cutoff", "0", "--stats", stats.to_str().unwrap()],
    );
    let mut s = go(&srv.sock);
    let mut cookie = 1u64;
    let mut check = |s: &mut std::os::unix::net::UnixStream, off: u64, len: u32| {
        cookie += 1;
        let (err, got) = simple_read(s, cookie, off, len);
        assert_eq!(err, 0, "read {off}+{len}");
        assert!(got == want[off as usize..off as usize + len as usize], "read {off}+{len}: wrong data");
    };
    for round in 0..4 {
        for (off, len) in [(0, 4096), (8192, 512), (65536 + 100, 20000), (1 << 20, 128 << 10)] {
            check(&mut s, off, len);
        }
        if round == 0 {
            // The fills land (a filler thread) before the next rounds hit.
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    let (err, _) = simple_read(&mut s, 99, (4 << 20) - 4096, 8192);
    assert_ne!(err, 0, "a read past the end");
    check(&mut s, 4096, 4096);
    drop(s);
    assert_eq!(srv.stop().code(), Some(0));
    let st = stats_file(&d);
    assert!(st["ram_hits"].as_u64().unwrap() + st["ssd_hits"].as_u64().unwrap() > 0, "{st}");
    assert!(st["misses"].as_u64().unwrap() > 0, "{st}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// `ztier bench cache` end to end, tiny and short: its JSON has every row
/// of both rounds, the ratios, the medians, each cell's load and notes.
#[test]
fn bench_cache_json() {
    for t in ["fio", "nbdkit"] {
        need(t);
    }
    let d = tmpdir("bench");
    let out = run(ztier()
        .args([
            "bench",
            "cache",
            "--cache-size",
            "4M",
            "--ws",
            "1",
            "--rounds",
            "2",
            "--data",
            "compressible",
        ])
        .args(["--workloads", "randread", "--rows", "backing,nbdkit-cache,raw,lz4,lz4-remote"])
        .args(["--warmup", "1", "--runtime", "2", "--json", "--dir"])
        .arg(&d));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 10, "{v}");
    for r in rows {
        for k in ["hit_ratio", "iops", "read_p50_us", "read_p99_us", "cpu_pct"] {
            assert!(r[k].is_number(), "{k}: {r}");
        }
        assert!(r["iops"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["load"][0].as_f64().unwrap() >= 0.0, "{r}");
        assert_eq!(r["notes"], serde_json::json!([]), "a clean run: {r}");
        if r["row"] == "lz4" {
            let z = &r["ztier"];
            assert!(z["ratio"].as_f64().unwrap() > 1.3, "{r}");
            assert!(r["hit_ratio"].as_f64().unwrap() > 0.3, "{r}");
        }
        if r["row"] == "lz4-remote" {
            // RAM cache + a redis-server started and stopped for the cell.
            assert!(r["ztier"]["ram_hit_p50_us"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["ztier"]["remote_hits"].is_u64(), "{r}");
        }
    }
    // lz4 and lz4-remote against nbdkit-cache and raw, in 2 rounds.
    assert_eq!(v["ratios"].as_array().unwrap().len(), 8, "{v}");
    let m = v["medians"].as_array().unwrap();
    assert_eq!(m.len(), 5, "{v}");
    for x in m {
        assert_eq!(x["iops"].as_array().unwrap().len(), 2, "{x}");
    }
    let mr = v["median_ratios"].as_array().unwrap();
    assert_eq!(mr.len(), 4, "{v}");
    assert_eq!(mr[0]["iops_x"].as_array().unwrap().len(), 2, "{v}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// `serve --remote` with a real redis-server on a loopback port: a
/// second whole read finds the blocks the small RAM and SSD caches let go
/// in Redis; `--remote` without `--ram-cache`, or with no server there, is
/// refused with a clear message.
#[test]
fn serve_with_a_remote_ram_cache() {
    use ztier_remote::testbed::{Options, Testbed};
    let bed = Testbed::single(&Options::default()).expect("starting redis-server");
    let d = tmpdir("remote");
    let img = d.join("backing.img");
    let want = text(8 << 20, 5);
    std::fs::write(&img, &want).unwrap();
    let cache = create_cache(&d, "1M", &[]);
    let stats = d.join("stats.json");
    let srv = serve(
        &d,
        &cache,
        img.to_str().unwrap(),
        &[
            "--ram-cache",
            "256K",
            "--remote",
            &bed.url(),
            "--remote-encrypt",
            "off",
            "--sequential-cutoff",
            "0",
            "--stats",
            stats.to_str().unwrap(),
        ],
    );
    assert!(read_all(&d, &srv.uri()) == want, "first read");
    std::thread::sleep(Duration::from_millis(500));
    assert!(read_all(&d, &srv.uri()) == want, "second read");
    assert_eq!(srv.stop().code(), Some(0));
    let st = stats_file(&d);
    let r = &st["remote"];
    assert!(r["puts"].as_u64().unwrap() > 1000, "{r}");
    assert!(r["hits"].as_u64().unwrap() > 500, "most of the second read from Redis: {st}");
    assert!(st["latency"]["remote_hit"]["count"].as_u64().unwrap() > 0, "{st}");

    let refused = |extra: &[&str], says: &str| {
        let out = ztier()
            .args(["cache", "serve", "--backing", img.to_str().unwrap(), "--cache"])
            .arg(&cache)
            .arg("--socket")
            .arg(d.join("refused.sock"))
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{extra:?}: {err}");
    };
    refused(&["--remote", &bed.url()], "--ram-cache");
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    refused(&["--ram-cache", "1M", "--remote", &format!("redis://127.0.0.1:{free}")], "--remote");
    std::fs::remove_dir_all(&d).unwrap();
}
