//! `ztier run` against real programs: python3, sqlite3, sort, gcc (cc1
//! via exec), node, java, php, perl, ruby, guile (a conservative
//! collector with parallel markers), a multi-threaded C program, fork with and
//! without exec, mmap/mremap/munmap/madvise, and kill -9. Every output is
//! compared with a native run; the budgets are small enough that pages
//! must be compressed, and the managed resident memory must stay within
//! the budget (from the library's own count, and from mincore in the C
//! program). These tests serve faults the way the environment says
//! (`ZTIER_FAULT_PATH`, `ZTIER_UFFD_USER_MODE_ONLY`), and `make test` runs
//! them once per way; the tests that go through every way themselves are
//! in `cli_run_modes.rs`.

use std::path::Path;
use std::process::{Command, Output, Stdio};

mod common;
use common::*;

/// Runs under `ztier run` and returns the output and the merged stats.
fn managed(budget: &str, cmd: &[&str], dir: &Path) -> (Output, serde_json::Value) {
    managed_with(budget, &[], cmd, dir)
}

/// As `managed`, with more options for `ztier run`.
fn managed_with(budget: &str, opts: &[&str], cmd: &[&str], dir: &Path) -> (Output, serde_json::Value) {
    let stats = dir.join(format!("stats-{}.json", cmd[0].replace('/', "_")));
    let out = Command::new(ztier())
        .args(["run", "--budget", budget])
        .args(opts)
        .arg("--stats")
        .arg(&stats)
        .arg("--")
        .args(cmd)
        .current_dir(dir)
        .output()
        .unwrap();
    let v = serde_json::from_str(
        &std::fs::read_to_string(&stats)
            .unwrap_or_else(|e| panic!("no stats ({e}); stderr: {}", String::from_utf8_lossy(&out.stderr))),
    )
    .unwrap();
    (out, v)
}

fn budget_bytes(b: &str) -> u64 {
    b.trim_end_matches('M').parse::<u64>().unwrap() << 20
}

/// Same exit status and stdout as native; every process stayed within
/// the budget (forked ones too: stored pages stay stored across a fork).
fn same_as_native(budget: &str, cmd: &[&str], dir: &Path) -> serde_json::Value {
    let n = native(cmd, dir);
    assert!(n.status.success(), "native run of {cmd:?} failed: {}", String::from_utf8_lossy(&n.stderr));
    let (m, s) = managed(budget, cmd, dir);
    assert_eq!(m.status.code(), n.status.code(), "{cmd:?}: stderr {}", String::from_utf8_lossy(&m.stderr));
    assert!(m.stdout == n.stdout, "{cmd:?}: output differs from the native run");
    for p in s["per_process"].as_array().unwrap() {
        let peak = p["peak_resident_bytes"].as_u64().unwrap();
        assert!(peak <= budget_bytes(budget), "{cmd:?}: process {} had {peak} bytes resident", p["pid"]);
    }
    s
}

#[test]
fn python3_dict_and_list_heavy() {
    require("python3");
    let d = tmp("py");
    std::fs::write(
        d.join("job.py"),
        "d = {i: str(i) * 8 for i in range(400000)}\n\
         l = [[j, str(j)] for j in range(300000)]\n\
         print(len(d), sum(len(v) for v in d.values()), sum(x[0] for x in l))\n\
         d2 = {k: v[::-1] for k, v in d.items() if k % 3}\n\
         print(len(d2), sum(map(len, d2.values())))\n",
    )
    .unwrap();
    let s = same_as_native("24M", &["python3", "job.py"], &d);
    assert!(compressed(&s) > 5000, "python3 under 24M compressed only {} pages", compressed(&s));
    assert!(s["faults"].as_u64().unwrap() > 100);
    let (p50, p99) = (s["fault_p50_us"].as_f64().unwrap(), s["fault_p99_us"].as_f64().unwrap());
    assert!(p50 > 0.0 && p99 >= p50, "latency quantiles {p50} {p99}");
    // The histogram (merged over processes): one count per fault served,
    // and the quantiles are read off it.
    let hist = latency_histogram(&s);
    assert!(hist.windows(2).all(|w| w[0].0 < w[1].0), "buckets out of order: {hist:?}");
    let counted: u64 = hist.iter().map(|b| b.1).sum();
    assert_eq!(counted, s["faults"].as_u64().unwrap(), "histogram counts against faults: {hist:?}");
    let at = |q: f64| {
        let mut seen = 0;
        hist.iter().find(|b| {
            seen += b.1;
            seen as f64 >= q * counted as f64
        })
    };
    assert_eq!(at(0.5).unwrap().0 as f64 / 1000.0, p50, "p50 against the histogram");
    assert_eq!(at(0.99).unwrap().0 as f64 / 1000.0, p99, "p99 against the histogram");
    let mean = s["fault_mean_us"].as_f64().unwrap();
    assert!(mean > 0.0, "mean service time {mean} (p50 {p50}, p99 {p99})");
    // The background evictor's write protections are made by fault
    // services on the program's CPU, unless no fault comes for 2 ms: in a
    // program that faults all along, most of them.
    let (near, far) = (s["wp_batches_near"].as_u64().unwrap(), s["wp_batches_far"].as_u64().unwrap());
    assert!(near > 0 && near >= far, "batches protected near {near}, far {far}: {s}");
    // The service time in all and its parts: every store fault reads
    // the store and installs, and the parts fit inside the whole, which
    // lies between the sums of its faults' bucket bounds (buckets 100 ns
    // wide up to 100 µs, then 10 µs; the last, from 10.09 ms, has no
    // upper bound: on a loaded machine a few faults there took the whole
    // past any estimate from bucket middles).
    let sec = |k: &str| s[k].as_f64().unwrap_or_else(|| panic!("{k} missing: {s}"));
    let (service, lock, read, install) =
        (sec("fault_service_s"), sec("fault_lock_wait_s"), sec("fault_store_read_s"), sec("fault_install_s"));
    assert!(read > 0.0 && install > 0.0 && lock >= 0.0, "{s}");
    assert!(lock + read + install <= service, "parts {lock} + {read} + {install} over {service}");
    const LAST_FROM_NS: u64 = 10_090_000;
    let (mut low, mut high) = (0.0, 0.0);
    for &(upper, n) in &hist {
        let width = if upper <= 100_000 { 100 } else { 10_000 };
        low += (n * upper.saturating_sub(width)) as f64 / 1e9;
        high += if upper >= LAST_FROM_NS { f64::INFINITY } else { (n * upper) as f64 / 1e9 };
    }
    assert!(
        service >= 0.98 * low - 0.01 && service <= 1.02 * high + 0.01,
        "service {service} s outside the histogram's bounds {low}..{high} s: {hist:?}"
    );
    let (o, st) = (s["orig_bytes"].as_u64().unwrap(), s["stored_bytes"].as_u64().unwrap());
    assert!(o > 0 && st > 0 && st < o, "python heap compresses: {o} -> {st}");
    // By default (--clean verify) pages that came back keep their copy
    // and are told clean or written by their hash at eviction: CPython
    // both writes pages it reads (reference counts) and leaves some alone.
    assert!(s["dirtied"].as_u64().unwrap() > 0 && s["clean_evicted"].as_u64().unwrap() > 0, "{s}");
    // Installed writable: a write costs no fault (the few write-protect
    // faults are writes to pages while they are being evicted).
    let verify_wp_faults = s["wp_faults"].as_u64().unwrap();
    assert!(verify_wp_faults < s["dirtied"].as_u64().unwrap(), "{s}");
    // --clean wp: pages that came back clean and were then written take
    // the write-protect path (their kept copy dropped); same output.
    let (m, s) = managed_with("24M", &["--clean", "wp"], &["python3", "job.py"], &d);
    assert!(m.status.success() && m.stdout == native(&["python3", "job.py"], &d).stdout);
    assert!(s["dirtied"].as_u64().unwrap() > 0 && s["clean_evicted"].as_u64().unwrap() > 0, "{s}");
    if s["fault_path"] == "signal" || s["per_process"][0]["user_mode_only"] == true {
        // Where the kernel's own faults are not served (the suite run with
        // ZTIER_FAULT_PATH=signal or as a user-mode-only userfaultfd), its
        // writes to a write-protected page would fail: wp becomes verify,
        // and says so (in the notices, not on the program's stderr); no
        // page is installed write-protected.
        assert!(notices(&s).contains("using --clean verify") && m.stderr.is_empty(), "{m:?} {s}");
        assert!(s["wp_faults"].as_u64().unwrap() < s["dirtied"].as_u64().unwrap(), "{s}");
    } else {
        // Here every page written after it came back took a write fault.
        assert!(s["wp_faults"].as_u64().unwrap() >= s["dirtied"].as_u64().unwrap(), "{s}");
        assert!(s["wp_faults"].as_u64().unwrap() > verify_wp_faults, "{s}");
    }
    assert!(s["peak_resident_bytes"].as_u64().unwrap() <= 24 << 20);
}

#[test]
fn sqlite3_in_memory_database() {
    require("sqlite3");
    let d = tmp("sqlite");
    let sql = "create table t(a integer, b text); \
        with recursive c(x) as (select 1 union all select x + 1 from c where x < 200000) \
        insert into t select x, printf('%08d-%s', x * 7919 % 200000, substr('abcdefghijklmnopqrstuvwxyz', x % 26, 10)) from c; \
        create index i on t(b); \
        select count(*), sum(length(b)), min(b), max(b) from t; \
        select b from t order by b limit 5;";
    let s = same_as_native("8M", &["sqlite3", ":memory:", sql], &d);
    assert!(compressed(&s) > 1000, "sqlite3 under 8M compressed {} pages", compressed(&s));
}

#[test]
fn sort_of_a_large_file() {
    require("sort");
    let d = tmp("sort");
    let text = lines(88172645463325252, 600_000, |x, i| {
        format!("{x:016x} line {i} {}\n", "payload".repeat((x % 5) as usize))
    });
    std::fs::write(d.join("big.txt"), text).unwrap();
    let s = same_as_native("16M", &["sort", "-S", "200M", "big.txt"], &d);
    assert!(compressed(&s) > 2000, "sort under 16M compressed {} pages", compressed(&s));
}

/// Perl's hashes: a record of its own array and hash per key, summed in
/// key order (reads all over the heap, through perl's own use of
/// `malloc`).
#[test]
fn perl_hash_of_records() {
    require("perl");
    let d = tmp("perl");
    let prog = "my %h; for my $i (1..60000) { $h{\"k$i\"} = [$i, \"v\" x ($i % 17), {a => $i}] } \
        my $s = 0; for my $k (sort keys %h) { $s += $h{$k}[0] } print \"$s\\n\"";
    let s = same_as_native("24M", &["perl", "-e", prog], &d);
    assert!(compressed(&s) > 10_000, "perl under 24M compressed {} pages", compressed(&s));
}

/// PHP with Debian's default extensions, which it opens with
/// `RTLD_DEEPBIND` (`tokenizer`, `pdo` and `phar` free blocks the
/// interpreter allocated): it aborted at start-up ("free(): invalid
/// pointer") at any budget before `dlopen` took that flag off.
#[test]
fn php_with_its_default_extensions() {
    require("php");
    let d = tmp("php");
    let prog = "$a = []; for ($i = 0; $i < 200000; $i++) { $a[\"k$i\"] = str_repeat(\"x\", $i % 40) . $i; } \
        ksort($a); echo count($a), \" \", strlen(implode(\",\", $a)), \" \", md5(serialize($a)), \"\\n\";";
    let s = same_as_native("16M", &["php", "-r", prog], &d);
    assert!(compressed(&s) > 5_000, "php under 16M compressed {} pages", compressed(&s));
}

/// Ruby: its own heap of object slots (pages of its own, from
/// `posix_memalign`) under a mark-and-sweep collector, and strings and
/// hash tables from `malloc`.
#[test]
fn ruby_hash_of_records() {
    require("ruby");
    let d = tmp("ruby");
    let prog = "h = {}; 150_000.times { |i| h[\"key#{i}\"] = [i, \"v\" * (i % 40)] }; s = 0; \
        h.keys.sort.each { |k| s = (s * 31 + k.size + h[k][0]) % 1_000_000_007 }; puts \"#{s} #{h.size}\"";
    let s = same_as_native("16M", &["ruby", "-e", prog], &d);
    assert!(compressed(&s) > 10_000, "ruby under 16M compressed {} pages", compressed(&s));
}

/// Guile: the Boehm-Demers-Weiser collector, conservative (every word
/// that looks like a pointer into its heap is followed), which marks the
/// whole heap in no order from the main thread and a marker thread of
/// its own: at about a third of its peak, most pages it reads are out.
#[test]
fn guile_with_its_conservative_collector() {
    require("guile");
    let d = tmp("guile");
    let prog = "(define h (make-hash-table)) \
        (let loop ((i 0)) (when (< i 60000) \
          (hash-set! h (string-append \"k\" (number->string i)) (list i (make-string (modulo i 30) #\\x))) \
          (loop (+ i 1)))) \
        (define s 0) \
        (hash-for-each (lambda (k v) (set! s (modulo (+ (* s 31) (string-length k) (car v)) 1000000007))) h) \
        (gc) (display (hash-count (const #t) h)) (display \" \") (display s) (newline)";
    let s = same_as_native("10M", &["guile", "--no-auto-compile", "-c", prog], &d);
    assert!(compressed(&s) > 10_000, "guile under 10M compressed {} pages", compressed(&s));
}

/// A pipeline whose two `xz` processes (one compressing, one
/// decompressing what it wrote) are each managed; the digest of the
/// round trip is the output compared.
#[test]
fn xz_pipeline() {
    require("xz");
    require("sha256sum");
    let d = tmp("xz");
    let s = same_as_native("8M", &["sh", "-c", "seq 1 600000 | xz -3 -T1 | xz -d | sha256sum"], &d);
    assert!(s["processes"].as_u64().unwrap() >= 2, "xz pipeline: {} processes managed", s["processes"]);
    assert!(compressed(&s) > 1000, "xz under 8M compressed {} pages", compressed(&s));
}

#[test]
fn gcc_compiles_through_cc1() {
    require("gcc");
    let d = tmp("gcc");
    let mut src = String::from("#include <stdio.h>\n");
    // 500 functions: cc1 peaks at ~90 MB (5 s natively here).
    for i in 0..500 {
        src.push_str(&format!(
            "int f{i}(int x) {{ int a[16]; for (int k = 0; k < 16; k++) a[k] = x * k + {i}; \
             int s = 0; for (int k = 0; k < 16; k++) s += a[k] ^ (s << 1); return s; }}\n"
        ));
    }
    src.push_str("int main(void) { long s = 0;\n");
    for i in 0..500 {
        src.push_str(&format!("s += f{i}({i});\n"));
    }
    src.push_str("printf(\"%ld\\n\", s); return 0; }\n");
    std::fs::write(d.join("big.c"), src).unwrap();
    let n = native(&["gcc", "-O2", "-c", "big.c", "-o", "native.o"], &d);
    assert!(n.status.success(), "{}", String::from_utf8_lossy(&n.stderr));
    let (m, s) = managed("16M", &["gcc", "-O2", "-c", "big.c", "-o", "managed.o"], &d);
    assert!(m.status.success(), "{}", String::from_utf8_lossy(&m.stderr));
    assert!(
        std::fs::read(d.join("native.o")).unwrap() == std::fs::read(d.join("managed.o")).unwrap(),
        "object files differ"
    );
    assert!(s["processes"].as_u64().unwrap() >= 2, "gcc, cc1 and as are all managed: {}", s["processes"]);
    assert!(compressed(&s) > 1000, "cc1 under 16M compressed {} pages", compressed(&s));
}

#[test]
fn node_script() {
    require("node");
    let d = tmp("node");
    let js = "let a = []; for (let i = 0; i < 1e6; i++) a.push({i, s: 'x' + i}); \
              const m = new Map(a.map(o => [o.s, o.i])); let t = 0; for (const [k, v] of m) t += k.length + v; \
              console.log(a.length, m.size, t);";
    // V8 reserves its heap (PROT_NONE, at random address hints) and commits
    // and decommits parts with mprotect, MAP_FIXED and MADV_DONTNEED, and
    // gives guard pages back inside code it made executable: all of it must
    // stay correct while the heap (about 290 MB natively) is compressed.
    let s = same_as_native("128M", &["node", "-e", js], &d);
    assert!(compressed(&s) > 20000, "node's heap under 128M: {} compressions", compressed(&s));
}

