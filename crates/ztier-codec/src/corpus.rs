//! Page corpora: `.pages` files, live-process samples, synthetic pages.
//!
//! ## `.pages` format
//!
//! A `.pages` file is nothing but whole 4 KiB pages, concatenated:
//!
//! ```text
//! offset 0        4096       8192             N*4096
//!        +---------+----------+-- ... --+---------+
//!        | page 0  | page 1   |         | page N-1|
//!        +---------+----------+-- ... --+---------+
//! ```
//!
//! There is no header (the files come from `/proc/PID/mem` dumps); a file
//! whose length is not a multiple of 4096 is rejected.
//!
//! ## Live processes
//!
//! [`sample_pid`] reads the private writable mappings of a running process
//! (`/proc/PID/maps` + `/proc/PID/mem`, which needs root or ptrace rights
//! over it) and returns every page (or a uniform sample of them).
//!
//! ## Synthetic pages
//!
//! [`synth`] makes word-structured pages (small integers, pointers into a
//! region, zeros, text, random bytes) so tests never depend on the bundled
//! corpus being the only data.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::PAGE_SIZE;

/// Why a corpus could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is not whole 4 KiB pages.
    #[error("{path}: {len} bytes is not a whole number of 4096-byte pages")]
    NotPages {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: u64,
    },
    /// The file holds no pages.
    #[error("{path}: empty corpus file")]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The process could not be sampled.
    #[error("cannot sample process {pid}: {reason}")]
    Process {
        /// The process id.
        pid: u32,
        /// What went wrong, in words.
        reason: String,
    },
}

/// A set of pages held in one buffer.
#[derive(Debug, Clone, Default)]
pub struct Corpus {
    /// Where the pages came from (file names or `pid:N`).
    pub sources: Vec<String>,
    data: Vec<u8>,
}

impl Corpus {
    /// An empty corpus.
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds a corpus from whole pages in `data`.
    pub fn from_bytes(source: impl Into<String>, data: Vec<u8>) -> Self {
        assert_eq!(data.len() % PAGE_SIZE, 0, "corpus data must be whole pages");
        Corpus { sources: vec![source.into()], data }
    }

    /// Loads a `.pages` file and appends its pages.
    pub fn add_file(&mut self, path: &Path) -> Result<(), CorpusError> {
        let io = |source| CorpusError::Io { path: path.to_owned(), source };
        let mut f = File::open(path).map_err(io)?;
        let len = f.metadata().map_err(io)?.len();
        if len % PAGE_SIZE as u64 != 0 {
            return Err(CorpusError::NotPages { path: path.to_owned(), len });
        }
        if len == 0 {
            return Err(CorpusError::Empty { path: path.to_owned() });
        }
        let start = self.data.len();
        self.data.resize(start + len as usize, 0);
        f.read_exact(&mut self.data[start..]).map_err(io)?;
        self.sources.push(path.display().to_string());
        Ok(())
    }

    /// Loads several `.pages` files into one corpus.
    pub fn load(paths: &[PathBuf]) -> Result<Self, CorpusError> {
        let mut c = Corpus::new();
        for p in paths {
            c.add_file(p)?;
        }
        Ok(c)
    }

    /// Number of pages.
    pub fn len(&self) -> usize {
        self.data.len() / PAGE_SIZE
    }

    /// True if the corpus holds no pages.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Page `i`.
    pub fn page(&self, i: usize) -> &[u8] {
        &self.data[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]
    }

    /// All pages, in order.
    pub fn pages(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        self.data.chunks_exact(PAGE_SIZE)
    }

    /// All the bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.data
    }
}

/// One private writable mapping of a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// Start address.
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// The path column of `/proc/PID/maps` (empty for anonymous memory).
    pub name: String,
}

/// Parses `/proc/PID/maps` text, keeping private writable mappings that hold
/// process data (heap, stacks, anonymous memory, writable file data) and
/// skipping `[vvar]`/`[vsyscall]`/`[vdso]`.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(range), Some(perms)) = (it.next(), it.next()) else { continue };
        let name = it.nth(3).unwrap_or("").to_string();
        let p = perms.as_bytes();
        if p.len() < 4 || p[0] != b'r' || p[1] != b'w' || p[3] != b'p' {
            continue;
        }
        if matches!(name.as_str(), "[vvar]" | "[vsyscall]" | "[vdso]" | "[vvar_vclock]") {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else { continue };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        if end > start {
            out.push(Mapping { start, end, name });
        }
    }
    out
}

