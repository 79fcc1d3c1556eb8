//! The page-trace file format.
//!
//! A trace is the sequence of page references of a program (data loads and
//! stores, as valgrind's lackey reports them), interleaved with
//! **compression records**: the compressed size of a page's content at
//! about that point of the run, for each codec named in the header.
//!
//! ```text
//!  header (16 + 9·n bytes)
//!  +--------+---------+----------+---------+-------------------------------+
//!  | "ZTRC" | version | reserved | n (u8)  | n × { codec u8,               |
//!  | 4 B    | u8 = 2  | 3 B      |  + 7 B  |       compress_ns u32 LE,     |
//!  |        |         |          |  pad    |       decompress_ns u32 LE }  |
//!  +--------+---------+----------+---------+-------------------------------+
//!  records, each starting with one LEB128 varint v; kind = v & 3:
//!   kind 0  read  of page prev + unzigzag(v >> 2)
//!   kind 1  write of page prev + unzigzag(v >> 2)
//!   kind 2  (v >> 2) more reads of the previous page (a run)
//!   kind 3  sub-record (v >> 2):
//!             0  compression record: page (varint, absolute),
//!                then n varints: compressed size per codec
//!                (0 = zero/same-filled page, 4096 = stored raw)
//!             1  end of trace: total references (varint)
//!             2  unmanaged page: page (varint, absolute) — memory `ztier run`
//!                would not manage (mapped from a file, or the main stack);
//!                written once per page, when it is first classified
//!                (version 2; version 1 traces have none and are read too)
//!             3  released page: page (varint, absolute) — the program
//!                unmapped it (`munmap`), or freed a large block whose
//!                pages the run library releases: out of memory and the
//!                store from here on, a later touch finds it new (version 3)
//! ```
//!
//! Page numbers are virtual addresses >> 12. `compress_ns` and
//! `decompress_ns` are the codec's cost per page measured on this
//! machine on the pages of the trace when it was recorded (0 = unknown).
//! Deltas keep ordinary traces at about one byte per reference; runs of
//! references to one page cost a few bytes in total.

use std::io::{self, BufRead, Write};

use ztier_codec::CodecId;

/// File magic.
pub const MAGIC: &[u8; 4] = b"ZTRC";
/// Format version written (versions 1, without unmanaged-page records,
/// and 2, without released-page records, are read as well).
pub const VERSION: u8 = 3;
/// Page numbers are below this (addresses are 64-bit, pages 4 KiB).
pub const MAX_PAGE: u64 = 1 << 52;

/// Costs and identity of one codec column of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodecColumn {
    /// The codec.
    pub codec: CodecId,
    /// Nanoseconds to compress one page (0 = unknown).
    pub compress_ns: u32,
    /// Nanoseconds to decompress one page (0 = unknown).
    pub decompress_ns: u32,
}

/// One event of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A reference to `page`, a write if `write`.
    Ref {
        /// Page number (address >> 12).
        page: u64,
        /// Store (or modify) rather than load.
        write: bool,
    },
    /// The compressed size of `page`'s content from here on, per codec
    /// column (same order as the header).
    Sizes {
        /// Page number.
        page: u64,
        /// Compressed size per codec column.
        sizes: Vec<u16>,
    },
    /// `page` is memory `ztier run` would not manage: mapped from a file
    /// (a program's or a library's data), or the main stack.
    Unmanaged {
        /// Page number.
        page: u64,
    },
    /// The program released `page` (`munmap`, or the `free` of a large
    /// block whose pages the run library releases): its content and any
    /// copy of it are gone; a later reference finds a new page.
    Released {
        /// Page number.
        page: u64,
    },
}

/// Errors reading a trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// I/O failed.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// Not a trace file.
    #[error("not a ztier trace (bad magic)")]
    BadMagic,
    /// A newer or unknown format version.
    #[error("trace format version {0} is not supported (this build reads versions 1 to {VERSION})")]
    Version(u8),
    /// Damaged content.
    #[error("corrupt trace at byte {offset}: {what}")]
    Corrupt {
        /// Byte offset of the damage.
        offset: u64,
        /// What was wrong.
        what: String,
    },
}

fn put_varint(w: &mut impl Write, mut v: u64) -> io::Result<()> {
    let mut buf = [0u8; 10];
    let mut n = 0;
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            buf[n] = b;
            n += 1;
            break;
        }
        buf[n] = b | 0x80;
        n += 1;
    }
    w.write_all(&buf[..n])
}

