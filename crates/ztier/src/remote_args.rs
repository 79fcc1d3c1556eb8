//! The remote tier's options (`--remote` and kin, of `ztier run` and
//! `ztier cache`) and its proxy's start and end around a run (`ztier
//! remote gc` is `cmd::remote`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::Value;
use ztier_remote::{Credentials, Durability, Proxy, RemoteConfig, Spill};

/// Options of the remote tier (`ztier run --remote`).
#[derive(Args, Debug, Clone)]
pub struct RemoteArgs {
    /// Keep compressed pages the store evicts in Redis (a server, or any
    /// nodes of a Redis Cluster): `redis://[USER@]HOST:PORT[,HOST:PORT...]`
    /// (rediss:// for TLS). The password comes from ZTIER_REMOTE_PASSWORD or
    /// --remote-auth, never from the URL. With --spill, the spill file is the
    /// remote's fallback (the remote is down, full or slow) and holds the
    /// local copies of --remote-durability local.
    #[arg(long, value_name = "URLS")]
    pub remote: Option<String>,
    /// A file (mode 600) whose first line is PASSWORD or USER PASSWORD.
    #[arg(long, value_name = "FILE", requires = "remote")]
    pub remote_auth: Option<PathBuf>,
    /// on (the default): pages are encrypted and authenticated (AES-256-GCM);
    /// off: only authenticated (a keyed BLAKE3 MAC), readable on the servers.
    #[arg(long, default_value = "on", value_parser = ["on", "off"], requires = "remote")]
    pub remote_encrypt: String,
    /// What a page survives: replica (a replica acknowledged it: the loss of
    /// any one server), local (a copy in the spill file: the loss of every
    /// server), replica+local, none; auto (the default): replica+local where
    /// every master has a replica and there is --spill, else what there is.
    #[arg(long, default_value = "auto", requires = "remote")]
    pub remote_durability: String,
    /// A PEM file of the certificate authorities to trust for rediss://.
    #[arg(long, value_name = "FILE", requires = "remote")]
    pub remote_tls_ca: Option<PathBuf>,
}

impl Default for RemoteArgs {
    fn default() -> Self {
        RemoteArgs {
            remote: None,
            remote_auth: None,
            remote_encrypt: "on".into(),
            remote_durability: "auto".into(),
            remote_tls_ca: None,
        }
    }
}

impl RemoteArgs {
    /// The tier's configuration, credentials included.
    pub fn config(&self) -> Result<Option<RemoteConfig>> {
        let Some(list) = &self.remote else { return Ok(None) };
        let mut cfg = RemoteConfig::parse(list).context("--remote")?;
        if let Some(f) = &self.remote_auth {
            let c = Credentials::from_file(f).context("--remote-auth")?;
            cfg.credentials.password = c.password;
            if c.user.is_some() {
                cfg.credentials.user = c.user;
            }
        }
        cfg.encrypt = self.remote_encrypt != "off";
        cfg.durability = self.remote_durability.parse::<Durability>().context("--remote-durability")?;
        cfg.tls_ca = self.remote_tls_ca.clone();
        Ok(Some(cfg))
    }

    /// The proxy for a run (the servers checked first: a wrong password
    /// or an unreachable cluster is said before any program runs), if
    /// `--remote` was given; `spill`: its fallback's folder and size.
    pub fn start(&self, spill: Option<(PathBuf, u64)>) -> Result<Option<Proxy>> {
        let Some(cfg) = self.config()? else { return Ok(None) };
        let spill = spill.map(|(dir, max_bytes)| Spill { dir, max_bytes });
        Ok(Some(Proxy::start(cfg, spill).context("--remote")?))
    }
}

/// After the run: waits for its processes' tiers to end (said on
/// stderr while some stay), and puts the totals into the statistics' `remote`.
pub fn end(proxy: Proxy, stats: &mut Value) {
    let run = proxy.run_id().to_string();
    let durability = proxy.durability().name();
    let server_cpu = proxy.server_cpu();
    let end = proxy.finish(|n| {
        eprintln!("ztier: waiting for {n} processes of the command that keep pages in the remote tier")
    });
    for p in &end.problems {
        eprintln!("ztier: remote: {p}");
    }
    let mut r = serde_json::to_value(&end.stats).unwrap_or_default();
    r["run"] = run.into();
    r["durability"] = durability.into();
    r["processes"] = end.processes.into();
    r["removed_at_end"] = end.removed_at_end.into();
    // Where the server's replies arrived, whether its process is bound
    // there (on loopback), and whether the run's first process was
    // pinned there.
    r["server_cpu"] = server_cpu.map(|c| c.cpu).into();
    r["server_held"] = server_cpu.and_then(|c| c.held).into();
    r["server_cpu_followed"] = server_cpu.is_some_and(|c| c.worth_following()).into();
    stats[ztier_run_core::names::stats::REMOTE] = r;
}
