//! Page traces from valgrind's lackey, and compression traces from the
//! traced program's own memory.
//!
//! `valgrind --tool=lackey --trace-mem=yes` prints one line per memory
//! access:
//!
//! ```text
//! I  0401ab70,3          instruction fetch      (ignored: data references only)
//!  L 1fff000838,8        load  of 8 bytes at 0x1fff000838
//!  S 1fff000770,8        store
//!  M 0421c3f0,4          modify (load + store): recorded as a write
//! ==18439== ...          valgrind's own messages (ignored)
//! ```
//!
//! Addresses are hex without `0x`. An access that straddles a page
//! boundary references both pages.
//!
//! # Compression traces
//!
//! A reference alone says nothing about how well the page compresses; the
//! 1999 study needed both. [`record`] gets them from the program's real
//! memory: valgrind runs the program in its own address space at the
//! program's own addresses, so the recorder reads `/proc/PID/mem` of the
//! valgrind process. Every `snapshot_every` references it reads each page
//! referenced since the previous snapshot, compresses it with every codec
//! column, and writes a compression record at that point of the trace.
//! The simulator uses a page's latest record for the references after it.
//!
//! Approximations (documented, not hidden): lackey's output is buffered,
//! so a snapshot sees the program slightly *ahead* of the reference at
//! which its record is placed; a page's content between two snapshots is
//! taken to be the later one; pages referenced only after the last
//! snapshot before exit have no record (the simulator then uses the mean
//! of the trace's records for that codec and counts such references).
//! Valgrind's own memory is never read: only pages the program referenced.
//!
//! # Memory `ztier run` would not manage
//!
//! At the snapshot after a page's first reference the recorder also looks
//! it up in the valgrind process's `/proc/PID/maps` and marks it
//! *unmanaged* ([`TraceWriter::unmanaged`]) if it is mapped from a file
//! (a program's or a library's data, a mapped file) or lies in the
//! client's main stack (valgrind puts it just below `0x1fff001000` on
//! x86-64: [`CLIENT_STACK`]). `ztier run`'s library manages the program's
//! heap and private anonymous mappings only, so the simulator's model of
//! it leaves those pages out. In the run's layout (below) also glibc's own
//! heap (the client's break) and the `.bss` of each mapped ELF file, which
//! a run leaves outside its arena ([`unmanaged_pages`]). In the run's
//! layout the library also logs the ranges a run would manage (its heap
//! and the program's own private anonymous `mmap`s, less what the program
//! unmapped: [`ManagedRanges`]); every other anonymous page (the dynamic
//! linker's and glibc's own mappings, threads' stacks) is then unmanaged
//! too. The pages of what the program unmapped, and of each large block
//! whose pages the library released when the program freed it (as a
//! run's `free` does: [`ManagedRanges::freed`]), get released-page
//! records (a block's a little after its log line is read, but those
//! referenced since: the block handed out again). (With glibc's layout the program's first MiB of requests, which a
//! run leaves to glibc, and the stacks of threads, cannot be told apart
//! here, and count as managed.)
//!
//! # Whose heap layout
//!
//! With [`RecordOptions::preload`] the program runs with `ztier run`'s
//! library preloaded in its allocation-only mode (`ZTIER_ALLOC_ONLY=1`:
//! the library's allocator, no userfaultfd or store, nothing valgrind
//! cannot run), so its `malloc` blocks lie on the pages a run would put
//! them on (size classes in 256 KiB spans, page ranges above 32 KiB);
//! without it, on glibc's. The two differ enough to move the simulator's
//! prediction of a run by 20–100% on programs with many small objects
//! (docs/measurements/2026-12-06-sim-vs-live-2.md).
//!
//! One address space is traced: valgrind follows `exec` (a launcher script
//! that execs the real program is traced as the program, with the memory
//! file reopened after the exec), while forked children run untraced. To
//! trace a program that a driver forks (gcc's cc1), trace the child's
//! command line directly (see `examples/traces/gcc.sh`).

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitStatus};
use std::time::Instant;

use ztier_codec::page::PageEncoder;
use ztier_codec::{CodecId, PAGE_SIZE};

use crate::trace::{CodecColumn, TraceWriter};

/// Errors of lackey import and recording.
#[derive(Debug, thiserror::Error)]
pub enum LackeyError {
    /// I/O failed.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// A lackey data line did not parse.
    #[error("line {line}: not a lackey data reference: {text:?}")]
    BadLine {
        /// 1-based line number.
        line: u64,
        /// The line.
        text: String,
    },
    /// valgrind could not be started.
    #[error("cannot run valgrind ({0}); install the Debian package `valgrind`")]
    NoValgrind(io::Error),
    /// The output did not look like lackey's.
    #[error("valgrind produced no lackey data references (is the command valid? valgrind said: {0})")]
    NoReferences(String),
}

/// One parsed data reference: pages `first..=last`, a write if `write`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// First page touched.
    pub first: u64,
    /// Last page touched (== first unless the access straddles pages).
    pub last: u64,
    /// Store or modify.
    pub write: bool,
}

/// A line that looks like a lackey data reference but does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadLine;

