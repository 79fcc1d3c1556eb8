//! What userfaultfd itself costs on this machine: the floor under any
//! fault service built on it, measured the way `ztier run` serves faults
//! (a handler thread on the faulting thread's CPU, `UFFDIO_COPY` without
//! waking, then `UFFDIO_WAKE`), but with nothing to look up or decode: the
//! pages come from a buffer already in the cache.
//!
//! ```text
//!  faulting thread (CPU c)                 handler thread (CPU c)
//!  touch page p ──missing-page fault──►    read the uffd_msg (poll when the queue is empty)
//!  (sleeps in the kernel)                  UFFDIO_COPY(p .. p+run, buffer, DONTWAKE)
//!                       ◄──────────────── UFFDIO_WAKE(p .. p+run)
//!  touches p+1 .. p+run-1 (present)        (back to reading)
//! ```
//!
//! Three timings, each over `pages` fresh pages touched in order:
//!
//! - `anon_fault_us`: the kernel's own anonymous fault (no userfaultfd):
//!   what a first touch costs natively;
//! - `fault_us`: every page its own fault, a run of one page: the round
//!   trip (trap, two context switches, reading the event, one page
//!   copied, the wake);
//! - `page_us`: with runs of `run` pages, (time per fault − `fault_us`) /
//!   (`run` − 1): what each further page of a run adds (`UFFDIO_COPY`'s
//!   allocation, charge and copy of one page).
//!
//! Each is the median of [`ROUNDS`] rounds. A program whose run under
//! `ztier run` took F faults and P pages beyond the first of each run
//! spent at least about F·`fault_us` + P·`page_us` in fault service
//! ([`Floor::service_floor_s`]), before any store lookup, decompression or
//! eviction: `ztier bench pressure` prints it next to each run, so a
//! target stated as a multiple of the native time can be checked against
//! what the machine allows.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::uffd::{map_anonymous, Installed, Uffd, EVENT_PAGEFAULT};

/// Page size.
pub const PAGE: usize = 4096;
/// Rounds of each timing; the median is reported.
pub const ROUNDS: usize = 3;
/// Byte every served page is filled with (checked by the faulting thread).
const FILL: u8 = 0x5a;

/// Costs measured by [`measure`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Floor {
    /// The CPU both threads ran on.
    pub cpu: usize,
    /// Pages touched per timing.
    pub pages: usize,
    /// Pages per fault in the run timing.
    pub run: usize,
    /// The kernel's own anonymous fault, µs a page.
    pub anon_fault_us: f64,
    /// A missing-page fault served with one page, µs a fault.
    pub fault_us: f64,
    /// Each further page of a run, µs a page.
    pub page_us: f64,
}

impl Floor {
    /// Seconds of fault service that `faults` faults bringing `further`
    /// pages beyond the first of each cost at this floor.
    pub fn service_floor_s(&self, faults: u64, further: u64) -> f64 {
        (faults as f64 * self.fault_us + further as f64 * self.page_us) / 1e6
    }
}

/// Errors of [`measure`].
#[derive(Debug, thiserror::Error)]
pub enum FloorError {
    /// Fewer than 2 pages per run, or too few pages to time.
    #[error("need runs of at least 2 pages and at least 64 pages per timing (got run {run}, {pages} pages)")]
    Arguments {
        /// Pages per run asked for.
        run: usize,
        /// Pages per timing asked for.
        pages: usize,
    },
    /// A system call failed (mapping, userfaultfd, affinity).
    #[error("{what}: {err}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The error.
        #[source]
        err: io::Error,
    },
    /// The handler thread failed; the region was unregistered so the
    /// faulting thread could finish.
    #[error("the fault handler failed: {0}")]
    Handler(io::Error),
    /// A page did not hold what the handler copied: the fault was served
    /// by something else.
    #[error("page {0} did not come from the handler (byte {1:#x}, expected {FILL:#x})")]
    WrongPage(usize, u8),
    /// The handler served a different number of faults than expected.
    #[error("the handler served {got} faults, expected {want}")]
    Count {
        /// Faults served.
        got: u64,
        /// Faults expected.
        want: u64,
    },
}

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> FloorError {
    move |err| FloorError::Io { what, err }
}

/// A private anonymous mapping, unmapped on drop.
struct Mapping {
    base: usize,
    len: usize,
}

impl Mapping {
    fn new(pages: usize) -> Result<Mapping, FloorError> {
        let len = pages * PAGE;
        let base = map_anonymous(len).map_err(io_err("mapping the pages to fault on"))?;
        let p = base as *mut libc::c_void;
        // Base pages, as `ztier run`'s arena has (a huge page would make
        // the kernel's own fault look cheaper per page). Advice only.
        // SAFETY: the range is the mapping just made.
        unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
        Ok(Mapping { base, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping this value made; nothing refers to it after.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

/// Pins the calling thread to one CPU; the old affinity comes back on drop.
struct Pin {
    old: libc::cpu_set_t,
}

impl Pin {
    fn to(cpu: usize) -> Result<Pin, FloorError> {
        // SAFETY: cpu_set_t is plain data; zeroed is an empty set.
        let mut old: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: the calling thread (0), a set of the size passed.
        if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut old) } != 0 {
            return Err(FloorError::Io { what: "reading the CPU affinity", err: io::Error::last_os_error() });
        }
        pin(cpu)?;
        Ok(Pin { old })
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        // SAFETY: the calling thread (0), the set read before pinning.
        unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.old) };
    }
}

