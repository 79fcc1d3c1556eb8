//! WKdm — the Wilson/Kaplan direct-mapped word codec (Wilson, Kaplan and
//! Smaragdakis, "The Case for Compressed Caching in Virtual Memory Systems",
//! USENIX 1999).
//!
//! The page is read as 32-bit little-endian words. A 16-entry direct-mapped
//! dictionary of recently seen words is indexed by a hash of a word's high
//! 22 bits. Each word gets a 2-bit tag:
//!
//! | tag | name    | meaning                                   | extra output          |
//! |-----|---------|-------------------------------------------|-----------------------|
//! | 0   | zero    | the word is 0                             | —                     |
//! | 1   | exact   | the dictionary entry equals the word      | 4-bit index           |
//! | 2   | partial | same high 22 bits as the dictionary entry | 4-bit index, low 10 bits |
//! | 3   | miss    | anything else                             | the full 32-bit word  |
//!
//! Partial matches and misses replace the dictionary entry with the word.
//! The dictionary starts all zero, so small integers (high bits zero) are
//! partial matches from the first word on.
//!
//! ## Format (version 1)
//!
//! The outputs of each kind are kept in separate, densely packed segments, as
//! in the paper, so that the decoder can unpack each segment with simple
//! word-parallel code. All multi-byte fields are little-endian.
//!
//! ```text
//!  byte 0     1      2..4      4..6      6..8      8..10
//! +--------+------+---------+---------+---------+---------+
//! | 0x01   | 0x00 | n_words | n_full  | n_index | n_low   |   header, 10 bytes
//! +--------+------+---------+---------+---------+---------+
//! | tags: ceil(n_words / 4) bytes; word i's tag is bits     |
//! |       2*(i%4)..2*(i%4)+2 of byte i/4                    |
//! +---------------------------------------------------------+
//! | full words: n_full × 4 bytes, in word order              |
//! +---------------------------------------------------------+
//! | indices: ceil(n_index / 2) bytes; index k is the low     |
//! |          nibble of byte k/2 when k is even, else high    |
//! +---------------------------------------------------------+
//! | low bits: ceil(n_low / 4) groups of 5 bytes; a group is  |
//! |           a 40-bit little-endian number holding 4 10-bit |
//! |           values, the first in bits 0..10                |
//! +---------------------------------------------------------+
//! ```
//!
//! `n_index` = exact + partial tags, `n_low` = partial tags, `n_full` = miss
//! tags; the decoder checks these counts against the tags and the total
//! length against `src.len()` before decoding, so a corrupt page is an error,
//! never an out-of-bounds access. Unused bits in the last byte or group of a
//! segment are zero.
//!
//! ## Kernels
//!
//! The loops that model words (encoder) and rebuild them through the
//! dictionary (decoder) come in several implementations, the [`Kernel`]s;
//! each writes and reads the format above byte for byte alike, and tests
//! and the `wkdm_kernels` fuzz target check every kernel the CPU runs
//! against the safe one, on every corpus page too. [`Wkdm::new`] runs the
//! fastest the CPU has ([`Kernel::best`]) unless [`KERNEL_ENV`] names one.
//!
//! - [`Kernel::Safe`] (this file): safe Rust, a branch per word. The only
//!   kernel of a build with the crate's `safe` feature, which leaves the
//!   others out and forbids `unsafe` in this module.
//! - [`Kernel::Scalar`] (`scalar`): a branch-free encoder loop (every
//!   candidate output written at its segment's cursor, only the cursors
//!   the tag selects advance) and a `match` per tag in the decoder, as in
//!   xnu's decoder, without bounds checks (the validation below makes the
//!   cursors stay in bounds).
//! - [`Kernel::Avx2`] (`avx2`): 8 words at a time in vector registers,
//!   the dictionary in a short branch-free scalar loop. Its module says
//!   how.
//! - [`Kernel::Avx512`] (`avx512`, built only with the `avx512` feature):
//!   16 words at a time with the dictionary in a register, resolved within
//!   the 16 by `vpconflictd`. Default builds leave it out because the
//!   machines the tests run on (AMD with AVX2) cannot execute it, nor can
//!   the emulators packaged for them (QEMU's user mode and valgrind stop
//!   at its first instruction with SIGILL); `cargo test --release -p
//!   ztier-codec --features avx512` tests it on a CPU that has it. It is
//!   not faster everywhere: on an Intel Xeon it ran at about half the
//!   AVX2 kernel's speed (its module says more).
//!
//! The decoder first validates the header against the tags and the length
//! (`Layout::check`), so a corrupt page is an error before any kernel
//! runs, then unpacks the indices and low bits one entry each. Work
//! buffers live in the codec value; nothing is allocated per call.
//!
//! Measurements (each kernel against C LZ4 in the same run, and what was
//! tried) are in `docs/measurements/`.

// The `safe` feature builds the safe kernel alone, and no `unsafe` here.
#![cfg_attr(feature = "safe", forbid(unsafe_code))]

use crate::{check_input_len, check_output_len, Codec, CodecId, CompressError, DecompressError, MAX_INPUT};

/// Format version byte.
pub const VERSION: u8 = 1;
/// Header length in bytes.
pub const HEADER: usize = 10;
pub(crate) const MAX_WORDS: usize = MAX_INPUT / 4;
/// Words between two early-abort checks while compressing.
pub(crate) const CHECK_EVERY: usize = 256;

pub(crate) const LOW_MASK: u32 = 0x3ff;

/// The multiplier of the dictionary's hash.
pub(crate) const HASH: u32 = 0x9E37_79B1;

