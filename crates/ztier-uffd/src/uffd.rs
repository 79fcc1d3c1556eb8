//! The userfaultfd API (linux/userfaultfd.h), by raw syscall and ioctls:
//! open (`/dev/userfaultfd` is not needed: the syscall, falling back to
//! `UFFD_USER_MODE_ONLY` for unprivileged users), API handshake,
//! register/unregister, copy, wake, and reading events.
//!
//! ```text
//!  struct uffd_msg (32 bytes)
//!  ┌───────┬──────────┬──────────┬──────────┬─────────────┬─────────────┬────────┐
//!  │ event │ reserved │ reserved │ reserved │ flags u64   │ address u64 │ ptid   │  pagefault
//!  │  u8   │   u8     │   u16    │   u32    │ (WRITE, WP) │             │ u32 …  │
//!  └───────┴──────────┴──────────┴──────────┴─────────────┴─────────────┴────────┘
//! ```

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::sys;

/// API version.
pub const UFFD_API: u64 = 0xAA;
/// Register for missing-page faults.
pub const REGISTER_MODE_MISSING: u64 = 1;
/// Register for write-protect faults.
pub const REGISTER_MODE_WP: u64 = 2;
/// Only user-mode faults (unprivileged use).
pub const USER_MODE_ONLY: libc::c_int = 1;
/// `UFFD_FEATURE_SIGBUS`: a fault raises `SIGBUS` in the faulting thread
/// instead of waiting for a handler to read it (Linux 4.14).
pub const FEATURE_SIGBUS: u64 = 1 << 7;
/// `UFFD_FEATURE_THREAD_ID` (Linux 4.14): a fault event names the
/// faulting thread ([`Event::tid`]).
pub const FEATURE_THREAD_ID: u64 = 1 << 8;

const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;
const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00;
const UFFDIO_UNREGISTER: libc::c_ulong = 0x8010_aa01;
const UFFDIO_WAKE: libc::c_ulong = 0x8010_aa02;
const UFFDIO_COPY: libc::c_ulong = 0xc028_aa03;
const UFFDIO_WRITEPROTECT: libc::c_ulong = 0xc018_aa06;
/// `/dev/userfaultfd`'s one ioctl: a new userfaultfd (`_IO(0xAA, 0)`).
const USERFAULTFD_IOC_NEW: libc::c_ulong = 0xaa00;
/// `UFFDIO_COPY_MODE_DONTWAKE`.
const COPY_MODE_DONTWAKE: u64 = 1 << 0;
/// `UFFDIO_COPY_MODE_WP`.
const COPY_MODE_WP: u64 = 1 << 1;

/// Page fault event.
pub const EVENT_PAGEFAULT: u8 = 0x12;
/// The fault was a write.
pub const PAGEFAULT_FLAG_WRITE: u64 = 1;
/// The fault was a write to a write-protected page.
pub const PAGEFAULT_FLAG_WP: u64 = 2;

#[repr(C)]
struct ApiArg {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Range {
    start: u64,
    len: u64,
}

#[repr(C)]
struct RegisterArg {
    range: Range,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct CopyArg {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

#[repr(C)]
struct WriteProtectArg {
    range: Range,
    mode: u64,
}

/// Maps `len` bytes of fresh private anonymous read-write memory (the
/// kind of range a userfaultfd registers here); returns its address.
pub fn map_anonymous(len: usize) -> io::Result<usize> {
    // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        Err(io::Error::last_os_error())
    } else {
        Ok(p as usize)
    }
}

/// One event read from the descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// Event type (`EVENT_PAGEFAULT`, …).
    pub kind: u8,
    /// Fault flags.
    pub flags: u64,
    /// Faulting address.
    pub address: u64,
    /// The faulting thread, with [`FEATURE_THREAD_ID`] (0 without).
    pub tid: u32,
}

/// An open userfaultfd.
pub struct Uffd {
    fd: OwnedFd,
    /// Features the kernel reported.
    pub features: u64,
    /// Opened with `UFFD_USER_MODE_ONLY`: faults the kernel takes on the
    /// program's behalf (a `read()` into a missing page) are not reported
    /// but fail the system call with `EFAULT`.
    pub user_mode_only: bool,
    /// Opened with [`FEATURE_SIGBUS`]: no fault is ever read from this
    /// descriptor; each raises `SIGBUS` in the faulting thread (and a
    /// fault the kernel takes fails its system call with `EFAULT`).
    pub sigbus: bool,
}

/// What an install found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installed {
    /// The page is in place.
    Done,
    /// Another thread installed it first (EEXIST): nothing to do.
    AlreadyThere,
    /// The range changed under us (EAGAIN); retry after reading events.
    Retry,
}