#[test]
fn java_program() {
    require("java");
    require("javac");
    let d = tmp("java");
    std::fs::write(
        d.join("Big.java"),
        "import java.util.*;\npublic class Big { public static void main(String[] a) {\n\
         HashMap<Integer, String> m = new HashMap<>(); for (int i = 0; i < 500000; i++) m.put(i, \"v\" + i);\n\
         long t = 0; for (String s : m.values()) t += s.length(); System.out.println(m.size() + \" \" + t); } }\n",
    )
    .unwrap();
    // HotSpot hints at addresses for its heap (zero-based compressed
    // pointers), takes what the arena gives, and its heap is compressed.
    let s = same_as_native("64M", &["java", "-Xmx512m", "Big.java"], &d);
    assert!(compressed(&s) > 5000, "the JVM's heap under 64M: {} compressions", compressed(&s));
    // ZGC reserves its heap's address space where it asks or not at all
    // (it failed to start: `cli_run_modes::mappings_at_the_address_asked_for`).
    // Its heap is shared memory, which stays the kernel's.
    same_as_native("64M", &["java", "-XX:+UseZGC", "-Xmx512m", "Big.java"], &d);
}

/// As an unprivileged user gets it (`UFFD_USER_MODE_ONLY`, forced with
/// `ZTIER_UFFD_USER_MODE_ONLY=1`), system calls whose memory lies in
/// evicted pages: without syscall user dispatch each would fail with
/// EFAULT (the kernel's own faults are not reported in that mode).
#[test]
fn system_calls_on_evicted_memory_in_user_mode_only() {
    let d = tmp("syscalls");
    let exe = compile(&d, "syscalls");
    let dir = d.to_string_lossy().into_owned();
    let n = native(&[&exe, &dir], &d);
    assert!(n.status.success(), "{}", String::from_utf8_lossy(&n.stderr));
    let stats = d.join("umo.json");
    let m = Command::new(ztier())
        .args(["run", "--budget", "16M", "--stats"])
        .arg(&stats)
        .args(["--", &exe, &dir])
        .env("ZTIER_UFFD_USER_MODE_ONLY", "1")
        .current_dir(&d)
        .output()
        .unwrap();
    assert!(m.status.success(), "stderr: {}", String::from_utf8_lossy(&m.stderr));
    assert_eq!(String::from_utf8_lossy(&m.stdout), String::from_utf8_lossy(&n.stdout));
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    let parent = &s["per_process"][0];
    assert_eq!(parent["user_mode_only"].as_bool(), Some(true), "{parent}");
    // The calls' buffers were evicted: brought back for the calls, not
    // by faults (32 MiB written, 32 MiB read into, iovecs, paths, argv).
    assert!(s["pinned_calls"].as_u64().unwrap() >= 8, "{s}");
    assert!(s["pinned_in"].as_u64().unwrap() >= 4096, "{s}");
    assert!(compressed(&s) > 20000, "{s}");
}

/// `--fault-path signal`: faults served in the faulting thread from a
/// SIGBUS handler of ztier's. A program with signal handling of its own
/// (`signals.c`: its own SIGBUS handler, installed before ztier starts,
/// gets a real SIGBUS and leaves by siglongjmp; every signal blocked
/// while evicted memory is read; a handler blocking every signal reads
/// evicted memory; a thread with every signal blocked) gives the native
/// output, in both fault paths and with `auto` (the default: `signal`
/// under a user-mode-only userfaultfd, `thread` otherwise); and system
/// calls on evicted memory work (caught first, as in user-mode-only mode).
#[test]
fn faults_served_in_the_faulting_thread() {
    let d = tmp("signal-path");
    let dir = d.to_string_lossy().into_owned();
    let exe = compile(&d, "signals");
    let n = native(&[&exe, &dir], &d);
    assert!(n.status.success(), "{}", String::from_utf8_lossy(&n.stderr));
    assert!(String::from_utf8_lossy(&n.stdout).contains("SIGBUS handler ran 1 time"));
    for asked in ["thread", "signal", "auto"] {
        let (m, s) = managed_with("16M", &["--fault-path", asked], &[&exe, &dir], &d);
        assert!(m.status.success(), "{asked}: {m:?}");
        assert_eq!(String::from_utf8_lossy(&m.stdout), String::from_utf8_lossy(&n.stdout), "{asked}");
        // auto: the faulting thread where system calls are caught anyway
        // (a user-mode-only userfaultfd), the handler thread otherwise.
        let umo = s["per_process"][0]["user_mode_only"] == true;
        let path = match asked {
            "auto" if umo => "signal",
            "auto" => "thread",
            _ => asked,
        };
        assert_eq!(s["fault_path"], path, "{asked}: {s}");
        assert_eq!(s["per_process"][0]["fault_path"], path, "{asked}: {s}");
        assert!(compressed(&s) > 20000 && s["faults"].as_u64().unwrap() > 1000, "{path}: {s}");
        assert!(s["peak_resident_bytes"].as_u64().unwrap() <= 16 << 20, "{s}");
    }
    let exe = compile(&d, "syscalls");
    let n = native(&[&exe, &dir], &d);
    let (m, s) = managed_with("16M", &["--fault-path", "signal"], &[&exe, &dir], &d);
    assert!(m.status.success(), "{m:?}");
    assert_eq!(String::from_utf8_lossy(&m.stdout), String::from_utf8_lossy(&n.stdout));
    assert!(s["pinned_calls"].as_u64().unwrap() >= 8 && s["pinned_in"].as_u64().unwrap() >= 4096, "{s}");
}

/// A `dup2` onto a descriptor the library keeps is refused (`EBADF`),
/// said once, and the program goes on.
#[test]
fn dup2_onto_a_library_descriptor_is_refused() {
    require("python3");
    let d = tmp("dup2-kept");
    // The library's descriptors: from 960 under the usual limit of 1024
    // descriptors (see the library's `fds`), at least its userfaultfd,
    // eventfd and control socket; not listed in /proc/self/fd (see
    // `the_librarys_descriptors_are_not_the_programs_to_see`), so each
    // number there is tried: a free one is taken (and closed again).
    let script = "import os\n\
                  x = [bytearray(4096) for i in range(5000)]\n\
                  bad = taken = 0\n\
                  for f in range(960, 1024):\n\
                  \x20   try:\n\
                  \x20       os.dup2(0, f); os.close(f); taken += 1\n\
                  \x20   except OSError as e:\n\
                  \x20       bad += e.errno == 9\n\
                  print(bad >= 3, bad + taken == 64)\n";
    let (o, s) = managed_with("8M", &[], &["python3", "-c", script], &d);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "True True\n", "{err}");
    // Said in the notices, the program's stderr left alone.
    let said = notices(&s);
    assert_eq!(said.matches("which ztier's library uses: refused (EBADF)").count(), 1, "{said}");
    assert!(err.is_empty(), "{err}");
}

/// Faults from threads on other CPUs than the main thread's start a
/// fault handler on each other CPU (with one, each such fault crossed
/// CPUs twice: `examples/workloads/threads.py`, 400 Python threads under
/// 16M, took 10.6× native, against 5.1× with them); a single-threaded
/// program keeps one (a second made it 1.20× slower). The threads of
/// `threads pin` bind themselves to every CPU in turn, so half are bound
/// to the handler's CPU and half of the faults come from elsewhere; and
/// they fault ~45 k times, 11 of the library's windows of 4,096 faults.
/// With ~7 k (one window), CI once saw one handler, as did 1 run in 12
/// here with a busy loop on the other CPU (0 in 12 at ~45 k): one window
/// can sample too few of the threads away from the handler, which fault
/// more slowly (across CPUs, and on a busy one).
/// (When the handler read the CPU each thread last ran on, `threads.py`'s
/// threads, left to the scheduler, were once all kept on one CPU while a
/// test beside this one kept the other busy, and CI saw one handler.)
/// The thread path only: with `--fault-path signal` each thread serves
/// its own faults.
#[test]
fn faults_from_other_cpus_get_a_handler_there() {
    require("python3");
    let d = tmp("spread");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(cpus >= 2, "this test needs two CPUs (the machine has {cpus})");
    let threads = compile(&d, "threads");
    let pyapp = pyapp_path();
    let runs: [(&[&str], bool); 2] =
        [(&[&threads, "pin"], true), (&["python3", pyapp.to_str().unwrap(), "50000"], false)];
    for (cmd, many) in runs {
        let n = native(cmd, &d);
        assert!(n.status.success());
        let (o, v) = managed_with("16M", &["--fault-path", "thread"], cmd, &d);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(o.stdout == n.stdout, "{cmd:?}: output differs from the native run");
        let p = &v["per_process"][0];
        let handlers = p["handlers"].as_u64().unwrap();
        if many {
            assert!(handlers >= 2, "threads pin: one handler only: {p}");
        } else {
            assert_eq!(handlers, 1, "pyapp.py: {p}");
        }
    }
}

/// The same for real: an unprivileged user (`nobody`, when the tests run
/// as root) sorts a file larger than the budget. Before dispatch, sort's
/// reads into evicted buffers failed ("read failed: Bad address"). Its
/// faults are served in the faulting thread unless another path is asked.
#[test]
fn sort_as_an_unprivileged_user() {
    require("sort");
    // SAFETY: getuid has no preconditions.
    let root = unsafe { libc::getuid() } == 0;
    if root {
        require("runuser");
    }
    let d = tmp("sort-unprivileged");
    let text = lines(2463534242, 300_000, |x, i| format!("{x:016x} {i}\n"));
    std::fs::write(d.join("in.txt"), text).unwrap();
    let out = d.join("out");
    std::fs::create_dir_all(&out).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).unwrap();
    let stats = out.join("stats.json");
    let run: Vec<String> =
        ["run", "--budget", "8M", "--stats", &stats.to_string_lossy(), "--", "sort", "in.txt"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    let mut cmd = if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "nobody", "--", ztier()]);
        c
    } else {
        Command::new(ztier())
    };
    let m = cmd.args(&run).current_dir(&d).output().unwrap();
    let n = native(&["sort", "in.txt"], &d);
    assert!(m.status.success(), "stderr: {}", String::from_utf8_lossy(&m.stderr));
    assert!(m.stdout == n.stdout, "sorted output differs from the native run");
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    let p = &s["per_process"][0];
    // As root the syscall opens full mode, so this is the unprivileged path.
    let umo = p["user_mode_only"].as_bool() == Some(true);
    if std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").is_ok_and(|v| v.trim() == "0") {
        assert!(umo, "{p}");
    }
    if umo {
        assert!(s["pinned_calls"].as_u64().unwrap() > 0, "{s}");
        // The default path (auto) there is the faulting thread's: system
        // calls are caught with either.
        if std::env::var_os("ZTIER_FAULT_PATH").is_none() {
            assert_eq!(p["fault_path"], "signal", "{p}");
        }
    }
    assert!(compressed(&s) > 1000, "{s}");
    assert!(p["peak_resident_bytes"].as_u64().unwrap() <= 8 << 20, "{p}");
}

#[test]
fn multi_threaded_program() {
    let d = tmp("threads");
    let exe = compile(&d, "threads");
    let s = same_as_native("24M", &[&exe], &d);
    assert!(compressed(&s) > 10000, "4 × 24 MiB under 24M compressed {} pages", compressed(&s));
}

#[test]
fn new_threads_keep_their_dtv_out_of_the_arena() {
    // glibc allocates a new thread's DTV with calloc inside
    // pthread_create; the library reads it (every thread-local access)
    // while holding the manager's lock, so from the arena it could be
    // evicted and deadlock the handler (multi_threaded_program hung 1 run
    // in 10-15 that way). Two of the threads are made by glibc's own
    // pthread_create, not through the library's: what the dynamic linker
    // allocates goes to glibc whoever made the thread (before, theirs was
    // in the arena, and a forked child hung on it).
    let d = tmp("dtv");
    let exe = compile(&d, "dtv");
    let (m, _) = managed("16M", &[&exe], &d);
    assert!(m.status.success(), "{}", String::from_utf8_lossy(&m.stderr));
    assert!(String::from_utf8_lossy(&m.stderr).contains("arena: found"), "the program must see the arena");
    assert!(m.stdout == native(&[&exe], &d).stdout, "{}", String::from_utf8_lossy(&m.stdout));
}

#[test]
fn writers_next_to_pages_being_evicted_lose_nothing() {
    // Victims are write-protected in spans that take in their resident
    // neighbours (unprotected again at once); here the other thread is
    // writing those neighbours all the time.
    let d = tmp("writers");
    let exe = compile(&d, "writers");
    let s = same_as_native("16M", &[&exe], &d);
    let (comp, calls) = (compressed(&s), s["wp_calls"].as_u64().unwrap());
    assert!(comp > 20000, "48 MiB written 6 times under 16M: {comp} compressions");
    assert!(calls > 0 && calls * 2 < comp, "{calls} write-protect calls for {comp} compressions");
}

#[test]
fn the_store_allocator_can_be_chosen() {
    // The allocators of `ztier bench store` hold the compressed pages of
    // a run: same output, and the per-process statistics name the one used.
    let d = tmp("allocator");
    let exe = compile(&d, "loop");
    let want = native(&[&exe], &d).stdout;
    let mut stored = Vec::new();
    for a in ["chunks", "cells4", "classes"] {
        let (o, s) = managed_with("32M", &["--allocator", a], &[&exe], &d);
        assert!(
            o.status.success() && o.stdout == want,
            "--allocator {a}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let p = &s["per_process"][0];
        assert_eq!(p["allocator"].as_str(), Some(a), "{p}");
        assert!(compressed(&s) > 10000, "--allocator {a}: {} compressions", compressed(&s));
        stored.push(s["stored_bytes"].as_u64().unwrap());
    }
    // Different allocators round and pack differently.
    assert!(stored[0] != stored[2] || stored[1] != stored[2], "stored bytes {stored:?}");
}

#[test]
fn fork_with_and_without_exec() {
    let d = tmp("forks");
    let exe = compile(&d, "forks");
    // The budget holds in every process, across the forks too (before,
    // the 48 MiB heap came back whole for each fork).
    // The exec'd program allocates 8 MiB: a process starts the library
    // only once it has asked for 1 MiB.
    let exec: &[&str] = &["python3", "-c", "print('hello from exec', len(bytearray(8 << 20)))"];
    let cmd: Vec<&str> = [exe.as_str()].into_iter().chain(exec.iter().copied()).collect();
    let s = same_as_native("16M", &cmd, &d);
    let parent = &s["per_process"][0];
    assert_eq!(parent["forks"].as_u64(), Some(2), "{parent}");
    for p in s["per_process"].as_array().unwrap() {
        assert!(
            p["resident_bytes"].as_u64().unwrap() <= 16 << 20,
            "back within the budget after the forks: {p}"
        );
    }
    let out = native(&cmd, &d);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("child: ok") && text.contains("parent: ok") && text.contains("hello from exec"),
        "{text}"
    );
    assert!(
        s["processes"].as_u64().unwrap() >= 3,
        "parent, forked child and exec'd python3: {}",
        s["processes"]
    );
    assert!(compressed(&s) > 5000);
}

/// Runs `cmd` under `ztier run --budget budget --stats` in a process
/// group of its own; after `secs` seconds the whole group is killed and
/// `None` returned (the program hung); else its output and merged stats.
fn managed_within(budget: &str, secs: u64, cmd: &[&str], dir: &Path) -> Option<(Output, serde_json::Value)> {
    use std::os::unix::process::CommandExt;
    let stats = dir.join(format!("stats-{}.json", cmd[0].replace('/', "_")));
    let child = Command::new(ztier())
        .args(["run", "--budget", budget, "--stats"])
        .arg(&stats)
        .arg("--")
        .args(cmd)
        .current_dir(dir)
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pgid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(std::time::Duration::from_secs(secs)) {
        Ok(out) => {
            let out = out.unwrap();
            let s = std::fs::read_to_string(&stats).unwrap_or_else(|e| {
                panic!("no stats ({e}); stderr: {}", String::from_utf8_lossy(&out.stderr))
            });
            Some((out, serde_json::from_str(&s).unwrap()))
        }
        Err(_) => {
            // SAFETY: kill has no memory preconditions; the group is the
            // one made for this run.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
            None
        }
    }
}

