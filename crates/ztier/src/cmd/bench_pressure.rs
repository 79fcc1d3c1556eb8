//! `ztier bench pressure`: one program under memory pressure, natively
//! and at each budget under kernel swap to a file, kernel zswap, kernel
//! zram swap — each inside a memory cgroup limited to the budget — and
//! under `ztier run`. Outputs must be identical to the native run; the
//! table reports wall time (and its ratio to native), CPU time (user +
//! system of the program's processes and threads), peak RSS, major
//! faults and what was compressed, then `ztier run`'s fault service time
//! (p50, p99, mean) per budget, and an SVG plot shows the wall times (zcache's
//! "make -jN under memory pressure" view). Last, userfaultfd's own costs
//! on this machine are measured (`ztier bench uffd`: a fault's round trip
//! and each further page of a run, with nothing to decompress), and each
//! `ztier run` row is told what its faults and pages take at that floor:
//! the part of its time above native that no store, codec or policy
//! change short of fewer faults or pages can remove (measured in the same
//! run, since the machine's speed drifts from day to day). With `--pairs
//! N`, native and `ztier run` are then timed N more times at each budget,
//! alternating, and `ztier run`'s time is taken against native's pair by
//! pair (median and range): on a shared VM the same native command took
//! 13.8 s and 20.5 s six minutes apart, so one run's ratio can be off by a
//! third, while a pair's two runs see about the same machine.
//!
//! Every system setting changed is put back by guards that run in reverse
//! order, also on errors and after Ctrl-C, SIGTERM or SIGHUP, whenever it
//! comes: they are caught for the benchmark's whole life (a signal sets a
//! flag and is forwarded to the running program, which ends the run
//! early; the benchmark stops at its next step, then the guards run),
//! and the commands that change or restore a setting run in process
//! groups of their own, out of a terminal's Ctrl-C. One benchmark with
//! kernel baselines runs at a time (a lock in `/run/lock`):
//!
//! ```text
//!  swap file   fallocate + mkswap + swapon      → swapoff, delete
//!  zswap       /sys/module/zswap/parameters/enabled = Y   → old value
//!  zram        hot_add, comp_algorithm, disksize, mkswap, swapon
//!                                                → swapoff, reset, hot_remove
//!  cgroup      memory/ztier-bench-PID-N, limit_in_bytes (v1) or memory.max (v2)
//!                                                → rmdir
//! ```
//!
//! A process a run leaves running (a script's server) is killed by PID
//! before the next run starts: a kernel run's from its cgroup
//! (`empty_cgroup`), a native or `ztier run` run's as an orphan that came
//! to `bench pressure`, a child subreaper (`end_leftovers`).
//!
//! In a v1 cgroup the OOM killer is disabled (v1 would kill the program
//! while reclaim waits for swap writeback); a program paused at the limit
//! is woken by a watcher (`wake_oom_waiters`), since nothing else would.
//! Only the program's own faults wait there: one the kernel takes for it
//! (a system call's buffer, glibc's `rseq` area written on the way back
//! to user space) fails at the limit, so a kernel baseline can end with
//! `EFAULT` or `SIGSEGV`; the table says FAILED and a line below it
//! says how the program ended (`failure_lines`). A program can also read
//! the cgroup's limit and size itself from it (the JVM's heap): where the
//! kernel runs exit with a status of their own and `ztier run` at that
//! budget finished, a line says so (`cgroup_sizing_lines`). Measured: the default
//! `examples/workloads/pyapp.py` (~700 MB) under zswap at 256M was killed by
//! `SIGSEGV` from `rseq` after ~50–62 s in five runs of five, and with
//! `GLIBC_TUNABLES=glibc.pthread.rseq=0` it hit the 300 s timeout instead.
//! With zswap's shrinker on as well (writeback to the swap file under
//! pressure; off by default here) it finished once in four runs (55.7 s),
//! timed out twice busy in reclaim, and was killed once, so the run leaves
//! the shrinker as it finds it. A program whose working set is a few
//! megabytes over the limit shows the same: `xz -6 -T2` over 3 MB of
//! base64 (51 MB peak) under swap to a file at 32M was killed by
//! `SIGSEGV` in two runs of two, and finished with `rseq` off (17.4 s,
//! the native output). `rseq` stays on: the baseline is the program as
//! it runs. A worker of `examples/workloads/workers.py 200000 3` under
//! zswap at 48M ended the same way (the script's output says "worker 1
//! ended by signal 11", so the table says the output differs), and with
//! `rseq` off the run hit the 300 s timeout (woken 2289 times).

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::Args;
use ztier_run_core::names::{merged, stats};

use crate::launch::{measure, run_program, Measured, RunArgs};

/// Arguments of `ztier bench pressure`.
#[derive(Args, Debug)]
#[command(after_long_help = "Example:\n  \
    ztier bench pressure --budgets 256M -- python3 examples/workloads/pyapp.py\n  \
    ztier bench pressure --kernel swap --pairs 4 -- python3 examples/workloads/pyapp-corpus.py 1380000\n\n\
Kernel baselines need root (swapon, cgroups, zram); without root they are skipped\n\
with a message and only native and ztier run. A run that fails or hits --timeout\n\
is a result, not an error: its row says FAILED or TIMEOUT and a line under the\n\
table says how the program ended (signal, exit status).")]
pub struct PressureArgs {
    /// Memory budgets (comma-separated sizes).
    #[arg(long, default_value = "256M")]
    pub budgets: String,
    /// Kernel baselines to run (swap, zswap, zram; comma-separated; "none" for none).
    #[arg(long, default_value = "swap,zswap,zram")]
    pub kernel: String,
    /// Folder for the temporary swap file (must be on a filesystem that supports swap files).
    #[arg(long, default_value = "/var/tmp")]
    pub swap_dir: PathBuf,
    /// Codec of ztier's store.
    #[arg(long, default_value = "lz4")]
    pub codec: String,
    /// Where `ztier run` serves faults (its --fault-path): thread (a handler
    /// thread), signal (the faulting thread, in a SIGBUS handler), or auto
    /// (signal under a user-mode-only userfaultfd, thread otherwise: as
    /// root, thread). Rows served by a handler thread are also priced at
    /// userfaultfd's floor.
    #[arg(long, default_value = "auto", value_parser = ["auto", "thread", "signal"])]
    pub fault_path: String,
    /// What `ztier run`'s budget bounds (its --budget-scope): tree (its processes
    /// share it, as the kernel runs' cgroup limit covers all of them) or process
    /// (each process of the command has the budget).
    #[arg(long, default_value = "tree", value_parser = ["process", "tree"])]
    pub budget_scope: String,
    /// What `ztier run`'s budget counts (its --budget-covers): all (resident
    /// pages, the compressed stores and the library's tables, as a cgroup limit
    /// charges zswap's pool; the default with the tree scope) or resident.
    #[arg(long, value_parser = ["all", "resident"])]
    pub budget_covers: Option<String>,
    /// Seconds after which a kernel-baseline or `ztier run` run is killed
    /// and reported as timed out (memory-cgroup swapping can stall for
    /// minutes). Native runs have no bound.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
    /// After the table's runs, time native and `ztier run` this many more
    /// times at each budget, alternating, and report ztier run's time
    /// against native's pair by pair (median, min–max): on a machine
    /// whose speed drifts, the table's single ratio can be off by a third.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub pairs: u32,
    /// Also run the program under `ztier run --remote` at each budget (the
    /// row "ztier run --remote"): a redis-server on loopback, started for
    /// the row and stopped after it by PID, takes the compressed pages that
    /// do not fit a local store of a quarter of the budget (the spill file
    /// as its fallback).
    #[arg(long)]
    pub remote: bool,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write a chart (SVG) here: wall times as bars, and beside them, for
    /// each `ztier run`, the share of its faults served within a given
    /// time (from its fault service histogram, log scale).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Run every program of this suite file instead of one command (TOML; see
    /// `examples/suites/default.toml` and docs/commands.md): each at its own budget,
    /// with optional arguments for its kernel runs only; one table for the suite.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["budgets", "pairs"])]
    pub suite: Option<PathBuf>,
    /// The program and its arguments.
    #[arg(required_unless_present = "suite", trailing_var_arg = true, allow_hyphen_values = true)]
    pub cmd: Vec<OsString>,
}

/// Where a `ztier run`'s fault service time went (seconds, every
/// process): its `--stats` fields `fault_service_s` and its parts.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub(super) struct FaultTime {
    service: f64,
    lock_wait: f64,
    store_read: f64,
    install: f64,
}

impl FaultTime {
    fn from_stats(s: &serde_json::Value) -> Option<FaultTime> {
        Some(FaultTime {
            service: s[merged::FAULT_SERVICE_S].as_f64()?,
            lock_wait: s[merged::FAULT_LOCK_WAIT_S].as_f64()?,
            store_read: s[merged::FAULT_STORE_READ_S].as_f64()?,
            install: s[merged::FAULT_INSTALL_S].as_f64()?,
        })
    }
}

