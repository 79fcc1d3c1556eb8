//! What the NBD tests of `ztier blk` and `ztier cache` share: running
//! tools, text data, undoing system changes, and a served export mounted
//! as a file system (nbdfuse + a loop device + ext4).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `cmd`, fails the test unless it succeeds; its stdout.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// `len` bytes of text lines (compressible, not same-filled).
pub fn text(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(len + 64);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(format!("line {} of the ztier NBD test, value {}\n", x % 977, x % 31).as_bytes());
    }
    v.truncate(len);
    v
}

/// Undoes a system change when dropped (also when the test fails): the
/// commands, last first.
pub struct Undo(pub Vec<(String, Vec<String>)>);
impl Drop for Undo {
    fn drop(&mut self) {
        for (cmd, args) in self.0.iter().rev() {
            let _ = Command::new(cmd).args(args).stdout(Stdio::null()).stderr(Stdio::null()).status();
        }
    }
}

/// The md5 sums of every file below `dir`, sorted by name.
pub fn sums(dir: &Path) -> String {
    run(Command::new("sh")
        .arg("-c")
        .arg(format!("cd {} && find . -type f -print0 | sort -z | xargs -0 md5sum", dir.display())))
}

/// As root: the export at the Unix socket `sock` as a block device
/// (nbdfuse, a loop device), with a fresh ext4 mounted at `DIR/m`.
pub struct Mounted {
    pub dev: String,
    pub mnt: PathBuf,
    fuse: Child,
    undo: Undo,
}

impl Mounted {
    pub fn mkfs(dir: &Path, sock: &Path) -> Mounted {
        super::require_root("needs loop devices and mount");
        for t in ["nbdfuse", "losetup", "mkfs.ext4", "fsck.ext4", "mount"] {
            super::require(t);
        }
        let (f, mnt) = (dir.join("f"), dir.join("m"));
        std::fs::create_dir_all(&f).unwrap();
        std::fs::create_dir_all(&mnt).unwrap();
        let mut undo = Undo(Vec::new());
        let fuse = Command::new("nbdfuse").arg(f.join("nbd")).arg("--unix").arg(sock).spawn().unwrap();
        undo.0.push(("kill".into(), vec![fuse.id().to_string()]));
        undo.0.push(("umount".into(), vec![f.display().to_string()]));
        let t = Instant::now();
        while !f.join("nbd").exists() {
            assert!(t.elapsed() < Duration::from_secs(30), "nbdfuse did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        let dev = run(Command::new("losetup").args(["-f", "--show"]).arg(f.join("nbd"))).trim().to_string();
        undo.0.push(("losetup".into(), vec!["-d".into(), dev.clone()]));
        run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&dev));
        run(Command::new("mount").arg(&dev).arg(&mnt));
        undo.0.push(("umount".into(), vec![mnt.display().to_string()]));
        Mounted { dev, mnt, fuse, undo }
    }

    /// Copies two trees of system files in and syncs; their sums.
    pub fn copy_files(&self) -> String {
        run(Command::new("cp").args(["-r", "/usr/share/zoneinfo"]).arg(self.mnt.join("zoneinfo")));
        run(Command::new("cp").args(["-r", "/usr/share/perl5"]).arg(self.mnt.join("perl5")));
        run(&mut Command::new("sync"));
        sums(&self.mnt)
    }

    /// Unmounts and mounts again (the page cache's copy dropped).
    pub fn remount(&self) {
        run(Command::new("umount").arg(&self.mnt));
        run(Command::new("mount").arg(&self.dev).arg(&self.mnt));
    }

    /// Unmounts, checks the file system (`fsck -fn` clean), detaches the
    /// loop device and ends nbdfuse.
    pub fn finish(mut self) {
        run(Command::new("umount").arg(&self.mnt));
        let out = run(Command::new("fsck.ext4").args(["-fn"]).arg(&self.dev));
        assert!(out.contains("files"), "{out}");
        run(Command::new("losetup").args(["-d", &self.dev]));
        // Unmounts the FUSE folder and ends nbdfuse (by PID).
        drop(std::mem::replace(&mut self.undo, Undo(Vec::new())));
        let _ = self.fuse.wait();
    }
}

/// Mounts the ext4 image `img` read-only at `mnt` while the result lives.
pub fn mount_image_ro(img: &Path, mnt: &Path) -> Undo {
    let mut undo = Undo(Vec::new());
    run(Command::new("mount").args(["-o", "loop,ro"]).arg(img).arg(mnt));
    undo.0.push(("umount".into(), vec![mnt.display().to_string()]));
    undo
}

/// A raw NBD connection to the unix socket `sock`, past the server's
/// greeting, with fixed newstyle asked for (no options sent yet).
pub fn handshake(sock: &Path) -> UnixStream {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    assert_eq!(&hello[..8], b"NBDMAGIC");
    s.write_all(&3u32.to_be_bytes()).unwrap();
    s
}

/// Sends option `opt` with `data`; the first reply's type and body.
pub fn option(s: &mut UnixStream, opt: u32, data: &[u8]) -> (u32, Vec<u8>) {
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

/// A connection in transmission on the default export (simple replies:
/// no structured replies asked for).
pub fn go(sock: &Path) -> UnixStream {
    let mut s = handshake(sock);
    go_on(&mut s);
    s
}

/// GO on the default export: INFO replies, then ACK.
pub fn go_on(s: &mut UnixStream) {
    let mut go = 0u32.to_be_bytes().to_vec();
    go.extend_from_slice(&0u16.to_be_bytes());
    let (mut k, _) = option(s, 7, &go);
    while k != 1 {
        assert_eq!(k, 3, "INFO expected");
        let mut h = [0u8; 20];
        s.read_exact(&mut h).unwrap();
        k = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let mut body = vec![0u8; u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize];
        s.read_exact(&mut body).unwrap();
    }
}

/// Sends a READ of `len` bytes at `off` with `cookie` and reads its
/// simple reply: the error (0 for success) and the data.
pub fn simple_read(s: &mut UnixStream, cookie: u64, off: u64, len: u32) -> (u32, Vec<u8>) {
    let mut r = 0x2560_9513u32.to_be_bytes().to_vec();
    r.extend_from_slice(&0u16.to_be_bytes()); // flags
    r.extend_from_slice(&0u16.to_be_bytes()); // READ
    r.extend_from_slice(&cookie.to_be_bytes());
    r.extend_from_slice(&off.to_be_bytes());
    r.extend_from_slice(&len.to_be_bytes());
    s.write_all(&r).unwrap();
    let mut h = [0u8; 16];
    s.read_exact(&mut h).unwrap();
    assert_eq!(u32::from_be_bytes(h[..4].try_into().unwrap()), 0x6744_6698, "simple reply magic");
    assert_eq!(u64::from_be_bytes(h[8..16].try_into().unwrap()), cookie, "the request's cookie");
    let err = u32::from_be_bytes(h[4..8].try_into().unwrap());
    let mut data = vec![0u8; if err == 0 { len as usize } else { 0 }];
    s.read_exact(&mut data).unwrap();
    (err, data)
}
