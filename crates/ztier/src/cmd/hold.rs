//! The control socket's client: `ztier stats PID` asks a program running
//! under `ztier run` for its statistics (`ztier stats` asks every such
//! process, found by its socket's name in `/proc/net/unix`), and `ztier
//! hold PID` keeps its pages in memory for a debugger or profiler.
//!
//! A program under `ztier run` answers on the abstract datagram socket
//! `@ztier-PID`; the client binds `@ztier-ctl-ITSPID-PID` for the answers. The
//! requests are one word each:
//!
//! ```text
//!  client (PID C)                            program (PID P), library thread
//!  "stats"   ─────────────────────────────▶  statistics, one JSON datagram
//!  "hold"    ─────────────────────────────▶  no eviction for 5 s from now;
//!                                            stored pages back, then
//!            ◀─────────────────────────────  {"held": true, "held_by": [C, ...],
//!                                             "brought_back_bytes", ...}
//!  "hold" again every second (renews C's lease; the answers are drained)
//!  "release" ─────────────────────────────▶  C's hold ends; eviction resumes
//!            ◀─────────────────────────────  {"held": false, "held_by": [], ...}
//!  any      ◀───────────────────────────── {"denied": "..."} or {"error": "..."}
//! ```
//!
//! **Why a hold.** An evicted page is missing from the program's memory,
//! and the kernel serves no userfaultfd fault for another process's
//! access: `gdb -p` ("Cannot access memory"), `/proc/PID/mem` reads
//! (`EIO`) and `process_vm_readv` (profilers such as py-spy) fail there.
//! Held, the program has every page it ever used in memory. The library
//! ends a hold that is not renewed within 5 s, so a holder that dies,
//! even by `SIGKILL`, does not leave the program over its budget for
//! good. Renewals sent while the program is stopped (under the debugger)
//! wait in its socket and are read before the lease is checked.
//!
//! Abstract names have no owner, so both sides check who they talk to:
//! the kernel attaches each datagram's sender (`SO_PASSCRED`), the
//! library answers only its program's user and root, and the client
//! trusts an answer only from the process it asked.

use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::Value;
use ztier_run_core::names::{control, stats};

/// A socket connected to one program's control socket.
pub struct Control {
    pid: u32,
    sock: UnixDatagram,
}

impl Control {
    /// Connects to process `pid`'s control socket: an error if there is
    /// no such process or it has none.
    pub fn connect(pid: u32) -> Result<Control> {
        if pid == 0 || !Path::new(&format!("/proc/{pid}")).exists() {
            bail!("no process {pid}");
        }
        // One name per process asked: `ztier hold --tree` talks to many.
        let me = SocketAddr::from_abstract_name(format!("ztier-ctl-{}-{pid}", std::process::id()))?;
        let sock = UnixDatagram::bind_addr(&me).context("binding the socket for the answers")?;
        ztier_uffd::ctl::pass_credentials(sock.as_raw_fd())
            .context("asking for the answers' sender (SO_PASSCRED)")?;
        let addr = SocketAddr::from_abstract_name(control::socket_name(pid))?;
        sock.connect_addr(&addr).with_context(|| silent(pid))?;
        Ok(Control { pid, sock })
    }

    /// Sends `request` and waits up to `wait` for its answer (earlier
    /// answers still queued are dropped first). A refusal
    /// (`{"denied": ...}`) is an error; `{"error": ...}` is returned as is.
    pub fn ask(&self, request: &[u8], wait: Duration) -> Result<Value> {
        self.drain();
        self.sock.send(request).with_context(|| silent(self.pid))?;
        self.sock.set_read_timeout(Some(wait))?;
        self.answer(wait)
    }

