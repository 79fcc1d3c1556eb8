//! `ztier bench pressure --suite FILE`: every program of a suite file
//! under the same pressure, natively, under each kernel mode and under
//! `ztier run`, and one table for the suite: per program its wall time
//! against native's and against the best kernel mode's (the fastest of
//! those that finished with native's output), CPU time against that
//! mode's, the most memory each held, `ztier run`'s fault service p50 and
//! p99, and the time it took above native against userfaultfd's floor;
//! then the geometric means. Under it, each program's own table (as
//! `bench pressure` prints it for one command).
//!
//! The suite file is TOML:
//!
//! ```toml
//! timeout = 300                 # seconds a kernel or ztier run may take (default: --timeout)
//!
//! [[program]]
//! name = "node-workers"         # unique; letters, digits, '-', '_', '.'
//! cmd = ["node", "examples/workloads/workers.js"]
//! budget = "280M"               # the cgroup limit of the kernel runs, ztier run's --budget
//! kernel_args = ["--max-old-space-size=2048"]   # optional: after cmd[0], kernel runs only
//! output = "same"               # optional: "same" (byte for byte native's) or "status" (exit 0)
//! timeout = 200                 # optional, this program's
//! ```
//!
//! `kernel_args` is for a program that sizes itself from the cgroup's
//! limit (V8's heap, the JVM's): the same program told its heap may be
//! larger, which `ztier run` (whose budget the program cannot see) does
//! not need. Commands run in the current folder. A file that does not
//! parse, an unknown key, a bad budget or a program not found is an error
//! naming the line, before anything runs.

use std::ffi::OsString;
use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};

use super::bench_pressure::{
    measure_program, outcome, price_at_floor, report, Bench, OutputRule, PressureArgs, Program, Row,
};

/// The suite file.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SuiteFile {
    timeout: Option<u64>,
    program: Vec<toml::Spanned<Entry>>,
}

/// One program of it.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    cmd: Vec<String>,
    budget: toml::Spanned<String>,
    #[serde(default)]
    kernel_args: Vec<String>,
    output: Option<OutputRule>,
    timeout: Option<u64>,
}

/// A program of the suite, checked: its name, the line it starts on,
/// and what to run.
#[derive(Debug)]
pub(super) struct SuiteProgram {
    pub name: String,
    pub line: usize,
    pub cmd: Vec<OsString>,
    pub kernel_cmd: Vec<OsString>,
    pub budget: u64,
    pub output: OutputRule,
    pub timeout: u64,
}

/// The line of byte offset `at` in `text` (from 1).
fn line_of(text: &str, at: usize) -> usize {
    text[..at.min(text.len())].matches('\n').count() + 1
}

