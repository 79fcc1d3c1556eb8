//! `ztier bench store` as users run it.

use std::process::Command;

fn ztier() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ztier"))
}

fn corpus_file(name: &str, pages: usize) -> (std::path::PathBuf, std::path::PathBuf) {
    let d = std::env::temp_dir().join(format!("ztier-cli-store-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let f = d.join("s.pages");
    let c = ztier_codec::corpus::synth::corpus(pages, 5);
    std::fs::write(&f, c.bytes()).unwrap();
    (d, f)
}

#[test]
fn json_has_the_documented_fields_and_overhead_is_counted() {
    let (d, f) = corpus_file("json", 600);
    let out = ztier()
        .args([
            "bench",
            "store",
            "--allocator",
            "classes",
            "--budget",
            "1M",
            "--ops",
            "3000",
            "--json",
            "--corpus",
        ])
        .arg(&f)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    for k in
        ["allocator", "pages_stored", "orig_bytes", "compressed_bytes", "memory_used_bytes", "metadata_bytes"]
    {
        assert!(!v[k].is_null(), "{k} missing");
    }
    assert_eq!(v["allocator"], "classes");
    assert_eq!(v["budget"], 1 << 20);
    let used = v["memory_used_bytes"].as_u64().unwrap();
    assert!(used <= 1 << 20, "memory {used} over the budget");
    let orig = v["orig_bytes"].as_u64().unwrap();
    assert_eq!(orig, v["pages_stored"].as_u64().unwrap() * 4096);
    let eff = v["effective_ratio"].as_f64().unwrap();
    assert!((eff - orig as f64 / used as f64).abs() < 1e-9, "effective_ratio is orig / memory used");
    assert!(used >= v["compressed_bytes"].as_u64().unwrap() + v["metadata_bytes"].as_u64().unwrap());
    // The store ran past its budget: not every page of the corpus fits.
    assert!(v["pages_stored"].as_u64().unwrap() < 600);
    assert!(v["evictions"].as_u64().unwrap() > 0);
    for k in ["put_ops_s", "get_ops_s", "pair_ops_s", "codec_pair_ops_s", "mixed_ops_s_1", "mixed_ops_s_n"] {
        assert!(v[k].as_f64().unwrap() > 0.0, "{k}");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn all_allocators_table_and_results_array() {
    let (d, f) = corpus_file("all", 300);
    let out = ztier()
        .args(["bench", "store", "--allocator", "all", "--ops", "2000", "--threads", "2", "--corpus"])
        .arg(&f)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    for a in ["cells1", "cells2", "cells4", "chunks", "classes"] {
        assert!(text.lines().any(|l| l.starts_with(a)), "{a} row missing:\n{text}");
    }
    let out = ztier()
        .args(["bench", "store", "--allocator", "cells2,chunks", "--ops", "2000", "--json", "--corpus"])
        .arg(&f)
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> =
        v["results"].as_array().unwrap().iter().map(|r| r["allocator"].as_str().unwrap()).collect();
    assert_eq!(names, ["cells2", "chunks"]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn bad_arguments_get_clear_errors() {
    let (d, f) = corpus_file("bad", 10);
    let run = |args: &[&str]| {
        let out = ztier().args(["bench", "store"]).args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        String::from_utf8(out.stderr).unwrap()
    };
    let fs = f.to_str().unwrap();
    assert!(run(&["--allocator", "slabby", "--corpus", fs]).contains("unknown allocator 'slabby'"));
    assert!(run(&["--budget", "12Q", "--corpus", fs]).contains("12Q"));
    assert!(run(&[]).contains("--corpus"));
    assert!(run(&["--corpus", "/nonexistent/x.pages"]).contains("/nonexistent/x.pages"));
    assert!(run(&["--threads", "0", "--corpus", fs]).contains("--threads"));
    std::fs::remove_dir_all(&d).unwrap();
}