/// One measured run.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(super) struct Row {
    /// The program's name in a suite.
    pub program: Option<String>,
    pub mode: String,
    pub budget: Option<u64>,
    pub wall_s: f64,
    pub vs_native: f64,
    /// User + system time of the program's processes (threads and
    /// waited-for children included; not the kernel's own threads).
    pub cpu_s: f64,
    pub peak_rss_bytes: u64,
    pub major_faults: u64,
    pub compressed_orig_bytes: Option<u64>,
    pub compressed_bytes: Option<u64>,
    pub same_output: bool,
    /// A finished run whose output is not native's: where the two first
    /// differ ([`first_difference`]).
    pub output_difference: Option<String>,
    pub exit_code: i32,
    pub timed_out: bool,
    /// Kernel baselines in a v1 cgroup: how often a program paused at the
    /// limit was woken (see `wake_oom_waiters`).
    pub oom_wakeups: u64,
    /// ztier run: faults served, and their service time's median, 99th
    /// percentile and mean (µs, decompression included).
    pub faults: Option<u64>,
    pub fault_p50_us: Option<f64>,
    pub fault_p99_us: Option<f64>,
    pub fault_mean_us: Option<f64>,
    /// ztier run: faults served from the store, and those of them that
    /// continued no walk (one page each, no prefetch tried).
    pub store_faults: Option<u64>,
    pub lone_faults: Option<u64>,
    /// ztier run: the handler's service time in all and its parts.
    pub fault_time_s: Option<FaultTime>,
    /// ztier run: pages installed beyond the first of each fault (its
    /// `prefetched`), and the seconds its faults and those pages take at
    /// this machine's userfaultfd floor (`ztier bench uffd`), measured
    /// in the same run: fault service that no store or codec can remove.
    pub further_pages: Option<u64>,
    pub uffd_floor_s: Option<f64>,
    /// The floor itself: a fault's round trip and a further page (µs).
    pub uffd_fault_us: Option<f64>,
    pub uffd_page_us: Option<f64>,
    /// ztier run with `--pairs`: the pairs' ratios of its wall time to
    /// native's, taken pair by pair.
    pub paired: Option<Paired>,
    /// Everything the run held at its most: for a kernel run its cgroup's
    /// peak (resident pages, page cache, and zswap's pool if the kernel
    /// charges it) plus the compressed pool's most (zswap's growth in
    /// `/proc/meminfo`, sampled every 20 ms, or zram's `mem_used_max`,
    /// which no cgroup is charged); for `ztier run` the most its
    /// processes held together (resident managed pages, the compressed
    /// stores and the library's tables: `tree_peak_total_bytes`).
    pub peak_total_bytes: Option<u64>,
    /// Kernel runs: the cgroup's peak, and the compressed pool's most.
    pub cgroup_peak_bytes: Option<u64>,
    pub pool_peak_bytes: Option<u64>,
    /// ztier run: its `--fault-path` (thread or signal).
    pub fault_path: Option<String>,
    /// ztier run: its `--budget-scope` (tree or process).
    pub budget_scope: Option<String>,
    /// ztier run: the fault service histogram, `[bucket upper bound in
    /// ns, count]` of the buckets that counted a fault (its `--stats`
    /// `latency_ns`).
    pub latency_ns: Option<Vec<(u64, u64)>>,
    /// `ztier run --remote`: pages written to and read from the remote
    /// tier, and those that went to its fallback (the spill file).
    pub remote_puts: Option<u64>,
    pub remote_gets: Option<u64>,
    pub remote_fallback_puts: Option<u64>,
}

/// `--pairs`: native and ztier run timed in turn at one budget.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(super) struct Paired {
    pairs: usize,
    /// Median, smallest and largest of the per-pair ratios.
    ratio: f64,
    ratio_min: f64,
    ratio_max: f64,
    /// Median wall times.
    native_s: f64,
    ztier_s: f64,
}

impl Paired {
    /// From the (native, ztier run) wall times of each pair.
    fn of(walls: &[(f64, f64)]) -> Option<Paired> {
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            let m = v.len() / 2;
            if v.len() % 2 == 1 {
                v[m]
            } else {
                (v[m - 1] + v[m]) / 2.0
            }
        };
        if walls.is_empty() {
            return None;
        }
        let ratios: Vec<f64> = walls.iter().map(|&(n, z)| z / n).collect();
        Some(Paired {
            pairs: walls.len(),
            ratio: median(ratios.clone()),
            ratio_min: ratios.iter().copied().fold(f64::INFINITY, f64::min),
            ratio_max: ratios.iter().copied().fold(0.0, f64::max),
            native_s: median(walls.iter().map(|w| w.0).collect()),
            ztier_s: median(walls.iter().map(|w| w.1).collect()),
        })
    }
}

/// Per ztier run row with pairs: its time against native's, pair by pair.
fn paired_lines(rows: &[Row]) -> Vec<String> {
    rows.iter()
        .filter_map(|r| {
            let p = r.paired.as_ref()?;
            Some(format!(
                "at {}M, {} pairs of native and {} in turn: {:.2} × native pair by pair ({:.2}–{:.2}); \
                 medians {:.2} s against {:.2} s",
                r.budget.unwrap_or(0) >> 20,
                p.pairs,
                r.mode,
                p.ratio,
                p.ratio_min,
                p.ratio_max,
                p.ztier_s,
                p.native_s
            ))
        })
        .collect()
}

/// What a row's run came to, as the tables say it.
pub(super) fn outcome(r: &Row) -> &'static str {
    if r.timed_out {
        "TIMEOUT"
    } else if r.same_output {
        "same"
    } else if r.exit_code != 0 {
        "FAILED"
    } else {
        "DIFFERS"
    }
}

/// One undo action and what it restores.
type Undo = (String, Box<dyn FnOnce() -> Result<()>>);

impl Row {
    /// A kernel-baseline row from its measurement.
    fn kernel(
        mode: &str,
        budget: u64,
        m: &Measured,
        native_s: f64,
        difference: Option<String>,
        compressed: Option<u64>,
        oom_wakeups: u64,
    ) -> Row {
        Row {
            mode: mode.into(),
            budget: Some(budget),
            wall_s: m.wall_s,
            vs_native: m.wall_s / native_s,
            cpu_s: m.cpu_s,
            peak_rss_bytes: m.maxrss,
            major_faults: m.majflt,
            compressed_bytes: compressed,
            same_output: m.code == 0 && difference.is_none(),
            output_difference: if m.code == 0 && !m.timed_out { difference } else { None },
            exit_code: m.code,
            timed_out: m.timed_out,
            oom_wakeups,
            ..Default::default()
        }
    }

    /// A kernel row's memory: its cgroup's peak and its compressed pool's.
    fn held(&mut self, cgroup_peak: Option<u64>, pool: u64) {
        self.cgroup_peak_bytes = cgroup_peak;
        self.pool_peak_bytes = Some(pool);
        self.peak_total_bytes = cgroup_peak.map(|c| c + pool);
    }
}

/// Per budget, ztier run's wall time as a fraction of kernel swap to a
/// file's (the issue's yardstick): an upper bound when swap timed out,
/// and none when swap's run failed or gave another output — a run that
/// did not do the work is no yardstick (e.g. xz in a pipeline whose
/// write to the next stage got ENOMEM from a kernel allocation at the
/// v1 limit: swap "finished" in 0.8× native); nor when ztier run did
/// not do it.
fn swap_ratios(rows: &[Row], budgets: &[u64]) -> Vec<String> {
    let mut lines = Vec::new();
    for (&b, zmode) in budgets.iter().flat_map(|b| [(b, "ztier run"), (b, "ztier run --remote")]) {
        let find = |m: &str| rows.iter().find(|r| r.mode == m && r.budget == Some(b));
        let (Some(z), Some(s)) = (find(zmode), find("kernel swap (file)")) else { continue };
        let mb = b >> 20;
        if !z.same_output {
            let why = if z.timed_out {
                "was stopped at the timeout"
            } else if z.exit_code != 0 {
                "failed"
            } else {
                "gave another output than native"
            };
            lines.push(format!("at {mb}M: no ratio to kernel swap to a file: {zmode} {why}"));
            continue;
        }
        if !s.same_output && !s.timed_out {
            let why = if s.exit_code != 0 { "failed" } else { "gave another output than native" };
            lines.push(format!(
                "at {mb}M: no ratio to kernel swap to a file: its run {why} (wall {:.2} s)",
                s.wall_s
            ));
            continue;
        }
        let bound = if s.timed_out { "at most " } else { "" };
        lines.push(format!(
            "at {mb}M: {zmode} takes {bound}{:.3} × the time of kernel swap to a file",
            z.wall_s / s.wall_s
        ));
    }
    lines
}

/// Per row that did not finish on its own: how it ended (the module docs
/// say why a kernel baseline can fail at a v1 limit).
fn failure_lines(rows: &[Row]) -> Vec<String> {
    rows.iter()
        .filter(|r| r.timed_out || r.exit_code != 0)
        .map(|r| {
            let at = r.budget.map_or(String::new(), |b| format!(" at {}M", b >> 20));
            let how = if r.timed_out {
                format!("stopped at the timeout after {:.0} s", r.wall_s)
            } else if r.exit_code > 128 {
                let sig = r.exit_code - 128;
                // SAFETY: strsignal returns a pointer to a static or
                // thread-local NUL-terminated string, read at once.
                let name = unsafe { std::ffi::CStr::from_ptr(libc::strsignal(sig)) };
                format!("killed by signal {sig} ({}), exit status {}", name.to_string_lossy(), r.exit_code)
            } else {
                format!("exited with status {}", r.exit_code)
            };
            format!("{}{at}: the program {how}", r.mode)
        })
        .collect()
}