/// Reads a suite from `text` (named `path` in errors); `timeout` is
/// `--timeout`, for programs that give none.
pub(super) fn parse(path: &Path, text: &str, timeout: u64) -> Result<Vec<SuiteProgram>> {
    let f: SuiteFile = toml::from_str(text).map_err(|e| {
        let at = e.span().map_or(":".to_string(), |s| format!(" line {}:", line_of(text, s.start)));
        anyhow::anyhow!("{}{at} {}", path.display(), e.message())
    })?;
    if f.program.is_empty() {
        bail!("{}: no [[program]] in the suite", path.display());
    }
    let mut seen = std::collections::BTreeMap::new();
    let mut out = Vec::new();
    for sp in &f.program {
        let line = line_of(text, sp.span().start);
        let e = sp.get_ref();
        let at =
            |what: String| anyhow::anyhow!("{} line {line}: program {:?}: {what}", path.display(), e.name);
        if e.name.is_empty() || !e.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return Err(at("a name is letters, digits, '-', '_' and '.'".into()));
        }
        if let Some(first) = seen.insert(e.name.clone(), line) {
            return Err(at(format!("the name is taken already (line {first})")));
        }
        if e.cmd.is_empty() || e.cmd[0].is_empty() {
            return Err(at("cmd is empty".into()));
        }
        let budget = crate::units::parse_size(e.budget.get_ref()).map_err(|err| {
            anyhow::anyhow!(
                "{} line {}: program {:?}: budget {:?}: {err}",
                path.display(),
                line_of(text, e.budget.span().start),
                e.name,
                e.budget.get_ref()
            )
        })?;
        if budget < crate::launch::MIN_BUDGET {
            return Err(at(format!("budget {:?} is too small (at least 1M)", e.budget.get_ref())));
        }
        let timeout = e.timeout.or(f.timeout).unwrap_or(timeout);
        if timeout == 0 {
            return Err(at("timeout 0: every run would be killed at once (at least 1 s)".into()));
        }
        if found(&e.cmd[0]).is_none() {
            return Err(at(format!("{:?} is not a file or a program on PATH", e.cmd[0])));
        }
        let cmd: Vec<OsString> = e.cmd.iter().map(OsString::from).collect();
        let mut kernel_cmd = vec![cmd[0].clone()];
        kernel_cmd.extend(e.kernel_args.iter().map(OsString::from));
        kernel_cmd.extend(cmd[1..].iter().cloned());
        out.push(SuiteProgram {
            name: e.name.clone(),
            line,
            cmd,
            kernel_cmd,
            budget,
            output: e.output.unwrap_or(OutputRule::Same),
            timeout,
        });
    }
    Ok(out)
}

/// `cmd` as a path (with a '/') or found on `PATH`.
fn found(cmd: &str) -> Option<std::path::PathBuf> {
    if cmd.contains('/') {
        return Path::new(cmd).is_file().then(|| cmd.into());
    }
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(cmd)).find(|p| p.is_file())
}

/// One program's line of the suite table.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub(super) struct Summary {
    pub program: String,
    pub budget: u64,
    pub native_s: f64,
    /// Wall seconds of each kernel mode that ran (`None`: it did not
    /// finish with native's output).
    pub swap_s: Option<f64>,
    pub zswap_s: Option<f64>,
    pub zram_s: Option<f64>,
    pub ztier_s: Option<f64>,
    /// The fastest kernel mode that finished with native's output.
    pub best_kernel: Option<String>,
    pub ztier_vs_native: Option<f64>,
    pub ztier_vs_best: Option<f64>,
    /// `ztier run`'s CPU time against the best kernel mode's.
    pub cpu_vs_best: Option<f64>,
    /// The most memory held (see `Row::peak_total_bytes`).
    pub best_held_bytes: Option<u64>,
    pub ztier_held_bytes: Option<u64>,
    pub fault_p50_us: Option<f64>,
    pub fault_p99_us: Option<f64>,
    /// `ztier run`'s time above native against what its faults and
    /// pages take at userfaultfd's floor.
    pub above_native_vs_floor: Option<f64>,
    /// same, FAILED, TIMEOUT or DIFFERS (`ztier run`'s).
    pub ztier_output: String,
}