    /// The next answer, waited for up to `wait`.
    fn answer(&self, wait: Duration) -> Result<Value> {
        let mut buf = vec![0u8; 4 << 20];
        let r = match ztier_uffd::ctl::recv(self.sock.as_raw_fd(), &mut buf, None, 0) {
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                bail!(
                    "process {} has not answered within {} s: is it stopped (under a debugger)?",
                    self.pid,
                    wait.as_secs()
                )
            }
            r => r.with_context(|| silent(self.pid))?,
        };
        self.trust(r.sender)?;
        let v: Value = serde_json::from_slice(&buf[..r.len]).context("the answer is not JSON")?;
        if let Some(why) = v.get(control::reply::DENIED) {
            bail!("process {} refused: {}", self.pid, why.as_str().unwrap_or("no reason given"));
        }
        Ok(v)
    }

    /// Sends `request` without waiting for room or an answer; an error if
    /// the program's socket is gone (the process ended or `exec`'d into a
    /// program not under `ztier run`).
    fn send_nowait(&self, request: &[u8]) -> std::io::Result<()> {
        // SAFETY: the request's bytes, on our connected socket.
        let r = unsafe {
            libc::send(self.sock.as_raw_fd(), request.as_ptr().cast(), request.len(), libc::MSG_DONTWAIT)
        };
        match std::io::Error::last_os_error() {
            // Its queue is full (it is stopped): the renewals queued do.
            e if r < 0 && e.kind() != std::io::ErrorKind::WouldBlock => Err(e),
            _ => Ok(()),
        }
    }

    /// The next answer if one is queued (a refusal or error as
    /// `{"denied": ...}` or `{"error": ...}`), else `None`.
    fn poll_answer(&self) -> Option<Value> {
        let mut buf = vec![0u8; 1 << 16];
        let r = ztier_uffd::ctl::recv(self.sock.as_raw_fd(), &mut buf, None, libc::MSG_DONTWAIT).ok()?;
        self.trust(r.sender).ok()?;
        serde_json::from_slice(&buf[..r.len]).ok()
    }

    /// Drops every answer queued.
    fn drain(&self) {
        let mut buf = [0u8; 256];
        while ztier_uffd::ctl::recv(self.sock.as_raw_fd(), &mut buf, None, libc::MSG_DONTWAIT).is_ok() {}
    }

    fn trust(&self, sender: Option<libc::ucred>) -> Result<()> {
        match sender.map(|c| c.pid) {
            Some(pid) if pid == self.pid as i32 => Ok(()),
            Some(pid) => bail!(
                "the answer for process {} came from process {pid}, which holds its control socket's \
                 name: not trusted",
                self.pid
            ),
            None => {
                bail!(
                    "the answer for process {} came without its sender's credentials: not trusted",
                    self.pid
                )
            }
        }
    }
}

/// How long `ztier stats` waits for a process's command line.
const CMDLINE_WAIT: Duration = Duration::from_secs(1);

/// The bytes of file `path`, read in a thread of its own within `limit`;
/// `None` if the read failed or took longer (the thread is left to
/// finish on its own). For `/proc/PID/cmdline`: reading another
/// process's arguments takes its memory map's lock, and a process stuck
/// in the kernel with that lock held would hold this command up too.
fn read_within(path: String, limit: Duration) -> Option<Vec<u8>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("ztier-read".into())
        .spawn(move || {
            let _ = tx.send(std::fs::read(&path).ok());
        })
        .ok()?;
    rx.recv_timeout(limit).ok().flatten()
}

/// Process `pid`'s command line (`/proc/PID/cmdline`, within
/// [`CMDLINE_WAIT`]), arguments apart by NULs; if it cannot be read in
/// time, or is empty, its name in brackets as `ps` shows it
/// (`/proc/PID/comm`, which takes no lock of the process's memory).
fn command_line(pid: u32) -> Vec<u8> {
    match read_within(format!("/proc/{pid}/cmdline"), CMDLINE_WAIT) {
        Some(cmd) if !cmd.is_empty() => cmd,
        _ => {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            format!("[{}]", comm.trim_end()).into_bytes()
        }
    }
}

