//! `ztier run` tests that run their program in each of the four ways
//! ztier serves faults themselves ([`MODES`]: a handler thread or the
//! faulting thread, on a full userfaultfd or on the user-mode-only one an
//! unprivileged user gets, where the faulting thread is the default).
//! `make test` runs this file once; `cli_run.rs`, whose tests take the
//! way from the environment, runs once per way.

use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
use common::*;

/// GNU make, which starts its recipes' shells with `posix_spawn`, from a
/// heap of 60 k variables (~20 MiB) at a 4M budget, two jobs at a time:
/// 300 targets, each a shell pipeline. Before the library exported
/// `posix_spawn`, with `--fault-path signal` it stopped with "make:
/// /bin/sh: Bad address" (the child's `exec` met evicted memory).
/// Same output as native in every mode.
#[test]
fn make_runs_recipes_from_a_cold_heap() {
    require("make");
    require("md5sum");
    let d = tmp("make");
    let mut mk = String::new();
    for i in 0..60_000 {
        mk.push_str(&format!("V{i} := value-{i}-{}\n", "x".repeat(100)));
    }
    let targets: Vec<String> = (0..300).map(|i| format!("t{i}")).collect();
    mk.push_str(&format!("T := {}\nall: $(T)\n\t@echo done $(words $(T))\n", targets.join(" ")));
    mk.push_str("t%:\n\t@echo $@ $(V$(subst t,,$@)) | md5sum | cut -c1-8\n");
    std::fs::write(d.join("Makefile"), mk).unwrap();
    let sorted = |o: &[u8]| {
        let mut l: Vec<String> = String::from_utf8_lossy(o).lines().map(str::to_owned).collect();
        l.sort();
        l
    };
    let n = native(&["make", "-s", "-j2"], &d);
    assert!(n.status.success(), "{n:?}");
    let want = sorted(&n.stdout);
    assert_eq!(want.len(), 301, "{want:?}");
    for (path, umo) in MODES {
        let stats = d.join(format!("make-{path}-{umo}.json"));
        let m = Command::new(ztier())
            .args(["run", "--budget", "4M", "--fault-path", path, "--stats"])
            .arg(&stats)
            .args(["--", "make", "-s", "-j2"])
            .env("ZTIER_UFFD_USER_MODE_ONLY", umo)
            .current_dir(&d)
            .output()
            .unwrap();
        let what = format!("{path}, user-mode-only {umo}");
        assert!(m.status.success(), "{what}: {}", String::from_utf8_lossy(&m.stderr));
        assert_eq!(sorted(&m.stdout), want, "{what}");
        let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
        assert!(compressed(&s) > 2000, "{what}: {s}");
    }
}

/// node starting child processes (`execSync`, `spawnSync`: libuv forks,
/// the child execs) with its heap compressed, in every mode. node maps
/// part of its own binary into its code range, which lies in the arena;
/// a forked child registers the arena again, the kernel refused the
/// range with that file mapping in it (`EINVAL`), and every child
/// aborted ("the forked child cannot manage its memory"), at any budget.
#[test]
fn node_starts_child_processes() {
    require("node");
    let d = tmp("node-child");
    let js = "const cp = require('child_process'); const keep = []; \
              for (let i = 0; i < 200000; i++) keep.push({ k: 'x' + i, v: 'y'.repeat(40) + i }); \
              const out = []; for (let r = 0; r < 3; r++) { let s = 0; for (const o of keep) s += o.v.length; \
              out.push(cp.execSync('echo run ' + r).toString().trim() + ' ' + s); \
              out.push(cp.spawnSync('/bin/echo', ['spawned', String(r)]).stdout.toString().trim()); } \
              console.log(out.join('\\n'));";
    let n = native(&["node", "-e", js], &d);
    assert!(n.status.success(), "{n:?}");
    assert!(String::from_utf8_lossy(&n.stdout).contains("spawned 2"), "{n:?}");
    for mode in MODES {
        let (m, s) = managed_in_mode(&d, mode, &["node", "-e", js], &[]);
        assert!(m.status.success(), "{mode:?}: {}", String::from_utf8_lossy(&m.stderr));
        assert_eq!(m.stdout, n.stdout, "{mode:?}");
        assert!(compressed(&s) > 5000, "{mode:?}: {s}");
    }
}

/// Runs `cmd` in a process group of its own (`ztier run` and the program)
/// and its output, or kills the group and fails if it has not ended
/// within `secs` (a hang must fail the test, not stop the suite).
fn output_within(cmd: &mut Command, secs: u64, what: &str) -> Output {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > std::time::Duration::from_secs(secs) {
            // The whole group, by its id.
            // SAFETY: signalling the process group this test made.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            panic!("{what}: no end within {secs} s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// The four ways `ztier run` serves a program: (`--fault-path`,
/// `ZTIER_UFFD_USER_MODE_ONLY`) — a handler thread, the faulting thread,
/// each on a full userfaultfd (root's default: the handler thread) and on
/// a user-mode-only one (an unprivileged user's default: the faulting
/// thread).
const MODES: [(&str, &str); 4] = [("thread", "0"), ("signal", "0"), ("thread", "1"), ("signal", "1")];

/// Runs `cmd` (in `d`) under `ztier run --budget 16M` in one of
/// [`MODES`], with `env` set too; its output and merged stats.
fn managed_in_mode(
    d: &Path,
    (path, umo): (&str, &str),
    cmd: &[&str],
    env: &[(&str, &str)],
) -> (Output, serde_json::Value) {
    let stats = d.join(format!("{path}-{umo}.json"));
    let m = Command::new(ztier())
        .args(["run", "--budget", "16M", "--fault-path", path, "--stats"])
        .arg(&stats)
        .arg("--")
        .args(cmd)
        .envs(env.iter().copied())
        .env("ZTIER_UFFD_USER_MODE_ONLY", umo)
        .current_dir(d)
        .output()
        .unwrap();
    let s = std::fs::read_to_string(&stats)
        .unwrap_or_else(|e| panic!("{path}, user-mode-only {umo}: no stats ({e}); {m:?}"));
    (m, serde_json::from_str(&s).unwrap())
}

/// Where system calls are caught first (user-mode-only mode, faults
/// served in the faulting thread), the ones programs make most through
/// glibc — `read`, `write`, `pread64`, `pwrite64`, `lseek`, `close`,
/// `readv`/`writev` and the positioned ones, the socket calls, `poll`,
/// `epoll_wait`, the `stat` family, `open`, file and directory calls,
/// `fcntl`, `pipe2`, `waitpid`, eventfds, glibc's fortified `__read_chk`,
/// `syscall` itself — are entered by the library's own wrappers and skip
/// the `SIGSYS` round trip, still with their cold buffers brought back
/// and pinned (`direct.c`: ~64 k such calls on buffers evicted between
/// them; a
/// futex wait through `syscall` whose timeout went cold, EFAULT before
/// the timeout was pinned; a thread blocked in `read` that
/// `pthread_cancel` must still reach; and timeouts on an empty pipe,
/// each left from a `SIGALRM` handler by `siglongjmp` or a plain
/// `longjmp` that keeps the handler's mask: a `read`, a `readv` of eight
/// buffers, a `poll`, and a `readv` and a `poll` made by the program's
/// own `syscall` instruction, which dispatch catches — after which calls
/// on cold memory must still work: before, the first failed with
/// EFAULT, the thread's calls left unprotected, and without `SIGSYS`
/// unblocked at the jump the process is killed by it; a jump to the very
/// frame of the own `syscall` left its level behind, EFAULT again). Same
/// output as native in every mode; without dispatch nothing is counted;
/// no pin outlives its call (`pinned_bytes` at exit: 64 KiB before the
/// cancelled reader's pins ended at its exit, a page each before the
/// jumps ended theirs, 16 KiB when a jump ended only the first four of
/// the eight buffers').
#[test]
fn system_calls_through_glibc_skip_the_dispatch_signal() {
    let d = tmp("direct");
    let dir = d.to_string_lossy().into_owned();
    let exe = compile(&d, "direct");
    let n = native(&[&exe, &dir], &d);
    assert!(n.status.success(), "{}", String::from_utf8_lossy(&n.stderr));
    let text = String::from_utf8_lossy(&n.stdout).into_owned();
    for line in [
        "futex wait with a cold timeout: -1, Connection timed out",
        "same: 1",
        "after the timeout: 1",
        "after the readv timeout: 1",
        "after the own readv timeout: 1",
        "after the poll timeout: 1",
        "after the own poll timeout: 1",
        "more calls: ",
        "other calls: 606,",
        "reader cancelled: 1",
    ] {
        assert!(text.contains(line), "native run: {text}");
    }
    for (path, umo) in MODES {
        let (m, s) = managed_in_mode(&d, (path, umo), &[&exe, &dir], &[]);
        assert!(m.status.success(), "{path}, user-mode-only {umo}: {m:?}");
        assert_eq!(String::from_utf8_lossy(&m.stdout), text, "{path}, user-mode-only {umo}");
        let (direct, dispatched) =
            (s["direct_calls"].as_u64().unwrap(), s["dispatched_calls"].as_u64().unwrap());
        assert!(compressed(&s) > 20000, "{s}");
        if path == "thread" && umo == "0" {
            assert_eq!((direct, dispatched, s["pinned_calls"].as_u64().unwrap()), (0, 0, 0), "{s}");
        } else {
            assert!(direct >= 64000 && dispatched < 200, "{path}, user-mode-only {umo}: {s}");
            // Buffers that had gone cold came back for the calls.
            assert!(s["pinned_in"].as_u64().unwrap() >= 2048, "{s}");
        }
        // Every pin ended: also those of the calls left by a jump (a page
        // each) and of the reader cancelled in its read (64 KiB).
        assert_eq!(
            s["per_process"][0]["pinned_bytes"].as_u64(),
            Some(0),
            "{path}, user-mode-only {umo}: {s}"
        );
    }
}

/// Asynchronous signals under pressure (`asyncsig.c`), in every mode: a
/// profiler's `SIGPROF` handler that reads a cold heap page each tick
/// while the program allocates and frees large blocks (which the library
/// manages under its lock) — before the library blocked such signals
/// while a thread of the program held that lock, the handler's fault
/// waited for a service that waited for the lock: the watchdog aborted
/// the run (exit 134), and with faults served in the faulting thread
/// the service faulted inside itself ("the fault handler faulted on
/// managed memory"; under dispatch such a signal is now put aside and
/// sent again when the lock is let go — without that, the watchdog
/// aborted those modes too); and `SIGUSR1`/`SIGTERM` sent to a process whose
/// threads block them, taken by `sigwait` — before the library's own
/// threads blocked them, they took the signal and its default action
/// ended the process (exit 138).
#[test]
fn asynchronous_signals_reach_the_program_and_never_wait_on_the_library() {
    native_output_in_every_mode("asyncsig", "sigwait took SIGUSR1: yes, then SIGTERM");
}

/// One-shot (`SA_RESETHAND`) handlers and handlers that install handlers
/// (`oneshot.c`): a System V style handler that reads a cold page and
/// re-arms itself with `sigaction`, its signal sent while the main thread
/// allocates and frees large blocks; what `sigaction` reports after a
/// one-shot delivery; a one-shot signal sent twice, and a `sysv_signal`
/// handler raising its own signal, end a child by that signal. Before,
/// in both dispatch modes, the handler ran where it interrupted ztier's
/// code with its calls let through: its `sigaction` put the program's
/// handler itself in the kernel, which then ran it while ztier's lock was
/// held (hung until the watchdog aborted it).
#[test]
fn one_shot_handlers_and_handlers_that_rearm_themselves() {
    native_output_in_every_mode_and(
        "oneshot",
        &[
            "50 or more handled: yes",
            "after: default 1, one-shot 1, restart 1, siginfo 0, onstack 0, mask has SIGINT 1",
            "sent twice ended the child by signal 12",
            "raising its signal ended the child by signal 12",
        ],
        |_, _, _, _| {},
    );
}

/// The program's `open` gets the lowest free descriptor every time while
/// the library works beside it (`lowfd.c`: 40960 opens, its heap swept
/// under pressure between them). Before, the background evictor's look
/// for processes that are gone read `/proc/PID/stat` every 10 ms while
/// the pool was short, and an `open` made meanwhile got descriptor 4:
/// 11–27 of the opens in each mode (CI once saw it in `closeall.c`).
#[test]
fn the_library_never_holds_the_programs_lowest_free_descriptor() {
    native_output_in_every_mode("lowfd", "opens 40960, not the lowest free descriptor 0,");
}

/// No library thread makes a descriptor while the program runs, seen
/// by `strace -ff` (a file per thread): `lowfd`, whose one thread is the
/// program's, so every other thread of its process is the library's. A
/// descriptor one of those makes (`open`, `socket`, ...) is first the
/// program's lowest free number, which the program's own `open` was
/// owed. glibc's allocator opened `/proc/sys/vm/overcommit_memory` the
/// first time a thread arena shrank, from the background evictor in 4 of
/// 6 runs (CI once saw 8 of `lowfd`'s opens get another number), until
/// the library made that first shrink at start-up (`prime_heap_check`):
/// two runs with `--fault-path signal`, as the evictor did not open it in
/// every run. The thread path's handler opened `/proc/self/task/TID/stat`
/// for every 256th fault (`Spread`), until it asked `sched_getaffinity`
/// instead: one run with `--fault-path thread`.
#[test]
fn the_library_threads_make_no_descriptor_while_the_program_runs() {
    require("strace");
    let d = tmp("libopens");
    let exe = compile(&d, "lowfd");
    // Every system call that makes a descriptor, and those that start
    // threads and programs. (--seccomp-bpf: the others run untraced.)
    let made = [
        "open",
        "openat",
        "openat2",
        "creat",
        "socket",
        "socketpair",
        "accept",
        "accept4",
        "eventfd",
        "eventfd2",
        "memfd_create",
        "pipe",
        "pipe2",
        "dup",
        "dup2",
        "dup3",
        "fcntl",
        "signalfd",
        "signalfd4",
        "timerfd_create",
        "epoll_create",
        "epoll_create1",
        "inotify_init",
        "inotify_init1",
        "pidfd_open",
        "pidfd_getfd",
        "userfaultfd",
        "perf_event_open",
        "io_uring_setup",
        "memfd_secret",
    ];
    let trace = format!("trace={},clone,clone3,execve", made.join(","));
    for (run, path) in ["signal", "signal", "thread"].into_iter().enumerate() {
        let logs = d.join(format!("strace-{run}"));
        std::fs::create_dir_all(&logs).unwrap();
        let o = Command::new("strace")
            .args(["-ff", "-qq", "--seccomp-bpf", "-e", &trace, "-o"])
            .arg(logs.join("t"))
            .arg(ztier())
            .args(["run", "--budget", "16M", "--fault-path", path, "--", &exe])
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{:?}: {}", o.status, String::from_utf8_lossy(&o.stderr));
        assert!(out.starts_with("opens 40960, not the lowest free descriptor 0,"), "{out}");
        // Each thread's calls, by thread ID (`t.TID`).
        let calls: std::collections::HashMap<u32, String> = std::fs::read_dir(&logs)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let tid = e.file_name().to_string_lossy().rsplit('.').next().unwrap().parse().unwrap();
                (tid, std::fs::read_to_string(e.path()).unwrap())
            })
            .collect();
        // The program: the thread that executed `lowfd`; its threads,
        // those it and they cloned with CLONE_THREAD.
        let started = format!("execve(\"{exe}\"");
        let program = *calls
            .iter()
            .find(|(_, c)| c.lines().any(|l| l.starts_with(&started) && l.ends_with("= 0")))
            .expect("strace saw lowfd start")
            .0;
        let mut threads = vec![program];
        let mut k = 0;
        while k < threads.len() {
            for l in calls.get(&threads[k]).map_or("", |c| c.as_str()).lines() {
                if l.starts_with("clone") && l.contains("CLONE_THREAD") {
                    if let Some(t) = l.rsplit("= ").next().and_then(|t| t.trim().parse().ok()) {
                        threads.push(t);
                    }
                }
            }
            k += 1;
        }
        assert!(threads.len() >= 3, "the library's threads: {threads:?}");
        for t in &threads[1..] {
            for l in calls.get(t).map_or("", |c| c.as_str()).lines() {
                let call = l.split('(').next().unwrap_or("");
                assert!(
                    !made.contains(&call) || (call == "fcntl" && !l.contains("F_DUPFD")),
                    "run {run} ({path} path): library thread {t} made a descriptor beside the program: {l}"
                );
            }
        }
    }
}

