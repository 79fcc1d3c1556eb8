//! Somebody else's test suite as the judge of `ztier run`: modules of
//! CPython 3.11's own regression suite (Debian's `libpython3.11-testsuite`,
//! run by `/usr/bin/python3 -m test`), each run natively and under `ztier
//! run` at a budget well under what the module's process held at its
//! peak natively (a third of it: [`budget_for`]), and the results compared
//! module by module: the verdict regrtest gives,
//! the tests it ran, skipped, and the names of those that failed or
//! erred (from its `--junit-xml` report). Every managed run must have
//! compressed pages. A module whose results differ is run again, natively
//! and managed, one at a time (a test that fails under the machine's load
//! in one run only is told apart from one that fails under `ztier run`
//! every time); if they differ again the test fails, naming the module and
//! its first test that failed in one run and not in the other.
//!
//! Four modules at a time, each run natively then managed (so about two
//! of each kind at once, what `-j2` each gives), the slowest first; each
//! run has regrtest's `--timeout` and a limit of its own. The table of
//! results is printed (`--nocapture`) and kept as `conformance.txt` in
//! the test's folder. To run it alone:
//! `cargo test --release -p ztier --test cpython_conformance -- --nocapture`
//! (`make conformance`).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::*;

/// Debian's interpreter, whose test package `libpython3.11-testsuite`
/// holds the suite (the `python3` first on `PATH` may be another build,
/// without it).
const PYTHON: &str = "/usr/bin/python3";
/// Where that package puts the suite's runner.
const REGRTEST: &str = "/usr/lib/python3.11/test/libregrtest";
/// The budget of a module's managed run: a third of the peak RSS of its
/// native run (rounded down to MiB, at least 4 MiB). Its process holds
/// 16–200 MB at its peak natively, some 12 MB of that the interpreter's
/// code and libraries (not managed): so every managed run compresses. A
/// budget for all (16M) left 13 modules under it, nothing compressed.
fn budget_for(native_peak: u64) -> u64 {
    ((native_peak / 3) >> 20).max(4) << 20
}
/// regrtest's `--timeout` (per test file; it dumps the tracebacks and
/// ends the run) and the limit of a whole run, after which its process
/// group is killed.
const TEST_TIMEOUT: Duration = Duration::from_secs(200);
const RUN_LIMIT: Duration = Duration::from_secs(240);
/// Modules at once (each run natively, then managed).
const AT_ONCE: usize = 4;

/// The modules: the 38 of issue 68 (`test_sqlite3` among them, which
/// Debian's package does not ship: both runs say so alike), then more
/// that fork, start threads, wait for children and use memory in bulk.
/// The slowest (natively, here) come first.
const MODULES: &[&str] = &[
    "test_signal",
    "test_subprocess",
    "test_io",
    "test_threading",
    "test_faulthandler",
    "test_os",
    "test_pickle",
    "test_decimal",
    "test_statistics",
    "test_fork1",
    "test_unicode",
    "test_sys",
    "test_queue",
    "test_shutil",
    "test_tempfile",
    "test_hashlib",
    "test_zlib",
    "test_random",
    "test_re",
    "test_bytes",
    "test_collections",
    "test_itertools",
    "test_set",
    "test_json",
    "test_weakref",
    "test_gc",
    "test_functools",
    "test_array",
    "test_mmap",
    "test_select",
    "test_selectors",
    "test_thread",
    "test_threadsignals",
    "test_posix",
    "test_wait4",
    "test_math",
    "test_long",
    "test_memoryview",
    "test_dataclasses",
    "test_enum",
    "test_deque",
    "test_bisect",
    "test_dict",
    "test_list",
    "test_struct",
    "test_heapq",
    "test_sort",
    "test_string",
    "test_csv",
    "test_sqlite3",
];

/// What one run of one module gave.
#[derive(Clone, Debug, Default)]
struct Outcome {
    /// regrtest's verdict (`SUCCESS`, `FAILURE`, `ENV CHANGED`, ...), or
    /// how the run ended without one.
    verdict: String,
    /// Tests run, as the JUnit report counts them, and of them skipped.
    tests: usize,
    skipped: usize,
    /// The tests that failed or erred (`name: first line of the message`).
    failed: Vec<String>,
    wall_s: f64,
    /// Peak RSS of its largest process, bytes.
    peak_rss: u64,
    /// Managed runs: the budget, and pages compressed, from `--stats`.
    budget: u64,
    compressed: Option<u64>,
    /// Its output (stdout and stderr), kept in the test's folder.
    output: PathBuf,
}