fn silent(pid: u32) -> String {
    let argv: Vec<Vec<u8>> = command_line(pid).split(|&b| b == 0).map(<[u8]>::to_vec).collect();
    if argv.len() > 1 && argv[0].ends_with(b"ztier") && argv[1] == b"run" {
        // `$!` after `ztier run ... &` is this one.
        let kids = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        return format!(
            "process {pid} is `ztier run` itself, not its program: ask its child ({})",
            kids.split_whitespace().collect::<Vec<_>>().join(", ")
        );
    }
    format!(
        "process {pid} does not answer: is it running under `ztier run`, and has it started ztier's \
         library (a process does once it has asked for 1 MiB of memory or made a second thread)?"
    )
}

/// Whether process `pid` is stopped (`T`, or `t` under a tracer), by
/// `/proc/PID/stat`: it cannot answer until it runs again.
fn stopped(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit(')').next().and_then(|r| r.split_whitespace().next()).is_some_and(|s| s == "T" || s == "t")
}

/// The processes with a control socket `@ztier-PID` in this network
/// namespace (`/proc/net/unix`), by PID.
fn managed_processes() -> Result<Vec<u32>> {
    let table = std::fs::read_to_string("/proc/net/unix").context("reading /proc/net/unix")?;
    let mut pids: Vec<u32> = table
        .lines()
        .filter_map(|l| {
            l.split_whitespace().nth(7)?.strip_prefix('@')?.strip_prefix(control::SOCKET_PREFIX)?.parse().ok()
        })
        .collect();
    pids.sort_unstable();
    pids.dedup();
    Ok(pids)
}

/// `ztier stats` with no PID: every process under `ztier run`, a line
/// each (or with `json`, an array of their statistics). A process that
/// refuses (another user's) or does not answer within a second (a
/// stopped one) is listed as such.
pub fn list(json: bool) -> Result<i32> {
    let mut rows = Vec::new();
    for pid in managed_processes()? {
        let answer = Control::connect(pid).and_then(|c| c.ask(control::STATS, Duration::from_secs(1)));
        let cmd = command_line(pid);
        // On one line: arguments apart by a space, a newline in one shown as one.
        let cmd: String =
            String::from_utf8_lossy(&cmd).chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
        let cmd = cmd.trim_end().to_string();
        rows.push((pid, cmd, answer));
    }
    if !json && rows.is_empty() {
        eprintln!("ztier stats: no process under `ztier run` answers here");
        return Ok(0);
    }
    let text = if json {
        // A process that did not answer is there too, with why.
        let all: Vec<Value> = rows
            .iter()
            .map(|(pid, _, v)| match v {
                Ok(v) => v.clone(),
                Err(e) => serde_json::json!({ "pid": pid, "error": format!("{e:#}") }),
            })
            .collect();
        serde_json::to_string_pretty(&all)? + "\n"
    } else {
        table(&rows)
    };
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        // A reader that stopped early (`| head`) is no error.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(0),
    }
}

