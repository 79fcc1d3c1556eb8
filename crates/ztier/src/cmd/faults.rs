//! `ztier faults LOG.csv` — a summary of one process's `ztier run
//! --fault-log` file (its format is drawn in `ztier-preload`'s
//! `faultlog.rs`): rows and pages by kind, store faults by the pages
//! they installed with their service times, refault distances, how often
//! the same pages came back, and page-ins over time.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use ztier_run_core::faultlog::{self, Kind, Row};

use crate::units::parse_size;

/// Arguments of `ztier faults`.
#[derive(Args, Debug)]
#[command(after_long_help = "Example:\n  \
    ztier run --budget 256M --fault-log faults -- python3 job.py\n  \
    ztier faults faults/12345.csv --budget 256M")]
pub struct FaultsArgs {
    /// A PID.csv that `ztier run --fault-log DIR` wrote.
    pub log: PathBuf,
    /// The run's --budget: refault distances are then given in budgets too.
    #[arg(long, value_parser = parse_size)]
    pub budget: Option<u64>,
    /// Time slices of the timeline.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub slices: u32,
}

/// Parses a fault log; an error names the line.
pub fn parse(text: &str) -> Result<Vec<Row>> {
    Ok(faultlog::parse(text)?)
}

/// The value at quantile `q` of sorted `v` (0 if empty).
fn quantile(v: &[u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// The summary, as printed.
pub fn summary(rows: &[Row], budget_pages: Option<u64>, slices: u32) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let (first, last) = (rows.first().map_or(0, |r| r.t_ns), rows.last().map_or(0, |r| r.t_ns));
    let secs = |ns: u64| ns as f64 / 1e9;
    let _ = writeln!(out, "{} rows from {:.3} s to {:.3} s", rows.len(), secs(first), secs(last));
    let _ = writeln!(out, "{:<10} {:>10} {:>12}", "kind", "rows", "pages");
    for k in Kind::ALL {
        let (n, p) =
            rows.iter().filter(|r| r.kind == k).fold((0u64, 0u64), |(n, p), r| (n + 1, p + r.pages as u64));
        let _ = writeln!(out, "{:<10} {n:>10} {p:>12}", k.name());
    }
    let store: Vec<&Row> = rows.iter().filter(|r| r.kind == Kind::Store).collect();
    if !store.is_empty() {
        let _ = writeln!(out, "store faults by pages installed (service inside the lock):");
        for (label, lo, hi) in [("1", 1, 1), ("2-7", 2, 7), ("8", 8, 8), ("9+", 9, u64::MAX)] {
            let mut t: Vec<u64> = store
                .iter()
                .filter(|r| r.pages as u64 >= lo && r.pages as u64 <= hi)
                .map(|r| r.service_ns as u64)
                .collect();
            t.sort_unstable();
            let _ = writeln!(
                out,
                "  {label:<4} {:>10} faults  p50 {:>7.2} µs  p99 {:>7.2} µs  in all {:.3} s",
                t.len(),
                quantile(&t, 0.5) as f64 / 1e3,
                quantile(&t, 0.99) as f64 / 1e3,
                t.iter().sum::<u64>() as f64 / 1e9
            );
        }
        let mut d: Vec<u64> = store.iter().filter_map(|r| r.distance()).map(u64::from).collect();
        d.sort_unstable();
        let q = [0.1, 0.5, 0.9].map(|q| quantile(&d, q));
        let hot = store.iter().filter(|r| r.hot).count();
        let _ = write!(out, "refault distance p10 / p50 / p90: {} / {} / {} evictions", q[0], q[1], q[2]);
        if let Some(b) = budget_pages.filter(|&b| b > 0) {
            let _ = write!(
                out,
                " ({:.2} / {:.2} / {:.2} budgets)",
                q[0] as f64 / b as f64,
                q[1] as f64 / b as f64,
                q[2] as f64 / b as f64
            );
        }
        let _ = writeln!(
            out,
            "; {hot} faults ({:.1}%) joined the protected segment",
            100.0 * hot as f64 / store.len() as f64
        );
        let mut times: HashMap<u64, u32> = HashMap::new();
        for r in &store {
            for k in 0..r.pages as u64 {
                *times.entry(r.addr + k * 4096).or_default() += 1;
            }
        }
        let mut by = [0u64; 4];
        for &n in times.values() {
            by[match n {
                1 => 0,
                2..=3 => 1,
                4..=8 => 2,
                _ => 3,
            }] += 1;
        }
        let _ = writeln!(
            out,
            "pages brought back from the store: {} distinct; once {}, 2-3 times {}, 4-8 times {}, 9 or more {}",
            times.len(),
            by[0],
            by[1],
            by[2],
            by[3]
        );
    }
    if last > first {
        let width = (last - first) / slices as u64 + 1;
        let mut pages = vec![[0u64; 2]; slices as usize];
        for r in rows.iter().filter(|r| matches!(r.kind, Kind::Store | Kind::Zero)) {
            let s = (((r.t_ns - first) / width) as usize).min(slices as usize - 1);
            pages[s][usize::from(r.kind == Kind::Zero)] += r.pages as u64;
        }
        let _ = writeln!(out, "page-ins over time (store / zero pages):");
        for (s, [st, z]) in pages.iter().enumerate() {
            let from = first + s as u64 * width;
            let _ = writeln!(out, "  {:>8.3} s {st:>12} {z:>10}", secs(from));
        }
    }
    out
}

/// `ztier faults`.
pub fn run(a: FaultsArgs) -> Result<i32> {
    let text = std::fs::read_to_string(&a.log).with_context(|| format!("reading {}", a.log.display()))?;
    let rows = parse(&text).with_context(|| format!("{}", a.log.display()))?;
    print!("{}", summary(&rows, a.budget.map(|b| b / 4096), a.slices));
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_add_up() {
        let log = format!(
            "{}\n100,zero,0x1000,16,,0,0,5000\n2000000000,store,0x1000,2,10,50,1,7000\n\
             3000000000,store,0x2000,1,300,60,0,4000\n3000000001,deferred,0x9000,0,,60,0,100\n",
            faultlog::HEADER
        );
        let rows = parse(&log).unwrap();
        assert_eq!(rows.len(), 4);
        assert_eq!(
            rows[1],
            Row {
                t_ns: 2_000_000_000,
                kind: Kind::Store,
                addr: 0x1000,
                pages: 2,
                distance: 10,
                evictions: 50,
                hot: true,
                service_ns: 7000
            }
        );
        let s = summary(&rows, Some(100), 3);
        assert!(s.contains("4 rows from 0.000 s to 3.000 s"), "{s}");
        assert!(s.contains(&format!("{:<10} {:>10} {:>12}", "store", 2, 3)), "{s}");
        assert!(s.contains(&format!("{:<10} {:>10} {:>12}", "zero", 1, 16)), "{s}");
        // Page 0x2000 came back twice (in the run from 0x1000, then alone).
        assert!(s.contains("2 distinct; once 1, 2-3 times 1"), "{s}");
        assert!(s.contains("1 faults (50.0%) joined"), "{s}");
        assert!(s.contains("p50 / p90: 10 / 300 / 300 evictions (0.10 / 3.00 / 3.00 budgets)"), "{s}");
        let e = format!("{:#}", parse("t_ns,kind\n").unwrap_err());
        assert!(e.contains("line 1"), "{e}");
    }
}
