//! How the RAM cache notices that the machine needs its memory back.
//!
//! Three signals, read every second and also the moment the kernel
//! reports a stall:
//!
//! * **PSI** (`/proc/pressure/memory`): a trigger (`some 100000 1000000`:
//!   100 ms of stall within a second) wakes the watcher through
//!   `poll(POLLPRI)`; the `some avg10` figure is read on every tick too.
//! * **MemAvailable** (`/proc/meminfo`): below the free floor
//!   (max(64 MiB, 5% of MemTotal)) the cache gives back the difference.
//! * **The memory cgroup** the server runs in (`/proc/self/cgroup`; v2
//!   `memory.max`/`memory.current`, or v1 `memory.limit_in_bytes`/
//!   `memory.usage_in_bytes`): room left below its limit under
//!   max(16 MiB, 5% of the limit) counts as a shortfall the same way.
//!
//! On a shortfall the budget drops by it (at least 1/8 of the budget);
//! on a stall (PSI avg10 above 10%, or the trigger) by a quarter. After
//! 10 s with neither, it grows back by 1/8 of the configured size per
//! second while there is room. The store evicts at once when its budget
//! shrinks (clean blocks: dropped), so memory is returned immediately.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::ram::RamCache;

/// What the watcher reads.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Reading {
    /// MemTotal, bytes.
    pub mem_total: u64,
    /// MemAvailable, bytes.
    pub mem_available: u64,
    /// PSI memory `some avg10` (percent), if PSI is there.
    pub psi_some_avg10: Option<f64>,
    /// The cgroup's limit and usage, if limited.
    pub cgroup: Option<(u64, u64)>,
    /// The PSI trigger fired since the last reading.
    pub stall_event: bool,
}

/// A decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// New budget.
    pub budget: u64,
    /// Why (empty: unchanged).
    pub reason: String,
}

/// PSI avg10 above which the cache shrinks.
pub const PSI_LIMIT: f64 = 10.0;
/// Quiet time before growing back.
pub const CALM: Duration = Duration::from_secs(10);

/// The free floor for MemAvailable.
pub fn min_free(mem_total: u64) -> u64 {
    (64u64 << 20).max(mem_total / 20)
}

/// Decides the budget from a reading (pure: tested directly).
pub fn decide(r: &Reading, budget: u64, configured: u64, calm_for: Duration) -> Decision {
    let floor = min_free(r.mem_total);
    let mut deficit = floor.saturating_sub(r.mem_available);
    let mut why = Vec::new();
    if deficit > 0 {
        why.push(format!("MemAvailable {} MiB below {} MiB", r.mem_available >> 20, floor >> 20));
    }
    if let Some((limit, usage)) = r.cgroup {
        let room = limit.saturating_sub(usage);
        let cg_floor = (16u64 << 20).max(limit / 20);
        if room < cg_floor {
            deficit = deficit.max(cg_floor - room);
            why.push(format!("cgroup room {} MiB below {} MiB", room >> 20, cg_floor >> 20));
        }
    }
    if deficit > 0 {
        let cut = deficit.max(budget / 8);
        return Decision { budget: budget.saturating_sub(cut), reason: why.join(", ") };
    }
    let psi = r.psi_some_avg10.unwrap_or(0.0);
    if r.stall_event || psi > PSI_LIMIT {
        let reason = if r.stall_event {
            "PSI trigger: memory stall".to_string()
        } else {
            format!("PSI memory some avg10 {psi:.1}%")
        };
        return Decision { budget: budget - budget / 4, reason };
    }
    if budget < configured && calm_for >= CALM {
        let step = (configured / 8).max(1 << 20);
        let room_ok = r.mem_available > floor.saturating_mul(2) + step
            && r.cgroup.is_none_or(|(l, u)| l.saturating_sub(u) > (16u64 << 20).max(l / 20) * 2 + step);
        if room_ok {
            return Decision {
                budget: (budget + step).min(configured),
                reason: "room again: growing".into(),
            };
        }
    }
    Decision { budget, reason: String::new() }
}

fn meminfo_field(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?.strip_prefix(':')?;
        let kb: u64 = rest.split_whitespace().next()?.parse().ok()?;
        Some(kb * 1024)
    })
}

fn psi_avg10(text: &str) -> Option<f64> {
    let l = text.lines().find(|l| l.starts_with("some "))?;
    l.split_whitespace().find_map(|kv| kv.strip_prefix("avg10=")?.parse().ok())
}

fn read_num(p: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(p).ok()?;
    let s = s.trim();
    if s == "max" {
        return Some(u64::MAX);
    }
    s.parse().ok()
}