/// Dictionary slot of a word: a multiplicative hash of its high 22 bits.
#[inline(always)]
fn slot(w: u32) -> usize {
    ((w >> 10).wrapping_mul(HASH) >> 28) as usize
}

/// Size of the packed output for the given counts.
#[inline]
pub(crate) fn packed_len(n_words: usize, n_full: usize, n_index: usize, n_low: usize) -> usize {
    HEADER + n_words.div_ceil(4) + 4 * n_full + n_index.div_ceil(2) + 5 * n_low.div_ceil(4)
}

// The kernels with `unsafe` code; the `safe` feature leaves them out.
#[cfg(all(not(feature = "safe"), target_arch = "x86_64"))]
mod avx2;
#[cfg(all(not(feature = "safe"), feature = "avx512", target_arch = "x86_64"))]
mod avx512;
#[cfg(not(feature = "safe"))]
mod scalar;

/// Which implementation of WKdm's loops a [`Wkdm`] runs. They all read and
/// write the same format, byte for byte (tests and a fuzz target compare
/// every kernel the CPU runs with [`Kernel::Safe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Safe Rust only: the reference the other kernels are tested against,
    /// and the only kernel of a build with the `safe` feature.
    Safe,
    /// Scalar loops without bounds checks: a branch-free encoder, and a
    /// `match` on each tag in the decoder (xnu's decoder's loop).
    Scalar,
    /// x86-64 with AVX2 (and POPCNT): 8 words at a time in both directions.
    Avx2,
    /// x86-64 with AVX-512F and AVX-512CD (and BMI2, POPCNT): 16 words at a
    /// time with the dictionary in a register. Built only with the
    /// `avx512` feature (see the crate docs for how to test it).
    Avx512,
}

/// The environment variable that picks the kernel [`Wkdm::new`] runs
/// (`safe`, `scalar`, `avx2` or `avx512`), for measurements and tests; by
/// default the fastest one the CPU runs ([`Kernel::best`]).
pub const KERNEL_ENV: &str = "ZTIER_WKDM_KERNEL";

impl Kernel {
    /// Every kernel, slowest first.
    pub const ALL: [Kernel; 4] = [Kernel::Safe, Kernel::Scalar, Kernel::Avx2, Kernel::Avx512];

    /// The kernel's name, as [`KERNEL_ENV`] takes it.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Safe => "safe",
            Kernel::Scalar => "scalar",
            Kernel::Avx2 => "avx2",
            Kernel::Avx512 => "avx512",
        }
    }

    /// Whether this build has the kernel: the `safe` feature builds
    /// [`Kernel::Safe`] alone; [`Kernel::Avx512`] needs the `avx512`
    /// feature; the vector kernels need x86-64.
    pub fn built(self) -> bool {
        match self {
            Kernel::Safe => true,
            Kernel::Scalar => cfg!(not(feature = "safe")),
            Kernel::Avx2 => cfg!(all(not(feature = "safe"), target_arch = "x86_64")),
            Kernel::Avx512 => cfg!(all(not(feature = "safe"), feature = "avx512", target_arch = "x86_64")),
        }
    }

    /// Whether this build has the kernel and this CPU runs it.
    pub fn available(self) -> bool {
        match self {
            Kernel::Safe => true,
            #[cfg(not(feature = "safe"))]
            Kernel::Scalar => true,
            #[cfg(all(not(feature = "safe"), target_arch = "x86_64"))]
            Kernel::Avx2 => avx2::available(),
            #[cfg(all(not(feature = "safe"), feature = "avx512", target_arch = "x86_64"))]
            Kernel::Avx512 => avx512::available(),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The fastest kernel this build and CPU run.
    pub fn best() -> Kernel {
        *Kernel::ALL.iter().rev().find(|k| k.available()).unwrap_or(&Kernel::Safe)
    }

    /// The kernel [`Wkdm::new`] runs: the one [`KERNEL_ENV`] names, else
    /// [`Kernel::best`]. A name that is not a kernel, or a kernel this
    /// build or CPU lacks, is reported on stderr once and the best kernel
    /// runs instead.
    pub fn selected() -> Kernel {
        static SELECTED: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
        *SELECTED.get_or_init(|| {
            let Ok(name) = std::env::var(KERNEL_ENV) else { return Kernel::best() };
            match name.parse::<Kernel>() {
                Ok(k) if k.available() => k,
                Ok(k) => {
                    let best = Kernel::best();
                    eprintln!(
                        "ztier-codec: {KERNEL_ENV}={name}: this {} run the {} kernel; WKdm runs the {} kernel",
                        if k.built() { "CPU cannot" } else { "build does not" },
                        k.name(),
                        best.name()
                    );
                    best
                }
                Err(e) => {
                    let best = Kernel::best();
                    eprintln!("ztier-codec: {KERNEL_ENV}: {e}; WKdm runs the {} kernel", best.name());
                    best
                }
            }
        })
    }
}

/// A kernel name that is not one of [`Kernel::ALL`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown WKdm kernel {0:?} (expected safe, scalar, avx2 or avx512)")]
pub struct UnknownKernel(pub String);

impl std::str::FromStr for Kernel {
    type Err = UnknownKernel;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Kernel::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| UnknownKernel(s.to_string()))
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// WKdm with its work buffers.
pub struct Wkdm {
    seg: Segments,
    kernel: Kernel,
}

impl std::fmt::Debug for Wkdm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Wkdm({})", self.kernel)
    }
}

impl Default for Wkdm {
    fn default() -> Self {
        Self::new()
    }
}