/// Reads up to `max_pages` pages (uniformly sampled when the process has
/// more) from the private writable mappings of process `pid`. Pages the
/// kernel refuses to read (guard pages, races with munmap) are skipped.
pub fn sample_pid(pid: u32, max_pages: usize) -> Result<Corpus, CorpusError> {
    let perr = |reason: String| CorpusError::Process { pid, reason };
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map_err(|e| perr(format!("reading /proc/{pid}/maps: {e}")))?;
    let maps = parse_maps(&maps);
    let total: u64 = maps.iter().map(|m| (m.end - m.start) / PAGE_SIZE as u64).sum();
    if total == 0 {
        return Err(perr("no private writable mappings".into()));
    }
    let mut mem = File::open(format!("/proc/{pid}/mem")).map_err(|e| {
        perr(format!(
            "opening /proc/{pid}/mem: {e} (reading another process's memory needs root or ptrace rights)"
        ))
    })?;
    let stride = (total as f64 / max_pages.max(1) as f64).max(1.0);
    let mut data = Vec::new();
    let mut page = vec![0u8; PAGE_SIZE];
    let mut next = 0.0f64;
    let mut idx = 0u64;
    for m in &maps {
        let n = (m.end - m.start) / PAGE_SIZE as u64;
        for k in 0..n {
            if (idx as f64) >= next && data.len() / PAGE_SIZE < max_pages {
                next += stride;
                let addr = m.start + k * PAGE_SIZE as u64;
                if mem.seek(SeekFrom::Start(addr)).is_ok() && mem.read_exact(&mut page).is_ok() {
                    data.extend_from_slice(&page);
                }
            }
            idx += 1;
        }
    }
    if data.is_empty() {
        return Err(perr("no readable pages".into()));
    }
    Ok(Corpus { sources: vec![format!("pid:{pid}")], data })
}

/// Synthetic word-structured pages for tests and benchmarks.
pub mod synth {
    use crate::PAGE_SIZE;

    /// A small deterministic generator (xorshift64*), so tests need no
    /// random-number crate and are reproducible.
    #[derive(Debug, Clone)]
    pub struct Rng(u64);

    impl Rng {
        /// A generator from a seed.
        pub fn new(seed: u64) -> Self {
            Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
        }
        /// The next 64 random bits.
        pub fn next_u64(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        /// A number below `n` (n > 0).
        pub fn below(&mut self, n: u64) -> u64 {
            self.next_u64() % n
        }
    }

    /// Kinds of synthetic page.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Kind {
        /// 32-bit small integers with many zeros.
        SmallInts,
        /// 64-bit pointers into one 16 MiB heap region, interleaved with
        /// small integers and zeros (a typical heap page).
        Pointers,
        /// English-like text.
        Text,
        /// Uniformly random bytes (incompressible).
        Random,
        /// Mostly zero with a few scattered words.
        Sparse,
    }

    /// Every kind.
    pub const KINDS: [Kind; 5] = [Kind::SmallInts, Kind::Pointers, Kind::Text, Kind::Random, Kind::Sparse];