/// The memory cgroup's (limit, usage) for the process, if limited.
fn cgroup(root: &Path) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(root.join("proc/self/cgroup")).ok()?;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrl, path) = (parts.next()?, parts.next()?, parts.next()?);
        let path = path.trim_start_matches('/');
        let (limit, usage) = if ctrl.is_empty() {
            let d = root.join("sys/fs/cgroup").join(path);
            (read_num(&d.join("memory.max")), read_num(&d.join("memory.current")))
        } else if ctrl.split(',').any(|c| c == "memory") {
            let d = root.join("sys/fs/cgroup/memory").join(path);
            (read_num(&d.join("memory.limit_in_bytes")), read_num(&d.join("memory.usage_in_bytes")))
        } else {
            continue;
        };
        if let (Some(l), Some(u)) = (limit, usage) {
            // v1 reports "no limit" as a huge number.
            if l < (1 << 60) {
                return Some((l, u));
            }
        }
    }
    None
}

/// Reads the signals under `root` (`/` normally; a folder of fake files in tests).
pub fn read(root: &Path) -> Reading {
    let mi = std::fs::read_to_string(root.join("proc/meminfo")).unwrap_or_default();
    Reading {
        mem_total: meminfo_field(&mi, "MemTotal").unwrap_or(0),
        mem_available: meminfo_field(&mi, "MemAvailable").unwrap_or(u64::MAX),
        psi_some_avg10: std::fs::read_to_string(root.join("proc/pressure/memory"))
            .ok()
            .and_then(|t| psi_avg10(&t)),
        cgroup: cgroup(root),
        stall_event: false,
    }
}

/// A PSI trigger file, if the kernel has PSI and lets us set one.
struct Trigger(std::fs::File);

impl Trigger {
    fn open(root: &Path) -> Option<Trigger> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(root.join("proc/pressure/memory"))
            .ok()?;
        f.write_all(b"some 100000 1000000\0").ok()?;
        Some(Trigger(f))
    }

    /// Waits up to `t` for a stall; true if one came.
    fn wait(&self, t: Duration) -> bool {
        use std::os::fd::AsRawFd;
        let mut p = libc::pollfd { fd: self.0.as_raw_fd(), events: libc::POLLPRI, revents: 0 };
        // SAFETY: poll on one valid pollfd for at most t.
        let r = unsafe { libc::poll(&mut p, 1, t.as_millis() as libc::c_int) };
        r > 0 && p.revents & libc::POLLPRI != 0
    }
}

/// What the watcher reports.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PressureStats {
    /// Times the budget was cut.
    pub shrinks: u64,
    /// Times it grew back.
    pub grows: u64,
    /// Why it last changed.
    pub last_reason: String,
    /// Whether a PSI trigger is armed (else the readings alone).
    pub psi_trigger: bool,
}

/// The watcher's shared state.
#[derive(Default)]
pub struct Watch {
    shrinks: AtomicU64,
    grows: AtomicU64,
    last: Mutex<String>,
    trigger: AtomicBool,
}

impl Watch {
    /// Its statistics.
    pub fn stats(&self) -> PressureStats {
        PressureStats {
            shrinks: self.shrinks.load(Ordering::Relaxed),
            grows: self.grows.load(Ordering::Relaxed),
            last_reason: self.last.lock().clone(),
            psi_trigger: self.trigger.load(Ordering::Relaxed),
        }
    }
}

/// Watcher configuration.
#[derive(Debug, Clone)]
pub struct PressureConfig {
    /// Where `/proc` and `/sys` are (`/`).
    pub root: PathBuf,
    /// Reading interval.
    pub interval: Duration,
}

impl Default for PressureConfig {
    fn default() -> Self {
        PressureConfig { root: PathBuf::from("/"), interval: Duration::from_secs(1) }
    }
}

/// Runs the watcher until `stop`: adjusts `ram`'s budget.
pub fn run(cfg: PressureConfig, ram: &RamCache, watch: &Watch, stop: &AtomicBool) {
    let trigger = Trigger::open(&cfg.root);
    watch.trigger.store(trigger.is_some(), Ordering::Relaxed);
    let mut calm_since = Instant::now();
    while !stop.load(Ordering::Acquire) {
        let stall = match &trigger {
            Some(t) => t.wait(cfg.interval),
            None => {
                std::thread::sleep(cfg.interval);
                false
            }
        };
        if stop.load(Ordering::Acquire) {
            break;
        }
        let r = Reading { stall_event: stall, ..read(&cfg.root) };
        let budget = ram.budget();
        let d = decide(&r, budget, ram.configured(), calm_since.elapsed());
        if d.budget < budget {
            calm_since = Instant::now();
            watch.shrinks.fetch_add(1, Ordering::Relaxed);
            *watch.last.lock() = d.reason;
            ram.set_budget(d.budget);
        } else if d.budget > budget {
            watch.grows.fetch_add(1, Ordering::Relaxed);
            *watch.last.lock() = d.reason;
            ram.set_budget(d.budget);
        }
    }
}