fn boxed<T: Copy + Default, const N: usize>() -> Box<[T; N]> {
    vec![T::default(); N].into_boxed_slice().try_into().map_err(|_| ()).expect("length N")
}

impl Wkdm {
    /// A new codec running [`Kernel::selected`].
    pub fn new() -> Self {
        Wkdm { seg: Segments::new(), kernel: Kernel::selected() }
    }

    /// A new codec running `kernel`, if this build and CPU run it.
    pub fn with_kernel(kernel: Kernel) -> Option<Self> {
        kernel.available().then(|| Wkdm { seg: Segments::new(), kernel })
    }

    /// The kernel this codec runs.
    pub fn kernel(&self) -> Kernel {
        self.kernel
    }
}

/// Entries past the largest count in the unpacked index and low-bits
/// buffers.
const SLACK: usize = 32;

/// The unpacked segments of a WK-format page, reused between calls. WK4x4
/// shares this layout and code; only the dictionary differs.
pub(crate) struct Segments {
    pub(crate) tags: Box<[u8; MAX_WORDS]>,
    // The segments have SLACK entries past the most a page can hold: the
    // vector kernels load and store 8 or 16 entries at a time at a cursor.
    pub(crate) index: Box<[u8; MAX_WORDS + SLACK]>,
    pub(crate) low: Box<[u16; MAX_WORDS + SLACK]>,
    pub(crate) full: Box<[u32; MAX_WORDS + SLACK]>,
}

impl Segments {
    pub(crate) fn new() -> Self {
        Segments { tags: boxed(), index: boxed(), low: boxed(), full: boxed() }
    }

    /// Writes header and segments for `n` words with the given counts into
    /// `dst`, which must hold `packed_len` bytes. Returns that length.
    pub(crate) fn pack(&mut self, version: u8, n: usize, c: Counts, dst: &mut [u8]) -> usize {
        let Counts { full: nf, index: ni, low: nl } = c;
        let total = packed_len(n, nf, ni, nl);
        let out = &mut dst[..total];
        out[0] = version;
        out[1] = 0;
        out[2..4].copy_from_slice(&(n as u16).to_le_bytes());
        out[4..6].copy_from_slice(&(nf as u16).to_le_bytes());
        out[6..8].copy_from_slice(&(ni as u16).to_le_bytes());
        out[8..10].copy_from_slice(&(nl as u16).to_le_bytes());
        let mut at = HEADER;
        // Zero the padding entries so that unused bits come out zero.
        let tag_bytes = n.div_ceil(4);
        self.tags[n..4 * tag_bytes].fill(0);
        self.index[ni..ni.next_multiple_of(2)].fill(0);
        self.low[nl..nl.next_multiple_of(4)].fill(0);
        // Tags, 4 per byte: four tag bytes read as one word, folded.
        for (o, t) in out[at..at + tag_bytes].iter_mut().zip(self.tags.chunks_exact(4)) {
            let x = u32::from_le_bytes(t.try_into().expect("4 bytes"));
            *o = (x | (x >> 6) | (x >> 12) | (x >> 18)) as u8;
        }
        at += tag_bytes;
        // Full words.
        for (o, w) in out[at..at + 4 * nf].chunks_exact_mut(4).zip(self.full[..nf].iter()) {
            o.copy_from_slice(&w.to_le_bytes());
        }
        at += 4 * nf;
        // Indices, 2 per byte.
        let idx_bytes = ni.div_ceil(2);
        for (o, p) in out[at..at + idx_bytes].iter_mut().zip(self.index.chunks_exact(2)) {
            *o = p[0] | (p[1] << 4);
        }
        at += idx_bytes;
        // Low bits, 4 per 5-byte group.
        for (o, g) in out[at..].chunks_exact_mut(5).zip(self.low.chunks_exact(4)) {
            let v = g[0] as u64 | (g[1] as u64) << 10 | (g[2] as u64) << 20 | (g[3] as u64) << 30;
            o.copy_from_slice(&v.to_le_bytes()[..5]);
        }
        total
    }

    /// Validates `src` as a page of `dst_len` bytes written with `version`
    /// and unpacks its segments. On success the tags, full words, indices
    /// and low bits are in the buffers and the counts are consistent with
    /// the tags, which is what the unchecked decode loops rely on.
    pub(crate) fn unpack(
        &mut self,
        version: u8,
        src: &[u8],
        dst_len: usize,
    ) -> Result<Counts, DecompressError> {
        let lay = Layout::check(version, src, dst_len)?;
        self.unpack_layout(src, &lay);
        Ok(lay.counts)
    }

    /// Unpacks every segment of a page `lay` validated.
    fn unpack_layout(&mut self, src: &[u8], lay: &Layout) {
        self.unpack_tags_full(src, lay);
        self.unpack_index_low(src, lay);
    }

    /// Unpacks the tags (one byte per word) and the full words of a
    /// validated page.
    fn unpack_tags_full(&mut self, src: &[u8], lay: &Layout) {
        // Tags, one byte per word (4 at a time through a table).
        for (t4, &b) in self.tags.chunks_exact_mut(4).zip(&src[lay.tags()]) {
            t4.copy_from_slice(&TAG_UNPACK[b as usize].to_le_bytes());
        }
        for (f, c) in self.full.iter_mut().zip(src[lay.full()].chunks_exact(4)) {
            *f = u32::from_le_bytes(c.try_into().expect("4 bytes"));
        }
    }