fn ioctl<T>(fd: RawFd, req: libc::c_ulong, arg: &mut T) -> io::Result<()> {
    // SAFETY: `arg` points to a live, correctly laid out argument for `req`.
    let r = unsafe { libc::ioctl(fd, req, arg as *mut T) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl Uffd {
    /// Opens a userfaultfd (non-blocking — the kernel's poll reports POLLERR
    /// on a blocking one — and close-on-exec) and negotiates
    /// the API. Tries full mode first, then user-mode-only (which works
    /// for unprivileged users); the error says when neither works.
    pub fn open() -> io::Result<Uffd> {
        Uffd::open_with(false)
    }

    /// As [`Uffd::open`]; with `user_mode_only`, only `UFFD_USER_MODE_ONLY`
    /// is tried (what an unprivileged user gets; for tests run as root).
    pub fn open_with(user_mode_only: bool) -> io::Result<Uffd> {
        Uffd::open_opts(user_mode_only, false)
    }

    /// As [`Uffd::open_with`]; with `sigbus`, faults raise `SIGBUS` in the
    /// faulting thread ([`FEATURE_SIGBUS`]; an error if the kernel lacks it).
    pub fn open_opts(user_mode_only: bool, sigbus: bool) -> io::Result<Uffd> {
        Uffd::open_via(None, user_mode_only, |_| sigbus)
    }

    /// Opens `/dev/userfaultfd` (Linux 6.1; close-on-exec), from which
    /// [`Uffd::open_via`] makes full-mode userfaultfds. Permission is
    /// checked at this open only, so a process that drops its privileges
    /// later (`setuid`) can still make one, for a child it forks. `None`
    /// if the device is missing or not this user's to open.
    pub fn open_device() -> Option<OwnedFd> {
        // SAFETY: a NUL-terminated path; a plain open.
        let fd = unsafe { libc::open(c"/dev/userfaultfd".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        // SAFETY: a fresh descriptor we own.
        (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// As [`Uffd::open_opts`]; a full-mode userfaultfd is asked of the
    /// device `dev` ([`Uffd::open_device`]) first, then of the system call.
    /// `sigbus` is asked, once the descriptor is open, whether faults
    /// should raise `SIGBUS`, given whether it is user-mode-only (what an
    /// unprivileged user gets when full mode is refused).
    pub fn open_via(
        dev: Option<RawFd>,
        user_mode_only: bool,
        sigbus: impl FnOnce(bool) -> bool,
    ) -> io::Result<Uffd> {
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        let mut fd = Err(io::Error::from_raw_os_error(libc::ENOENT));
        let mut umo = user_mode_only;
        if let (false, Some(dev)) = (user_mode_only, dev) {
            // SAFETY: USERFAULTFD_IOC_NEW takes the new descriptor's flags
            // as its integer argument.
            let r = unsafe { libc::ioctl(dev, USERFAULTFD_IOC_NEW, flags) };
            fd = if r < 0 {
                Err(io::Error::last_os_error())
            } else {
                // SAFETY: r is a fresh descriptor we own.
                Ok(unsafe { OwnedFd::from_raw_fd(r) })
            };
        }
        if !user_mode_only && fd.is_err() {
            fd = sys::userfaultfd(flags);
        }
        if fd.is_err() {
            umo = true;
            fd = sys::userfaultfd(flags | USER_MODE_ONLY);
        }
        let fd = fd.map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "userfaultfd is not available ({e}); as a non-root user it needs \
                     vm.unprivileged_userfaultfd=1 or kernel support for UFFD_USER_MODE_ONLY"
                ),
            )
        })?;
        let sigbus = sigbus(umo);
        // Faults read from the descriptor name their thread.
        let want = if sigbus { FEATURE_SIGBUS } else { FEATURE_THREAD_ID };
        let mut api = ApiArg { api: UFFD_API, features: want, ioctls: 0 };
        ioctl(fd.as_raw_fd(), UFFDIO_API, &mut api).map_err(|e| {
            if sigbus {
                io::Error::new(e.kind(), format!("userfaultfd with UFFD_FEATURE_SIGBUS (Linux 4.14): {e}"))
            } else {
                e
            }
        })?;
        Ok(Uffd { fd, features: api.features, user_mode_only: umo, sigbus })
    }

    /// Registers `[start, start + len)` for missing-page faults.
    pub fn register(&self, start: usize, len: usize) -> io::Result<()> {
        let mut r = RegisterArg {
            range: Range { start: start as u64, len: len as u64 },
            mode: REGISTER_MODE_MISSING,
            ioctls: 0,
        };
        ioctl(self.fd.as_raw_fd(), UFFDIO_REGISTER, &mut r)
    }

    /// Registers `[start, start + len)` with the given `REGISTER_MODE_*` bits.
    pub fn register_mode(&self, start: usize, len: usize, mode: u64) -> io::Result<()> {
        let mut r = RegisterArg { range: Range { start: start as u64, len: len as u64 }, mode, ioctls: 0 };
        ioctl(self.fd.as_raw_fd(), UFFDIO_REGISTER, &mut r)
    }

    /// Write-protects (`wp`) or unprotects a range of a range registered
    /// with `REGISTER_MODE_WP`. Unprotecting wakes the threads waiting on it.
    pub fn writeprotect(&self, start: usize, len: usize, wp: bool) -> io::Result<()> {
        let mut a =
            WriteProtectArg { range: Range { start: start as u64, len: len as u64 }, mode: u64::from(wp) };
        ioctl(self.fd.as_raw_fd(), UFFDIO_WRITEPROTECT, &mut a)
    }

    /// The raw descriptor (for polling next to other descriptors).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Moves the descriptor to the lowest free number at or above `min`
    /// (close-on-exec), out of the way of a program's own numbers; stays
    /// if it is there already or `min` is 0.
    pub fn move_fd_up(&mut self, min: RawFd) -> io::Result<()> {
        if min <= 0 || self.fd.as_raw_fd() >= min {
            return Ok(());
        }
        // SAFETY: duplicating our own descriptor.
        let up = unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, min) };
        if up < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own; the old one is closed as it
        // is dropped.
        self.fd = unsafe { OwnedFd::from_raw_fd(up) };
        Ok(())
    }

    /// Unregisters a range.
    pub fn unregister(&self, start: usize, len: usize) -> io::Result<()> {
        let mut r = Range { start: start as u64, len: len as u64 };
        ioctl(self.fd.as_raw_fd(), UFFDIO_UNREGISTER, &mut r)
    }

    /// Wakes threads waiting on faults in a range.
    pub fn wake(&self, start: usize, len: usize) -> io::Result<()> {
        let mut r = Range { start: start as u64, len: len as u64 };
        ioctl(self.fd.as_raw_fd(), UFFDIO_WAKE, &mut r)
    }

    /// Copies `src` (page-aligned length) to `dst` in the registered range
    /// and wakes the faulting threads.
    pub fn copy(&self, dst: usize, src: &[u8]) -> io::Result<Installed> {
        self.copy_mode(dst, src, false)
    }

    /// As [`Uffd::copy`]; with `wp` the pages are installed write-protected
    /// (`UFFDIO_COPY_MODE_WP`: the first write raises a write-protect fault;
    /// the range must be registered with `REGISTER_MODE_WP`).
    pub fn copy_mode(&self, dst: usize, src: &[u8], wp: bool) -> io::Result<Installed> {
        self.copy_with(dst, src, wp, true)
    }

    /// As [`Uffd::copy_mode`]; without `wake` the faulting threads are
    /// left asleep (`UFFDIO_COPY_MODE_DONTWAKE`) for a later
    /// [`Uffd::wake`] — a woken thread on the caller's CPU may preempt
    /// it at once, so a caller holding a lock wakes after releasing it.
    pub fn copy_with(&self, dst: usize, src: &[u8], wp: bool, wake: bool) -> io::Result<Installed> {
        let mode = if wp { COPY_MODE_WP } else { 0 } | if wake { 0 } else { COPY_MODE_DONTWAKE };
        let mut c =
            CopyArg { dst: dst as u64, src: src.as_ptr() as u64, len: src.len() as u64, mode, copy: 0 };
        match ioctl(self.fd.as_raw_fd(), UFFDIO_COPY, &mut c) {
            Ok(()) => Ok(Installed::Done),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                self.wake(dst, src.len())?;
                Ok(Installed::AlreadyThere)
            }
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Ok(Installed::Retry),
            Err(e) => Err(e),
        }
    }

    /// Waits up to `timeout_ms` for an event; `None` on timeout.
    pub fn read_event(&self, timeout_ms: i32) -> io::Result<Option<Event>> {
        let mut p = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one live pollfd.
        let n = unsafe { libc::poll(&mut p, 1, timeout_ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted { Ok(None) } else { Err(e) };
        }
        if n == 0 {
            return Ok(None);
        }
        self.try_read()
    }

    /// Reads an event if one is queued (never blocks).
    pub fn try_read(&self) -> io::Result<Option<Event>> {
        let mut msg = [0u8; 32];
        // SAFETY: reading at most 32 bytes into a 32-byte buffer.
        let r = unsafe { libc::read(self.fd.as_raw_fd(), msg.as_mut_ptr().cast(), msg.len()) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return if e.raw_os_error() == Some(libc::EAGAIN) { Ok(None) } else { Err(e) };
        }
        if r != 32 {
            return Err(io::Error::other(format!("short userfaultfd message ({r} bytes)")));
        }
        Ok(Some(Event {
            kind: msg[0],
            flags: u64::from_ne_bytes(msg[8..16].try_into().expect("8 bytes")),
            address: u64::from_ne_bytes(msg[16..24].try_into().expect("8 bytes")),
            tid: u32::from_ne_bytes(msg[24..28].try_into().expect("4 bytes")),
        }))
    }
}
