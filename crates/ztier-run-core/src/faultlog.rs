//! The fault log (`ztier run --fault-log DIR`): one row per page-in the
//! manager serves, kept in memory and written at exit as `DIR/PID.csv`
//! ([`FaultLog`]), and read back ([`parse`]) by `ztier faults` and by
//! `ztier sim`, which replays one as a trace of faults.
//!
//! It exists for offline analysis of what the policy did to a program:
//! when pages came back, in what runs, at what refault distance, and what
//! each service cost. It sees what userfaultfd sees — misses only, never
//! hits on resident pages — so it is a record of the built policy's
//! faults, not a reference stream: replayed by `ztier sim` it tells what
//! another fault-driven policy, or a larger budget, would have done with
//! those faults, not what hits the run had in between.
//!
//! ```text
//!  t_ns,kind,addr,pages,distance,evictions,hot,service_ns
//!  1834121,zero,0x7f3a40000000,16,,0,0,5321
//!  9120334512,store,0x7f3a4012c000,8,20114,912533,0,9876
//!  9120347101,pin,0x7f3a40200000,2,,912533,0,4410
//!  │          │     │              │  │     │      │ └ ns inside the manager's lock: store read,
//!  │          │     │              │  │     │      │   room made, install (not the lock wait,
//!  │          │     │              │  │     │      │   not the wake, not the trap)
//!  │          │     │              │  │     │      └ 1: the page joined the protected segment
//!  │          │     │              │  │     │        (store rows whose distance was under the hot
//!  │          │     │              │  │     │        distance then: budget/4 to budget/64)
//!  │          │     │              │  │     └ the eviction clock: pages evicted so far
//!  │          │     │              │  └ refault distance (evictions since the faulting page
//!  │          │     │              │    went out); store rows only
//!  │          │     │              └ pages installed by this row (a run: prefetch included)
//!  │          │     └ first page of the row
//!  │          └ store: a fault served from the store (or spill file) · zero: a first touch,
//!  │            zeros installed · pin: stored or new pages brought back for a system call ·
//!  │            deferred: a fault on a page an eviction in flight owns (served after its
//!  │            commit, by a later row) · wp: a write to a write-protected page (a page
//!  │            kept clean by --clean wp, or a victim of an eviction in flight, taken back) ·
//!  │            lost: a page resident by the books that the program released behind
//!  │            the library's back (a raw system call); zeros installed
//!  └ ns since the process's manager started (monotonic), taken under the
//!    manager's lock, so rows are in service order
//! ```
//!
//! Rows are 32 bytes in memory, in chunks of 64 Ki rows taken from the
//! library's own allocator (never the arena), so logging is one clock
//! read and one store per page-in. A process keeps at most
//! [`MAX_ROWS`] rows (256 MiB); later page-ins are counted, not logged,
//! and the count is said in the log at exit. A forked child starts an
//! empty log of its own; a process killed by a signal writes none.

use std::io::{self, Write};
use std::path::PathBuf;

/// The first line of a fault log.
pub const HEADER: &str = "t_ns,kind,addr,pages,distance,evictions,hot,service_ns";

/// Most rows a process keeps (`ZTIER_TEST_FAULT_LOG_MAX` lowers it, for
/// tests).
pub const MAX_ROWS: usize = 8 << 20;
const CHUNK: usize = 64 << 10;

/// What a row records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A fault served from the store.
    Store,
    /// A first touch: zeros installed.
    Zero,
    /// Pages brought back for a system call.
    Pin,
    /// A fault on a page owned by an eviction in flight (retried).
    Deferred,
    /// A write to a write-protected page (kept clean, or a victim of an
    /// eviction in flight).
    Wp,
    /// A page resident by the books but missing: zeros installed.
    Lost,
}

impl Kind {
    /// Every kind, in the order the docs list them.
    pub const ALL: [Kind; 6] = [Kind::Store, Kind::Zero, Kind::Pin, Kind::Deferred, Kind::Wp, Kind::Lost];

    /// The kind named `name` in a log.
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Its name in a log.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Store => "store",
            Kind::Zero => "zero",
            Kind::Pin => "pin",
            Kind::Deferred => "deferred",
            Kind::Wp => "wp",
            Kind::Lost => "lost",
        }
    }
}

/// One row (see the module docs for the fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    /// Nanoseconds since the process's manager started.
    pub t_ns: u64,
    /// First page's address.
    pub addr: u64,
    /// Service time inside the manager's lock.
    pub service_ns: u32,
    /// Refault distance; `u32::MAX`: none.
    pub distance: u32,
    /// The eviction clock.
    pub evictions: u32,
    /// Pages installed.
    pub pages: u16,
    /// What the row records.
    pub kind: Kind,
    /// The page joined the protected segment.
    pub hot: bool,
}