/// A kernel run that ended with an exit status of its own (not killed,
/// not timed out) where `ztier run` at the same budget finished: the
/// program may have read the cgroup's limit and sized itself from it,
/// which `ztier run`'s budget does not show it. The JVM does: its default
/// heap is a quarter of the memory it sees, so `java -XX:+UseParallelGC`
/// at a 109M limit ended with `OutOfMemoryError: Java heap space` (exit
/// status 1) in all three kernel runs, natively and under `ztier run` it
/// did not.
fn cgroup_sizing_lines(rows: &[Row]) -> Vec<String> {
    let finished =
        |b: Option<u64>| rows.iter().any(|r| r.mode == "ztier run" && r.budget == b && r.exit_code == 0);
    let mut budgets: Vec<u64> = rows
        .iter()
        .filter(|r| r.mode.starts_with("kernel") && !r.timed_out && (1..=128).contains(&r.exit_code))
        .filter(|r| finished(r.budget))
        .filter_map(|r| r.budget)
        .collect();
    budgets.sort_unstable();
    budgets.dedup();
    budgets
        .into_iter()
        .map(|b| {
            format!(
                "at {}M the kernel runs failed where ztier run did not: a program can read its cgroup's \
                 memory limit and size itself from it (the JVM's default heap is a quarter of it; \
                 give -Xmx); ztier run's budget is not shown to the program",
                b >> 20
            )
        })
        .collect()
}

/// Per ztier run row: its fault service times (the issue's latency
/// target is on the median, decompression included).
fn fault_lines(rows: &[Row]) -> Vec<String> {
    rows.iter()
        .filter_map(|r| {
            let (n, p50, p99, mean) = (r.faults?, r.fault_p50_us?, r.fault_p99_us?, r.fault_mean_us?);
            if n == 0 || r.exit_code != 0 {
                // Nothing measured, or a run that failed.
                return None;
            }
            let parts = r.fault_time_s.map_or(String::new(), |t| {
                format!(
                    "; {:.2} s in all: {}",
                    t.service,
                    crate::launch::service_parts(t.service, t.lock_wait, t.store_read, t.install)
                )
            });
            let lone = match (r.store_faults, r.lone_faults) {
                (Some(st), Some(l)) => format!(" ({st} from the store, {l} of them lone pages off any walk)"),
                _ => String::new(),
            };
            let path = match r.fault_path.as_deref() {
                Some("signal") => ", in the faulting thread: signal delivery not counted",
                _ => "",
            };
            Some(format!(
                "fault service at {}M ({}{path}): p50 {p50:.1} µs, p99 {p99:.1} µs, mean {mean:.1} µs over {n} faults{lone}{parts}",
                r.budget.unwrap_or(0) >> 20,
                r.mode
            ))
        })
        .collect()
}

/// What `ztier run`'s budget covered, against the kernel runs' cgroup.
fn scope_line(scope: &str) -> String {
    match scope {
        "tree" => "budget scope tree: ztier run's budget covers the command's processes together, as each \
                   kernel run's cgroup limit does"
            .into(),
        s => format!(
            "budget scope {s}: ztier run's budget is for each process of the command, while each kernel \
             run's cgroup limit covers them together"
        ),
    }
}

/// The `ztier run` settings of a bench run of `cmd` at `budget`.
fn ztier_args(a: &PressureArgs, cmd: &[OsString], budget: u64) -> RunArgs {
    let mut ra = RunArgs::defaults(budget, &a.codec, cmd.to_vec());
    ra.fault_path = a.fault_path.clone();
    ra.budget_scope = Some(a.budget_scope.clone());
    // Everything counted, as the kernel runs' cgroup counts zswap's pool
    // (with the tree scope; a process's own budget counts resident pages).
    ra.budget_covers = a.budget_covers.clone().or_else(|| (a.budget_scope == "tree").then(|| "all".into()));
    // Where the kernel runs' swap file goes, the pages the budget has no
    // room for go (compressed) too.
    ra.spill = Some(a.swap_dir.clone());
    ra
}

/// Per ztier run row with a floor: the seconds its faults and pages take
/// at userfaultfd's floor on this machine, against native's time and the
/// time the run took above it.
fn floor_lines(rows: &[Row]) -> Vec<String> {
    let native = rows.iter().find(|r| r.mode == "native").map(|r| r.wall_s);
    rows.iter()
        .filter_map(|r| {
            let (n, p, f, native) = (r.faults?, r.further_pages?, r.uffd_floor_s?, native?);
            if r.exit_code != 0 || r.timed_out {
                return None;
            }
            Some(format!(
                "at {}M: {n} faults and {p} further pages take {f:.2} s at that floor ({:.2} × native), \
                 of the {:.2} s {} took above native",
                r.budget.unwrap_or(0) >> 20,
                f / native,
                r.wall_s - native,
                r.mode
            ))
        })
        .collect()
}

/// Undo actions, run in reverse order when dropped.
#[derive(Default)]
struct Restore(Vec<Undo>);

impl Restore {
    fn push(&mut self, what: impl Into<String>, f: impl FnOnce() -> Result<()> + 'static) {
        self.0.push((what.into(), Box::new(f)));
    }
    /// Runs the undo actions pushed after `mark` (newest first).
    fn undo_to(&mut self, mark: usize) {
        while self.0.len() > mark {
            let (what, f) = self.0.pop().expect("non-empty");
            if let Err(e) = f() {
                eprintln!("ztier bench pressure: restoring {what} failed: {e:#}");
            }
        }
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        self.undo_to(0);
    }
}

/// Runs a setup or restore command (`swapon`, `swapoff`, `mkswap`,
/// `fallocate`) out of reach of SIGINT, SIGTERM and SIGHUP: in a process
/// group of its own, with those ignored (ignored from before it leaves
/// this process's group: one sent to the group in between killed it).
/// A Ctrl-C at the terminal reaches this process, which undoes what it
/// did in order, but not the command (a `swapoff` killed by it left the
/// swap file on).
fn sh(args: &[&str]) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new(args[0]);
    c.args(&args[1..]).process_group(0);
    // SAFETY: only `signal`, which is async-signal-safe, runs in the child.
    unsafe {
        c.pre_exec(|| {
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(sig, libc::SIG_IGN);
            }
            Ok(())
        })
    };
    let o = c.output().with_context(|| format!("running {}", args[0]))?;
    if !o.status.success() {
        bail!("{} failed ({}): {}", args.join(" "), o.status, String::from_utf8_lossy(&o.stderr).trim());
    }
    Ok(())
}

fn write(path: impl AsRef<Path>, v: &str) -> Result<()> {
    std::fs::write(path.as_ref(), v).with_context(|| format!("writing {v:?} to {}", path.as_ref().display()))
}

/// A memory cgroup made for one run.
struct Cgroup {
    dir: PathBuf,
    /// cgroup v1 (`memory.limit_in_bytes`), whose OOM waits need waking.
    v1: bool,
    limit: u64,
}

/// A memory cgroup limited to `limit` (v1 or v2), removed when `restore`
/// is undone.
fn cgroup(restore: &mut Restore, limit: u64, n: usize) -> Result<Cgroup> {
    let v1 = Path::new("/sys/fs/cgroup/memory");
    let (dir, file) = if v1.join("memory.limit_in_bytes").exists() {
        (v1.join(format!("ztier-bench-{}-{n}", std::process::id())), "memory.limit_in_bytes")
    } else if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        (PathBuf::from(format!("/sys/fs/cgroup/ztier-bench-{}-{n}", std::process::id())), "memory.max")
    } else {
        bail!("no memory cgroup (v1 /sys/fs/cgroup/memory or v2 /sys/fs/cgroup)");
    };
    std::fs::create_dir(&dir).with_context(|| format!("creating cgroup {}", dir.display()))?;
    let d = dir.clone();
    restore.push(format!("cgroup {}", dir.display()), move || {
        // The program has exited; what it left running goes too, and an
        // empty cgroup can be removed.
        empty_cgroup(&d)?;
        for _ in 0..50 {
            if std::fs::remove_dir(&d).is_ok() {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        std::fs::remove_dir(&d).with_context(|| format!("removing {}", d.display()))
    });
    write(dir.join(file), &limit.to_string())?;
    if file == "memory.limit_in_bytes" {
        // v1 kills at the limit while reclaim waits for swap writeback;
        // pause the program instead, as v2's memory.max does (it throttles).
        write(dir.join("memory.oom_control"), "1")?;
    }
    Ok(Cgroup { dir, v1: file == "memory.limit_in_bytes", limit })
}

/// Kills (`SIGKILL`, by PID) every process still in the cgroup `dir`, and
/// waits until it is empty (up to 5 s). A run killed at the timeout loses
/// only the program's own process: a script's server (`redis-server`
/// under `examples/workloads/redis-bgsave.sh`, and its `BGSAVE` child)
/// stayed in the cgroup, which then could not be removed, nor the swap
/// file turned off (its pages were theirs). A program that exits leaving
/// a process behind left it there too.
fn empty_cgroup(dir: &Path) -> Result<()> {
    for _ in 0..50 {
        // Those whose parents died first are ours (see `end_leftovers`):
        // their zombies are reaped here.
        reap_zombies();
        let procs = std::fs::read_to_string(dir.join("cgroup.procs"))
            .with_context(|| format!("reading {}/cgroup.procs", dir.display()))?;
        let pids: Vec<libc::pid_t> = procs.lines().filter_map(|l| l.trim().parse().ok()).collect();
        if pids.is_empty() {
            return Ok(());
        }
        for pid in pids {
            // SAFETY: signalling a process of the cgroup this run made;
            // one that has exited meanwhile makes kill fail, harmlessly.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    bail!("processes are still in {} after SIGKILL", dir.display())
}

/// Reaps every child of this process that has exited, without waiting.
/// Only called between runs, on the thread that starts them: then every
/// child is a leftover of a run (each measured run's own process is
/// reaped by its `wait4` before).
fn reap_zombies() {
    let mut status = 0;
    // SAFETY: waitpid with WNOHANG into a live out-parameter.
    while unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) } > 0 {}
}

/// This process's children now (`/proc/self/task/TID/children`).
fn children() -> Vec<libc::pid_t> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    let mut pids = Vec::new();
    for t in tasks.flatten() {
        if let Ok(c) = std::fs::read_to_string(t.path().join("children")) {
            pids.extend(c.split_whitespace().filter_map(|x| x.parse::<libc::pid_t>().ok()));
        }
    }
    pids
}