fn zigzag(d: i64) -> u64 {
    ((d << 1) ^ (d >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Writes a trace.
pub struct TraceWriter<W: Write> {
    w: W,
    columns: usize,
    prev: u64,
    run: u64,
    refs: u64,
}

impl<W: Write> TraceWriter<W> {
    /// Starts a trace with these codec columns.
    pub fn new(mut w: W, columns: &[CodecColumn]) -> io::Result<Self> {
        assert!(columns.len() <= 255, "at most 255 codec columns");
        w.write_all(MAGIC)?;
        w.write_all(&[VERSION, 0, 0, 0])?;
        w.write_all(&[columns.len() as u8, 0, 0, 0, 0, 0, 0, 0])?;
        for c in columns {
            w.write_all(&[c.codec as u8])?;
            w.write_all(&c.compress_ns.to_le_bytes())?;
            w.write_all(&c.decompress_ns.to_le_bytes())?;
        }
        Ok(TraceWriter { w, columns: columns.len(), prev: 0, run: 0, refs: 0 })
    }

    fn flush_run(&mut self) -> io::Result<()> {
        if self.run > 0 {
            put_varint(&mut self.w, (self.run << 2) | 2)?;
            self.run = 0;
        }
        Ok(())
    }

    /// Appends a reference. Pages are below 2^52 (64-bit addresses >> 12).
    pub fn reference(&mut self, page: u64, write: bool) -> io::Result<()> {
        if page >= MAX_PAGE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("page number {page:#x} above 2^52"),
            ));
        }
        if page == self.prev && !write && self.refs > 0 {
            self.run += 1;
        } else {
            self.flush_run()?;
            let d = page.wrapping_sub(self.prev) as i64;
            put_varint(&mut self.w, (zigzag(d) << 2) | u64::from(write))?;
            self.prev = page;
        }
        self.refs += 1;
        Ok(())
    }

    /// Appends a compression record (one size per codec column).
    pub fn sizes(&mut self, page: u64, sizes: &[u16]) -> io::Result<()> {
        assert_eq!(sizes.len(), self.columns, "one size per codec column");
        self.flush_run()?;
        put_varint(&mut self.w, 3)?;
        put_varint(&mut self.w, page)?;
        for &s in sizes {
            put_varint(&mut self.w, s as u64)?;
        }
        Ok(())
    }

    /// Appends an unmanaged-page record.
    pub fn unmanaged(&mut self, page: u64) -> io::Result<()> {
        self.flush_run()?;
        put_varint(&mut self.w, (2 << 2) | 3)?;
        put_varint(&mut self.w, page)
    }

    /// Appends a released-page record.
    pub fn released(&mut self, page: u64) -> io::Result<()> {
        self.flush_run()?;
        put_varint(&mut self.w, (3 << 2) | 3)?;
        put_varint(&mut self.w, page)
    }

    /// References written so far.
    pub fn references(&self) -> u64 {
        self.refs
    }

    /// Ends the trace and returns the writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.flush_run()?;
        put_varint(&mut self.w, (1 << 2) | 3)?;
        put_varint(&mut self.w, self.refs)?;
        self.w.flush()?;
        Ok(self.w)
    }
}

/// Reads a trace event by event.
pub struct TraceReader<R: BufRead> {
    r: R,
    /// The codec columns of the header.
    pub columns: Vec<CodecColumn>,
    prev: u64,
    run: u64,
    offset: u64,
    refs: u64,
    done: bool,
}

