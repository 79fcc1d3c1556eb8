//! `ztier man` and `ztier completions`: generated from the clap
//! definitions, installed by `make install-docs`.

use std::process::Command;

mod common;
use common::{require, tmp};

fn ztier() -> Command {
    Command::new(common::ztier())
}

/// A page for the binary and one per subcommand, each one that `man`
/// renders with the options `--help` lists.
#[test]
fn man_pages_for_every_subcommand_render() {
    require("man");
    let d = tmp("man").join("man1");
    let o = ztier().arg("man").arg(&d).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for page in [
        "ztier.1",
        "ztier-run.1",
        "ztier-sim.1",
        "ztier-stats.1",
        "ztier-hold.1",
        "ztier-bench.1",
        "ztier-bench-pressure.1",
        "ztier-blk-serve.1",
        "ztier-trace-record.1",
        "ztier-man.1",
        "ztier-completions.1",
    ] {
        let p = d.join(page);
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.starts_with(".ie") || text.contains("\n.TH "), "{page} is not a man page");
    }
    let out = Command::new("man")
        .args(["-l", "-P", "cat"])
        .arg(d.join("ztier-run.1"))
        .env("MANWIDTH", "100")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    for want in ["ztier-run", "--budget", "--policy", "--fault-path"] {
        assert!(text.contains(want), "ztier-run.1 lacks {want}:\n{text}");
    }
    // A folder that cannot be made is a clear error.
    let o = ztier().args(["man", "/proc/ztier-man"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/proc/ztier-man"));
    std::fs::remove_dir_all(d.parent().unwrap()).unwrap();
}

/// A completion script for every shell clap_complete knows; bash's parses,
/// and each one offers the subcommands.
#[test]
fn completions_for_every_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let o = ztier().args(["completions", shell]).output().unwrap();
        assert!(o.status.success(), "{shell}: {}", String::from_utf8_lossy(&o.stderr));
        let s = String::from_utf8_lossy(&o.stdout);
        for want in ["ztier", "run", "sim", "blk", "--budget"] {
            assert!(s.contains(want), "{shell} completions lack {want}");
        }
    }
    require("bash");
    let d = tmp("bash");
    let script = d.join("ztier.bash");
    let o = ztier().args(["completions", "bash"]).output().unwrap();
    std::fs::write(&script, &o.stdout).unwrap();
    // It parses, and sourced it registers a completion for `ztier`.
    let o = Command::new("bash")
        .arg("-c")
        .arg(format!("set -e; bash -n {0}; source {0}; complete -p ztier", script.display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("ztier"));
    let o = ztier().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "an unknown shell is a usage error");
    std::fs::remove_dir_all(&d).unwrap();
}
