//! `docs/json.md` against what the commands print: each of its JSON
//! examples names every key of its command's output, no more, nested
//! objects and arrays of objects included (a key is its path: `a.b`,
//! `rows[].ztier.ratio`; an array's elements are taken together). The
//! commands run for real, small (a python program of 32 MB at an 8 MiB
//! budget with a local redis-server as its remote tier, a one-second
//! `bench cache` cell, 200 pages of `bench remote`, one pair of `bench
//! pressure` at one budget, ...: about 10 s in all), so a key added
//! to, renamed in or dropped from an output fails here until the docs
//! say it. Every JSON example of the page is checked by one test here
//! ([`every_example_is_checked`]); `ztier blk stats`'s is an excerpt, so
//! only its keys are checked to be printed.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{require, tmp, ztier};
use serde_json::Value;
use ztier_remote::testbed::{Options, Testbed};

/// The page, read where the tests run (the package's folder).
fn page() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/json.md");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every ```json example of the page with the `## ` heading it is under.
fn examples() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let (mut heading, mut block) = (String::new(), None::<String>);
    for line in page().lines() {
        match &mut block {
            Some(b) if line.starts_with("```") => {
                let v = serde_json::from_str(b)
                    .unwrap_or_else(|e| panic!("docs/json.md, the example under {heading:?}: {e}\n{b}"));
                out.push((heading.clone(), v));
                block = None;
            }
            Some(b) => {
                b.push_str(line);
                b.push('\n');
            }
            None if line.starts_with("```json") => block = Some(String::new()),
            None if line.starts_with("## ") => heading = line[3..].to_string(),
            None => {}
        }
    }
    out
}

/// The one example under the `## ` heading `heading`.
fn example(heading: &str) -> Value {
    let mut found: Vec<Value> =
        examples().into_iter().filter(|(h, _)| h == heading).map(|(_, v)| v).collect();
    assert_eq!(found.len(), 1, "docs/json.md: one JSON example under `## {heading}`");
    found.pop().unwrap()
}

/// Every key of `v` as a path (see the module docs), under `at`.
fn paths_into(v: &Value, at: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let p = if at.is_empty() { k.clone() } else { format!("{at}.{k}") };
                out.insert(p.clone());
                paths_into(x, &p, out);
            }
        }
        Value::Array(a) => {
            for x in a {
                paths_into(x, &format!("{at}[]"), out);
            }
        }
        _ => {}
    }
}

fn paths(v: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    paths_into(v, "", &mut out);
    out
}

/// The paths of `all` under `prefix` (`per_process[]`), without it.
fn under(all: &BTreeSet<String>, prefix: &str) -> BTreeSet<String> {
    all.iter().filter_map(|p| p.strip_prefix(prefix)?.strip_prefix('.').map(str::to_string)).collect()
}

/// Fails unless the printed keys are the documented ones, saying which
/// differ.
fn same_keys(what: &str, documented: &BTreeSet<String>, printed: &BTreeSet<String>) {
    let undocumented: Vec<_> = printed.difference(documented).collect();
    let unprinted: Vec<_> = documented.difference(printed).collect();
    assert!(
        undocumented.is_empty() && unprinted.is_empty(),
        "docs/json.md, {what}:\n  printed, not in its example: {undocumented:?}\n  \
         in its example, not printed: {unprinted:?}"
    );
}