impl Outcome {
    /// The names of the tests that failed or erred.
    fn failed_names(&self) -> BTreeSet<&str> {
        self.failed.iter().map(|f| f.split(": ").next().unwrap_or(f)).collect()
    }

    /// Do two runs of a module give the same results?
    fn same_as(&self, o: &Outcome) -> bool {
        self.verdict == o.verdict
            && self.tests == o.tests
            && self.skipped == o.skipped
            && self.failed_names() == o.failed_names()
    }

    fn cell(&self) -> String {
        format!(
            "{} {}/{}/{} {:.0}s {}MB",
            self.verdict,
            self.tests,
            self.failed.len(),
            self.skipped,
            self.wall_s,
            self.peak_rss >> 20
        )
    }
}

/// Runs `module` in `dir`, natively (`budget` 0) or under `ztier run
/// --budget budget`.
fn run_module(dir: &Path, module: &str, budget: u64) -> Outcome {
    let managed = budget > 0;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let junit = dir.join("junit.xml");
    let stats = dir.join("stats.json");
    let output = dir.join("output.txt");
    let mut cmd = if managed {
        let mut c = Command::new(ztier());
        c.args(["run", "--budget", &budget.to_string(), "--stats"]).arg(&stats).arg("--").arg(PYTHON);
        c
    } else {
        Command::new(PYTHON)
    };
    let out = std::fs::File::create(&output).unwrap();
    cmd.args(["-m", "test", "--timeout", &TEST_TIMEOUT.as_secs().to_string(), "--junit-xml"])
        .arg(&junit)
        .arg(module)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .process_group(0);
    let t = Instant::now();
    // Reaped by `wait4` below, which gives its resource usage too.
    #[allow(clippy::zombie_processes)]
    let child = cmd.spawn().unwrap();
    let pid = child.id() as libc::pid_t;
    // Waited for here (with its resource usage), not through `child`.
    let mut status = 0;
    // SAFETY: a zeroed rusage for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let mut timed_out = false;
    loop {
        // SAFETY: waiting for our own child, with live out-parameters.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if r == pid {
            break;
        }
        assert_eq!(r, 0, "wait4: {}", std::io::Error::last_os_error());
        if t.elapsed() > RUN_LIMIT && !timed_out {
            timed_out = true;
            // SAFETY: the process group made for this run.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // What is left of the group (a test's child that outlived it).
    // SAFETY: as above.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    let wall_s = t.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&std::fs::read(&output).unwrap()).into_owned();
    let verdict = if timed_out {
        format!("KILLED after {} s", RUN_LIMIT.as_secs())
    } else if let Some(v) = text.lines().rev().find_map(|l| l.strip_prefix("Tests result: ")) {
        v.trim().to_owned()
    } else if libc::WIFSIGNALED(status) {
        format!("DIED by signal {}", libc::WTERMSIG(status))
    } else {
        format!("NO RESULT, exit {}", libc::WEXITSTATUS(status))
    };
    let mut o = Outcome { verdict, wall_s, budget, output, ..Outcome::default() };
    if let Ok(xml) = std::fs::read_to_string(&junit) {
        read_junit(&xml, &mut o);
    }
    if managed {
        match std::fs::read_to_string(&stats)
            .ok()
            .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
        {
            Some(s) => {
                o.compressed = s["pages_compressed"].as_u64();
                o.peak_rss = s["peak_rss_bytes"].as_u64().unwrap_or(0);
            }
            None => o.verdict.push_str(" (no statistics)"),
        }
    } else {
        o.peak_rss = usage.ru_maxrss as u64 * 1024;
    }
    o
}

/// The value of attribute `name` in the tag text `tag`.
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    tag[at..].split('"').next()
}

/// Counts and failures from regrtest's JUnit report: each `<testcase>`
/// is a test run, with a `<skipped>`, `<failure>` or `<error>` child
/// when it was not a success.
fn read_junit(xml: &str, o: &mut Outcome) {
    for case in xml.split("<testcase ").skip(1) {
        let body = case.split("<testcase ").next().unwrap_or(case);
        o.tests += 1;
        if body.contains("<skipped") {
            o.skipped += 1;
        }
        for kind in ["<failure", "<error"] {
            if let Some(at) = body.find(kind) {
                let name = attr(body, "name").unwrap_or("?");
                let message = attr(&body[at..], "message").unwrap_or("");
                let first = message.lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
                o.failed.push(format!("{name}: {}", unescape(first)));
            }
        }
    }
}