/// Parses one lackey line: `Ok(None)` for lines that are not data
/// references (instruction fetches, valgrind messages, blank lines).
pub fn parse_line(line: &str) -> Result<Option<Access>, BadLine> {
    let b = line.as_bytes();
    if b.len() < 4 || b[0] != b' ' || b[2] != b' ' {
        return Ok(None);
    }
    let write = match b[1] {
        b'L' => false,
        b'S' | b'M' => true,
        _ => return Ok(None),
    };
    let rest = &line[3..];
    let (addr, size) = rest.trim_end().split_once(',').ok_or(BadLine)?;
    let addr = u64::from_str_radix(addr.trim_start(), 16).map_err(|_| BadLine)?;
    let size: u64 = size.parse().map_err(|_| BadLine)?;
    if size == 0 {
        return Err(BadLine);
    }
    let end = addr.checked_add(size - 1).ok_or(BadLine)?;
    Ok(Some(Access { first: addr >> 12, last: end >> 12, write }))
}

/// What a conversion saw.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ConvertStats {
    /// Lines read.
    pub lines: u64,
    /// Page references written.
    pub references: u64,
    /// Compression records written.
    pub size_records: u64,
    /// Exit code of the traced command (recording only).
    pub exit_code: Option<i32>,
}

/// Converts lackey text (a file or a pipe) into a trace without
/// compression records.
pub fn import<R: BufRead, W: Write>(input: R, out: W) -> Result<ConvertStats, LackeyError> {
    let mut w = TraceWriter::new(out, &[])?;
    let mut st = ConvertStats::default();
    convert(input, &mut w, &mut st, |_, _| Ok(()))?;
    w.finish()?;
    Ok(st)
}

fn convert<R: BufRead, W: Write>(
    mut input: R,
    w: &mut TraceWriter<W>,
    st: &mut ConvertStats,
    mut each: impl FnMut(&mut TraceWriter<W>, u64) -> io::Result<()>,
) -> Result<(), LackeyError> {
    let mut line = String::new();
    loop {
        line.clear();
        if input.read_line(&mut line)? == 0 {
            return Ok(());
        }
        st.lines += 1;
        match parse_line(&line) {
            Ok(None) => {}
            Ok(Some(a)) => {
                for p in a.first..=a.last {
                    w.reference(p, a.write)?;
                    st.references += 1;
                    each(w, p)?;
                }
            }
            Err(BadLine) => {
                return Err(LackeyError::BadLine { line: st.lines, text: line.trim_end().to_string() })
            }
        }
    }
}

/// How to record.
#[derive(Debug, Clone)]
pub struct RecordOptions {
    /// Codec columns to measure.
    pub codecs: Vec<CodecId>,
    /// References between memory snapshots.
    pub snapshot_every: u64,
    /// Removed if the recorder is interrupted (SIGINT, SIGTERM, SIGHUP):
    /// the partial trace.
    pub output_path: Option<std::path::PathBuf>,
    /// `ztier run`'s preload library, loaded into the program in its
    /// allocation-only mode (`ZTIER_ALLOC_ONLY=1`): the program's blocks
    /// then lie where a run puts them (its size classes), not where
    /// glibc's `malloc` does. `None`: glibc's layout.
    pub preload: Option<std::path::PathBuf>,
}

impl Default for RecordOptions {
    fn default() -> Self {
        RecordOptions {
            codecs: vec![CodecId::Wkdm, CodecId::Lz4, CodecId::Zstd],
            snapshot_every: 1_000_000,
            output_path: None,
            preload: None,
        }
    }
}

/// Where valgrind puts the client's main stack on x86-64 (its address
/// space manager's layout): pages of anonymous memory in this range are
/// the stack's.
pub const CLIENT_STACK: std::ops::Range<u64> = 0x1f_f000_0000..0x20_0000_0000;

