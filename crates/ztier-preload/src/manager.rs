//! The manager — page states, eviction, the tree budget, pins, fork
//! bookkeeping — lives in [`ztier_run_core::manager`], testable without
//! `LD_PRELOAD`; this module hands it what it needs of the library (a
//! [`Host`]: the library's own system-call entry, its kept descriptors,
//! its log, its settings, its core-dump hooks, the remote tier's client)
//! and names it for the rest of the library.

use ztier_run_core::host::{self, Host};
pub use ztier_run_core::manager::*;

/// The library as the manager's host.
static HOST: Host = Host {
    raw: crate::sys::raw,
    keep_fd: crate::fds::keep,
    register_fd: crate::fds::register,
    forget_fd: crate::fds::forget,
    low_fd: crate::fds::low,
    notice: crate::notice,
    knob: crate::knob,
    exclude_from_core: crate::coredump::exclude,
    remote_tier: || crate::remote::tier(crate::fds::keep),
    program_has_own_malloc: crate::program_has_own_malloc,
};

/// Makes the library the manager's host: called first thing at start-up,
/// before anything of the manager runs.
pub fn set_host() {
    host::set(&HOST);
}