/// Starts the watcher thread.
pub fn spawn(
    cfg: PressureConfig,
    ram: Arc<RamCache>,
    watch: Arc<Watch>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("cache-pressure".into())
        .spawn(move || run(cfg, &ram, &watch, &stop))
        .expect("spawning the memory pressure watcher")
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;
    const M: u64 = 1 << 20;

    fn r(avail: u64) -> Reading {
        Reading { mem_total: 16 * G, mem_available: avail, ..Default::default() }
    }

    #[test]
    fn shrinks_on_shortfall_stall_and_cgroup_grows_when_calm() {
        let floor = min_free(16 * G);
        assert_eq!(floor, 16 * G / 20);
        // Plenty of room: unchanged, then growth only after calm.
        assert_eq!(decide(&r(8 * G), 512 * M, 512 * M, CALM).budget, 512 * M);
        assert_eq!(decide(&r(8 * G), 256 * M, 512 * M, Duration::from_secs(1)).budget, 256 * M);
        assert_eq!(decide(&r(8 * G), 256 * M, 512 * M, CALM).budget, 320 * M);
        // Short by 100 MiB: gives back at least that.
        let d = decide(&r(floor - 100 * M), 512 * M, 512 * M, CALM);
        assert_eq!(d.budget, 412 * M);
        assert!(d.reason.contains("MemAvailable"), "{d:?}");
        // Short by a little: at least an eighth.
        assert_eq!(decide(&r(floor - M), 512 * M, 512 * M, CALM).budget, 448 * M);
        // A stall: a quarter.
        let s = Reading { psi_some_avg10: Some(25.0), ..r(8 * G) };
        assert_eq!(decide(&s, 512 * M, 512 * M, CALM).budget, 384 * M);
        let e = Reading { stall_event: true, ..r(8 * G) };
        assert!(decide(&e, 512 * M, 512 * M, CALM).reason.contains("trigger"));
        // A cgroup with 10 MiB of room left under 1 GiB.
        let c = Reading { cgroup: Some((G, G - 10 * M)), ..r(8 * G) };
        let d = decide(&c, 512 * M, 512 * M, CALM);
        assert!(d.budget < 512 * M && d.reason.contains("cgroup"), "{d:?}");
        // Never below zero.
        assert_eq!(decide(&r(0), 10 * M, 512 * M, CALM).budget, 0);
    }

    #[test]
    fn reads_fake_proc_and_cgroup_files() {
        let root = std::env::temp_dir().join(format!("ztier-pressure-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("proc/pressure")).unwrap();
        std::fs::create_dir_all(root.join("proc/self")).unwrap();
        std::fs::create_dir_all(root.join("sys/fs/cgroup/memory/svc")).unwrap();
        std::fs::write(
            root.join("proc/meminfo"),
            "MemTotal:       16384 kB\nMemFree: 1 kB\nMemAvailable:    2048 kB\n",
        )
        .unwrap();
        std::fs::write(
            root.join("proc/pressure/memory"),
            "some avg10=12.50 avg60=3.00 avg300=1.00 total=1\nfull avg10=1.00 avg60=0 avg300=0 total=0\n",
        )
        .unwrap();
        std::fs::write(root.join("proc/self/cgroup"), "5:cpu:/\n4:memory:/svc\n").unwrap();
        std::fs::write(root.join("sys/fs/cgroup/memory/svc/memory.limit_in_bytes"), "1073741824\n").unwrap();
        std::fs::write(root.join("sys/fs/cgroup/memory/svc/memory.usage_in_bytes"), "1048576\n").unwrap();
        let got = read(&root);
        assert_eq!(got.mem_total, 16 << 20);
        assert_eq!(got.mem_available, 2 << 20);
        assert_eq!(got.psi_some_avg10, Some(12.5));
        assert_eq!(got.cgroup, Some((1 << 30, 1 << 20)));
        // cgroup v2, unlimited: none.
        std::fs::write(root.join("proc/self/cgroup"), "0::/a\n").unwrap();
        std::fs::create_dir_all(root.join("sys/fs/cgroup/a")).unwrap();
        std::fs::write(root.join("sys/fs/cgroup/a/memory.max"), "max\n").unwrap();
        std::fs::write(root.join("sys/fs/cgroup/a/memory.current"), "5\n").unwrap();
        assert_eq!(read(&root).cgroup, None);
        std::fs::write(root.join("sys/fs/cgroup/a/memory.max"), "100000000\n").unwrap();
        assert_eq!(read(&root).cgroup, Some((100_000_000, 5)));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