/// The pages of `pages` (page numbers) that `maps` (the text of
/// `/proc/PID/maps`) shows mapped from a file, as a special mapping
/// (`[stack]`, `[vdso]`, ...), or in the client's stack ([`CLIENT_STACK`]):
/// memory `ztier run` would not manage. `[heap]` is the kernel's name for
/// what lies at valgrind's own break, where a client's anonymous mapping
/// (the preload library's heap) can land and merge: anonymous memory. Pages in no mapping (gone since
/// they were referenced) are not among them.
///
/// With `run_layout` (the program ran with the allocation-only library,
/// [`RecordOptions::preload`]) also the anonymous memory a run leaves to
/// glibc and the kernel: the client's break (valgrind maps it `rwx`, and
/// it holds glibc's heap: the blocks glibc and the dynamic linker allocate
/// for themselves), and the zero-filled tail (`.bss`) of each mapped ELF
/// file, up to the end of its last `PT_LOAD` segment (read from the
/// file's program headers). With glibc's layout the break is the
/// program's heap: managed.
///
/// With `own` (the ranges the allocation-only library logged, once it has
/// logged any), a page is managed if it lies in one of them, and every
/// other page in a mapping is unmanaged: anonymous memory the program did
/// not map through the library is not a run's.
pub fn unmanaged_pages(maps: &str, pages: &[u64], run_layout: bool, own: Option<&ManagedRanges>) -> Vec<u64> {
    let mut ranges: Vec<(u64, u64, bool)> = Vec::new();
    // Per mapped file: where its first page lies (offset 0), where its
    // last mapping ends.
    let mut images: Vec<(&str, u64, u64)> = Vec::new();
    for l in maps.lines() {
        let mut f = l.split_whitespace();
        let (Some(range), Some(perms), Some(off), Some(_dev), Some(_inode)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let Some((lo, hi)) = range.split_once('-') else { continue };
        let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) else { continue };
        let name = f.next();
        let named = name.is_some_and(|p| {
            p.starts_with('/') || (p.starts_with('[') && !p.starts_with("[anon") && p != "[heap]")
        });
        let brk = run_layout && name.is_none() && perms == "rwxp";
        if let Some(path) = name.filter(|p| run_layout && p.starts_with('/')) {
            match images.iter_mut().find(|i| i.0 == path) {
                Some(i) => i.2 = i.2.max(hi),
                None if off.trim_start_matches('0').is_empty() => images.push((path, lo, hi)),
                None => {}
            }
        }
        ranges.push((lo, hi, named || brk || (CLIENT_STACK.contains(&lo) && hi <= CLIENT_STACK.end)));
    }
    // The images' zero-filled tails: from a file's last mapping to its
    // image's end.
    let mut tails: Vec<(u64, u64)> = images
        .iter()
        .filter_map(|&(path, first, last)| {
            elf_image_end(first, path).filter(|&end| end > last).map(|end| (last, end))
        })
        .collect();
    tails.sort_unstable();
    ranges.sort_unstable();
    pages
        .iter()
        .copied()
        .filter(|&p| {
            let a = p << 12;
            if own.is_some_and(|o| o.contains(p)) {
                return false;
            }
            let k = tails.partition_point(|&(lo, _)| lo <= a);
            if k > 0 && a < tails[k - 1].1 {
                return true;
            }
            let k = ranges.partition_point(|&(lo, _, _)| lo <= a);
            k > 0 && a < ranges[k - 1].1 && (ranges[k - 1].2 || own.is_some())
        })
        .collect()
}

/// The ranges `ztier run` would manage, as the allocation-only library
/// logs them (`ZTIER_ALLOC_ONLY_MAPS`): lines `PID m LO HI` (mapped:
/// the library's heap, the program's private anonymous `mmap`s) and
/// `PID u LO HI` (unmapped), hex, `HI` exclusive; lines of other
/// processes (forked children) are skipped. Lines `PID r LO HI` (a freed
/// large block whose pages the library released, still managed) leave
/// the ranges as they are ([`ManagedRanges::freed`] reads them).
#[derive(Debug, Default, Clone)]
pub struct ManagedRanges {
    /// First page -> page after the last, disjoint.
    ranges: std::collections::BTreeMap<u64, u64>,
    /// Lines applied.
    pub lines: u64,
}

impl ManagedRanges {
    /// Applies one log line of process `pid`; other lines are ignored.
    /// Returns the pages an unmap line released (first, after the last).
    pub fn apply(&mut self, line: &str, pid: u32) -> Option<(u64, u64)> {
        let mut f = line.split_whitespace();
        let (Some(p), Some(kind), Some(lo), Some(hi)) = (f.next(), f.next(), f.next(), f.next()) else {
            return None;
        };
        let parse = |x: &str| u64::from_str_radix(x, 16).ok();
        let (Some(p), Some(lo), Some(hi)) = (parse(p), parse(lo), parse(hi)) else { return None };
        if p != pid as u64 || hi <= lo || !matches!(kind, "m" | "u") {
            return None;
        }
        let (lo, hi) = (lo >> 12, hi.div_ceil(4096));
        self.remove(lo, hi);
        self.lines += 1;
        if kind == "m" {
            self.ranges.insert(lo, hi);
            return None;
        }
        Some((lo, hi))
    }

    /// Takes `[lo, hi)` out, splitting the ranges it cuts.
    fn remove(&mut self, lo: u64, hi: u64) {
        let cut: Vec<(u64, u64)> =
            self.ranges.range(..hi).rev().take_while(|&(_, &e)| e > lo).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in cut {
            self.ranges.remove(&s);
            if s < lo {
                self.ranges.insert(s, lo);
            }
            if e > hi {
                self.ranges.insert(hi, e);
            }
        }
    }

    /// The pages a line `PID r LO HI` of process `pid` says were
    /// released by a `free` (first, after the last): still managed, but
    /// out of a run's memory and store, as the library's `free` releases a
    /// large block's pages (`MADV_DONTNEED`) unless it keeps the block for
    /// reuse. `None` for any other line.
    pub fn freed(line: &str, pid: u32) -> Option<(u64, u64)> {
        let mut f = line.split_whitespace();
        let (Some(p), Some("r"), Some(lo), Some(hi)) = (f.next(), f.next(), f.next(), f.next()) else {
            return None;
        };
        let parse = |x: &str| u64::from_str_radix(x, 16).ok();
        let (Some(p), Some(lo), Some(hi)) = (parse(p), parse(lo), parse(hi)) else { return None };
        (p == pid as u64 && hi > lo).then_some((lo >> 12, hi.div_ceil(4096)))
    }

    /// Is `page` in a managed range?
    pub fn contains(&self, page: u64) -> bool {
        self.ranges.range(..=page).next_back().is_some_and(|(_, &e)| page < e)
    }
}