fn ok(o: Output, what: &str) -> Output {
    assert!(
        o.status.success(),
        "{what}: {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Runs `ztier ARGS` in `d`; its stdout as one JSON value.
fn json_of(d: &Path, args: &[&str]) -> Value {
    let o = ok(Command::new(ztier()).args(args).current_dir(d).output().unwrap(), &args.join(" "));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("ztier {}: {e}", args.join(" ")))
}

fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Waits for `p` to exist, while `child` runs.
fn wait_for(p: &Path, child: &mut std::process::Child) {
    let t = Instant::now();
    while !p.exists() {
        assert!(child.try_wait().unwrap().is_none(), "the program ended before {}", p.display());
        assert!(t.elapsed() < Duration::from_secs(120), "no {} after 120 s", p.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A python program that touches 32 MB, writes its PID to argv[1] and
/// waits for the file argv[2] before it ends.
const WAITER: &str = "import os, sys, time\n\
x = bytearray(32 << 20)\n\
for i in range(0, len(x), 4096): x[i] = 1\n\
open(sys.argv[1] + '.new', 'w').write(str(os.getpid()))\n\
os.rename(sys.argv[1] + '.new', sys.argv[1])\n\
while not os.path.exists(sys.argv[2]): time.sleep(0.02)\n\
print(sum(x))\n";

/// `ztier run --stats` (merged, `per_process[]` and both `remote`
/// objects: the run has a remote tier), `ztier stats PID` of the same
/// program while it runs (a `per_process` entry's keys), and from its
/// `--fault-log`: `ztier trace info --json` of the trace imported from
/// it and `ztier sim --fault-log --json` over it.
#[test]
fn run_stats_live_stats_trace_info_and_sim_have_the_documented_keys() {
    require("python3");
    let d = tmp("json-docs-run");
    let bed = Testbed::single(&Options::default()).unwrap();
    std::fs::write(d.join("waiter.py"), WAITER).unwrap();
    std::fs::create_dir_all(d.join("log")).unwrap();
    let mut run = Command::new(ztier())
        .args(["run", "--budget", "8M", "--store", "2M", "--remote", &bed.url()])
        .args(["--stats", "s.json", "--fault-log", "log", "--", "python3", "waiter.py", "pid", "go"])
        .current_dir(&d)
        .env_remove("ZTIER_REMOTE_PASSWORD")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(&d.join("pid"), &mut run);
    let pid = std::fs::read_to_string(d.join("pid")).unwrap();
    let live = json_of(&d, &["stats", pid.trim()]);
    std::fs::write(d.join("go"), "").unwrap();
    ok(run.wait_with_output().unwrap(), "ztier run");

    let doc = paths(&example("`ztier run --stats` and `ztier stats PID`"));
    let stats = read_json(&d.join("s.json"));
    assert!(!stats["per_process"].as_array().unwrap().is_empty(), "{stats}");
    same_keys("`ztier run --stats`", &doc, &paths(&stats));
    same_keys(
        "`ztier stats PID` (a `per_process` entry's keys)",
        &under(&doc, "per_process[]"),
        &paths(&live),
    );

    // The fault log: the program's own (the only process).
    let log = std::fs::read_dir(d.join("log")).unwrap().next().unwrap().unwrap().path();
    let log = log.to_str().unwrap();
    ok(
        Command::new(ztier())
            .args(["trace", "import-faults", "-o", "t.trace", log])
            .current_dir(&d)
            .output()
            .unwrap(),
        "ztier trace import-faults",
    );
    let info = json_of(&d, &["trace", "info", "t.trace", "--json"]);
    same_keys("`ztier trace info --json`", &paths(&example("`ztier trace info --json`")), &paths(&info));
    let sim = json_of(
        &d,
        &["sim", "--fault-log", log, "--memory", "1M,4M", "--policy", "none,kaplan,shipped"]
            .into_iter()
            .chain(["--codec", "lz4", "--disk-ms", "5", "--json"])
            .collect::<Vec<_>>(),
    );
    same_keys("`ztier sim --json`", &paths(&example("`ztier sim --json`")), &paths(&sim));
}

/// `ztier remote gc --json` over a server that holds a run that ended
/// without its cleanup (recorded in `zt:runs`, not alive).
#[test]
fn remote_gc_has_the_documented_keys() {
    let d = tmp("json-docs-gc");
    let bed = Testbed::single(&Options::default()).unwrap();
    bed.cli(bed.servers[0].port, &["SADD", "zt:runs", "0123456789ab"]).unwrap();
    let gc = json_of(&d, &["remote", "gc", "--remote", &bed.url(), "--json"]);
    assert_eq!(gc["runs"][0]["run"], "0123456789ab", "{gc}");
    same_keys("`ztier remote gc --json`", &paths(&example("`ztier remote gc --json`")), &paths(&gc));
}

/// `ztier bench remote --json` at one depth, 200 pages, one round
/// (against a redis-server it starts).
#[test]
fn bench_remote_has_the_documented_keys() {
    require("redis-benchmark");
    let d = tmp("json-docs-bench-remote");
    let v =
        json_of(&d, &["bench", "remote", "--pipelines", "1", "--requests", "200", "--rounds", "1", "--json"]);
    same_keys("`ztier bench remote --json`", &paths(&example("`ztier bench remote --json`")), &paths(&v));
}

/// `ztier bench cache --json`: one cell (compressible data, randread, a
/// working set of the cache's size), rows `raw` and `lz4` (so a ratio of
/// one to the other), one second, no ramp.
#[test]
fn bench_cache_has_the_documented_keys() {
    common::require_root("serves caches over NBD with nbdkit and fio");
    for tool in ["fio", "nbdkit"] {
        require(tool);
    }
    let d = tmp("json-docs-bench-cache");
    let dir = d.join("work");
    let v = json_of(
        &d,
        &[
            "bench",
            "cache",
            "--cache-size",
            "8M",
            "--ws",
            "1",
            "--data",
            "compressible",
            "--workloads",
            "randread",
            "--rows",
            "raw,lz4",
            "--warmup",
            "0",
            "--runtime",
            "1",
            "--dir",
            dir.to_str().unwrap(),
            "--json",
        ],
    );
    assert!(!v["ratios"].as_array().unwrap().is_empty(), "{v}");
    same_keys("`ztier bench cache --json`", &paths(&example("`ztier bench cache --json`")), &paths(&v));
}

/// `ztier bench pressure --json` with no kernel mode, one budget and one
/// pair (native's row and `ztier run`'s, `paired` filled in) of a python
/// program that writes 24 MB.
#[test]
fn bench_pressure_has_the_documented_keys() {
    require("python3");
    let d = tmp("json-docs-bench-pressure");
    let prog = [
        "python3",
        "-c",
        "x = bytearray(24 << 20)\nfor i in range(0, len(x), 4096): x[i] = 1\nprint(sum(x))",
    ];
    let args = [
        "bench",
        "pressure",
        "--kernel",
        "none",
        "--budgets",
        "16M",
        "--pairs",
        "1",
        "--json",
        "p.json",
        "--",
    ];
    let o = Command::new(ztier()).args(args).args(prog).current_dir(&d).output().unwrap();
    ok(o, "ztier bench pressure");
    let v = read_json(&d.join("p.json"));
    assert!(v.as_array().unwrap().iter().any(|r| r["paired"].is_object()), "{v}");
    same_keys("`ztier bench pressure --json`", &paths(&example("`ztier bench pressure --json`")), &paths(&v));
}

/// `ztier bench uffd --json` (256 pages), `ztier bench codecs --json`
/// and `ztier bench store --json` (a 50-page corpus, no timing).
#[test]
fn bench_uffd_codecs_and_store_have_the_documented_keys() {
    let d = tmp("json-docs-bench");
    let v = json_of(&d, &["bench", "uffd", "--pages", "256", "--json"]);
    same_keys("`ztier bench uffd --json`", &paths(&example("`ztier bench uffd --json`")), &paths(&v));
    let c = ztier_codec::corpus::synth::corpus(50, 9);
    std::fs::write(d.join("c.pages"), c.bytes()).unwrap();
    let v = json_of(&d, &["bench", "codecs", "--seconds", "0", "--json", "--corpus", "c.pages"]);
    same_keys("`ztier bench codecs --json`", &paths(&example("`ztier bench codecs --json`")), &paths(&v));
    let v = json_of(&d, &["bench", "store", "--corpus", "c.pages", "--allocator", "classes", "--json"]);
    same_keys("`ztier bench store --json`", &paths(&example("`ztier bench store --json`")), &paths(&v));
}

/// `ztier blk stats --json` of a new image: the example is an excerpt,
/// so each of its keys is printed (not the other way round).
#[test]
fn blk_stats_prints_the_keys_of_its_excerpt() {
    let d = tmp("json-docs-blk");
    ok(
        Command::new(ztier())
            .args(["blk", "create", "i.img", "--size", "64M"])
            .current_dir(&d)
            .output()
            .unwrap(),
        "ztier blk create",
    );
    let v = json_of(&d, &["blk", "stats", "i.img", "--json"]);
    let doc = paths(&example("`ztier blk stats --json`"));
    let printed = paths(&v);
    let unprinted: Vec<_> = doc.difference(&printed).collect();
    assert!(unprinted.is_empty(), "docs/json.md, `ztier blk stats --json`: not printed: {unprinted:?}");
}

/// Each JSON example of the page is one of those checked above: a new
/// one must come with its check.
#[test]
fn every_example_is_checked() {
    let checked: BTreeSet<&str> = [
        "`ztier run --stats` and `ztier stats PID`",
        "`ztier trace info --json`",
        "`ztier sim --json`",
        "`ztier remote gc --json`",
        "`ztier bench remote --json`",
        "`ztier bench cache --json`",
        "`ztier bench pressure --json`",
        "`ztier bench uffd --json`",
        "`ztier bench codecs --json`",
        "`ztier bench store --json`",
        "`ztier blk stats --json`",
    ]
    .into();
    let on_page: BTreeSet<String> = examples().into_iter().map(|(h, _)| h).collect();
    let unchecked: Vec<_> = on_page.iter().filter(|h| !checked.contains(h.as_str())).collect();
    assert!(unchecked.is_empty(), "docs/json.md: JSON examples no test here checks: {unchecked:?}");
    for h in checked {
        example(h);
    }
}