/// The suite line of one program from its rows.
pub(super) fn summarize(name: &str, budget: u64, rows: &[Row]) -> Summary {
    let find = |m: &str| rows.iter().find(|r| r.mode == m);
    let ok = |m: &str| find(m).filter(|r| r.same_output).map(|r| r.wall_s);
    let native_s = find("native").map_or(0.0, |r| r.wall_s);
    let best = rows
        .iter()
        .filter(|r| r.mode.starts_with("kernel") && r.same_output)
        .min_by(|a, b| a.wall_s.total_cmp(&b.wall_s));
    let z = find("ztier run");
    let zok = z.filter(|r| r.same_output);
    Summary {
        program: name.into(),
        budget,
        native_s,
        swap_s: ok("kernel swap (file)"),
        zswap_s: ok("kernel zswap"),
        zram_s: ok("kernel zram"),
        ztier_s: zok.map(|r| r.wall_s),
        best_kernel: best.map(|b| b.mode.trim_start_matches("kernel ").into()),
        ztier_vs_native: zok.map(|r| r.wall_s / native_s),
        ztier_vs_best: zok.zip(best).map(|(z, b)| z.wall_s / b.wall_s),
        cpu_vs_best: zok.zip(best).filter(|(_, b)| b.cpu_s > 0.0).map(|(z, b)| z.cpu_s / b.cpu_s),
        best_held_bytes: best.and_then(|b| b.peak_total_bytes),
        ztier_held_bytes: z.and_then(|r| r.peak_total_bytes),
        fault_p50_us: zok.and_then(|r| r.fault_p50_us),
        fault_p99_us: zok.and_then(|r| r.fault_p99_us),
        above_native_vs_floor: zok
            .and_then(|r| Some((r.wall_s - native_s) / r.uffd_floor_s.filter(|&f| f > 0.0)?)),
        ztier_output: z.map_or("-", outcome).into(),
    }
}

/// The geometric mean of the values given (`None` if none).
pub(super) fn geomean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let (mut sum, mut n) = (0.0, 0);
    for x in v.filter(|x| *x > 0.0) {
        sum += x.ln();
        n += 1;
    }
    (n > 0).then(|| (sum / n as f64).exp())
}

/// The suite table and its geometric means.
pub(super) fn suite_table(o: &mut impl Write, s: &[Summary]) -> Result<()> {
    let secs = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.2}"));
    let ratio = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.2}"));
    let mb = |v: Option<u64>| v.map_or("-".to_string(), |x| format!("{:.0}", x as f64 / 1e6));
    let us = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.0}"));
    writeln!(
        o,
        "{:<18} {:>6} {:>7} {:>7} {:>7} {:>7} {:>7} {:>6} {:>6} {:>6} {:>6} {:>11} {:>9} {:>6} {:>7}",
        "program",
        "budget",
        "native",
        "swap",
        "zswap",
        "zram",
        "ztier",
        "×nat",
        "×best",
        "best",
        "CPU×b",
        "held MB b/z",
        "p50/p99µs",
        "×floor",
        "output"
    )?;
    for r in s {
        writeln!(
            o,
            "{:<18} {:>6} {:>7.2} {:>7} {:>7} {:>7} {:>7} {:>6} {:>6} {:>6} {:>6} {:>11} {:>9} {:>6} {:>7}",
            r.program,
            format!("{}M", r.budget >> 20),
            r.native_s,
            secs(r.swap_s),
            secs(r.zswap_s),
            secs(r.zram_s),
            secs(r.ztier_s),
            ratio(r.ztier_vs_native),
            ratio(r.ztier_vs_best),
            r.best_kernel.as_deref().unwrap_or("-"),
            ratio(r.cpu_vs_best),
            format!("{}/{}", mb(r.best_held_bytes), mb(r.ztier_held_bytes)),
            format!("{}/{}", us(r.fault_p50_us), us(r.fault_p99_us)),
            ratio(r.above_native_vs_floor),
            r.ztier_output
        )?;
    }
    let g = |f: fn(&Summary) -> Option<f64>| geomean(s.iter().filter_map(f));
    let n = |f: fn(&Summary) -> Option<f64>| s.iter().filter_map(f).count();
    writeln!(
        o,
        "geometric mean over the programs with a ratio: ztier run {} × native ({} programs), {} × the best \
         kernel mode ({} programs), CPU {} × the best kernel mode's",
        ratio(g(|r| r.ztier_vs_native)),
        n(|r| r.ztier_vs_native),
        ratio(g(|r| r.ztier_vs_best)),
        n(|r| r.ztier_vs_best),
        ratio(g(|r| r.cpu_vs_best)),
    )?;
    writeln!(
        o,
        "swap/zswap/zram/ztier: wall seconds of runs that finished with native's output; ×best: ztier run \
         against the fastest of those kernel modes; CPU×b: CPU time against that mode's; held: the most \
         memory the best kernel mode held (cgroup peak + compressed pool) / ztier run held (resident + \
         stores + tables); ×floor: ztier run's time above native against what its faults take at \
         userfaultfd's floor"
    )?;
    Ok(())
}