/// Where the image of the 64-bit ELF file `path`, its first page mapped at
/// `first`, ends in memory: the page after its last `PT_LOAD` segment's
/// end (`p_vaddr + p_memsz`, so its `.bss` included). `None` if the file
/// is not a 64-bit ELF file or cannot be read.
fn elf_image_end(first: u64, path: &str) -> Option<u64> {
    let f = File::open(path).ok()?;
    let mut h = [0u8; 64];
    f.read_exact_at(&mut h, 0).ok()?;
    if &h[..4] != b"\x7fELF" || h[4] != 2 {
        return None;
    }
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    let (phoff, phentsize, phnum) = (u64_at(&h, 0x20), u16_at(&h, 0x36) as u64, u16_at(&h, 0x38) as u64);
    if phentsize < 56 || phnum > 256 {
        return None;
    }
    let mut ph = vec![0u8; (phentsize * phnum) as usize];
    f.read_exact_at(&mut ph, phoff).ok()?;
    let (mut lowest, mut end) = (u64::MAX, 0u64);
    for e in ph.chunks_exact(phentsize as usize) {
        if u32::from_le_bytes(e[..4].try_into().expect("4 bytes")) == 1 {
            let (vaddr, memsz) = (u64_at(e, 0x10), u64_at(e, 0x28));
            lowest = lowest.min(vaddr & !0xfff);
            end = end.max(vaddr.checked_add(memsz)?);
        }
    }
    (end > 0).then(|| first.wrapping_sub(lowest).wrapping_add(end).next_multiple_of(4096))
}

/// References between two reads of the library's maps log (for the
/// blocks it released on `free`).
const MAPS_POLL: u64 = 1 << 14;
/// References after reading a freed block's line before its pages are
/// released: more than lackey's output the recorder has not read yet when
/// the program frees (a pipe's and the reader's 1 MiB buffer, ~40k
/// references), so the block's last references come first.
const FREED_LAG: u64 = 1 << 17;

/// A freed block whose pages the library released, waiting to be
/// released in the trace.
#[derive(Debug)]
struct Freed {
    lo: u64,
    hi: u64,
    /// The reference count at which it is released.
    due: u64,
    /// Its pages referenced since its line was read.
    since: HashSet<u64>,
}

impl Freed {
    /// Its pages to release, in order: those `seen` by the trace, but
    /// none referenced since its line was read.
    fn gone(&self, seen: impl Fn(&u64) -> bool) -> Vec<u64> {
        (self.lo..self.hi).filter(|p| seen(p) && !self.since.contains(p)).collect()
    }
}

struct Snapshotter {
    pid: u32,
    /// The program runs with the allocation-only library ([`unmanaged_pages`]).
    run_layout: bool,
    mem: Option<File>,
    /// Pages already looked up in the maps.
    classified: HashSet<u64>,
    /// The library's log of managed ranges (run layout), what of it is
    /// read, and the ranges.
    maps_log: Option<(File, Vec<u8>)>,
    own: ManagedRanges,
    /// Page ranges the program unmapped: read at the last snapshot, and
    /// since (released at the next snapshot, so never before the last
    /// references to them that lackey's buffered output still holds).
    released_due: Vec<(u64, u64)>,
    released_new: Vec<(u64, u64)>,
    /// Blocks the program freed whose pages the library released
    /// ([`ManagedRanges::freed`]), read at a poll of the maps log.
    freed: Vec<Freed>,
    /// References so far.
    refs: u64,
    encoders: Vec<PageEncoder>,
    touched: HashSet<u64>,
    page: Vec<u8>,
    out: Vec<u8>,
    back: Vec<u8>,
    compress_ns: Vec<u128>,
    decompress_ns: Vec<u128>,
    pages: u64,
}

impl Snapshotter {
    /// Applies the complete lines the library has appended to its maps
    /// log since the last call.
    fn read_maps_log(&mut self) -> io::Result<()> {
        let Some((f, pending)) = self.maps_log.as_mut() else { return Ok(()) };
        io::Read::read_to_end(f, pending)?;
        let Some(end) = pending.iter().rposition(|&b| b == b'\n') else { return Ok(()) };
        for line in pending[..end].split(|&b| b == b'\n') {
            let line = String::from_utf8_lossy(line);
            if let Some(r) = self.own.apply(&line, self.pid) {
                self.released_new.push(r);
            } else if let Some((lo, hi)) = ManagedRanges::freed(&line, self.pid) {
                self.freed.push(Freed { lo, hi, due: self.refs + FREED_LAG, since: HashSet::new() });
            }
        }
        pending.drain(..=end);
        Ok(())
    }

    /// A reference to `page`; every [`MAPS_POLL`] references the maps log
    /// is read, and freed blocks that are due are released: their pages
    /// the trace has seen, but those referenced since the line was read
    /// (a block handed out again; or the freed block's own last
    /// references, still in lackey's buffered output: kept, as before).
    fn reference<W: Write>(&mut self, w: &mut TraceWriter<W>, page: u64) -> io::Result<()> {
        self.refs += 1;
        self.touched.insert(page);
        for f in &mut self.freed {
            if (f.lo..f.hi).contains(&page) {
                f.since.insert(page);
            }
        }
        if self.refs % MAPS_POLL == 0 && self.maps_log.is_some() {
            self.read_maps_log()?;
            let refs = self.refs;
            let (due, wait): (Vec<Freed>, Vec<Freed>) =
                std::mem::take(&mut self.freed).into_iter().partition(|f| f.due <= refs);
            self.freed = wait;
            for f in due {
                let seen = |p: &u64| self.classified.contains(p) || self.touched.contains(p);
                for p in f.gone(seen) {
                    w.released(p)?;
                }
            }
        }
        Ok(())
    }

