//! `ztier bench pressure`: the ztier-vs-native comparison, and (as root)
//! the kernel baselines with every system change undone — after a normal
//! run and after Ctrl-C in the middle of one.

use std::process::{Command, Stdio};

fn ztier() -> &'static str {
    env!("CARGO_BIN_EXE_ztier")
}

const JOB: &str = "d = {i: str(i) * 6 for i in range(250000)}\nprint(len(d), sum(map(len, d.values())))\n";

fn system_state() -> (String, String, Vec<String>, Vec<String>) {
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap();
    let zswap = std::fs::read_to_string("/sys/module/zswap/parameters/enabled").unwrap_or_default();
    let mut cgroups: Vec<String> = std::fs::read_dir("/sys/fs/cgroup/memory")
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    cgroups.retain(|c| c.starts_with("ztier-bench"));
    let mut blocks: Vec<String> = std::fs::read_dir("/sys/block")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|b| b.starts_with("zram"))
        .collect();
    blocks.sort();
    (swaps, zswap, cgroups, blocks)
}

#[test]
fn ztier_against_native_same_output() {
    let o = Command::new(ztier())
        .args(["bench", "pressure", "--kernel", "none", "--budgets", "16M,32M", "--pairs", "2", "--"])
        .args(["python3", "-c", JOB])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{text}\n{}", String::from_utf8_lossy(&o.stderr));
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("ztier run")).collect();
    assert_eq!(rows.len(), 2, "{text}");
    assert!(rows.iter().all(|r| r.ends_with("same")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("native")), "{text}");
    // Each ztier run reports its fault service times, from its own stats.
    for b in ["16M", "32M"] {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("fault service at {b} (ztier run): p50 ")))
            .unwrap_or_else(|| panic!("no fault times at {b}: {text}"));
        let faults: u64 =
            line.split(" over ").nth(1).and_then(|t| t.split(' ').next()?.parse().ok()).unwrap();
        assert!(faults > 0, "{line}");
        // And what those faults take at userfaultfd's floor, measured in
        // the same run, against native.
        let floor = text
            .lines()
            .find(|l| l.starts_with(&format!("at {b}: ")) && l.contains(" at that floor ("))
            .unwrap_or_else(|| panic!("no floor at {b}: {text}"));
        assert!(floor.starts_with(&format!("at {b}: {faults} faults and ")), "{floor}");
    }
    let floor = text.lines().find(|l| l.starts_with("userfaultfd on this machine")).expect(&text);
    assert!(floor.contains("a fault's round trip") && floor.contains("each further page"), "{floor}");
    // --pairs 2: two more runs of each at each budget, in turn, and the
    // ratio pair by pair within its range.
    for b in ["16M", "32M"] {
        let head = format!("at {b}, 2 pairs of native and ztier run in turn: ");
        let line =
            text.lines().find(|l| l.starts_with(&head)).unwrap_or_else(|| panic!("no pairs at {b}: {text}"));
        let num = |s: &str| s.parse::<f64>().unwrap_or_else(|_| panic!("{s:?} in {line}"));
        let rest = &line[head.len()..];
        let ratio = num(rest.split(' ').next().unwrap());
        let range = rest.split('(').nth(1).and_then(|r| r.split(')').next()).unwrap();
        let (lo, hi) = range.split_once('–').unwrap();
        let (lo, hi) = (num(lo), num(hi));
        assert!(ratio > 0.0 && lo <= ratio && ratio <= hi, "{line}");
    }
}

/// `--fault-path signal`: `ztier run` serves faults in the faulting
/// thread; the row says so, its output is the same, and the handler
/// thread's floor is not applied to it.
#[test]
fn the_fault_path_can_be_chosen() {
    let svg = std::env::temp_dir().join(format!("ztier-pressure-path-{}.svg", std::process::id()));
    let (text, rows) = pressure_json(
        "path",
        &["--kernel", "none", "--budgets", "16M", "--fault-path", "signal", "--plot", svg.to_str().unwrap()],
    );
    let z = rows.as_array().unwrap().iter().find(|r| r["mode"] == "ztier run").expect("a ztier run row");
    assert_eq!(z["fault_path"], "signal", "{z}");
    assert_eq!(
        z["budget_scope"], "tree",
        "the default, as the kernel runs' cgroup covers every process: {z}"
    );
    assert!(text.contains("ztier run's budget covers the command's processes together"), "{text}");
    assert_eq!(z["same_output"], true, "{z}");
    assert!(z["faults"].as_u64().unwrap() > 0 && z["uffd_floor_s"].is_null(), "{z}");
    // The fault service histogram: a count per fault.
    let counted: u64 = z["latency_ns"].as_array().unwrap().iter().map(|p| p[1].as_u64().unwrap()).sum();
    assert_eq!(counted, z["faults"].as_u64().unwrap(), "{z}");
    // The plot: wall times, and the faults' service times beside them.
    let plot = std::fs::read_to_string(&svg).unwrap();
    let _ = std::fs::remove_file(&svg);
    assert!(plot.contains("wall time under memory pressure"), "{plot}");
    assert!(plot.contains("ztier run: faults served within") && plot.contains("at 16M"), "{plot}");
    assert!(text.contains("fault service at 16M (ztier run, in the faulting thread"), "{text}");
    assert!(!text.lines().any(|l| l.starts_with("at 16M: ") && l.contains(" at that floor (")), "{text}");
}