/// Ends what a native or `ztier run` run left running, and says so on
/// stderr. `bench pressure` is a child subreaper (`PR_SET_CHILD_SUBREAPER`,
/// set in [`run`]), so a process the program leaves behind (a server its
/// script started and did not stop, or stopped too late) becomes a child
/// of `bench pressure` when its parent exits, instead of going to init
/// and running on into the next runs, whose times it would disturb. Each
/// is killed by PID (`SIGKILL`) and reaped; a killed process's own
/// children come to `bench pressure` in turn and go the same way. Gives
/// up after 10 s (a process can take long to die), naming who is left.
fn end_leftovers(run: &str) {
    end_leftovers_but(run, &[])
}

/// [`end_leftovers`], but for the processes `keep` (a server the bench
/// started for the runs, stopped by its owner).
fn end_leftovers_but(run: &str, keep: &[libc::pid_t]) {
    let t = std::time::Instant::now();
    let mut ended = std::collections::BTreeSet::new();
    loop {
        reap_zombies();
        let pids: Vec<_> = children().into_iter().filter(|p| !keep.contains(p)).collect();
        if pids.is_empty() {
            break;
        }
        if t.elapsed() > std::time::Duration::from_secs(10) {
            eprintln!(
                "ztier bench pressure: after the {run}, processes {pids:?} are still running after SIGKILL"
            );
            break;
        }
        for pid in pids {
            ended.insert(pid);
            // SAFETY: signalling our own child (not yet reaped, so its
            // PID is not reused); again if it is still dying.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    if !ended.is_empty() {
        eprintln!(
            "ztier bench pressure: the {run} left {} process{} running ({}): killed",
            ended.len(),
            if ended.len() == 1 { "" } else { "es" },
            ended.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ")
        );
    }
}

/// While a v1 run goes on: a task paused by v1's disabled OOM killer
/// waits until the cgroup's limit grows or memory of it is uncharged —
/// and a lone program paused while its pages were still being written
/// to swap is woken by neither (runs then stalled until the timeout).
/// So every 20 ms, while `under_oom` says a task waits, the limit is
/// raised by one page and set back at once: raising it wakes the
/// waiters, who retry their charge (reclaim usually succeeds by then),
/// and the limit stays what it was. Returns how many times it woke them.
fn wake_oom_waiters(cg: &Path, limit: u64, stop: &std::sync::atomic::AtomicBool) -> u64 {
    let mut woken = 0;
    let limit_file = cg.join("memory.limit_in_bytes");
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let waiting = std::fs::read_to_string(cg.join("memory.oom_control"))
            .is_ok_and(|s| s.lines().any(|l| l.trim() == "under_oom 1"));
        if waiting {
            let _ = std::fs::write(&limit_file, (limit + 4096).to_string());
            // Setting it back may need a moment of reclaim (EBUSY meanwhile).
            for _ in 0..50 {
                if std::fs::write(&limit_file, limit.to_string()).is_ok() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            woken += 1;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    woken
}

/// The cgroup's peak memory use (v1 `memory.max_usage_in_bytes`, v2
/// `memory.peak`), if it says.
fn cgroup_peak(cg: &Cgroup) -> Option<u64> {
    let file = if cg.v1 { "memory.max_usage_in_bytes" } else { "memory.peak" };
    std::fs::read_to_string(cg.dir.join(file)).ok()?.trim().parse().ok()
}

/// zswap's pool now (`Zswap:` of `/proc/meminfo`, bytes).
fn zswap_pool() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let l = m.lines().find(|l| l.starts_with("Zswap:"))?;
            l.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kib| kib << 10)
}

/// Runs `cmd` inside `cg` (moved in by a shell before exec), stdout to
/// `out`; also returns how often OOM waiters were woken (v1), and the
/// memory it held: the cgroup's peak, and how far zswap's pool grew
/// above what it was at the start (sampled every 20 ms).
fn run_in_cgroup(
    cg: &Cgroup,
    cmd: &[OsString],
    out: &Path,
    timeout: u64,
) -> Result<(Measured, u64, (Option<u64>, u64))> {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(format!("echo $$ > {}/cgroup.procs && exec \"$@\"", cg.dir.display()))
        .arg("sh")
        .args(cmd);
    c.stdout(std::fs::File::create(out)?);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let waker = cg.v1.then(|| {
        let (dir, limit, stop) = (cg.dir.clone(), cg.limit, stop.clone());
        std::thread::spawn(move || wake_oom_waiters(&dir, limit, &stop))
    });
    let pool = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let start = zswap_pool();
            let mut most = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(zswap_pool().saturating_sub(start));
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            most
        })
    };
    let m = crate::launch::measure_with_timeout(&mut c, Some(std::time::Duration::from_secs(timeout)));
    let peak = cgroup_peak(cg);
    // What the program left in the cgroup goes before the next run (the
    // OOM waiter still runs: a task paused at the limit must get to exit).
    let emptied = empty_cgroup(&cg.dir);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let woken = waker.map_or(0, |w| w.join().unwrap_or(0));
    let pool = pool.join().unwrap_or(0);
    emptied?;
    Ok((m?, woken, (peak, pool)))
}

fn swap_file(restore: &mut Restore, dir: &Path, size: u64) -> Result<()> {
    let path = dir.join(format!("ztier-bench-{}.swap", std::process::id()));
    let p = path.clone();
    restore.push(format!("swap file {}", path.display()), move || {
        let _ = sh(&["swapoff", &p.to_string_lossy()]);
        std::fs::remove_file(&p).or_else(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Ok(())
            } else {
                Err(e)
            }
        })?;
        Ok(())
    });
    let ps = path.to_string_lossy().into_owned();
    sh(&["fallocate", "-l", &size.to_string(), &ps])?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    sh(&["mkswap", "-q", &ps])?;
    sh(&["swapon", &ps])?;
    Ok(())
}

fn zswap(restore: &mut Restore, on: bool) -> Result<()> {
    let p = "/sys/module/zswap/parameters/enabled";
    let old = std::fs::read_to_string(p).context("zswap is not available (no /sys/module/zswap)")?;
    let old = old.trim().to_string();
    restore.push("zswap enabled flag", move || write(p, &old));
    write(p, if on { "Y" } else { "N" })
}

/// A zram swap device of `size` bytes; returns its mm_stat path.
fn zram(restore: &mut Restore, size: u64) -> Result<PathBuf> {
    let id = std::fs::read_to_string("/sys/class/zram-control/hot_add")
        .context("zram is not available (no /sys/class/zram-control; load the zram module)")?;
    let id = id.trim().to_string();
    let dev = format!("/dev/zram{id}");
    let sys = PathBuf::from(format!("/sys/block/zram{id}"));
    let (d2, s2, id2) = (dev.clone(), sys.clone(), id.clone());
    restore.push(format!("zram device {dev}"), move || {
        let _ = sh(&["swapoff", &d2]);
        let _ = write(s2.join("reset"), "1");
        write("/sys/class/zram-control/hot_remove", &id2)
    });
    let algos = std::fs::read_to_string(sys.join("comp_algorithm")).unwrap_or_default();
    if algos.split_whitespace().any(|a| a.trim_matches(|c| c == '[' || c == ']') == "lz4") {
        write(sys.join("comp_algorithm"), "lz4")?;
    }
    write(sys.join("disksize"), &size.to_string())?;
    sh(&["mkswap", "-q", &dev])?;
    sh(&["swapon", "-p", "32767", &dev])?;
    Ok(sys.join("mm_stat"))
}

/// Where the output in `other` first differs from native's in `native`
/// (`None`: the same): the line and both versions of it, or which one
/// ends first. "DIFFERS" alone left the reader to guess (a worker killed
/// under the limit, a line cut short, a number off).
fn first_difference(native: &Path, other: &Path) -> Option<String> {
    let (a, b) = match (std::fs::read(native), std::fs::read(other)) {
        (Ok(a), Ok(b)) if a == b => return None,
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return Some(format!("its output could not be read: {e}")),
    };
    let show = |l: &[u8]| {
        let t = String::from_utf8_lossy(l);
        let cut: String = t.chars().take(72).collect();
        if cut.len() < t.len() {
            format!("{cut:?}…")
        } else {
            format!("{cut:?}")
        }
    };
    let lines = |x: &[u8]| -> Vec<Vec<u8>> {
        let mut l: Vec<Vec<u8>> = x.split(|&c| c == b'\n').map(<[u8]>::to_vec).collect();
        if x.ends_with(b"\n") {
            l.pop();
        }
        l
    };
    let (la, lb) = (lines(&a), lines(&b));
    let k = la.iter().zip(&lb).take_while(|(x, y)| x == y).count();
    let count = |n: usize| if n == 1 { "1 line".to_string() } else { format!("{n} lines") };
    Some(match (la.get(k), lb.get(k)) {
        (Some(x), Some(y)) => format!("line {}: native {}, this run {}", k + 1, show(x), show(y)),
        (None, None) => "the same lines, but one of the two ends without a newline".into(),
        // One is the other cut short (or carried on), line by line.
        _ => format!(
            "this run has {} where native has {} (the same up to there)",
            count(lb.len()),
            count(la.len())
        ),
    })
}

