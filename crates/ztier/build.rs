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
    for dep in ["ztier-preload", "ztier-store", "ztier-codec", "ztier-uffd", "ztier-remote"] {
        println!("cargo:rerun-if-changed={}", ws.join("crates").join(dep).join("src").display());
        println!("cargo:rerun-if-changed={}", ws.join("crates").join(dep).join("Cargo.toml").display());
    }
    println!("cargo:rerun-if-changed={}", ws.join("Cargo.lock").display());
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