/// A program that closes every descriptor it did not open
/// (`closeall.c`: `close_range`, `closefrom`, a loop of `close`, the raw
/// `close_range` system call, `CLOSE_RANGE_UNSHARE`), each time with its
/// heap cold: the heap reads back intact and its next `open` gets
/// descriptor 3, as natively. Before, those closes took the library's
/// userfaultfd, and the next fault aborted the process (`EBADF`) or
/// killed it by `SIGSEGV`; CPython's `os.closerange` did it too.
#[test]
fn a_program_that_closes_every_descriptor_keeps_its_memory() {
    native_output_in_every_mode_and(
        "closeall",
        &[
            "close_range(3, ~0U, 0): heap intact, next descriptor 3",
            "closefrom(3): heap intact, next descriptor 3",
            "close(3..4095): heap intact, next descriptor 3",
            "syscall(SYS_close_range, 3, ~0U, 0): heap intact, next descriptor 3",
            "close_range(3, ~0U, CLOSE_RANGE_UNSHARE): heap intact, next descriptor 3",
        ],
        |_, _, _, _| {},
    );
}

/// `MADV_WIPEONFORK` (how a random generator notices a fork),
/// `MADV_KEEPONFORK` over part of it, `MADV_DONTFORK`, and a mapping made
/// where a wiped one was unmapped (`wipeonfork.c`): in a forked child the
/// wiped pages read as zeros, evicted before the fork or not, and nothing
/// else does; a touch of the range kept from it is a `SIGSEGV`, as where
/// natively nothing is mapped (it read zeros). Before, the library
/// ignored that advice on its arena, and the child read the parent's
/// bytes.
#[test]
fn pages_wiped_on_fork_read_as_zeros_in_the_child() {
    native_output_in_every_mode_and(
        "wipeonfork",
        &[
            "child wiped cold: 0 0 0 0",
            "child wiped hot, middle kept: 0 22 22 0",
            "child mapped after a wiped one: 55 55 55 55",
            "child not forked: SIGSEGV",
            "parent wiped cold: 11 11 11 11",
            "parent not forked: 33 33",
        ],
        |_, _, _, _| {},
    );
}

/// Locked memory (`mlock.c`: `mlock`, `mlock2(MLOCK_ONFAULT)`, a partial
/// `munlock`, `mlockall(MCL_CURRENT | MCL_FUTURE)` in a forked child),
/// with everything else pushed out between: locked pages stay resident
/// (`mincore`) and every byte reads back. Before, the kernel's lock made
/// the next eviction's `MADV_DONTNEED` fail (`EINVAL`) and the process
/// was aborted. And the child, over its budget under `mlockall`, sleeps
/// without using the CPU (the evictor spun there, ~1 s of CPU a second).
#[test]
fn locked_memory_stays_resident() {
    native_output_in_every_mode_and(
        "mlock",
        &[
            "mlock 0, mlock2 onfault 0",
            "after pressure: key resident 256 of 256, intact 1; on-fault intact 1",
            "second half resident 128 of 128, whole key intact 1",
            "child: mlockall 0, new memory resident 256 of 256, sum 18432, key intact 1",
            "child: CPU while asleep under mlockall under 0.1 s: 1",
            "parent after: key intact 1, on-fault intact 1",
        ],
        |_, _, _, _| {},
    );
}

/// Where cores go while a test runs: as root `core_pattern` is set to
/// `DIR/core.%p` and put back when this is dropped (also when the test
/// fails); otherwise it must already write plain files into the folder
/// of the crashing process (`core`, with or without the PID).
struct CoresInto {
    old: Option<String>,
    _one: std::sync::MutexGuard<'static, ()>,
    /// Held (`flock`) while `core_pattern` is ours: test processes run
    /// at once (two checkouts, or the four ways by hand) would otherwise
    /// each put back the other's pattern, leaving one of a deleted folder.
    _across: std::fs::File,
}

/// One test of this process at a time sets `core_pattern` (each puts back
/// what it found); the lock file keeps other processes off it too.
static CORES_INTO: std::sync::Mutex<()> = std::sync::Mutex::new(());

const CORE_PATTERN: &str = "/proc/sys/kernel/core_pattern";

impl CoresInto {
    fn dir(d: &Path) -> CoresInto {
        let one = CORES_INTO.lock().unwrap_or_else(|e| e.into_inner());
        // (Read-only when another user made the file: flock needs no more.)
        let lock = std::env::temp_dir().join("ztier-tests-core-pattern.lock");
        let across = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&lock)
            .or_else(|_| std::fs::File::open(&lock))
            .unwrap();
        // SAFETY: flock on a descriptor we own; it waits for the other holder.
        assert_eq!(unsafe { libc::flock(across.as_raw_fd(), libc::LOCK_EX) }, 0, "locking core_pattern");
        let old = std::fs::read_to_string(CORE_PATTERN).unwrap().trim_end().to_string();
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            std::fs::write(CORE_PATTERN, format!("{}/core.%p", d.display())).unwrap();
            return CoresInto { old: Some(old), _one: one, _across: across };
        }
        assert_eq!(
            old, "core",
            "this test needs cores written as files into the crashing program's folder: run it as root \
             (it sets {CORE_PATTERN} for its run) or with core_pattern 'core'"
        );
        CoresInto { old: None, _one: one, _across: across }
    }
}

impl Drop for CoresInto {
    fn drop(&mut self) {
        if let Some(old) = &self.old {
            std::fs::write(CORE_PATTERN, old).unwrap();
        }
    }
}

/// The one core file in `d` (taken out of it), if it is shorter than
/// `most` bytes.
fn take_core(d: &Path, most: u64) -> Result<Vec<u8>, String> {
    let cores: Vec<PathBuf> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("core"))
        .collect();
    assert_eq!(cores.len(), 1, "one core file expected in {}: {cores:?}", d.display());
    let len = std::fs::metadata(&cores[0]).unwrap().len();
    let core = (len < most).then(|| std::fs::read(&cores[0]).unwrap());
    std::fs::remove_file(&cores[0]).unwrap();
    core.ok_or(format!("a core of {} MiB", len >> 20))
}

/// How many different numbered blocks `core` holds as the program wrote
/// them: `prefix`, 8 digits (`i`), a NUL, and at least 64 bytes of
/// `fill` + `i` % 26 (a compressed copy in the store has the marker too,
/// but not the run of bytes after it).
fn markers(core: &[u8], prefix: &str, fill: u8) -> usize {
    let mut seen = std::collections::HashSet::new();
    for at in memchr::memmem::find_iter(core, prefix.as_bytes()) {
        let at = at + prefix.len();
        // (The format string itself is in the core too.)
        let Some(i) = core.get(at..at + 8).and_then(|n| std::str::from_utf8(n).ok()?.parse::<usize>().ok())
        else {
            continue;
        };
        let want = fill + (i % 26) as u8;
        if core.get(at + 8) == Some(&0)
            && core.get(at + 9..at + 73).is_some_and(|r| r.iter().all(|&b| b == want))
        {
            seen.insert(i);
        }
    }
    seen.len()
}

