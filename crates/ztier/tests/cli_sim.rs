//! `ztier sim` on a trace recorded from a real program.

mod common;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn ztier() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ztier"))
}

/// One recorded trace shared by the tests: `sort` over 3000 lines, in
/// glibc's heap layout (`--layout glibc`): the research checks below
/// (de Castro's findings) were set on it; on the run's layout
/// castro-aggressive at 16 pages costs 1.16x none.
fn sort_trace() -> &'static Path {
    static T: OnceLock<PathBuf> = OnceLock::new();
    T.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("ztier-cli-sim-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let input = d.join("in.txt");
        let lines: Vec<String> = (0..3000).map(|i| format!("{:08} some text", (i * 7919) % 3000)).collect();
        std::fs::write(&input, lines.join("\n")).unwrap();
        let t = d.join("sort.trace");
        let out = ztier()
            .args(["trace", "record", "--layout", "glibc", "--snapshot-every", "20000", "-o"])
            .arg(&t)
            .args(["--", "sort", "-o", "/dev/null"])
            .arg(&input)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        t
    })
}

#[test]
fn json_rows_for_every_memory_policy_and_disk_cost() {
    let t = sort_trace();
    let svg = t.with_extension("svg");
    let out = ztier()
        .args([
            "sim",
            "--json",
            "--memory",
            "64K..256K:64K",
            "--policy",
            "none,static:0.25,kaplan",
            "--disk-ms",
            "5,0.1",
        ])
        .arg("--trace")
        .arg(t)
        .arg("--plot")
        .arg(&svg)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["references"].as_u64().unwrap() > 50_000);
    assert!(v["refs_per_s"].as_f64().unwrap() > 0.0);
    let rows = v["results"].as_array().unwrap();
    assert_eq!(rows.len(), 4 * 3 * 2);
    for r in rows {
        for k in [
            "memory_pages",
            "policy",
            "disk_ms",
            "disk_faults",
            "compressed_hits",
            "paging_time_s",
            "normalized",
            "taken_back",
        ] {
            assert!(!r[k].is_null(), "{k} missing in {r}");
        }
        let m = r["memory_pages"].as_u64().unwrap();
        assert!([16, 32, 48, 64].contains(&m));
        if r["policy"] == "none" {
            assert_eq!(r["normalized"], 1.0);
            assert_eq!(r["compressed_hits"], 0);
        }
        // Paging time is what the counts cost.
        let d = r["disk_ms"].as_f64().unwrap();
        let t = r["disk_faults"].as_f64().unwrap() * d / 1e3
            + r["compressions"].as_f64().unwrap() * v["compress_ns"].as_f64().unwrap() / 1e9
            + r["decompressions"].as_f64().unwrap() * v["decompress_ns"].as_f64().unwrap() / 1e9;
        assert!((t - r["paging_time_s"].as_f64().unwrap()).abs() < 1e-9);
    }
    // More memory never means more faults for LRU.
    let faults: Vec<u64> = rows
        .iter()
        .filter(|r| r["policy"] == "none" && r["disk_ms"] == 5.0)
        .map(|r| r["disk_faults"].as_u64().unwrap())
        .collect();
    assert!(faults.windows(2).all(|w| w[1] <= w[0]), "{faults:?}");
    // A compressed region turns some faults into compressed hits.
    assert!(rows.iter().any(|r| r["policy"] == "static:0.25" && r["compressed_hits"].as_u64().unwrap() > 0));
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(svg_text.starts_with("<svg") && svg_text.contains("kaplan"));
}

/// de Castro 2003 §3 on the `sort` trace at a 5 ms disk: compression pays
/// at every size (`static:0.25` cuts paging time by 20–65%), and castro,
/// which before removing the growth barrier after a shrink sat on top
/// of `none` (0.99–1.00 here), now follows. The paper's two variants
/// and `+clean-disable` take the same names everywhere.
#[test]
fn castro_and_its_variants_compress_where_compression_pays() {
    let t = sort_trace();
    let out = ztier()
        .args(["sim", "--json", "--memory", "64K..256K:64K", "--disk-ms", "5", "--policy"])
        .arg("static:0.25,castro,castro-aggressive,castro-sluggish,castro+clean-disable")
        .arg("--trace")
        .arg(t)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["results"].as_array().unwrap();
    assert_eq!(rows.len(), 4 * 5);
    let norm = |p: &str, m: u64| {
        rows.iter().find(|r| r["policy"] == p && r["memory_pages"] == m).unwrap()["normalized"]
            .as_f64()
            .unwrap()
    };
    for m in [16, 32, 48, 64] {
        assert!(norm("static:0.25", m) < 0.85, "compression pays at {m} pages: {}", norm("static:0.25", m));
        for p in ["castro", "castro-sluggish", "castro+clean-disable"] {
            assert!(norm(p, m) < 0.9, "{p} at {m} pages: {} × none", norm(p, m));
        }
        // Shrinking at every expense read gives back more of the gain.
        assert!(
            norm("castro-aggressive", m) < 0.97,
            "castro-aggressive at {m}: {}",
            norm("castro-aggressive", m)
        );
        assert!(norm("castro-aggressive", m) >= norm("castro", m), "at {m} pages");
    }
}