/// The lines of `ztier stats` with no PID.
fn table(rows: &[(u32, String, Result<Value>)]) -> String {
    use std::fmt::Write;
    let mut out = format!(
        "{:>8} {:>10} {:>10} {:>22} {:>6} {:>10} {:>10} {:>7} {:>4}  command\n",
        "PID", "budget", "resident", "stored (orig → mem)", "ratio", "spilled", "faults", "p50 µs", "held"
    );
    let mib = |v: &Value, k: &str| v[k].as_u64().unwrap_or(0) as f64 / f64::from(1 << 20);
    for (pid, cmd, v) in rows {
        let cmd: String = cmd.chars().take(60).collect();
        let _ = match v {
            Ok(v) => {
                let (orig, mem) = (mib(v, stats::STORE_ORIG_BYTES_NOW), mib(v, stats::STORE_BYTES_NOW));
                let held = v[stats::HELD_BY].as_array().is_some_and(|h| !h.is_empty());
                writeln!(
                    out,
                    "{pid:>8} {:>6.1} MiB {:>6.1} MiB {:>22} {:>6} {:>6.1} MiB {:>10} {:>7} {:>4}  {cmd}",
                    mib(v, stats::BUDGET_BYTES),
                    mib(v, stats::RESIDENT_BYTES),
                    format!("{orig:.1} → {mem:.1} MiB"),
                    if mem > 0.0 { format!("{:.2}", orig / mem) } else { "-".into() },
                    mib(v, stats::SPILLED_BYTES),
                    v[stats::FAULTS].as_u64().unwrap_or(0),
                    v[stats::FAULT_P50_US].as_f64().unwrap_or(0.0),
                    if held { "yes" } else { "-" },
                )
            }
            Err(e) => {
                let e = format!("{e:#}");
                let why = if e.contains("refused") {
                    "refused: another user's process"
                } else if e.contains("has not answered") {
                    "no answer within 1 s: stopped?"
                } else {
                    "does not answer"
                };
                writeln!(out, "{pid:>8} {why:>87}  {cmd}")
            }
        };
    }
    out
}

/// Arguments of `ztier hold`.
#[derive(Args, Debug)]
#[command(after_long_help = "Examples:\n  \
    ztier hold 1234 -- gdb -p 1234                  debug it; released when gdb ends\n  \
    ztier hold 1234 -- py-spy dump --pid 1234       a Python program's stacks\n  \
    ztier hold --tree 1234 -- py-spy dump --subprocesses --pid 1234\n                                                  \
    and its child processes' too\n  \
    ztier hold 1234                                 held until Ctrl-C\n\n\
Why: a page kept compressed is missing from the program's memory, and the kernel\n\
serves no userfaultfd fault for another process's access, so debuggers and\n\
profilers that read a process from outside (ptrace, /proc/PID/mem,\n\
process_vm_readv) fail on it (\"Cannot access memory\", EIO). Held, every page the\n\
program has used is in memory. Memory it never touched, or freed, still reads as\n\
an error from outside.\n\n\
While held the program may go over its budget by everything it had evicted:\n\
ztier hold says how much came back, and refuses if that would not fit in the\n\
memory available. Under one budget for the whole command (--budget-scope tree,\n\
the default) its held pages count there too: the command's other processes\n\
evict more meanwhile. The hold is renewed every second; the library ends one not\n\
renewed for 5 s, so a killed ztier hold leaves nothing behind. Several holds at\n\
once are fine: eviction resumes when the last ends. An exec'd program is held\n\
again at the next renewal; a forked child is not held, unless with --tree: then\n\
every descendant of PID under ztier run is held as well (children, theirs, ...),\n\
each one found within a second of its start (a pool's workers, a compiler's cc1),\n\
for debuggers that follow forks and profilers that sample subprocesses. A stopped\n\
process is refused (it cannot bring its pages back until it runs): hold it before\n\
the debugger attaches, by running the debugger as the hold's command.")]
pub struct HoldArgs {
    /// Process id of a program running under `ztier run`.
    pub pid: u32,
    /// Hold its descendants under `ztier run` too: those running now and
    /// those started while the hold lasts (each found at the next
    /// renewal, within a second; its pages come back then). The hold
    /// then lasts, without a command, until every held process has ended.
    #[arg(long)]
    pub tree: bool,
    /// A command to run while the process is held (a debugger, a
    /// profiler); its exit status is ztier hold's, and SIGTERM or SIGHUP
    /// sent to ztier hold are passed on to it (SIGINT is not: at a
    /// terminal Ctrl-C reaches it by itself). Without one, the hold lasts
    /// until ztier hold gets SIGINT (Ctrl-C), SIGTERM or SIGHUP, or the
    /// process ends.
    #[arg(last = true)]
    pub cmd: Vec<std::ffi::OsString>,
}

/// How long the first hold may take to answer: it brings every evicted
/// page back first (about 0.5 s a GiB here).
const FIRST_WAIT: Duration = Duration::from_secs(60);

