//! `ztier run --remote`: programs whose compressed pages do not fit the
//! store keep them in Redis (servers started here on loopback ports,
//! stopped by PID): native output with most of the memory remote, a
//! fork, a wrong password said before the program runs, a live
//! resharding and the SIGKILL of a master during a run, and every
//! server down with the spill file taking over.

mod common;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{compile, native, tmp, ztier};
use ztier_remote::testbed::{Options, Testbed};

/// Starts `ztier run` with `args` then `--` and `prog` in `d`, its
/// output captured, the password in the environment.
fn start(d: &Path, args: &[&str], prog: &[&str], password: Option<&str>) -> Child {
    let mut c = Command::new(ztier());
    c.arg("run").args(args).arg("--").args(prog).current_dir(d);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    match password {
        Some(p) => c.env("ZTIER_REMOTE_PASSWORD", p),
        None => c.env_remove("ZTIER_REMOTE_PASSWORD"),
    };
    c.spawn().unwrap()
}

fn stats(d: &Path, name: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(d.join(name)).unwrap()).unwrap()
}

fn said(o: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Values on the masters (`ports`), less the run's two records.
fn values(bed: &Testbed, ports: &[u16]) -> u64 {
    ports.iter().map(|&p| bed.dbsize(p).unwrap_or(0)).sum::<u64>().saturating_sub(2)
}

/// Waits until the servers on `ports` hold `n` values of the run.
fn wait_values(bed: &Testbed, ports: &[u16], n: u64, run: &mut Child) {
    let t = Instant::now();
    while values(bed, ports) < n {
        assert!(run.try_wait().unwrap().is_none(), "the program ended before {n} pages were remote");
        assert!(t.elapsed() < Duration::from_secs(60), "{} values after 60 s", values(bed, ports));
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A program with most of its memory remote (an ACL user, the password
/// from the environment) gives native output, and so does a forking
/// one whose child checks its parent's heap; the values are gone from
/// the server when the run ends.
#[test]
fn most_memory_remote_gives_native_output_and_a_fork_its_pages() {
    let d = tmp("remote-native");
    let opts = Options { auth: Some(("ztier".into(), "pw-remote-run".into())), ..Options::default() };
    let bed = Testbed::single(&opts).unwrap();
    let port = bed.servers[0].port;
    let url = bed.url();
    let touch = compile(&d, "touch_times");
    let want = native(&[&touch, "8192"], &d);
    let run = start(
        &d,
        &["--budget", "4M", "--store", "2M", "--remote", &url, "--stats", "s.json"],
        &[&touch, "8192"],
        Some("pw-remote-run"),
    )
    .wait_with_output()
    .unwrap();
    assert!(run.status.success(), "{}", said(&run));
    assert_eq!(run.stdout, want.stdout, "{}", said(&run));
    let s = stats(&d, "s.json");
    let r = &s["remote"];
    assert!(s["pages_compressed"].as_u64().unwrap() > 4000, "{s}");
    // Most of the 32 MiB was remote: far more pages came back from it
    // than the store could hold (512 pages at 2 MiB uncompressed... or ~2× that).
    assert!(r["remote_puts"].as_u64().unwrap() > 4000, "{r}");
    assert!(r["remote_gets"].as_u64().unwrap() > 4000, "{r}");
    assert_eq!(
        (r["mac_errors"].as_u64(), r["lost"].as_u64(), r["errors"].as_u64()),
        (Some(0), Some(0), Some(0)),
        "{r}"
    );
    let p = &s["per_process"][0]["remote"];
    assert!(p["proxied_gets"].as_u64().unwrap() > 4000, "{p}");
    assert_eq!(bed.dbsize(port).unwrap(), 0, "the run's values and records are gone");

    let forks = compile(&d, "forks");
    let want = native(&[&forks, "true"], &d);
    let run = start(
        &d,
        &["--budget", "8M", "--store", "4M", "--remote", &url, "--stats", "f.json"],
        &[&forks, "true"],
        Some("pw-remote-run"),
    )
    .wait_with_output()
    .unwrap();
    assert!(run.status.success(), "{}", said(&run));
    assert_eq!(run.stdout, want.stdout, "{}", said(&run));
    let s = stats(&d, "f.json");
    assert!(s["remote"]["remote_puts"].as_u64().unwrap() > 1000, "{s}");
    assert_eq!(s["remote"]["lost"].as_u64(), Some(0));
    assert_eq!(bed.dbsize(port).unwrap(), 0);
}

/// The CPUs this test may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity
    // fills the set it is given, of that size, for this thread (0).
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set), 0);
        set
    };
    // SAFETY: reading a filled set.
    (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()
}

/// A server bound to one CPU (`taskset -c N`) answers from it: the run
/// reads N from its connection (`SO_INCOMING_CPU`), says so in its
/// statistics and pins the program's fault handler there; a server free
/// to move is seen as such and not followed.
#[test]
fn the_run_follows_a_bound_servers_cpu_and_not_a_free_one() {
    let d = tmp("remote-cpu");
    let touch = compile(&d, "touch_times");
    let cpus = allowed_cpus();
    // The last allowed CPU: with two or more, not always the one a pick
    // by PID would give.
    let n = *cpus.last().unwrap();
    for (cpu, name) in [(Some(n), "bound.json"), (None, "free.json")] {
        let bed = Testbed::single(&Options { cpu, ..Options::default() }).unwrap();
        let url = bed.url();
        let run = start(
            &d,
            &["--budget", "4M", "--store", "2M", "--remote", &url, "--stats", name],
            &[&touch, "2048"],
            None,
        )
        .wait_with_output()
        .unwrap();
        assert!(run.status.success(), "{}", said(&run));
        let s = stats(&d, name);
        let (r, handler) = (&s["remote"], &s["per_process"][0]["handler_cpu"]);
        // Free on one allowed CPU only is bound all the same.
        let bound = cpu.is_some() || cpus.len() == 1;
        assert_eq!(r["server_held"].as_bool(), Some(bound), "{r}");
        assert_eq!(r["server_cpu_followed"].as_bool(), Some(bound), "{r}");
        let seen = r["server_cpu"].as_u64().expect("a CPU seen") as usize;
        assert!(cpus.contains(&seen), "{r}");
        if let Some(c) = cpu {
            assert_eq!(seen, c, "{r}");
            // The handler is pinned where two or more CPUs are allowed.
            if cpus.len() > 1 {
                assert_eq!(handler.as_u64(), Some(c as u64), "{s}");
            } else {
                assert!(handler.is_null(), "{s}");
            }
        }
    }
}

/// A wrong password is said before the program starts (which never
/// runs), without the password.
#[test]
fn a_wrong_password_is_said_before_the_program_starts() {
    let d = tmp("remote-password");
    let opts = Options { auth: Some(("ztier".into(), "the-right-one".into())), ..Options::default() };
    let bed = Testbed::single(&opts).unwrap();
    let o = start(
        &d,
        &["--budget", "8M", "--remote", &bed.url()],
        &["sh", "-c", "touch ran"],
        Some("a-wrong-one"),
    )
    .wait_with_output()
    .unwrap();
    assert!(!o.status.success(), "{}", said(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("authentication failed") && !err.contains("a-wrong-one"), "{err}");
    assert!(!d.join("ran").exists(), "the program ran");
    // A password in the URL is refused, without repeating it.
    let url = bed.url().replace("ztier@", "ztier:secret@");
    let o = start(&d, &["--budget", "8M", "--remote", &url], &["sh", "-c", "touch ran"], None)
        .wait_with_output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("readable by every user") && !err.contains("secret"),
        "{err}"
    );
    assert!(!d.join("ran").exists(), "the program ran");
}

/// A Redis Cluster of 3 masters with a replica each: slots move between
/// masters during one run (no error), and a master is SIGKILLed during
/// another (durability replica, no spill file: every page comes back
/// through the promoted replica); both give native output.
#[test]
fn resharding_and_a_master_killed_during_runs() {
    let d = tmp("remote-cluster");
    let mut bed = Testbed::cluster(3, 1, &Options { node_timeout_ms: 1000, ..Options::default() }).unwrap();
    let exe = compile(&d, "loop");
    let want = native(&[&exe], &d);
    let url = bed.url();
    let args = ["--budget", "4M", "--store", "2M", "--remote", &url, "--remote-durability", "replica"];

    let masters = bed.master_ports().unwrap();
    let mut run = start(&d, &[&args[..], &["--stats", "r.json"]].concat(), &[&exe], None);
    wait_values(&bed, &masters, 2000, &mut run);
    bed.reshard(masters[0], masters[1], 2000).unwrap();
    let o = run.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", said(&o));
    assert_eq!(o.stdout, want.stdout, "{}", said(&o));
    let r = &stats(&d, "r.json")["remote"];
    assert_eq!(
        (r["errors"].as_u64(), r["lost"].as_u64(), r["mac_errors"].as_u64()),
        (Some(0), Some(0), Some(0)),
        "{r}"
    );
    assert!(r["remote_gets"].as_u64().unwrap() > 1000, "{r}");

    let masters = bed.master_ports().unwrap();
    let mut run = start(&d, &[&args[..], &["--stats", "k.json"]].concat(), &[&exe], None);
    wait_values(&bed, &masters, 2000, &mut run);
    let victim = masters[2];
    bed.server(victim).unwrap().kill();
    let o = run.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", said(&o));
    assert_eq!(o.stdout, want.stdout, "{}", said(&o));
    let r = &stats(&d, "k.json")["remote"];
    assert_eq!((r["lost"].as_u64(), r["mac_errors"].as_u64()), (Some(0), Some(0)), "{r}");
    assert!(r["failovers"].as_u64().unwrap() >= 1, "{r}");
}

/// Every server down during a run (its only one SIGKILLed): the spill
/// file takes the pages, and those already remote come back from their
/// local copies (durability local, the default without replicas).
#[test]
fn every_server_down_the_spill_file_takes_over() {
    let d = tmp("remote-down");
    let mut bed = Testbed::single(&Options::default()).unwrap();
    let port = bed.servers[0].port;
    let exe = compile(&d, "loop");
    let want = native(&[&exe], &d);
    let spill = d.join("spill");
    std::fs::create_dir_all(&spill).unwrap();
    let mut run = start(
        &d,
        &[
            "--budget",
            "4M",
            "--store",
            "2M",
            "--remote",
            &bed.url(),
            "--spill",
            spill.to_str().unwrap(),
            "--stats",
            "s.json",
        ],
        &[&exe],
        None,
    );
    wait_values(&bed, &[port], 2000, &mut run);
    bed.servers[0].kill();
    let o = run.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", said(&o));
    assert_eq!(o.stdout, want.stdout, "{}", said(&o));
    let r = &stats(&d, "s.json")["remote"];
    assert_eq!(r["durability"], "local", "{r}");
    assert!(r["fallback_puts"].as_u64().unwrap() > 0 && r["fallback_gets"].as_u64().unwrap() > 0, "{r}");
    assert_eq!((r["lost"].as_u64(), r["mac_errors"].as_u64()), (Some(0), Some(0)), "{r}");
    // The end could not remove the run's records: said, with what to do.
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("ztier remote gc"), "{err}");
}

