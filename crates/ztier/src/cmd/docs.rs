//! `ztier man` and `ztier completions`: the manual pages and the shell
//! completions, generated from the clap definitions of this binary (so
//! they always say what `--help` says).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use clap_complete::Shell;

/// Arguments of `ztier man`.
#[derive(Args, Debug)]
pub struct ManArgs {
    /// Folder to write the pages into (made if missing): `ztier.1` and one
    /// page per subcommand (`ztier-run.1`, `ztier-bench-pressure.1`, …).
    /// Install with `ztier man /usr/local/share/man/man1`.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

/// Arguments of `ztier completions`.
#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for; the script goes to stdout. For bash:
    /// `ztier completions bash > /usr/share/bash-completion/completions/ztier`.
    #[arg(value_enum, value_name = "SHELL")]
    pub shell: Shell,
}

/// Runs `ztier man` over `cli`, the binary's command definition.
pub fn man(a: ManArgs, cli: clap::Command) -> Result<i32> {
    std::fs::create_dir_all(&a.dir).with_context(|| format!("making {}", a.dir.display()))?;
    clap_mangen::generate_to(cli, &a.dir)
        .with_context(|| format!("writing manual pages into {}", a.dir.display()))?;
    Ok(0)
}

/// Runs `ztier completions` over `cli`.
pub fn completions(a: CompletionsArgs, mut cli: clap::Command) -> Result<i32> {
    let mut out = std::io::stdout().lock();
    clap_complete::generate(a.shell, &mut cli, "ztier", &mut out);
    Ok(0)
}