/// How often the hold is renewed (the library's lease is 5 s).
const RENEW_EVERY: Duration = Duration::from_secs(1);

/// Arguments of `ztier stats`.
#[derive(Args, Debug)]
#[command(after_long_help = "Examples:\n  \
    ztier stats 1234            one process's statistics (JSON)\n  \
    ztier stats                 a line per process under ztier run\n  \
    ztier stats --json          the same as a JSON array of their statistics\n\n\
Without PID it lists the processes that answer on a control socket @ztier-PID\n\
in this network namespace (/proc/net/unix), the program's user and root only:\n\
others refuse, and are listed as refusing; one that has not answered within 1 s\n\
(a stopped one) is listed so, and in --json as {\"pid\", \"error\"}.")]
pub struct StatsArgs {
    /// Process id of a program running under `ztier run`; without one, every
    /// process under `ztier run` on this machine, a line each.
    pub pid: Option<u32>,
    /// With no PID: a JSON array of each process's statistics instead of
    /// the table.
    #[arg(long)]
    pub json: bool,
}

/// `ztier stats PID`: asks the library inside a running program for its
/// statistics through its control socket (see the module docs), and
/// prints them.
pub fn stats(a: StatsArgs) -> Result<i32> {
    let Some(pid) = a.pid else { return list(a.json) };
    let v = Control::connect(pid)?.ask(control::STATS, std::time::Duration::from_secs(5))?;
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", crate::launch::pretty(&v)?)?;
    Ok(0)
}

/// `ztier hold PID [-- CMD ...]`: see [`HoldArgs`] and the module docs.
pub fn hold(a: HoldArgs) -> Result<i32> {
    if let Some(cmd) = a.cmd.first() {
        // Before the hold: nothing to undo then.
        if let Err(code) = crate::launch::runnable(cmd) {
            return Ok(code);
        }
    }
    let ctl = Control::connect(a.pid)?;
    if stopped(a.pid) {
        bail!(
            "process {} is stopped, and cannot bring its pages back until it runs again: hold it first, \
             and run the debugger as the hold's command (ztier hold {} -- gdb -p {})",
            a.pid,
            a.pid,
            a.pid
        );
    }
    // Caught from before the hold, so that no Ctrl-C leaves it in force
    // unreleased (it would lapse, but 5 s later).
    let caught = crate::launch::CatchSignals::new();
    let v = match ctl.ask(control::HOLD, FIRST_WAIT) {
        Ok(v) => v,
        Err(e) => {
            // Should it be read later (the process stopped meanwhile),
            // undone right after.
            let _ = ctl.send_nowait(control::RELEASE);
            return Err(e);
        }
    };
    if let Some(why) = v.get(control::reply::ERROR) {
        bail!("process {} cannot be held: {}", a.pid, why.as_str().unwrap_or("no reason given"));
    }
    let mib = |k: &str| v[k].as_u64().unwrap_or(0) as f64 / f64::from(1 << 20);
    eprintln!(
        "ztier hold: process {} held: {:.1} MiB brought back, {:.1} MiB resident (budget {:.1} MiB); {}",
        a.pid,
        mib(control::reply::BROUGHT_BACK_BYTES),
        mib(stats::RESIDENT_BYTES),
        mib(stats::BUDGET_BYTES),
        if a.cmd.is_empty() { "Ctrl-C releases it" } else { "released when the command ends" }
    );
    let done = AtomicBool::new(false);
    let (code, (gone, others)) = std::thread::scope(|s| {
        let renewer = s.spawn(|| renew(&ctl, a.tree, &done));
        let code = if a.cmd.is_empty() {
            while !crate::launch::signal_pending() && !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(0)
        } else {
            run_command(&a.cmd)
        };
        done.store(true, Ordering::Relaxed);
        let ended = renewer.join().unwrap_or((true, Vec::new()));
        (code, ended)
    });
    drop(caught);
    for c in &others {
        release(c);
    }
    if gone {
        eprintln!("ztier hold: process {} has ended or left ztier", a.pid);
        return code;
    }
    release(&ctl);
    code
}