impl Row {
    /// The refault distance, if the row has one.
    pub fn distance(&self) -> Option<u32> {
        (self.distance != u32::MAX).then_some(self.distance)
    }
}

/// A line of a fault log that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {why}")]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub why: String,
}

/// Parses a fault log (header first); an error names the line.
pub fn parse(text: &str) -> Result<Vec<Row>, ParseError> {
    let mut lines = text.lines();
    match lines.next() {
        Some(HEADER) => {}
        Some(h) => {
            return Err(ParseError {
                line: 1,
                why: format!("not a fault log header ({h:?}; expected {HEADER:?})"),
            })
        }
        None => return Err(ParseError { line: 1, why: "empty file: not a fault log".into() }),
    }
    lines
        .enumerate()
        .map(|(i, l)| parse_row(l).map_err(|why| ParseError { line: i + 2, why: format!("{why}: {l:?}") }))
        .collect()
}

fn parse_row(l: &str) -> Result<Row, String> {
    let f: Vec<&str> = l.split(',').collect();
    if f.len() != 8 {
        return Err(format!("{} fields, expected 8", f.len()));
    }
    fn num<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, String> {
        s.parse::<T>().map_err(|_| format!("{what} {s:?} is not a number in range"))
    }
    let kind = Kind::from_name(f[1]).ok_or_else(|| format!("unknown kind {:?}", f[1]))?;
    let addr = f[2].strip_prefix("0x").ok_or_else(|| format!("addr {:?} is not hexadecimal", f[2]))?;
    Ok(Row {
        t_ns: num(f[0], "t_ns")?,
        kind,
        addr: u64::from_str_radix(addr, 16).map_err(|_| format!("addr {:?} is not hexadecimal", f[2]))?,
        pages: num(f[3], "pages")?,
        distance: if f[4].is_empty() { u32::MAX } else { num::<u32>(f[4], "distance")?.min(u32::MAX - 1) },
        evictions: num(f[5], "evictions")?,
        hot: match f[6] {
            "0" => false,
            "1" => true,
            h => return Err(format!("hot {h:?} is neither 0 nor 1")),
        },
        service_ns: num(f[7], "service_ns")?,
    })
}

/// The log of one process.
pub struct FaultLog {
    /// Where `PID.csv` goes.
    pub dir: PathBuf,
    origin: std::time::Instant,
    chunks: Vec<Vec<Row>>,
    len: usize,
    max: usize,
    /// Page-ins past `max`, not logged.
    pub dropped: u64,
}

impl FaultLog {
    /// A log if `ZTIER_FAULT_LOG_DIR` is set.
    pub fn from_env() -> Option<FaultLog> {
        let dir: PathBuf =
            std::env::var_os(crate::names::env::FAULT_LOG_DIR).filter(|d| !d.is_empty())?.into();
        let max = std::env::var(crate::names::env::TEST_FAULT_LOG_MAX)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(MAX_ROWS);
        Some(FaultLog::new(dir, max))
    }

    /// An empty log of at most `max` rows.
    pub fn new(dir: PathBuf, max: usize) -> FaultLog {
        FaultLog { dir, origin: std::time::Instant::now(), chunks: Vec::new(), len: 0, max, dropped: 0 }
    }

    /// Nanoseconds since the log started.
    #[inline]
    pub fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    /// Adds a row (or counts it as dropped past the limit).
    pub fn push(&mut self, row: Row) {
        if self.len >= self.max {
            self.dropped += 1;
            return;
        }
        match self.chunks.last_mut() {
            Some(c) if c.len() < c.capacity() => c.push(row),
            _ => {
                let mut c = Vec::with_capacity(CHUNK.min(self.max - self.len));
                c.push(row);
                self.chunks.push(c);
            }
        }
        self.len += 1;
    }

    /// Rows logged.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no row was logged.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every row and starts the clock again (a forked child).
    pub fn clear(&mut self) {
        self.chunks = Vec::new();
        self.len = 0;
        self.dropped = 0;
        self.origin = std::time::Instant::now();
    }

    /// Takes the rows out, leaving the log empty but still logging (what
    /// is written at exit, taken under the manager's lock and formatted
    /// after it is let go).
    pub fn take(&mut self) -> FaultLog {
        let mut out = FaultLog::new(self.dir.clone(), self.max);
        out.origin = self.origin;
        std::mem::swap(&mut out.chunks, &mut self.chunks);
        out.len = std::mem::take(&mut self.len);
        out.dropped = std::mem::take(&mut self.dropped);
        out
    }

