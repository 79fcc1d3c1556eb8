//! `ztier trace` with real valgrind runs of real programs.

mod common;

use std::process::Command;

fn ztier() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ztier"))
}

fn tmpdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("ztier-cli-trace-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn info(path: &std::path::Path) -> serde_json::Value {
    let out = ztier().args(["trace", "info", "--json"]).arg(path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn record_sort_with_compression_records_from_its_real_pages() {
    let d = tmpdir("record");
    let input = d.join("in.txt");
    let lines: Vec<String> = (0..2000).map(|i| format!("line {:05}", (i * 7919) % 2000)).collect();
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let t = d.join("sort.trace");
    let out = ztier()
        .args(["trace", "record", "--snapshot-every", "50000", "--codecs", "wkdm,lz4", "-o"])
        .arg(&t)
        .args(["--", "sort"])
        .arg(&input)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The program ran for real: its output is sorted.
    let mut want = lines.clone();
    want.sort();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), want.join("\n") + "\n");
    let v = info(&t);
    assert!(v["references"].as_u64().unwrap() > 100_000, "{v}");
    assert!(v["writes"].as_u64().unwrap() > 1000);
    assert!(v["distinct_pages"].as_u64().unwrap() > 30);
    assert!(v["size_records"].as_u64().unwrap() > 10);
    assert_eq!(v["codecs"], serde_json::json!(["wkdm", "lz4"]));
    for k in 0..2 {
        let m = v["mean_sizes"][k].as_f64().unwrap();
        assert!(m > 0.0 && m <= 4096.0, "{v}");
        assert!(v["compress_ns"][k].as_u64().unwrap() > 0, "codec costs measured: {v}");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// `ztier trace record` traces `ztier run`'s heap layout by default (the
/// preload library's allocator, in its allocation-only mode, under
/// lackey), glibc's with `--layout glibc`: 1500 blocks of 4300 bytes lie
/// 5120 bytes apart in the first (its size class), 4304 in the second.
#[test]
fn record_traces_the_heap_layout_of_ztier_run_or_of_glibc() {
    let d = tmpdir("layout");
    let exe = common::compile(&d, "objs");
    let pages = |layout: &str| {
        let t = d.join(format!("{layout}.trace"));
        let out = ztier()
            .env("ZTIER_START_AFTER", "0")
            .args([
                "trace",
                "record",
                "--snapshot-every",
                "100000",
                "--codecs",
                "lz4",
                "--layout",
                layout,
                "-o",
            ])
            .arg(&t)
            .args(["--", &exe, "1500", "2000"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v = info(&t);
        v["distinct_pages"].as_u64().unwrap() - v["unmanaged_pages"].as_u64().unwrap()
    };
    let (run, glibc) = (pages("run"), pages("glibc"));
    // 1500 * 5120 / 4096 = 1875 pages of blocks, against 1576.
    assert!((1875..1875 + 150).contains(&run), "run's layout: {run} managed pages");
    assert!((1576..1576 + 150).contains(&glibc), "glibc's layout: {glibc} managed pages");
    std::fs::remove_dir_all(&d).unwrap();
}

/// A large block the program frees leaves a run's memory and store (the
/// library releases its pages), so its pages get released-page records:
/// `run_progs/freed_block.c` writes the 256 pages of a 1 MiB block, frees
/// it, works elsewhere, and writes a block of that size again (the same
/// pages). Its first pages are released once each, the second block's
/// (never freed) not at all; with glibc's layout nothing is released.
#[test]
fn record_releases_the_pages_of_a_freed_large_block() {
    let d = tmpdir("freed");
    let exe = common::compile(&d, "freed_block");
    let released = |layout: &str| {
        let t = d.join(format!("{layout}.trace"));
        let out = ztier()
            .env("ZTIER_START_AFTER", "0")
            .args(["trace", "record", "--codecs", "lz4", "--layout", layout, "-o"])
            .arg(&t)
            .args(["--", &exe])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        info(&t)["released_pages"].as_u64().unwrap()
    };
    assert_eq!(released("run"), 256);
    assert_eq!(released("glibc"), 0);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn record_passes_on_the_exit_status() {
    let d = tmpdir("status");
    let t = d.join("sh.trace");
    let out =
        ztier().args(["trace", "record", "-o"]).arg(&t).args(["--", "sh", "-c", "exit 3"]).output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    let out = ztier()
        .args(["trace", "record", "-o"])
        .arg(&t)
        .args(["--", "/nonexistent/program"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn import_of_real_lackey_output_counts_every_data_reference() {
    let d = tmpdir("import");
    let log = d.join("lackey.log");
    let st = Command::new("valgrind")
        .args(["--tool=lackey", "--trace-mem=yes"])
        .arg(format!("--log-file={}", log.display()))
        .args(["ls", "/"])
        .output()
        .expect("valgrind is installed by the test command");
    assert!(st.status.success());
    let text = std::fs::read_to_string(&log).unwrap();
    // Count page references independently: data lines, plus one more for
    // each access that straddles a page boundary.
    let mut expected = 0u64;
    for l in text.lines() {
        if l.starts_with(" L ") || l.starts_with(" S ") || l.starts_with(" M ") {
            let (a, n) = l[3..].split_once(',').unwrap();
            let a = u64::from_str_radix(a, 16).unwrap();
            let n: u64 = n.parse().unwrap();
            expected += ((a + n - 1) >> 12) - (a >> 12) + 1;
        }
    }
    assert!(expected > 10_000);
    let t = d.join("ls.trace");
    let out = ztier().args(["trace", "import-lackey"]).arg(&log).arg("-o").arg(&t).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v = info(&t);
    assert_eq!(v["references"].as_u64().unwrap(), expected);
    assert_eq!(v["size_records"], 0);

    // Damaged input gets a clear error naming the line.
    std::fs::write(&log, "==1== hello\n L 1000,8\n L zz,8\n").unwrap();
    let out = ztier().args(["trace", "import-lackey"]).arg(&log).arg("-o").arg(&t).output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("line 3"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // ... and loses nothing: the trace imported before is whole, no part left.
    assert_eq!(info(&t)["references"].as_u64().unwrap(), expected);
    assert!(!d.join("ls.trace.partial").exists());
    let out = ztier().args(["trace", "info"]).arg(&log).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a ztier trace"));

    // A reader that goes away (`ztier trace info T | head -0`): the
    // printer ends as filters do (SIGPIPE, or done first), never a panic.
    let mut child = ztier()
        .args(["trace", "info"])
        .arg(&t)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    use std::os::unix::process::ExitStatusExt;
    assert!(out.status.success() || out.status.signal() == Some(libc::SIGPIPE), "{:?}: {stderr}", out.status);
    std::fs::remove_dir_all(&d).unwrap();
}

/// PIDs of the live children of `pid` (from /proc).
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else { continue };
        // pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let mut f = after.split(' ');
        let state = f.next().unwrap();
        let ppid: u32 = f.next().unwrap().parse().unwrap();
        if ppid == pid && state != "Z" {
            out.push(p);
        }
    }
    out
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !f() {
        assert!(start.elapsed().as_secs() < 60, "timed out waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// SIGTERM to the recorder kills valgrind (by PID), removes the FIFO's
/// temporary folder and the partial trace, and exits 128 + 15; SIGKILL
/// to the recorder still takes valgrind down (parent-death signal).
#[test]
fn an_interrupted_recorder_leaves_nothing_behind() {
    for sig in ["TERM", "KILL"] {
        let d = tmpdir(&format!("signal-{sig}"));
        let tmp = d.join("tmp");
        std::fs::create_dir_all(&tmp).unwrap();
        let t = d.join("sleep.trace");
        let rec = ztier()
            .env("TMPDIR", &tmp)
            .args(["trace", "record", "-o"])
            .arg(&t)
            .args(["--", "sleep", "100"])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = rec.id();
        let mut kids = Vec::new();
        wait_for("valgrind to start", || {
            kids = children_of(pid);
            !kids.is_empty() && t.exists()
        });
        std::thread::sleep(std::time::Duration::from_millis(500));
        let k = Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status().unwrap();
        assert!(k.success());
        let out = rec.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        for &k in &kids {
            wait_for("valgrind to die", || !alive(k));
        }
        if sig == "TERM" {
            assert_eq!(out.status.code(), Some(128 + 15), "{err}");
            assert!(err.contains("interrupted"), "{err}");
            assert!(!t.exists(), "the partial trace must be removed");
            // Only the per-user cache of ztier run's library (kept for
            // the next run or recording, as `ztier run` keeps it) stays.
            // SAFETY: getuid has no preconditions.
            let cache = format!("ztier-{}", unsafe { libc::getuid() });
            let mut left: Vec<_> = std::fs::read_dir(&tmp).unwrap().map(|e| e.unwrap().path()).collect();
            left.retain(|p| {
                p.file_name().unwrap() != cache.as_str()
                    || std::fs::read_dir(p).unwrap().any(|e| {
                        let name = e.unwrap().file_name().into_string().unwrap();
                        !(name.starts_with("libztier_preload-") && name.ends_with(".so"))
                    })
            });
            assert!(left.is_empty(), "temporary files left: {left:?}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}