/// Stops the benchmark (its guards undo what it changed) if a SIGINT,
/// SIGTERM or SIGHUP has come.
fn go_on() -> Result<()> {
    if crate::launch::interrupted() {
        bail!("interrupted");
    }
    Ok(())
}

/// Where [`exclusive`] locks.
const LOCK_FILE: &str = "/run/lock/ztier-bench-pressure.lock";

/// One `ztier bench pressure` with kernel baselines at a time: two
/// change the same settings (each saved the other's zswap flag as the
/// one to put back, and zswap was left on; each one's runs had both swap
/// files). The lock is held as long as the returned file is open.
fn exclusive() -> Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let path = if Path::new("/run/lock").is_dir() {
        PathBuf::from(LOCK_FILE)
    } else {
        std::env::temp_dir().join("ztier-bench-pressure.lock")
    };
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening the lock {}", path.display()))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        bail!(
            "another `ztier bench pressure` with kernel baselines is running (it holds {}): the two would \
             change the same swap, zswap and zram settings; wait for it to end, or run this one with \
             --kernel none",
            path.display()
        );
    }
    Ok(f)
}

/// Can `dir` hold a swap file? Checked before anything runs: a folder
/// that is missing, not one, not writable or on tmpfs (which has no swap
/// files) was found only after the native run, which can take minutes.
fn check_swap_dir(dir: &Path) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let meta = std::fs::metadata(dir).with_context(|| format!("--swap-dir {}", dir.display()))?;
    if !meta.is_dir() {
        bail!("--swap-dir {}: not a folder", dir.display());
    }
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: a NUL-terminated path, which access only reads.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK) } != 0 {
        bail!("--swap-dir {}: cannot write there: {}", dir.display(), std::io::Error::last_os_error());
    }
    if crate::launch::fs_type(dir) == Some(libc::TMPFS_MAGIC) {
        bail!("--swap-dir {}: on tmpfs, which cannot hold a swap file (use a disk's folder)", dir.display());
    }
    Ok(())
}

/// `ztier bench pressure` without `--suite` (the suite is `bench_pressure_suite`'s).
pub fn run(a: PressureArgs) -> Result<i32> {
    // Caught from here on: a signal sets a flag, the run in progress is
    // passed it, and the benchmark stops at its next step with every
    // setting put back. (Caught only while a program ran, a Ctrl-C during
    // a setting's change or undoing killed the benchmark, and left swap
    // on, zswap enabled, a cgroup and a zram device behind.) Made first,
    // so dropped last: after the guards have run.
    let _signals = crate::launch::CatchSignals::new();
    let budgets = crate::units::parse_size_list(&a.budgets)
        .map_err(|e| anyhow::anyhow!("--budgets {}: {e}", a.budgets))?;
    if let Some(b) = budgets.iter().find(|&&b| b < crate::launch::MIN_BUDGET) {
        bail!("--budgets: {b} bytes is too small (at least {} MiB)", crate::launch::MIN_BUDGET >> 20);
    }
    if a.timeout == 0 {
        bail!("--timeout 0: every run would be killed at once (at least 1 s)");
    }
    let mut b = Bench::new(&a)?;
    let p = Program {
        name: None,
        cmd: a.cmd.clone(),
        kernel_cmd: a.cmd.clone(),
        budgets: budgets.clone(),
        timeout: a.timeout,
        output: OutputRule::Same,
        dir: b.work.clone(),
    };
    let (mut rows, paired_differs) = measure_program(&mut b, &p)?;
    // Every kernel setting was undone after its run; this removes the
    // work folder.
    drop(b);
    go_on()?;
    let floor = price_at_floor(&mut rows);
    let title = a.cmd.iter().map(|s| s.to_string_lossy()).collect::<Vec<_>>().join(" ");
    report(&mut std::io::stdout().lock(), &title, &rows, floor.as_ref(), &budgets)?;
    if let Some(p) = &a.json {
        std::fs::write(p, crate::launch::pretty(&serde_json::to_value(&rows)?)? + "\n")?;
    }
    if let Some(p) = &a.plot {
        plot(p, &rows)?;
    }
    // Kernel runs that timed out or were killed are results, not errors;
    // a finished run with different output is.
    let differs = paired_differs || rows.iter().any(|r| !r.same_output && r.exit_code == 0 && !r.timed_out);
    Ok(if differs || !rows.iter().any(|r| r.mode == "ztier run" && r.same_output) { 1 } else { 0 })
}

/// How a run's output is checked against native's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum OutputRule {
    /// Byte for byte the same.
    Same,
    /// Not compared (a program whose output differs from run to run):
    /// the exit status alone says it finished.
    Status,
}

/// One program to measure.
pub(super) struct Program {
    /// Its name in a suite.
    pub name: Option<String>,
    pub cmd: Vec<OsString>,
    /// The command of its kernel runs (`cmd` with a suite's `kernel_args`).
    pub kernel_cmd: Vec<OsString>,
    pub budgets: Vec<u64>,
    /// Seconds (kernel and `ztier run` runs).
    pub timeout: u64,
    pub output: OutputRule,
    /// Where its outputs go.
    pub dir: PathBuf,
}

impl Program {
    /// Where the output in `other` differs from native's (`None`: the
    /// same, or not compared).
    fn difference(&self, native: &Path, other: &Path) -> Option<String> {
        match self.output {
            OutputRule::Same => first_difference(native, other),
            OutputRule::Status => None,
        }
    }
}

/// What every program's runs share: the kernel modes, the lock, the
/// work folder and the guards that undo what was changed.
pub(super) struct Bench<'a> {
    pub a: &'a PressureArgs,
    pub kernel: Vec<String>,
    pub work: PathBuf,
    /// Dropped first: undoes every setting, removes the work folder.
    restore: Restore,
    cg_n: usize,
    _lock: Option<std::fs::File>,
}

impl<'a> Bench<'a> {
    /// Checks the kernel modes and the swap folder, takes the lock (with
    /// kernel modes), becomes a child subreaper and makes the work folder.
    pub fn new(a: &'a PressureArgs) -> Result<Bench<'a>> {
        let kernel: Vec<String> = a
            .kernel
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty() && s != "none")
            .collect();
        for k in &kernel {
            if !["swap", "zswap", "zram"].contains(&k.as_str()) {
                bail!("--kernel {k}: use swap, zswap, zram or none");
            }
        }
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if !kernel.is_empty() && !root {
            eprintln!(
                "ztier bench pressure: kernel baselines ({}) need root (swapon, cgroups, zram): skipped",
                kernel.join(",")
            );
        }
        let kernel = if root { kernel } else { Vec::new() };
        let _lock = if kernel.is_empty() { None } else { Some(exclusive()?) };
        if kernel.iter().any(|k| k == "swap" || k == "zswap") {
            check_swap_dir(&a.swap_dir)?;
        }
        // What a run leaves running becomes ours when its parent exits, to be
        // ended before the next run (`end_leftovers`).
        // SAFETY: a prctl that sets a flag of this process.
        if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
            eprintln!(
                "ztier bench pressure: cannot become a child subreaper ({}): what a run leaves running is not ended",
                std::io::Error::last_os_error()
            );
        }
        let work = std::env::temp_dir().join(format!("ztier-bench-pressure-{}", std::process::id()));
        std::fs::create_dir_all(&work)?;
        let mut restore = Restore::default();
        let w2 = work.clone();
        restore.push("work folder", move || Ok(std::fs::remove_dir_all(&w2)?));

        Ok(Bench { a, kernel, work, restore, cg_n: 0, _lock })
    }
}