/// A process ends when its last thread ends, whichever thread that is,
/// with the library's threads still running: glibc ends the process
/// when the last thread it counts leaves, and counted the library's,
/// which never end. CPython's `test_threading` forks from a thread
/// other than the main one; the child's only thread returns from its
/// function, and the child stayed a zombie leader with the library's
/// three threads while its parent polled for it for ever
/// (`test_main_thread_after_fork_from_nonmain_thread`). `lastthread.c`
/// does that, then its main thread leaves by `pthread_exit` before its
/// last thread: both processes end with status 0 (and write their
/// statistics: the last thread's `exit(0)` runs the exit handlers), the
/// heap read right, at a budget under it. The same in Python.
#[test]
fn a_process_ends_with_its_last_thread_even_a_forked_one() {
    let d = tmp("lastthread");
    let exe = compile(&d, "lastthread");
    let py = "import os, threading, sys, time\n\
              data = [bytes([i % 251]) * 4096 for i in range(12000)]\n\
              def func():\n\
              \x20   pid = os.fork()\n\
              \x20   if pid == 0:\n\
              \x20       print(threading.main_thread().name, sum(b[7] for b in data)); sys.stdout.flush()\n\
              \x20   else:\n\
              \x20       for _ in range(3000):\n\
              \x20           p, status = os.waitpid(pid, os.WNOHANG)\n\
              \x20           if p:\n\
              \x20               print('child ended', os.waitstatus_to_exitcode(status)); break\n\
              \x20           time.sleep(0.01)\n\
              \x20       else:\n\
              \x20           print('child still running after 30 s'); os.kill(pid, 9)\n\
              th = threading.Thread(target=func); th.start(); th.join(); print('done')\n";
    std::fs::write(d.join("lastthread.py"), py).unwrap();
    for cmd in [vec![exe.as_str()], vec!["python3", "lastthread.py"]] {
        let n = native(&cmd, &d);
        assert!(n.status.success(), "native {cmd:?}: {n:?}");
        let text = String::from_utf8_lossy(&n.stdout);
        assert!(text.contains("ended, status 0") || text.contains("child ended 0"), "{text}");
        let Some((m, s)) = managed_within("16M", 90, &cmd, &d) else {
            panic!("{cmd:?} under ztier run still running after 90 s (native: {text})")
        };
        assert_eq!(m.status.code(), Some(0), "{cmd:?}: {}", String::from_utf8_lossy(&m.stderr));
        assert_eq!(String::from_utf8_lossy(&m.stdout), text, "{cmd:?}");
        let procs = s["per_process"].as_array().unwrap();
        assert!(
            procs.len() >= 2 && procs.iter().filter(|p| p["forked_child"] == 1).count() == 1,
            "{cmd:?}: the parent and its forked child each counted: {s}"
        );
        assert!(compressed(&s) > 1000, "{cmd:?}: {} pages compressed", compressed(&s));
    }
}

/// Blocks glibc allocates for itself and touches inside `fork` while the
/// library's fork handlers hold its lock (the NSS configuration's state,
/// a `fopen`ed `FILE`) are glibc's, never evicted: `libcstate.c` makes
/// both after its 64 MiB heap, pushes them out of the 16M budget before
/// each of 20 forks, and each child writes to the `FILE` and looks its
/// user up again. Before, the parent faulted inside `fork` with the lock
/// held and hung until the watchdog aborted it (CPython's `test_os`,
/// `test_waitpid`, hung for good: its faulthandler ran on the watchdog).
#[test]
fn glibcs_own_blocks_stay_resident_across_fork() {
    let d = tmp("libcstate");
    let exe = compile(&d, "libcstate");
    let n = native(&[&exe], &d);
    assert_eq!(String::from_utf8_lossy(&n.stdout), "forks 20, children ok 20, heap intact\n", "{n:?}");
    let Some((m, s)) = managed_within("16M", 90, &[&exe], &d) else { panic!("still running after 90 s") };
    assert!(m.status.success() && m.stdout == n.stdout, "{m:?}");
    assert_eq!(s["processes"].as_u64(), Some(21), "the parent and its 20 children: {s}");
    assert!(compressed(&s) > 5000, "{s}");
}

/// The program sees the descriptors it would see natively: the
/// library's own (userfaultfd, eventfd, control socket, statistics file,
/// the userfaultfd device), at 960 and up, are left out of its listings
/// of `/proc/self/fd`, `/dev/fd`, `/proc/self/fdinfo` and
/// `/proc/thread-self/fd` (by `readdir`, glibc's `getdents64` and the
/// raw call through `syscall(2)`, one record at a time), and a probe of
/// each number (`fstat`, `fstatat`, `statx`, `fcntl`, `dup`) or a
/// `close` of it fails as on a number never opened (`hidefds.c`). CPython's
/// `test_subprocess` (`test_pass_fds_redirected`) found the five in its
/// exec'd child. The heap, cold at 16M, still reads back after the
/// closes.
#[test]
fn the_librarys_descriptors_are_not_the_programs_to_see() {
    let d = tmp("hidefds");
    let exe = compile(&d, "hidefds");
    let s = same_as_native("16M", &[&exe], &d);
    let out = native(&[&exe], &d);
    let text = String::from_utf8_lossy(&out.stdout);
    // Natively none at 960 and up, where the library's go: the
    // comparison above would have seen them.
    let probed = text.lines().find_map(|l| l.strip_prefix("fstat:")).unwrap_or_else(|| panic!("{text}"));
    assert!(probed.split_whitespace().all(|f| f.parse::<u32>().unwrap() < 960), "{text}");
    assert!(text.contains("/proc/self/fd by readdir: 0 1 2") && text.contains("heap intact"), "{text}");
    assert!(compressed(&s) > 1000, "{} pages compressed", compressed(&s));
}

/// A program's stderr is its own: what ztier says about the run that the
/// program did not cause goes to the `--stats` file (`notices`), to
/// `--log FILE`, or to stderr only when asked (`--log -`, or with
/// `--summary` after the run). CPython's `test_bytes` asks for ~800 TB to
/// get a `MemoryError`, and "... MiB asked at once does not fit in the
/// arena" came out among its output; here a 512 PiB `bytearray`.
#[test]
fn notices_stay_out_of_the_programs_stderr_unless_asked() {
    require("python3");
    let d = tmp("notices");
    let cmd = [
        "python3",
        "-c",
        "x = [bytearray(4096) for i in range(4000)]\n\
         try:\n\
         \x20   bytearray(2 ** 59)\n\
         except MemoryError:\n\
         \x20   print('MemoryError')\n",
    ];
    let n = native(&cmd, &d);
    assert!(n.status.success() && n.stdout == b"MemoryError\n", "{n:?}");
    let said = "MiB asked at once does not fit in the arena";
    let log = d.join("ztier.log");
    std::fs::write(&log, "an earlier line\n").unwrap();
    for (opts, on_stderr) in [
        (vec![], false),
        (vec!["--log", log.to_str().unwrap()], false),
        (vec!["--log", "-"], true),
        (vec!["--summary"], true),
    ] {
        let (m, s) = managed_with("8M", &opts, &cmd, &d);
        let err = String::from_utf8_lossy(&m.stderr);
        assert!(m.status.success() && m.stdout == n.stdout, "{opts:?}: {m:?}");
        assert_eq!(err.matches(said).count(), usize::from(on_stderr), "{opts:?}: {err}");
        match opts.first().copied() {
            // Listed with the statistics, this run's only.
            None | Some("--log") if !on_stderr => {
                assert_eq!(s["notices"].as_array().map(Vec::len), Some(1), "{opts:?}: {s}");
                assert!(notices(&s).contains(said), "{opts:?}: {s}");
            }
            Some("--summary") => {
                assert!(err.find(said) < err.find("ztier run: exit 0"), "{err}");
                assert!(notices(&s).contains(said), "{opts:?}: {s}");
            }
            _ => assert!(s.get("notices").is_none(), "{opts:?}: {s}"),
        }
        assert!(compressed(&s) > 0, "{opts:?}: {s}");
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.starts_with("an earlier line\n") && text.matches(said).count() == 1, "{text}");
}

/// `--budget-scope tree`: the processes of a command share one budget,
/// as a memory cgroup's limit covers them all. Three forked workers that
/// run at once (`examples/workloads/workers.py`, ~25 MB of records each)
/// under 24M: with a budget each, they have more than 48 MiB resident
/// together; sharing it, the pages they hold together (counted in the
/// shared segment: at least their resident pages) stay within it. Then
/// worker 0 kills itself (SIGKILL) holding its pages: the others take
/// them back when the budget runs short, and the budget still holds.
/// Shared, the budget works no worse than split evenly.
#[test]
fn a_tree_budget_bounds_every_process_of_the_command_together() {
    let d = tmp("tree");
    let w = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/workloads/workers.py");
    let w = w.to_str().unwrap();
    let cmd = ["python3", w, "100000", "3"];
    let n = native(&cmd, &d);
    assert!(n.status.success(), "{}", String::from_utf8_lossy(&n.stderr));
    let (m, own) = managed_with("24M", &["--budget-scope", "process", "--summary"], &cmd, &d);
    assert!(m.status.success() && m.stdout == n.stdout, "{}", String::from_utf8_lossy(&m.stderr));
    assert_eq!(own["budget_scope"], "process");
    // --summary says what the budget bounded.
    let line = format!(
        "peak resident {:.1} MB (the most of its 4 processes) of the 25.2 MB budget each",
        own["peak_resident_bytes"].as_f64().unwrap() / 1e6
    );
    assert!(String::from_utf8_lossy(&m.stderr).contains(&line), "{line:?}: {m:?}");
    let together: u64 = own["per_process"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["peak_resident_bytes"].as_u64().unwrap())
        .sum();
    assert!(together > 48 << 20, "with a budget each, the workers hold more together: {together}");
    assert!(own.get("tree_peak_held_bytes").is_none(), "{own}");

    // The tree scope is the default. (Counting resident pages only, as
    // the budget of each process does: `--budget-covers resident`.)
    let (m, tree) = managed_with("24M", &["--summary", "--budget-covers", "resident"], &cmd, &d);
    assert!(m.status.success() && m.stdout == n.stdout, "{}", String::from_utf8_lossy(&m.stderr));
    assert_eq!(tree["budget_scope"], "tree");
    let line = format!(
        "peak held by its 4 processes together {:.1} MB of the 25.2 MB budget (the most resident in one {:.1} MB)",
        tree["tree_peak_held_bytes"].as_f64().unwrap() / 1e6,
        tree["peak_resident_bytes"].as_f64().unwrap() / 1e6
    );
    assert!(String::from_utf8_lossy(&m.stderr).contains(&line), "{line:?}: {m:?}");
    // Past the budget only by pages taken when the process that needed
    // them had nothing it could evict at once (its resident pages all in
    // an eviction in flight or pinned): counted, and a few at most.
    let held = tree["tree_peak_held_bytes"].as_u64().unwrap();
    let over = tree["tree_over_bytes"].as_u64().unwrap();
    assert!(held <= (24 << 20) + over && held > 16 << 20, "held together at most: {held}: {tree}");
    assert!(over < 1 << 20, "{tree}");
    assert!(tree["tree_processes"].as_u64().unwrap() >= 4, "the parent and three workers: {tree}");
    assert!(compressed(&tree) > compressed(&own), "less memory, more compressed");
    // Sharing 24M works no more than a third of it each: the protected
    // segment a worker keeps follows its share down at once but up only
    // slowly. When it followed each passing surplus up, the pages that
    // came back into it (without their copies in the store) were
    // demoted and compressed again as the others took their share back:
    // 303 k pages compressed, against 196 k with 8M each. Since pages on
    // trial (segmented.rs) both come to ~200 k and either may be the
    // lower (214 k against 201 k once in ten runs of a build that passed
    // the rest): no worse than a tenth more, which still fails that bug.
    let (m, third) = managed_with("8M", &["--budget-scope", "process"], &cmd, &d);
    assert!(m.status.success() && m.stdout == n.stdout, "{}", String::from_utf8_lossy(&m.stderr));
    let (a, b) = (compressed(&tree), compressed(&third));
    assert!(a * 10 <= b * 11, "24M shared: {a} pages compressed, 8M each: {b}");

    let cmd = ["python3", w, "100000", "3", "kill"];
    let n = native(&cmd, &d);
    assert!(String::from_utf8_lossy(&n.stdout).contains("worker 0 ended by signal 9"));
    let (m, tree) = managed_with("24M", &[], &cmd, &d);
    assert!(m.status.success() && m.stdout == n.stdout, "{}", String::from_utf8_lossy(&m.stderr));
    assert!(tree["tree_reclaimed_bytes"].as_u64().unwrap() > 0, "the dead worker's pages came back: {tree}");
    let over = tree["tree_over_bytes"].as_u64().unwrap();
    assert!(over < 1 << 20, "{tree}");
    assert!(tree["tree_peak_held_bytes"].as_u64().unwrap() <= (24 << 20) + over, "{tree}");
}