/// A program that crashes with its heap cold (`crash.c`: 24 MiB of
/// numbered pages and 32 k numbered small blocks at a 4M budget; by
/// `abort`, a `SIGSEGV`, a `SIGBUS` from a truncated file mapping, and a
/// `SIGSEGV` whose handler puts back the action it found, as CPython's
/// `faulthandler` does) leaves a core with every marker in it, as
/// natively, in every mode, and a core about as long as native (the
/// arena's unused reservation and the library's page tables are left
/// out). Before, the evicted pages were holes in the core (zeros), and
/// the core file was as long as the arena: 69 GB for a 64 MiB program.
#[test]
fn a_crash_dumps_core_with_every_page() {
    let d = tmp("crash");
    let exe = compile(&d, "crash");
    let _cores = CoresInto::dir(&d);
    let run = |cmd: &[&str], env: &[(&str, &str)], most: u64| {
        let o = Command::new("sh")
            .args(["-c", "ulimit -c unlimited && exec \"$@\"", "sh"])
            .args(cmd)
            .envs(env.iter().copied())
            .current_dir(&d)
            .output()
            .unwrap();
        let core = take_core(&d, most);
        (o, core)
    };
    for (kind, sig) in [("abort", 6), ("segv", 11), ("bus", 7), ("chain", 11)] {
        let (n, native_core) = run(&[&exe, kind], &[], 1 << 30);
        let native_core = native_core.unwrap();
        // `sh` execs the program, so it dies by the signal itself.
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(n.status.signal(), Some(sig), "native {kind}: {n:?}");
        let text = String::from_utf8_lossy(&n.stdout).into_owned();
        assert!(text.ends_with("SIGSEGV shown as default: 1, SIGABRT was: 1\n"), "{text}");
        assert_eq!(markers(&native_core, "ztier-core-page-", b'a'), 6144, "native {kind}");
        assert_eq!(markers(&native_core, "ztier-core-obj-", b'A'), 32768, "native {kind}");
        for (path, umo) in MODES {
            let what = format!("{kind}, {path}, user-mode-only {umo}");
            // The two regions' fronts round up to 8 MiB each; the
            // library's threads, stacks and store come on top.
            let (m, core) = run(
                // (ztier's notices on stderr, where this looks for one.)
                &[ztier(), "run", "--budget", "4M", "--log", "-", "--fault-path", path, "--", &exe, kind],
                &[("ZTIER_UFFD_USER_MODE_ONLY", umo)],
                native_core.len() as u64 + (96 << 20),
            );
            let err = String::from_utf8_lossy(&m.stderr);
            let core = core
                .unwrap_or_else(|e| panic!("{what}: {e}, against {} MiB natively", native_core.len() >> 20));
            assert_eq!(m.status.code(), Some(128 + sig), "{what}: {err}");
            assert_eq!(String::from_utf8_lossy(&m.stdout), text, "{what}");
            assert!(!err.contains("the core dump will miss"), "{what}: {err}");
            assert_eq!(markers(&core, "ztier-core-page-", b'a'), 6144, "{what}");
            assert_eq!(markers(&core, "ztier-core-obj-", b'A'), 32768, "{what}");
        }
    }
}

/// A JVM that crashes where core dumps are on still writes its
/// `hs_err_pid*.log` report, and its core, in every mode. HotSpot keeps
/// the `SIGSEGV` action it finds and calls it for a crash of its own
/// before it writes the report; shown the library's core handler, it
/// called that, and the report was never written (seen in the default
/// thread path before `sigaction` showed the default there).
#[test]
fn a_crashing_jvm_still_writes_its_report_where_cores_are_on() {
    require("java");
    let d = tmp("jvm-crash");
    std::fs::write(
        d.join("Crash.java"),
        "public class Crash { public static void main(String[] a) throws Exception {\n\
         java.util.HashMap<Integer, String> m = new java.util.HashMap<>();\n\
         for (int i = 0; i < 300000; i++) m.put(i, \"v\" + i);\n\
         System.out.println(m.size());\n\
         java.lang.reflect.Field f = sun.misc.Unsafe.class.getDeclaredField(\"theUnsafe\");\n\
         f.setAccessible(true);\n\
         ((sun.misc.Unsafe) f.get(null)).putLong(16L, 1L); } }\n",
    )
    .unwrap();
    let _cores = CoresInto::dir(&d);
    let reports = || -> Vec<PathBuf> {
        std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("hs_err_pid"))
            .collect()
    };
    for (path, umo) in MODES {
        let what = format!("{path}, user-mode-only {umo}");
        let o = Command::new("sh")
            .args(["-c", "ulimit -c unlimited && exec \"$@\"", "sh"])
            .args([ztier(), "run", "--budget", "32M", "--fault-path", path, "--"])
            .args(["java", "-Xmx256m", "-XX:-CreateCoredumpOnCrash", "Crash.java"])
            .env("ZTIER_UFFD_USER_MODE_ONLY", umo)
            .current_dir(&d)
            .output()
            .unwrap();
        let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        // HotSpot's account of the crash goes to stdout, after the output.
        assert!(out.starts_with("300000\n"), "{what}: {out} {err}");
        assert!(
            out.contains("A fatal error has been detected by the Java Runtime Environment"),
            "{what}: {out} {err}"
        );
        let r = reports();
        assert_eq!(r.len(), 1, "{what}: no hs_err report ({r:?}); {err}");
        std::fs::remove_file(&r[0]).unwrap();
    }
}

/// Threads started after the locale's data went cold (`locale.c`:
/// `setlocale` once the library is up, then 20 rounds of 48 MiB written
/// at a 16M budget and a new thread). glibc's new thread reads that data
/// with every signal blocked; with `--fault-path signal` the fault there
/// was a blocked `SIGBUS`, and the process was killed by it every time
/// (a JVM at 32M: 5 runs of 13). Before those, 5 rounds end in a
/// `SIGEV_THREAD` timer's expiry, whose threads glibc starts by its
/// internal `pthread_create`: their creator's block-all mask goes through
/// dispatch, which keeps `SIGBUS` unblocked, so they need no keep (they
/// passed before it too; the data was found evicted by `mincore` at 2 of
/// those 5 starts).
#[test]
fn threads_started_after_the_locale_went_cold() {
    native_output_in_every_mode_and(
        "locale",
        &["timer threads after the locale went cold: ", "\nthreads after the locale went cold: "],
        |_, _, _, _| {},
    );
}

/// Programs started from memory that went cold (`spawn.c`: a command,
/// its environment and `posix_spawn`'s file actions built in the heap,
/// 144 MiB written at a 16M budget, then started by `posix_spawn`,
/// `posix_spawnp`, `system`, `popen` and `vfork` with an `open` and an
/// `execv`/`execve`). A `vfork`-like child has no dispatch; the kernel's
/// reads for its `open` and `exec` failed with `EFAULT` with
/// `--fault-path signal` and in user-mode-only mode: before, 9 and 8 of
/// the 12 rounds failed there ("Bad address", a shell that exited 127,
/// `popen` failing, `vfork` children killed by `SIGBUS`). Same output as
/// native in every mode, with most rounds' command evicted when it was
/// started (10 or 11 of 12, by `mincore`; on a loaded machine, where the
/// evictor lags, CI once saw 7 in full thread mode, so each round now
/// writes its 48 MiB again, up to four times, while the command is not
/// yet out; and CI then saw 7 in (signal, user-mode-only): a command
/// page that took a place the protected segment freed while the evictor
/// lagged stays resident through any number of passes, so such a
/// command is built again on a new page, up to twice: 12 of 12 since).
#[test]
fn programs_started_from_cold_memory() {
    let lines = ["programs started from cold memory: 0 failed", "round 3: system", "round 11: 11 /bin/sh"];
    native_output_in_every_mode_and("spawn", &lines, |(path, umo), m, _, _| {
        let err = String::from_utf8_lossy(&m.stderr);
        let cold = err
            .lines()
            .find_map(|l| l.strip_prefix("cold rounds "))
            .and_then(|n| n.trim().parse::<u32>().ok())
            .unwrap_or_else(|| panic!("{path}, user-mode-only {umo}: {err}"));
        assert!(cold >= 8, "{path}, user-mode-only {umo}: only {cold} of 12 rounds started from cold memory");
    });
}

/// A sandbox's seccomp filter that forbids `ioctl` (`seccomp.c`), then
/// cold memory read and written through system calls. The default thread
/// path serves faults from the library's own thread, started before the
/// filter: the native output. Where pages are brought back in the
/// program's own thread (`--fault-path signal`; a system call's memory
/// in user-mode-only mode) the library's `UFFDIO_COPY` is refused, and
/// the run stops with a message that names the filter and the way out
/// (before, "Operation not permitted" and nothing more).
#[test]
fn a_seccomp_filter_that_forbids_the_library_is_named() {
    let d = tmp("seccomp");
    let exe = compile(&d, "seccomp");
    let n = native(&[&exe], &d);
    assert!(n.status.success(), "{n:?}");
    for (path, umo) in MODES {
        let (m, _) = managed_in_mode(&d, (path, umo), &[&exe], &[]);
        let err = String::from_utf8_lossy(&m.stderr);
        let what = format!("{path}, user-mode-only {umo}");
        match (path, umo) {
            ("thread", "0") => {
                assert!(m.status.success(), "{what}: {err}");
                assert_eq!(m.stdout, n.stdout, "{what}: {err}");
            }
            _ => {
                assert_eq!(m.status.code(), Some(134), "{what}: {err}");
                // (Under a user-mode-only userfaultfd the faulting thread
                // brings back its system calls' memory on either path.)
                let way = if (path, umo) == ("signal", "0") {
                    "with --fault-path thread"
                } else {
                    "vm.unprivileged_userfaultfd=1"
                };
                assert!(
                    err.contains(
                        "runs under a seccomp filter of the program that forbids the library's calls"
                    ) && err.contains(way),
                    "{what}: {err}"
                );
            }
        }
    }
}

/// `MADV_POPULATE_READ`/`_WRITE` of cold and fresh arena memory
/// (`populate.c`): served by the library (the pages brought in); before,
/// both failed with `EFAULT` with `--fault-path signal` and in
/// user-mode-only mode.
#[test]
fn madvise_populate_brings_pages_in() {
    native_output_in_every_mode("populate", "populate read 0 (0) write 0 (0) fresh 0 (0) sum 6144");
}

/// A program that drops root (`setuid`, as a daemon does) and then forks
/// a child that reads and writes its cold heap through system calls.
/// Before, `setuid` hung for ever: glibc makes every thread change its
/// own credentials (signal 33), and the library's threads blocked it.
/// Then the child, no longer allowed a full-mode userfaultfd, got a
/// user-mode-only one without syscall user dispatch, and its `write`
/// from an evicted buffer failed (`EFAULT`). Now the library keeps
/// `/dev/userfaultfd` open from its start and makes the child's from it;
/// without the device, the child catches its system calls. A worker
/// forked before, which drops root itself (as nginx's do), too.
/// Statistics: each process opens its `--stats` file when it starts, so
/// the parent and the worker, which dropped root after that, are counted
/// (before, neither was, and each said so); the child forked after the
/// `setuid` cannot make one, and says so.
#[test]
fn a_program_that_drops_root_and_forks_keeps_working() {
    require("python3");
    require_root("drops root");
    let d = tmp("setuid");
    let script = "import os, sys, hashlib\n\
                  data = [bytes([i % 251]) * 4000 + str(i).encode() for i in range(12000)]\n\
                  def work(name, part):\n\
                  \x20   h = hashlib.sha256()\n\
                  \x20   r, w = os.pipe()\n\
                  \x20   for x in part:\n\
                  \x20       os.write(w, x); h.update(os.read(r, len(x)))\n\
                  \x20   print(name, h.hexdigest()[:16], os.getuid(), flush=True)\n\
                  \x20   sys.exit(0)\n\
                  pid = os.fork()\n\
                  if pid == 0:\n\
                  \x20   os.setgid(65534); os.setuid(65534)\n\
                  \x20   work('worker', data[6000:9000])\n\
                  os.waitpid(pid, 0)\n\
                  os.setgid(65534); os.setuid(65534)\n\
                  pid = os.fork()\n\
                  if pid == 0:\n\
                  \x20   work('child', data[:3000])\n\
                  os.waitpid(pid, 0)\n\
                  print('parent', hashlib.sha256(b''.join(data)).hexdigest()[:16], os.getuid())\n";
    let n = native(&["python3", "-c", script], &d);
    assert!(n.status.success(), "{n:?}");
    for (path, umo) in MODES {
        for device in ["0", "1"] {
            let (m, s) = managed_in_mode(
                &d,
                (path, umo),
                &["python3", "-c", script],
                &[("ZTIER_TEST_NO_UFFD_DEVICE", device)],
            );
            let err = String::from_utf8_lossy(&m.stderr);
            let what = format!("{path}, user-mode-only {umo}, no device {device}");
            assert!(m.status.success(), "{what}: {:?}: {err}", m.status);
            assert_eq!(m.stdout, n.stdout, "{what}: {err}");
            let said = notices(&s);
            assert_eq!(said.matches("its statistics are left out of --stats").count(), 1, "{what}: {said}");
            let per = s["per_process"].as_array().unwrap();
            let forks: Vec<u64> = per.iter().map(|p| p["forks"].as_u64().unwrap()).collect();
            assert_eq!(forks.len(), 2, "{what}: the parent and the worker: {forks:?}");
            assert!(forks.contains(&2), "{what}: the parent, which forked twice: {forks:?}");
        }
    }
}