    /// Unpacks the indices (one byte each) and the low bits (one `u16`
    /// each) of a validated page.
    fn unpack_index_low(&mut self, src: &[u8], lay: &Layout) {
        let idx = &src[lay.index()];
        for (p, &b) in self.index[..idx.len() * 2].chunks_exact_mut(2).zip(idx) {
            p[0] = b & 15;
            p[1] = b >> 4;
        }
        let low = &src[lay.low()];
        for (g, o) in self.low[..low.len() / 5 * 4].chunks_exact_mut(4).zip(low.chunks_exact(5)) {
            let v = u64::from_le_bytes([o[0], o[1], o[2], o[3], o[4], 0, 0, 0]);
            for (k, x) in g.iter_mut().enumerate() {
                *x = ((v >> (10 * k)) & LOW_MASK as u64) as u16;
            }
        }
    }
}

/// Where the segments of a validated page lie in its compressed form.
///
/// Only [`Layout::check`] makes one, so a `Layout` means: `src` is exactly
/// as long as its header says, and the tags of its `n` words hold exactly
/// `counts.full` misses, `counts.index` exact-or-partial matches and
/// `counts.low` partial matches (padding tags past the last word are zero
/// or counted too). The decode loops rely on this to skip bounds checks.
pub(crate) struct Layout {
    /// Words in the page.
    pub(crate) n: usize,
    /// Entries in each segment.
    pub(crate) counts: Counts,
    full_at: usize,
    index_at: usize,
    low_at: usize,
    end: usize,
}

impl Layout {
    /// Validates the header of `src` (format `version`, `dst_len` bytes
    /// out) and its counts against the tags and the length of `src`.
    pub(crate) fn check(version: u8, src: &[u8], dst_len: usize) -> Result<Layout, DecompressError> {
        Layout::check_with(version, src, dst_len, count_tags)
    }

    /// [`Layout::check`] with `count` counting the tags (misses, partials,
    /// exacts) as `count_tags` does.
    fn check_with(
        version: u8,
        src: &[u8],
        dst_len: usize,
        count: impl FnOnce(&[u8]) -> (usize, usize, usize),
    ) -> Result<Layout, DecompressError> {
        check_output_len(dst_len)?;
        if src.len() < HEADER {
            return Err(DecompressError::Truncated("WK header"));
        }
        if src[0] != version {
            return Err(DecompressError::WrongFormat { expected: version, found: src[0] });
        }
        let rd = |o: usize| u16::from_le_bytes([src[o], src[o + 1]]) as usize;
        let (n, nf, ni, nl) = (rd(2), rd(4), rd(6), rd(8));
        if n != dst_len / 4 {
            return Err(DecompressError::LengthMismatch { expected: dst_len, actual: n * 4 });
        }
        if src[1] != 0 || nl > ni || nf + ni > n {
            return Err(DecompressError::Corrupt("WK header counts are inconsistent"));
        }
        let total = packed_len(n, nf, ni, nl);
        if src.len() < total {
            return Err(DecompressError::Truncated("WK segments"));
        }
        if src.len() > total {
            return Err(DecompressError::Corrupt("trailing bytes after WK segments"));
        }
        let full_at = HEADER + n.div_ceil(4);
        let (misses, partials, exacts) = count(&src[HEADER..full_at]);
        if misses != nf || exacts + partials != ni || partials != nl {
            return Err(DecompressError::Corrupt("WK tag counts disagree with the header"));
        }
        let index_at = full_at + 4 * nf;
        let low_at = index_at + ni.div_ceil(2);
        Ok(Layout {
            n,
            counts: Counts { full: nf, index: ni, low: nl },
            full_at,
            index_at,
            low_at,
            end: total,
        })
    }

    /// The packed tags: 4 per byte.
    pub(crate) fn tags(&self) -> std::ops::Range<usize> {
        HEADER..self.full_at
    }

    /// The full words: 4 bytes each.
    pub(crate) fn full(&self) -> std::ops::Range<usize> {
        self.full_at..self.index_at
    }

    /// The packed indices: 2 per byte.
    pub(crate) fn index(&self) -> std::ops::Range<usize> {
        self.index_at..self.low_at
    }

    /// The packed low bits: 4 per 5-byte group.
    pub(crate) fn low(&self) -> std::ops::Range<usize> {
        self.low_at..self.end
    }
}