/// Every page value on the server changed behind the run's back (one
/// byte each, by a script on the server) while the program loops over
/// its heap: the run stops with the MAC error, and the program never
/// prints a result computed from a changed page.
#[test]
fn a_value_changed_in_redis_is_an_error_never_data() {
    let d = tmp("remote-tamper");
    let bed = Testbed::single(&Options::default()).unwrap();
    let port = bed.servers[0].port;
    let exe = compile(&d, "loop");
    let want = native(&[&exe], &d);
    let mut run = start(&d, &["--budget", "4M", "--store", "2M", "--remote", &bed.url()], &[&exe], None);
    wait_values(&bed, &[port], 2000, &mut run);
    // Page values only (`zt:RUN:PROC:{TAG}:ID`), not the run's records.
    let flip = "local n = 0 \
                for _, k in ipairs(redis.call('KEYS', 'zt:*{*')) do \
                  local b = string.byte(redis.call('GETRANGE', k, 0, 0)) \
                  redis.call('SETRANGE', k, 0, string.char((b + 1) % 256)) \
                  n = n + 1 \
                end \
                return n";
    let n: u64 = bed.cli(port, &["EVAL", flip, "0"]).unwrap().trim().parse().unwrap();
    assert!(n >= 1000, "{n} values changed");
    let o = run.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "the run went on after {n} values changed: {}", said(&o));
    assert!(err.contains("page MAC mismatch: the value was changed on the server"), "{}", said(&o));
    assert_eq!(err.matches("next tier I/O").count(), 1, "{err}");
    assert!(o.stdout.is_empty() || o.stdout == want.stdout, "{}", said(&o));
}