/// Compiles `run_progs/NAME.c` and runs it natively (its output must
/// contain `line`), then in each mode at `--budget 16M`: the same output,
/// with its heap managed and under pressure (over 10 k compressions).
fn native_output_in_every_mode(name: &str, line: &str) {
    native_output_in_every_mode_and(name, &[line], |_, _, _, _| {});
}

/// As [`native_output_in_every_mode`], with every one of `lines` in the
/// native output, and `more` checking each mode's run besides (the mode,
/// the managed run and its stats, the native run).
fn native_output_in_every_mode_and(
    name: &str,
    lines: &[&str],
    more: impl Fn((&str, &str), &Output, &serde_json::Value, &Output),
) {
    let d = tmp(name);
    let exe = compile(&d, name);
    native_output_in_modes(&d, &exe, &MODES, lines, more);
}

/// As [`native_output_in_every_mode_and`], for the program `exe` already
/// built in `d`, in `modes`; the native run.
fn native_output_in_modes(
    d: &Path,
    exe: &str,
    modes: &[(&str, &str)],
    lines: &[&str],
    more: impl Fn((&str, &str), &Output, &serde_json::Value, &Output),
) -> Output {
    let n = native(&[exe], d);
    assert!(n.status.success(), "{n:?}");
    let text = String::from_utf8_lossy(&n.stdout).into_owned();
    for line in lines {
        assert!(text.contains(line), "native run: {text}");
    }
    for &(path, umo) in modes {
        let (m, s) = managed_in_mode(d, (path, umo), &[exe], &[]);
        assert!(m.status.success(), "{exe}, {path}, user-mode-only {umo}: {m:?}");
        assert_eq!(String::from_utf8_lossy(&m.stdout), text, "{exe}, {path}, user-mode-only {umo}");
        assert!(compressed(&s) > 10000, "{exe}, {path}, user-mode-only {umo}: {s}");
        more((path, umo), &m, &s, &n);
    }
    n
}

/// The processes of a run's statistics that were forked children.
fn forked_children(s: &serde_json::Value) -> usize {
    s["per_process"]
        .as_array()
        .map_or(0, |p| p.iter().filter(|p| p["forked_child"].as_u64() == Some(1)).count())
}

/// Memory that is not plain read-write (`protections.c`: 48 MiB of data
/// made read-only, 16 MiB of code made read-and-execute, 16 MiB mapped
/// read-write-execute, 16 MiB of code mapped read-write-execute with
/// `MAP_FIXED` into a reservation, read and called three rounds at
/// `--budget 16M`). It is evicted as read-write memory is, and a fault
/// on code being called is served as any other. Before, pages made
/// read-only or executable were kept resident (the handler must read what
/// it evicts, and these it can), so the program's other memory thrashed
/// through what was left: 0.08 s natively against 13–49 s for a program
/// like this one, 56 MiB over the budget; and the two mappings made
/// read-write-execute were left to the kernel. Same output as native in
/// every mode, no process over the budget.
#[test]
fn read_only_and_executable_memory_is_evicted_too() {
    native_output_in_every_mode_and("protections", &["round 2: data "], |(path, umo), _, s, _| {
        for p in s["per_process"].as_array().unwrap() {
            let peak = p["peak_resident_bytes"].as_u64().unwrap();
            assert!(peak <= 16 << 20, "{path}, user-mode-only {umo}: {p}");
        }
        // The program's 96 MiB, nearly all written out at least once.
        assert!(compressed(s) >= 20_000, "{path}, user-mode-only {umo}: {s}");
        assert_eq!(s["tree_over_bytes"], 0, "{path}, user-mode-only {umo}: {s}");
    });
}

/// `malloc` blocks freed with a page still protected (`freed_guard.c`:
/// a guard page left `PROT_NONE`, a block left read-only, 200 rounds,
/// each followed by mallocs of the same size written whole). Before, the
/// library handed those pages out again with their protection, and the
/// program crashed (`SIGSEGV`) on its next `malloc`'s memory in every
/// mode. Same output as native in every mode.
#[test]
fn blocks_freed_with_a_protected_page_come_back_read_write() {
    native_output_in_every_mode("freed_guard", "guarded and read-only blocks freed: sum ");
}

/// Mappings asked for at an address (`hints.c`): a 64 MiB heap hinted at
/// 9 addresses, each given back when not where asked, then taken anywhere
/// (HotSpot's G1); a reservation that must be where asked, tried at one
/// address after another (ZGC's, which ran 24 s and then failed: "Failed
/// to reserve enough address space for Java heap"); and `MAP_32BIT`
/// (was placed in the arena, above 2 GiB). The arena gives no hinted
/// address: after 16 given back in a row, hints are granted by the kernel
/// (unmanaged), and stderr says so once. The 9 refusals leave the heap
/// managed (compressed). Same output as native in every mode. Before all,
/// a 64 GiB reservation, the kernel's since the arena cannot hold it:
/// stderr says so, not that the arena is full (it said "full", and what
/// came after was managed all the same).
#[test]
fn mappings_at_the_address_asked_for() {
    native_output_in_every_mode_and(
        "hints",
        &[
            "64 GiB reserved: yes",
            "heap: 0 wrong",
            "reserved where asked: 0 wrong",
            "MAP_32BIT below 2 GiB: yes, 0 wrong",
        ],
        |(path, umo), m, s, n| {
            assert!(m.stderr.is_empty(), "{path}, user-mode-only {umo}: {m:?}");
            let err = notices(s);
            let said = err.matches("mappings in a row that were not at").count();
            assert_eq!(said, 1, "{path}, user-mode-only {umo}: {err}");
            assert_eq!(err.matches("65536 MiB asked at once does not fit").count(), 1, "{path}: {err}");
            assert!(!err.contains("is full"), "{path}, user-mode-only {umo}: {err}");
            assert!(n.stderr.is_empty(), "{n:?}");
            // The heap, 16 k pages, went out at least once at 16M.
            assert!(compressed(s) >= 12_000, "{path}, user-mode-only {umo}: {s}");
        },
    );
}

/// `mremap` with `MREMAP_FIXED` (`remap_fixed.c`: mappings pushed out of
/// memory at `--budget 16M`, then moved into the program's own
/// reservations in the arena, one read-write and grown, one read-only,
/// and one to a reservation of the kernel's; and the kernel's three
/// refusals). Before, every such call on arena memory failed with
/// `EINVAL`. Same output as native in every mode (contents, where each
/// went, its protection), the moved pages compressed, nothing over the
/// budget.
#[test]
fn mremap_to_a_fixed_address() {
    let d = tmp("remap-fixed");
    let exe = compile(&d, "remap_fixed");
    let n = native(&[&exe], &d);
    assert!(n.status.success(), "{n:?}");
    let text = String::from_utf8_lossy(&n.stdout);
    assert_eq!(text.matches("where asked").count(), 3, "{text}");
    assert_eq!(text.matches(" 0 wrong").count(), 5, "{text}");
    assert_eq!(text.matches("failed: Invalid argument").count(), 3, "{text}");
    for mode in MODES {
        let (m, s) = managed_in_mode(&d, mode, &[&exe], &[]);
        assert!(m.status.success(), "{mode:?}: {m:?}");
        assert_eq!(String::from_utf8_lossy(&m.stdout), text, "{mode:?}");
        assert!(compressed(&s) >= 2000, "{mode:?}: {s}");
        assert_eq!(s["tree_over_bytes"], 0, "{mode:?}: {s}");
    }
}

/// `mremap` moves keep what the kernel keeps (`remap_move.c`, each
/// source pushed out of memory at `--budget 16M` first): a read-only
/// mapping grown stays read-only, its new part too (it became read-write);
/// an inaccessible one grown is moved (the copy out of it crashed the
/// program with `SIGSEGV`); and `MREMAP_DONTUNMAP` moves the pages and
/// leaves the old range mapped with its protection, reading zeros, also to
/// a fixed address (it failed with `EINVAL`), with the kernel's two
/// refusals. Same output as native in every mode, over 10 k pages
/// compressed, nothing over the budget.
#[test]
fn mremap_moves_keep_the_protection_and_dontunmap_leaves_the_old_range() {
    native_output_in_every_mode_and(
        "remap_move",
        &["MREMAP_DONTUNMAP into a reservation: done"],
        |mode, _, s, n| {
            let text = String::from_utf8_lossy(&n.stdout);
            assert_eq!(text.matches(": done").count(), 5, "{text}");
            assert_eq!(text.matches(" 0 wrong").count(), 7, "{text}");
            assert_eq!(text.matches(" 0 bytes not zero").count(), 3, "{text}");
            assert_eq!(text.matches("failed: Invalid argument").count(), 2, "{text}");
            assert_eq!(s["tree_over_bytes"], 0, "{mode:?}: {s}");
        },
    );
}

/// Unmapped memory is gone (`unmapped.c`, at `--budget 16M`): a touch
/// after `munmap`, past an `mremap` that shrank, or at the old place of
/// one that moved is a `SIGSEGV`, as natively (it read zeros: the arena
/// kept the range read-write); the addresses handed out again by `mmap`
/// and `malloc` read zeros and keep what is written through the churn.
/// Same output as native in every mode, over 10 k pages compressed,
/// nothing over the budget.
#[test]
fn unmapped_memory_is_gone() {
    native_output_in_every_mode_and("unmapped", &["malloc after it all: 0 wrong"], |mode, _, s, n| {
        let text = String::from_utf8_lossy(&n.stdout);
        assert_eq!(text.matches("SIGSEGV").count(), 8, "{text}");
        assert_eq!(text.matches(" 0 wrong").count(), 6, "{text}");
        assert_eq!(s["tree_over_bytes"], 0, "{mode:?}: {s}");
    });
}

/// A hole unmapped in the middle of a mapping is unmapped memory to every
/// call (`holes.c`, at `--budget 16M`): `mincore`, `msync`, `mprotect`,
/// `madvise`, `mlock` and `munlock` over it, or over a range that takes in
/// part of it, fail with `ENOMEM`, `mremap` with `EFAULT` (the same-size
/// one only where the hole is at its start), `MAP_FIXED_NOREPLACE` maps
/// half of it and fails with `EEXIST` on memory in use; the next 32
/// mappings keep off a `MAP_FIXED` mapping over the hole; unmapping it
/// twice, and across its edges, makes a hole again that later mappings
/// do not share, and a mapping hinted at the hole gets it. Before, those
/// calls succeeded on the arena's inaccessible mapping,
/// `MAP_FIXED_NOREPLACE` failed (exit 5), (seen with that part alone) the
/// next mapping of the hole's size was handed the fixed mapping's pages
/// (65,536 bytes wrong), and the hinted mapping was put elsewhere. Same
/// output as native in every mode, over 10 k pages compressed, nothing
/// over the budget.
#[test]
fn calls_on_unmapped_memory_fail_as_natively() {
    native_output_in_every_mode_and(
        "holes",
        &[
            "the hole: mincore ENOMEM",
            "32 mappings after it: 0 over the fixed one, 0 wrong bytes",
            "a hint at the hole: granted",
        ],
        |mode, _, s, n| {
            let text = String::from_utf8_lossy(&n.stdout);
            assert_eq!(text.matches("ENOMEM").count(), 7 * 4, "{text}");
            assert_eq!(text.matches("EFAULT").count(), 4, "{text}");
            assert!(text.contains("MAP_FIXED_NOREPLACE over memory in use: EEXIST"), "{text}");
            assert!(text.contains("8 more mappings: 0 wrong bytes"), "{text}");
            assert_eq!(s["tree_over_bytes"], 0, "{mode:?}: {s}");
        },
    );
}

/// A plugin opened with `RTLD_DEEPBIND` (`deepbind.c` and `deep.c`, as
/// PHP opens its extensions): blocks pass both ways between the program
/// and the plugin, each freed or grown on the other side, through churn
/// at `--budget 16M`. The plugin's `free` was glibc's, and the program
/// aborted at the first block it freed ("free(): invalid pointer", exit
/// 134) in every mode. Same output as native in every mode, over 10 k
/// pages compressed.
#[test]
fn a_plugin_opened_with_deepbind_shares_the_programs_malloc() {
    let d = tmp("deepbind");
    compile_in(&d, "libdeep.so", &["deep.c"], &["-shared", "-fPIC"]);
    let exe = compile(&d, "deepbind");
    native_output_in_modes(&d, &exe, &MODES, &["deep-bound plugin: 0 wrong bytes"], |_, _, _, _| {});
}

