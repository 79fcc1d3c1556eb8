//! What the manager (the `manager` module) asks of the library it runs in:
//! a [`Host`], a set of plain functions the preloaded library supplies
//! once at start-up ([`set`]) — its own system-call entry (which Syscall
//! User Dispatch lets through), its books of descriptors kept from the
//! program's `close`, its log, the settings it read at start-up, its
//! core-dump hooks, the remote tier's client and what it knows of the
//! program's allocator. Until one is set (in this crate's tests, and in
//! any program that is not the preloaded library) [`PLAIN`] stands in:
//! plain system calls, descriptors left where they are, notices on
//! stderr, settings from the environment.
//!
//! None of these is on the path of a fault: they are called at start-up,
//! at a fork, when a file is opened, when something is said, and once
//! per run of victims an eviction batch checks (a `mincore`), so an
//! indirect call each costs nothing measurable.

use std::io;
use std::sync::OnceLock;

use ztier_store::tier::NextTier;

/// The library's side of the manager (see the module docs).
pub struct Host {
    /// A system call through the library's own entry, never caught by
    /// Syscall User Dispatch: `nr` and six arguments; the kernel's
    /// result (`-errno` on failure).
    pub raw: fn(nr: i64, args: [u64; 6]) -> i64,
    /// Moves a descriptor the library just made out of the program's way
    /// and keeps it from the program's `close`; returns its number now.
    pub keep_fd: fn(fd: i32) -> i32,
    /// Keeps a descriptor from the program's `close` where it is.
    pub register_fd: fn(fd: i32),
    /// The library closes a kept descriptor: no longer kept.
    pub forget_fd: fn(fd: i32),
    /// The lowest number a kept descriptor is moved to (0: not moved).
    pub low_fd: fn() -> i32,
    /// Says one line in the run's log.
    pub notice: fn(args: std::fmt::Arguments),
    /// A setting (`ZTIER_*`) as the library read it at start-up.
    pub knob: fn(name: &str) -> Option<String>,
    /// Leaves `[base, base + len)`, the library's own memory, out of the
    /// program's core dumps.
    pub exclude_from_core: fn(base: usize, len: usize),
    /// The remote tier (`ztier run --remote`), if the run set one up.
    pub remote_tier: fn() -> io::Result<Option<Box<dyn NextTier>>>,
    /// The program's executable has a `malloc` of its own (its fork
    /// handlers then touch the arena: see the manager's `signal_path`).
    pub program_has_own_malloc: fn() -> bool,
}

/// The host of a program that is not the preloaded library (this crate's
/// tests): plain `syscall(2)`, descriptors left where they are, notices
/// on stderr, settings read from the environment, no core-dump hooks, no
/// remote tier.
pub static PLAIN: Host = Host {
    raw: plain_raw,
    keep_fd: |fd| fd,
    register_fd: |_| {},
    forget_fd: |_| {},
    low_fd: || 0,
    notice: |args| eprintln!("{args}"),
    knob: |name| std::env::var(name).ok(),
    exclude_from_core: |_, _| {},
    remote_tier: || Ok(None),
    program_has_own_malloc: || false,
};

fn plain_raw(nr: i64, a: [u64; 6]) -> i64 {
    // SAFETY: the arguments are the caller's, valid for this call; the
    // kernel checks them.
    let r = unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]) };
    if r < 0 {
        -(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO) as i64)
    } else {
        r
    }
}

static HOST: OnceLock<&'static Host> = OnceLock::new();

/// Sets the host, once, before the first manager is made; later calls
/// change nothing (`false`).
pub fn set(host: &'static Host) -> bool {
    HOST.set(host).is_ok()
}

/// The host set by [`set`], or [`PLAIN`].
#[inline]
pub fn host() -> &'static Host {
    HOST.get().copied().unwrap_or(&PLAIN)
}