impl Codec for Wkdm {
    fn id(&self) -> CodecId {
        CodecId::Wkdm
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, CompressError> {
        check_input_len(src.len())?;
        let n = src.len() / 4;
        let cap = dst.len();
        let overflow = Err(CompressError::Overflow { capacity: cap });
        if packed_len(n, 0, 0, 0) > cap {
            return overflow;
        }
        // Slot 16 is a scratch slot: zero words "write" there, so a store's
        // data is always the input word and no chain of dependent loads and
        // stores forms through the dictionary.
        let mut dict = [0u32; 17];
        let mut counts = Counts::default();
        let seg = &mut self.seg;
        for (block, tags) in src.chunks(4 * CHECK_EVERY).zip(seg.tags[..n].chunks_mut(CHECK_EVERY)) {
            let (index, low, full) = (&mut seg.index[..], &mut seg.low[..], &mut seg.full[..]);
            let done = match self.kernel {
                #[cfg(all(not(feature = "safe"), feature = "avx512", target_arch = "x86_64"))]
                // SAFETY: a codec runs a kernel only if the CPU has the
                // features it needs (`Kernel::available`), its one
                // requirement.
                Kernel::Avx512 => unsafe {
                    avx512::model(block, tags, index, low, full, &mut dict, &mut counts)
                },
                #[cfg(all(not(feature = "safe"), target_arch = "x86_64"))]
                // SAFETY: as above.
                Kernel::Avx2 => unsafe { avx2::model(block, tags, index, low, full, &mut dict, &mut counts) },
                Kernel::Safe => {
                    model_block_safe(block, tags, index, low, full, &mut dict, &mut counts);
                    block.len() / 4
                }
                _ => 0,
            };
            // The scalar kernel, and the words a vector kernel left.
            #[cfg(not(feature = "safe"))]
            scalar::model_block(
                &block[4 * done..],
                &mut tags[done..],
                index,
                low,
                full,
                &mut dict,
                &mut counts,
            );
            #[cfg(feature = "safe")]
            debug_assert_eq!(done, block.len() / 4);
            if packed_len(n, counts.full, counts.index, counts.low) > cap {
                return overflow;
            }
        }
        Ok(self.seg.pack(VERSION, n, counts, dst))
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), DecompressError> {
        #[cfg(all(not(feature = "safe"), target_arch = "x86_64"))]
        if self.kernel == Kernel::Avx2 {
            let lay = Layout::check_with(VERSION, src, dst.len(), |tags| {
                // SAFETY: a codec runs a kernel only if the CPU has the
                // features it needs (`Kernel::available`).
                unsafe { avx2::count_tags(tags) }
            })?;
            // SAFETY: as above.
            unsafe { avx2::decode(src, &lay, &mut self.seg, dst) };
            return Ok(());
        }
        let lay = Layout::check(VERSION, src, dst.len())?;
        match self.kernel {
            #[cfg(all(not(feature = "safe"), feature = "avx512", target_arch = "x86_64"))]
            Kernel::Avx512 => {
                let (ni, nl) = (lay.counts.index, lay.counts.low);
                // SAFETY: a codec runs a kernel only if the CPU has the
                // features it needs (`Kernel::available`); AVX-512F implies
                // AVX2.
                unsafe { avx2::unpack_index_low(src, &lay, &mut self.seg) };
                let (tags, full) = (&src[lay.tags()], &src[lay.full()]);
                let (index, low) = (&self.seg.index[..ni + SLACK], &self.seg.low[..nl + SLACK]);
                // SAFETY: as above. (The decoder bounds-checks its reads
                // and does not panic here: `lay` passed the checks, so the
                // tags hold as many entries of each segment as it has, and
                // the unpacked index and low-bits segments come with the
                // SLACK entries it reads past them.)
                unsafe { avx512::decode(tags, lay.n, full, index, low, dst) };
            }
            #[cfg(not(feature = "safe"))]
            Kernel::Scalar => {
                self.seg.unpack_layout(src, &lay);
                let (c, seg) = (lay.counts, &self.seg);
                // SAFETY: `lay` passed the checks: the tags take exactly the
                // counts' entries of each segment, and the slices hold them.
                unsafe {
                    scalar::decode_words(
                        &seg.tags[..lay.n],
                        &seg.full[..c.full],
                        &seg.index[..c.index],
                        &seg.low[..c.low],
                        dst,
                    )
                }
            }
            _ => {
                self.seg.unpack_layout(src, &lay);
                let (c, seg) = (lay.counts, &self.seg);
                decode_words_safe(
                    &seg.tags[..lay.n],
                    &seg.full[..c.full],
                    &seg.index[..c.index],
                    &seg.low[..c.low],
                    dst,
                );
            }
        }
        Ok(())
    }

    fn max_compressed_len(&self, len: usize) -> usize {
        // Misses cost 4 bytes a word, partial matches 1.75; segment rounding
        // adds at most 6 bytes.
        let n = len / 4;
        packed_len(n, n, 0, 0) + 6
    }
}

/// Entries in each segment.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) full: usize,
    pub(crate) index: usize,
    pub(crate) low: usize,
}

