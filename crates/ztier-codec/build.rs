//! Sets `cfg(wkdm_avx512)` when the compiler has the AVX-512 intrinsics
//! (stable since Rust 1.89; the workspace also builds with 1.85, and the
//! WKdm vector encoder and decoder are then left out).

use std::process::Command;

fn main() {
    println!("cargo:rustc-check-cfg=cfg(wkdm_avx512)");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=RUSTC");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    // "rustc 1.95.0 (59807616e 2026-04-14)" → 95
    let minor = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| v.split_whitespace().nth(1)?.split('.').nth(1)?.parse::<u32>().ok());
    if minor.is_some_and(|m| m >= 89) {
        println!("cargo:rustc-cfg=wkdm_avx512");
    }
}