    /// Writes the rows as CSV (header first).
    pub fn write_csv(&self, w: &mut impl Write) -> io::Result<()> {
        writeln!(w, "{HEADER}")?;
        for r in self.chunks.iter().flatten() {
            write!(w, "{},{},{:#x},{},", r.t_ns, r.kind.name(), r.addr, r.pages)?;
            if r.distance != u32::MAX {
                write!(w, "{}", r.distance)?;
            }
            writeln!(w, ",{},{},{}", r.evictions, u8::from(r.hot), r.service_ns)?;
        }
        Ok(())
    }

    /// Writes `dir/name` (`PID.csv`, or `PID-N.csv` as the process's
    /// statistics are named). How many page-ins went unlogged is
    /// [`FaultLog::unlogged`]'s, for the caller to say.
    pub fn write_file(&self, name: &str) -> io::Result<PathBuf> {
        let path = self.dir.join(name);
        let mut w = io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&path)?);
        self.write_csv(&mut w)?;
        w.flush()?;
        Ok(path)
    }

    /// Page-ins counted but not logged (past the first `max` rows), and
    /// that `max`.
    pub fn unlogged(&self) -> (u64, usize) {
        (self.dropped, self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(t: u64, kind: Kind) -> Row {
        Row {
            t_ns: t,
            addr: 0x1000 * t,
            service_ns: 7,
            distance: u32::MAX,
            evictions: 3,
            pages: 1,
            kind,
            hot: false,
        }
    }

    #[test]
    fn rows_come_out_in_order_as_csv_and_past_the_limit_are_counted() {
        let mut log = FaultLog::new(PathBuf::from("/nonexistent"), CHUNK + 2);
        for t in 0..CHUNK as u64 + 5 {
            log.push(row(t, if t % 2 == 0 { Kind::Store } else { Kind::Zero }));
        }
        assert_eq!(log.len(), CHUNK + 2);
        assert_eq!(log.dropped, 3);
        log.push(Row { distance: 42, hot: true, ..row(9, Kind::Pin) });
        let mut out = Vec::new();
        log.write_csv(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), CHUNK + 3);
        assert_eq!(lines[0], "t_ns,kind,addr,pages,distance,evictions,hot,service_ns");
        assert_eq!(lines[1], "0,store,0x0,1,,3,0,7");
        assert_eq!(lines[2], "1,zero,0x1000,1,,3,0,7");
        assert_eq!(lines[CHUNK + 2].split(',').next(), Some((CHUNK as u64 + 1).to_string().as_str()));
        let taken = log.take();
        assert_eq!((taken.len(), taken.dropped, log.len(), log.dropped), (CHUNK + 2, 4, 0, 0));
        log.push(Row { distance: 42, hot: true, ..row(9, Kind::Pin) });
        let mut out = Vec::new();
        log.write_csv(&mut out).unwrap();
        assert!(String::from_utf8(out).unwrap().ends_with("\n9,pin,0x9000,1,42,3,1,7\n"));
        log.clear();
        assert!(log.is_empty());
    }

    #[test]
    fn a_written_log_parses_back_and_bad_lines_are_named() {
        let mut log = FaultLog::new(PathBuf::from("/nonexistent"), 100);
        log.push(row(1, Kind::Zero));
        log.push(Row { distance: 42, hot: true, pages: 8, ..row(2, Kind::Store) });
        let mut out = Vec::new();
        log.write_csv(&mut out).unwrap();
        let rows = parse(std::str::from_utf8(&out).unwrap()).unwrap();
        assert_eq!(
            rows,
            vec![row(1, Kind::Zero), Row { distance: 42, hot: true, pages: 8, ..row(2, Kind::Store) }]
        );
        assert_eq!((rows[0].distance(), rows[1].distance()), (None, Some(42)));
        for (bad, says) in [
            ("t_ns,kind\n", "line 1"),
            (&*format!("{HEADER}\n1,store,0x10,1,,1,0,5\n1,nope,0x10,1,,1,0,5\n"), "line 3"),
            (&*format!("{HEADER}\n1,store,10,1,,1,0,5\n"), "not hexadecimal"),
            (&*format!("{HEADER}\n1,store,0x10,1,,1,2,5\n"), "neither 0 nor 1"),
            (&*format!("{HEADER}\n1,store,0x10,1\n"), "4 fields"),
            (&*format!("{HEADER}\n1,store,0x10,70000,,1,0,5\n"), "pages"),
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }
}