/// Runs `ztier bench pressure ARGS --json F -- python3 -c JOB`, which
/// must succeed: its table and its JSON rows.
fn pressure_json(name: &str, args: &[&str]) -> (String, serde_json::Value) {
    let json = std::env::temp_dir().join(format!("ztier-pressure-{name}-{}.json", std::process::id()));
    let o = Command::new(ztier())
        .args(["bench", "pressure"])
        .args(args)
        .arg("--json")
        .arg(&json)
        .args(["--", "python3", "-c", JOB])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{text}\n{}", String::from_utf8_lossy(&o.stderr));
    let rows = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    (text, rows)
}

/// The two root tests change system-wide state (swap, zswap, zram) and
/// compare snapshots of it: one at a time.
static SYSTEM: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let r = unsafe { libc::geteuid() } == 0;
    assert!(r, "the kernel baselines need root (swapon, cgroups, zram): run the tests as root");
    r
}

#[test]
fn kernel_baselines_restore_every_setting() {
    root();
    let _one = SYSTEM.lock().unwrap_or_else(|e| e.into_inner());
    let before = system_state();
    let (text, rows) = pressure_json("kernel", &["--budgets", "24M", "--timeout", "60"]);
    let modes: Vec<&str> = rows.as_array().unwrap().iter().map(|r| r["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["native", "kernel swap (file)", "kernel zswap", "kernel zram", "ztier run"], "{text}");
    for r in rows.as_array().unwrap() {
        // A kernel run may be slow or stall (then it is killed at the
        // timeout); one that finished must match the native output.
        if r["exit_code"] == 0 {
            assert_eq!(r["same_output"], true, "{r}");
            // Its CPU time is counted: a CPU-bound program, so half the
            // native run's CPU time at least. (Not its wall time: on a
            // busy machine the native run itself took 0.37 s of CPU in
            // 0.79 s.)
            let (cpu, native) = (r["cpu_s"].as_f64().unwrap(), rows[0]["cpu_s"].as_f64().unwrap());
            assert!(native > 0.1 && cpu > native / 2.0, "{r}");
        }
    }
    assert_eq!(system_state(), before, "swap, zswap, cgroups and zram devices are as they were");
}

#[test]
fn ctrl_c_in_the_middle_restores_too() {
    root();
    let _one = SYSTEM.lock().unwrap_or_else(|e| e.into_inner());
    let before = system_state();
    let child = Command::new(ztier())
        .args(["bench", "pressure", "--kernel", "swap", "--budgets", "24M", "--timeout", "60", "--"])
        .args([
            "python3",
            "-c",
            "import time\nb = [bytes(4096) + bytes([i % 256]) for i in range(20000)]\ntime.sleep(30)\n",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the swap file is on.
    let t = std::time::Instant::now();
    while !std::fs::read_to_string("/proc/swaps").unwrap().contains("ztier-bench") {
        assert!(t.elapsed().as_secs() < 60, "the swap file never came up");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    // SAFETY: signalling our child by pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let o = child.wait_with_output().unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("interrupted"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(system_state(), before, "everything undone after Ctrl-C");
}

/// The sleeps whose PIDs the program listed in `pids` (removed here):
/// `n` of them, none still running (`err`: the bench's stderr).
fn sleeps_ended(pids: &std::path::Path, n: usize, err: &str) {
    let listed = std::fs::read_to_string(pids).unwrap();
    std::fs::remove_file(pids).unwrap();
    let pids: Vec<u32> = listed.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(pids.len(), n, "{pids:?}");
    for pid in &pids {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(!String::from_utf8_lossy(&cmdline).starts_with("sleep"), "sleep {pid} still runs: {err}");
    }
}

#[test]
fn processes_left_running_are_ended_and_everything_restored() {
    // The program starts a process it leaves running (as a script leaves
    // its server when the run is killed at the timeout). In the swap run
    // that process stayed in the cgroup, so the cgroup could not be
    // removed, nor the swap file turned off; in the native and ztier runs
    // it ran on into the next runs. Now every one is killed by PID: from
    // the cgroup, or as an orphan that came to `bench pressure`.
    root();
    let _one = SYSTEM.lock().unwrap_or_else(|e| e.into_inner());
    let before = system_state();
    let pids = std::env::temp_dir().join(format!("ztier-pressure-left-{}.pids", std::process::id()));
    let _ = std::fs::remove_file(&pids);
    let t = std::time::Instant::now();
    let script = format!("sleep 120 > /dev/null 2>&1 & echo $! >> {}; echo started", pids.display());
    let o = Command::new(ztier())
        .args(["bench", "pressure", "--kernel", "swap", "--budgets", "24M", "--pairs", "1"])
        .args(["--timeout", "60", "--", "sh", "-c", &script])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{text}\n{err}");
    assert!(!err.contains("failed"), "{err}");
    assert!(text.lines().any(|l| l.starts_with("kernel swap (file)") && l.ends_with("same")), "{text}");
    assert!(t.elapsed().as_secs() < 60, "the runs do not wait for what they left");
    assert_eq!(system_state(), before, "swap and cgroups are as they were");
    // Native, swap, ztier run, then a pair: five sleeps, none left.
    sleeps_ended(&pids, 5, &err);
    // And the user is told, once for each native and ztier run.
    assert_eq!(err.matches("the native run left 1 process running (").count(), 2, "{err}");
    assert_eq!(err.matches("the ztier run left 1 process running (").count(), 2, "{err}");
}

#[test]
fn a_ztier_run_that_does_not_end_is_stopped_at_the_timeout() {
    // A program that never ends under `ztier run` (here by choice: it
    // waits on a sleep only when it sees the library's settings) left
    // `bench pressure` waiting for ever: only kernel runs had a bound.
    // Now the row says TIMEOUT, no ratio is drawn from it, the exit
    // status says the comparison failed, and the sleep is ended too.
    let pids = std::env::temp_dir().join(format!("ztier-pressure-hang-{}.pids", std::process::id()));
    let _ = std::fs::remove_file(&pids);
    let script = format!(
        "if [ -n \"$ZTIER_BUDGET\" ]; then sleep 120 & echo $! >> {}; wait; fi; echo done",
        pids.display()
    );
    let t = std::time::Instant::now();
    let o = Command::new(ztier())
        .args(["bench", "pressure", "--kernel", "none", "--budgets", "16M", "--pairs", "1"])
        .args(["--timeout", "3", "--", "sh", "-c", &script])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{text}\n{err}");
    assert!(t.elapsed().as_secs() < 60, "{err}");
    let row = text.lines().find(|l| l.starts_with("ztier run")).expect(&text);
    assert!(row.ends_with("TIMEOUT"), "{text}");
    assert!(text.contains("ztier run at 16M: the program stopped at the timeout after 3 s"), "{text}");
    assert!(!text.contains("× native pair by pair"), "{text}");
    // A killed run wrote no statistics: none are made up for it.
    assert!(!text.contains("fault service at 16M"), "{text}");
    assert!(!text.contains("further pages take"), "{text}");
    assert!(
        err.contains("pair 1 at 16 MiB: native exit 0, ztier run exit 137 (killed at the timeout)"),
        "{err}"
    );
    sleeps_ended(&pids, 2, &err);
    assert_eq!(err.matches("the ztier run left 1 process running (").count(), 2, "{err}");
}

/// Runs `bench pressure` with `args` in a process group of its own and,
/// from the moment `ready` holds, sends the whole group SIGINT every 10
/// ms, as a user who keeps pressing Ctrl-C at a terminal does, until it
/// ends; its stderr.
fn interrupted_when(args: &[&str], ready: impl Fn() -> bool) -> String {
    use std::os::unix::process::CommandExt;
    let child = Command::new(ztier())
        .args(["bench", "pressure"])
        .args(args)
        .args([
            "--",
            "python3",
            "-c",
            "import time\nb = [bytes(4096) + bytes([i % 256]) for i in range(20000)]\ntime.sleep(3)\n",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let pgid = child.id() as i32;
    let t = std::time::Instant::now();
    while !ready() {
        assert!(t.elapsed().as_secs() < 120, "never ready: {args:?}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let storm = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // SAFETY: signalling the process group this test made.
                unsafe { libc::kill(-pgid, libc::SIGINT) };
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        })
    };
    let o = child.wait_with_output().unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    storm.join().unwrap();
    assert!(!o.status.success());
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Ctrl-C at any moment, pressed again and again: while the swap file
/// is being made and turned on, while zswap and a zram device are set up,
/// and while each is undone. Before, a signal that came while no program
/// ran killed the benchmark, and one that reached `swapoff` killed that:
/// swap left on, zswap enabled, cgroups and zram devices left behind.
/// Now the benchmark stops with "interrupted" and everything is as it
/// was.
#[test]
fn ctrl_c_again_and_again_at_any_moment_restores_everything() {
    root();
    let _one = SYSTEM.lock().unwrap_or_else(|e| e.into_inner());
    let before = system_state();
    let swap_named = || {
        std::fs::read_dir("/var/tmp").unwrap().flatten().any(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with("ztier-bench-") && n.ends_with(".swap")
        })
    };
    let zram_count = before.3.len();
    type Ready = Box<dyn Fn() -> bool>;
    let phases: [(&[&str], Ready); 3] = [
        // As soon as the swap file is there: during fallocate, mkswap, swapon.
        (&["--kernel", "swap", "--budgets", "24M", "--timeout", "60"], Box::new(swap_named)),
        // As zswap's run starts (its setting changed).
        (
            &["--kernel", "zswap", "--budgets", "24M", "--timeout", "60"],
            Box::new(|| std::fs::read_to_string("/proc/swaps").unwrap().contains("ztier-bench")),
        ),
        // As soon as a zram device is added: during its setup.
        (
            &["--kernel", "zram", "--budgets", "24M", "--timeout", "60"],
            Box::new(move || {
                std::fs::read_dir("/sys/block")
                    .unwrap()
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("zram"))
                    .count()
                    > zram_count
            }),
        ),
    ];
    for (args, ready) in phases {
        let err = interrupted_when(args, ready);
        assert!(err.contains("interrupted"), "{args:?}: {err}");
        assert!(!err.contains("restoring"), "{args:?}: a step of the undoing failed: {err}");
        assert_eq!(system_state(), before, "{args:?}: everything undone: {err}");
        assert!(!swap_named(), "{args:?}: the swap file is gone");
    }
}

/// One `bench pressure` with kernel baselines at a time (two changed the
/// same settings: zswap was left enabled, and each one's runs had both
/// swap files): a second one is refused before it runs anything, and
/// changes nothing. Bad arguments are refused before anything runs too:
/// a budget under 1 MiB (the kernel runs went ahead in a cgroup of 0
/// bytes, and the error came at the end), a `--timeout` of 0, a
/// `--swap-dir` on tmpfs (the error came after the native run).
#[test]
fn refused_before_anything_runs() {
    use std::os::fd::AsRawFd;
    root();
    let _one = SYSTEM.lock().unwrap_or_else(|e| e.into_inner());
    let before = system_state();
    let refused = |args: &[&str], why: &str| {
        let o = Command::new(ztier())
            .args(["bench", "pressure"])
            .args(args)
            .args(["--", "python3", "-c", "print(1)"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(why), "{args:?}: {err}");
        assert!(!err.contains("native ..."), "{args:?}: ran the program: {err}");
        assert_eq!(system_state(), before, "{args:?}");
    };
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open("/run/lock/ztier-bench-pressure.lock")
        .unwrap();
    // SAFETY: flock on a descriptor we own.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
    refused(
        &["--kernel", "zswap", "--budgets", "24M"],
        "another `ztier bench pressure` with kernel baselines",
    );
    drop(lock);
    refused(&["--budgets", "0"], "--budgets: 0 bytes is too small (at least 1 MiB)");
    refused(&["--budgets", "64M,1K"], "--budgets: 1024 bytes is too small");
    refused(&["--budgets", "64M,,32M"], "--budgets 64M,,32M: an empty item in the list");
    refused(&["--timeout", "0"], "--timeout 0");
    refused(&["--kernel", "swap", "--swap-dir", "/dev/shm"], "on tmpfs, which cannot hold a swap file");
    refused(&["--kernel", "swap", "--swap-dir", "/nonexistent-ztier"], "--swap-dir /nonexistent-ztier");
}

/// Writes a suite file for a test.
fn suite_file(name: &str, text: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("ztier-suite-{name}-{}.toml", std::process::id()));
    std::fs::write(&p, text).unwrap();
    p
}

/// `--suite`: a tiny suite of two programs (one given arguments for its
/// kernel run only) under one kernel mode and `ztier run`: one table, a
/// line per program with its ratios and what each run held, the
/// geometric means, each program's own table under it; every setting
/// restored. (~15 s.)
#[test]
fn a_suite_runs_each_program_and_restores_every_setting() {
    root();
    let _one = SYSTEM.lock().unwrap_or_else(|e| e.into_inner());
    let before = system_state();
    let job = JOB.replace('\n', "\\n");
    let suite = suite_file(
        "tiny",
        &format!(
            "timeout = 60\n\n[[program]]\nname = \"py-dict\"\ncmd = [\"python3\", \"-c\", \"{job}\"]\n\
             budget = \"24M\"\n\n[[program]]\nname = \"sort\"\n\
             cmd = [\"sh\", \"-c\", \"seq 1 400000 | sort -r | md5sum\"]\nbudget = \"8M\"\n\
             kernel_args = [\"-e\"]\n"
        ),
    );
    let json = suite.with_extension("json");
    let o = Command::new(ztier())
        .args(["bench", "pressure", "--kernel", "zram", "--suite"])
        .arg(&suite)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{text}\n{}", String::from_utf8_lossy(&o.stderr));
    assert!(text.starts_with("ztier bench pressure --suite "), "{text}");
    for name in ["py-dict", "sort"] {
        let line = text.lines().find(|l| l.starts_with(&format!("{name} "))).expect(&text);
        assert!(line.ends_with("same"), "{line}");
        assert!(text.contains(&format!("\nztier bench pressure: {name}: ")), "its own table: {text}");
    }
    assert!(text.contains("geometric mean over the programs with a ratio: ztier run "), "{text}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let programs = v["programs"].as_array().unwrap();
    assert_eq!(programs.len(), 2, "{v}");
    for p in programs {
        assert!(p["ztier_vs_native"].as_f64().unwrap() > 0.0, "{p}");
        // What ztier run held, everything counted, is reported.
        assert!(p["ztier_held_bytes"].as_u64().unwrap() > 0, "{p}");
    }
    let rows = v["rows"].as_array().unwrap();
    let modes: Vec<(&str, &str)> =
        rows.iter().map(|r| (r["program"].as_str().unwrap(), r["mode"].as_str().unwrap())).collect();
    assert_eq!(
        modes,
        [
            ("py-dict", "native"),
            ("py-dict", "kernel zram"),
            ("py-dict", "ztier run"),
            ("sort", "native"),
            ("sort", "kernel zram"),
            ("sort", "ztier run")
        ]
    );
    // A kernel run that finished says what it held: its cgroup's peak and
    // zram's pool.
    for r in rows.iter().filter(|r| r["mode"] == "kernel zram" && r["exit_code"] == 0) {
        assert!(r["cgroup_peak_bytes"].as_u64().unwrap() > 0, "{r}");
        assert!(r["peak_total_bytes"].as_u64() >= r["cgroup_peak_bytes"].as_u64(), "{r}");
    }
    let _ = std::fs::remove_file(&suite);
    let _ = std::fs::remove_file(&json);
    assert_eq!(system_state(), before, "swap, zswap, cgroups and zram devices are as they were");
}

/// A bad suite file is refused before anything runs, naming its line.
#[test]
fn a_bad_suite_is_refused_naming_the_line() {
    let refused = |text: &str, why: &str| {
        let suite = suite_file("bad", text);
        let o = Command::new(ztier())
            .args(["bench", "pressure", "--kernel", "none", "--suite"])
            .arg(&suite)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        let _ = std::fs::remove_file(&suite);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains(why), "{why:?}: {err}");
        assert!(!err.contains("native ..."), "ran a program: {err}");
    };
    refused(
        "[[program]]\nname = \"a\"\ncmd = [\"true\"]\nbudget = \"64X\"\n",
        "line 4: program \"a\": budget \"64X\"",
    );
    refused(
        "[[program]]\nname = \"a\"\ncmd = [\"true\"]\nbudget = \"64M\"\nheap = 1\n",
        "line 5: unknown field `heap`",
    );
    refused(
        "[[program]]\nname = \"a\"\ncmd = [\"nope-not-a-program\"]\nbudget = \"64M\"\n",
        "line 1: program \"a\"",
    );
    let o = Command::new(ztier())
        .args(["bench", "pressure", "--suite", "/nonexistent/suite.toml"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--suite /nonexistent/suite.toml"), "{o:?}");
}