/// glibc's mutexes, condition variables and semaphores, whose `futex`
/// calls glibc makes inside itself, where they take the dispatch signal
/// (`sync.c`: turns handed between two threads 6000 times each way under
/// a mutex and a condition variable, and with semaphores; timeouts whose
/// times lie in cold memory; four threads on contended semaphores and a
/// broadcast; 64 sets of the objects a page apart, going cold between
/// rounds). Same output as native in every mode, nothing left pinned.
#[test]
fn waits_and_wakes_on_cold_memory() {
    let lines =
        ["condition variable turns 6000", "timeouts 160 of 160", "counted 1000000 (expected 1000000)"];
    native_output_in_every_mode_and("sync", &lines, |(path, umo), _, s, _| {
        let pinned = s["per_process"][0]["pinned_bytes"].as_u64();
        assert_eq!(pinned, Some(0), "{path}, user-mode-only {umo}: {s}");
    });
}

/// Robust mutexes on the heap whose owner exits holding them (`robust.c`:
/// 16, half of them priority-inheriting, each on a page of its own, cold
/// when the owner exits; one with a waiter blocked on it). The kernel
/// marks them for the next locker (`EOWNERDEAD`) after the thread's last
/// code has run, and an exiting thread's fault is never handed to a
/// userfaultfd: before, in every mode, the waiter timed out and glibc's
/// lock of a priority-inheriting one failed an assertion (abort); with
/// plain ones only, the waiter and all 15 later lockers timed out. The
/// mutexes are now kept resident from the thread's exit until it is gone,
/// and nothing stays pinned at the end. Then a thread's destructor of the
/// program's (its key made after the library's, so run after the
/// library's in glibc's first round) locks 4 more at the thread's exit
/// and waits while they go cold: before, the library had read the list
/// already, and the same abort came in every mode. Then the main thread
/// leaves by `pthread_exit` holding 4 more (in full mode it has the exit
/// hook only since the library's start gives it: without that, the same
/// abort).
#[test]
fn robust_mutexes_of_a_thread_that_exits_holding_them() {
    let lines = [
        "the waiter got: EOWNERDEAD",
        "later lockers: owner died 15, timed out 0, other 0",
        "locked in a destructor: owner died 4 of 4",
        "after the main thread left: owner died 4 of 4",
    ];
    native_output_in_every_mode_and("robust", &lines, |(path, umo), _, s, _| {
        let pinned = s["per_process"][0]["pinned_bytes"].as_u64();
        assert_eq!(pinned, Some(0), "{path}, user-mode-only {umo}: {s}");
    });
}

/// `io_uring` transfers into and out of heap buffers that go cold
/// (`uring.c`: 30 rounds of 64 writes and 64 reads of 16 KiB, falling
/// back to `pwrite`/`pread` if `io_uring_setup` fails). In full mode the
/// program uses `io_uring` as natively (the kernel's own faults are
/// served); where system calls are caught, the kernel would meet evicted
/// buffers after the submitting call, where nothing can pin them (before:
/// all 3840 transfers failed, `EFAULT` or short, in both modes), so
/// `io_uring_setup` fails with `ENOSYS`, said once in ztier's notices,
/// and the program falls back. Same output as native in every mode.
#[test]
fn io_uring_is_served_in_full_mode_and_refused_where_calls_are_caught() {
    native_output_in_every_mode_and("uring", &["failed transfers 0"], |(path, umo), m, s, n| {
        let (err, native_way) = (String::from_utf8_lossy(&m.stderr), String::from_utf8_lossy(&n.stderr));
        let said = notices(s);
        if path == "thread" && umo == "0" {
            assert_eq!(err.contains("using io_uring"), native_way.contains("using io_uring"), "{err}");
            assert!(!said.contains("ENOSYS"), "{said}");
        } else {
            assert!(err.contains("using pread/pwrite") && !err.contains("ztier"), "{err}");
            assert_eq!(said.matches("the program was told ENOSYS").count(), 1, "{said}");
        }
    });
}

/// Threads started without the library's `pthread_create`, whose clone
/// the library catches where system calls are caught. glibc's own, by its
/// internal `pthread_create` (`sigev_thread.c`: a periodic `SIGEV_THREAD`
/// timer whose threads write 40 cold heap pages to a pipe, and POSIX AIO
/// reading into cold buffers): the library makes that clone itself, so the
/// thread has dispatch from its first instruction, and moves its DTV out
/// of the arena. Before, their calls on evicted memory failed (no
/// dispatch: 0 of 16 pages written), and with `--fault-path signal` the
/// helper thread, which blocks every signal, was killed by `SIGBUS`; with
/// dispatch but the DTV in the arena, the `SIGBUS` handler faulted on the
/// DTV for ever (`SIGSEGV`). Same output as native in every mode, and no
/// warning. A thread of the program's own `clone()` without its own
/// thread-local storage (`rawclone.c`, writing 16 cold pages) cannot be
/// given dispatch (it would share its parent's): the library says so once
/// on stderr in the two modes that catch system calls. Its `write`s go
/// through the library's export of glibc's function, which finds its
/// thread id is not its creator's and pins their memory as for a `vfork`
/// child: the native output in every mode. (Before, its writes from
/// evicted pages failed there, 0 of 16, and the program exited 1; its raw
/// system calls still would.) (The JVM's first thread, started before
/// the library was, once set the warning off: its clone ran with dispatch
/// just turned on.)
#[test]
fn threads_started_without_pthread_create() {
    let warning = "a thread was started without pthread_create";
    native_output_in_every_mode_and("sigev_thread", &["timer: 40 pages", "aio: 8 reads"], |mode, _, s, _| {
        let said = notices(s);
        assert!(!said.contains(warning), "{mode:?}: {said}");
    });
    let d = tmp("rawclone");
    let exe = compile(&d, "rawclone");
    let n = native(&[&exe], &d);
    assert!(n.status.success(), "{n:?}");
    for (path, umo) in MODES {
        let (m, s) = managed_in_mode(&d, (path, umo), &[&exe], &[]);
        let err = notices(&s);
        assert!(compressed(&s) > 10000, "{path}, user-mode-only {umo}: {s}");
        assert!(m.status.success() && m.stdout == n.stdout, "{path}, user-mode-only {umo}: {m:?}");
        let said = if (path, umo) == ("thread", "0") { 0 } else { 1 };
        assert_eq!(err.matches(warning).count(), said, "{path}, user-mode-only {umo}: {err}");
    }
}

/// Is `malloc` in the dynamic symbol table of `exe` a canonical PLT
/// entry (undefined, with a value) rather than a definition? From
/// `readelf --dyn-syms`.
fn malloc_is_a_plt_stub(exe: &str) -> bool {
    require("readelf");
    let o = Command::new("readelf").args(["--dyn-syms", "-W", exe]).output().unwrap();
    assert!(o.status.success(), "readelf {exe}: {o:?}");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let row = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() >= 8 && (f[7] == "malloc" || f[7].starts_with("malloc@")))
        .unwrap_or_else(|| panic!("no malloc in {exe}'s dynamic symbols:\n{text}"));
    row[6] == "UND" && u64::from_str_radix(row[1], 16).unwrap() != 0
}

/// A program built without position independence that takes
/// `malloc`'s address (`mallocptr.c`, `-fno-pie -no-pie`, as Debian's
/// `python3.11` and the official `node` are) has a canonical PLT entry
/// for it, which the lookup of `malloc` returns though its calls come
/// to the library. Such a program was taken for one with an allocator
/// of its own and put on the signal path whatever was asked: it now
/// takes the default path, the one asked for. The same program linked
/// with a `malloc` of its own (`ownalloc.c`) still takes the signal
/// path. Both give the native output with their memory compressed.
#[test]
fn a_plt_stub_for_malloc_is_not_a_malloc_of_its_own() {
    let d = tmp("mallocptr");
    let cases = [
        (compile_in(&d, "mallocptr", &["mallocptr.c"], &["-fno-pie", "-no-pie"]), true, "thread"),
        (
            compile_in(&d, "mallocptr_own", &["mallocptr.c", "ownalloc.c"], &["-fno-pie", "-no-pie"]),
            false,
            "signal",
        ),
    ];
    for (exe, stub, path) in cases {
        assert_eq!(malloc_is_a_plt_stub(&exe), stub, "{exe}: the build is not the one this test is about");
        let n = native(&[&exe], &d);
        assert!(n.status.success(), "{exe}: {n:?}");
        assert!(String::from_utf8_lossy(&n.stdout).ends_with("ok\n"), "{exe}: {n:?}");
        let stats = d.join("default.json");
        let m = Command::new(ztier())
            .args(["run", "--budget", "16M", "--stats"])
            .arg(&stats)
            .arg("--")
            .arg(&exe)
            .env_remove("ZTIER_FAULT_PATH")
            .env("ZTIER_UFFD_USER_MODE_ONLY", "0")
            .current_dir(&d)
            .output()
            .unwrap();
        assert!(m.status.success(), "{exe}: {m:?}");
        assert_eq!(m.stdout, n.stdout, "{exe}");
        let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
        assert_eq!(s["fault_path"], path, "{exe}: {s}");
        assert!(compressed(&s) > 4096, "{exe}: {s}");
    }
}

/// glibc's own threads (`sigev_thread.c`, as in
/// [`threads_started_without_pthread_create`]) in a program with a
/// `malloc` of its own (`ownalloc.c` linked in): their DTVs come from
/// that `malloc`, so from the arena, and the library cannot move them
/// to glibc's heap (the program's `free` gets them back). Where system
/// calls are caught, the library makes the clone and pins the DTV first,
/// until the thread keeps it pinned itself. Before, the `SIGBUS` handler
/// of the timer's helper thread faulted on its DTV for ever: `SIGSEGV`,
/// in every run. Same output as native in every mode, every one of them
/// the signal path (as for any program with a `malloc` of its own).
/// About 1 run in 50 also hung until the watchdog aborted it: a thread
/// glibc started (the timer's or AIO's), in its `SIGBUS` handler with the
/// manager's lock, first waited
/// for a store lock, whose thread data glibc allocated with this
/// `calloc`, locked by the main thread waiting for the manager's lock
/// (the store's locks now keep nothing per thread: `ztier_store::lock`,
/// and its test `thread_exit`). `ownalloc.c`'s `calloc` now ends the
/// program whenever glibc's `__cxa_thread_atexit_impl` calls it, which
/// only the library would make it do: with the parking_lot build that
/// ended every run of this program, in every mode (and of `ownmalloc`,
/// run in the default mode).
#[test]
fn glibc_threads_of_a_program_with_a_malloc_of_its_own() {
    let d = tmp("sigev-own");
    let exe = compile_in(&d, "sigev_own", &["sigev_thread.c", "ownalloc.c"], &[]);
    let n = native(&[&exe], &d);
    assert!(n.status.success(), "{n:?}");
    let text = String::from_utf8_lossy(&n.stdout).into_owned();
    assert!(text.contains("timer: 40 pages") && text.contains("aio: 8 reads"), "native run: {text}");
    for (path, umo) in MODES {
        let what = format!("{path}, user-mode-only {umo}");
        let (m, s) = managed_in_mode(&d, (path, umo), &[&exe], &[]);
        assert!(m.status.success(), "{what}: {m:?}");
        assert_eq!(String::from_utf8_lossy(&m.stdout), text, "{what}");
        assert!(compressed(&s) > 10000, "{what}: {s}");
        assert_eq!(s["fault_path"], "signal", "{what}: {s}");
    }
}

