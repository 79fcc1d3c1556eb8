//! `ztier remote gc` (the remote tier's options of `ztier run` and their
//! proxy are [`crate::remote_args`]).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use serde_json::Value;

use crate::remote_args::RemoteArgs;

/// `ztier remote ...`.
#[derive(Subcommand, Debug)]
pub enum RemoteCommand {
    /// Remove from the servers the pages of runs whose `ztier run` was
    /// killed (or whose machine was lost): each run says it is alive on the
    /// servers every 20 s; those that have not for 60 s are removed.
    Gc(GcArgs),
}

/// Arguments of `ztier remote gc`.
#[derive(Args, Debug)]
#[command(after_long_help = "Examples:\n  \
    ztier remote gc --remote redis://ztier@10.0.0.1:6379 --remote-auth ~/.ztier-remote")]
pub struct GcArgs {
    /// The servers, as `ztier run --remote` takes them.
    #[arg(long, value_name = "URLS")]
    pub remote: String,
    /// A file (mode 600) whose first line is PASSWORD or USER PASSWORD.
    #[arg(long, value_name = "FILE")]
    pub remote_auth: Option<PathBuf>,
    /// A PEM file of the certificate authorities to trust for rediss://.
    #[arg(long, value_name = "FILE")]
    pub remote_tls_ca: Option<PathBuf>,
    /// Print one JSON object instead of a line per run.
    #[arg(long)]
    pub json: bool,
}

/// `ztier remote`.
pub fn run(c: RemoteCommand) -> Result<i32> {
    match c {
        RemoteCommand::Gc(a) => {
            let r = RemoteArgs {
                remote: Some(a.remote),
                remote_auth: a.remote_auth,
                remote_tls_ca: a.remote_tls_ca,
                remote_encrypt: "on".into(),
                remote_durability: "auto".into(),
            };
            let cfg = r.config()?.expect("--remote given");
            let runs = ztier_remote::remove_dead_runs(&cfg).context("--remote")?;
            if a.json {
                let runs: Vec<Value> =
                    runs.iter().map(|(run, n)| serde_json::json!({ "run": run, "removed": n })).collect();
                println!("{}", serde_json::json!({ "runs": runs }));
            } else if runs.is_empty() {
                println!("no ended run left values");
            } else {
                for (run, n) in &runs {
                    println!("run {run}: {n} values removed");
                }
            }
            Ok(0)
        }
    }
}