/// `--budget` counts everything ztier holds for the command by default
/// (`--budget-covers all`): the resident pages of its processes, their
/// compressed stores and the library's tables together, as a memory
/// cgroup's limit charges zswap's pool; the stores may take up to 3/8 of
/// it with a next tier. Four processes of `workers.py` at 24M (with a spill folder, as the
/// kernel has its swap file) held less in all than counting resident
/// pages only (`--budget-covers resident`, the old meaning), whose
/// resident pages alone filled the budget. (~20 s.)
#[test]
fn the_budget_counts_the_stores_and_tables_too() {
    let d = tmp("covers-all");
    let spill = d.join("spill");
    std::fs::create_dir_all(&spill).unwrap();
    let spill = spill.to_str().unwrap();
    let w = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/workloads/workers.py");
    let cmd = ["python3", w.to_str().unwrap(), "100000", "3"];
    let n = native(&cmd, &d);
    assert!(n.status.success(), "{}", String::from_utf8_lossy(&n.stderr));
    let (m, all) = managed_with("24M", &["--summary", "--budget-covers", "all", "--spill", spill], &cmd, &d);
    assert!(m.status.success() && m.stdout == n.stdout, "{}", String::from_utf8_lossy(&m.stderr));
    assert_eq!(all["budget_covers"], "all");
    assert!(all["tree_processes"].as_u64().unwrap() >= 4, "{all}");
    assert_eq!(all["tree_over_bytes"], 0, "{all}");
    assert_eq!(all["tree_store_limit_bytes"], 9 << 20, "3/8 of the budget: {all}");
    let total = all["tree_peak_total_bytes"].as_u64().unwrap();
    assert!(all["tree_store_peak_bytes"].as_u64().unwrap() > 2 << 20, "the stores took part: {all}");
    let said = format!(
        "everything held (resident, stores, tables) at most {:.1} MB of the 25.2 MB budget",
        total as f64 / 1e6
    );
    assert!(String::from_utf8_lossy(&m.stderr).contains(&said), "{said:?}: {m:?}");
    // The old meaning: the resident pages alone fill the budget, the
    // stores come on top.
    let (m, res) = managed_with("24M", &["--budget-covers", "resident", "--spill", spill], &cmd, &d);
    assert!(m.status.success() && m.stdout == n.stdout, "{}", String::from_utf8_lossy(&m.stderr));
    assert_eq!(res["budget_covers"], "resident");
    let res_total = res["tree_peak_total_bytes"].as_u64().unwrap();
    assert!(res_total > (24 << 20) + (2 << 20), "resident {res_total}: {res}");
    assert!(res_total > total, "{res_total} against {total}");
    // Each process's own budget counts its resident pages only (a sizing
    // policy splits it between them and the store).
    let o = Command::new(ztier())
        .args(["run", "--budget", "24M", "--budget-scope", "process", "--budget-covers", "all", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--budget-covers all needs --budget-scope tree"),
        "{o:?}"
    );
    // A sizing policy counts resident pages and the stores: `resident`
    // would contradict it.
    let o = Command::new(ztier())
        .args(["run", "--budget", "24M", "--budget-covers", "resident", "--policy", "static:0.25"])
        .args(["--spill", "/tmp", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains("--budget-covers resident cannot be used with --policy static:0.25"),
        "{o:?}"
    );
}

/// The bound itself: everything held stays within the budget, but for
/// pages counted as over it and what a look at the shared counters finds
/// while another process is between two of its changes (a store's
/// growth said, the pages given back for it not yet: up to 44 KiB in
/// one run of three, docs/measurements/2026-12-07-peak-total.md). A store grows only into the room
/// the pages held, the other stores and the tables leave; past it, its
/// oldest pages go to the spill file first. Before, four `workers.py`
/// processes at 24M held 25.7-27.7 MB in all at their most (25.2 MB
/// budget, 11 runs): a forked child that evicted pages it did not hold
/// (shared with its parent, or adopted once its parent dropped them)
/// grew its store with nothing given back
/// (docs/measurements/2026-12-07-budget-all-2.md, -3.md).
#[test]
fn everything_held_stays_within_the_budget() {
    let d = tmp("covers-all-bound");
    let spill = d.join("spill");
    std::fs::create_dir_all(&spill).unwrap();
    let w = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/workloads/workers.py");
    let cmd = ["python3", w.to_str().unwrap(), "100000", "3"];
    let n = native(&cmd, &d);
    assert!(n.status.success(), "{}", String::from_utf8_lossy(&n.stderr));
    let (m, all) =
        managed_with("24M", &["--budget-covers", "all", "--spill", spill.to_str().unwrap()], &cmd, &d);
    assert!(m.status.success() && m.stdout == n.stdout, "{}", String::from_utf8_lossy(&m.stderr));
    let total = all["tree_peak_total_bytes"].as_u64().unwrap();
    let over = all["tree_over_bytes"].as_u64().unwrap();
    let processes = all["tree_processes"].as_u64().unwrap();
    assert!(total <= (24 << 20) + over + processes * (128 << 10), "held {total} bytes in all: {all}");
}

/// A process alone within the budget: everything held stays within it,
/// the library's tables included. They grow as a program first touches
/// memory (a page's state, eviction time and hash), and were said only
/// at the first eviction's commit, with nothing given back for them: a
/// program that fills a 16M budget and goes on (80 MB of bytes in
/// python3) held 126 KiB past it at the first eviction, with
/// `tree_over_bytes` 0. They are held for before the pages that grow
/// them are installed now, and said ahead of their use.
#[test]
fn a_first_fill_keeps_the_tables_within_the_budget() {
    let d = tmp("covers-all-tables");
    let spill = d.join("spill");
    std::fs::create_dir_all(&spill).unwrap();
    let cmd = ["python3", "-c", "a = b'x' * (40 << 20); b = bytes(a); print(len(a) + len(b))"];
    let (m, all) =
        managed_with("16M", &["--budget-covers", "all", "--spill", spill.to_str().unwrap()], &cmd, &d);
    assert!(m.status.success(), "{}", String::from_utf8_lossy(&m.stderr));
    assert_eq!(String::from_utf8_lossy(&m.stdout).trim(), "83886080");
    assert_eq!(all["tree_processes"], 1, "{all}");
    assert!(all["tree_peak_held_bytes"].as_u64().unwrap() > 15 << 20, "it filled the budget: {all}");
    let total = all["tree_peak_total_bytes"].as_u64().unwrap();
    let over = all["tree_over_bytes"].as_u64().unwrap();
    assert!(total <= (16 << 20) + over, "held {total} bytes in all, {over} counted over: {all}");
}

/// `--store` with the tree scope bounds the compressed stores of all the
/// command's processes together, as `--budget` bounds their resident
/// pages: three workers at `--store 6M` store 6M between them (the
/// oldest pages go to the spill file), where with a store each they
/// store 6M each.
#[test]
fn the_stores_of_the_command_share_one_store_limit() {
    let d = tmp("tree-store");
    let w = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/workloads/workers.py");
    let cmd = ["python3", w.to_str().unwrap(), "100000", "3"];
    let n = native(&cmd, &d);
    assert!(n.status.success(), "{}", String::from_utf8_lossy(&n.stderr));
    let spill = d.join("spill");
    std::fs::create_dir_all(&spill).unwrap();
    let spill = spill.to_str().unwrap();
    let store = 6u64 << 20;
    let (m, own) =
        managed_with("8M", &["--budget-scope", "process", "--store", "6M", "--spill", spill], &cmd, &d);
    assert!(m.status.success() && m.stdout == n.stdout, "{}", String::from_utf8_lossy(&m.stderr));
    let stores: Vec<u64> =
        own["per_process"].as_array().unwrap().iter().map(|p| p["stored_bytes"].as_u64().unwrap()).collect();
    assert!(stores.iter().sum::<u64>() > 2 * store, "a store each, more together: {stores:?}");
    assert!(own.get("tree_store_peak_bytes").is_none(), "{own}");

    let (m, tree) = managed_with("8M", &["--store", "6M", "--spill", spill, "--summary"], &cmd, &d);
    assert!(m.status.success() && m.stdout == n.stdout, "{}", String::from_utf8_lossy(&m.stderr));
    let peak = tree["tree_store_peak_bytes"].as_u64().unwrap();
    let line = format!("their stores together at most {:.1} MB of the 6.3 MB --store", peak as f64 / 1e6);
    assert!(String::from_utf8_lossy(&m.stderr).contains(&line), "{line:?}: {m:?}");
    // Each says what its store uses after an eviction round, and resizes
    // it when its share moved by a 32nd of the limit: a little over, at
    // most, for a moment.
    assert!(peak > store / 2 && peak <= store + store / 4, "the stores together at most {peak}: {tree}");
    let each = |k: &str| -> Vec<u64> {
        tree["per_process"].as_array().unwrap().iter().map(|p| p[k].as_u64().unwrap()).collect()
    };
    let spilled: u64 = each("spilled_bytes").iter().sum();
    assert!(spilled > 2 * store, "the rest went to the spill file: {spilled}: {tree}");
    let stores = each("stored_bytes");
    assert!(stores.iter().filter(|&&b| b > store / 16).count() >= 3, "each worker stored some: {stores:?}");
}

/// `--budget-scope tree` and `fork`: the pages a child inherits resident
/// are shared copy-on-write with its parent, which holds them, so they
/// count once. A child that only reads them evicts nothing for them
/// (before, it took a page of the shared budget for each at the fork,
/// and with the pool empty evicted them all first); one that writes
/// them gets pages of its own, which it then holds (`tree_adopted_bytes`).
/// The child closes every descriptor it does not know for a while, as a
/// shell's subshell does: the page map its manager reads stays open
/// (before, opened for each look at the lowest free number, it was
/// closed under the read, and the reading child took all 20 MiB as its
/// own: 23 MiB adopted, ~5 k pages compressed).
///
/// The writing child then waits (under `ztier run`) until the budget
/// was enforced: the anonymous memory it and its parent have resident
/// (`RssAnon`) down by 8 MiB (the two hold ~40 MiB of the data, the
/// budget is 32M). Before, it slept 0.3 s, and on a loaded machine (one
/// run in ~100) its evictor, which looks at its page map every 50 ms,
/// got no CPU for a second or more and the child exited with ~29 MiB
/// still counted as shared. And pages its evictor takes before a look found them its own
/// count as adopted (its page map is read before they are released):
/// before, they left uncounted, and 13-15.9 MiB were adopted.
#[test]
fn a_forked_child_holds_the_pages_it_shares_with_its_parent_once_they_are_its_own() {
    let d = tmp("tree-fork");
    std::fs::write(
        d.join("share.py"),
        "import os, sys, time\n\
         write = sys.argv[1] == 'write'\n\
         budget = 'ZTIER_BUDGET' in os.environ\n\
         def anon():\n\
         \x20   kib = 0\n\
         \x20   for p in ('self', os.getppid()):\n\
         \x20       with open('/proc/%s/status' % p) as f:\n\
         \x20           kib += next(int(l.split()[1]) for l in f if l.startswith('RssAnon:'))\n\
         \x20   return kib\n\
         data = bytearray(20 << 20)\n\
         for i in range(0, len(data), 4096):\n    data[i] = 1\n\
         r, w = os.pipe()\n\
         pid = os.fork()\n\
         if pid == 0:\n\
         \x20   s = sum(data[::4096])\n\
         \x20   t = time.time()\n\
         \x20   while time.time() - t < 0.3:\n\
         \x20       os.closerange(w + 1, 1024)\n\
         \x20   if write:\n\
         \x20       a0 = anon()\n\
         \x20       for i in range(0, len(data), 4096):\n            data[i] = 2\n\
         \x20       t = time.time()\n\
         \x20       while budget and anon() > a0 - (8 << 10) and time.time() - t < 20:\n\
         \x20           time.sleep(0.02)\n\
         \x20   os.write(w, str(s + sum(data[::4096])).encode())\n\
         \x20   os._exit(0)\n\
         os.close(w)\n\
         out = os.read(r, 100).decode()\n\
         os.waitpid(pid, 0)\n\
         print(out, sum(data[::4096]))\n",
    )
    .unwrap();
    for how in ["read", "write"] {
        let cmd = ["python3", "share.py", how];
        let n = native(&cmd, &d);
        assert!(n.status.success(), "{}", String::from_utf8_lossy(&n.stderr));
        let (m, s) = managed_with("32M", &[], &cmd, &d);
        assert!(m.status.success() && m.stdout == n.stdout, "{how}: {}", String::from_utf8_lossy(&m.stderr));
        let procs = s["per_process"].as_array().unwrap();
        let child = procs.iter().find(|p| p["forked_child"] == 1).unwrap_or_else(|| panic!("{s}"));
        let over = s["tree_over_bytes"].as_u64().unwrap();
        assert!(over < 1 << 20, "{how}: {s}");
        assert!(s["tree_peak_held_bytes"].as_u64().unwrap() <= (32 << 20) + over, "{how}: {s}");
        let adopted = s["tree_adopted_bytes"].as_u64().unwrap();
        if how == "read" {
            let c = child["pages_compressed"].as_u64().unwrap();
            assert!(c < 256, "a reading child evicted {c} pages: {child}");
            assert!(adopted < 4 << 20, "a reading child took over {adopted} bytes: {s}");
        } else {
            assert!(adopted >= 16 << 20, "the child wrote 20 MiB it shared, took over {adopted} bytes: {s}");
        }
    }
}

/// `--budget-scope tree`, measured by the kernel: a parent fills 48 MiB,
/// forks 16 children that read it, then sweeps 64 MiB of its own at
/// 48M, dropping its copies of pages the children still map. What the
/// command keeps resident of that memory (the proportional set size of
/// those mappings, summed over the 17 processes, so a shared page
/// counts once) stays within the budget. Before, a page the parent
/// dropped while two or more children mapped it counted nowhere (each
/// child took it for the parent's): 45-57 MiB in seven runs (of four
/// children), six of them over the budget.
///
/// And the pages taken past the budget (`tree_over_bytes`: a process
/// that needed pages had nothing of its own to evict and the others gave
/// none back in time) are a few at most. With four children, CI once
/// saw 341 (the limit was 256): a child whose pages had all gone took a
/// fault's whole run of up to 32 past the budget without asking the
/// others, and one whose resident pages were all in an eviction in
/// flight took over inherited ones it then had to take past it. With 16
/// children that was 1 to 68 pages in 7 runs of 20 here; now one page
/// per fault that finds nothing, 1 to 3 pages in 6 of 20.
#[test]
fn pages_children_share_after_their_parent_dropped_them_stay_within_the_budget() {
    let d = tmp("tree-shared");
    let prog = compile(&d, "sharedkids");
    let cmd = [prog.as_str(), "48", "64", "16"];
    let n = native(&cmd, &d);
    assert!(n.status.success(), "{}", String::from_utf8_lossy(&n.stderr));
    let (m, s) = managed_with("48M", &[], &cmd, &d);
    let err = String::from_utf8_lossy(&m.stderr);
    assert!(m.status.success() && m.stdout == n.stdout, "{err}");
    let kib: u64 = err.lines().find_map(|l| l.strip_prefix("pss_kib ")).expect("pss line").parse().unwrap();
    // The kernel's count lags the children's looks at their page maps
    // (every 50 ms) by a few pages at most.
    let tree =
        ["tree_peak_held_bytes", "tree_over_bytes", "tree_adopted_bytes"].map(|k| s[k].as_u64().unwrap());
    assert!(kib <= 49 * 1024, "{kib} KiB resident of the 48 MiB budget; held, over, adopted: {tree:?}");
    let each: Vec<_> = s["per_process"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| ["faults", "pages_compressed", "peak_resident_bytes", "tree_held_bytes"].map(|k| &p[k]))
        .collect();
    assert!(
        tree[1] < 64 << 12,
        "held, over, adopted: {tree:?}; each (faults, compressed, peak resident, held): {each:?}"
    );
}

#[test]
fn children_started_with_an_environment_of_their_own_are_managed_too() {
    let d = tmp("clean-env");
    // Each child holds 48 MiB at a 16M budget. Before, a child whose
    // environment its parent made (no LD_PRELOAD, no ZTIER_*) ran
    // unmanaged and silently outside the budget: only the parent was
    // in the statistics.
    let script = r#"
import os, subprocess, sys
code = "b = [bytes([i % 251]) * 4096 for i in range(12000)]; print('child', sum(x[0] for x in b), flush=True)"
child = [sys.executable, "-c", code]
subprocess.run(child, env={}, check=True)
subprocess.run(child, env={"LD_PRELOAD": "", "ZTIER_BUDGET": "16777216"}, check=True, close_fds=False)
pid = os.posix_spawn(child[0], child, {"A": "1"})
assert os.waitpid(pid, 0)[1] == 0
subprocess.run(["env", "-i", sys.executable, "-c", code], check=True)
print("parent done")
"#;
    std::fs::write(d.join("clean_env.py"), script).unwrap();
    let s = same_as_native("16M", &["python3", "clean_env.py"], &d);
    let children: Vec<&serde_json::Value> = s["per_process"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["pages_compressed"].as_u64().unwrap() > 5000)
        .collect();
    assert_eq!(
        children.len(),
        4,
        "subprocess env={{}}, LD_PRELOAD='', posix_spawn, env -i: {}",
        s["per_process"]
    );
}

#[test]
fn a_statically_linked_program_is_said_to_be_out_of_reach() {
    require("cc");
    let d = tmp("static");
    let src = d.join("st.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\nint main(void) { size_t n = 48 << 20; \
         char *p = malloc(n); memset(p, 1, n); long s = 0; for (size_t i = 0; i < n; i += 4096) s += p[i]; \
         printf(\"%ld\\n\", s); return 3; }\n",
    )
    .unwrap();
    let exe = d.join("st");
    let o = Command::new("cc").args(["-O2", "-static", "-o"]).arg(&exe).arg(&src).output().unwrap();
    assert!(o.status.success(), "cc -static (libc6-dev's libc.a): {}", String::from_utf8_lossy(&o.stderr));
    // A script whose interpreter is that program is judged by it.
    let script = d.join("st.sh");
    std::fs::write(&script, format!("#!{}\n", exe.display())).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    for cmd in [&exe, &script] {
        let cmd = cmd.to_str().unwrap();
        let n = native(&[cmd], &d);
        let (m, s) = managed("16M", &[cmd], &d);
        // It runs as natively, and the user is told that the budget
        // did not hold: before, nothing said so.
        assert_eq!((m.status.code(), &m.stdout), (n.status.code(), &n.stdout), "{cmd}");
        assert_eq!(m.status.code(), Some(3));
        let err = notices(&s);
        assert!(err.contains("st is statically linked") && err.contains("not managed"), "{cmd}: {err}");
        assert!(err.contains("went over the budget (16 MiB)"), "{cmd}: {err}");
        assert!(!String::from_utf8_lossy(&m.stderr).contains("ztier"), "{cmd}: {m:?}");
        assert_eq!(s["processes"].as_u64(), Some(0), "{s}");
    }
    // A dynamically linked program gets no such warning, nor one run by
    // the dynamic linker as a command (it has no PT_INTERP of its own,
    // and reads LD_PRELOAD for the program).
    let py = ["python3", "-c", "print(len(bytearray(48 << 20)))"];
    let by_ld = ["/lib64/ld-linux-x86-64.so.2", "/usr/bin/python3", "-c", py[2]];
    for cmd in [&py[..], &by_ld[..]] {
        let (m, s) = managed("16M", cmd, &d);
        assert!(m.status.success() && !String::from_utf8_lossy(&m.stderr).contains("warning"), "{m:?}");
        assert!(s["processes"].as_u64().unwrap() >= 1, "{cmd:?}: {s}");
    }
}

#[test]
fn the_library_starts_at_the_first_mib_and_takes_blocks_that_grow_past_it() {
    let d = tmp("late");
    // A process that asks for less than 1 MiB is never managed: no arena,
    // no threads, no statistics.
    let s = same_as_native("16M", &["sh", "-c", "echo small"], &d);
    assert_eq!(s["processes"].as_u64(), Some(0), "{s}");
    // A block malloc'ed before start-up (glibc's) that realloc grows to
    // 48 MiB, or an anonymous mapping made before start-up that mremap
    // grows, moves to the arena, and is evicted like any other.
    let exe = compile(&d, "late");
    for how in ["realloc", "mremap"] {
        let s = same_as_native("16M", &[&exe, how], &d);
        assert_eq!(s["processes"].as_u64(), Some(1), "{how}: {s}");
        assert!(
            compressed(&s) > 5000,
            "{how}: 48 MiB walked twice under 16M: {} compressions",
            compressed(&s)
        );
        // A walk: most of its store faults continue it (and prefetch).
        // Lone pages come after a stretch of more than 16 resident pages
        // (the protected segment's), where the walk is lost: ~19% when
        // measured.
        let (store, lone) = (s["store_faults"].as_u64().unwrap(), s["lone_faults"].as_u64().unwrap());
        assert!(store > 100 && lone * 3 < store, "{how}: {lone} lone of {store} store faults: {s}");
    }
}

#[test]
fn mmap_mremap_munmap_madvise() {
    let d = tmp("remap");
    let exe = compile(&d, "remap");
    let s = same_as_native("16M", &[&exe], &d);
    let text = String::from_utf8_lossy(&native(&[&exe], &d).stdout).into_owned();
    assert!(!text.contains("wrong"), "{text}");
    // mincore's view: of the last 64 MiB buffer, at most the budget is resident.
    let (m, _) = managed("16M", &[&exe], &d);
    let err = String::from_utf8_lossy(&m.stderr);
    let kib: u64 =
        err.lines().find_map(|l| l.strip_prefix("resident_kib ")).expect("resident line").parse().unwrap();
    assert!(kib <= 16 * 1024, "64 MiB buffer under a 16M budget: {kib} KiB resident");
    assert!(kib > 0);
    assert!(compressed(&s) > 5000);
}

/// Compiles `run_progs/NAME.c` and runs it natively and under `ztier run`
/// at `budget` with a 10 s watchdog (a hang fails the test in seconds):
/// exit status 0 and the same output; at most the budget resident.
fn watched_same_as_native(name: &str, budget: &str) -> serde_json::Value {
    let d = tmp(name);
    let exe = compile(&d, name);
    let (m, s) = managed_with(budget, &["--watchdog", "10"], &[&exe], &d);
    let n = native(&[&exe], &d);
    assert!(n.status.success(), "{}", String::from_utf8_lossy(&n.stdout));
    assert_eq!(m.status.code(), Some(0), "{}", String::from_utf8_lossy(&m.stderr));
    assert!(m.stdout == n.stdout, "{}", String::from_utf8_lossy(&m.stdout));
    assert!(s["peak_resident_bytes"].as_u64().unwrap() <= budget_bytes(budget), "{s}");
    s
}

#[test]
fn releasing_and_protecting_pages_while_they_are_evicted() {
    // The evictor reads and releases its victims without the manager's
    // lock; here the program gives back (munmap, MADV_DONTNEED) or
    // protects exactly those pages, the oldest, over and over. (Before
    // the fix: a hang — the evictor faulted on a released victim whose
    // fault waited for the evictor — or a crash reading a PROT_NONE one.)
    let s = watched_same_as_native("churn", "16M");
    assert!(compressed(&s) > 50_000, "1500 MiB written under 16M: {} compressions", compressed(&s));
}

#[test]
fn reservations_over_freed_pages_that_are_being_evicted() {
    // A fault's run of zero pages can reach free pages behind the block
    // it faults in, and those become victims like any resident page. A
    // PROT_NONE reservation (V8's and the JVM's way to get address space)
    // that reuses them made them unreadable while the evictor read them:
    // the evictor crashed (node under 128M, about 1 run in 30 when the
    // machine was busy; this program every time before the fix).
    let s = watched_same_as_native("reserve", "8M");
    assert!(compressed(&s) > 100_000, "2 GiB written under 8M: {} compressions", compressed(&s));
}

#[test]
fn cyclic_reuse_larger_than_the_budget_keeps_a_protected_part() {
    // 64 MiB read 8 times in one shuffled order under 32M: oldest-first
    // eviction faults on every page of every pass (128k store faults when
    // measured); the protected segment keeps most of the budget resident
    // across passes, so only the rest cycles.
    let d = tmp("loop");
    let exe = compile(&d, "loop");
    let s = same_as_native("32M", &[&exe], &d);
    let pages_in = s["store_faults"].as_u64().unwrap() + s["prefetched"].as_u64().unwrap();
    let every_page_every_pass = 8 * 64 * 256;
    assert!(
        pages_in * 4 < every_page_every_pass * 3,
        "{pages_in} pages came back from the store over 8 passes of 16384 pages"
    );
    assert!(pages_in > 8 * 64 * 256 / 4, "the loop does not fit: it must fault ({pages_in})");
    // Pages in a shuffled order: no walk, so (nearly) every store fault
    // is a lone page.
    let (store, lone) = (s["store_faults"].as_u64().unwrap(), s["lone_faults"].as_u64().unwrap());
    assert!(lone * 10 >= store * 9 && lone <= store, "{lone} lone of {store} store faults");
    assert!(s["demoted"].as_u64().unwrap() > 0, "the protected segment ages: {s}");
    // Each pass needs the pages aged out of the protected segment again:
    // those demotions are regretted, and aging slows down.
    let p = &s["per_process"][0];
    assert!(s["regretted"].as_u64().unwrap() * 2 > s["demoted"].as_u64().unwrap(), "{s}");
    assert_eq!(p["age_every"].as_u64(), Some(256), "aging slowed down for a loop: {p}");
    // By default (--clean verify) the pages that cycle through probation
    // keep their compressed copy; the passes only read, so at eviction
    // their hash matches and they go out again without compression.
    let (clean, comp) = (s["clean_evicted"].as_u64().unwrap(), compressed(&s));
    assert!(clean > 2 * comp, "verify: clean evictions {clean}, compressions {comp}");
    assert_eq!(s["dirtied"].as_u64(), Some(0), "nothing was written after the first pass");
    // --clean off: every eviction compresses.
    let (o, s) = managed_with("32M", &["--clean", "off"], &[&exe], &d);
    assert!(o.status.success() && o.stdout == native(&[&exe], &d).stdout);
    assert_eq!(s["clean_evicted"].as_u64(), Some(0));
    assert!(compressed(&s) > pages_in, "{} compressions", compressed(&s));
    // --clean wp: pages come back write-protected with their compressed
    // copy kept and go out again without compression.
    let (o, s) = managed_with("32M", &["--clean", "wp"], &[&exe], &d);
    assert!(o.status.success() && o.stdout == native(&[&exe], &d).stdout);
    let (clean, comp) = (s["clean_evicted"].as_u64().unwrap(), compressed(&s));
    assert!(clean > 2 * comp, "wp: clean evictions {clean}, compressions {comp}");
    assert_eq!(s["dirtied"].as_u64(), Some(0), "nothing was written after the first pass");
    assert!(s["peak_resident_bytes"].as_u64().unwrap() <= 32 << 20);
}

/// One row of a `--fault-log` file.
struct LogRow {
    t_ns: u64,
    kind: String,
    addr: u64,
    pages: u64,
    distance: Option<u64>,
    evictions: u64,
    hot: bool,
}

fn read_fault_log(path: &Path) -> Vec<LogRow> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("t_ns,kind,addr,pages,distance,evictions,hot,service_ns"));
    lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            assert_eq!(f.len(), 8, "{l}");
            let n = |s: &str| s.parse::<u64>().unwrap_or_else(|e| panic!("{l}: {e}"));
            f[7].parse::<u32>().unwrap_or_else(|e| panic!("{l}: service_ns: {e}"));
            LogRow {
                t_ns: n(f[0]),
                kind: f[1].to_string(),
                addr: u64::from_str_radix(f[2].trim_start_matches("0x"), 16).unwrap(),
                pages: n(f[3]),
                distance: (!f[4].is_empty()).then(|| n(f[4])),
                evictions: n(f[5]),
                hot: match f[6] {
                    "0" => false,
                    "1" => true,
                    h => panic!("{l}: hot {h}"),
                },
            }
        })
        .collect()
}

