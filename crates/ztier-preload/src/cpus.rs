//! Where the library's threads run: the CPUs the process may use, pinning
//! a thread to some of them, and [`Spread`], which samples where the
//! first handler's faults come from and starts a handler on each other
//! CPU when they come from threads elsewhere.

use std::sync::atomic::Ordering;

use ztier_run_core::names::env;

use crate::{knob, more_handlers, ALLOWED, MORE_HANDLERS};

/// CPUs this process may run on (as inherited: `ztier run`'s own mask
/// in `ZTIER_CPUS` when a parent pinned us).
pub(crate) fn allowed_cpus() -> Vec<usize> {
    if let Some(list) = knob(env::CPUS) {
        let v: Vec<usize> = list.split(',').filter_map(|c| c.parse().ok()).collect();
        if !v.is_empty() {
            return v;
        }
    }
    let Some(set) = affinity(0) else { return Vec::new() };
    // SAFETY: reading a filled set.
    (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()
}

/// The CPUs thread `tid` of this process may run on (0: the calling
/// thread); `None` if it is gone. Makes no descriptor.
pub(crate) fn affinity(tid: libc::pid_t) -> Option<libc::cpu_set_t> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity fills the set it is given, of that size.
    let r = unsafe { libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    (r == 0).then_some(set)
}

/// Pins the calling thread to `cpus` (all of them).
pub(crate) fn pin(cpus: &[usize]) {
    // SAFETY: a zeroed set with the CPUs added, applied to this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Thread `tid` of this process can run on CPU `mine` alone: the main
/// thread, pinned next to the first handler, or a thread the program
/// bound there itself. Its allowed CPUs ([`affinity`]) take no
/// descriptor; reading the CPU a thread last ran on (its
/// `/proc/self/task/TID/stat`) took one, the program's lowest free
/// number, which another of its threads opening a file meanwhile was
/// owed. `None` if the thread is gone.
pub(crate) fn kept_on(tid: u32, mine: usize) -> Option<bool> {
    let set = affinity(tid as libc::pid_t)?;
    // SAFETY: reading a filled set.
    Some(unsafe { libc::CPU_COUNT(&set) == 1 && libc::CPU_ISSET(mine, &set) })
}

/// Where the faults read by the first handler come from, sampled (one
/// fault in [`SAMPLE_EVERY`]): when a quarter of [`SAMPLES`] were taken
/// by threads that may run on other CPUs than the handler's own, a
/// handler is started on each other CPU ([`more_handlers`]), once. The
/// first handler sits next to the main thread, so a fault of a thread on
/// another CPU cost a wake-up across CPUs each way:
/// `examples/workloads/threads.py` (400 threads) at `--budget 16M` took
/// 10.6× native. Every handler reads the same userfaultfd and all are
/// woken for each fault; the one on the faulting CPU, idle since its
/// thread blocked, usually serves it. Started for a single-threaded
/// program, the extra handler made the corpus builder at 256M 1.20× as
/// long (wake-ups for nothing on the evictor's CPU), hence the sampling:
/// that program's faults are all its pinned main thread's ([`kept_on`]).
/// A thread that may run anywhere counts as elsewhere even when the
/// scheduler keeps it on the handler's CPU (as when the other CPUs are
/// busy); then the other handlers are woken for nothing there.
pub(crate) struct Spread {
    cpu: Option<usize>,
    faults: u64,
    samples: u32,
    off: u32,
}

const SAMPLE_EVERY: u64 = 256;

const SAMPLES: u32 = 16;

impl Spread {
    pub(crate) fn new(first: bool) -> Spread {
        // SAFETY: sched_getcpu has no preconditions.
        let cpu = unsafe { libc::sched_getcpu() };
        // Only the first handler, pinned (the others are started by it).
        let pinned = first && cpu >= 0 && ALLOWED.get().is_some_and(|c| c.len() > 1);
        Spread { cpu: pinned.then_some(cpu as usize), faults: 0, samples: 0, off: 0 }
    }

    /// A fault of thread `tid` was read.
    pub(crate) fn fault(&mut self, tid: u32) {
        let Some(mine) = self.cpu else { return };
        self.faults += 1;
        if tid == 0 || self.faults % SAMPLE_EVERY != 0 || MORE_HANDLERS.load(Ordering::Relaxed) {
            return;
        }
        let Some(kept) = kept_on(tid, mine) else { return };
        self.samples += 1;
        self.off += u32::from(!kept);
        if self.samples == SAMPLES {
            if self.off * 4 >= SAMPLES {
                more_handlers(mine);
            }
            (self.samples, self.off) = (0, 0);
        }
    }
}

/// The CPU of `ZTIER_SERVER_CPU` (`CPU@PID`), if it is meant for this
/// process: the one whose parent is PID (the run's first process; its
/// children, forked or started, keep the pick by PID, so that the
/// processes of a program that runs several at once do not all share
/// one CPU).
pub(crate) fn server_cpu(value: Option<&str>, parent: u32) -> Option<usize> {
    let (cpu, pid) = value?.split_once('@')?;
    (pid.parse::<u32>().ok()? == parent).then_some(())?;
    cpu.parse().ok()
}

/// The CPU for the handler and the main thread among the allowed
/// `cpus` (not empty): the server's (`hint`, see [`server_cpu`]) if
/// allowed, else one picked by `pid`.
pub(crate) fn pick_cpu(cpus: &[usize], hint: Option<usize>, pid: u32) -> usize {
    match hint {
        Some(c) if cpus.contains(&c) => c,
        _ => cpus[pid as usize % cpus.len()],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread counts as kept on a CPU only while bound to it alone; a
    /// thread that is gone is not counted at all.
    #[test]
    fn a_thread_is_kept_on_a_cpu_only_while_bound_to_it_alone() {
        let all = allowed_cpus();
        assert!(!all.is_empty());
        // In a thread of its own: binding it leaves the test's threads be.
        let cpus = all.clone();
        let (tid, seen) = std::thread::spawn(move || {
            let all = cpus;
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() } as u32;
            let free: Vec<_> = all.iter().map(|&c| kept_on(tid, c)).collect();
            pin(&[all[0]]);
            let bound: Vec<_> = all.iter().map(|&c| kept_on(tid, c)).collect();
            (tid, (free, bound))
        })
        .join()
        .unwrap();
        let (free, bound) = seen;
        // Free to run on every allowed CPU: kept on none of them, unless
        // there is only one.
        let one = all.len() == 1;
        assert!(free.iter().all(|&k| k == Some(one)), "{free:?}");
        // Bound to the first: kept there, and nowhere else.
        assert_eq!(bound[0], Some(true));
        assert!(bound[1..].iter().all(|&k| k == Some(false)), "{bound:?}");
        // The thread has ended: once the kernel has let it go (a moment
        // after the join), it is not counted (its ID is not reused so
        // soon: they are handed out in turn).
        let t = std::time::Instant::now();
        while kept_on(tid, all[0]).is_some() {
            assert!(t.elapsed() < std::time::Duration::from_secs(5), "thread {tid} still counted");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

#[cfg(test)]
mod pick_tests {
    use super::*;

    /// The server's CPU is taken when it is allowed; outside the allowed
    /// set, or without one, the pick by PID stands.
    #[test]
    fn the_servers_cpu_is_taken_only_where_allowed() {
        let cpus = [2, 3, 5];
        assert_eq!(pick_cpu(&cpus, Some(5), 7), 5);
        assert_eq!(pick_cpu(&cpus, Some(2), 7), 2);
        // 7 % 3 = 1: the second allowed CPU.
        assert_eq!(pick_cpu(&cpus, Some(4), 7), 3);
        assert_eq!(pick_cpu(&cpus, Some(0), 9), 2);
        assert_eq!(pick_cpu(&cpus, None, 7), 3);
        assert_eq!(pick_cpu(&cpus, None, 8), 5);
    }

    /// The hint is for the process whose parent it names, and only a
    /// well-formed one is read.
    #[test]
    fn the_hint_is_read_only_by_the_process_it_names() {
        assert_eq!(server_cpu(Some("1@400"), 400), Some(1));
        assert_eq!(server_cpu(Some("0@400"), 400), Some(0));
        // A child of the first process (its parent is not the launcher).
        assert_eq!(server_cpu(Some("1@400"), 401), None);
        assert_eq!(server_cpu(None, 400), None);
        for bad in ["", "1", "@400", "x@400", "1@", "1@x", "-1@400"] {
            assert_eq!(server_cpu(Some(bad), 400), None, "{bad}");
        }
    }
}