/// Measures one program: natively, under each kernel mode and `ztier
/// run` at each budget, then `--pairs`; the rows, and whether a pair's
/// output differed.
pub(super) fn measure_program(b: &mut Bench, p: &Program) -> Result<(Vec<Row>, bool)> {
    std::fs::create_dir_all(&p.dir)?;
    // Native runs, the yardstick, have no time bound (Ctrl-C ends them).
    let timeout = std::time::Duration::from_secs(p.timeout);
    let mut rows: Vec<Row> = Vec::new();
    let dir = &p.dir;
    let native_out = dir.join("native.out");
    eprintln!("native ...");
    let mut c = Command::new(&p.cmd[0]);
    c.args(&p.cmd[1..]).stdout(std::fs::File::create(&native_out)?);
    let n = measure(&mut c)?;
    end_leftovers("native run");
    if crate::launch::interrupted() {
        bail!("interrupted");
    }
    if n.code != 0 {
        bail!("the program failed natively (exit {})", n.code);
    }
    rows.push(Row {
        mode: "native".into(),
        program: p.name.clone(),
        wall_s: n.wall_s,
        vs_native: 1.0,
        cpu_s: n.cpu_s,
        peak_rss_bytes: n.maxrss,
        major_faults: n.majflt,
        same_output: true,
        exit_code: 0,
        timed_out: false,
        oom_wakeups: 0,
        ..Default::default()
    });
    let swap_size = (n.maxrss * 2).max(512 << 20);
    for &budget in &p.budgets {
        let file_modes: Vec<&str> =
            ["swap", "zswap"].into_iter().filter(|m| b.kernel.iter().any(|k| k == m)).collect();
        if !file_modes.is_empty() {
            let mark = b.restore.0.len();
            go_on()?;
            swap_file(&mut b.restore, &b.a.swap_dir, swap_size)?;
            for mode in file_modes {
                let zmark = b.restore.0.len();
                go_on()?;
                zswap(&mut b.restore, mode == "zswap")?;
                b.cg_n += 1;
                let cg = cgroup(&mut b.restore, budget, b.cg_n)?;
                go_on()?;
                eprintln!("{mode} at {} MiB ...", budget >> 20);
                let out = dir.join(format!("{mode}-{budget}.out"));
                let (m, woken, mem) = run_in_cgroup(&cg, &p.kernel_cmd, &out, p.timeout)?;
                b.restore.undo_to(zmark);
                if crate::launch::interrupted() {
                    bail!("interrupted");
                }
                let name = if mode == "swap" { "kernel swap (file)" } else { "kernel zswap" };
                rows.push(Row::kernel(
                    name,
                    budget,
                    &m,
                    n.wall_s,
                    p.difference(&native_out, &out),
                    None,
                    woken,
                ));
                rows.last_mut().expect("pushed").held(mem.0, mem.1);
            }
            b.restore.undo_to(mark);
        }
        if b.kernel.iter().any(|k| k == "zram") {
            let mark = b.restore.0.len();
            go_on()?;
            let mm = zram(&mut b.restore, swap_size)?;
            b.cg_n += 1;
            let cg = cgroup(&mut b.restore, budget, b.cg_n)?;
            go_on()?;
            eprintln!("zram at {} MiB ...", budget >> 20);
            let out = dir.join(format!("zram-{budget}.out"));
            let (m, woken, mem) = run_in_cgroup(&cg, &p.kernel_cmd, &out, p.timeout)?;
            // mm_stat: orig_data_size compr_data_size mem_used_total mem_limit mem_used_max ...
            let stat: Vec<u64> = std::fs::read_to_string(&mm)
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            b.restore.undo_to(mark);
            if crate::launch::interrupted() {
                bail!("interrupted");
            }
            rows.push(Row::kernel(
                "kernel zram",
                budget,
                &m,
                n.wall_s,
                p.difference(&native_out, &out),
                stat.get(4).copied(),
                woken,
            ));
            // zram's pool is not charged to the cgroup: its most used.
            rows.last_mut().expect("pushed").held(mem.0, stat.get(4).copied().unwrap_or(0));
        }
        go_on()?;
        eprintln!("ztier run at {} MiB ...", budget >> 20);
        let out = dir.join(format!("ztier-{budget}.out"));
        let r =
            run_program(&ztier_args(b.a, &p.cmd, budget), Some(std::fs::File::create(&out)?), Some(timeout))?;
        end_leftovers("ztier run");
        if crate::launch::interrupted() {
            bail!("interrupted");
        }
        rows.push(ztier_row("ztier run", p, budget, &r, n.wall_s, &native_out, &out));
        if b.a.remote {
            rows.push(remote_row(b, p, budget, n.wall_s, &native_out)?);
        }
    }
    // --pairs: native and ztier run in turn, each output checked.
    let mut paired_differs = false;
    for &budget in &p.budgets {
        let mut walls = Vec::new();
        for i in 1..=b.a.pairs {
            eprintln!("pair {i} of {} at {} MiB: native, then ztier run ...", b.a.pairs, budget >> 20);
            let out = dir.join("pair-native.out");
            let mut c = Command::new(&p.cmd[0]);
            c.args(&p.cmd[1..]).stdout(std::fs::File::create(&out)?);
            let m = measure(&mut c)?;
            end_leftovers("native run");
            if crate::launch::interrupted() {
                bail!("interrupted");
            }
            let out_z = dir.join("pair-ztier.out");
            let r = run_program(
                &ztier_args(b.a, &p.cmd, budget),
                Some(std::fs::File::create(&out_z)?),
                Some(timeout),
            )?;
            end_leftovers("ztier run");
            if crate::launch::interrupted() {
                bail!("interrupted");
            }
            if m.code != 0
                || r.code != 0
                || p.difference(&native_out, &out).is_some()
                || p.difference(&native_out, &out_z).is_some()
            {
                eprintln!(
                    "ztier bench pressure: pair {i} at {} MiB: native exit {}, ztier run exit {}{}, \
                     outputs {} and {} the first native run's",
                    budget >> 20,
                    m.code,
                    r.code,
                    if r.timed_out { " (killed at the timeout)" } else { "" },
                    if p.difference(&native_out, &out).is_none() { "same as" } else { "differ from" },
                    if p.difference(&native_out, &out_z).is_none() { "same as" } else { "differ from" },
                );
                paired_differs = true;
                continue;
            }
            walls.push((m.wall_s, r.stats[merged::WALL_S].as_f64().unwrap_or(0.0)));
        }
        if let Some(z) = rows.iter_mut().find(|r| r.mode == "ztier run" && r.budget == Some(budget)) {
            z.paired = Paired::of(&walls);
        }
    }
    for r in &mut rows {
        r.program.clone_from(&p.name);
    }
    Ok((rows, paired_differs))
}

/// The row of a `ztier run` (`mode`) at `budget`, from its result and
/// stats.
fn ztier_row(
    mode: &str,
    p: &Program,
    budget: u64,
    r: &crate::launch::RunOutcome,
    native_wall: f64,
    native_out: &Path,
    out: &Path,
) -> Row {
    let s = &r.stats;
    // What the library's processes wrote at exit: nothing to trust
    // from a run killed at the timeout.
    let lib = if r.timed_out { &serde_json::Value::Null } else { s };
    let wall = s[merged::WALL_S].as_f64().unwrap_or(0.0);
    Row {
        mode: mode.into(),
        budget: Some(budget),
        wall_s: wall,
        vs_native: wall / native_wall,
        cpu_s: s[merged::CPU_S].as_f64().unwrap_or(0.0),
        peak_rss_bytes: s[merged::PEAK_RSS_BYTES].as_u64().unwrap_or(0),
        major_faults: s[merged::MAJOR_FAULTS].as_u64().unwrap_or(0),
        compressed_orig_bytes: lib[stats::ORIG_BYTES].as_u64(),
        compressed_bytes: lib[stats::STORED_BYTES].as_u64(),
        same_output: r.code == 0 && !r.timed_out && p.difference(native_out, out).is_none(),
        output_difference: if r.code == 0 && !r.timed_out { p.difference(native_out, out) } else { None },
        exit_code: r.code,
        timed_out: r.timed_out,
        oom_wakeups: 0,
        faults: lib[stats::FAULTS].as_u64(),
        fault_p50_us: lib[stats::FAULT_P50_US].as_f64(),
        fault_p99_us: lib[stats::FAULT_P99_US].as_f64(),
        fault_mean_us: lib[merged::FAULT_MEAN_US].as_f64(),
        store_faults: lib[stats::STORE_FAULTS].as_u64(),
        lone_faults: lib[stats::LONE_FAULTS].as_u64(),
        fault_time_s: FaultTime::from_stats(lib),
        further_pages: lib[stats::PREFETCHED].as_u64(),
        fault_path: s[stats::FAULT_PATH].as_str().map(Into::into),
        program: p.name.clone(),
        peak_total_bytes: s[merged::TREE_PEAK_TOTAL_BYTES].as_u64(),
        budget_scope: lib[merged::BUDGET_SCOPE].as_str().map(Into::into),
        latency_ns: lib[stats::LATENCY_NS]
            .as_array()
            .map(|h| h.iter().filter_map(|p| Some((p[0].as_u64()?, p[1].as_u64()?))).collect()),
        ..Default::default()
    }
}

/// The row "ztier run --remote" at `budget` (`--remote`): a redis-server
/// on loopback started for it (by [`Testbed`](ztier_remote::testbed::Testbed),
/// stopped by its PID when the row is done), a local store of a quarter
/// of the budget, the spill file as the remote's fallback.
fn remote_row(b: &Bench, p: &Program, budget: u64, native_wall: f64, native_out: &Path) -> Result<Row> {
    go_on()?;
    let bed = ztier_remote::testbed::Testbed::single(&Default::default())
        .context("starting a redis-server on loopback for the --remote row")?;
    let keep: Vec<libc::pid_t> =
        bed.servers.iter().filter_map(|s| s.pid()).map(|p| p as libc::pid_t).collect();
    eprintln!("ztier run --remote at {} MiB (redis-server {}) ...", budget >> 20, bed.url());
    let mut ra = ztier_args(b.a, &p.cmd, budget);
    ra.store = Some(budget / 4);
    ra.remote.remote = Some(bed.url());
    let out = p.dir.join(format!("remote-{budget}.out"));
    let r = run_program(
        &ra,
        Some(std::fs::File::create(&out)?),
        Some(std::time::Duration::from_secs(p.timeout)),
    )?;
    end_leftovers_but("ztier run --remote", &keep);
    drop(bed);
    end_leftovers("ztier run --remote");
    if crate::launch::interrupted() {
        bail!("interrupted");
    }
    let mut row = ztier_row("ztier run --remote", p, budget, &r, native_wall, native_out, &out);
    let remote = if r.timed_out { &serde_json::Value::Null } else { &r.stats[stats::REMOTE] };
    row.remote_puts = remote["remote_puts"].as_u64();
    row.remote_gets = remote["remote_gets"].as_u64();
    row.remote_fallback_puts = remote["fallback_puts"].as_u64();
    Ok(row)
}