#[test]
fn bad_input_gets_clear_errors() {
    let t = sort_trace();
    let run = |args: &[&str]| {
        let out = ztier().arg("sim").arg("--trace").arg(t).args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        String::from_utf8(out.stderr).unwrap()
    };
    assert!(run(&["--policy", "lru2"]).contains("unknown policy 'lru2'"));
    assert!(run(&["--policy", "static:1.5"]).contains("[0, 1)"));
    assert!(run(&["--codec", "deflate"]).contains("no compression records for deflate"));
    assert!(run(&["--disk-ms", "0"]).contains("positive"));
    assert!(run(&["--memory", "4K"]).contains("at least 8K"));
    // A range near u64::MAX: refused at once (it looped for ever).
    let e = run(&["--memory", "1..18446744073709551615:1"]);
    assert!(e.contains("gives 18446744073709551615 sizes, and a list may give at most 10000"), "{e}");
    assert!(run(&["--plot", "x.png"]).contains("SVG"));
    // A trace without compression records cannot answer.
    let d = t.parent().unwrap();
    let log = d.join("lk.log");
    std::fs::write(&log, " L 1000,8\n S 2000,8\n L 1000,8\n").unwrap();
    let bare = d.join("bare.trace");
    assert!(ztier()
        .args(["trace", "import-lackey"])
        .arg(&log)
        .arg("-o")
        .arg(&bare)
        .status()
        .unwrap()
        .success());
    let out = ztier().arg("sim").arg("--trace").arg(&bare).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("no compression records"));
    // A damaged trace is an error naming the damage, not a panic.
    let mut bytes = std::fs::read(t).unwrap();
    bytes.truncate(bytes.len() / 2);
    let cut = d.join("cut.trace");
    std::fs::write(&cut, bytes).unwrap();
    let out = ztier().arg("sim").arg("--trace").arg(&cut).output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("corrupt trace"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `ztier sim` with the shipped policy predicts the store faults of
/// `ztier run` on the same program: `sort` over 50,000 lines (one
/// thread, ~6 MB at its peak), recorded under lackey, then run under a
/// 2.5M budget. The run's memory is all managed from the first byte
/// (`ZTIER_START_AFTER=0`): by default the library leaves a process's
/// first MiB of requests to glibc, which a trace cannot tell apart (see
/// docs/measurements/2026-12-06-policy.md for both). The live count is
/// the store faults, the median of five runs (the model runs the
/// background evictor's pipeline, so the victims a write takes back are
/// no store faults there either: docs/policy.md); the prediction must
/// be within 20% of it. A replay of one run's fault log, which has no
/// hits, sees at most that run's page-ins.
#[test]
#[ignore = "the lackey recording takes minutes; at 1M-3M the model predicts -3..+20% of the run's store faults \
            (docs/measurements/2026-12-07-sim-vs-live-5.md)"]
fn the_simulator_predicts_the_store_faults_of_a_live_run() {
    let d = std::env::temp_dir().join(format!("ztier-cli-sim-live-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let input = d.join("in.txt");
    let mut x: u64 = 7;
    let mut text = String::new();
    for _ in 0..50_000 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let n = (x >> 33) % 100_000_000;
        let pad = ((x >> 20) % 40) as usize;
        text.push_str(&format!("{n:08} {}\n", "x".repeat(pad)));
    }
    std::fs::write(&input, text).unwrap();
    let sort = ["sort", "--parallel=1", "-o", "/dev/null", input.to_str().unwrap()];
    let t = d.join("sort.trace");
    let out = ztier().args(["trace", "record", "-o"]).arg(&t).arg("--").args(sort).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let log = d.join("log");
    let runs = live_runs(&d, "2560K", &[OsStr::new("--fault-log"), log.as_os_str()], &sort.map(OsStr::new));
    let p = &runs[4];
    let last = (p["faults"].as_u64().unwrap(), log.join(format!("{}.csv", p["pid"])));
    // A victim of the background evictor's batch in flight that the
    // program writes is taken back, not faulted; the model runs that
    // pipeline too (docs/policy.md).
    let mut live: Vec<u64> = runs.iter().map(|p| p["store_faults"].as_u64().unwrap()).collect();
    live.sort_unstable();
    let live = live[2];
    assert!(live > 300, "sort under 2.5M faults on stored pages: {live}");
    let sim = |input: &str, path: &Path| {
        let out = ztier()
            .args(["sim", "--json", "--memory", "2560K", "--policy", "shipped", "--disk-ms", "5", input])
            .arg(path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let r = v["results"].as_array().unwrap().iter().find(|r| r["policy"] == "shipped").unwrap().clone();
        r
    };
    let r = sim("--trace", &t);
    let predicted = r["store_faults"].as_u64().unwrap();
    let off = predicted as f64 / live as f64 - 1.0;
    assert!(
        off.abs() <= 0.2,
        "predicted {predicted} store faults, ztier run had {live} ({:+.0}%)",
        off * 100.0
    );
    let (faults, csv) = last;
    let r = sim("--fault-log", &csv);
    let replayed = r["faults"].as_u64().unwrap();
    assert!(r["store_faults"].as_u64().unwrap() > 0 && replayed <= faults, "{r} against {faults} faults");
}

/// `ztier sim` with the shipped policy predicts the store faults of
/// `ztier run` on a program whose pages are where lackey saw them:
/// `run_progs/hotset.c`, one `malloc` of 6 MiB (a mapping of its own,
/// under glibc as under ztier's allocator), a hot sixth of it and random
/// touches, one write each (~5 s to record under lackey). Budget 4M, the
/// run managed from its first byte (`ZTIER_START_AFTER=0`); the live count
/// is the store faults, the median of five runs, and the prediction (the
/// model runs the evictor's pipeline: docs/policy.md) must be within 20%
/// of it. Before the pipeline was modelled the model's store faults were
/// compared with store faults + `taken_back`: on a loaded 2-core machine
/// (docs/measurements/2026-12-06-sim-vs-live-2.md) prediction 5002, two
/// sets of five runs, sums 4763-5522, medians 5140 and 5019 (-3%, 0%);
/// under `make test` on a nearly idle machine 6,217-6,568 (prediction
/// 4,990: -21%). With the pipeline modelled it passed 6 of 6 at load
/// 20-45 (16 s each) and 8 of 8 on an idle machine (load ~2, 2 s each).
#[test]
fn the_simulator_predicts_a_live_run_of_a_program_with_one_heap_block() {
    let d = common::tmp("sim-hotset");
    let exe = common::compile(&d, "hotset");
    let t = d.join("hotset.trace");
    let out = ztier()
        .args(["trace", "record", "--snapshot-every", "20000", "--codecs", "lz4", "-o"])
        .arg(&t)
        .arg("--")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let runs = live_runs(&d, "4M", &[], &[OsStr::new(&exe)]);
    let mut live: Vec<u64> = runs.iter().map(|p| p["store_faults"].as_u64().unwrap()).collect();
    live.sort_unstable();
    let median = live[2];
    let back: Vec<u64> = runs.iter().map(|p| p["taken_back"].as_u64().unwrap()).collect();
    assert!(median > 2000, "hotset under 4M faults on stored pages: {live:?}");
    let out = ztier()
        .args(["sim", "--json", "--memory", "4M", "--policy", "shipped", "--disk-ms", "5", "--trace"])
        .arg(&t)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let predicted = v["results"][0]["store_faults"].as_u64().unwrap();
    let predicted_back = v["results"][0]["taken_back"].as_u64().unwrap();
    let off = predicted as f64 / median as f64 - 1.0;
    assert!(
        off.abs() <= 0.2,
        "predicted {predicted} store faults ({predicted_back} taken back), ztier run had {live:?} store faults \
         ({back:?} taken back) ({:+.0}% of the median)",
        off * 100.0
    );
}

/// Five runs of `cmd` under `ztier run --budget BUDGET` (and `extra`),
/// managed from the first byte: each run's first process's statistics.
fn live_runs(d: &Path, budget: &str, extra: &[&OsStr], cmd: &[&OsStr]) -> Vec<serde_json::Value> {
    (0..5)
        .map(|k| {
            let stats = d.join(format!("run{k}.json"));
            let out = ztier()
                .env("ZTIER_START_AFTER", "0")
                .args(["run", "--budget", budget])
                .args(extra)
                .arg("--stats")
                .arg(&stats)
                .arg("--")
                .args(cmd)
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
            s["per_process"][0].clone()
        })
        .collect()
}