/// `ztier bench pressure --suite FILE`.
pub fn run(a: &PressureArgs, suite: &Path) -> Result<i32> {
    // First, so dropped last (see `bench_pressure::run`).
    let _signals = crate::launch::CatchSignals::new();
    if !a.cmd.is_empty() {
        bail!("--suite FILE runs the suite's programs: give no command after it");
    }
    if a.timeout == 0 {
        bail!("--timeout 0: every run would be killed at once (at least 1 s)");
    }
    let text = std::fs::read_to_string(suite).with_context(|| format!("--suite {}", suite.display()))?;
    let programs = parse(suite, &text, a.timeout)?;
    let mut b = Bench::new(a)?;
    let mut all: Vec<(String, u64, Vec<OsString>, Vec<Row>)> = Vec::new();
    let mut failed_natively = Vec::new();
    for (i, sp) in programs.iter().enumerate() {
        eprintln!("[{}/{}] {} at {} MiB", i + 1, programs.len(), sp.name, sp.budget >> 20);
        let p = Program {
            name: Some(sp.name.clone()),
            cmd: sp.cmd.clone(),
            kernel_cmd: sp.kernel_cmd.clone(),
            budgets: vec![sp.budget],
            timeout: sp.timeout,
            output: sp.output,
            dir: b.work.join(format!("{i}-{}", sp.name)),
        };
        match measure_program(&mut b, &p) {
            Ok((rows, _)) => all.push((sp.name.clone(), sp.budget, sp.cmd.clone(), rows)),
            Err(e) if !crate::launch::interrupted() => {
                eprintln!("ztier bench pressure: {} (line {}): {e:#}", sp.name, sp.line);
                failed_natively.push(format!("{} (line {}): {e:#}", sp.name, sp.line));
            }
            Err(e) => return Err(e),
        }
    }
    // Every setting was undone after its run; this removes the work folder.
    drop(b);
    let mut rows: Vec<Row> = all.iter().flat_map(|p| p.3.iter().cloned()).collect();
    let floor = price_at_floor(&mut rows);
    // The rows again per program, priced at the floor.
    let mut k = 0;
    for p in &mut all {
        let n = p.3.len();
        p.3 = rows[k..k + n].to_vec();
        k += n;
    }
    let summaries: Vec<Summary> = all.iter().map(|(n, b, _, r)| summarize(n, *b, r)).collect();
    let mut o = std::io::stdout().lock();
    writeln!(o, "ztier bench pressure --suite {} ({} programs)", suite.display(), programs.len())?;
    suite_table(&mut o, &summaries)?;
    for f in &failed_natively {
        writeln!(o, "not measured: {f}")?;
    }
    if let Some(f) = &floor {
        writeln!(o, "{}", super::bench_uffd::floor_line(f))?;
    }
    for (name, budget, cmd, r) in &all {
        writeln!(o)?;
        let title =
            format!("{name}: {}", cmd.iter().map(|s| s.to_string_lossy()).collect::<Vec<_>>().join(" "));
        report(&mut o, &title, r, None, &[*budget])?;
    }
    if let Some(p) = &a.json {
        let v = serde_json::json!({ "programs": summaries, "rows": rows, "not_measured": failed_natively });
        std::fs::write(p, crate::launch::pretty(&v)? + "\n")?;
    }
    if let Some(p) = &a.plot {
        plot(p, &summaries)?;
    }
    let bad = summaries.iter().any(|s| s.ztier_output != "same") || !failed_natively.is_empty();
    Ok(i32::from(bad))
}