/// Ends this hold of `ctl`'s process, and says so.
fn release(ctl: &Control) {
    // Renewals still unanswered are answered first, in order.
    let release = ctl.ask(control::RELEASE, Duration::from_secs(2)).and_then(|mut v| {
        while v[control::reply::REQUEST].as_str().map(str::as_bytes) != Some(control::RELEASE) {
            v = ctl.answer(Duration::from_secs(2))?;
        }
        Ok(v)
    });
    match release {
        Ok(v) if v[control::reply::HELD] == Value::Bool(true) => {
            eprintln!(
                "ztier hold: process {} released by this hold; still held by {}",
                ctl.pid,
                v[stats::HELD_BY]
            )
        }
        Ok(_) => eprintln!("ztier hold: process {} released", ctl.pid),
        Err(e) => eprintln!(
            "ztier hold: {e:#}; its hold lapses 5 s after it runs again (it is not renewed any more)"
        ),
    }
}

/// The descendants of process `pid`: its children (those of each of its
/// threads, `/proc/PID/task/TID/children`), theirs, and so on.
fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else { continue };
        for t in tasks.flatten() {
            let kids = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            for k in kids.split_whitespace().filter_map(|k| k.parse::<u32>().ok()) {
                if !out.contains(&k) {
                    out.push(k);
                    todo.push(k);
                }
            }
        }
    }
    out
}

/// A descendant held with `--tree`: its control socket, and whether its
/// first answer (the pages it brought back) was shown.
struct Kin {
    ctl: Control,
    shown: bool,
}

/// With `--tree`: renews the hold of each descendant held, and holds
/// each descendant under `ztier run` not held yet, without waiting for
/// its pages; shows the answers that came; drops the processes gone or
/// that refused (kept in `skip`, not asked again). The descendants are
/// `root`'s while it lives (the held ones among them), else those of
/// the processes still held (`root_gone`).
fn hold_kin(root: u32, root_gone: bool, kin: &mut Vec<Kin>, skip: &mut Vec<u32>) {
    let Ok(managed) = managed_processes() else { return };
    // Renewed first, so that a process asked below is asked once; one
    // gone (ended, or left `ztier run` by `exec`) is dropped.
    kin.retain(|k| k.ctl.send_nowait(control::HOLD).is_ok());
    let tree: Vec<u32> =
        if root_gone { kin.iter().flat_map(|k| descendants(k.ctl.pid)).collect() } else { descendants(root) };
    for pid in tree {
        if pid == root
            || !managed.contains(&pid)
            || skip.contains(&pid)
            || kin.iter().any(|k| k.ctl.pid == pid)
        {
            continue;
        }
        // Not answering yet (its library still starting): asked again
        // at the next renewal.
        let Ok(ctl) = Control::connect(pid) else { continue };
        if ctl.send_nowait(control::HOLD).is_ok() {
            kin.push(Kin { ctl, shown: false });
        }
    }
    kin.retain_mut(|k| {
        while let Some(v) = k.ctl.poll_answer() {
            if let Some(why) = v.get(control::reply::DENIED).or(v.get(control::reply::ERROR)) {
                eprintln!(
                    "ztier hold: process {} (of {root}'s tree) cannot be held: {}",
                    k.ctl.pid,
                    why.as_str().unwrap_or("no reason given")
                );
                skip.push(k.ctl.pid);
                return false;
            }
            if !k.shown && v[control::reply::HELD] == Value::Bool(true) {
                k.shown = true;
                let mib = |f: &str| v[f].as_u64().unwrap_or(0) as f64 / f64::from(1 << 20);
                eprintln!(
                    "ztier hold: process {} (of {root}'s tree) held: {:.1} MiB brought back, {:.1} MiB \
                     resident (budget {:.1} MiB)",
                    k.ctl.pid,
                    mib(control::reply::BROUGHT_BACK_BYTES),
                    mib(stats::RESIDENT_BYTES),
                    mib(stats::BUDGET_BYTES),
                );
            }
        }
        true
    });
}