/// `bench pressure --remote` adds a row "ztier run --remote": a
/// redis-server on loopback started for it takes the pages a store of a
/// quarter of the budget cannot hold, the output is native's, and the
/// server is stopped (by its PID) when the row is done.
#[test]
fn bench_pressure_gains_a_remote_row() {
    let d = tmp("remote-pressure");
    let touch = compile(&d, "touch_times");
    let json = d.join("p.json");
    let o = Command::new(ztier())
        .args(["bench", "pressure", "--kernel", "none", "--remote", "--budgets", "8M", "--json"])
        .arg(&json)
        .args(["--", &touch, "4096"])
        .current_dir(&d)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", said(&o));
    let rows: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let rows = rows.as_array().unwrap();
    let row = rows.iter().find(|r| r["mode"] == "ztier run --remote").unwrap_or_else(|| panic!("{rows:?}"));
    assert_eq!(row["same_output"], true, "{row}");
    assert_eq!(row["budget"].as_u64(), Some(8 << 20), "{row}");
    // 16 MiB (4096 pages) through a 2 MiB store: thousands of pages went
    // to the remote and back (~3900 and ~2400 here).
    assert!(row["remote_puts"].as_u64().unwrap() > 1000, "{row}");
    assert!(row["remote_gets"].as_u64().unwrap() > 1000, "{row}");
    // The spill-file row is still there, without remote counts.
    let local = rows.iter().find(|r| r["mode"] == "ztier run").unwrap();
    assert!(local["remote_puts"].is_null(), "{local}");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("ztier run --remote at 8M: "), "{text}");
    // The server is gone: its port refuses connections.
    let err = String::from_utf8_lossy(&o.stderr);
    let at = err.find("(redis-server redis://").unwrap_or_else(|| panic!("{err}"));
    let addr = err[at + "(redis-server redis://".len()..].split(')').next().unwrap();
    assert!(std::net::TcpStream::connect(addr).is_err(), "the server at {addr} still runs: {err}");
    assert!(!err.contains("process running ("), "{err}");
}