/// The mechanism's own cost here, measured now (the machine's speed
/// drifts between runs and days; ~1 s), and each `ztier run` row served
/// by a handler thread priced at it.
pub(super) fn price_at_floor(rows: &mut [Row]) -> Option<ztier_uffd::floor::Floor> {
    eprintln!("userfaultfd floor ...");
    match ztier_uffd::floor::measure(16384, 8) {
        Ok(f) => {
            // The floor is a handler thread's round trip: not the path of
            // faults served in the faulting thread.
            for r in rows.iter_mut().filter(|r| r.fault_path.as_deref() == Some("thread")) {
                if let (Some(n), Some(p)) = (r.faults, r.further_pages) {
                    r.uffd_floor_s = Some(f.service_floor_s(n, p));
                    (r.uffd_fault_us, r.uffd_page_us) = (Some(f.fault_us), Some(f.page_us));
                }
            }
            Some(f)
        }
        Err(e) => {
            eprintln!("ztier bench pressure: could not measure userfaultfd's floor: {e}");
            None
        }
    }
}

/// The table of one program's rows and the lines under it.
pub(super) fn report(
    o: &mut impl Write,
    title: &str,
    rows: &[Row],
    floor: Option<&ztier_uffd::floor::Floor>,
    budgets: &[u64],
) -> Result<()> {
    writeln!(o, "ztier bench pressure: {title}")?;
    writeln!(
        o,
        "{:<20} {:>8} {:>9} {:>8} {:>7} {:>10} {:>10} {:>10} {:>22} {:>7}",
        "mode",
        "budget",
        "wall s",
        "× native",
        "CPU s",
        "peak RSS",
        "peak held",
        "maj.flt",
        "compressed (orig→mem)",
        "output"
    )?;
    for r in rows {
        let comp = match (r.compressed_orig_bytes, r.compressed_bytes) {
            (Some(a), Some(b)) => format!("{:.0} → {:.0} MB", a as f64 / 1e6, b as f64 / 1e6),
            (None, Some(b)) => format!("peak {:.0} MB", b as f64 / 1e6),
            _ => "-".into(),
        };
        writeln!(
            o,
            "{:<20} {:>8} {:>9.2} {:>8.2} {:>7.2} {:>7.0} MB {:>10} {:>10} {:>22} {:>7}",
            r.mode,
            r.budget.map_or("-".into(), |b| format!("{}M", b >> 20)),
            r.wall_s,
            r.vs_native,
            r.cpu_s,
            r.peak_rss_bytes as f64 / 1e6,
            r.peak_total_bytes.map_or("-".into(), |b| format!("{:.0} MB", b as f64 / 1e6)),
            r.major_faults,
            comp,
            outcome(r)
        )?;
    }
    if let Some(scope) = rows.iter().find_map(|r| r.budget_scope.as_deref()) {
        writeln!(o, "{}", scope_line(scope))?;
    }
    if rows.iter().any(|r| r.peak_total_bytes.is_some()) {
        writeln!(
            o,
            "peak held: a kernel run's cgroup peak + its compressed pool's most (zswap's growth, zram's \
             mem_used_max); ztier run's resident managed pages + stores + tables of all its processes"
        )?;
    }
    for r in rows.iter().filter(|r| r.oom_wakeups > 0) {
        writeln!(
            o,
            "{} at {}M: paused at the cgroup limit and woken {} times",
            r.mode,
            r.budget.unwrap_or(0) >> 20,
            r.oom_wakeups
        )?;
    }
    for line in failure_lines(rows).into_iter().chain(cgroup_sizing_lines(rows)) {
        writeln!(o, "{line}")?;
    }
    for r in rows {
        if let Some(d) = &r.output_difference {
            let at = r.budget.map_or(String::new(), |b| format!(" at {}M", b >> 20));
            writeln!(o, "{}{at}: the output differs from native's: {d}", r.mode)?;
        }
    }
    for line in fault_lines(rows) {
        writeln!(o, "{line}")?;
    }
    if let Some(f) = floor {
        writeln!(o, "{}", super::bench_uffd::floor_line(f))?;
        for line in floor_lines(rows) {
            writeln!(o, "{line}")?;
        }
    }
    for line in swap_ratios(rows, budgets) {
        writeln!(o, "{line}")?;
    }
    for r in rows {
        if let (Some(p), Some(g), Some(f)) = (r.remote_puts, r.remote_gets, r.remote_fallback_puts) {
            let at = r.budget.map_or(0, |b| b >> 20);
            writeln!(
                o,
                "{} at {at}M: {p} pages written to the remote tier, {g} read back, {f} to its fallback",
                r.mode
            )?;
        }
    }
    for line in paired_lines(rows) {
        writeln!(o, "{line}")?;
    }
    Ok(())
}