    /// Fills `buf` (a multiple of 8 bytes) with data of `kind`.
    pub fn fill(buf: &mut [u8], kind: Kind, rng: &mut Rng) {
        const WORDS: [&str; 12] = [
            "the ",
            "page ",
            "cache ",
            "of ",
            "memory ",
            "compressed ",
            "is ",
            "a ",
            "fault ",
            "and ",
            "swap ",
            "\n",
        ];
        match kind {
            Kind::SmallInts => {
                for w in buf.chunks_exact_mut(4) {
                    let v = if rng.below(3) == 0 { 0 } else { rng.below(1000) as u32 };
                    w.copy_from_slice(&v.to_le_bytes());
                }
            }
            Kind::Pointers => {
                let base = 0x5555_5000_0000u64 + (rng.below(16) << 24);
                for w in buf.chunks_exact_mut(8) {
                    let v = match rng.below(4) {
                        0 => 0,
                        1 => rng.below(64),
                        _ => base + (rng.below(1 << 21) << 3),
                    };
                    w.copy_from_slice(&v.to_le_bytes());
                }
            }
            Kind::Text => {
                let mut i = 0;
                while i < buf.len() {
                    let word = WORDS[rng.below(WORDS.len() as u64) as usize].as_bytes();
                    let n = word.len().min(buf.len() - i);
                    buf[i..i + n].copy_from_slice(&word[..n]);
                    i += n;
                }
            }
            Kind::Random => {
                for w in buf.chunks_exact_mut(8) {
                    w.copy_from_slice(&rng.next_u64().to_le_bytes());
                }
            }
            Kind::Sparse => {
                buf.fill(0);
                for _ in 0..8 {
                    let at = rng.below((buf.len() / 8) as u64) as usize * 8;
                    buf[at..at + 8].copy_from_slice(&rng.next_u64().to_le_bytes());
                }
            }
        }
    }

    /// One page of `kind`.
    pub fn page(kind: Kind, seed: u64) -> Vec<u8> {
        let mut p = vec![0u8; PAGE_SIZE];
        fill(&mut p, kind, &mut Rng::new(seed));
        p
    }

    /// A corpus of `n` pages cycling through every kind.
    pub fn corpus(n: usize, seed: u64) -> super::Corpus {
        let mut rng = Rng::new(seed);
        let mut data = vec![0u8; n * PAGE_SIZE];
        for (i, p) in data.chunks_exact_mut(PAGE_SIZE).enumerate() {
            fill(p, KINDS[i % KINDS.len()], &mut rng);
        }
        super::Corpus::from_bytes(format!("synthetic:{n}:{seed}"), data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_parsing_keeps_private_writable_data() {
        let text = "\
55d0c0000000-55d0c0021000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000004000 r--p 00000000 08:01 123                        /usr/lib/libc.so.6
7f0000004000-7f0000008000 rw-p 00004000 08:01 123                        /usr/lib/libc.so.6
7f0000008000-7f000000a000 rw-s 00000000 00:05 9                          /dev/shm/x
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
7ffd00100000-7ffd00102000 r--p 00000000 00:00 0                          [vvar]
";
        let m = parse_maps(text);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].name, "[heap]");
        assert_eq!(m[0].end - m[0].start, 0x21000);
        assert_eq!(m[1].name, "/usr/lib/libc.so.6");
        assert_eq!(m[2].name, "[stack]");
    }

    #[test]
    fn sampling_our_own_process_reads_real_pages() {
        // Put a recognisable pattern in our own heap and find it again.
        // The page-aligned page inside a 3-page buffer gets the pattern.
        let mut buf = vec![0u8; PAGE_SIZE * 3];
        let off = buf.as_ptr().align_offset(PAGE_SIZE);
        for (i, b) in buf[off..off + PAGE_SIZE].iter_mut().enumerate() {
            *b = (i % 251) as u8 ^ 0x5a;
        }
        let needle = buf[off..off + PAGE_SIZE].to_vec();
        let c = sample_pid(std::process::id(), usize::MAX).expect("sample self");
        assert!(c.len() > 4);
        assert!(c.pages().any(|p| p == needle.as_slice()), "the marker page was not sampled");
        drop(buf);
        let few = sample_pid(std::process::id(), 10).unwrap();
        assert!(few.len() <= 10 && !few.is_empty());
        assert!(sample_pid(u32::MAX - 1, 10).is_err());
    }

    #[test]
    fn file_errors_are_clear() {
        let dir = std::env::temp_dir().join(format!("ztier-corpus-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("bad.pages");
        std::fs::write(&bad, vec![0u8; 5000]).unwrap();
        let e = Corpus::load(&[bad]).unwrap_err();
        assert!(e.to_string().contains("not a whole number"), "{e}");
        let e = Corpus::load(&[dir.join("missing.pages")]).unwrap_err();
        assert!(e.to_string().contains("cannot read"), "{e}");
        let good = dir.join("good.pages");
        std::fs::write(&good, synth::corpus(3, 1).bytes()).unwrap();
        let c = Corpus::load(&[good.clone(), good]).unwrap();
        assert_eq!(c.len(), 6);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