    /// Reads every page touched since the last snapshot and writes its
    /// compressed sizes.
    fn snapshot<W: Write>(&mut self, w: &mut TraceWriter<W>, st: &mut ConvertStats) -> io::Result<()> {
        // Pages unmapped by the last snapshot, that the trace has seen.
        for (lo, hi) in std::mem::take(&mut self.released_due) {
            let mut gone: Vec<u64> = if hi - lo <= self.classified.len() as u64 {
                (lo..hi).filter(|p| self.classified.contains(p)).collect()
            } else {
                self.classified.iter().copied().filter(|p| (lo..hi).contains(p)).collect()
            };
            gone.sort_unstable();
            for p in gone {
                w.released(p)?;
            }
        }
        self.read_maps_log()?;
        self.released_due = std::mem::take(&mut self.released_new);
        let mut pages: Vec<u64> = self.touched.drain().collect();
        pages.sort_unstable();
        let new: Vec<u64> = pages.iter().copied().filter(|&p| self.classified.insert(p)).collect();
        if !new.is_empty() {
            if let Ok(maps) = std::fs::read_to_string(format!("/proc/{}/maps", self.pid)) {
                let own = (self.own.lines > 0).then_some(&self.own);
                for p in unmanaged_pages(&maps, &new, self.run_layout, own) {
                    w.unmanaged(p)?;
                }
            }
        }
        let mut sizes = vec![0u16; self.encoders.len()];
        let mut reopened = false;
        for p in pages {
            let ok = self.mem.as_ref().is_some_and(|m| m.read_exact_at(&mut self.page, p << 12).is_ok());
            if !ok {
                // After an exec the old memory file reads nothing: reopen
                // once per snapshot. A page the program has unmapped
                // meanwhile cannot be read at all: skip it.
                if reopened {
                    continue;
                }
                reopened = true;
                self.mem = File::open(format!("/proc/{}/mem", self.pid)).ok();
                if self.mem.as_ref().is_none_or(|m| m.read_exact_at(&mut self.page, p << 12).is_err()) {
                    continue;
                }
            }
            for (i, e) in self.encoders.iter_mut().enumerate() {
                let t = Instant::now();
                let enc = e.encode(&self.page, &mut self.out).map_err(io::Error::other)?;
                self.compress_ns[i] += t.elapsed().as_nanos();
                let t = Instant::now();
                e.decode(enc.form, &self.out[..enc.len], &mut self.back).map_err(io::Error::other)?;
                self.decompress_ns[i] += t.elapsed().as_nanos();
                if self.back != self.page {
                    return Err(io::Error::other(format!(
                        "codec {} did not round-trip a page",
                        e.codec_id().name()
                    )));
                }
                sizes[i] = match enc.form {
                    ztier_codec::page::Form::Raw => PAGE_SIZE as u16,
                    _ => enc.len as u16,
                };
            }
            w.sizes(p, &sizes)?;
            st.size_records += 1;
            self.pages += 1;
        }
        Ok(())
    }
}

/// Runs `cmd` under valgrind lackey, writing its page trace with
/// compression records to `out` (a file: the codec costs are patched into
/// the header at the end). The command's stdin/stdout/stderr are the
/// caller's.
///
/// Interrupted by SIGINT, SIGTERM or SIGHUP, the recorder kills valgrind
/// (by its PID), removes its temporary FIFO folder and
/// [`RecordOptions::output_path`], and exits with 128 + the signal. If
/// the recorder itself is killed with SIGKILL, the kernel kills valgrind
/// (`PR_SET_PDEATHSIG`); only the empty temporary folder can remain.
pub fn record(cmd: &[OsString], out: File, opts: &RecordOptions) -> Result<ConvertStats, LackeyError> {
    let dir = std::env::temp_dir().join(format!("ztier-record-{}-{}", std::process::id(), rand_suffix()));
    std::fs::create_dir_all(&dir)?;
    let fifo = dir.join("lackey.fifo");
    let guard = SignalGuard::install(dir.clone(), opts.output_path.clone())?;
    let result = record_in(cmd, out, opts, &fifo, &guard);
    drop(guard);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// While alive: SIGINT/SIGTERM/SIGHUP are blocked in this process and
/// taken by a thread (`sigtimedwait`), which cleans up and exits.
struct SignalGuard {
    child: std::sync::Arc<std::sync::atomic::AtomicI32>,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    old_mask: libc::sigset_t,
}

fn stop_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a local sigset_t.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        set
    }
}

