//! `ztier demo`: the flagship end-to-end demonstration on built-in defaults.

use anyhow::Result;
use clap::Args;

/// Arguments of `ztier demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {}

/// Runs the demo.
pub fn run(_a: DemoArgs) -> Result<i32> {
    Ok(0)
}