impl<R: BufRead> TraceReader<R> {
    /// Opens a trace, reading its header.
    pub fn new(mut r: R) -> Result<Self, TraceError> {
        let mut h = [0u8; 16];
        r.read_exact(&mut h).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => TraceError::BadMagic,
            _ => e.into(),
        })?;
        if &h[..4] != MAGIC {
            return Err(TraceError::BadMagic);
        }
        if !(1..=VERSION).contains(&h[4]) {
            return Err(TraceError::Version(h[4]));
        }
        let n = h[8] as usize;
        let mut columns = Vec::with_capacity(n);
        for i in 0..n {
            let mut c = [0u8; 9];
            r.read_exact(&mut c)?;
            let codec = CodecId::try_from(c[0]).map_err(|_| TraceError::Corrupt {
                offset: 16 + 9 * i as u64,
                what: format!("unknown codec tag {}", c[0]),
            })?;
            columns.push(CodecColumn {
                codec,
                compress_ns: u32::from_le_bytes(c[1..5].try_into().expect("4 bytes")),
                decompress_ns: u32::from_le_bytes(c[5..9].try_into().expect("4 bytes")),
            });
        }
        let offset = 16 + 9 * n as u64;
        Ok(TraceReader { r, columns, prev: 0, run: 0, offset, refs: 0, done: false })
    }

    fn varint(&mut self) -> Result<Option<u64>, TraceError> {
        let mut v = 0u64;
        let mut shift = 0;
        loop {
            let buf = self.r.fill_buf()?;
            if buf.is_empty() {
                if shift == 0 {
                    return Ok(None);
                }
                return Err(self.corrupt("truncated varint"));
            }
            let b = buf[0];
            self.r.consume(1);
            self.offset += 1;
            if shift >= 64 || (shift == 63 && b > 1) {
                return Err(self.corrupt("varint too long"));
            }
            v |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(Some(v));
            }
            shift += 7;
        }
    }

    fn corrupt(&self, what: &str) -> TraceError {
        TraceError::Corrupt { offset: self.offset, what: what.into() }
    }

    /// The next event, or `None` at the end of the trace.
    pub fn next_event(&mut self) -> Result<Option<Event>, TraceError> {
        if self.run > 0 {
            self.run -= 1;
            self.refs += 1;
            return Ok(Some(Event::Ref { page: self.prev, write: false }));
        }
        if self.done {
            return Ok(None);
        }
        let Some(v) = self.varint()? else {
            return Err(self.corrupt("trace ends without its end record (truncated?)"));
        };
        match v & 3 {
            k @ (0 | 1) => {
                let page = self.prev.wrapping_add(unzigzag(v >> 2) as u64);
                self.prev = page;
                self.refs += 1;
                Ok(Some(Event::Ref { page, write: k == 1 }))
            }
            2 => {
                if v >> 2 == 0 {
                    return Err(self.corrupt("empty run"));
                }
                self.run = (v >> 2) - 1;
                self.refs += 1;
                Ok(Some(Event::Ref { page: self.prev, write: false }))
            }
            _ => match v >> 2 {
                0 => {
                    let page = self.varint()?.ok_or_else(|| self.corrupt("truncated compression record"))?;
                    let mut sizes = Vec::with_capacity(self.columns.len());
                    for _ in 0..self.columns.len() {
                        let s = self.varint()?.ok_or_else(|| self.corrupt("truncated compression record"))?;
                        if s > 4096 {
                            return Err(self.corrupt("compressed size above 4096"));
                        }
                        sizes.push(s as u16);
                    }
                    Ok(Some(Event::Sizes { page, sizes }))
                }
                1 => {
                    let total = self.varint()?.ok_or_else(|| self.corrupt("truncated end record"))?;
                    if total != self.refs {
                        return Err(self.corrupt(&format!(
                            "end record counts {total} references, the trace holds {}",
                            self.refs
                        )));
                    }
                    self.done = true;
                    Ok(None)
                }
                2 => {
                    let page =
                        self.varint()?.ok_or_else(|| self.corrupt("truncated unmanaged-page record"))?;
                    Ok(Some(Event::Unmanaged { page }))
                }
                3 => {
                    let page =
                        self.varint()?.ok_or_else(|| self.corrupt("truncated released-page record"))?;
                    Ok(Some(Event::Released { page }))
                }
                k => Err(self.corrupt(&format!("unknown record kind 3/{k}"))),
            },
        }
    }

    /// References read so far.
    pub fn references(&self) -> u64 {
        self.refs
    }
}

/// Summary of a trace, from one pass.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct TraceInfo {
    /// Data references.
    pub references: u64,
    /// Of which writes.
    pub writes: u64,
    /// Distinct pages referenced (the footprint).
    pub distinct_pages: u64,
    /// Compression records.
    pub size_records: u64,
    /// Pages marked unmanaged (memory `ztier run` would not manage).
    pub unmanaged_pages: u64,
    /// Released-page records (pages the program unmapped).
    pub released_pages: u64,
    /// Codec names of the columns.
    pub codecs: Vec<String>,
    /// Mean compressed size per codec column over compression records.
    pub mean_sizes: Vec<f64>,
    /// Measured compress cost per page, per codec column (ns; 0 = unknown).
    pub compress_ns: Vec<u32>,
    /// Measured decompress cost per page, per codec column (ns; 0 = unknown).
    pub decompress_ns: Vec<u32>,
}

