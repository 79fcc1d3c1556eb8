//! Refuses the `avx512` feature on a compiler without the AVX-512
//! intrinsics (stable since Rust 1.89; the workspace also builds with
//! 1.85, and without that feature).

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=RUSTC");
    if std::env::var_os("CARGO_FEATURE_AVX512").is_none() {
        return;
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    // "rustc 1.95.0 (59807616e 2026-04-14)" → 95
    let minor = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| v.split_whitespace().nth(1)?.split('.').nth(1)?.parse::<u32>().ok());
    if minor.is_none_or(|m| m < 89) {
        panic!("the `avx512` feature of ztier-codec needs Rust 1.89 or later (its AVX-512 intrinsics)");
    }
}