fn unescape(s: &str) -> String {
    s.replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// The first test of `a` whose outcome `b` does not share (failed in one
/// and not in the other), with its message, or the run's verdicts and
/// counts where no test tells them apart.
fn first_difference(native: &Outcome, managed: &Outcome) -> String {
    let (n, m) = (native.failed_names(), managed.failed_names());
    if let Some(f) = managed.failed.iter().find(|f| !n.contains(f.split(": ").next().unwrap_or(f))) {
        return format!("fails under ztier run only: {f}");
    }
    if let Some(f) = native.failed.iter().find(|f| !m.contains(f.split(": ").next().unwrap_or(f))) {
        return format!("fails natively only: {f}");
    }
    let tail: Vec<String> = std::fs::read_to_string(&managed.output)
        .unwrap_or_default()
        .lines()
        .rev()
        .take(12)
        .map(str::to_owned)
        .collect();
    format!(
        "native {}, ztier run {}; the managed run's output ends:\n{}",
        native.cell(),
        managed.cell(),
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    )
}

/// Runs `module` natively, then managed at [`budget_for`] its native
/// peak, in folders of `d` named with `tag`.
fn run_pair(d: &Path, module: &str, tag: &str) -> (Outcome, Outcome) {
    let n = run_module(&d.join(format!("{module}-native{tag}")), module, 0);
    let m = run_module(&d.join(format!("{module}-ztier{tag}")), module, budget_for(n.peak_rss));
    (n, m)
}

#[test]
fn cpython_regression_modules_give_native_results_under_a_budget() {
    assert!(
        Path::new(PYTHON).exists() && Path::new(REGRTEST).is_dir(),
        "CPython's regression suite is needed: {PYTHON} with libpython3.11-testsuite \
         (scripts/deb-packages/run.txt; `make deps` as root installs it)"
    );
    let d = tmp("cpython");
    let t0 = Instant::now();
    let next = Arc::new(Mutex::new(0usize));
    type Pair = Option<(Outcome, Outcome)>;
    let results: Arc<Mutex<Vec<Pair>>> = Arc::new(Mutex::new(vec![None; MODULES.len()]));
    let workers: Vec<_> = (0..AT_ONCE)
        .map(|_| {
            let (next, results, d) = (next.clone(), results.clone(), d.clone());
            std::thread::spawn(move || loop {
                let i = {
                    let mut n = next.lock().unwrap();
                    *n += 1;
                    *n - 1
                };
                let Some(module) = MODULES.get(i) else { break };
                let pair = run_pair(&d, module, "");
                results.lock().unwrap()[i] = Some(pair);
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let results = std::mem::take(&mut *results.lock().unwrap());
    let mut table = format!(
        "CPython {} regression modules, natively and under `ztier run` at a third of the native peak RSS \
         ({AT_ONCE} modules at a time)\n\
         columns: verdict tests/failed/skipped wall peak-RSS; budget, pages compressed\n",
        MODULES.len()
    );
    let mut differ = Vec::new();
    let mut uncompressed = Vec::new();
    for (i, module) in MODULES.iter().enumerate() {
        let (mut n, mut m) = results[i].clone().unwrap();
        let mut again = String::new();
        if !n.same_as(&m) {
            // Once more, one run at a time: load, or ztier run?
            (n, m) = run_pair(&d, module, "-again");
            again = if n.same_as(&m) { " (differed at first; alike run alone)" } else { " (differed twice)" }
                .to_string();
            if !n.same_as(&m) {
                differ.push(format!("{module}: {}", first_difference(&n, &m)));
            }
        }
        if m.compressed.unwrap_or(0) == 0 {
            // A native peak far above the usual one (test_decimal: 26 MB
            // most runs, once 125 MB) gives a budget the managed run never
            // reaches. Once more: a second such peak fails.
            let (n2, m2) = run_pair(&d, module, "-budget-again");
            if m2.compressed.unwrap_or(0) == 0 || !n2.same_as(&m2) {
                uncompressed.push(*module);
            } else {
                again =
                    format!(" (nothing compressed at first, native peak {} MB; run again)", n.peak_rss >> 20);
                (n, m) = (n2, m2);
            }
        }
        let _ = writeln!(
            table,
            "{module:<24} native {:<40} ztier {:<40} {:>3}M {:>8} pages{again}",
            n.cell(),
            m.cell(),
            m.budget >> 20,
            m.compressed.map_or("?".into(), |c| c.to_string())
        );
    }
    let _ = writeln!(table, "{} s in all", t0.elapsed().as_secs());
    std::fs::write(d.join("conformance.txt"), &table).unwrap();
    println!("{table}(kept in {})", d.join("conformance.txt").display());
    assert!(differ.is_empty(), "results differ from native ones:\n{}", differ.join("\n"));
    assert!(uncompressed.is_empty(), "nothing compressed: {uncompressed:?}");
}
