//! What the CLI tests share: the binary, temporary directories, native
//! runs, the C programs in `run_progs/`, and for the NBD tests [`nbd`].
//! Each test binary uses part of it.
#![allow(dead_code)]

pub mod nbd;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `ztier` binary under test.
pub fn ztier() -> &'static str {
    env!("CARGO_BIN_EXE_ztier")
}

/// Fails the test, naming the package list, unless `tool` is on `PATH`.
pub fn require(tool: &str) {
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "{tool} is needed by this test (scripts/deb-packages/*.txt; `make deps` as root installs it)"
    );
}

/// Fails the test, saying `why` it needs root, unless it runs as root
/// (`make test` does).
pub fn require_root(why: &str) {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "this test {why}: run it as root (make test does)");
}

/// Prefix of the directories [`tmp`] makes, followed by the test
/// process's PID and the test's name.
const TMP_PREFIX: &str = "ztier-run-test-";

/// A fresh, empty directory for one test. A test's directory stays after
/// it (its programs and outputs, for a look at a failure), until a later
/// test process finds its maker gone: the first call in each test process
/// removes the directories of processes that no longer run. (Kept for
/// ever, they had grown to 8,662 directories and 22 GB.)
pub fn tmp(name: &str) -> PathBuf {
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(|| remove_dirs_of_gone_processes(&std::env::temp_dir()));
    let d = std::env::temp_dir().join(format!("{TMP_PREFIX}{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Removes the [`tmp`] directories in `dir` whose test process no longer
/// runs (no `/proc/PID`).
pub fn remove_dirs_of_gone_processes(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(TMP_PREFIX)) else { continue };
        let Some(Ok(pid)) = rest.split('-').next().map(str::parse::<u32>) else { continue };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Runs `cmd` in `dir` without ztier.
pub fn native(cmd: &[&str], dir: &Path) -> Output {
    Command::new(cmd[0]).args(&cmd[1..]).current_dir(dir).output().unwrap()
}

/// Pages compressed, from merged stats.
pub fn compressed(s: &serde_json::Value) -> u64 {
    s["pages_compressed"].as_u64().unwrap()
}

/// The fault-service histogram of stats (`latency_ns`): each bucket's upper
/// bound in ns and its count of faults.
pub fn latency_histogram(s: &serde_json::Value) -> Vec<(u64, u64)> {
    s["latency_ns"]
        .as_array()
        .unwrap_or_else(|| panic!("no latency histogram: {s}"))
        .iter()
        .map(|p| (p[0].as_u64().unwrap(), p[1].as_u64().unwrap()))
        .collect()
}

/// `n` lines of text for `sort`, line `i` made by `line` from the `i`th
/// number of a xorshift sequence started at `seed`.
pub fn lines(seed: u64, n: u64, line: impl Fn(u64, u64) -> String) -> String {
    let mut x = seed;
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            line(x, i)
        })
        .collect()
}

/// Compiles `run_progs/NAME.c` into `d`; the binary's path.
pub fn compile(d: &Path, name: &str) -> String {
    compile_in(d, name, &[&format!("{name}.c")], &[])
}

/// Compiles the `run_progs` files `sources` into `d/out` (`-O2 -pthread`,
/// then `args`: `-shared -fPIC` for a library, `-L. -lNAME` for one built
/// in `d` before), run in `d`; the output's path.
pub fn compile_in(d: &Path, out: &str, sources: &[&str], args: &[&str]) -> String {
    require("cc");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/run_progs");
    let o = Command::new("cc")
        .args(["-O2", "-pthread", "-o", out])
        .args(sources.iter().map(|s| dir.join(s)))
        .args(args)
        .current_dir(d)
        .output()
        .unwrap();
    assert!(o.status.success(), "compiling {sources:?} into {out}: {}", String::from_utf8_lossy(&o.stderr));
    d.join(out).to_string_lossy().into_owned()
}

/// Builds the `run_progs` library `lib{lib}.so` from `lib_sources` in
/// `d`, then the program `exe` from `sources` linked against it (kept
/// even if unused, found beside the program at run time); the program's
/// path. The library's constructor then runs before `main`, as a real
/// library's does.
pub fn compile_with_library(
    d: &Path,
    lib: &str,
    lib_sources: &[&str],
    exe: &str,
    sources: &[&str],
) -> String {
    compile_in(d, &format!("lib{lib}.so"), lib_sources, &["-shared", "-fPIC"]);
    let link = format!("-l{lib}");
    compile_in(d, exe, sources, &["-Wl,--no-as-needed", "-L.", &link, "-Wl,-rpath,$ORIGIN"])
}

/// The notices of ztier's in merged stats (`notices`: what it said about
/// the run, kept out of the program's stderr), a line each.
pub fn notices(s: &serde_json::Value) -> String {
    s["notices"]
        .as_array()
        .unwrap_or_else(|| panic!("no notices in the statistics: {s}"))
        .iter()
        .map(|n| format!("{}\n", n.as_str().unwrap()))
        .collect()
}
