//! `ztier blk` with real NBD clients: qemu-io, qemu-img, nbdinfo, nbdcopy,
//! fio's nbd engine; malformed protocol input; kill -9 of the server.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::nbd::{go, go_on, handshake, mount_image_ro, option, run, sums, text, Mounted};
use common::{require as need, tmp as tmpdir};

fn ztier() -> Command {
    Command::new(common::ztier())
}

struct Server {
    child: Option<Child>,
    sock: PathBuf,
}

impl Server {
    fn start(image: &Path, sock: &Path) -> Server {
        let child = ztier()
            .args(["blk", "serve"])
            .arg(image)
            .arg("--socket")
            .arg(sock)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Wait until it accepts (a stale socket file may be there before).
        let start = Instant::now();
        while UnixStream::connect(sock).is_err() {
            assert!(start.elapsed() < Duration::from_secs(30), "server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Server { child: Some(child), sock: sock.to_path_buf() }
    }
    fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.sock.display())
    }
    /// SIGTERM (by PID): clean shutdown with a checkpoint.
    fn stop(mut self) {
        let mut c = self.child.take().unwrap();
        run(Command::new("kill").arg("-TERM").arg(c.id().to_string()));
        let st = c.wait().unwrap();
        assert!(st.success(), "server exit {st:?}");
        assert!(!self.sock.exists(), "socket removed at shutdown");
    }
    /// SIGKILL (by PID): a crash; the socket file stays, as after a real one.
    fn kill9_keep_socket(mut self) {
        let mut c = self.child.take().unwrap();
        run(Command::new("kill").arg("-KILL").arg(c.id().to_string()));
        let _ = c.wait();
        assert!(self.sock.exists(), "a killed server leaves its socket");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn create(dir: &Path, size: &str) -> PathBuf {
    let img = dir.join("img.ztb");
    run(ztier().args(["blk", "create"]).arg(&img).args(["--size", size]));
    img
}

fn check_clean(img: &Path) {
    let out = run(ztier().args(["blk", "check"]).arg(img));
    assert!(out.contains("clean"), "{out}");
}

#[test]
fn qemu_io_patterns_nbdinfo_map_and_nbdcopy_both_ways() {
    for t in ["qemu-io", "nbdinfo", "nbdcopy"] {
        need(t);
    }
    let d = tmpdir("clients");
    let img = create(&d, "64M");
    let srv = Server::start(&img, &d.join("s.sock"));
    let u = srv.uri();
    let out = run(Command::new("qemu-io")
        .args(["-f", "raw"])
        .args([
            "-c",
            "write -P 0xab 0 1M",
            "-c",
            "write -P 0xcd 4097 10000",
            "-c",
            "read -P 0xab 0 4097",
            "-c",
            "read -P 0xcd 4097 10000",
            "-c",
            "read -P 0xab 14097 1034479",
            "-c",
            "discard 2M 1M",
            "-c",
            "write -z 3M 64k",
            "-c",
            "read -P 0 2M 1M",
            "-c",
            "read -P 0 3M 64k",
            "-c",
            "flush",
        ])
        .arg(&u));
    assert!(!out.contains("Pattern verification failed"), "{out}");
    let map = run(Command::new("nbdinfo").arg("--map").arg(&u));
    // 1M data, then holes; the written zeroes are zero but allocated.
    assert!(
        map.lines().next().unwrap().split_whitespace().collect::<Vec<_>>()[..3] == ["0", "1048576", "0"],
        "{map}"
    );
    assert!(map.contains("3145728") && map.contains("zero"), "{map}");
    // nbdcopy in and out: text (compresses) then random (does not).
    let src = d.join("src");
    let mut data = text(8 << 20, 7);
    let mut x = 99u64;
    data.extend((0..(4 << 20)).map(|_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as u8
    }));
    std::fs::write(&src, &data).unwrap();
    run(Command::new("nbdcopy").arg(&src).arg(&u));
    let back = d.join("back");
    run(Command::new("nbdcopy").arg(&u).arg(&back));
    let got = std::fs::read(&back).unwrap();
    assert_eq!(got.len(), 64 << 20);
    assert!(got[..data.len()] == data[..], "nbdcopy round trip differs");
    srv.stop();
    check_clean(&img);
    let s: serde_json::Value =
        serde_json::from_str(&run(ztier().args(["blk", "stats", "--json"]).arg(&img))).unwrap();
    assert!(s["ratio"].as_f64().unwrap() > 1.3, "{s}");
    assert_eq!(s["block_size"], 4096);
    for k in [
        "logical_size",
        "logical_bytes_mapped",
        "physical_bytes_used",
        "ratio",
        "extents_total",
        "extents_free",
    ] {
        assert!(s[k].is_number(), "DESIGN field {k} missing: {s}");
    }
    assert_eq!(s["logical_size"], 64u64 << 20);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn fio_nbd_engine_verifies_crc32c() {
    need("fio");
    let d = tmpdir("fio");
    let img = create(&d, "128M");
    let srv = Server::start(&img, &d.join("s.sock"));
    // fio writes its verify state file into its working directory.
    let out = run(Command::new("fio")
        .current_dir(&d)
        .args(["--name=v", "--ioengine=nbd", "--rw=randwrite", "--bs=4k", "--size=48M", "--iodepth=16"])
        .args(["--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--output-format=terse"])
        .arg(format!("--uri={}", srv.uri())));
    // terse field 5 is the error code
    assert_eq!(out.split(';').nth(4), Some("0"), "{out}");
    srv.stop();
    check_clean(&img);
    std::fs::remove_dir_all(&d).unwrap();
}

/// Malformed options get error replies, malformed requests error replies
/// or a dropped connection; the server keeps serving others.
#[test]
fn malformed_input_gets_errors_and_the_server_survives() {
    need("qemu-io");
    let d = tmpdir("malformed");
    let img = create(&d, "16M");
    let srv = Server::start(&img, &d.join("s.sock"));
    let mut s = handshake(&srv.sock);
    const ERR_UNSUP: u32 = (1 << 31) + 1;
    const ERR_INVALID: u32 = (1 << 31) + 3;
    const ERR_UNKNOWN: u32 = (1 << 31) + 6;
    assert_eq!(option(&mut s, 4242, b"junk").0, ERR_UNSUP);
    assert_eq!(option(&mut s, 7, &[0, 0, 0, 50, 0]).0, ERR_INVALID); // GO with a name past the end
    assert_eq!(option(&mut s, 9, b"").0, ERR_INVALID); // meta context before structured replies
    let mut go = 5u32.to_be_bytes().to_vec();
    go.extend_from_slice(b"nope!");
    go.extend_from_slice(&0u16.to_be_bytes());
    assert_eq!(option(&mut s, 6, &go).0, ERR_UNKNOWN);
    go_on(&mut s);
    // Read beyond the end: EINVAL in a simple reply.
    let req = |kind: u16, off: u64, len: u32| {
        let mut b = 0x2560_9513u32.to_be_bytes().to_vec();
        b.extend_from_slice(&0u16.to_be_bytes());
        b.extend_from_slice(&kind.to_be_bytes());
        b.extend_from_slice(&77u64.to_be_bytes());
        b.extend_from_slice(&off.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        b
    };
    s.write_all(&req(0, 16 << 20, 4096)).unwrap();
    let mut r = [0u8; 16];
    s.read_exact(&mut r).unwrap();
    assert_eq!(u32::from_be_bytes(r[4..8].try_into().unwrap()), 22, "EINVAL");
    s.write_all(&req(99, 0, 1)).unwrap();
    s.read_exact(&mut r).unwrap();
    assert_eq!(u32::from_be_bytes(r[4..8].try_into().unwrap()), 22, "unknown command: EINVAL");
    // A request with a bad magic: the server hangs up on this connection.
    s.write_all(&[0xde; 28]).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    // Garbage instead of the client flags, and a truncated option.
    let mut g = UnixStream::connect(&srv.sock).unwrap();
    let _ = g.write_all(&[0xff; 64]);
    drop(g);
    let mut t = handshake(&srv.sock);
    let _ = t.write_all(b"IHAVEOPT\0\0\0\x07\xff\xff\xff\xff");
    let _ = t.read_to_end(&mut rest); // the server hangs up
    drop(t);
    // Others are still served.
    let out = run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x11 0 64k", "-c", "read -P 0x11 0 64k"])
        .arg(srv.uri()));
    assert!(!out.contains("failed"), "{out}");
    srv.stop();
    check_clean(&img);
    std::fs::remove_dir_all(&d).unwrap();
}

/// kill -9 of the server during fio writes: fio writes sequentially with
/// a FLUSH after each write and a checksum in each block; the server is
/// killed once it has answered 40 flushes. After a restart the image is
/// consistent and every block fio wrote and flushed before the kill
/// verifies (fio --verify_only over them; the same check over more than
/// was written fails, so it checks what it claims).
#[test]
fn kill_9_during_fio_writes_keeps_flushed_data() {
    for t in ["fio", "nbdcopy"] {
        need(t);
    }
    let d = tmpdir("kill9");
    let img = create(&d, "96M");
    let srv = Server::start(&img, &d.join("s.sock"));
    let keep = text(16 << 20, 3);
    std::fs::write(d.join("keep"), &keep).unwrap();
    run(Command::new("nbdcopy").arg("--flush").arg(d.join("keep")).arg(srv.uri()));
    let uri = srv.uri();
    let job = |size: u64| {
        let mut c = Command::new("fio");
        c.current_dir(&d)
            .args(["--name=w", "--ioengine=nbd", "--rw=write", "--bs=64k", "--offset=32M", "--iodepth=1"])
            .args(["--verify=crc32c", "--verify_fatal=1"])
            .arg(format!("--size={size}"))
            .arg(format!("--uri={uri}"));
        c
    };
    let mut fio = job(48 << 20)
        .args(["--fsync=1", "--do_verify=0", "--output-format=json", "--output=fio.json"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Kill once the server has answered 40 flushes (its live stats).
    let start = Instant::now();
    loop {
        let out = ztier().args(["blk", "stats", "--json"]).arg(&img).output().unwrap();
        let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if s["flush_requests"].as_u64().unwrap_or(0) >= 40 {
            break;
        }
        assert!(fio.try_wait().unwrap().is_none(), "fio ended before the kill: did it connect?");
        assert!(start.elapsed() < Duration::from_secs(60), "fio made no progress: {s}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let sock = srv.sock.clone();
    srv.kill9_keep_socket();
    let st = fio.wait().unwrap();
    assert!(!st.success(), "fio must see its server die mid-run");
    let j = std::fs::read_to_string(d.join("fio.json")).unwrap();
    let j: serde_json::Value = serde_json::from_str(&j[j.find('{').unwrap()..]).unwrap();
    let written = j["jobs"][0]["write"]["io_bytes"].as_u64().unwrap();
    // Each write was followed by a FLUSH before the next: all but the
    // last completed write were flushed.
    let flushed = written.saturating_sub(64 << 10);
    assert!(flushed >= 32 * (64 << 10), "fio wrote {written} bytes before the kill");
    check_clean(&img);
    let srv = Server::start(&img, &sock); // the stale socket is replaced
    let back = d.join("back");
    run(Command::new("nbdcopy").arg(srv.uri()).arg(&back));
    let got = std::fs::read(&back).unwrap();
    assert!(got[..keep.len()] == keep[..], "data flushed by nbdcopy lost after kill -9");
    let ok = job(flushed).args(["--verify_only", "--do_verify=1"]).output().unwrap();
    assert!(ok.status.success(), "flushed fio blocks do not verify: {}", String::from_utf8_lossy(&ok.stderr));
    let beyond = job(flushed + (8 << 20)).args(["--verify_only", "--do_verify=1"]).output().unwrap();
    assert!(!beyond.status.success(), "verifying blocks fio never wrote must fail");
    // kill -9 again right after the restart (whose open replayed the log
    // and took its first checkpoint, incremental): new data flushed over
    // the first 4 MiB survives, and so does the rest.
    let more = text(4 << 20, 5);
    std::fs::write(d.join("more"), &more).unwrap();
    run(Command::new("nbdcopy").arg("--flush").arg(d.join("more")).arg(srv.uri()));
    srv.kill9_keep_socket();
    check_clean(&img);
    let srv = Server::start(&img, &sock);
    run(Command::new("nbdcopy").arg(srv.uri()).arg(&back));
    let got = std::fs::read(&back).unwrap();
    assert!(got[..more.len()] == more[..], "data flushed right after a restart lost after kill -9");
    assert!(got[more.len()..keep.len()] == keep[more.len()..], "older data lost after a second kill -9");
    let ok = job(flushed).args(["--verify_only", "--do_verify=1"]).output().unwrap();
    assert!(
        ok.status.success(),
        "flushed fio blocks after a second kill -9: {}",
        String::from_utf8_lossy(&ok.stderr)
    );
    srv.stop();
    check_clean(&img);
    std::fs::remove_dir_all(&d).unwrap();
}

/// A real ext4 image filled with /usr/share files: qemu-img convert onto
/// the device and qemu-img compare; it compresses.
#[test]
fn qemu_img_convert_and_compare_an_ext4_image() {
    for t in ["qemu-img", "mkfs.ext4"] {
        need(t);
    }
    let d = tmpdir("ext4");
    let src = d.join("fs.img");
    let share = d.join("share");
    std::fs::create_dir_all(&share).unwrap();
    for sub in ["vim", "i18n", "zoneinfo", "perl5", "python3"] {
        let from = Path::new("/usr/share").join(sub);
        if from.exists() {
            let _ = Command::new("cp").arg("-r").arg(&from).arg(share.join(sub.replace('/', "-"))).status();
        }
    }
    run(Command::new("mkfs.ext4").args(["-q", "-F", "-d"]).arg(&share).arg(&src).arg("160M"));
    let img = create(&d, "160M");
    let srv = Server::start(&img, &d.join("s.sock"));
    run(Command::new("qemu-img").args(["convert", "-n", "-f", "raw", "-O", "raw"]).arg(&src).arg(srv.uri()));
    let out =
        run(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw"]).arg(&src).arg(srv.uri()));
    assert!(out.contains("identical"), "{out}");
    srv.stop();
    check_clean(&img);
    let s: serde_json::Value =
        serde_json::from_str(&run(ztier().args(["blk", "stats", "--json"]).arg(&img))).unwrap();
    assert!(s["ratio"].as_f64().unwrap() > 1.5, "{s}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// As root: the device as a real block device (nbdfuse + a loop device),
/// mkfs.ext4, mount, copy files, unmount, fsck clean, files intact after a
/// server restart.
#[test]
fn nbdfuse_loop_mkfs_mount_copy_fsck_as_root() {
    let d = tmpdir("fuse");
    let img = create(&d, "192M");
    let srv = Server::start(&img, &d.join("s.sock"));
    let fs = Mounted::mkfs(&d, &srv.sock);
    let want = fs.copy_files();
    let m = fs.mnt.clone();
    fs.finish();
    srv.stop();
    check_clean(&img);
    // The files read back through a fresh server, with qemu-img as the client.
    let srv = Server::start(&img, &d.join("s.sock"));
    let raw = d.join("raw.img");
    run(Command::new("qemu-img").args(["convert", "-f", "raw", "-O", "raw"]).arg(srv.uri()).arg(&raw));
    srv.stop();
    let undo = mount_image_ro(&raw, &m);
    assert_eq!(sums(&m), want, "files differ after a restart");
    drop(undo);
    std::fs::remove_dir_all(&d).unwrap();
}

/// Starts `ztier blk serve ARGS`; returns it (the caller waits for it)
/// and its "serving" line.
#[allow(clippy::zombie_processes)]
fn serve_with(args: &[&str]) -> (Child, String) {
    use std::io::BufRead;
    let mut c = ztier().args(["blk", "serve"]).args(args).stderr(Stdio::piped()).spawn().unwrap();
    let mut r = std::io::BufReader::new(c.stderr.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap() == 0 {
            let st = c.wait().unwrap();
            panic!("serve {args:?} ended ({st:?}) before serving: {seen}");
        }
        seen.push_str(&line);
        if line.contains("serving") {
            // Keep draining stderr so the server never blocks on it.
            std::thread::spawn(move || std::io::copy(&mut r, &mut std::io::sink()));
            return (c, line);
        }
    }
}

/// Runs `ztier ARGS`, expecting failure; returns stderr.
fn fails(args: &[&str]) -> String {
    let out = ztier().args(args).output().unwrap();
    assert!(!out.status.success(), "ztier {args:?} should fail: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).to_string()
}

fn kill(c: &mut Child, sig: &str) {
    run(Command::new("kill").arg(format!("-{sig}")).arg(c.id().to_string()));
    let _ = c.wait();
}

fn sha(p: &Path) -> String {
    run(Command::new("sha256sum").arg(p))
}

/// A server killed by SIGKILL leaves its socket; the same command starts
/// again (the socket nobody listens on is replaced). A socket a live
/// server listens on, or a file that is not a socket, is refused.
#[test]
fn stale_socket_is_replaced_a_live_one_refused() {
    need("qemu-io");
    let d = tmpdir("stale");
    let img = create(&d, "16M");
    let sock = d.join("s.sock");
    let srv = Server::start(&img, &sock);
    srv.kill9_keep_socket();
    let a = img.display().to_string();
    let s = sock.display().to_string();
    let (mut c, line) = serve_with(&[&a, "--socket", &s]);
    assert!(line.contains("serving"), "{line}");
    let out = run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x33 0 64k", "-c", "read -P 0x33 0 64k"])
        .arg(format!("nbd+unix:///?socket={s}")));
    assert!(!out.contains("failed"), "{out}");
    // Another image on the same socket while it is served: refused.
    let other = d.join("other.ztb");
    run(ztier().args(["blk", "create"]).arg(&other).args(["--size", "1M"]));
    let e = fails(&["blk", "serve", &other.display().to_string(), "--socket", &s]);
    assert!(e.contains("another server listens"), "{e}");
    kill(&mut c, "TERM");
    // A regular file in the way is never removed.
    let file = d.join("notasocket");
    std::fs::write(&file, b"keep me").unwrap();
    let e = fails(&["blk", "serve", &a, "--socket", &file.display().to_string()]);
    assert!(e.contains("not a socket"), "{e}");
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
    check_clean(&img);
    std::fs::remove_dir_all(&d).unwrap();
}

/// qemu-io fills 64 MiB with one byte: same-filled blocks are records,
/// under 1 MiB physical.
#[test]
fn same_filled_64m_takes_under_1m() {
    need("qemu-io");
    let d = tmpdir("samefill");
    let img = create(&d, "64M");
    let srv = Server::start(&img, &d.join("s.sock"));
    let out = run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x5a 0 64M", "-c", "read -P 0x5a 0 64M", "-c", "flush"])
        .arg(srv.uri()));
    assert!(!out.contains("failed"), "{out}");
    srv.stop();
    let s: serde_json::Value =
        serde_json::from_str(&run(ztier().args(["blk", "stats", "--json"]).arg(&img))).unwrap();
    assert_eq!(s["same_blocks"], 16384, "{s}");
    assert!(s["physical_bytes_used"].as_u64().unwrap() < 1 << 20, "{s}");
    check_clean(&img);
    std::fs::remove_dir_all(&d).unwrap();
}

fn http_get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// A served image: `blk stats` answers from the server with the offline
/// fields plus live counters; the metrics endpoint serves Prometheus text;
/// `blk check` reads every block back online and says what it did not do.
#[test]
fn live_stats_metrics_and_online_check_of_a_served_image() {
    need("qemu-io");
    let d = tmpdir("live");
    let img = create(&d, "32M");
    let a = img.display().to_string();
    let s = d.join("s.sock").display().to_string();
    let e = fails(&["blk", "serve", &a, "--socket", &s, "--metrics", "0.0.0.0:0"]);
    assert!(e.contains("not a loopback address"), "{e}");
    let (mut c, line) = serve_with(&[&a, "--socket", &s, "--metrics", "127.0.0.1:0"]);
    let addr = line.split("http://").nth(1).and_then(|x| x.split("/metrics").next()).unwrap().to_string();
    let out = run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x11 0 1M", "-c", "read -P 0x11 0 1M", "-c", "flush"])
        .arg(format!("nbd+unix:///?socket={s}")));
    assert!(!out.contains("failed"), "{out}");
    let v: serde_json::Value =
        serde_json::from_str(&run(ztier().args(["blk", "stats", "--json", &a]))).unwrap();
    assert_eq!(v["served"], true, "{v}");
    assert_eq!(v["logical_size"], 32u64 << 20, "{v}");
    assert_eq!(v["bytes_written"], 1u64 << 20, "{v}");
    assert_eq!(v["bytes_read"], 1u64 << 20, "{v}");
    assert!(v["requests"].as_u64().unwrap() >= 3 && v["flush_requests"].as_u64().unwrap() >= 1, "{v}");
    assert_eq!(v["errors"], 0, "{v}");
    for k in ["latency_p50_us", "latency_p99_us", "write_latency_p99_us", "read_latency_p50_us"] {
        assert!(v[k].as_f64().unwrap() > 0.0, "{k}: {v}");
    }
    for k in ["checkpoints", "checkpoint_pages_written", "cleaner_runs", "extents_cleaned", "same_blocks"] {
        assert!(v[k].is_number(), "{k}: {v}");
    }
    let text = run(ztier().args(["blk", "stats", &a]));
    assert!(text.contains("requests") && text.contains("p99"), "{text}");
    let m = http_get(&addr, "/metrics");
    assert!(m.starts_with("HTTP/1.") && m.contains(" 200 "), "{m}");
    assert!(m.contains("# TYPE ztier_blk_requests_total counter"), "{m}");
    assert!(m.contains("ztier_blk_written_bytes_total{image=") && m.contains("} 1048576"), "{m}");
    assert!(m.contains("ztier_blk_request_duration_seconds_bucket{"), "{m}");
    assert!(http_get(&addr, "/other").contains(" 404 "));
    let out = ztier().args(["blk", "check", &a]).output().unwrap();
    let o = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{o}");
    assert!(o.contains("every mapped block reads back") && o.contains("need the image not served"), "{o}");
    kill(&mut c, "TERM");
    // Stopped: the offline answer, without the live fields.
    let v: serde_json::Value =
        serde_json::from_str(&run(ztier().args(["blk", "stats", "--json", &a]))).unwrap();
    assert!(v.get("served").is_none() && v["data_blocks"].is_number(), "{v}");
    check_clean(&img);
    std::fs::remove_dir_all(&d).unwrap();
}

/// The handshake up to GO on the default export, with structured replies
/// off: the connection is in transmission.
fn threads_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().count()
}

/// --listen on loopback TCP (a non-loopback address refused), --readonly
/// (writes refused with EPERM, the image byte-identical after), --threads
/// (workers per connection).
#[test]
fn listen_readonly_and_threads() {
    need("qemu-io");
    let d = tmpdir("opts");
    let img = create(&d, "16M");
    let a = img.display().to_string();
    let e = fails(&["blk", "serve", &a, "--listen", "0.0.0.0:0"]);
    assert!(e.contains("not a loopback address"), "{e}");
    let (mut c, line) = serve_with(&[&a, "--listen", "127.0.0.1:0"]);
    let uri = line.split_whitespace().find(|w| w.starts_with("nbd://")).unwrap().to_string();
    let out = run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x42 0 256k", "-c", "read -P 0x42 0 256k", "-c", "flush"])
        .arg(&uri));
    assert!(!out.contains("failed"), "{out}");
    kill(&mut c, "TERM");
    // Read-only: a raw WRITE gets EPERM, reads work, the file is unchanged.
    let before = sha(&img);
    let s = d.join("ro.sock");
    let (mut c, _) = serve_with(&[&a, "--socket", &s.display().to_string(), "--readonly"]);
    let mut conn = go(&s);
    let mut w = 0x2560_9513u32.to_be_bytes().to_vec();
    w.extend_from_slice(&0u16.to_be_bytes()); // flags
    w.extend_from_slice(&1u16.to_be_bytes()); // WRITE
    w.extend_from_slice(&5u64.to_be_bytes()); // cookie
    w.extend_from_slice(&0u64.to_be_bytes());
    w.extend_from_slice(&4096u32.to_be_bytes());
    w.extend_from_slice(&[0xee; 4096]);
    conn.write_all(&w).unwrap();
    let mut r = [0u8; 16];
    conn.read_exact(&mut r).unwrap();
    assert_eq!(u32::from_be_bytes(r[4..8].try_into().unwrap()), 1, "EPERM for a write to a read-only export");
    drop(conn);
    let out = run(Command::new("qemu-io")
        .args(["-r", "-f", "raw", "-c", "read -P 0x42 0 256k"])
        .arg(format!("nbd+unix:///?socket={}", s.display())));
    assert!(!out.contains("failed"), "{out}");
    kill(&mut c, "TERM");
    assert_eq!(sha(&img), before, "a read-only serve changed the image");
    // Threads: one connection in transmission has N workers.
    let mut counts = Vec::new();
    for n in ["1", "3"] {
        let s = d.join(format!("t{n}.sock"));
        let (mut c, line) = serve_with(&[&a, "--socket", &s.display().to_string(), "--threads", n]);
        assert!(line.contains(&format!("({n} threads per connection)")), "{line}");
        std::thread::sleep(Duration::from_millis(300)); // its maintenance thread starts
        let idle = threads_of(c.id());
        let conn = go(&s);
        std::thread::sleep(Duration::from_millis(300));
        counts.push(threads_of(c.id()) - idle);
        drop(conn);
        kill(&mut c, "TERM");
    }
    // The connection's reader thread plus its workers.
    assert_eq!(counts, vec![2, 4], "threads per connection with --threads 1 and 3");
    let e = fails(&["blk", "serve", &a, "--threads", "0"]);
    assert!(e.contains("--threads"), "{e}");
    check_clean(&img);
    std::fs::remove_dir_all(&d).unwrap();
}

/// `blk create` never overwrites a file and refuses sizes that do not fit
/// (a --block above u32 was once truncated to 4K), leaving no file.
#[test]
fn create_refuses_existing_files_and_bad_sizes() {
    let d = tmpdir("create");
    let img = d.join("x.ztb");
    std::fs::write(&img, b"precious").unwrap();
    let e = fails(&["blk", "create", &img.display().to_string(), "--size", "16M"]);
    assert!(e.contains("exists"), "{e}");
    assert_eq!(std::fs::read(&img).unwrap(), b"precious");
    let new = d.join("new.ztb").display().to_string();
    for (args, says) in [
        (vec!["--size", "0"], "--size"),
        (vec!["--size", "1000"], "multiple of the block size"),
        (vec!["--size", "12Q"], "suffix"),
        (vec!["--size", "16M", "--block", "3000"], "power of two"),
        (vec!["--size", "16M", "--block", "4294971392"], "does not fit"),
        (vec!["--size", "16M", "--block", "64K"], "--block"),
        (vec!["--size", "16M", "--extent", "128K"], "--extent"),
        (vec!["--size", "16M", "--extent", "4K"], "--extent"),
        (vec!["--size", "16M", "--physical", "0"], "--physical"),
        (vec!["--size", "16M", "--physical", "64K"], "physical size too small"),
    ] {
        let mut a = vec!["blk", "create", &new];
        a.extend(args.iter().copied());
        let e = fails(&a);
        assert!(e.contains(says), "{args:?}: {e}");
        assert!(!Path::new(&new).exists(), "{args:?} left a file");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// check, serve and stats of a file that is not an image, and of an image
/// whose two superblock slots are damaged, fail with a clear message and
/// change nothing; one damaged slot is survived.
#[test]
fn non_images_and_damaged_superblocks_are_refused() {
    need("qemu-io");
    let d = tmpdir("notimg");
    let txt = d.join("notes.txt");
    std::fs::write(&txt, "not an image\n".repeat(2000)).unwrap();
    let img = create(&d, "8M");
    let srv = Server::start(&img, &d.join("s.sock"));
    let out = run(Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 0x77 0 1M"]).arg(srv.uri()));
    assert!(!out.contains("failed"), "{out}");
    srv.stop(); // generation 2, in slot 0; generation 1 stays in slot 1
    let mut bytes = std::fs::read(&img).unwrap();
    // Slot 0 damaged: generation 1 and the log written since are used.
    bytes[100] ^= 0xff;
    std::fs::write(&img, &bytes).unwrap();
    check_clean(&img);
    let srv = Server::start(&img, &d.join("s.sock"));
    let out = run(Command::new("qemu-io").args(["-f", "raw", "-c", "read -P 0x77 0 1M"]).arg(srv.uri()));
    assert!(!out.contains("failed"), "{out}");
    srv.stop();
    let bytes = std::fs::read(&img).unwrap();
    // Both damaged.
    let two = d.join("two.ztb");
    let mut b2 = bytes.clone();
    b2[100] ^= 0xff;
    b2[4096 + 100] ^= 0xff;
    std::fs::write(&two, &b2).unwrap();
    for (p, says) in [(&txt, "no ztier block image magic"), (&two, "superblock checksum mismatch")] {
        let before = sha(p);
        let f = p.display().to_string();
        let sock = d.join("n.sock").display().to_string();
        for args in
            [vec!["blk", "check", &f], vec!["blk", "stats", &f], vec!["blk", "serve", &f, "--socket", &sock]]
        {
            let e = fails(&args);
            assert!(e.contains("not a ztier block image") && e.contains(says), "{args:?}: {e}");
            if p == &two {
                assert!(e.contains("slot 0") && e.contains("slot 1"), "both slots named: {e}");
            }
        }
        assert_eq!(sha(p), before, "{} changed", p.display());
        assert!(!Path::new(&sock).exists());
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// A short `ztier bench blk --cold --json` run: one JSON object with every
/// fio job against nbdkit (the read jobs from a dropped page cache), the
/// space table (random at most 101%, the mixed row), and the
/// checkpoint-latency run.
#[test]
fn bench_blk_short_run_json() {
    for t in ["fio", "nbdkit", "sqlite3", "gzip"] {
        need(t);
    }
    let d = tmpdir("bench");
    let out = run(ztier()
        .args(["bench", "blk", "--size", "32M", "--runtime", "1", "--space-mib", "32", "--ckpt-runtime", "2"])
        .args(["--rounds", "1", "--cold", "--ckpt-size", "256M", "--ckpt-span", "16M"])
        .arg("--dir")
        .arg(&d)
        .arg("--json"));
    let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON object on stdout");
    let jobs: Vec<&str> = v["fio"].as_array().unwrap().iter().map(|j| j["job"].as_str().unwrap()).collect();
    assert_eq!(
        jobs,
        ["seq-write-1M", "seq-read-1M-qd4", "seq-read-1M-qd16", "randread-4K-qd32", "randwrite-4K-qd32"]
    );
    for j in v["fio"].as_array().unwrap() {
        for k in ["ztier_mb_s", "nbdkit_mb_s", "ratio", "ztier_iops", "nbdkit_iops"] {
            assert!(j[k].as_f64().unwrap() > 0.0, "{k}: {j}");
        }
        assert_eq!(j["ratios"].as_array().unwrap().len(), 1, "{j}");
        let read = j["job"].as_str().unwrap().contains("read");
        assert_eq!(j["cold"], read, "{j}");
        // ztier's CPU is read in microseconds; nbdkit's in 10 ms clock
        // ticks, which a 1-s job of 4 KiB writes (a few MB) may not reach.
        assert!(j["ztier_cpu_ms_per_gib"].as_f64().unwrap() > 0.0, "{j}");
        let kit = j["nbdkit_cpu_ms_per_gib"].as_f64().unwrap();
        if j["job"].as_str().unwrap().starts_with("seq") {
            assert!(kit > 0.0, "{j}");
        } else {
            assert!(kit >= 0.0, "{j}");
        }
        // Only the first read job waits for the writes to settle; cold
        // reads get no warm-up pass.
        assert_eq!(j["settle_ms"].is_f64(), j["job"] == "seq-read-1M-qd4", "{j}");
        assert_eq!(j["warmed"], false, "{j}");
        if read {
            // The drops worked: (almost) nothing of either image stayed cached.
            assert!(j["resident_after_drop"].as_f64().unwrap() < 0.05, "{j}");
        }
    }
    let space = v["space"].as_array().unwrap();
    let row = |name: &str| space.iter().find(|r| r["data"] == name).unwrap_or_else(|| panic!("{name}: {v}"));
    let random = row("random")["physical_fraction"].as_f64().unwrap();
    assert!(random <= 1.01, "random data at {random} of its size");
    let mixed = row("mixed")["physical_fraction"].as_f64().unwrap();
    assert!(mixed < 1.0 && mixed > row("text")["physical_fraction"].as_f64().unwrap(), "{v}");
    let c = &v["checkpoint"][0];
    assert_eq!(c["build"], "this", "{v}");
    for k in ["iops", "write_p50_us", "write_p99_us", "write_max_us"] {
        assert!(c[k].as_f64().unwrap() > 0.0, "{k}: {c}");
    }
    assert!(c["checkpoints"].is_u64(), "{c}");
    // --ckpt-size: a 256 MiB device, whose table (65,536 entries of 12
    // bytes, 340 to a 4 KiB page) is what a full checkpoint would write.
    assert_eq!(c["table_bytes"].as_u64().unwrap(), 65536_u64.div_ceil(340) * 4096, "{c}");
    // This build reports its checkpoints' pages from its live stats.
    if c["checkpoints"].as_u64().unwrap() > 0 {
        assert!(c["pages_per_checkpoint"].as_f64().unwrap() > 0.0, "{c}");
        assert!(c["bytes_per_checkpoint"].as_f64().unwrap() > 0.0, "{c}");
    }
    std::fs::remove_dir_all(&d).unwrap();
}
