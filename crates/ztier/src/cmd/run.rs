//! `ztier run` — runs an unmodified program with its heap under a memory
//! budget (`ztier stats PID`, live statistics of a running one, and
//! `ztier hold PID` are the control socket's client, in `hold`).
//!
//! The work happens inside the program, in the preloaded library
//! (`ztier-preload`, embedded in this binary at build time and written
//! once per version to `$TMPDIR/ztier-UID/`). This command sets the
//! environment (`LD_PRELOAD` and the `ZTIER_*` settings, inherited by
//! every process the program starts), runs the program, forwards
//! SIGINT/SIGTERM/SIGHUP to it, exits with its status, and merges the
//! per-process statistics into `--stats FILE.json` (that work is
//! [`ztier_launch::launch`]'s, which the demo and the benchmarks share; this
//! module checks the arguments and says the outcome):
//!
//! ```text
//!  { "faults", "fault_p50_us", "fault_p99_us", "fault_mean_us", "pages_compressed",
//!    "fault_service_s", "fault_lock_wait_s", "fault_store_read_s", "fault_install_s",
//!    "orig_bytes", "stored_bytes", "peak_resident_bytes",   (DESIGN.md)
//!    "processes", "peak_rss_bytes", "wall_s", "exit_code", "per_process": [...] }
//! ```

use anyhow::{bail, Context, Result};
use serde_json::Value;
use ztier_run_core::names::{merged, stats};

use crate::launch::{
    in_proc_or_sys, out_of_reach, pretty, run_program, runnable, say_notice, service_parts, RunArgs,
};

/// `ztier run`.
pub fn run(a: RunArgs) -> Result<i32> {
    if let Some(path) = &a.stats {
        // Said before the program runs, not after.
        if in_proc_or_sys(path) {
            bail!("--stats {}: a file of /proc or /sys, not one for statistics", path.display());
        }
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .with_context(|| format!("--stats {}: cannot write there", path.display()))?;
    }
    if let Err(code) = runnable(&a.cmd[0]) {
        return Ok(code);
    }
    let reach = out_of_reach(a.cmd[0].as_ref()).map(|why| {
        format!("ztier: warning: {why}: LD_PRELOAD cannot reach it, so its own memory is not managed")
    });
    if let Some(msg) = &reach {
        // Said now where notices are said as they come (and listed with
        // the others after the run).
        say_notice(&a, None, msg.clone());
    }
    let mut out = run_program(&a, None, None)?;
    if let (Some(msg), Some(Value::Array(n))) = (reach, out.stats.get_mut(merged::NOTICES)) {
        n.insert(0, msg.into());
    }
    let s = &out.stats;
    let peak = s[merged::PEAK_RSS_BYTES].as_u64().unwrap_or(0);
    // With the tree scope, processes that joined its budget started the
    // library, though none may have left statistics (killed by SIGKILL).
    let started =
        s[merged::PROCESSES].as_u64().unwrap_or(0) + s[merged::TREE_PROCESSES].as_u64().unwrap_or(0);
    if started == 0 && peak > a.budget {
        let msg = format!(
            "ztier: warning: no process of the program started ztier's library, and its peak RSS ({} MiB) \
             went over the budget ({} MiB): none of its memory was managed (a statically linked program, \
             a set-user-ID one, or one started without LD_PRELOAD)",
            peak >> 20,
            a.budget >> 20
        );
        say_notice(&a, Some(&mut out.stats), msg);
    }
    let s = &out.stats;
    if let Some(path) = &a.stats {
        if let Err(e) = std::fs::write(path, pretty(s)? + "\n") {
            // The program's own status is still the one given back, unless
            // it succeeded: then the statistics asked for are what failed.
            eprintln!("ztier: error: writing the statistics to {}: {e}", path.display());
            return Ok(if out.code != 0 { out.code } else { 1 });
        }
    }
    if a.summary {
        if a.log.is_none() {
            for n in s[merged::NOTICES].as_array().into_iter().flatten() {
                eprintln!("{}", n.as_str().unwrap_or_default());
            }
        }
        let sec = |k: &str| s[k].as_f64().unwrap_or(0.0);
        let mb = |k: &str| s[k].as_f64().unwrap_or(0.0) / 1e6;
        let budget = a.budget as f64 / 1e6;
        let resident = match (s.get(merged::TREE_PEAK_HELD_BYTES), s[merged::PROCESSES].as_u64().unwrap_or(0))
        {
            (Some(_), n) if n > 1 => format!(
                "peak held by its {n} processes together {:.1} MB of the {budget:.1} MB budget (the most \
                 resident in one {:.1} MB)",
                mb(merged::TREE_PEAK_HELD_BYTES),
                mb(stats::PEAK_RESIDENT_BYTES)
            ),
            (None, n) if n > 1 => format!(
                "peak resident {:.1} MB (the most of its {n} processes) of the {budget:.1} MB budget each",
                mb(stats::PEAK_RESIDENT_BYTES)
            ),
            _ => format!("peak resident {:.1} MB of {budget:.1} MB budget", mb(stats::PEAK_RESIDENT_BYTES)),
        };
        // An explicit --store the processes shared: what they stored together.
        let resident = match (a.store, s.get(merged::TREE_STORE_PEAK_BYTES)) {
            (Some(limit), Some(_)) if s[merged::PROCESSES].as_u64().unwrap_or(0) > 1 => format!(
                "{resident}, their stores together at most {:.1} MB of the {:.1} MB --store",
                mb(merged::TREE_STORE_PEAK_BYTES),
                limit as f64 / 1e6
            ),
            _ => resident,
        };
        // Everything held together, against the budget it counts toward.
        let resident = match s[merged::TREE_PEAK_TOTAL_BYTES].as_u64() {
            Some(t) => format!(
                "{resident}, everything held (resident, stores, tables) at most {:.1} MB{}",
                t as f64 / 1e6,
                if s[merged::BUDGET_COVERS] == "all" {
                    format!(" of the {budget:.1} MB budget")
                } else {
                    String::new()
                }
            ),
            None => resident,
        };
        eprintln!(
            "ztier run: exit {} in {:.2} s; {} faults ({} from the store, {} of them lone pages off any walk; p50 {} µs, p99 {} µs; served in {:.2} s: {}), {} pages compressed ({:.1} MB → {:.1} MB), {resident}, peak RSS {:.1} MB",
            out.code,
            s[merged::WALL_S].as_f64().unwrap_or(0.0),
            s[stats::FAULTS],
            s[stats::STORE_FAULTS],
            s[stats::LONE_FAULTS],
            s[stats::FAULT_P50_US],
            s[stats::FAULT_P99_US],
            sec(merged::FAULT_SERVICE_S),
            service_parts(
                sec(merged::FAULT_SERVICE_S),
                sec(merged::FAULT_LOCK_WAIT_S),
                sec(merged::FAULT_STORE_READ_S),
                sec(merged::FAULT_INSTALL_S)
            ),
            s[stats::PAGES_COMPRESSED],
            s[stats::ORIG_BYTES].as_f64().unwrap_or(0.0) / 1e6,
            s[stats::STORED_BYTES].as_f64().unwrap_or(0.0) / 1e6,
            s[merged::PEAK_RSS_BYTES].as_f64().unwrap_or(0.0) / 1e6,
        );
    }
    Ok(out.code)
}
