//! `ztier blk` with real NBD clients: qemu-io, qemu-img, nbdinfo, nbdcopy,
//! fio's nbd engine; malformed protocol input; kill -9 of the server.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn ztier() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ztier"))
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ztier-cli-blk-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn need(tool: &str) {
    let ok =
        Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output().unwrap().status.success();
    assert!(ok, "{tool} is needed (scripts/deb-packages/blk.txt; `make test` as root installs it)");
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
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
        let start = Instant::now();
        while !sock.exists() {
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
    /// SIGKILL (by PID): a crash.
    fn kill9(mut self) {
        let mut c = self.child.take().unwrap();
        run(Command::new("kill").arg("-KILL").arg(c.id().to_string()));
        let _ = c.wait();
        let _ = std::fs::remove_file(&self.sock);
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

fn text(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(len + 32);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(
            format!("line {} of the ztier block test, value {}\n", x % 977, x % 31).as_bytes(),
        );
    }
    v.truncate(len);
    v
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

fn handshake(sock: &Path) -> UnixStream {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    assert_eq!(&hello[..8], b"NBDMAGIC");
    s.write_all(&3u32.to_be_bytes()).unwrap();
    s
}

fn option(s: &mut UnixStream, opt: u32, data: &[u8]) -> (u32, Vec<u8>) {
    let mut m = b"IHAVEOPT".to_vec();
    m.extend_from_slice(&opt.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(data);
    s.write_all(&m).unwrap();
    let mut h = [0u8; 20];
    s.read_exact(&mut h).unwrap();
    let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body).unwrap();
    (kind, body)
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
    let mut go = 0u32.to_be_bytes().to_vec();
    go.extend_from_slice(&0u16.to_be_bytes());
    // GO on the default export: INFO replies, then ACK.
    let (mut k, _) = option(&mut s, 7, &go);
    while k != 1 {
        assert_eq!(k, 3, "INFO expected");
        let mut h = [0u8; 20];
        s.read_exact(&mut h).unwrap();
        k = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let mut body = vec![0u8; u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize];
        s.read_exact(&mut body).unwrap();
    }
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

/// kill -9 of the server during fio writes: after a restart the image is
/// consistent and data flushed before the crash reads back.
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
    run(Command::new("nbdcopy").arg(d.join("keep")).arg(srv.uri())); // flushes at the end
    let mut fio = Command::new("fio")
        .args(["--name=w", "--ioengine=nbd", "--rw=randwrite", "--bs=16k", "--offset=32M", "--size=64M"])
        .args(["--iodepth=8", "--time_based", "--runtime=30", "--output=/dev/null"])
        .arg(format!("--uri={}", srv.uri()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    srv.kill9();
    let _ = fio.wait();
    check_clean(&img);
    let srv = Server::start(&img, &d.join("s.sock"));
    let back = d.join("back");
    run(Command::new("nbdcopy").arg(srv.uri()).arg(&back));
    let got = std::fs::read(&back).unwrap();
    assert!(got[..keep.len()] == keep[..], "flushed data lost after kill -9");
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

/// Undoes a system change when dropped (also when the test fails).
struct Undo(Vec<(String, Vec<String>)>);
impl Drop for Undo {
    fn drop(&mut self) {
        for (cmd, args) in self.0.iter().rev() {
            let _ = Command::new(cmd).args(args).stdout(Stdio::null()).stderr(Stdio::null()).status();
        }
    }
}

/// As root: the device as a real block device (nbdfuse + a loop device),
/// mkfs.ext4, mount, copy files, unmount, fsck clean, files intact after a
/// server restart.
#[test]
fn nbdfuse_loop_mkfs_mount_copy_fsck_as_root() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    assert!(root, "this test needs root (loop devices, mount); run `make test` as root");
    for t in ["nbdfuse", "losetup", "mkfs.ext4", "fsck.ext4", "mount"] {
        need(t);
    }
    let d = tmpdir("fuse");
    let (f, m) = (d.join("f"), d.join("m"));
    std::fs::create_dir_all(&f).unwrap();
    std::fs::create_dir_all(&m).unwrap();
    let img = create(&d, "192M");
    let srv = Server::start(&img, &d.join("s.sock"));
    let mut undo = Undo(Vec::new());
    let mut fuse = Command::new("nbdfuse").arg(f.join("nbd")).arg("--unix").arg(&srv.sock).spawn().unwrap();
    undo.0.push(("kill".into(), vec![fuse.id().to_string()]));
    undo.0.push(("umount".into(), vec![f.display().to_string()]));
    let start = Instant::now();
    while !f.join("nbd").exists() {
        assert!(start.elapsed() < Duration::from_secs(30), "nbdfuse did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let dev = run(Command::new("losetup").args(["-f", "--show"]).arg(f.join("nbd"))).trim().to_string();
    undo.0.push(("losetup".into(), vec!["-d".into(), dev.clone()]));
    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&dev));
    run(Command::new("mount").arg(&dev).arg(&m));
    undo.0.push(("umount".into(), vec![m.display().to_string()]));
    run(Command::new("cp").args(["-r", "/usr/share/zoneinfo"]).arg(m.join("zoneinfo")));
    run(Command::new("cp").args(["-r", "/usr/share/perl5"]).arg(m.join("perl5")));
    run(&mut Command::new("sync"));
    let want = run(Command::new("sh")
        .arg("-c")
        .arg(format!("cd {} && find . -type f -print0 | sort -z | xargs -0 md5sum", m.display())));
    run(Command::new("umount").arg(&m));
    let out = run(Command::new("fsck.ext4").args(["-fn"]).arg(&dev));
    assert!(out.contains("files"), "{out}");
    run(Command::new("losetup").args(["-d", &dev]));
    drop(undo); // unmounts the FUSE folder and ends nbdfuse (by PID)
    let _ = fuse.wait();
    srv.stop();
    check_clean(&img);
    // The files read back through a fresh server, with qemu-img as the client.
    let srv = Server::start(&img, &d.join("s.sock"));
    let raw = d.join("raw.img");
    run(Command::new("qemu-img").args(["convert", "-f", "raw", "-O", "raw"]).arg(srv.uri()).arg(&raw));
    srv.stop();
    let mut undo = Undo(Vec::new());
    run(Command::new("mount").args(["-o", "loop,ro"]).arg(&raw).arg(&m));
    undo.0.push(("umount".into(), vec![m.display().to_string()]));
    let got = run(Command::new("sh")
        .arg("-c")
        .arg(format!("cd {} && find . -type f -print0 | sort -z | xargs -0 md5sum", m.display())));
    assert_eq!(got, want, "files differ after a restart");
    drop(undo);
    std::fs::remove_dir_all(&d).unwrap();
}