/// Counts (misses, partials, exacts) among the packed tags. Bits of a padding
/// tag past the last word are zero, so they count as zero tags.
fn count_tags(packed: &[u8]) -> (usize, usize, usize) {
    let (mut m, mut p, mut e) = (0u32, 0u32, 0u32);
    let mut chunks = packed.chunks_exact(8);
    let count = |x: u64, m: &mut u32, p: &mut u32, e: &mut u32| {
        let lo = x & 0x5555_5555_5555_5555;
        let hi = (x >> 1) & 0x5555_5555_5555_5555;
        *m += (lo & hi).count_ones();
        *p += (hi & !lo).count_ones();
        *e += (lo & !hi).count_ones();
    };
    for c in &mut chunks {
        count(u64::from_le_bytes(c.try_into().expect("8 bytes")), &mut m, &mut p, &mut e);
    }
    let mut last = [0u8; 8];
    last[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    count(u64::from_le_bytes(last), &mut m, &mut p, &mut e);
    (m as usize, p as usize, e as usize)
}

/// The safe kernel's encoder: models one block of words as the other
/// kernels do (each word's tag to `tags`, its index, low bits and full word
/// appended to the segments its tag selects, at the cursors in `c`), with
/// a branch per word. Slot 16 of `dict` is not used.
fn model_block_safe(
    block: &[u8],
    tags: &mut [u8],
    index: &mut [u8],
    low: &mut [u16],
    full: &mut [u32],
    dict: &mut [u32; 17],
    c: &mut Counts,
) {
    for (w, t) in block.chunks_exact(4).zip(tags.iter_mut()) {
        let w = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        if w == 0 {
            *t = 0;
            continue;
        }
        let h = slot(w);
        let d = dict[h];
        if d == w {
            *t = 1;
            index[c.index] = h as u8;
            c.index += 1;
        } else if (d ^ w) <= LOW_MASK {
            *t = 2;
            index[c.index] = h as u8;
            low[c.low] = (w & LOW_MASK) as u16;
            (c.index, c.low) = (c.index + 1, c.low + 1);
            dict[h] = w;
        } else {
            *t = 3;
            full[c.full] = w;
            c.full += 1;
            dict[h] = w;
        }
    }
}

/// The safe kernel's decoder: the main loop over validated, unpacked
/// segments, a `match` on each tag.
///
/// `full`, `index` and `low` hold exactly as many entries as there are miss,
/// exact-or-partial and partial tags in `tags`; if they do not, this panics.
fn decode_words_safe(tags: &[u8], full: &[u32], index: &[u8], low: &[u16], dst: &mut [u8]) {
    let mut dict = [0u32; 16];
    let (mut fp, mut ip, mut lp) = (0usize, 0usize, 0usize);
    for (&t, out) in tags.iter().zip(dst.chunks_exact_mut(4)) {
        let v = match t {
            0 => 0,
            1 => {
                let v = dict[index[ip] as usize & 15];
                ip += 1;
                v
            }
            2 => {
                let ix = index[ip] as usize & 15;
                let v = (dict[ix] & !LOW_MASK) | low[lp] as u32;
                ip += 1;
                lp += 1;
                dict[ix] = v;
                v
            }
            _ => {
                let f = full[fp];
                fp += 1;
                dict[slot(f)] = f;
                f
            }
        };
        out.copy_from_slice(&v.to_le_bytes());
    }
}

/// Packed tag byte → four tag bytes (as a little-endian u32).
static TAG_UNPACK: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut b = 0;
    while b < 256 {
        let x = b as u32;
        t[b] = (x & 3) | ((x >> 2 & 3) << 8) | ((x >> 4 & 3) << 16) | ((x >> 6 & 3) << 24);
        b += 1;
    }
    t
};

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(words: &[u32]) -> Vec<u8> {
        crate::testutil::round_trip(&mut Wkdm::new(), &crate::testutil::words(words))
    }

    #[test]
    fn golden_vectors() {
        // Four zero words: header + one tag byte of zeros.
        assert_eq!(enc(&[0, 0, 0, 0]), vec![1, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0x00]);
        // 5 is a partial match of the zero-initialised slot(5) = slot(0) = 0:
        // tag 2, index 0, low bits 5. Then 5 again: exact, index 0.
        // Then 0x12345678: miss (tag 3), full word. Then 0: zero.
        assert_eq!(slot(5), 0);
        let out = enc(&[5, 5, 0x1234_5678, 0]);
        let tags = 2 | (1 << 2) | (3 << 4); // 0b00_11_01_10
        assert_eq!(
            out,
            vec![
                1, 0, 4, 0, 1, 0, 2, 0, 1, 0,    // header: 4 words, 1 full, 2 indices, 1 low
                tags, // tags
                0x78, 0x56, 0x34, 0x12, // full word
                0x00, // indices 0 and 0
                5, 0, 0, 0, 0, // low-bits group: 5
            ]
        );
        // A partial match against a missed word fills in its slot index.
        let w = 0x1234_5400u32;
        let out = enc(&[w, w | 0x3ff]);
        assert_eq!(slot(w), slot(w | 0x3ff));
        assert_eq!(out[10], 3 | (2 << 2));
        assert_eq!(&out[11..15], &w.to_le_bytes());
        assert_eq!(out[15], slot(w) as u8);
        assert_eq!(&out[16..21], &[0xff, 0x03, 0, 0, 0]);
    }

    /// The kernels this build and CPU run: all that are built. A kernel
    /// this build has but the CPU cannot run is a test failure, not a
    /// skip (CI's machines run every kernel a default build has; the
    /// `avx512` feature's kernel is for AVX-512 machines), except under
    /// miri, which detects no CPU features.
    fn kernels() -> Vec<Kernel> {
        for k in Kernel::ALL {
            assert!(
                !k.built() || k.available() || cfg!(miri),
                "this build has the {k} kernel but this CPU cannot run it, so it cannot be tested here \
                 (build without the `avx512` feature, or test on a CPU that has the instructions)"
            );
        }
        Kernel::ALL.into_iter().filter(|k| k.available()).collect()
    }

    /// Decodes `src` (a page of `len` bytes) with every kernel, checks that
    /// they agree with the safe twin and returns the page.
    fn decode_every_way(src: &[u8], len: usize) -> Vec<u8> {
        let mut seg = Segments::new();
        let c = seg.unpack(VERSION, src, len).unwrap();
        let n = len / 4;
        let (tags, full, index, low) =
            (&seg.tags[..n], &seg.full[..c.full], &seg.index[..c.index], &seg.low[..c.low]);
        let mut safe = vec![0u8; len];
        decode_words_safe(tags, full, index, low, &mut safe);
        for kernel in kernels() {
            let mut c = Wkdm::with_kernel(kernel).unwrap();
            let mut out = vec![0x5au8; len];
            c.decompress(src, &mut out).unwrap();
            assert!(out == safe, "the {kernel} kernel's decoder differs from decode_words_safe");
        }
        safe
    }

    /// Compresses `page` with every kernel, checks that the outputs are
    /// byte for byte the safe kernel's and that a buffer one byte short,
    /// or half as long, is an overflow for every kernel; returns the
    /// output.
    fn encode_every_way(page: &[u8]) -> Vec<u8> {
        let mut safe = Wkdm::with_kernel(Kernel::Safe).unwrap();
        let mut want = vec![0u8; safe.max_compressed_len(page.len())];
        let n = safe.compress(page, &mut want).unwrap();
        want.truncate(n);
        for kernel in kernels() {
            let mut c = Wkdm::with_kernel(kernel).unwrap();
            let mut out = vec![0xa5u8; c.max_compressed_len(page.len())];
            let m = c.compress(page, &mut out).unwrap();
            assert!(out[..m] == want[..], "{} bytes: the {kernel} kernel's encoder differs", page.len());
            for cap in [n - 1, n / 2] {
                let mut short = vec![0u8; cap];
                assert!(c.compress(page, &mut short).is_err(), "{kernel}: {n} bytes fit in {cap}");
            }
        }
        want
    }

    /// Pages of every synthetic kind at lengths around the group sizes.
    fn synthetic_pages(seed: u64, lens: &[usize]) -> Vec<Vec<u8>> {
        let mut rng = crate::corpus::synth::Rng::new(seed);
        let mut pages = Vec::new();
        for kind in crate::corpus::synth::KINDS {
            for &len in lens {
                let mut page = vec![0u8; len.next_multiple_of(8)];
                crate::corpus::synth::fill(&mut page, kind, &mut rng);
                page.truncate(len);
                pages.push(page);
            }
        }
        pages
    }

    fn corpus(file: &str) -> crate::corpus::Corpus {
        let f = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus").join(file);
        crate::corpus::Corpus::load(&[f]).expect("corpus file (CI provides ../shared/corpus)")
    }

    /// Pages made to collide in the dictionary within a group of words:
    /// words from a few high parts (so a few slots), random low bits, and
    /// zero words at a rate that varies by round.
    fn colliding_pages(rounds: usize) -> Vec<Vec<u8>> {
        let mut rng = crate::corpus::synth::Rng::new(21);
        (0..rounds)
            .map(|round| {
                let highs: Vec<u32> =
                    (0..1 + rng.below(4)).map(|_| rng.next_u64() as u32 & !LOW_MASK).collect();
                let zeros = rng.below(4);
                let words: Vec<u32> = (0..[16, 48, 1024, 9, 300][round % 5])
                    .map(|_| match rng.below(8) {
                        r if r < zeros => 0,
                        4 => rng.next_u64() as u32,
                        5 => rng.below(1024) as u32,
                        _ => highs[rng.below(highs.len() as u64) as usize] | (rng.below(4) as u32),
                    })
                    .collect();
                crate::testutil::words(&words)
            })
            .collect()
    }

    /// Small enough for miri: every kernel the build has, both directions,
    /// on short pages of every kind and length class.
    #[test]
    fn kernels_agree_on_short_pages() {
        for page in
            synthetic_pages(5, &[4, 8, 28, 32, 36, 60, 64, 68, 132]).iter().chain(&colliding_pages(10))
        {
            let out = encode_every_way(page);
            assert!(decode_every_way(&out, page.len()) == *page);
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "too slow under miri; kernels_agree_on_short_pages runs there")]
    fn kernels_agree_on_synthetic_and_colliding_pages() {
        let lens = [4, 60, 64, 68, 1020, 1024, 4096, 4100, crate::MAX_INPUT];
        for page in synthetic_pages(21, &lens).iter().chain(&colliding_pages(200)) {
            let out = encode_every_way(page);
            assert!(decode_every_way(&out, page.len()) == *page);
        }
    }

    /// Every page of the three corpus files, both directions, every kernel
    /// against the safe one.
    #[test]
    #[cfg_attr(miri, ignore = "too slow under miri; kernels_agree_on_short_pages runs there")]
    fn kernels_agree_on_every_corpus_page() {
        for file in ["python-dict.pages", "python-sqlite.pages", "gcc-cc1.pages"] {
            for page in corpus(file).pages() {
                let out = encode_every_way(page);
                assert!(decode_every_way(&out, page.len()) == page, "{file}: a page differs");
            }
        }
    }

    /// Valid but arbitrary compressed pages: random tags (padding tags
    /// too), indices naming slots never written, random segment bytes, and
    /// the header counts that make them pass the checks.
    #[test]
    fn decoders_agree_on_arbitrary_valid_input() {
        let mut rng = crate::corpus::synth::Rng::new(9);
        let rounds = if cfg!(miri) { 8 } else { 400 };
        for round in 0..rounds {
            let n = match round % 4 {
                0 => 1 + rng.below(40) as usize,
                _ if cfg!(miri) => 1 + rng.below(200) as usize,
                1 => 1024,
                2 => 1 + rng.below(MAX_WORDS as u64) as usize,
                _ => MAX_WORDS - rng.below(20) as usize,
            };
            // Tag mixes from all zero to all miss: tag t has weight w[t].
            let w: Vec<u64> = (0..4).map(|_| rng.below(4)).collect();
            let total: u64 = w.iter().sum();
            let mut tags = vec![0u8; n.div_ceil(4)];
            for i in 0..4 * tags.len() {
                let mut t = 0;
                if total == 0 {
                    t = rng.below(4) as usize;
                } else {
                    let mut r = rng.below(total);
                    while r >= w[t] {
                        r -= w[t];
                        t += 1;
                    }
                }
                tags[i / 4] |= (t as u8) << (2 * (i % 4));
            }
            let (mut nf, mut nl, mut ne) = count_tags(&tags);
            if nf + nl + ne > n {
                // Too many padding tags to pass the header check.
                tags[n / 4] &= (1 << (2 * (n % 4))) - 1;
                (nf, nl, ne) = count_tags(&tags);
            }
            let ni = nl + ne;
            let mut src = vec![VERSION, 0];
            for v in [n, nf, ni, nl] {
                src.extend_from_slice(&(v as u16).to_le_bytes());
            }
            src.extend_from_slice(&tags);
            let body = packed_len(n, nf, ni, nl) - src.len();
            src.extend((0..body).map(|_| rng.next_u64() as u8));
            decode_every_way(&src, 4 * n);
        }
    }

    #[cfg(all(not(feature = "safe"), feature = "avx512", target_arch = "x86_64"))]
    #[test]
    fn avx512_decoder_panics_on_counts_it_was_not_given() {
        assert!(Kernel::Avx512.available(), "built with the avx512 feature on a CPU without AVX-512");
        // 16 misses but room for 15 full words: a panic, not a read past
        // the end.
        let tags = [0xffu8; 4];
        let (index, low) = ([0u8; 16], [0u16; 16]);
        let mut dst = [0u8; 64];
        let r = std::panic::catch_unwind(move || {
            // SAFETY: the CPU has the features (checked above).
            unsafe { avx512::decode(&tags, 16, &[0u8; 60], &index, &low, &mut dst) }
        });
        assert!(r.is_err());
    }

    /// Corrupt pages (valid ones with tag bytes, counts or segment bytes
    /// changed): every kernel accepts and refuses the same ones, and
    /// decodes the accepted ones alike.
    #[test]
    fn decoders_agree_on_corrupt_input() {
        let mut rng = crate::corpus::synth::Rng::new(13);
        let mut c = Wkdm::with_kernel(Kernel::Safe).unwrap();
        let (mut refused, mut accepted) = (0, 0);
        let rounds = if cfg!(miri) { 30 } else { 3000 };
        for round in 0..rounds {
            let len: usize = [64, 4096, 1000][round % 3];
            let mut page = vec![0u8; len.next_multiple_of(8)];
            crate::corpus::synth::fill(&mut page, crate::corpus::synth::KINDS[round % 4], &mut rng);
            page.truncate(len);
            let mut src = vec![0u8; c.max_compressed_len(len)];
            let n = c.compress(&page, &mut src).unwrap();
            src.truncate(n);
            for _ in 0..1 + rng.below(3) {
                let at = match rng.below(3) {
                    0 => HEADER + rng.below((len / 16) as u64) as usize, // a tag byte
                    1 => 2 + rng.below(8) as usize,                      // a count
                    _ => rng.below(n as u64) as usize,
                };
                if at < src.len() {
                    src[at] ^= 1 << rng.below(8);
                }
            }
            let mut first: Option<Result<Vec<u8>, ()>> = None;
            for kernel in kernels() {
                let mut d = Wkdm::with_kernel(kernel).unwrap();
                let mut out = vec![0u8; len];
                let r = d.decompress(&src, &mut out).map(|()| out).map_err(|_| ());
                match &first {
                    None => first = Some(r),
                    Some(f) => assert!(*f == r, "the {kernel} kernel disagrees on round {round}"),
                }
            }
            if first.unwrap().is_ok() {
                accepted += 1;
            } else {
                refused += 1;
            }
        }
        assert!(refused > rounds / 6 && accepted > rounds / 30, "refused {refused}, accepted {accepted}");
    }

    #[cfg(all(not(feature = "safe"), target_arch = "x86_64"))]
    #[test]
    fn avx2_count_tags_agrees_with_count_tags() {
        if !kernels().contains(&Kernel::Avx2) {
            return; // miri: no AVX2 detected
        }
        let mut rng = crate::corpus::synth::Rng::new(17);
        for len in (0..70).chain([255, 256, 257, 4096, 16384]) {
            let packed: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            // SAFETY: the CPU has AVX2 (the kernel is available).
            assert_eq!(unsafe { avx2::count_tags(&packed) }, count_tags(&packed), "{len} bytes");
        }
    }

    #[test]
    fn kernels_are_named_and_chosen() {
        for k in Kernel::ALL {
            assert_eq!(k.name().parse::<Kernel>().unwrap(), k);
            assert_eq!(Wkdm::with_kernel(k).is_some(), k.available());
            assert!(!k.available() || k.built());
        }
        assert!("avx3".parse::<Kernel>().is_err());
        assert!(Kernel::Safe.available() && Kernel::best().available());
        assert_eq!(Kernel::Scalar.built(), cfg!(not(feature = "safe")));
        if cfg!(feature = "safe") {
            assert_eq!(Kernel::best(), Kernel::Safe);
        }
    }

    #[test]
    fn header_checks_reject_bad_counts() {
        let out = enc(&[5, 5, 0x1234_5678, 0]);
        let mut back = vec![0u8; 16];
        let mut c = Wkdm::new();
        let mut bad = out.clone();
        bad[0] = 2;
        assert!(matches!(c.decompress(&bad, &mut back), Err(DecompressError::WrongFormat { .. })));
        let mut bad = out.clone();
        bad[4] = 2; // n_full 2
        assert!(c.decompress(&bad, &mut back).is_err());
        let mut bad = out.clone();
        bad[10] = 0xff; // all misses: counts disagree
        assert!(c.decompress(&bad, &mut back).is_err());
        assert!(c.decompress(&out[..out.len() - 1], &mut back).is_err());
        let mut long = out.clone();
        long.push(0);
        assert!(c.decompress(&long, &mut back).is_err());
        let mut back8 = vec![0u8; 8];
        assert!(matches!(c.decompress(&out, &mut back8), Err(DecompressError::LengthMismatch { .. })));
    }
}