/// A stack overflow reported from a `SIGSEGV` handler on an 8 KiB
/// alternate stack, as Rust's runtime reports one (`overflow.c`: a
/// message, signal masks set, `abort()`). Where system calls are caught,
/// the dispatch handler of each call the handler makes ran on that small
/// stack and overflowed it: the process died by `SIGSEGV` (exit 139 with
/// `--fault-path signal`, and in both modes for a Rust program) instead of
/// `SIGABRT`. Same output and the same signal as native in every mode.
///
/// `overflow main`: the main thread overflows, its alternate stack set
/// up before the library started (as Rust's runtime sets up the main
/// thread's). Where system calls are caught, the library's own alternate
/// stack replaced it unseen: the handler ran on the overflowed stack and
/// the process died by `SIGSEGV`, without its message (every Rust program
/// whose main thread overflowed, in signal and user-mode-only modes).
#[test]
fn a_handler_on_a_small_alternate_stack_makes_its_calls() {
    use std::os::unix::process::ExitStatusExt;
    let d = tmp("overflow");
    let exe = compile(&d, "overflow");
    for args in [vec![exe.as_str()], vec![exe.as_str(), "main"]] {
        let n = native(&args, &d);
        assert_eq!(n.status.signal(), Some(libc::SIGABRT), "{args:?}: {n:?}");
        let text = String::from_utf8_lossy(&n.stdout).into_owned();
        assert!(text.contains("thread has overflowed its stack"), "native run {args:?}: {text}");
        for (path, umo) in MODES {
            let (m, s) = managed_in_mode(&d, (path, umo), &args, &[]);
            assert_eq!(
                m.status.code(),
                Some(128 + libc::SIGABRT),
                "{args:?}, {path}, user-mode-only {umo}: {m:?}"
            );
            assert_eq!(String::from_utf8_lossy(&m.stdout), text, "{args:?}, {path}, user-mode-only {umo}");
            // An aborted process writes no stats of its own (40 MiB of
            // ballast under a 16 MiB budget all the same).
            assert_eq!(s["exit_code"].as_i64(), Some(128 + libc::SIGABRT as i64), "{s}");
        }
    }
}

/// A signal handler of the program that runs while its thread is blocked
/// in a system call the library made for it (`handlers.c`: a thread
/// blocked in glibc's `read`, entered directly, and one blocked in a
/// `read` of its own `syscall` instruction, caught by dispatch), and that
/// writes a cold heap page to a pipe, half through glibc's `write` and
/// half with its own instruction. The thread's selector is at ALLOW
/// inside such a call; before the library ran the program's handlers
/// with it at BLOCK (`on_program_signal`), their calls were not caught
/// and 1–5 of the 24 pages got through in signal and user-mode-only
/// modes. Same output as native in every mode.
#[test]
fn a_handler_run_during_a_blocked_call_has_its_calls_caught() {
    native_output_in_every_mode("handlers", "handler pages matched 24 of 24, short 0, failed calls 0");
}

/// Stacks in the arena (`coro.c`): 24 coroutines on stacks from malloc
/// (`makecontext`/`swapcontext`) that recurse up to 240 KiB deep, make
/// system calls from there, free large blocks, and go cold between
/// rounds, with a timer signal every 200 µs; then a thread given a stack
/// from malloc (`pthread_attr_setstack`). Before the library's own signal
/// stack, both dispatch modes died with SIGSEGV at once (a signal frame
/// written below the stack pointer into a missing page); before library
/// code moved off such stacks, a direct `write` hung pinning under the
/// manager's lock (a page of its own stack missing); and before a
/// thread's stack from the arena was kept resident, that thread died
/// with SIGSEGV in `start_thread` (its control block evicted). Then 200
/// short threads on stacks from malloc, each with a thread-specific data
/// destructor that calls `malloc`, `free`, `write` and `read`: before,
/// each left two mappings behind in every mode (a stack of the library's,
/// taken again after the library's exit destructor had put the thread's
/// aside, and never given back: 380 over 190 threads). Same output as
/// native in every mode.
#[test]
fn coroutine_and_thread_stacks_from_malloc() {
    native_output_in_every_mode_and(
        "coro",
        &[
            "thread on a stack from malloc: sum",
            "190 short threads on stacks from malloc: mappings gained few",
        ],
        |_, _, _, _| {},
    );
}

/// Memory the kernel writes for a thread outside its system calls —
/// signal frames on an alternate stack from malloc, the CPU number in an
/// rseq area from malloc — while it goes cold under the budget
/// (`kernel_writes.c`: also a thread that replaces its alternate stack,
/// and a forked child that keeps the one it inherited). With faults
/// served in the faulting thread, and in user-mode-only mode, the kernel's
/// write to a missing page is not served but kills the process (SIGSEGV
/// at the first signal, before the alternate stack was kept pinned; now
/// the kernel writes every frame to a stack of the library's and the
/// program's handler runs on its alternate stack in user mode, while the
/// rseq area stays pinned); in every mode the output is the native one.
#[test]
fn memory_the_kernel_writes_outside_system_calls() {
    let d = tmp("kernel-writes");
    let exe = compile(&d, "kernel_writes");
    // glibc registers an rseq area of its own unless told not to.
    let tunables = ("GLIBC_TUNABLES", "glibc.pthread.rseq=0");
    let n = Command::new(&exe).env(tunables.0, tunables.1).output().unwrap();
    assert!(n.status.success(), "{}", String::from_utf8_lossy(&n.stderr));
    let text = String::from_utf8_lossy(&n.stdout);
    for line in
        ["rseq: own, cpu_id valid 1", "signals on the alternate stack 12, elsewhere 0", "child ended: exit 0"]
    {
        assert!(text.contains(line), "native run: {text}");
    }
    for (path, umo) in MODES {
        let (m, s) = managed_in_mode(&d, (path, umo), &[&exe], &[tunables]);
        assert!(m.status.success(), "{path}, user-mode-only {umo}: {m:?}");
        assert_eq!(String::from_utf8_lossy(&m.stdout), text, "{path}, user-mode-only {umo}");
        assert!(compressed(&s) > 20000, "{s}");
        assert_eq!(s["per_process"][0]["user_mode_only"].as_bool(), Some(umo == "1"), "{s}");
    }
}

/// A program with a `malloc` of its own in its executable, as rustc has
/// jemalloc (`ownmalloc.c`: a bump allocator that maps 4 MiB chunks with
/// `mmap` while it holds its lock, which is not recursive; its first
/// call made by the constructor of a library it links,
/// `ownmalloc_early.c`, before the preloaded library's; 96 MiB of
/// blocks, checked by seven more threads and the main thread). glibc's own
/// allocations go to that `malloc` too: a new thread's TLS table, and
/// the thread-exit destructors a thread registers on its first use of a
/// thread-local. Before, every such program hung before `main`: the
/// allocator's first `mmap` started the library, whose `pthread_create`
/// called back into the allocator, waiting on its own lock (every rustc
/// under `ztier run`). Started in the library's constructor instead,
/// the handler still hung on that lock (its first contended store lock
/// registered parking_lot's per-thread data), and with `--fault-path
/// signal` the `SIGBUS` handler's first thread-local read faulted on a
/// thread's table evicted with the program's memory (`SIGSEGV`). Then
/// a new thread's table, made by this `malloc` just before the thread
/// starts, could still be out of memory at its first thread-local read
/// (one run in ten died so under `--fault-path signal`, `SIGSEGV`, no
/// word); the creator now pins it first (`sud::ThreadGate`). The
/// program's `free` aborts on a block that is not its own: glibc frees
/// each DTV with it, and the library used to move DTVs to glibc's heap.
/// And the handler, starting more handlers for the threads on other
/// CPUs, called that `calloc` and faulted on itself (`--fault-path
/// thread` hung). Same output as native in every mode, the heap
/// compressed; a run that does not end within a minute fails. Like
/// jemalloc, the allocator registers fork handlers at its first call,
/// before the library starts; the program then forks, and the child
/// allocates and checks blocks: with `--fault-path signal` the
/// allocator's `prepare` reads a cold page of each chunk, which hung
/// before the library's `prepare` ran last (rustc under `ztier run`,
/// forking its linker, hung so), and the child's threads start after
/// the allocator's `child` handler (before, on its lock, for ever).
/// Such a program takes the signal path whatever was asked: with
/// `--fault-path thread` its fork hung (no thread of the child could
/// serve the allocator's `child` handler), so that run kept the cold
/// pages out of its `prepare`; now every run reads them.
#[test]
fn a_program_with_a_malloc_of_its_own() {
    let d = tmp("ownmalloc");
    compile_with_library(
        &d,
        "ownmalloc_early",
        &["ownmalloc_early.c"],
        "ownmalloc",
        &["ownmalloc.c", "ownalloc.c"],
    );
    let n = native(&["./ownmalloc"], &d);
    assert!(n.status.success(), "{n:?}");
    let text = String::from_utf8_lossy(&n.stdout).into_owned();
    assert!(
        text.starts_with("fork: child saw its blocks\nown malloc: 3072 blocks, 96 MiB")
            && text.ends_with("called for all\n"),
        "{text}"
    );
    for (path, umo) in MODES {
        let what = format!("{path}, user-mode-only {umo}");
        let stats = d.join(format!("{path}-{umo}.json"));
        let m = output_within(
            Command::new(ztier())
                .args(["run", "--budget", "16M", "--fault-path", path, "--stats"])
                .arg(&stats)
                .args(["--", "./ownmalloc"])
                .env("ZTIER_UFFD_USER_MODE_ONLY", umo)
                // The allocator's fork `prepare` handler reads a cold page of
                // each chunk under its lock, and its `child` handler writes them.
                .env("OWNMALLOC_TOUCH", "1")
                .current_dir(&d),
            60,
            &what,
        );
        assert!(m.status.success(), "{what}: {m:?}");
        assert_eq!(String::from_utf8_lossy(&m.stdout), text, "{what}");
        let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
        assert!(compressed(&s) > 10000, "{what}: {s}");
        assert_eq!(s["fault_path"], "signal", "{what}: the fault path every process took: {s}");
    }
}

/// rustc itself, whose executable has jemalloc linked in (the case
/// `ownmalloc.c` models), compiles a program with 16 codegen units at
/// `--budget 32M` and forks its linker, under `--fault-path signal` in
/// full and user-mode-only mode. jemalloc registers its fork handlers
/// before the library starts, and its `prepare` takes every mutex in its
/// metadata: with the library's `prepare` run first, rustc hung at that
/// fork until the watchdog ended it. The program it builds prints what
/// the one rustc builds natively prints. With `--fault-path thread`,
/// the default, rustc hung at that fork until the watchdog ended it: a
/// handler thread in the child cannot start before jemalloc's `child`
/// handler has given its locks back, and that handler faults. Now rustc
/// takes the signal path whatever was asked, and the linker it starts
/// (glibc's `malloc`, the library's) the handler thread asked for.
#[test]
fn rustc_with_jemalloc_compiles_and_forks_its_linker() {
    require("rustc");
    require("cc");
    let d = tmp("rustc");
    let sysroot = Command::new("rustc").args(["--print", "sysroot"]).output().unwrap();
    assert!(sysroot.status.success(), "{sysroot:?}");
    let rustc = format!("{}/bin/rustc", String::from_utf8_lossy(&sysroot.stdout).trim());
    std::fs::write(
        d.join("hello.rs"),
        "use std::collections::HashMap;\n\
         fn main() {\n\
             let m: HashMap<u64, u64> = (0..1000u64).map(|i| (i, i * i)).collect();\n\
             println!(\"sum {}\", m.values().sum::<u64>());\n\
         }\n",
    )
    .unwrap();
    let build = |out: &str, ztier_mode: Option<(&str, &str)>| {
        let args = ["-O", "-C", "codegen-units=16", "hello.rs", "-o", out];
        let o = match ztier_mode {
            None => Command::new(&rustc).args(args).current_dir(&d).output().unwrap(),
            Some((path, umo)) => {
                let what = format!("{path}, user-mode-only {umo}");
                let stats = d.join(format!("rustc-{path}-{umo}.json"));
                let o = Command::new(ztier())
                    .args(["run", "--budget", "32M", "--fault-path", path, "--stats"])
                    .arg(&stats)
                    .arg("--")
                    .arg(&rustc)
                    .args(args)
                    .env("ZTIER_UFFD_USER_MODE_ONLY", umo)
                    .current_dir(&d)
                    .output()
                    .unwrap();
                let s: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(&stats).unwrap_or_default())
                        .unwrap_or_else(|e| panic!("{what}: no stats ({e}): {o:?}"));
                assert!(compressed(&s) > 1000, "{what}: rustc's heap compressed: {s}");
                let per = s["per_process"].as_array().unwrap_or_else(|| panic!("per-process stats: {s}"));
                let forks: u64 = per.iter().map(|p| p["forks"].as_u64().unwrap_or(0)).sum();
                assert!(forks >= 1, "{what}: rustc forked: {s}");
                // The processes that forked (rustc) took the signal path.
                for p in per.iter().filter(|p| p["forks"].as_u64().unwrap_or(0) > 0) {
                    assert_eq!(p["fault_path"], "signal", "{what}: rustc's fault path: {s}");
                }
                if path == "thread" {
                    // The linker, glibc's malloc, took the handler thread.
                    assert!(per.iter().any(|p| p["fault_path"] == "thread"), "{what}: the linker's: {s}");
                    assert_eq!(s["fault_path"], "mixed", "{what}: {s}");
                }
                o
            }
        };
        assert!(o.status.success(), "rustc {ztier_mode:?}: {o:?}");
        let run = Command::new(d.join(out)).output().unwrap();
        assert!(run.status.success(), "{run:?}");
        String::from_utf8_lossy(&run.stdout).into_owned()
    };
    let want = build("native", None);
    assert_eq!(want, "sum 332833500\n");
    for (path, umo) in [("signal", "0"), ("signal", "1"), ("thread", "0")] {
        assert_eq!(
            build(&format!("managed-{path}-{umo}"), Some((path, umo))),
            want,
            "{path}, user-mode-only {umo}"
        );
    }
}

