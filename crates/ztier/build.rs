//! Builds the LD_PRELOAD library of `ztier run` (crate `ztier-preload`, a
//! cdylib, which cargo cannot hand to another crate as an artifact on
//! stable) with a nested `cargo build` into this crate's OUT_DIR, so that
//! the `ztier` binary can embed it: `cargo run --release -- demo` then
//! needs nothing else built.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let ws = manifest.join("../..");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target = out.join("preload-target");
    // Every workspace crate the library is built from, found through
    // their manifests (a crate added to the library's dependencies, or
    // to one of theirs, is watched without a change here).
    for dep in workspace_deps(&ws, "ztier-preload") {
        let dir = ws.join("crates").join(&dep);
        println!("cargo:rerun-if-changed={}", dir.join("src").display());
        println!("cargo:rerun-if-changed={}", dir.join("Cargo.toml").display());
        if dir.join("build.rs").exists() {
            println!("cargo:rerun-if-changed={}", dir.join("build.rs").display());
        }
    }
    // The lock file, and the workspace manifest (its
    // `[workspace.dependencies]` and profiles build the library too).
    println!("cargo:rerun-if-changed={}", ws.join("Cargo.lock").display());
    println!("cargo:rerun-if-changed={}", ws.join("Cargo.toml").display());
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--release", "--quiet", "-p", "ztier-preload", "--manifest-path"])
        .arg(ws.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        // Not clippy's driver nor the outer build's flags: a plain build.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_MAKEFLAGS")
        .env_remove("MAKEFLAGS")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "0")
        .env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo")
        .status()
        .expect("running cargo to build ztier-preload");
    assert!(status.success(), "building ztier-preload (the library of `ztier run`) failed");
    let so = target.join("release/libztier_preload.so");
    println!("cargo:rustc-env=ZTIER_PRELOAD_SO={}", so.display());
}

/// `krate` and the workspace crates (`crates/ztier-*`) it depends on,
/// directly or not, from the `[dependencies]` of their manifests.
fn workspace_deps(ws: &std::path::Path, krate: &str) -> Vec<String> {
    let mut seen = vec![krate.to_string()];
    let mut at = 0;
    while at < seen.len() {
        let manifest = ws.join("crates").join(&seen[at]).join("Cargo.toml");
        let text = std::fs::read_to_string(&manifest)
            .unwrap_or_else(|e| panic!("reading {}: {e}", manifest.display()));
        let mut in_deps = false;
        for line in text.lines().map(str::trim) {
            if line.starts_with('[') {
                in_deps = line == "[dependencies]";
                continue;
            }
            let name = line.split(['=', '.', ' ']).next().unwrap_or("");
            if in_deps && name.starts_with("ztier-") && !seen.iter().any(|s| s == name) {
                seen.push(name.to_string());
            }
        }
        at += 1;
    }
    seen
}