/// A mode's bar: its name, its wall time in a summary, its colour.
type Bar = (&'static str, fn(&Summary) -> Option<f64>, plotters::style::RGBColor);

/// Bars per program: each mode's wall time against native's (log scale).
fn plot(path: &Path, s: &[Summary]) -> Result<()> {
    use plotters::prelude::*;
    let e = |e: &dyn std::fmt::Display| anyhow::anyhow!("{e}");
    let modes: [Bar; 4] = [
        ("swap", |r| r.swap_s, RED),
        ("zswap", |r| r.zswap_s, MAGENTA),
        ("zram", |r| r.zram_s, CYAN),
        ("ztier run", |r| r.ztier_s, BLUE),
    ];
    let top =
        s.iter().flat_map(|r| modes.iter().filter_map(|m| Some(m.1(r)? / r.native_s))).fold(2.0, f64::max)
            * 1.3;
    let root = SVGBackend::new(path, ((120 * s.len() as u32).max(600) + 100, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut chart = ChartBuilder::on(&root)
        .caption("wall time under memory pressure, × native (log scale)", ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(60)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..s.len() as f64, (0.5f64..top).log_scale())
        .map_err(|x| e(&x))?;
    chart.configure_mesh().disable_x_mesh().disable_x_axis().draw().map_err(|x| e(&x))?;
    for (i, r) in s.iter().enumerate() {
        for (j, (label, f, c)) in modes.iter().enumerate() {
            let Some(v) = f(r) else { continue };
            let x = i as f64 + 0.1 + j as f64 * 0.2;
            let s = chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x, 0.5), (x + 0.18, v / r.native_s)],
                    c.mix(0.7).filled(),
                )))
                .map_err(|x| e(&x))?;
            if i == 0 {
                let c = *c;
                s.label(*label)
                    .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], c.filled()));
            }
        }
        chart
            .draw_series(std::iter::once(Text::new(
                r.program.clone(),
                (i as f64 + 0.05, 0.5 / 1.08),
                ("sans-serif", 11).into_font(),
            )))
            .map_err(|x| e(&x))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<Vec<SuiteProgram>> {
        parse(Path::new("s.toml"), text, 300)
    }

    #[test]
    fn a_suite_file_is_read_with_its_kernel_arguments() {
        let s = p("timeout = 120\n\n[[program]]\nname = \"node\"\ncmd = [\"sh\", \"-c\", \"echo 1\"]\n\
                   budget = \"150M\"\nkernel_args = [\"-e\"]\n\n[[program]]\nname = \"b\"\ncmd = [\"true\"]\n\
                   budget = \"64M\"\noutput = \"status\"\ntimeout = 9\n")
        .unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(
            (s[0].line, s[0].budget, s[0].timeout, s[0].output),
            (3, 150 << 20, 120, OutputRule::Same)
        );
        assert_eq!(s[0].cmd, ["sh", "-c", "echo 1"]);
        assert_eq!(s[0].kernel_cmd, ["sh", "-e", "-c", "echo 1"], "kernel_args go after the program");
        assert_eq!((s[1].line, s[1].timeout, s[1].output), (9, 9, OutputRule::Status));
    }

    #[test]
    fn a_bad_suite_file_is_refused_naming_the_line() {
        let err = |t: &str| p(t).unwrap_err().to_string();
        let e = err("[[program]]\nname = \"a\"\ncmd = [\"true\"]\nbudget = \"12Q\"\n");
        assert!(e.starts_with("s.toml line 4: program \"a\": budget \"12Q\": "), "{e}");
        let e = err("[[program]]\nname = \"a\"\ncmd = [\"true\"]\nbudget = \"64M\"\nkernel_arg = []\n");
        assert!(e.starts_with("s.toml line 5: unknown field `kernel_arg`"), "{e}");
        let e = err("[[program]]\nname = \"a\"\ncmd = [\"true\"\n");
        assert!(e.starts_with("s.toml line 3: "), "{e}");
        let e = err("[[program]]\nname = \"a\"\ncmd = [\"true\"]\nbudget = \"64M\"\n\n\
                     [[program]]\nname = \"a\"\ncmd = [\"true\"]\nbudget = \"64M\"\n");
        assert_eq!(e, "s.toml line 6: program \"a\": the name is taken already (line 1)");
        let e = err("[[program]]\nname = \"a\"\ncmd = [\"no-such-program-ztier\"]\nbudget = \"64M\"\n");
        assert!(e.contains("line 1: program \"a\": \"no-such-program-ztier\" is not a file"), "{e}");
        let e = err("[[program]]\nname = \"a\"\ncmd = []\nbudget = \"64M\"\n");
        assert!(e.ends_with("cmd is empty"), "{e}");
        let e = err("[[program]]\nname = \"a\"\ncmd = [\"true\"]\nbudget = \"64M\"\noutput = \"close\"\n");
        assert!(e.starts_with("s.toml line 5: unknown variant `close`"), "{e}");
        assert_eq!(err("timeout = 5\n"), "s.toml line 1: missing field `program`");
        let e = err("[[program]]\nname = \"a\"\ncmd = [\"true\"]\nbudget = \"512K\"\n");
        assert!(e.ends_with("is too small (at least 1M)"), "{e}");
    }

    fn row(mode: &str, wall_s: f64, cpu_s: f64, same: bool) -> Row {
        Row {
            mode: mode.into(),
            budget: Some(64 << 20),
            wall_s,
            cpu_s,
            same_output: same,
            exit_code: if same { 0 } else { 1 },
            ..Default::default()
        }
    }

    #[test]
    fn the_best_kernel_mode_is_the_fastest_that_did_the_work() {
        let mut z = row("ztier run", 6.0, 9.0, true);
        z.peak_total_bytes = Some(60 << 20);
        let mut zram = row("kernel zram", 8.0, 6.0, true);
        zram.peak_total_bytes = Some(90 << 20);
        let rows = [
            row("native", 2.0, 2.0, true),
            row("kernel swap (file)", 30.0, 5.0, true),
            row("kernel zswap", 1.0, 1.0, false),
            zram,
            z,
        ];
        let s = summarize("x", 64 << 20, &rows);
        assert_eq!(s.best_kernel.as_deref(), Some("zram"), "zswap failed: no yardstick");
        assert_eq!((s.swap_s, s.zswap_s, s.zram_s, s.ztier_s), (Some(30.0), None, Some(8.0), Some(6.0)));
        assert_eq!((s.ztier_vs_native, s.ztier_vs_best, s.cpu_vs_best), (Some(3.0), Some(0.75), Some(1.5)));
        assert_eq!((s.best_held_bytes, s.ztier_held_bytes), (Some(90 << 20), Some(60 << 20)));
        assert_eq!(s.ztier_output, "same");
        // No kernel mode finished: no ratio to one.
        let s = summarize("y", 64 << 20, &[row("native", 2.0, 2.0, true), row("ztier run", 4.0, 4.0, true)]);
        assert_eq!((s.best_kernel, s.ztier_vs_best, s.ztier_vs_native), (None, None, Some(2.0)));
        let s = summarize("y", 64 << 20, &[row("native", 2.0, 2.0, true), row("ztier run", 4.0, 4.0, false)]);
        assert_eq!((s.ztier_s, s.ztier_vs_native, s.ztier_output.as_str()), (None, None, "FAILED"));
    }

    #[test]
    fn the_geometric_mean_is_of_the_ratios_given() {
        assert_eq!(geomean([].into_iter()), None);
        assert!((geomean([0.5, 2.0].into_iter()).unwrap() - 1.0).abs() < 1e-12);
        assert!((geomean([0.25, 1.0, 4.0, 8.0].into_iter()).unwrap() - 8f64.powf(0.25)).abs() < 1e-12);
    }
}