/// `bench remote --json`: one JSON object, a row per concurrency and
/// depth with ztier's and redis-benchmark's rates (the server started
/// here on loopback), the bound on pages waiting to be written, and
/// every page read back right (the bench checks them and fails if not).
/// A few hundred pages: about 2 s.
#[test]
fn bench_remote_compares_with_redis_benchmark_in_a_steady_state() {
    let d = tmp("remote-bench");
    for pending in ["16", "0"] {
        let o = Command::new(ztier())
            .args(["bench", "remote", "--clients", "1,4", "--pipelines", "4", "--requests", "400"])
            .args(["--rounds", "1", "--pending-pages", pending, "--json"])
            .current_dir(&d)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", said(&o));
        let j: serde_json::Value =
            serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", said(&o)));
        assert_eq!(j["pending_pages"].as_u64(), Some(pending.parse().unwrap()), "{j}");
        let rows = j["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 2, "{j}");
        for (r, c) in rows.iter().zip([1, 4]) {
            assert_eq!((r["clients"].as_u64(), r["pipeline"].as_u64()), (Some(c), Some(4)), "{r}");
            for k in [
                "ztier_put_s",
                "ztier_get_s",
                "redis_benchmark_set_s",
                "redis_benchmark_get_s",
                "put_ratio",
                "ztier_put_flusher_cpu_us",
            ] {
                let v = r[k].as_f64().unwrap_or(0.0);
                assert!(v > 0.0 && v.is_finite(), "{k} in {r}");
            }
        }
    }
}
