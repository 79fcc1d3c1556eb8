//! `ztier` — the command-line front end. It parses arguments and wires the
//! library crates together; the logic lives in those crates (launching and
//! measuring `ztier run` in this package's library, `ztier_launch`). Each
//! subcommand has its own module under `cmd/`.

use clap::{CommandFactory, Parser, Subcommand};

mod cmd;

use ztier_launch::{launch, remote_args, scratch, units};

/// ztier: compressed caching in user space.
///
/// Keeps pages and blocks compressed in RAM (or on a fast device) instead of
/// writing them to slow storage: compressed memory for unmodified programs,
/// a compressed block device, a trace-driven simulator and benchmarks against
/// the kernel's and other peers'.
#[derive(Parser, Debug)]
#[command(
    name = "ztier",
    version,
    about,
    long_about,
    after_long_help = "Examples:\n  \
    ztier demo                                   compare every codec on the bundled corpus\n  \
    ztier bench codecs --corpus a.pages --json   one JSON object with ratio and MB/s per codec\n  \
    ztier bench codecs --pid 1234 --codecs wkdm,lz4\n\n\
Codecs: wkdm, wk4x4, wk64 (word codecs for memory pages), lzo (LZO1X-1), lz4, zstd, deflate,\n\
hybrid (WKdm, then LZ4 for pages WKdm does poorly on), raw.\n\
Sizes take K, M, G suffixes (powers of 1024); lists are comma-separated."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// (Made once per process: a large variant costs nothing.)
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Run the end-to-end demonstration on built-in defaults.
    Demo(cmd::demo::DemoArgs),
    /// Measure ztier's components side by side with their peers.
    #[command(subcommand)]
    Bench(cmd::bench::BenchCommand),
    /// Replay a page trace through compressed-cache policies: faults,
    /// compressed hits and paging time per memory size, policy and disk cost.
    Sim(cmd::sim::SimArgs),
    /// Record, import and inspect page traces of real programs.
    #[command(subcommand)]
    Trace(cmd::trace::TraceCommand),
    /// A compressed block device (log-structured compressed extents,
    /// cleaner, crash-safe) served over NBD.
    #[command(subcommand)]
    Blk(cmd::blk::BlkCommand),
    /// A compressed cache in front of slow storage (a file, a block device
    /// or an NBD export), served over NBD: FlaZ's compressed SSD cache and
    /// a compressed RAM cache of clean blocks.
    #[command(subcommand)]
    Cache(cmd::cache::CacheCommand),
    /// Run an unmodified program with its heap under a memory budget: colder
    /// pages are kept compressed and served back on touch by userfaultfd.
    Run(launch::RunArgs),
    /// Live statistics of a program running under `ztier run`, or of all.
    ///
    /// Asks the program's library, through its control socket, for the
    /// statistics that `ztier run --stats` writes at exit (JSON on stdout,
    /// with the fault service histogram `latency_ns`). Only the program's
    /// user and root are answered, and only an answer from the process
    /// asked is trusted. A process that has not answered within 5 s (a
    /// stopped one) is said to be so. Without a PID, a line per process
    /// under `ztier run`: budget, resident, what its store holds now and
    /// at what ratio, spilled, faults, fault p50, whether it is held.
    Stats(cmd::hold::StatsArgs),
    /// Keep a program running under `ztier run` wholly in memory, for a
    /// debugger or profiler.
    ///
    /// Brings back every page the program has evicted and stops its
    /// eviction, while a command runs (`ztier hold PID -- gdb -p PID`) or
    /// until Ctrl-C: tools that read a process from outside (gdb, py-spy,
    /// /proc/PID/mem) cannot read evicted pages. Only the program's user
    /// and root may hold it.
    Hold(cmd::hold::HoldArgs),
    /// Summarise a `ztier run --fault-log` file: page-ins by kind, store
    /// faults by run length and service time, refault distances, pages
    /// that came back again and again, and page-ins over time.
    Faults(cmd::faults::FaultsArgs),
    /// The remote tier (`ztier run --remote`): remove what killed runs left.
    #[command(subcommand)]
    Remote(cmd::remote::RemoteCommand),
    /// Write the manual pages (ztier.1 and one per subcommand) into DIR.
    Man(cmd::docs::ManArgs),
    /// Print the shell completion script for SHELL (bash, elvish, fish,
    /// powershell, zsh).
    Completions(cmd::docs::CompletionsArgs),
}

/// Commands that only print to stdout end quietly when its reader goes
/// away (`ztier trace info T | head`), as other filters do, instead of
/// panicking in `println!`. The serving and launching commands keep
/// SIGPIPE ignored: a client that hangs up must not kill a server.
fn default_sigpipe_for_filters(command: &Command) {
    if matches!(command, Command::Sim(_) | Command::Trace(_) | Command::Faults(_) | Command::Completions(_)) {
        // SAFETY: restoring the default disposition of SIGPIPE before any
        // thread is started; no handler function is installed.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
}

fn main() {
    let cli = Cli::parse();
    default_sigpipe_for_filters(&cli.command);
    let result = match cli.command {
        Command::Demo(a) => cmd::demo::run(a),
        Command::Bench(b) => cmd::bench::run(b),
        Command::Sim(a) => cmd::sim::run(a),
        Command::Trace(t) => cmd::trace::run(t),
        Command::Blk(b) => cmd::blk::run(b),
        Command::Cache(c) => cmd::cache::run(c),
        Command::Run(a) => cmd::run::run(a),
        Command::Stats(a) => cmd::hold::stats(a),
        Command::Hold(a) => cmd::hold::hold(a),
        Command::Faults(a) => cmd::faults::run(a),
        Command::Remote(c) => cmd::remote::run(c),
        Command::Man(a) => cmd::docs::man(a, Cli::command()),
        Command::Completions(a) => cmd::docs::completions(a, Cli::command()),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("ztier: error: {e:#}");
            std::process::exit(1);
        }
    }
}