fn pin(cpu: usize) -> Result<(), FloorError> {
    // SAFETY: cpu_set_t is plain data; zeroed is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET on a live set; cpu is below CPU_SETSIZE (checked by the caller's
    // sched_getcpu, which returns a CPU that exists).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: the calling thread (0), a set of the size passed.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(FloorError::Io { what: "pinning to one CPU", err: io::Error::last_os_error() });
    }
    Ok(())
}

/// Touches one byte of every page of `[base, base + pages·PAGE)` in order
/// and returns the seconds it took; with `check`, every byte must be
/// [`FILL`].
fn touch(base: usize, pages: usize, check: bool) -> Result<f64, FloorError> {
    let t = Instant::now();
    for i in 0..pages {
        let p = (base + i * PAGE) as *mut u8;
        if check {
            // SAFETY: page i is inside the caller's mapping; a missing page
            // faults and is served by the handler (or, if it failed, by the
            // kernel after the range was unregistered).
            let b = unsafe { std::ptr::read_volatile(p) };
            if b != FILL {
                return Err(FloorError::WrongPage(i, b));
            }
        } else {
            // SAFETY: as above, a plain anonymous page; the write faults it in.
            unsafe { std::ptr::write_volatile(p, 1) };
        }
    }
    Ok(t.elapsed().as_secs_f64())
}

/// Serves the missing-page faults of `[base, base + len)` with runs of
/// `run` pages of [`FILL`] until `stop` and no event for 10 ms.
fn serve(
    uffd: &Uffd,
    base: usize,
    len: usize,
    run: usize,
    stop: &AtomicBool,
    served: &AtomicU64,
) -> io::Result<()> {
    let buf = vec![FILL; run * PAGE];
    loop {
        let ev = match uffd.try_read()? {
            Some(ev) => ev,
            None => match uffd.read_event(10)? {
                Some(ev) => ev,
                None if stop.load(Ordering::Acquire) => return Ok(()),
                None => continue,
            },
        };
        if ev.kind != EVENT_PAGEFAULT {
            continue;
        }
        let at = (ev.address as usize) & !(PAGE - 1);
        let n = (base + len - at).min(run * PAGE);
        loop {
            match uffd.copy_with(at, &buf[..n], false, false)? {
                Installed::Retry => continue,
                Installed::Done => {
                    served.fetch_add(1, Ordering::Relaxed);
                    uffd.wake(at, n)?;
                    break;
                }
                Installed::AlreadyThere => break,
            }
        }
    }
}

/// Times `pages` pages faulted in runs of `run` through a handler on the
/// calling thread's CPU; returns seconds.
fn timed_uffd(cpu: usize, pages: usize, run: usize) -> Result<f64, FloorError> {
    let m = Mapping::new(pages)?;
    let uffd = Arc::new(Uffd::open().map_err(io_err("opening a userfaultfd"))?);
    uffd.register(m.base, m.len).map_err(io_err("registering the pages with userfaultfd"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    let handler = {
        let (uffd, stop, served, base, len) = (uffd.clone(), stop.clone(), served.clone(), m.base, m.len);
        std::thread::spawn(move || -> io::Result<()> {
            pin(cpu).map_err(|e| io::Error::other(e.to_string()))?;
            let r = serve(&uffd, base, len, run, &stop, &served);
            if r.is_err() {
                // The faulting thread must not wait forever: without the
                // registration its faults are the kernel's (zero pages,
                // which the check then reports).
                let _ = uffd.unregister(base, len);
            }
            r
        })
    };
    // Let the handler pin itself and reach its first read.
    std::thread::sleep(std::time::Duration::from_millis(5));
    let t = touch(m.base, pages, true);
    stop.store(true, Ordering::Release);
    let h =
        handler.join().map_err(|_| FloorError::Handler(io::Error::other("the handler thread panicked")))?;
    h.map_err(FloorError::Handler)?;
    let t = t?;
    let want = pages.div_ceil(run) as u64;
    let got = served.load(Ordering::Relaxed);
    if got != want {
        return Err(FloorError::Count { got, want });
    }
    Ok(t)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Measures the floor (see the module docs) over `pages` pages per
/// timing, runs of `run` pages, with both threads on the CPU the calling
/// thread is on now; the calling thread's affinity is restored after.
pub fn measure(pages: usize, run: usize) -> Result<Floor, FloorError> {
    if run < 2 || pages < 64 {
        return Err(FloorError::Arguments { run, pages });
    }
    // SAFETY: sched_getcpu has no preconditions.
    let cpu = unsafe { libc::sched_getcpu() };
    if cpu < 0 {
        return Err(FloorError::Io { what: "finding the current CPU", err: io::Error::last_os_error() });
    }
    let cpu = cpu as usize;
    let _pin = Pin::to(cpu)?;
    let (mut anon, mut one, mut many) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let m = Mapping::new(pages)?;
        anon.push(touch(m.base, pages, false)? / pages as f64);
        drop(m);
        one.push(timed_uffd(cpu, pages, 1)? / pages as f64);
        many.push(timed_uffd(cpu, pages, run)? / pages.div_ceil(run) as f64);
    }
    let fault_us = median(one) * 1e6;
    let per_run_fault_us = median(many) * 1e6;
    Ok(Floor {
        cpu,
        pages,
        run,
        anon_fault_us: median(anon) * 1e6,
        fault_us,
        page_us: ((per_run_fault_us - fault_us) / (run - 1) as f64).max(0.0),
    })
}