/// The rows of a process's fault log agree with its statistics.
fn fault_log_agrees(rows: &[LogRow], p: &serde_json::Value) {
    let stat = |k: &str| p[k].as_u64().unwrap_or_else(|| panic!("{k} in {p}"));
    fn of<'a>(rows: &'a [LogRow], kind: &'a str) -> impl Iterator<Item = &'a LogRow> + 'a {
        rows.iter().filter(move |r| r.kind == kind)
    }
    let of = |kind: &'static str| of(rows, kind);
    assert_eq!(of("store").count() as u64, stat("store_faults"), "{p}");
    assert_eq!(of("store").map(|r| r.pages).sum::<u64>(), stat("store_faults") + stat("prefetched"));
    assert_eq!(of("zero").count() as u64 + of("lost").count() as u64, stat("zero_faults"));
    assert_eq!(of("deferred").count() as u64, stat("deferred"));
    assert_eq!(of("pin").filter(|r| r.distance.is_some()).map(|r| r.pages).sum::<u64>(), stat("pinned_in"));
    assert!(rows.windows(2).all(|w| w[0].t_ns <= w[1].t_ns), "rows are in service order");
    assert!(rows.windows(2).all(|w| w[0].evictions <= w[1].evictions), "the eviction clock only grows");
    assert!(rows.iter().all(|r| r.addr % 4096 == 0 && r.addr != 0));
    // A stored page joins the protected segment when it comes back within
    // the hot distance, which adapts between a quarter of the budget's
    // evictions and a 64th: always within a quarter, never past it, and
    // always within a 64th.
    let pages = stat("resident_budget_bytes") / 4096;
    let (longest, shortest) = (pages / 4, pages / 64);
    for r in of("store") {
        let d = r.distance.expect("store rows have a refault distance");
        assert!(!r.hot || d < longest, "hot at distance {d}, past budget/4 {longest}");
        assert!(r.hot || d >= shortest, "not hot at distance {d}, within budget/64 {shortest}");
        assert!(r.pages >= 1 && d <= r.evictions);
    }
}

#[test]
fn the_fault_log_has_a_row_per_page_in_that_agrees_with_the_statistics() {
    let d = tmp("faultlog");
    let exe = compile(&d, "loop");
    let log = d.join("log");
    let opts = ["--fault-log", log.to_str().unwrap()];
    let (o, s) = managed_with("32M", &opts, &[&exe], &d);
    assert!(o.status.success() && o.stdout == native(&[&exe], &d).stdout);
    let p = &s["per_process"][0];
    let rows = read_fault_log(&log.join(format!("{}.csv", p["pid"])));
    fault_log_agrees(&rows, p);
    // The loop reads 8 passes of 16384 pages in one order under 8192
    // pages: both kinds of refault appear.
    let store: Vec<&LogRow> = rows.iter().filter(|r| r.kind == "store").collect();
    assert!(store.len() > 16384, "{} store rows", store.len());
    assert!(store.iter().any(|r| r.hot) && store.iter().any(|r| !r.hot));
    assert_eq!(std::fs::read_dir(&log).unwrap().count(), 1, "one process, one file");
    // `ztier faults` summarises it: the same counts.
    let file = log.join(format!("{}.csv", p["pid"]));
    let o = Command::new(ztier()).arg("faults").arg(&file).args(["--budget", "32M"]).output().unwrap();
    assert!(o.status.success(), "{o:?}");
    let text = String::from_utf8_lossy(&o.stdout);
    let pages_in = p["store_faults"].as_u64().unwrap() + p["prefetched"].as_u64().unwrap();
    let line = format!("{:<10} {:>10} {:>12}", "store", p["store_faults"].as_u64().unwrap(), pages_in);
    assert!(text.contains(&line), "{line:?} in {text}");
    assert!(text.contains(&format!("{} rows from", rows.len())) && text.contains("budgets)"), "{text}");
    // A damaged log: refused, naming the line.
    let bad = d.join("bad.csv");
    let mut damaged = std::fs::read_to_string(&file).unwrap();
    damaged.push_str("12,store,0x1000,1,,5\n");
    std::fs::write(&bad, damaged).unwrap();
    let o = Command::new(ztier()).arg("faults").arg(&bad).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains(&format!("line {}", rows.len() + 2)), "{err}");

    // Every process writes its own: a forked child starts an empty log,
    // and an exec'd one has a library of its own. (A budget each: with
    // one for the tree, the budget a process's protected segment follows
    // moves with what the others hold, so its hot distance at a fault is
    // not the one its statistics end with.)
    let exe = compile(&d, "forks");
    let log = d.join("log-forks");
    let opts = ["--budget-scope", "process", "--fault-log", log.to_str().unwrap()];
    let cmd = [exe.as_str(), "python3", "-c", "print('hello from exec', len(bytearray(8 << 20)))"];
    let (o, s) = managed_with("16M", &opts, &cmd, &d);
    assert!(o.status.success() && o.stdout == native(&cmd, &d).stdout);
    let procs = s["per_process"].as_array().unwrap();
    assert!(procs.len() >= 3, "{s}");
    for p in procs {
        fault_log_agrees(&read_fault_log(&log.join(format!("{}.csv", p["pid"]))), p);
    }
    assert_eq!(std::fs::read_dir(&log).unwrap().count(), procs.len());

    // Past its limit a process counts the rows it could not keep and says
    // so (in the log asked for: here stderr).
    let log = d.join("log-capped");
    let o = Command::new(ztier())
        .args(["run", "--budget", "32M", "--log", "-", "--fault-log"])
        .arg(&log)
        .arg("--")
        .arg(d.join("loop"))
        .env("ZTIER_TEST_FAULT_LOG_MAX", "1000")
        .output()
        .unwrap();
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("were not logged"), "{err}");
    let files: Vec<_> = std::fs::read_dir(&log).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1);
    assert_eq!(read_fault_log(&files[0]).len(), 1000);

    // A file where the folder should be: refused before the program runs.
    let o = Command::new(ztier())
        .args(["run", "--budget", "32M", "--fault-log"])
        .arg(&files[0])
        .args(["--", "sh", "-c", "echo ran"])
        .output()
        .unwrap();
    assert!(!o.status.success() && o.stdout.is_empty());
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a folder"));
}

#[test]
fn a_new_working_set_that_fits_stops_faulting_once_the_old_one_ages_out() {
    // 48 MiB read 8 times in a scattered order under 32M, then left
    // alone; then 20 MiB read 40 times. The first phase's demotions come
    // back, so the protected segment ages slowly; in the second, the old
    // pages it holds never come back, so aging speeds up, drains them,
    // and the new set stays resident. Without aging the new set would
    // cycle through probation on every pass (173k pages came back in the
    // second phase when measured); at a fixed 1 demotion per 8 victims,
    // 32k; adaptive, 27k.
    let d = tmp("phases");
    let exe = compile(&d, "phases");
    let pages_in =
        |s: &serde_json::Value| s["store_faults"].as_u64().unwrap() + s["prefetched"].as_u64().unwrap();
    let first = same_as_native("32M", &[&exe, "0"], &d);
    assert!(pages_in(&first) > 8 * (48 - 32) * 256, "the first phase does not fit: it must fault");
    assert_eq!(first["per_process"][0]["age_every"].as_u64(), Some(256), "aging slowed for a loop: {first}");
    let both = same_as_native("32M", &[&exe, "40"], &d);
    let second = pages_in(&both).saturating_sub(pages_in(&first));
    assert!(second * 4 < 40 * 20 * 256, "{second} pages came back in the second phase: {both}");
    assert_eq!(both["per_process"][0]["age_every"].as_u64(), Some(8), "aging sped up: {both}");
    assert!(both["peak_resident_bytes"].as_u64().unwrap() <= 32 << 20);
}

fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Waits until the program `ztier run` (`child`, its output piped)
/// started prints "ready"; returns the program's PID (`ztier run`'s one
/// child).
fn ready_program(child: &mut std::process::Child) -> u32 {
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let kids = children_of(child.id());
    assert_eq!(kids.len(), 1, "ztier run has one child: {kids:?}");
    kids[0]
}

