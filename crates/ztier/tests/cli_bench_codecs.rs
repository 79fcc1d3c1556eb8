//! `ztier bench codecs` and `ztier demo` as users run them.

use std::process::Command;

fn ztier() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ztier"))
}

fn tmpdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("ztier-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write_pages(path: &std::path::Path) {
    let c = ztier_codec::corpus::synth::corpus(50, 9);
    let mut data = c.bytes().to_vec();
    data.extend_from_slice(&[0u8; 4096 * 2]); // two zero pages
    std::fs::write(path, data).unwrap();
}

#[test]
fn json_report_has_the_documented_fields_for_every_codec() {
    let d = tmpdir("json");
    let f = d.join("s.pages");
    write_pages(&f);
    let out =
        ztier().args(["bench", "codecs", "--seconds", "0", "--json", "--corpus"]).arg(&f).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object on stdout");
    assert_eq!(v["pages"], 52);
    assert_eq!(v["zero_pages"], 2);
    assert_eq!(v["same_filled_pages"], 0);
    assert!(v["memcpy_mb_s"].as_f64().unwrap() > 0.0);
    let codecs = v["codecs"].as_array().unwrap();
    let names: Vec<&str> = codecs.iter().map(|c| c["codec"].as_str().unwrap()).collect();
    assert_eq!(names, ["wkdm", "wk4x4", "wk64", "lzo", "lz4", "zstd", "deflate", "hybrid"]);
    for c in codecs {
        for k in ["ratio", "compress_mb_s", "decompress_mb_s", "compress_vs_memcpy", "decompress_vs_memcpy"] {
            assert!(c[k].as_f64().unwrap() > 0.0, "{k} of {}", c["codec"]);
        }
        let h = &c["histogram"];
        let total: u64 = ["0-512", "512-1024", "1024-2048", "2048-3072", "3072-4096", "raw"]
            .iter()
            .map(|k| h[k].as_u64().unwrap())
            .sum();
        assert_eq!(total, 50, "histogram of {}", c["codec"]);
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn table_output_and_codec_selection() {
    let d = tmpdir("table");
    let f = d.join("s.pages");
    write_pages(&f);
    let out = ztier()
        .args(["bench", "codecs", "--seconds", "0", "--codecs", "wkdm,lz4", "--corpus"])
        .arg(&f)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("wkdm") && text.contains("lz4") && !text.contains("zstd"), "{text}");
    assert!(text.contains("2 zero"), "{text}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn bad_input_gets_a_clear_error() {
    let d = tmpdir("bad");
    let f = d.join("bad.pages");
    std::fs::write(&f, [1u8; 100]).unwrap();
    let out = ztier().args(["bench", "codecs", "--corpus"]).arg(&f).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a whole number of 4096-byte pages"), "{err}");
    let out = ztier().args(["bench", "codecs", "--codecs", "nope", "--corpus"]).arg(&f).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown codec"));
    let out = ztier().args(["bench", "codecs"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--corpus"));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn pid_sampling_reads_a_live_process() {
    // A child python process holding a recognisable heap.
    let mut child = Command::new("python3")
        .args([
            "-c",
            "import sys,time; x=[i*7 for i in range(300000)]; print('ready', flush=True); time.sleep(30)",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 is needed for this test (make test installs it)");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let out = ztier()
        .args([
            "bench",
            "codecs",
            "--seconds",
            "0",
            "--codecs",
            "lz4",
            "--json",
            "--max-pages",
            "2000",
            "--pid",
        ])
        .arg(child.id().to_string())
        .output()
        .unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pages = v["pages"].as_u64().unwrap();
    assert!(pages > 100 && pages <= 2000, "{pages} pages sampled");
    assert_eq!(v["corpus"][0], format!("pid:{}", child.id()));
}

#[test]
fn demo_runs_on_built_in_defaults() {
    let out = ztier().args(["demo", "--seconds", "0"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    for c in ["wkdm", "wk4x4", "wk64", "lzo", "lz4", "zstd", "deflate", "hybrid"] {
        assert!(text.contains(c), "demo output lacks {c}:\n{text}");
    }
    // Part 2: the store, one row per allocator.
    let part4 = text.split("part 4").nth(1).expect("demo has a block device part");
    assert!(part4.contains("audit clean") && part4.contains("flushed data intact"), "{part4}");
    let part3 = text.split("part 3").nth(1).expect("demo has a simulator part");
    assert!(!part3.contains("skipped"), "valgrind is installed by the test command:\n{part3}");
    assert!(part3.contains("kaplan") && part3.contains("normalized"), "{part3}");
    let part2 = text.split("part 2").nth(1).expect("demo has a store part");
    let part2 = part2.split("part 3").next().unwrap();
    for a in ["cells1", "cells2", "cells4", "chunks", "classes"] {
        assert!(part2.lines().any(|l| l.starts_with(a)), "store table lacks {a}:\n{part2}");
    }
    // Part 5: the Python job under a budget; pages that went out unchanged
    // were not compressed again.
    let part5 = text.split("part 5").nth(1).expect("demo has a ztier run part");
    assert!(part5.contains("output identical to the native run"), "{part5}");
    assert!(
        part5
            .lines()
            .any(|l| l.trim_start().starts_with("--fault-path signal") && l.ends_with("output identical)")),
        "{part5}"
    );
    assert!(part5.contains(" s in all: lock wait ") && part5.contains(" s, store reads "), "{part5}");
    let clean: u64 = part5
        .split(" more evicted unchanged")
        .next()
        .and_then(|t| t.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of unchanged evictions:\n{part5}"));
    assert!(clean > 0, "{part5}");
    // The pool of forked workers: under one budget of 24M (25.2 MB) for
    // the whole command, they hold at most that together; with one each,
    // more than twice that in all.
    let number_before = |line: &str, word: &str| -> f64 {
        let head = line.split(word).next().unwrap().trim_end();
        head.rsplit(' ')
            .next()
            .unwrap()
            .trim_start_matches('(')
            .parse()
            .unwrap_or_else(|_| panic!("{line:?}"))
    };
    let tree = part5.lines().find(|l| l.starts_with("ztier run --budget 24M")).expect(part5);
    let together = number_before(tree, " together");
    assert!(together > 16.0 && together <= 26.0, "{tree}");
    let own = part5.lines().find(|l| l.trim_start().starts_with("--budget-scope process")).expect(part5);
    let all = number_before(own, " in all)");
    assert!(all > 2.0 * together, "{own}\n{tree}");
    assert!(part5.contains("Outputs identical. One budget covers every process"), "{part5}");
}