/// Renews the hold every [`RENEW_EVERY`] until `done`, and with `tree`
/// holds the process's descendants too ([`hold_kin`], at once and at each
/// renewal). Returns whether the process's socket went away (it ended,
/// or left `ztier run` by `exec`) and the descendants still held. With
/// descendants held, the hold goes on after the process is gone, until
/// they are too.
fn renew(ctl: &Control, tree: bool, done: &AtomicBool) -> (bool, Vec<Control>) {
    let (mut kin, mut skip) = (Vec::new(), Vec::new());
    let mut gone = false;
    let mut next = std::time::Instant::now();
    let mut first = true;
    while !done.load(Ordering::Relaxed) {
        if std::time::Instant::now() < next {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        next += RENEW_EVERY;
        if tree {
            hold_kin(ctl.pid, gone, &mut kin, &mut skip);
        }
        // The first hold was just answered: renewed from the next round.
        if !gone && !std::mem::take(&mut first) {
            ctl.drain();
            gone = ctl.send_nowait(control::HOLD).is_err();
        }
        if gone && kin.is_empty() {
            done.store(true, Ordering::Relaxed);
        }
    }
    (gone, kin.into_iter().map(|k| k.ctl).collect())
}

/// Runs `cmd` with ztier hold's standard streams; its exit status (128 +
/// the signal that killed it). `SIGTERM` and `SIGHUP` sent to ztier hold
/// meanwhile are passed on to it; `SIGINT` is not: at a terminal Ctrl-C
/// reaches the command by itself, and a debugger takes it to stop its
/// program (twice, it asks whether to give up).
fn run_command(cmd: &[std::ffi::OsString]) -> Result<i32> {
    use std::os::unix::process::ExitStatusExt;
    let mut child = std::process::Command::new(&cmd[0])
        .args(&cmd[1..])
        .spawn()
        .with_context(|| format!("running {}", cmd[0].to_string_lossy()))?;
    let status = loop {
        if let Some(st) = child.try_wait().context("waiting for the command")? {
            break st;
        }
        match crate::launch::take_signal() {
            sig @ (libc::SIGTERM | libc::SIGHUP) => {
                // SAFETY: signalling our own child, not yet reaped.
                unsafe { libc::kill(child.id() as i32, sig) };
            }
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    Ok(status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read that blocks (a FIFO nobody writes) gives up at the limit;
    /// one that does not returns the bytes; a process's command line
    /// falls back to its name.
    #[test]
    fn a_read_that_blocks_gives_up_at_the_limit() {
        let dir = std::env::temp_dir().join(format!("ztier-read-within-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let t = std::time::Instant::now();
        assert_eq!(read_within(fifo.to_str().unwrap().to_string(), Duration::from_millis(200)), None);
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(200) && took < Duration::from_secs(5), "{took:?}");
        // Let the blocked reader go: a writer opens and closes (EOF).
        drop(std::fs::OpenOptions::new().write(true).open(&fifo).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();

        let me = read_within("/proc/self/cmdline".into(), CMDLINE_WAIT).unwrap();
        assert!(!me.is_empty());
        assert_eq!(command_line(std::process::id()), std::fs::read("/proc/self/cmdline").unwrap());
        // A process with no command line (a zombie: its memory is gone)
        // shows its name in brackets.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let stat = format!("/proc/{}/stat", child.id());
        let t = std::time::Instant::now();
        while !std::fs::read_to_string(&stat).unwrap().contains(") Z ") {
            assert!(t.elapsed() < Duration::from_secs(10), "`true` did not exit");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(command_line(child.id()), b"[true]");
        child.wait().unwrap();
    }
}