/// A fork `child` handler registered before the library starts (by a
/// library's constructor, `earlyfork.c`, as libraries register them at
/// load) that reads the program's heap, mostly evicted at the fork
/// (`earlyfork_main.c`: 96 MiB at `--budget 16M`). The child's memory
/// leaves the parent's userfaultfd at the fork, and the library's own
/// `child` handler registers it with the child's: glibc runs `child`
/// handlers in the order they were registered, and with the handler
/// thread the library's came after that one, which read zeros from
/// every evicted page (5,000 to 5,027 of the 6,144 words it read wrong,
/// in three runs), silently. Now the library's handlers are registered before anyone's
/// in every mode. Same output as native, exit 0, in every mode.
#[test]
fn fork_handlers_registered_before_the_library_starts() {
    let d = tmp("earlyfork");
    compile_with_library(&d, "earlyfork", &["earlyfork.c"], "earlyfork", &["earlyfork_main.c"]);
    let n = native(&["./earlyfork"], &d);
    assert!(n.status.success(), "{n:?}");
    assert_eq!(String::from_utf8_lossy(&n.stdout), "fork handler of a library: the child saw the heap\n");
    for (path, umo) in MODES {
        let what = format!("{path}, user-mode-only {umo}");
        let (m, s) = managed_in_mode(&d, (path, umo), &["./earlyfork"], &[]);
        assert!(m.status.success(), "{what}: {m:?}");
        assert_eq!(m.stdout, n.stdout, "{what}");
        assert!(compressed(&s) > 10000, "{what}: {s}");
        assert_eq!(s["fault_path"], path, "{what}: {s}");
    }
}

/// glibc's `_Fork`, a fork that runs no `pthread_atfork` handlers
/// (`underscore_fork.c`: 96 MiB at `--budget 16M`, the child checks every
/// word), linked alone and with a `malloc` of its own (`ownalloc.c`).
/// The child's memory leaves the parent's userfaultfd at the fork, and
/// no handler of the library's registered it with the child's: the child
/// read zeros from every evicted page, in every mode. The library now
/// exports `_Fork` and runs its handlers around glibc's. Same output as
/// native in every mode, nothing over the shared budget (the child of
/// the program with its own `malloc` starts no thread of the library's,
/// and evicts as it faults).
#[test]
fn a_child_of_fork_without_handlers_sees_its_memory() {
    let d = tmp("underscore-fork");
    for (name, sources) in
        [("alone", &["underscore_fork.c"][..]), ("own-malloc", &["underscore_fork.c", "ownalloc.c"])]
    {
        let exe = compile_in(&d, name, sources, &[]);
        let n = native_output_in_modes(&d, &exe, &MODES, &[], |(path, umo), _, s, _| {
            assert_eq!(
                forked_children(s),
                1,
                "{name}, {path}, user-mode-only {umo}: the child's statistics: {s}"
            );
            assert_eq!(s["tree_over_bytes"], 0, "{name}, {path}, user-mode-only {umo}: {s}");
        });
        assert_eq!(
            String::from_utf8_lossy(&n.stdout),
            "_Fork: the child saw the heap; the parent read 0 wrong words\n",
            "{name}"
        );
    }
}

/// Forks made by the program's own system calls (`rawfork.c`:
/// `syscall(SYS_fork)`, `syscall(SYS_clone, SIGCHLD, 0, ...)` and glibc's
/// `clone(fn, stack, SIGCHLD, arg)` with a static stack and with one from
/// `malloc`, then `SYS_clone` and `clone` with `CLONE_VFORK` but not
/// `CLONE_VM`; 96 MiB at `--budget 16M`, each child checks every word),
/// which no fork handler sees: where system calls are caught
/// (`--fault-path signal`, user-mode-only mode) the dispatch handler
/// makes the first two inside the library's fork handlers; with the
/// handler thread in full mode, where no system call is caught, the
/// library's `syscall` export does. glibc's `clone` starts its child on
/// another stack, which dispatch does not make; the library's `clone`
/// export does, in every mode. Before, the children read zeros from the
/// evicted pages (every mode for `clone`, full thread mode for the other
/// two). Same output as native in every mode, the six children's
/// statistics, nothing over the budget.
#[test]
fn forks_by_the_programs_own_system_calls() {
    let d = tmp("rawfork");
    let exe = compile(&d, "rawfork");
    let n = native_output_in_modes(&d, &exe, &MODES, &[], |(path, umo), _, s, _| {
        assert_eq!(forked_children(s), 6, "{path}, user-mode-only {umo}: the children's statistics: {s}");
        assert_eq!(s["tree_over_bytes"], 0, "{path}, user-mode-only {umo}: {s}");
    });
    assert_eq!(
        String::from_utf8_lossy(&n.stdout),
        "SYS_fork: the child saw the heap\nSYS_clone: the child saw the heap\n\
         clone (static stack): the child saw the heap\nclone (heap stack): the child saw the heap\n\
         SYS_clone, CLONE_VFORK: the child saw the heap\nclone, CLONE_VFORK: the child saw the heap\n"
    );
}

/// Children of glibc's `clone` in new PID namespaces (`clone_newpid.c`:
/// three in turn, each PID 1 in its own, each checking the 96 MiB heap at
/// `--budget 16M`; root). Each writes its statistics: they were all
/// `1.json` in `ztier run`'s folder, each child's overwriting the one
/// before (one counted of three); a process now takes `PID-N.json` when
/// `PID.json` is taken. Same output as native in every mode, the three
/// children and the parent counted, nothing over the budget.
#[test]
fn clone_children_in_new_pid_namespaces_are_each_counted() {
    require_root("makes PID namespaces");
    let d = tmp("clone-newpid");
    let exe = compile(&d, "clone_newpid");
    let n = native_output_in_modes(&d, &exe, &MODES, &[], |(path, umo), _, s, _| {
        assert_eq!(forked_children(s), 3, "{path}, user-mode-only {umo}: the children's statistics: {s}");
        assert_eq!(s["processes"], 4, "{path}, user-mode-only {umo}: {s}");
        assert_eq!(s["tree_over_bytes"], 0, "{path}, user-mode-only {umo}: {s}");
    });
    assert_eq!(
        String::from_utf8_lossy(&n.stdout),
        "child 1: PID 1 in its namespace, 0 wrong words\nchild 2: PID 1 in its namespace, 0 wrong words\n\
         child 3: PID 1 in its namespace, 0 wrong words\n"
    );
}

/// Children in new PID namespaces alive at the same time answer `ztier
/// stats` (`newpid_stats.c`: two `clone(CLONE_NEWPID)` children, each
/// PID 1 in its own namespace, checking the 96 MiB heap at `--budget
/// 16M`, then waiting; root). Each one's control socket is named by its
/// PID as `/proc` shows it: before, both wanted `@ztier-1`, and the
/// second ran without one (`ztier stats` on it: "does not answer").
/// `ztier stats` accepts an answer only from the PID it asked, so each
/// answer is the child's own. Same output as native in every mode.
#[test]
fn children_in_new_pid_namespaces_at_once_each_answer_stats() {
    use std::io::{BufRead, Read, Write};
    require_root("makes PID namespaces");
    let d = tmp("newpid-stats");
    let exe = compile(&d, "newpid_stats");
    let expected = "child 1: PID 1 in its namespace, 0 wrong words\n\
                    child 2: PID 1 in its namespace, 0 wrong words\n";
    for (path, umo) in MODES {
        let what = format!("{path}, user-mode-only {umo}");
        let mut child = Command::new(ztier())
            .args(["run", "--budget", "16M", "--fault-path", path, "--", &exe])
            .env("ZTIER_UFFD_USER_MODE_ONLY", umo)
            .current_dir(&d)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        // However it ends, nothing of this run is left behind.
        struct Group(i32);
        impl Drop for Group {
            fn drop(&mut self) {
                // SAFETY: signalling the process group this test made.
                unsafe { libc::kill(-self.0, libc::SIGKILL) };
            }
        }
        let _group = Group(child.id() as i32);
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut head = String::new();
        for _ in 0..3 {
            out.read_line(&mut head).unwrap();
        }
        let (children, pids) = head.rsplit_once("pids ").unwrap_or_else(|| panic!("{what}: {head:?}"));
        assert_eq!(children, expected, "{what}");
        let pids: Vec<&str> = pids.split_whitespace().collect();
        assert_eq!(pids.len(), 2, "{what}: {head:?}");
        assert_ne!(pids[0], pids[1], "{what}");
        for pid in &pids {
            let o = Command::new(ztier()).args(["stats", pid]).output().unwrap();
            assert!(o.status.success(), "{what}: child {pid}: {}", String::from_utf8_lossy(&o.stderr));
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(v["forked_child"], 1, "{what}: child {pid}: {v}");
        }
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let mut rest = String::new();
        out.read_to_string(&mut rest).unwrap();
        let status = child.wait().unwrap();
        assert!(status.success(), "{what}: {status:?}");
        assert_eq!(rest, "both ended\n", "{what}");
    }
}

/// glibc's `_Fork` from a signal handler (`fork_in_handler.c`: a
/// one-shot `SIGALRM` 1 ms after each, forking a child that exits 7: 40
/// while the program allocates and frees all the time, 40 while it
/// reallocates a block glibc made before the library started).
/// `_Fork` is async-signal-safe; the library's export takes its locks,
/// and a handler that interrupted the library's `malloc` in the same
/// thread waited for ever for the lock that thread held (with a
/// periodic timer every 2 ms, the program hung in every mode until
/// killed). The lock may also be glibc's allocator's, which the
/// library's `realloc` of glibc's block holds while glibc's runs, and
/// the fork handlers allocate: the parent, or the child on its copy of
/// the lock, waited for ever in glibc's `malloc` (the first part hung in
/// about one run in a hundred, in CI once; the second in every run, in
/// every mode). Now a `_Fork` from a handler over the library's code is
/// made at once without the library's handlers, and the log says so (a
/// small-block lock's holder is recorded, so one over `malloc`'s small
/// blocks, not counted as library code without dispatch, is told too);
/// one elsewhere waits for the locks, as `fork` does.
/// Same output as native in every mode, within a minute.
#[test]
fn fork_from_a_signal_handler_that_interrupted_malloc() {
    let d = tmp("fork-in-handler");
    let exe = compile(&d, "fork_in_handler");
    let n = native(&[&exe], &d);
    assert!(n.status.success(), "{n:?}");
    assert_eq!(
        String::from_utf8_lossy(&n.stdout),
        "_Fork in a signal handler over malloc and free: 40 children, 40 exited 7\n\
         _Fork in a signal handler over glibc's realloc: 40 children, 40 exited 7\n"
    );
    for (path, umo) in MODES {
        let what = format!("{path}, user-mode-only {umo}");
        let m = output_within(
            Command::new(ztier())
                .args(["run", "--budget", "16M", "--log", "-", "--fault-path", path, "--", &exe])
                .env("ZTIER_UFFD_USER_MODE_ONLY", umo)
                .current_dir(&d),
            60,
            &what,
        );
        assert!(m.status.success(), "{what}: {m:?}");
        assert_eq!(m.stdout, n.stdout, "{what}");
        // The loop of the second part runs in the library's `realloc`
        // nearly all the time: some signal came there.
        let err = String::from_utf8_lossy(&m.stderr);
        assert!(
            err.contains("_Fork was called from a signal handler that interrupted ztier's code"),
            "{what}: {err}"
        );
    }
}