/// Reads a whole trace and summarises it.
pub fn info<R: BufRead>(r: R) -> Result<TraceInfo, TraceError> {
    let mut t = TraceReader::new(r)?;
    let mut seen = std::collections::HashSet::new();
    let mut out = TraceInfo {
        codecs: t.columns.iter().map(|c| c.codec.name().to_string()).collect(),
        compress_ns: t.columns.iter().map(|c| c.compress_ns).collect(),
        decompress_ns: t.columns.iter().map(|c| c.decompress_ns).collect(),
        ..Default::default()
    };
    let mut sums = vec![0f64; t.columns.len()];
    while let Some(e) = t.next_event()? {
        match e {
            Event::Ref { page, write } => {
                out.references += 1;
                out.writes += u64::from(write);
                seen.insert(page);
            }
            Event::Sizes { sizes, .. } => {
                out.size_records += 1;
                for (s, &x) in sums.iter_mut().zip(&sizes) {
                    *s += x as f64;
                }
            }
            Event::Unmanaged { .. } => out.unmanaged_pages += 1,
            Event::Released { .. } => out.released_pages += 1,
        }
    }
    out.distinct_pages = seen.len() as u64;
    out.mean_sizes =
        sums.iter().map(|s| if out.size_records == 0 { 0.0 } else { s / out.size_records as f64 }).collect();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cols() -> Vec<CodecColumn> {
        vec![
            CodecColumn { codec: CodecId::Wkdm, compress_ns: 3000, decompress_ns: 2000 },
            CodecColumn { codec: CodecId::Lz4, compress_ns: 5000, decompress_ns: 1000 },
        ]
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            6 => (prop_oneof![0..8u64, 0..MAX_PAGE], any::<bool>()).prop_map(|(page, write)| Event::Ref { page, write }),
            1 => (any::<u64>(), (0..=4096u16, 0..=4096u16)).prop_map(|(page, (a, b))| Event::Sizes { page, sizes: vec![a, b] }),
            1 => any::<u64>().prop_map(|page| Event::Unmanaged { page }),
            1 => any::<u64>().prop_map(|page| Event::Released { page }),
        ]
    }

    proptest! {
        #[test]
        fn round_trips(events in prop::collection::vec(event(), 0..500)) {
            let mut w = TraceWriter::new(Vec::new(), &cols()).unwrap();
            for e in &events {
                match e {
                    Event::Ref { page, write } => w.reference(*page, *write).unwrap(),
                    Event::Sizes { page, sizes } => w.sizes(*page, sizes).unwrap(),
                    Event::Unmanaged { page } => w.unmanaged(*page).unwrap(),
                    Event::Released { page } => w.released(*page).unwrap(),
                }
            }
            let bytes = w.finish().unwrap();
            let mut r = TraceReader::new(&bytes[..]).unwrap();
            prop_assert_eq!(&r.columns, &cols());
            let mut back = Vec::new();
            while let Some(e) = r.next_event().unwrap() {
                back.push(e);
            }
            prop_assert_eq!(back, events);
        }

        #[test]
        fn damaged_traces_are_errors_not_panics(cut in 0usize..400, flip in 0usize..400, bit in 0u8..8) {
            let mut w = TraceWriter::new(Vec::new(), &cols()).unwrap();
            for i in 0..300u64 {
                w.reference(i * 7 % 50, i % 3 == 0).unwrap();
                if i % 50 == 0 {
                    w.sizes(i, &[100, 200]).unwrap();
                }
            }
            let mut bytes = w.finish().unwrap();
            if flip < bytes.len() {
                bytes[flip] ^= 1 << bit;
            }
            bytes.truncate(bytes.len().min(cut.max(1) * 3));
            if let Ok(mut r) = TraceReader::new(&bytes[..]) {
                let mut n = 0;
                while let Ok(Some(_)) = r.next_event() {
                    n += 1;
                    prop_assert!(n < 100_000);
                }
            }
        }
    }

    #[test]
    fn runs_cost_a_few_bytes_and_errors_are_named() {
        let mut w = TraceWriter::new(Vec::new(), &[]).unwrap();
        for _ in 0..100_000 {
            w.reference(0x1234, false).unwrap();
        }
        let bytes = w.finish().unwrap();
        assert!(bytes.len() < 40, "{} bytes", bytes.len());
        assert_eq!(info(&bytes[..]).unwrap().references, 100_000);
        assert!(matches!(TraceReader::new(&b"nope, not a trace"[..]), Err(TraceError::BadMagic)));
        let mut w = TraceWriter::new(Vec::new(), &[]).unwrap();
        assert!(w.reference(MAX_PAGE, false).is_err());
        let mut v = bytes.clone();
        v[4] = 9;
        assert!(matches!(TraceReader::new(&v[..]), Err(TraceError::Version(9))));
        // Version 1 (no unmanaged-page records) is read as well.
        v[4] = 1;
        assert_eq!(info(&v[..]).unwrap().references, 100_000);
        let cut = &bytes[..bytes.len() - 2];
        let mut r = TraceReader::new(cut).unwrap();
        let err = loop {
            match r.next_event() {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("a truncated trace read to the end"),
                Err(e) => break e,
            }
        };
        assert!(err.to_string().contains("truncated") || err.to_string().contains("end record"), "{err}");
    }
}