impl SignalGuard {
    fn install(dir: std::path::PathBuf, output: Option<std::path::PathBuf>) -> io::Result<SignalGuard> {
        use std::sync::atomic::Ordering;
        let set = stop_signals();
        // SAFETY: a zeroed sigset_t is a valid out-parameter.
        let mut old_mask: libc::sigset_t = unsafe { std::mem::zeroed() };
        // Block before any thread starts, so every later thread inherits
        // the mask and only the waiter below takes these signals.
        // SAFETY: both pointers are to live sigset_t values.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old_mask) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        let child = std::sync::Arc::new(std::sync::atomic::AtomicI32::new(0));
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (c, d) = (child.clone(), done.clone());
        let thread = std::thread::spawn(move || {
            let timeout = libc::timespec { tv_sec: 0, tv_nsec: 100_000_000 };
            while !d.load(Ordering::Acquire) {
                // SAFETY: `set` and `timeout` are live; a null siginfo is allowed.
                let sig = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &timeout) };
                if sig <= 0 {
                    continue; // timeout or EINTR
                }
                let pid = c.load(Ordering::Acquire);
                if pid > 0 {
                    // SAFETY: kill(2) on the PID of the valgrind child we started.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                let _ = std::fs::remove_dir_all(&dir);
                if let Some(o) = &output {
                    let _ = std::fs::remove_file(o);
                }
                eprintln!(
                    "ztier trace record: interrupted (signal {sig}); valgrind killed, partial trace removed"
                );
                std::process::exit(128 + sig);
            }
        });
        Ok(SignalGuard { child, done, thread: Some(thread), old_mask })
    }

    fn set_child(&self, pid: u32) {
        self.child.store(pid as i32, std::sync::atomic::Ordering::Release);
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        self.done.store(true, std::sync::atomic::Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // SAFETY: restores the mask saved in install; pointers are live.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old_mask, std::ptr::null_mut()) };
    }
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

fn record_in(
    cmd: &[OsString],
    mut out: File,
    opts: &RecordOptions,
    fifo: &Path,
    guard: &SignalGuard,
) -> Result<ConvertStats, LackeyError> {
    let mk = Command::new("mkfifo").arg("-m").arg("600").arg(fifo).status()?;
    if !mk.success() {
        return Err(io::Error::other("mkfifo failed").into());
    }
    // The library's log of the ranges a run would manage (run layout).
    let maps_log = fifo.with_file_name("managed.log");
    File::create(&maps_log)?;
    let maps_file = File::open(&maps_log)?;
    let mut log = OsString::from("--log-file=");
    log.push(fifo);
    let mut command = Command::new("valgrind");
    // Follow exec (a shell or launcher script becomes the program, same
    // process, same log); forked children run untraced and silent, so
    // one address space is traced.
    command
        .args(["--tool=lackey", "--trace-mem=yes", "--trace-children=yes", "--child-silent-after-fork=yes"])
        .arg("--vgdb=no") // no gdbserver pipes left in TMPDIR if valgrind is killed
        .arg(log)
        .args(cmd);
    if let Some(lib) = &opts.preload {
        // Valgrind puts its own preloads before the client's LD_PRELOAD
        // and none of lackey's replaces malloc, so the library's serves.
        let mut preload = lib.as_os_str().to_owned();
        if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
            preload.push(":");
            preload.push(old);
        }
        command
            .env("LD_PRELOAD", preload)
            .env(ztier_run_core::names::env::ALLOC_ONLY, "1")
            .env(ztier_run_core::names::env::ALLOC_ONLY_MAPS, &maps_log)
            .env_remove(ztier_run_core::names::env::BUDGET);
    }
    let unmask = guard.old_mask;
    // SAFETY: the closure runs in the forked child before exec and calls
    // only async-signal-safe functions (prctl, getppid, pthread_sigmask).
    unsafe {
        command.pre_exec(move || {
            // Die with the recorder, even if it is killed with SIGKILL.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() == 1 {
                return Err(io::Error::other("the recorder died"));
            }
            // The program gets the signal mask the recorder had.
            libc::pthread_sigmask(libc::SIG_SETMASK, &unmask, std::ptr::null_mut());
            Ok(())
        })
    };
    let mut child = command.spawn().map_err(LackeyError::NoValgrind)?;
    let pid = child.id();
    guard.set_child(pid);
    // The waiter reaps valgrind. Opening the FIFO below blocks until
    // valgrind opens it; if valgrind exits without doing so (bad command
    // line), the waiter connects as a writer and closes, so the read side
    // sees end of file instead of blocking forever. A non-blocking open for
    // writing fails (ENXIO) until the reader is there, so the waiter keeps
    // trying until the reader's open has returned.
    let fifo_w = fifo.to_path_buf();
    let opened = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let opened_w = opened.clone();
    let waiter = std::thread::spawn(move || {
        let status = child.wait();
        while !opened_w.load(std::sync::atomic::Ordering::Acquire) {
            if std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&fifo_w).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        status
    });
    let reader = File::open(fifo);
    opened.store(true, std::sync::atomic::Ordering::Release);
    let reader = reader?;
    // Only now is the process running the tool (the launcher has exec'd):
    // its memory is the program's.
    let mem = File::open(format!("/proc/{pid}/mem")).ok();
    let columns: Vec<CodecColumn> =
        opts.codecs.iter().map(|&c| CodecColumn { codec: c, compress_ns: 0, decompress_ns: 0 }).collect();
    let mut w = TraceWriter::new(io::BufWriter::new(&mut out), &columns)?;
    let mut snap = Snapshotter {
        pid,
        run_layout: opts.preload.is_some(),
        mem,
        classified: HashSet::new(),
        maps_log: opts.preload.is_some().then(|| (maps_file, Vec::new())),
        own: ManagedRanges::default(),
        released_due: Vec::new(),
        released_new: Vec::new(),
        freed: Vec::new(),
        refs: 0,
        encoders: opts.codecs.iter().map(|&c| PageEncoder::new(c)).collect(),
        touched: HashSet::new(),
        page: vec![0; PAGE_SIZE],
        out: vec![0; PAGE_SIZE],
        back: vec![0; PAGE_SIZE],
        compress_ns: vec![0; opts.codecs.len()],
        decompress_ns: vec![0; opts.codecs.len()],
        pages: 0,
    };
    let mut st = ConvertStats::default();
    let every = opts.snapshot_every.max(1);
    let mut since = 0u64;
    let r = {
        let snap = &mut snap;
        let st_ptr = &mut st;
        let mut local = ConvertStats::default();
        let res = convert(BufReader::with_capacity(1 << 20, reader), &mut w, &mut local, |w, p| {
            snap.reference(w, p)?;
            since += 1;
            if since >= every {
                since = 0;
                snap.snapshot(w, st_ptr)?;
            }
            Ok(())
        });
        st.lines = local.lines;
        st.references = local.references;
        res
    };
    let status: ExitStatus = waiter.join().map_err(|_| io::Error::other("waiter thread panicked"))??;
    r?;
    if st.references == 0 {
        return Err(LackeyError::NoReferences(format!("exit status {status}")));
    }
    st.exit_code = status.code();
    w.finish()?;
    // Patch the measured codec costs into the header.
    for (i, _) in opts.codecs.iter().enumerate() {
        let n = snap.pages.max(1) as u128;
        let c = (snap.compress_ns[i] / n).min(u32::MAX as u128) as u32;
        let d = (snap.decompress_ns[i] / n).min(u32::MAX as u128) as u32;
        out.seek(SeekFrom::Start(16 + 9 * i as u64 + 1))?;
        out.write_all(&c.to_le_bytes())?;
        out.write_all(&d.to_le_bytes())?;
    }
    out.flush()?;
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lackey_lines() {
        assert_eq!(
            parse_line(" L 1fff000838,8\n"),
            Ok(Some(Access { first: 0x1fff000, last: 0x1fff000, write: false }))
        );
        assert_eq!(
            parse_line(" S 0421cffc,8"),
            Ok(Some(Access { first: 0x421c, last: 0x421d, write: true }))
        );
        assert_eq!(
            parse_line(" M 0421c3f0,4"),
            Ok(Some(Access { first: 0x421c, last: 0x421c, write: true }))
        );
        assert_eq!(parse_line("I  0401ab70,3"), Ok(None));
        assert_eq!(parse_line("==18439== Lackey, an example Valgrind tool"), Ok(None));
        assert_eq!(parse_line(""), Ok(None));
        assert_eq!(parse_line(" L zz,8"), Err(BadLine));
        assert_eq!(parse_line(" L 1000,0"), Err(BadLine));
        assert_eq!(parse_line(" L ffffffffffffffff,8"), Err(BadLine));
    }

    /// The library's log: mapped ranges of this process, less what it
    /// unmapped (ranges cut in two), other processes' lines ignored; with
    /// it, anonymous memory outside them is unmanaged, inside it managed.
    /// A freed block's pages are released but those the trace never saw
    /// and those referenced after its line was read (handed out again).
    #[test]
    fn a_freed_block_releases_the_pages_seen_and_not_touched_since() {
        let mut f = Freed { lo: 0x100, hi: 0x108, due: FREED_LAG, since: HashSet::new() };
        f.since.insert(0x103);
        assert_eq!(f.gone(|&p| p != 0x107), vec![0x100, 0x101, 0x102, 0x104, 0x105, 0x106]);
    }

    #[test]
    fn logged_ranges_decide_which_anonymous_pages_are_managed() {
        let mut own = ManagedRanges::default();
        for l in [
            "1f m 58c25000 258c65000",
            "1f m 4a00000 4a10000",
            "1f u 4a04000 4a06000",
            "20 m 4835000 4837000",
            "1f m 5000000 5004000",
            "1f u 5000000 5004000",
            "garbage",
        ] {
            own.apply(l, 0x1f);
        }
        assert_eq!(own.lines, 5);
        assert_eq!(own.apply("1f u 4a0f000 4a10800", 0x1f), Some((0x4a0f, 0x4a11)));
        own.apply("1f m 4a0f000 4a10000", 0x1f);
        let managed: Vec<u64> = [0x4a00, 0x4a03, 0x4a04, 0x4a05, 0x4a06, 0x4a0f, 0x4a10]
            .into_iter()
            .filter(|&p| own.contains(p))
            .collect();
        assert_eq!(managed, vec![0x4a00, 0x4a03, 0x4a06, 0x4a0f]);
        assert!(!own.contains(0x5000) && !own.contains(0x4835));
        // A freed block's release leaves its pages managed.
        assert_eq!(own.apply("1f r 4a00000 4a02000", 0x1f), None);
        assert!(own.contains(0x4a00) && own.contains(0x4a01));
        assert_eq!(ManagedRanges::freed("1f r 4a00000 4a02000", 0x1f), Some((0x4a00, 0x4a02)));
        assert_eq!(ManagedRanges::freed("20 r 4a00000 4a02000", 0x1f), None);
        assert_eq!(ManagedRanges::freed("1f u 4a00000 4a02000", 0x1f), None);
        let maps = "\
04835000-04837000 rw-p 00000000 00:00 0 \n\
04a00000-04a10000 rw-p 00000000 00:00 0 \n\
58c25000-258c65000 rw-p 00000000 00:00 0                                 [heap]\n\
7efd90df1000-7efd90df3000 rw-p 001d3000 fe:00 326279                     /usr/lib/x86_64-linux-gnu/libc.so.6\n";
        let pages = [0x4835, 0x4a00, 0x4a04, 0x58c40, 0x7efd90df1, 0x9000];
        // Without the log only the file's page is unmanaged; with it also
        // the anonymous pages nobody logged (the dynamic linker's, and a
        // logged range's unmapped middle, mapped again by someone else).
        assert_eq!(unmanaged_pages(maps, &pages, true, None), vec![0x7efd90df1]);
        assert_eq!(unmanaged_pages(maps, &pages, true, Some(&own)), vec![0x4835, 0x4a04, 0x7efd90df1]);
    }

    /// A valgrind process's maps (lines of a real one): the program's
    /// file mappings and the client stack are unmanaged, its anonymous
    /// memory (heap, arenas) is not, and a page in no mapping is neither.
    #[test]
    fn file_mappings_and_the_client_stack_are_unmanaged() {
        let maps = "\
04035000-04056000 rwxp 00000000 00:00 0 \n\
55a9cc5f3000-55a9cc5f4000 rw-p 00003000 fe:00 18504                      /usr/bin/python3.11\n\
7efd902fb000-7efd90731000 rw-p 00000000 00:00 0 \n\
7efd90df1000-7efd90df3000 rw-p 001d3000 fe:00 326279                     /usr/lib/x86_64-linux-gnu/libc.so.6\n\
7efd90df3000-7efd90e00000 rw-p 00000000 00:00 0                          [anon:glibc]\n\
58c25000-258c65000 rw-p 00000000 00:00 0                                 [heap]\n\
1ffeffd000-1fff001000 rw-p 00000000 00:00 0 \n\
7ffe336f0000-7ffe33711000 rw-p 00000000 00:00 0                          [stack]\n";
        let pages = [
            0x4040,
            0x55a9cc5f3,
            0x7efd90300,
            0x7efd90df1,
            0x7efd90df5,
            0x58c40,
            0x1fff000,
            0x7ffe336f1,
            0x5000,
        ];
        assert_eq!(
            unmanaged_pages(maps, &pages, false, None),
            vec![0x55a9cc5f3, 0x7efd90df1, 0x1fff000, 0x7ffe336f1]
        );
    }

    /// In the run's layout the client's break (glibc's heap, `rwx` under
    /// valgrind) and an ELF file's zero-filled tail are unmanaged too; an
    /// anonymous mapping merged past the tail is managed beyond it.
    #[test]
    fn in_the_runs_layout_glibcs_heap_and_bss_are_unmanaged() {
        // A 64-bit ELF header and two PT_LOADs: [0, 0x1800) and
        // [0x2000, 0x7000) of which 0x100 bytes from the file.
        let mut elf = vec![0u8; 64 + 2 * 56];
        elf[..5].copy_from_slice(b"\x7fELF\x02");
        elf[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&2u16.to_le_bytes());
        for (i, (vaddr, filesz, memsz)) in
            [(0u64, 0x1800u64, 0x1800u64), (0x2000, 0x100, 0x5000)].into_iter().enumerate()
        {
            let e = &mut elf[64 + 56 * i..64 + 56 * (i + 1)];
            e[..4].copy_from_slice(&1u32.to_le_bytes());
            e[0x10..0x18].copy_from_slice(&vaddr.to_le_bytes());
            e[0x20..0x28].copy_from_slice(&filesz.to_le_bytes());
            e[0x28..0x30].copy_from_slice(&memsz.to_le_bytes());
        }
        let path = std::env::temp_dir().join(format!("ztier-lackey-elf-{}", std::process::id()));
        std::fs::write(&path, &elf).unwrap();
        let p = path.display();
        let maps = format!(
            "00400000-00402000 r--p 00000000 fe:00 1 {p}\n\
             00402000-00403000 rw-p 00002000 fe:00 1 {p}\n\
             00403000-00409000 rw-p 00000000 00:00 0 \n\
             04035000-04056000 rwxp 00000000 00:00 0 \n\
             05371000-05675000 rw-p 00000000 00:00 0 \n"
        );
        let pages = [0x400, 0x402, 0x403, 0x406, 0x407, 0x408, 0x4040, 0x5400];
        let run = unmanaged_pages(&maps, &pages, true, None);
        let glibc = unmanaged_pages(&maps, &pages, false, None);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(run, vec![0x400, 0x402, 0x403, 0x406, 0x4040]);
        assert_eq!(glibc, vec![0x400, 0x402]);
    }
}