/// Many forks of a process whose heap is mostly evicted (`forkmany.c`:
/// 64 MiB of words at `--budget 16M`, 200 children that each close
/// descriptors 3 to 99 blind, as a shell's subshell does, then check and
/// write a 1 MiB slice the parent read just before the fork, every tenth
/// pushing it out of memory before it checks it again; every tenth with
/// a grandchild; and with `--clean wp`). Each child serves
/// its faults from its copy of the parent's store, so stored pages stay
/// stored across a fork: every process stays within the budget, and the
/// parent compresses its heap about once. Before, every stored page came
/// back for each fork and went out again in parent and child: 71 s
/// against 2.7 s, 5.5 M compressions against 28 k, 64 MiB resident at
/// each fork. A descriptor the library made on one of its threads after
/// the fork was, for a moment, a low number the child's blind `close`
/// could take: with the children left to run at once, its handler failed
/// with `EBADF` in every run (now they are made before the program runs
/// on). With a spill file in use, the child gets a copy of it (each
/// entry at its offset) and spills into that. A child's store figures
/// (`orig_bytes`, `stored_bytes`) leave out the copy it inherited.
#[test]
fn many_forks_of_a_cold_heap_keep_the_budget() {
    let d = tmp("forkmany");
    let exe = compile(&d, "forkmany");
    let n = native(&[&exe], &d);
    let text = String::from_utf8_lossy(&n.stdout).into_owned();
    assert_eq!(text, "children ok 200 of 200, with their grandchildren 20 of 20\nparent's heap intact: 1\n");
    let heap_pages = (64 << 20) / 4096;
    for (path, umo) in MODES {
        let what = format!("{path}, user-mode-only {umo}");
        let (m, s) = managed_in_mode(&d, (path, umo), &[&exe], &[]);
        assert!(m.status.success(), "{what}: {m:?}");
        assert_eq!(String::from_utf8_lossy(&m.stdout), text, "{what}");
        let procs = s["per_process"].as_array().unwrap();
        assert_eq!(procs.len(), 221, "{what}: parent, 200 children, 20 grandchildren");
        for p in procs {
            assert!(p["peak_resident_bytes"].as_u64().unwrap() <= 16 << 20, "{what}: {p}");
        }
        let parent = procs.iter().find(|p| p["forks"] == 200).unwrap_or_else(|| panic!("{what}: {s}"));
        let c = parent["pages_compressed"].as_u64().unwrap();
        assert!(c > heap_pages / 2 && c < 3 * heap_pages, "{what}: the parent compressed {c} pages");
        // A child's store figures count what its store grew by, not the
        // copy of the parent's it inherited: before, a child that evicted
        // anything reported the parent's ~49 MiB as its own. (Every tenth
        // child reads a third of the heap, ~21 MiB; with the budget shared
        // and the parent holding most of it, it compresses nearly all it
        // reads: ~15 MiB.)
        let orig = parent["orig_bytes"].as_u64().unwrap();
        assert!(orig > 16 << 20, "{what}: the parent's store held {orig} bytes of its heap");
        for p in procs.iter().filter(|p| p["forked_child"] == 1) {
            assert!(p["orig_bytes"].as_u64().unwrap() < orig / 2, "{what}: a child's store: {p}");
        }
    }
    // With `--clean wp` (full mode only): the parent's slice came back
    // write-protected with its copy kept; the fork drops the protection,
    // so the child's copy of it must count as written. Before, 4-5 of the
    // 20 children that push their written slice out and read it again
    // read the parent's bytes.
    // In the default mode (a handler thread, full userfaultfd), with
    // `opts`: the output and the merged stats.
    let run = |opts: &[&str], cmd: &[&str], name: &str| {
        let stats = d.join(format!("{name}.json"));
        let m = Command::new(ztier())
            .args(["run", "--budget", "16M", "--fault-path", "thread", "--stats"])
            .arg(&stats)
            .args(opts)
            .arg("--")
            .args(cmd)
            .env("ZTIER_UFFD_USER_MODE_ONLY", "0")
            .current_dir(&d)
            .output()
            .unwrap();
        assert!(m.status.success(), "{opts:?}: {m:?}");
        let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
        (m, s)
    };
    let (m, s) = run(&["--clean", "wp"], &[&exe], "wp");
    assert_eq!(String::from_utf8_lossy(&m.stdout), text, "--clean wp");
    assert!(s["wp_faults"].as_u64().unwrap() > 0 && s["clean_evicted"].as_u64().unwrap() > 0, "{s}");
    // With a spill file: 10 children, at a store of 4 MiB.
    let n = native(&[&exe, "10"], &d);
    let spill = d.join("spill");
    std::fs::create_dir_all(&spill).unwrap();
    let (m, s) = run(&["--store", "4M", "--spill", spill.to_str().unwrap()], &[&exe, "10"], "spill");
    assert_eq!(m.stdout, n.stdout, "with a spill file");
    let procs = s["per_process"].as_array().unwrap();
    assert_eq!(procs.len(), 12, "{s}");
    let spilled: Vec<u64> = procs.iter().map(|p| p["spilled_bytes"].as_u64().unwrap()).collect();
    assert!(spilled.iter().filter(|&&b| b > 0).count() >= 2, "the parent and children spill: {spilled:?}");
    // Spilled pages stay spilled across a fork (the child gets a copy of
    // the file): before, they all came back into the parent for each
    // fork: 60 MiB resident in every process at a 16M budget, and 287 k
    // compressions against 33 k now.
    for p in procs {
        assert!(p["peak_resident_bytes"].as_u64().unwrap() <= 16 << 20, "with a spill file: {p}");
    }
    assert_eq!(std::fs::read_dir(&spill).unwrap().count(), 0, "no spill file left");
    // With one budget for all of them (`--budget-scope tree`), 50
    // children: the pages a child inherits count once, in the parent, and
    // a child that needs pages wakes the parent's evictor instead of
    // evicting what it shares with it, which gives nothing back. About as
    // many compressions as with a budget each (22-24 k against 18 k);
    // before, 214 k (each child held every page it inherited and evicted
    // them all first), and 53 k with the sharing counted but no wake.
    let n = native(&[&exe, "50"], &d);
    let (m, own) = run(&["--budget-scope", "process"], &[&exe, "50"], "own50");
    assert_eq!(m.stdout, n.stdout, "50 children, a budget each");
    let (m, tree) = run(&[], &[&exe, "50"], "tree50");
    assert_eq!(m.stdout, n.stdout, "50 children, one budget");
    let over = tree["tree_over_bytes"].as_u64().unwrap();
    assert!(tree["tree_peak_held_bytes"].as_u64().unwrap() <= (16 << 20) + over && over < 1 << 20, "{tree}");
    let (a, b) = (compressed(&tree), compressed(&own));
    assert!(a < 2 * b, "one budget: {a} pages compressed, against {b} with a budget each");
}

/// Forked children that end without their exit handlers (`exits.c`: by
/// `_exit`, `_Exit`, and `_exit` from a signal handler; one by `exit`)
/// are counted in `--stats`, each with the faults it took on its cold
/// slice; a `vfork` child's `_exit` writes nothing of its parent's.
/// Before, `ztier run` counted only the parent and the child that called
/// `exit`: redis's `BGSAVE` children and CPython's `os._exit` (its
/// `multiprocessing` workers, `examples/workloads/forks.py`) were left
/// out of the figures.
#[test]
fn children_that_end_by_exit_without_handlers_are_counted() {
    native_output_in_every_mode_and(
        "exits",
        &["children ok 4 of 4, vfork child ok", "heap intact: 1"],
        |(path, umo), _, s, _| {
            let procs = s["per_process"].as_array().unwrap();
            assert_eq!(procs.len(), 5, "{path}, user-mode-only {umo}: the parent and four children: {s}");
            let children: Vec<&serde_json::Value> = procs.iter().filter(|p| p["forked_child"] == 1).collect();
            assert_eq!(children.len(), 4, "{path}, user-mode-only {umo}: {s}");
            for c in children {
                // 4096 pages, up to 32 a fault on a sequential walk.
                assert!(c["store_faults"].as_u64().unwrap() > 50, "{path}, user-mode-only {umo}: {c}");
            }
        },
    );
}

/// A spill file that cannot be copied for a forked child (its device
/// is full: a 64 MiB tmpfs, against a spill file of ~46 MB): the parent
/// says so and brings the spilled pages back for the fork, as before the
/// copy, and every process still reads the heap right; nothing is left
/// on the device.
#[test]
fn a_spill_file_that_cannot_be_copied_at_a_fork_comes_back_first() {
    require_root("mounts a tmpfs");
    let d = tmp("spillfull");
    let exe = compile(&d, "forkmany");
    let n = native(&[&exe, "4"], &d);
    let spill = d.join("spill");
    std::fs::create_dir_all(&spill).unwrap();
    let ok =
        Command::new("mount").args(["-t", "tmpfs", "-o", "size=64m", "tmpfs"]).arg(&spill).status().unwrap();
    assert!(ok.success(), "mount");
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let ok = Command::new("umount").arg(&self.0).status().map(|s| s.success());
            assert!(matches!(ok, Ok(true)), "umount {}", self.0.display());
        }
    }
    let mounted = Unmount(spill.clone());
    let m = Command::new(ztier())
        .args(["run", "--budget", "16M", "--store", "4M", "--log", "-", "--spill"])
        .arg(&spill)
        .args(["--", &exe, "4"])
        .current_dir(&d)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&m.stderr);
    assert!(m.status.success(), "{m:?}");
    assert_eq!(m.stdout, n.stdout, "{err}");
    let said = "copying the spill file for a forked child failed (next tier I/O: No space left on device";
    assert_eq!(err.matches(said).count(), 1, "said once (4 forks): {err}");
    assert_eq!(std::fs::read_dir(&spill).unwrap().count(), 0, "no spill file left");
    let df = Command::new("df").arg("--output=used").arg(&spill).output().unwrap();
    let used: u64 = String::from_utf8_lossy(&df.stdout).lines().nth(1).unwrap().trim().parse().unwrap();
    assert_eq!(used, 0, "nothing held on the device");
    drop(mounted);
}

/// A fork while a thread made by glibc's own `pthread_create` runs (found
/// in libc.so.6 itself, as libjemalloc finds it for redis's background
/// thread), its early allocations cold (`forkthreads.c`). In the child
/// that thread's stack is in glibc's cache, and taking it frees the old
/// thread's DTV first. That DTV was arena memory, and the child's first
/// `pthread_create`, the library's own starting the child's fault
/// handler, faulted on it with no handler to serve it: every child hung
/// (redis's `BGSAVE` child did). Now what the dynamic linker allocates
/// never goes to the arena, and the library's threads run on stacks of
/// their own. Each child checks a slice of the heap and starts a thread.
#[test]
fn forks_next_to_a_thread_the_library_did_not_start() {
    native_output_in_every_mode("forkthreads", "children ok 8 of 8");
}

/// A test's directory is removed by a later test process once its own
/// process has ended, and only then: a running one's stays, and so does
/// anything else in the folder.
#[test]
fn test_directories_of_ended_test_processes_are_removed() {
    let dir = tmp("sweep");
    let mut gone = Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    gone.wait().unwrap();
    let mut running = Command::new("sleep").arg("30").spawn().unwrap();
    let names = [
        format!("ztier-run-test-{gone_pid}-a"),
        format!("ztier-run-test-{gone_pid}-b"),
        format!("ztier-run-test-{}-c", running.id()),
        format!("ztier-run-test-{}-d", std::process::id()),
        format!("ztier-other-{gone_pid}"),
        "ztier-run-test-notapid-e".to_string(),
    ];
    for n in &names {
        std::fs::create_dir_all(dir.join(n).join("inner")).unwrap();
        std::fs::write(dir.join(n).join("inner/file"), b"x").unwrap();
    }
    remove_dirs_of_gone_processes(&dir);
    let left: Vec<bool> = names.iter().map(|n| dir.join(n).exists()).collect();
    running.kill().unwrap();
    running.wait().unwrap();
    assert_eq!(left, [false, false, true, true, true, true], "{names:?}");
}