/// Grouped bars: wall time per mode, one group per budget (native first).
fn plot(path: &Path, rows: &[Row]) -> Result<()> {
    use plotters::prelude::*;
    let curves: Vec<(String, Vec<(f64, f64)>)> = rows
        .iter()
        .filter_map(|r| {
            Some((r.budget.map_or(String::new(), |b| format!("{}M", b >> 20)), cdf(r.latency_ns.as_ref()?)?))
        })
        .collect();
    let whole = SVGBackend::new(path, (if curves.is_empty() { 900 } else { 1400 }, 500)).into_drawing_area();
    whole.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (root, right) = whole.split_horizontally(900);
    if !curves.is_empty() {
        // Fault service times of each `ztier run` row: the share of faults
        // served within x µs, on a log scale.
        let top = curves.iter().flat_map(|c| c.1.last()).map(|p| p.0).fold(1.0, f64::max);
        let low = curves.iter().flat_map(|c| c.1.first()).map(|p| p.0 / 1.5).fold(top, f64::min).max(0.1);
        let mut chart = ChartBuilder::on(&right)
            .caption("ztier run: faults served within (µs)", ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d((low..top * 1.2).log_scale(), 0f64..1.0)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        chart
            .configure_mesh()
            .x_desc("fault service (µs)")
            .y_desc("share of faults")
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let colors = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
        for (i, (label, points)) in curves.iter().enumerate() {
            let c = colors[i % colors.len()];
            chart
                .draw_series(LineSeries::new(points.iter().copied(), c.stroke_width(2)))
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .label(format!("at {label}"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let max = rows.iter().map(|r| r.wall_s).fold(0.0, f64::max) * 1.15;
    let n = rows.len();
    let mut chart = ChartBuilder::on(&root)
        .caption("wall time under memory pressure (s)", ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(70)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..n as f64, 0f64..max)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart.configure_mesh().disable_x_mesh().disable_x_axis().draw().map_err(|e| anyhow::anyhow!("{e}"))?;
    let colors = [BLACK, RED, MAGENTA, CYAN, BLUE];
    let modes = ["native", "kernel swap (file)", "kernel zswap", "kernel zram", "ztier run"];
    for (i, r) in rows.iter().enumerate() {
        let c = colors[modes.iter().position(|m| *m == r.mode).unwrap_or(0)];
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(i as f64 + 0.1, 0.0), (i as f64 + 0.9, r.wall_s)],
                c.mix(0.7).filled(),
            )))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let label = format!("{} {}", r.mode, r.budget.map_or(String::new(), |b| format!("{}M", b >> 20)));
        chart
            .draw_series(std::iter::once(Text::new(
                label,
                (i as f64 + 0.1, -max * 0.04),
                ("sans-serif", 11).into_font(),
            )))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        chart
            .draw_series(std::iter::once(Text::new(
                if r.wall_s < 10.0 { format!("{:.2}s", r.wall_s) } else { format!("{:.1}s", r.wall_s) },
                (i as f64 + 0.25, r.wall_s + max * 0.02),
                ("sans-serif", 12).into_font(),
            )))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    whole.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

/// The cumulative share of faults served within each bucket's upper bound
/// (µs), from a `latency_ns` histogram; `None` if it counted none.
fn cdf(hist: &[(u64, u64)]) -> Option<Vec<(f64, f64)>> {
    let total: u64 = hist.iter().map(|b| b.1).sum();
    if total == 0 {
        return None;
    }
    let mut seen = 0;
    Some(
        hist.iter()
            .map(|&(bound, count)| {
                seen += count;
                (bound as f64 / 1000.0, seen as f64 / total as f64)
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(mode: &str, wall_s: f64, same_output: bool, exit_code: i32, timed_out: bool) -> Row {
        Row {
            mode: mode.into(),
            budget: Some(256 << 20),
            wall_s,
            same_output,
            exit_code,
            timed_out,
            ..Default::default()
        }
    }

    #[test]
    fn a_different_output_says_where_it_differs() {
        let d = std::env::temp_dir().join(format!("ztier-diff-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let (a, b) = (d.join("native.out"), d.join("run.out"));
        let cmp = |x: &str, y: &str| {
            std::fs::write(&a, x).unwrap();
            std::fs::write(&b, y).unwrap();
            first_difference(&a, &b)
        };
        assert_eq!(cmp("w 0 ab\nw 1 cd\n", "w 0 ab\nw 1 cd\n"), None);
        assert_eq!(
            cmp(
                "worker 0 3f2a 17\nworker 1 9c1e 18\ndone 2\n",
                "worker 0 3f2a 17\nworker 1 ended by signal 9\ndone 2\n"
            )
            .unwrap(),
            r#"line 2: native "worker 1 9c1e 18", this run "worker 1 ended by signal 9""#
        );
        assert_eq!(
            cmp("a\nb\nc\n", "a\n").unwrap(),
            "this run has 1 line where native has 3 lines (the same up to there)"
        );
        assert_eq!(
            cmp("a\nb", "a\nb\n").unwrap(),
            "the same lines, but one of the two ends without a newline"
        );
        let long = "x".repeat(100);
        let d2 = cmp(&format!("{long}1\n"), &format!("{long}2\n")).unwrap();
        assert!(d2.starts_with(&format!("line 1: native \"{}\"…, this run", "x".repeat(72))), "{d2}");
        std::fs::remove_file(&b).unwrap();
        assert!(first_difference(&a, &b).unwrap().starts_with("its output could not be read: "));
        // A kernel row: kept only for a run that finished.
        let m = Measured { code: 0, wall_s: 1.0, maxrss: 0, majflt: 0, cpu_s: 0.0, timed_out: false, pid: 1 };
        let r = Row::kernel("kernel zswap", 48 << 20, &m, 1.0, Some("line 2: …".into()), None, 0);
        assert!(!r.same_output && r.output_difference.is_some());
        let m = Measured { code: 137, ..m };
        let r = Row::kernel("kernel zswap", 48 << 20, &m, 1.0, Some("line 2: …".into()), None, 0);
        assert!(!r.same_output && r.output_difference.is_none(), "its failure line says why");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_latency_curve_climbs_to_all_faults() {
        assert_eq!(cdf(&[]), None);
        assert_eq!(cdf(&[(1700, 0)]), None);
        assert_eq!(
            cdf(&[(1700, 1), (1800, 2), (250_000, 1)]).unwrap(),
            [(1.7, 0.25), (1.8, 0.75), (250.0, 1.0)]
        );
    }

    #[test]
    fn runs_that_did_not_finish_say_how_they_ended() {
        let rows = [
            row("native", 5.0, true, 0, false),
            row("kernel swap (file)", 120.0, true, 0, false),
            row("kernel zswap", 50.0, false, 139, false),
            row("kernel zram", 300.0, false, 0, true),
            row("ztier run", 15.0, false, 3, false),
        ];
        let lines = failure_lines(&rows);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(
            lines[0].starts_with("kernel zswap at 256M: the program killed by signal 11 ("),
            "{}",
            lines[0]
        );
        assert!(lines[0].contains("fault") && lines[0].ends_with("exit status 139"), "{}", lines[0]);
        assert_eq!(lines[1], "kernel zram at 256M: the program stopped at the timeout after 300 s");
        assert_eq!(lines[2], "ztier run at 256M: the program exited with status 3");
    }

    #[test]
    fn kernel_runs_that_fail_where_ztier_run_finishes_get_a_hint() {
        let hint = |zswap: (i32, bool), ztier: i32| {
            cgroup_sizing_lines(&[
                row("native", 1.1, true, 0, false),
                row("kernel swap (file)", 11.7, false, 1, false),
                row("kernel zswap", 11.6, false, zswap.0, zswap.1),
                row("ztier run", 4.3, true, ztier, false),
            ])
        };
        let lines = hint((1, false), 0);
        assert_eq!(lines.len(), 1, "one line a budget: {lines:?}");
        assert!(
            lines[0].starts_with("at 256M the kernel runs failed where ztier run did not"),
            "{}",
            lines[0]
        );
        assert!(lines[0].contains("-Xmx"), "{}", lines[0]);
        assert!(hint((1, false), 1).is_empty(), "ztier run failed too: no hint");
        // Killed by a signal or stopped at the timeout: not a program's
        // own decision, so no hint from those rows alone.
        let only = |r: Row| cgroup_sizing_lines(&[r, row("ztier run", 4.3, true, 0, false)]);
        assert!(only(row("kernel zram", 50.0, false, 139, false)).is_empty());
        assert!(only(row("kernel zram", 300.0, false, 0, true)).is_empty());
        assert_eq!(only(row("kernel zram", 9.0, false, 1, false)).len(), 1);
    }

    #[test]
    fn fault_times_are_reported_for_ztier_rows_only() {
        let mut z = row("ztier run", 12.0, true, 0, false);
        (z.faults, z.fault_p50_us, z.fault_p99_us, z.fault_mean_us) =
            (Some(462_545), Some(5.5), Some(83.8), Some(11.2));
        let mut with_parts = z.clone();
        with_parts.fault_time_s = FaultTime::from_stats(&serde_json::json!({
            "fault_service_s": 5.2, "fault_lock_wait_s": 0.4, "fault_store_read_s": 2.5, "fault_install_s": 1.8
        }));
        with_parts.store_faults = Some(450_000);
        with_parts.lone_faults = Some(120_000);
        let lines = fault_lines(&[
            row("native", 4.0, true, 0, false),
            row("kernel zram", 35.0, true, 0, false),
            z,
            with_parts,
        ]);
        assert_eq!(
            lines,
            [
                "fault service at 256M (ztier run): p50 5.5 µs, p99 83.8 µs, mean 11.2 µs over 462545 faults",
                "fault service at 256M (ztier run): p50 5.5 µs, p99 83.8 µs, mean 11.2 µs over 462545 faults \
                 (450000 from the store, 120000 of them lone pages off any walk); \
                 5.20 s in all: lock wait 0.40 s, store reads 2.50 s, installs 1.80 s, the rest 0.50 s"
            ]
        );
        // A file without the parts (a library from before them): no parts.
        assert_eq!(FaultTime::from_stats(&serde_json::json!({ "fault_service_s": 1.0 })), None);
    }

    #[test]
    fn the_floor_is_reported_for_ztier_rows_against_native() {
        let mut z = row("ztier run", 30.0, true, 0, false);
        (z.faults, z.further_pages) = (Some(700_000), Some(1_400_000));
        let f = ztier_uffd::floor::Floor {
            cpu: 0,
            pages: 16384,
            run: 8,
            anon_fault_us: 2.5,
            fault_us: 10.0,
            page_us: 2.0,
        };
        z.uffd_floor_s = Some(f.service_floor_s(700_000, 1_400_000));
        let lines =
            floor_lines(&[row("native", 10.0, true, 0, false), row("kernel zram", 80.0, true, 0, false), z]);
        assert_eq!(
            lines,
            ["at 256M: 700000 faults and 1400000 further pages take 9.80 s at that floor (0.98 × native), \
              of the 20.00 s ztier run took above native"]
        );
    }

    #[test]
    fn pairs_are_taken_pair_by_pair() {
        // The ratio is the median of the pairs' own ratios, not the ratio
        // of the medians: a slow pair slows both of its runs.
        let p = Paired::of(&[(10.0, 20.0), (20.0, 30.0), (12.0, 30.0)]).unwrap();
        assert_eq!(p.pairs, 3);
        assert_eq!((p.ratio, p.ratio_min, p.ratio_max), (2.0, 1.5, 2.5));
        assert_eq!((p.native_s, p.ztier_s), (12.0, 30.0));
        let even = Paired::of(&[(10.0, 20.0), (10.0, 30.0)]).unwrap();
        assert_eq!((even.ratio, even.native_s, even.ztier_s), (2.5, 10.0, 25.0));
        assert_eq!(Paired::of(&[]), None);
        let mut z = row("ztier run", 30.0, true, 0, false);
        z.paired = Some(p);
        let lines = paired_lines(&[row("native", 10.0, true, 0, false), z]);
        assert_eq!(
            lines,
            ["at 256M, 3 pairs of native and ztier run in turn: 2.00 × native pair by pair (1.50–2.50); \
              medians 30.00 s against 12.00 s"]
        );
    }

    #[test]
    fn the_swap_ratio_needs_a_swap_run_that_did_the_work() {
        let b = [256 << 20];
        let z = row("ztier run", 20.0, true, 0, false);
        let ok = swap_ratios(&[row("kernel swap (file)", 80.0, true, 0, false), z.clone()], &b);
        assert_eq!(ok, ["at 256M: ztier run takes 0.250 × the time of kernel swap to a file"]);
        let slow = swap_ratios(&[row("kernel swap (file)", 100.0, false, -1, true), z.clone()], &b);
        assert_eq!(slow, ["at 256M: ztier run takes at most 0.200 × the time of kernel swap to a file"]);
        let differs = swap_ratios(&[row("kernel swap (file)", 11.5, false, 0, false), z.clone()], &b);
        assert_eq!(
            differs,
            ["at 256M: no ratio to kernel swap to a file: its run gave another output than native (wall 11.50 s)"]
        );
        let failed = swap_ratios(&[row("kernel swap (file)", 3.0, false, 1, false), z], &b);
        assert!(failed[0].contains("its run failed"), "{failed:?}");
        // Nor a ztier run that did not do the work.
        let swap = row("kernel swap (file)", 80.0, true, 0, false);
        let stopped = swap_ratios(&[swap.clone(), row("ztier run", 60.0, false, 137, true)], &b);
        assert_eq!(
            stopped,
            ["at 256M: no ratio to kernel swap to a file: ztier run was stopped at the timeout"]
        );
        let z_failed = swap_ratios(&[swap, row("ztier run", 2.0, false, 1, false)], &b);
        assert_eq!(z_failed, ["at 256M: no ratio to kernel swap to a file: ztier run failed"]);
        // The remote row gets its own line, after the spill file's.
        let both = swap_ratios(
            &[
                row("kernel swap (file)", 80.0, true, 0, false),
                row("ztier run --remote", 40.0, true, 0, false),
                row("ztier run", 20.0, true, 0, false),
            ],
            &b,
        );
        assert_eq!(
            both,
            [
                "at 256M: ztier run takes 0.250 × the time of kernel swap to a file",
                "at 256M: ztier run --remote takes 0.500 × the time of kernel swap to a file"
            ]
        );
    }
}