#[test]
fn live_stats_and_kill_9_leave_nothing_behind() {
    require("python3");
    let d = tmp("kill");
    let spill = d.join("spill");
    std::fs::create_dir_all(&spill).unwrap();
    // 47 MiB of random bytes (incompressible) under an 8M budget and a
    // 4M store: the store must spill.
    let mut child = Command::new(ztier())
        .args(["run", "--budget", "8M", "--store", "4M", "--spill"])
        .arg(&spill)
        .args(["--", "python3", "-c", "import os, time\nb = [os.urandom(4096) for i in range(12000)]\nprint('ready', flush=True)\ntime.sleep(60)\n"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let py = ready_program(&mut child);
    // Live statistics through the control socket.
    let o = Command::new(ztier()).args(["stats", &py.to_string()]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let counted: u64 = latency_histogram(&v).iter().map(|b| b.1).sum();
    assert_eq!(v["pid"].as_u64(), Some(py as u64));
    assert!(v["pages_compressed"].as_u64().unwrap() > 5000, "{v}");
    assert!(v["spilled_bytes"].as_u64().unwrap() > 0, "the 4M store spilled: {v}");
    // Its share of the budget (the tree scope's, the default): at least
    // a page per resident page, and the only process holding any.
    let held = v["tree_held_bytes"].as_u64().unwrap();
    assert!(held >= v["resident_bytes"].as_u64().unwrap() && held <= 8 << 20, "{v}");
    assert_eq!(v["tree_reserved_bytes"].as_u64(), Some(held), "{v}");
    assert_eq!(v["tree_inherited_bytes"].as_u64(), Some(0), "{v}");
    // The one process's share of the command's --store: all of it.
    assert_eq!(v["store_budget_bytes"].as_u64(), Some(4 << 20), "{v}");
    // The live latency histogram: a count per fault served, in the same
    // snapshot (both are read under the lock a fault is counted under),
    // whatever the program is doing meanwhile.
    assert!(counted > 0 && counted == v["faults"].as_u64().unwrap(), "{v}");
    // A stopped program cannot answer: said after 5 s, no hang.
    // SAFETY: signalling our grandchild by pid.
    unsafe { libc::kill(py as i32, libc::SIGSTOP) };
    // The stop is asynchronous: asked once it shows (CI once got an
    // answer here).
    let state = || std::fs::read_to_string(format!("/proc/{py}/stat")).unwrap_or_default();
    for _ in 0..200 {
        if state().rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('T')) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let o = Command::new(ztier()).args(["stats", &py.to_string()]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("has not answered within 5 s"),
        "{:?} {err} {}",
        o.status,
        String::from_utf8_lossy(&o.stdout).chars().take(300).collect::<String>()
    );
    // SAFETY: signalling our grandchild by pid.
    unsafe { libc::kill(py as i32, libc::SIGKILL) };
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(137), "ztier run passes on death by SIGKILL as 128 + 9");
    // The program started the library (it answered), though it left no
    // statistics: no warning that it did not.
    let mut err = String::new();
    use std::io::Read;
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(!err.contains("started ztier's library"), "{err}");
    assert_eq!(std::fs::read_dir(&spill).unwrap().count(), 0, "no spill file left");
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let run_dir = std::env::temp_dir().join(format!("ztier-{uid}")).join(format!("run-{}", child.id()));
    assert!(!run_dir.exists(), "{} left behind", run_dir.display());
    let o = Command::new(ztier()).args(["stats", &py.to_string()]).output().unwrap();
    assert!(!o.status.success());
}

#[test]
fn live_stats_count_every_fault_in_the_histogram_while_the_program_faults() {
    require("python3");
    // 47 MiB of random bytes under an 8M budget, then read round and
    // round: a fault every few microseconds while the statistics are
    // asked for. Each answer is one snapshot: its histogram counts every
    // fault it counts, and its service time is theirs. (The histogram was
    // read before the lock and the count after it, and each fault was
    // timed after letting the lock go: an answer lagged by the faults
    // taken meanwhile, 7 to 13 in one reading of a program just going to
    // sleep.)
    let mut child = Command::new(ztier())
        .args(["run", "--budget", "8M", "--"])
        .args([
            "python3",
            "-c",
            "import os\nb = [os.urandom(4096) for i in range(12000)]\nprint('ready', flush=True)\n\
             while True:\n    for x in b:\n        x[0]\n",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let py = ready_program(&mut child);
    // The answers are checked once the program is gone: it loops for
    // ever, so a failed check must not leave it running.
    let mut answers = Vec::new();
    for _ in 0..30 {
        answers.push(Command::new(ztier()).args(["stats", &py.to_string()]).output().unwrap());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // SAFETY: signalling our grandchild by pid.
    unsafe { libc::kill(py as i32, libc::SIGKILL) };
    assert_eq!(child.wait().unwrap().code(), Some(137));
    let mut seen = Vec::new();
    for o in &answers {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let hist = latency_histogram(&v);
        let counted: u64 = hist.iter().map(|h| h.1).sum();
        seen.push((v["faults"].as_u64().unwrap(), counted));
        // The exact sum of the service times lies within the bounds of
        // the buckets that counted them (100 ns wide up to 100 µs, then
        // 10 µs; the last, open one is printed at where it starts).
        let service = v["fault_service_ns"].as_u64().unwrap();
        let low: u64 = hist.iter().map(|&(u, c)| (u - if u <= 100_000 { 100 } else { 10_000 }) * c).sum();
        let high: u64 = hist.iter().map(|&(u, c)| u * c).sum();
        let open = hist.last().is_some_and(|&(u, _)| u >= 10_090_000);
        assert!(
            service >= low && (open || service <= high),
            "service {service} ns, buckets {low}..{high}: {v}"
        );
    }
    // It faulted meanwhile (else the answers prove nothing) ...
    assert!(seen[seen.len() - 1].0 > seen[0].0, "faults, histogram: {seen:?}");
    // ... and every answer's histogram holds its faults.
    assert!(seen.iter().all(|&(f, c)| f == c), "faults, histogram: {seen:?}");
}

#[test]
fn live_stats_take_none_of_the_programs_descriptor_numbers() {
    // `lowfd -`: its heap swept under a 16M budget, then opens of
    // /dev/null, each owed descriptor 3 (the lowest free), until its
    // stdin is closed, which it is once the statistics have been asked
    // for 40 times: every request comes while it opens (it ran 3 s by
    // the clock, and under load it had ended before the requests did).
    // Before, the library accepted each request as a connection, at the
    // lowest free number for as long as it wrote the answer: a few of
    // the program's opens got 4 instead.
    let d = tmp("lowfd-stats");
    let exe = compile(&d, "lowfd");
    let mut child = Command::new(ztier())
        .args(["run", "--budget", "16M", "--", &exe, "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    use std::io::{BufRead, Read};
    out.read_line(&mut line).unwrap();
    // The sweep's own count is `cli_run_modes`' to check (`lowfd`, every
    // mode): this test is about the requests.
    assert!(line.starts_with("opens 40960, "), "{line}");
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let kids = children_of(child.id());
    assert_eq!(kids.len(), 1, "ztier run has one child: {kids:?}");
    for _ in 0..40 {
        let o = Command::new(ztier()).args(["stats", &kids[0].to_string()]).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert!(v["pages_compressed"].as_u64().unwrap() > 5000, "{v}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Its stdin closed: it stops opening.
    drop(child.stdin.take());
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(rest.trim(), "then many opens, not the lowest free descriptor 0");
}

/// A copy of the `ztier` binary that any user may run (in a folder of
/// its own, both mode 755: the build's may be closed to others).
fn ztier_for_anyone(name: &str) -> std::path::PathBuf {
    let d = tmp(name);
    let bin = d.join("ztier");
    std::fs::copy(ztier(), &bin).unwrap();
    use std::os::unix::fs::PermissionsExt;
    for (p, mode) in [(&d, 0o755), (&bin, 0o755)] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    bin
}

#[test]
fn live_stats_are_for_the_programs_user_and_root_only() {
    require("python3");
    require("setpriv");
    require_root("asks as another user");
    let bin = ztier_for_anyone("stats-who");
    let mut child = Command::new(ztier())
        .args(["run", "--budget", "8M", "--"])
        .args([
            "python3",
            "-c",
            "import time\nb = bytearray(16 << 20)\nprint('ready', flush=True)\ntime.sleep(60)\n",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = ready_program(&mut child);
    let py = pid.to_string();
    // Root (here also the program's user) is answered.
    let o = Command::new(&bin).args(["stats", &py]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["pid"].as_u64(), Some(pid as u64), "{v}");
    // Another user is refused, and told why.
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&bin)
        .args(["stats", &py])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && o.stdout.is_empty(), "{err}");
    assert!(err.contains(&format!("process {py} refused: user 65534 asked")), "{err}");
    // Nor may another user hold it (`ztier hold`).
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&bin)
        .args(["hold", &py, "--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains(&format!("process {py} refused: user 65534 asked; only the program's user")),
        "{err}"
    );
    let o = Command::new(&bin).args(["stats", &py]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["held_by"], serde_json::json!([]), "{v}");
    // SAFETY: signalling our grandchild by pid.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    assert_eq!(child.wait().unwrap().code(), Some(137));
}

/// How many of pages `pages` of the buffer of process `pid` at `addr`
/// (page `i` starts with `i`, little-endian) `/proc/PID/mem` cannot read;
/// panics if one that reads holds anything else.
fn unreadable_from_outside(pid: u32, addr: u64, pages: std::ops::Range<u64>) -> u64 {
    use std::os::unix::fs::FileExt;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut page = [0u8; 4096];
    let mut bad = 0;
    for i in pages {
        match mem.read_exact_at(&mut page, addr + i * 4096) {
            Ok(()) => assert_eq!(u32::from_le_bytes(page[..4].try_into().unwrap()) as u64, i, "page {i}"),
            Err(_) => bad += 1,
        }
    }
    bad
}

/// Waits until process `pid` shows as stopped (a `SIGSTOP` takes effect
/// asynchronously).
fn wait_stopped(pid: u32) {
    let state = || std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    for _ in 0..500 {
        if state().rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('T')) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("process {pid} did not stop: {}", state());
}

/// `ztier stats PID`'s answer.
fn live_stats(pid: u32) -> serde_json::Value {
    let o = Command::new(ztier()).args(["stats", &pid.to_string()]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Polls `ztier stats PID` until `ok` holds of it (10 s at most).
fn live_stats_until(pid: u32, what: &str, ok: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let v = live_stats(pid);
        if ok(&v) {
            return v;
        }
        assert!(std::time::Instant::now() < until, "not {what} after 10 s: {v}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// `ztier hold PID` started, once it says the process is held.
fn holding(pid: u32) -> std::process::Child {
    let mut h =
        Command::new(ztier()).args(["hold", &pid.to_string()]).stderr(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(h.stderr.as_mut().unwrap()).read_line(&mut line).unwrap();
    assert!(line.contains(&format!("process {pid} held: ")), "{line}");
    h
}

#[test]
fn held_pages_can_be_read_from_outside_by_debuggers() {
    require("python3");
    require("gdb");
    require_root("reads another process's memory (/proc/PID/mem, gdb -p)");
    let d = tmp("hold");
    let spill = d.join("spill");
    std::fs::create_dir_all(&spill).unwrap();
    // 48 MiB of random pages under an 8M budget and a 4M store (it
    // spills); page i begins with i. The program checks its buffer when
    // told to end.
    let prog = "import ctypes, hashlib, random, sys\n\
                n = 12288\nb = bytearray(n * 4096)\nr = random.Random(7)\n\
                for i in range(n):\n    b[i * 4096:(i + 1) * 4096] = i.to_bytes(4, 'little') + r.randbytes(4092)\n\
                h = hashlib.sha256(b).digest()\n\
                print('ready', ctypes.addressof((ctypes.c_char * len(b)).from_buffer(b)), n, flush=True)\n\
                sys.stdin.readline()\n\
                print('same' if hashlib.sha256(b).digest() == h else 'changed', flush=True)\n";
    // ztier's notices (a hold that lapsed) go to a log of their own.
    let notices = d.join("notices.log");
    let mut child = Command::new(ztier())
        .args(["run", "--budget", "8M", "--store", "4M", "--spill"])
        .arg(&spill)
        .arg("--log")
        .arg(&notices)
        .args(["--", "python3", "-c", prog])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    use std::io::{BufRead, Read, Write};
    out.read_line(&mut line).unwrap();
    let f: Vec<u64> = line.split_whitespace().skip(1).map(|x| x.parse().unwrap()).collect();
    assert!(line.starts_with("ready") && f.len() == 2, "{line}");
    let (addr, n) = (f[0], f[1]);
    let kids = children_of(child.id());
    assert_eq!(kids.len(), 1, "ztier run has one child: {kids:?}");
    let py = kids[0];
    let gdb_word = |page: u64| {
        let o = Command::new("gdb")
            .args(["-nx", "-batch", "-p", &py.to_string(), "-ex"])
            .arg(format!("x/1wd {}", addr + page * 4096))
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
    };

    // Evicted pages cannot be read from outside: the kernel serves no
    // userfaultfd fault of another process's access.
    let before = unreadable_from_outside(py, addr, 0..n);
    assert!(before > n / 2, "{before} of {n} pages unreadable: most should be evicted");
    let v = live_stats(py);
    assert!(v["spilled_bytes"].as_u64().unwrap() > 0, "the 4M store spilled: {v}");
    let evicted = (0..n).rev().find(|&i| unreadable_from_outside(py, addr, i..i + 1) == 1).unwrap();
    let g = gdb_word(evicted);
    assert!(g.contains("Cannot access memory"), "{g}");

    // Held: every page back (most were in the spill file); gdb reads
    // them.
    let h = holding(py);
    let v = live_stats(py);
    assert_eq!(v["held_by"], serde_json::json!([h.id()]), "{v}");
    assert!(v["resident_bytes"].as_u64().unwrap() > 40 << 20, "over the budget while held: {v}");
    assert_eq!(unreadable_from_outside(py, addr, 0..n), 0);
    let g = gdb_word(evicted);
    assert!(g.lines().any(|l| l.split_whitespace().last() == Some(&evicted.to_string())), "{g}");
    // Stopped longer than the hold's lease (as under a debugger): the
    // renewals sent meanwhile wait in its socket, and are read first.
    // SAFETY: signalling our grandchild by pid.
    unsafe { libc::kill(py as i32, libc::SIGSTOP) };
    std::thread::sleep(std::time::Duration::from_secs(7));
    // SAFETY: as above.
    unsafe { libc::kill(py as i32, libc::SIGCONT) };
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert_eq!(live_stats(py)["held_by"], serde_json::json!([h.id()]));
    assert_eq!(unreadable_from_outside(py, addr, 0..n), 0);
    // Ctrl-C releases it: eviction resumes.
    // SAFETY: signalling our child by pid.
    unsafe { libc::kill(h.id() as i32, libc::SIGINT) };
    let o = h.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && err.contains(&format!("process {py} released")), "{err}");
    live_stats_until(py, "back within the budget", |v| {
        v["held_by"] == serde_json::json!([]) && v["resident_bytes"].as_u64().unwrap() <= 8 << 20
    });
    assert!(unreadable_from_outside(py, addr, 0..n) > n / 2);

    // With a command: held while it runs (it reads an evicted page),
    // its status passed on.
    let evicted = (0..n).find(|&i| unreadable_from_outside(py, addr, i..i + 1) == 1).unwrap();
    let o = Command::new(ztier())
        .args(["hold", &py.to_string(), "--", "sh", "-c"])
        .arg(format!(
            "test \"$(dd if=/proc/{py}/mem bs=4096 skip={} count=1 status=none | od -An -tu4 -N4 | tr -d ' ')\" \
             = {evicted} && exit 7",
            addr / 4096 + evicted
        ))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(7), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(live_stats(py)["held_by"], serde_json::json!([]));
    let o =
        Command::new(ztier()).args(["hold", &py.to_string(), "--", "no-such-command-here"]).output().unwrap();
    assert_eq!(o.status.code(), Some(127), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(live_stats(py)["held_by"], serde_json::json!([]));
    // SIGTERM to the hold is passed on to its command, and the hold ends.
    let mut t = Command::new(ztier())
        .args([
            "hold",
            &py.to_string(),
            "--",
            "sh",
            "-c",
            "trap 'exit 5' TERM; echo ready; while :; do sleep 0.05; done",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(t.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n", "the command runs, its trap set");
    // SAFETY: signalling our child by pid.
    unsafe { libc::kill(t.id() as i32, libc::SIGTERM) };
    assert_eq!(t.wait().unwrap().code(), Some(5));
    assert_eq!(live_stats(py)["held_by"], serde_json::json!([]));
    // A stopped process is refused at once, and not held when it runs on.
    // SAFETY: signalling our grandchild by pid.
    unsafe { libc::kill(py as i32, libc::SIGSTOP) };
    wait_stopped(py);
    let o = Command::new(ztier()).args(["hold", &py.to_string()]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains(&format!("process {py} is stopped")), "{err}");
    // SAFETY: as above.
    unsafe { libc::kill(py as i32, libc::SIGCONT) };
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(live_stats(py)["held_by"], serde_json::json!([]));

    // A holder killed with SIGKILL: its hold lapses by itself.
    let mut h = holding(py);
    h.kill().unwrap();
    h.wait().unwrap();
    live_stats_until(py, "released after its holder died", |v| v["held_by"] == serde_json::json!([]));

    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"\n").unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert_eq!(rest.trim(), "same");
    assert!(child.wait().unwrap().success());
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(!err.contains("ztier"), "the program's stderr is its own: {err}");
    let said = std::fs::read_to_string(&notices).unwrap();
    assert_eq!(said.matches("was not renewed for 5 s").count(), 1, "the killed holder's only: {said}");
}

/// `ztier hold --tree`: a Python program forks a child that fills 16 MiB
/// of random pages (page i begins with i) under a tree budget of 8M, so
/// most of them are evicted. `ztier hold` of the parent alone leaves the
/// child's evicted pages unreadable from outside; `--tree` holds the
/// child too, and a second child forked while the hold lasts is found
/// and held within seconds; Ctrl-C releases all three, and eviction
/// resumes in the children. Their buffers are checked unchanged at the
/// end.
#[test]
fn a_tree_hold_holds_the_children_too_even_those_forked_while_it_lasts() {
    require("python3");
    require_root("reads other processes' memory (/proc/PID/mem)");
    // Each child: its buffer's address to the parent through a pipe, then
    // waits for SIGTERM, when it checks its buffer (exit 0 if unchanged).
    let prog = "import ctypes, hashlib, os, random, signal, sys\n\
                def child(seed):\n\
                \x20   rd, wr = os.pipe()\n\
                \x20   pid = os.fork()\n\
                \x20   if pid:\n\
                \x20       os.close(wr)\n\
                \x20       return pid, os.fdopen(rd).readline().split()\n\
                \x20   os.close(rd)\n\
                \x20   n = 4096\n\
                \x20   b = bytearray(n * 4096)\n\
                \x20   r = random.Random(seed)\n\
                \x20   for i in range(n):\n\
                \x20       b[i * 4096:(i + 1) * 4096] = i.to_bytes(4, 'little') + r.randbytes(4092)\n\
                \x20   h = hashlib.sha256(b).digest()\n\
                \x20   a = ctypes.addressof((ctypes.c_char * len(b)).from_buffer(b))\n\
                \x20   signal.signal(signal.SIGTERM, lambda *_: os._exit(0 if hashlib.sha256(b).digest() == h else 3))\n\
                \x20   os.write(wr, f'{a} {n}\\n'.encode())\n\
                \x20   while True:\n\
                \x20       signal.pause()\n\
                kids = [child(1)]\n\
                print('ready', kids[0][0], *kids[0][1], flush=True)\n\
                sys.stdin.readline()\n\
                kids.append(child(2))\n\
                print('forked', kids[1][0], *kids[1][1], flush=True)\n\
                sys.stdin.readline()\n\
                for pid, _ in kids:\n\
                \x20   os.kill(pid, signal.SIGTERM)\n\
                print('children', *[os.waitpid(pid, 0)[1] for pid, _ in kids], flush=True)\n";
    let mut child = Command::new(ztier())
        .args(["run", "--budget", "8M", "--", "python3", "-c", prog])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::{BufRead, Read, Write};
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut stdin = child.stdin.take().unwrap();
    let mut read_kid = |word: &str| {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let f: Vec<u64> = line.split_whitespace().skip(1).map(|x| x.parse().unwrap()).collect();
        assert!(line.starts_with(word) && f.len() == 3, "{line}");
        (f[0] as u32, f[1], f[2])
    };
    let (a, a_addr, n) = read_kid("ready");
    let py = children_of(child.id())[0];
    let evicted = |pid, addr| unreadable_from_outside(pid, addr, 0..n);
    // The child's pages are out, and holding the parent alone leaves
    // them so.
    let until = |what: &str, ok: &dyn Fn() -> bool| {
        let end = std::time::Instant::now() + std::time::Duration::from_secs(15);
        while !ok() {
            assert!(std::time::Instant::now() < end, "not {what} after 15 s");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    };
    until("most of the first child's pages evicted", &|| evicted(a, a_addr) > n / 2);
    let mut h = holding(py);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(evicted(a, a_addr) > n / 2, "the parent's hold does not reach its child");
    // SAFETY: signalling our child by pid.
    unsafe { libc::kill(h.id() as i32, libc::SIGINT) };
    assert!(h.wait().unwrap().success());

    // With --tree: the child held too, and a child forked meanwhile.
    let mut h = Command::new(ztier())
        .args(["hold", "--tree", &py.to_string()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Its lines as they come (a hold that never says so must not hang
    // the test).
    let (tx, said) = std::sync::mpsc::channel();
    let err = h.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(err).lines() {
            let _ = tx.send(line.unwrap_or_default());
        }
    });
    let mut text = String::new();
    let mut wait_for = |what: &str| {
        let end = std::time::Instant::now() + std::time::Duration::from_secs(15);
        while !text.contains(what) {
            let left = end.saturating_duration_since(std::time::Instant::now());
            match said.recv_timeout(left) {
                Ok(line) => {
                    text.push_str(&line);
                    text.push('\n');
                }
                Err(e) => panic!("ztier hold --tree did not say {what:?} ({e}): {text}"),
            }
        }
    };
    wait_for(&format!("process {a} (of {py}'s tree) held: "));
    wait_for(&format!("process {py} held: "));
    assert_eq!(evicted(a, a_addr), 0, "the child's pages are back");
    assert!(live_stats(a)["held_by"].as_array().is_some_and(|v| v.len() == 1));
    stdin.write_all(b"fork\n").unwrap();
    let (b, b_addr, _) = read_kid("forked");
    until("the second child held and its pages back", &|| {
        live_stats(b)["held_by"].as_array().is_some_and(|v| v.len() == 1) && evicted(b, b_addr) == 0
    });
    assert_eq!(evicted(a, a_addr), 0, "the first child stays held");

    // Ctrl-C releases all three; eviction resumes in the children.
    // SAFETY: signalling our child by pid.
    unsafe { libc::kill(h.id() as i32, libc::SIGINT) };
    assert!(h.wait().unwrap().success());
    for pid in [py, a, b] {
        wait_for(&format!("process {pid} released"));
    }
    until("the children's pages evicted again", &|| evicted(a, a_addr) > n / 4 && evicted(b, b_addr) > n / 4);
    for pid in [py, a, b] {
        assert_eq!(live_stats(pid)["held_by"], serde_json::json!([]));
    }
    stdin.write_all(b"end\n").unwrap();
    let mut last = String::new();
    out.read_to_string(&mut last).unwrap();
    assert_eq!(last.trim(), "children 0 0", "both children found their buffers unchanged");
    assert!(child.wait().unwrap().success());
}

#[test]
fn stats_without_a_pid_lists_every_process_under_ztier_run() {
    require("python3");
    require("setpriv");
    require_root("asks as another user");
    let prog = "import time\nb = [bytes([i % 251]) * 4096 for i in range(8192)]\nprint('ready', flush=True)\ntime.sleep(60)\n";
    let start = |budget: &str| {
        let mut c = Command::new(ztier())
            .args(["run", "--budget", budget, "--", "python3", "-c", prog])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = ready_program(&mut c);
        (c, pid)
    };
    let (mut a, pa) = start("8M");
    let (mut b, pb) = start("12M");
    let o = Command::new(ztier()).arg("stats").output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(text.starts_with("     PID     budget   resident"), "{text}");
    for (pid, budget) in [(pa, "8.0 MiB"), (pb, "12.0 MiB")] {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(&pid.to_string()))
            .unwrap_or_else(|| panic!("no line for {pid}: {text}"));
        assert!(line.contains(budget) && line.contains("python3 -c import time b = "), "{line}");
        // 32 MiB written at 8 or 12 MiB: most of it stored, compressed.
        let f: Vec<&str> = line.split_whitespace().collect();
        let stored: f64 = f[5].parse().unwrap();
        assert!(stored > 15.0, "{line}");
    }
    // One stopped: listed with why (in the table and in JSON).
    // SAFETY: signalling our grandchild by pid.
    unsafe { libc::kill(pb as i32, libc::SIGSTOP) };
    wait_stopped(pb);
    let o = Command::new(ztier()).args(["stats", "--json"]).output().unwrap();
    let all: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    let entry = |pid: u32| all.iter().find(|v| v["pid"].as_u64() == Some(pid as u64)).cloned();
    assert!(entry(pa).is_some_and(|v| v["faults"].is_u64()), "{all:?}");
    let stopped = entry(pb).unwrap_or_else(|| panic!("{pb} missing: {all:?}"));
    assert!(stopped["error"].as_str().unwrap().contains("has not answered within 1 s"), "{stopped}");
    // SAFETY: as above.
    unsafe { libc::kill(pb as i32, libc::SIGCONT) };
    // `ztier run`'s own PID (what `$!` gives) is told apart from its program's.
    let o = Command::new(ztier()).args(["stats", &a.id().to_string()]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!(
            "process {} is `ztier run` itself, not its program: ask its child ({pa})",
            a.id()
        )),
        "{err}"
    );
    // Another user is refused by each, and the list says so.
    let bin = ztier_for_anyone("stats-list");
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&bin)
        .arg("stats")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    for pid in [pa, pb] {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with(&format!("{pid} "))
                    && l.contains("refused: another user's")),
            "{text}"
        );
    }
    for (c, pid) in [(&mut a, pa), (&mut b, pb)] {
        // SAFETY: signalling our grandchild by pid.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        assert_eq!(c.wait().unwrap().code(), Some(137));
    }
}

#[test]
fn live_stats_trust_only_the_process_asked() {
    // Anyone can bind an abstract name: here the test holds
    // `@ztier-PID` for a `sleep` that never ran ztier, and answers with
    // made-up statistics. `ztier stats PID` must see that the answer came
    // from another process and refuse it.
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = sleeper.id();
    let name = SocketAddr::from_abstract_name(format!("ztier-{pid}")).unwrap();
    let fake = UnixDatagram::bind_addr(&name).unwrap();
    fake.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    let asker =
        Command::new(ztier()).args(["stats", &pid.to_string()]).stderr(Stdio::piped()).spawn().unwrap();
    let mut req = [0u8; 64];
    let (_, from) = fake.recv_from(&mut req).expect("ztier stats asks");
    let lie = format!("{{\"pid\": {pid}, \"faults\": 0}}");
    fake.send_to_addr(lie.as_bytes(), &from).unwrap();
    let o = asker.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains(&format!("the answer for process {pid} came from process {}", std::process::id())),
        "{err}"
    );
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
}

/// Runs the bundled pyapp job under `--policy` with a spill folder.
fn with_policy(policy: &str, d: &Path) -> (Output, serde_json::Value) {
    let app = pyapp_path();
    let spill = d.join(format!("spill-{}", policy.replace(':', "_")));
    std::fs::create_dir_all(&spill).unwrap();
    let stats = d.join(format!("stats-{}.json", policy.replace(':', "_")));
    let out = Command::new(ztier())
        .args(["run", "--budget", "32M", "--policy", policy, "--spill"])
        .arg(&spill)
        .arg("--stats")
        .arg(&stats)
        .args(["--", "python3"])
        .arg(&app)
        .arg("100000")
        .output()
        .unwrap();
    assert!(out.status.success(), "{policy}: {}", String::from_utf8_lossy(&out.stderr));
    let v = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    (out, v)
}

#[test]
fn a_policy_splits_the_budget_between_resident_pages_and_the_store() {
    require("python3");
    let d = tmp("policy");
    let app = pyapp_path();
    let n = native(&["python3", app.to_str().unwrap(), "100000"], &d);
    assert!(n.status.success());
    // static:0.25 — a quarter of 32M for the store, the rest resident; the
    // ~50 MB heap does not fit in both: the oldest compressed pages spill.
    let (o, s) = with_policy("static:0.25", &d);
    assert!(o.stdout == n.stdout, "static:0.25: output differs from the native run");
    let p = &s["per_process"][0];
    assert_eq!(p["policy"].as_str(), Some("static:0.25"), "{p}");
    assert_eq!((p["replacement"].as_str(), p["prefetch"].as_str()), (Some("segmented"), Some("walk")), "{p}");
    assert_eq!(s["budget_scope"], "tree", "a policy takes the default scope");
    assert_eq!(p["store_budget_bytes"].as_u64(), Some(8 << 20), "{p}");
    assert_eq!(p["resident_budget_bytes"].as_u64(), Some(24 << 20), "{p}");
    assert!(p["peak_resident_bytes"].as_u64().unwrap() <= 24 << 20, "{p}");
    assert!(p["spilled_bytes"].as_u64().unwrap() > 0, "{p}");
    assert!(p["store_bytes_now"].as_u64().unwrap() <= 8 << 20, "{p}");
    // kaplan moves the split as it learns; the two shares always make
    // the budget, and resident pages never exceed it.
    let (o, s) = with_policy("kaplan", &d);
    assert!(o.stdout == n.stdout, "kaplan: output differs from the native run");
    let p = &s["per_process"][0];
    assert_eq!(p["policy"].as_str(), Some("kaplan"), "{p}");
    let (st, res) = (p["store_budget_bytes"].as_u64().unwrap(), p["resident_budget_bytes"].as_u64().unwrap());
    assert_eq!(st + res, 32 << 20, "{p}");
    assert!(st >= 2 << 20 && res >= 4 << 20, "{p}");
    assert!(p["peak_resident_bytes"].as_u64().unwrap() <= 32 << 20, "{p}");
    // Bad input.
    let o = Command::new(ztier())
        .args(["run", "--budget", "32M", "--policy", "kaplan", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("needs --spill"));
    let o = Command::new(ztier())
        .args([
            "run", "--budget", "32M", "--policy", "kaplan", "--spill", "/tmp", "--store", "8M", "--", "true",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("sizes the store"));
    let o = Command::new(ztier())
        .args(["run", "--budget", "32M", "--policy", "lru", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("faults only"));
    let o = Command::new(ztier())
        .args(["run", "--budget", "32M", "--policy", "static:2", "--spill", "/tmp", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("fraction"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Any combination of the policy's parts runs: oldest-first replacement
/// and no prefetch give the native output, say so in the statistics,
/// and bring no page in besides the faulting one.
#[test]
fn any_replacement_and_prefetch_can_be_picked() {
    require("python3");
    let d = tmp("policy-parts");
    let app = pyapp_path();
    let cmd = ["python3", app.to_str().unwrap(), "100000"];
    let n = native(&cmd, &d);
    assert!(n.status.success());
    let (m, s) = managed_with("16M", &["--policy", "fifo+single"], &cmd, &d);
    assert!(m.status.success() && m.stdout == n.stdout, "{}", String::from_utf8_lossy(&m.stderr));
    let p = &s["per_process"][0];
    assert_eq!((p["replacement"].as_str(), p["prefetch"].as_str()), (Some("fifo"), Some("single")), "{p}");
    assert_eq!(p["policy"], serde_json::Value::Null, "no sizing policy: {p}");
    assert_eq!(p["prefetched"].as_u64(), Some(0), "{p}");
    assert_eq!(p["promoted"].as_u64(), Some(0), "fifo has no protected segment: {p}");
    assert!(p["store_faults"].as_u64().unwrap() > 1000, "{p}");
}

/// A sizing policy in the tree scope (the default): three forked workers
/// share one budget of 32M for their resident pages and their stores
/// together, each splitting its part by the policy; the oldest compressed
/// pages beyond a store's share spill.
#[test]
fn a_sizing_policy_splits_each_processs_part_of_a_shared_budget() {
    require("python3");
    let d = tmp("policy-tree");
    let w = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/workloads/workers.py");
    let cmd = ["python3", w.to_str().unwrap(), "100000", "3"];
    let n = native(&cmd, &d);
    assert!(n.status.success(), "{}", String::from_utf8_lossy(&n.stderr));
    let spill = d.join("spill");
    std::fs::create_dir_all(&spill).unwrap();
    let (m, s) =
        managed_with("32M", &["--policy", "static:0.25", "--spill", spill.to_str().unwrap()], &cmd, &d);
    assert!(m.status.success() && m.stdout == n.stdout, "{}", String::from_utf8_lossy(&m.stderr));
    assert_eq!(s["budget_scope"], "tree");
    // The policy's split is what the budget counts: resident pages and
    // the stores, held as pages of the shared budget, with no shared
    // store limit besides.
    assert_eq!(s["budget_covers"], "all", "{s}");
    assert_eq!(s["tree_store_limit_bytes"], 0, "{s}");
    let over = s["tree_over_bytes"].as_u64().unwrap();
    assert!(over < 1 << 20, "{s}");
    assert!(s["tree_peak_held_bytes"].as_u64().unwrap() <= (32 << 20) + over, "{s}");
    let procs = s["per_process"].as_array().unwrap();
    assert!(procs.len() >= 4, "{s}");
    let mut spilled = 0;
    for p in procs {
        assert_eq!(p["policy"].as_str(), Some("static:0.25"), "{p}");
        let (st, res) =
            (p["store_budget_bytes"].as_u64().unwrap(), p["resident_budget_bytes"].as_u64().unwrap());
        assert!(st + res <= 32 << 20, "a process's part is at most the budget: {p}");
        spilled += p["spilled_bytes"].as_u64().unwrap();
    }
    assert!(spilled > 0, "the stores' shares are too small for the workers' records: {s}");
}

/// A full store: with no spill folder, and with a spill file that can
/// take no more (`--spill-max`; a full device takes the same path, see
/// the store's `a_full_spill_device_refuses_puts_and_loses_nothing`).
/// Pages the store refuses stay resident over the budget: the program
/// ends as natively, with its output, and stderr says why once. Before,
/// each fault over budget compressed victims only to have them refused
/// (2.6× and 7× the time of a roomy store), and a refused page
/// unprotected after its commit, when the program could already have
/// unmapped it, aborted the process (`ENOENT`, exit 134).
#[test]
fn a_full_store_keeps_pages_resident_and_says_why() {
    require("python3");
    let d = tmp("fullstore");
    let app = pyapp_path();
    let cmd = ["python3", app.to_str().unwrap(), "100000"];
    let n = native(&cmd, &d);
    assert!(n.status.success());
    let spill = d.join("spill");
    std::fs::create_dir_all(&spill).unwrap();
    let spill_opts = ["--store", "4M", "--spill", spill.to_str().unwrap(), "--spill-max", "1M"];
    for (opts, why) in [
        (&["--store", "4M"][..], "there is no --spill folder"),
        (&spill_opts[..], "the spill file reached its limit of 1048576 bytes"),
    ] {
        let (o, v) = managed_with("8M", opts, &cmd, &d);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{opts:?}: {:?}: {err}", o.status);
        assert!(o.stdout == n.stdout, "{opts:?}: output differs from the native run");
        let err = notices(&v);
        let said: Vec<&str> = err.lines().filter(|l| l.contains("the compressed store is full")).collect();
        assert_eq!(said.len(), 1, "{opts:?}: said once: {err}");
        // One process: all of the command's --store is its share.
        assert!(
            said[0].contains("(its share, 4 MiB, of the 4 MiB of --store") && said[0].contains(why),
            "{opts:?}: {}",
            said[0]
        );
        let p = &v["per_process"][0];
        assert!(p["refused"].as_u64().unwrap() > 0, "{opts:?}: {p}");
        assert!(p["peak_resident_bytes"].as_u64().unwrap() > 8 << 20, "{opts:?}: pages stayed resident: {p}");
        assert!(p["store_bytes_now"].as_u64().unwrap() <= 4 << 20, "{opts:?}: {p}");
    }
    assert_eq!(std::fs::read_dir(&spill).unwrap().count(), 0, "no spill file left");
}

/// `--spill` and `--stats` paths that cannot be written are refused
/// before the program runs (a spill folder was an abort of the program
/// at start-up, exit 134; a stats path an error after it had run), and a
/// relative `--spill` holds in a child that changed its working folder
/// (before, its library looked for the folder there and aborted it).
#[test]
fn spill_and_stats_paths_are_checked_before_the_program_runs() {
    require("python3");
    let d = tmp("paths");
    let ran = d.join("ran");
    for opts in [["--spill", "/proc"], ["--stats", "/proc/stats.json"]] {
        let o = Command::new(ztier())
            .args(["run", "--budget", "8M"])
            .args(opts)
            .args(["--", "touch"])
            .arg(&ran)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{opts:?}: {err}");
        assert!(err.contains(&format!("{} /proc", opts[0])), "{opts:?}: {err}");
        assert!(!ran.exists(), "{opts:?}: the program ran");
    }
    let app = pyapp_path();
    let app = app.to_str().unwrap();
    let n = native(&["python3", app, "30000"], &d);
    std::fs::create_dir_all(d.join("spill")).unwrap();
    let script = format!("cd / && exec python3 {app} 30000");
    let (o, v) = managed_with("8M", &["--store", "2M", "--spill", "spill"], &["sh", "-c", &script], &d);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.stdout == n.stdout, "output differs from the native run");
    let spilled: u64 =
        v["per_process"].as_array().unwrap().iter().map(|p| p["spilled_bytes"].as_u64().unwrap()).sum();
    assert!(spilled > 0, "{v}");
    assert_eq!(std::fs::read_dir(d.join("spill")).unwrap().count(), 0, "no spill file left");
}

/// Under an address-space limit (`ulimit -v`) or a data limit (`ulimit
/// -d`), both of which count the arena's reservation: the arena is made
/// to fit (before, reserving 64 GiB failed and the program was aborted at
/// start-up); when it is full, memory comes from glibc and the kernel,
/// unmanaged, said once; and a limit too tight for any arena is a clear
/// error.
#[test]
fn an_address_space_limit_shrinks_the_arena() {
    require("python3");
    let d = tmp("ulimit");
    let app = pyapp_path();
    let under =
        |flag: &str, limit: u32, n: u32| format!("ulimit {flag} {limit}; exec python3 {} {n}", app.display());
    for (flag, limit, n, budget, full) in [
        ("-v", 1_500_000, 100_000, "24M", false),
        ("-d", 1_500_000, 100_000, "24M", false),
        // A 140 MiB arena, filled by ~150 MB of Python objects.
        ("-v", 300_000, 200_000, "64M", true),
    ] {
        let script = under(flag, limit, n);
        let native = native(&["sh", "-c", &script], &d);
        assert!(native.status.success(), "ulimit {flag} {limit}: native: {native:?}");
        let (o, v) = managed_with(budget, &[], &["sh", "-c", &script], &d);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "ulimit {flag} {limit}: {:?}: {err}", o.status);
        assert!(o.stdout == native.stdout, "ulimit {flag} {limit}: output differs from the native run");
        let p = &v["per_process"][0];
        assert!(p["faults"].as_u64().unwrap() > 1000, "ulimit {flag} {limit}: managed: {p}");
        assert!(p["peak_resident_bytes"].as_u64().unwrap() <= budget_bytes(budget), "{p}");
        let said = notices(&v).matches("is full: further memory comes from glibc and the kernel").count();
        assert_eq!(said, usize::from(full), "ulimit {flag} {limit}: {err}");
    }
    for (flag, what) in [("-v", "address-space limit"), ("-d", "data limit")] {
        let o = Command::new(ztier())
            .args(["run", "--budget", "8M", "--", "sh", "-c", &under(flag, 100_000, 1000)])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(134), "{err}");
        assert!(err.contains(what) && err.contains("too little for ztier's arena"), "{err}");
    }
}

#[test]
fn a_stuck_handler_is_caught_by_the_watchdog() {
    require("python3");
    // The test hook makes the handler stop serving after 50 faults, as a
    // deadlocked one would: the program must not hang silently.
    let t = std::time::Instant::now();
    let mut child = Command::new(ztier())
        .args(["run", "--budget", "16M", "--watchdog", "2", "--", "python3", "-c"])
        .arg("b = [bytes(4096) for i in range(10000)]\nprint('finished')")
        .env("ZTIER_TEST_HANG_AFTER", "50")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > std::time::Duration::from_secs(60) {
            for k in children_of(child.id()) {
                // SAFETY: signalling our grandchild by pid.
                unsafe { libc::kill(k as i32, libc::SIGKILL) };
            }
            let _ = child.kill();
            panic!("the program hung for 60 s: no watchdog");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    aborted_by_the_watchdog(&child.wait_with_output().unwrap(), "fault handler", t);
}

/// The program was ended by the watchdog, naming `who`, soon after `t`,
/// before it could print "finished".
fn aborted_by_the_watchdog(o: &Output, who: &str, t: std::time::Instant) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(128 + libc::SIGABRT), "{err}");
    assert!(err.contains(who) && err.contains("no progress"), "{err}");
    assert!(!String::from_utf8_lossy(&o.stdout).contains("finished"));
    assert!(t.elapsed() < std::time::Duration::from_secs(30), "took {:?}", t.elapsed());
}

#[test]
fn a_stuck_evictor_is_caught_by_the_watchdog() {
    require("python3");
    // The test hook makes the evictor stop while it holds its third batch
    // of victims, sealed and write-protected, as a deadlocked one would;
    // the program then goes over every object it made, writing their
    // reference counts, those victims among them, and the writes wait for
    // the evictor: the watchdog must end it with a message. Several passes:
    // a write that reaches a victim before its batch is sealed takes it
    // back without waiting, so a busy machine can let the first pass through.
    let t = std::time::Instant::now();
    let o = Command::new(ztier())
        .args(["run", "--budget", "16M", "--watchdog", "2", "--", "python3", "-c"])
        .arg("import os\nb = [os.urandom(4096) for i in range(10000)]\nfor _ in range(8): print(sum(x[0] for x in b))\nprint('finished')")
        .env("ZTIER_TEST_EVICTOR_HANG_AFTER", "3")
        .output()
        .unwrap();
    aborted_by_the_watchdog(&o, "evictor", t);
}

#[test]
fn an_unprivileged_user_runs_with_user_mode_only_userfaultfd() {
    require("python3");
    require("setpriv");
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    assert_eq!(uid, 0, "this test drops to an unprivileged user: run the tests as root");
    // As nobody: no /dev/userfaultfd, vm.unprivileged_userfaultfd=0, so
    // the library gets UFFD_USER_MODE_ONLY. The program writes 64 MiB
    // under 16M, then has the kernel read a file into the first pages
    // (evicted by then).
    let d = tmp("nobody");
    let bin = d.join("ztier");
    std::fs::copy(ztier(), &bin).unwrap();
    let job = d.join("kread.py");
    std::fs::write(
        &job,
        "b = bytearray(64 << 20)\nfor i in range(0, len(b), 4096): b[i] = i // 4096 % 251\n\
         with open('/etc/passwd', 'rb') as f: n = f.readinto(memoryview(b)[0:8192])\n\
         print(n, bytes(b[:8192]) == open('/etc/passwd', 'rb').read()[:8192], sum(b[4096 * 3::4096]))\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    for p in [&d, &bin, &job] {
        let mode = if p.is_dir() || *p == bin { 0o755 } else { 0o644 };
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let want = native(&["python3", job.to_str().unwrap()], &d).stdout;
    let stats = std::env::temp_dir().join(format!("ztier-nobody-{}.json", std::process::id()));
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "env", "HOME=/tmp"])
        .arg(&bin)
        .args(["run", "--budget", "16M", "--stats"])
        .arg(&stats)
        .arg("--")
        .arg("python3")
        .arg(&job)
        .current_dir(&d)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&want));
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    let _ = std::fs::remove_file(&stats);
    assert!(compressed(&s) > 5000, "64 MiB under 16M as nobody: {} compressions", compressed(&s));
}

#[test]
fn bad_input_gets_clear_errors() {
    let o = Command::new(ztier()).args(["run", "--budget", "100", "--", "true"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("too small"));
    // A program not found or not runnable: the status a shell gives (it
    // was 1).
    for (cmd, code, said) in [
        ("/nonexistent/program", 127, "/nonexistent/program: no such file"),
        ("no-such-command-ztier", 127, "no-such-command-ztier: command not found"),
        ("/etc/passwd", 126, "/etc/passwd: not executable"),
        ("/tmp", 126, "/tmp: is a folder"),
    ] {
        let o = Command::new(ztier()).args(["run", "--budget", "16M", "--", cmd]).output().unwrap();
        assert_eq!(o.status.code(), Some(code), "{cmd}");
        assert!(String::from_utf8_lossy(&o.stderr).contains(said), "{cmd}: {o:?}");
    }
    // --stats in /proc or /sys: refused before the program runs (a write
    // there failed at the end, or could change a setting).
    let o = Command::new(ztier())
        .args(["run", "--budget", "16M", "--stats", "/proc/version", "--", "echo", "ran"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty() && String::from_utf8_lossy(&o.stderr).contains("a file of /proc or /sys"));
    // Statistics that cannot be written at the end (the program removed
    // their folder): said, and the program's status is still passed on
    // (it was lost: 1).
    let d = tmp("stats-gone");
    let dir = d.join("gone");
    std::fs::create_dir_all(&dir).unwrap();
    let o = Command::new(ztier())
        .args(["run", "--budget", "16M", "--stats"])
        .arg(dir.join("s.json"))
        .args(["--", "sh", "-c", &format!("rm -r {}; exit 5", dir.display())])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(5), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("writing the statistics to"), "{o:?}");
    let o = Command::new(ztier())
        .args(["run", "--budget", "16M", "--codec", "nope", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let o = Command::new(ztier())
        .args(["run", "--budget", "16M", "--allocator", "cells99", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--allocator: unknown allocator 'cells99'"));
    let o =
        Command::new(ztier()).args(["run", "--budget", "16M", "--", "sh", "-c", "exit 42"]).output().unwrap();
    assert_eq!(o.status.code(), Some(42), "the program's exit status is passed on");
    let o = Command::new(ztier()).args(["stats", "999999999"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no process 999999999"), "{o:?}");
}

/// Every castro variant is a policy `ztier run` takes, alone and with
/// +clean-disable: the program's output is the native one and the
/// statistics name the policy as given.
#[test]
fn the_castro_variants_size_a_live_store() {
    require("python3");
    let d = tmp("castro-variants");
    let prog =
        ["python3", "-c", "x = [bytes([i % 251]) * 4096 for i in range(12000)]; print(sum(map(len, x)))"];
    let n = native(&prog, &d);
    assert!(n.status.success());
    for p in ["castro", "castro-aggressive", "castro-sluggish", "castro-sluggish+clean-disable"] {
        let spill = d.join(format!("spill-{p}"));
        std::fs::create_dir_all(&spill).unwrap();
        let stats = d.join(format!("stats-{p}.json"));
        let o = Command::new(ztier())
            .args(["run", "--budget", "32M", "--policy", p, "--spill"])
            .arg(&spill)
            .arg("--stats")
            .arg(&stats)
            .arg("--")
            .args(prog)
            .output()
            .unwrap();
        assert!(o.status.success(), "{p}: {}", String::from_utf8_lossy(&o.stderr));
        assert!(o.stdout == n.stdout, "{p}: output differs from the native run");
        let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
        let pp = &s["per_process"][0];
        assert_eq!(pp["policy"].as_str(), Some(p), "{pp}");
        let (st, res) =
            (pp["store_budget_bytes"].as_u64().unwrap(), pp["resident_budget_bytes"].as_u64().unwrap());
        assert_eq!(st + res, 32 << 20, "{p}: {pp}");
    }
    let o = Command::new(ztier())
        .args(["run", "--budget", "32M", "--policy", "castro-lazy", "--spill", "/tmp", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("unknown policy 'castro-lazy'") && e.contains("castro-sluggish"), "{e}");
}

/// The flagship workload the tests run under `ztier run`.
fn pyapp_path() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/workloads/pyapp.py")
}
