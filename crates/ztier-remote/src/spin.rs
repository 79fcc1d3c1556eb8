//! Waiting for a reply that is due within microseconds: a bounded spin
//! before a blocking read.
//!
//! A remote fault waits twice: the process for the proxy's answer and
//! the proxy for the server's (the tier's gets on a single server over
//! plain TCP). A blocking read sleeps and is woken when the bytes
//! come: on an otherwise idle machine that wake-up costs the CPU's exit
//! from an idle state, several µs to tens of µs, on a path whose useful
//! work is a ~20 µs round trip. The proxy serves a get on the CPU of the
//! thread that asked for it, which blocks meanwhile; so the proxy polls
//! the server's connection (`recv` with `MSG_DONTWAIT`) for up to
//! [`FOR_SERVER`], and only then blocks: that CPU stays busy from the
//! process's request to its answer, and neither the proxy's wake-up nor
//! the process's finds it idle. Past the bound the cost is the bound's
//! CPU time and the blocking read as before. The spin does not yield
//! the CPU between polls: on a loaded machine a thread that yielded is
//! not woken by the reply (it is runnable already) and waits for its
//! turn, which doubled the gets' p99 where the blocking read's wake-up
//! preempts at once (measured: `docs/measurements/2026-12-07-remote-fault-path.md`).

use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// How long the proxy spins for a server's reply to a get (a loopback
/// round trip: ~20 µs).
pub const FOR_SERVER: Duration = Duration::from_micros(30);

/// After a spin that came back empty, the reads done without spinning
/// before the next spin. A spin misses when the server is farther than
/// the bound (a real network: spinning would only burn the bound each
/// time) or when it waits for the spinner's CPU (a loaded machine, the
/// server on loopback scheduled there: it waits out the bound). One miss
/// in this many reads keeps the spin's cost and those stalls rare.
pub const OFF_AFTER_MISS: u32 = 256;

/// Reads what `fd` has into `buf`, polling for up to `bound`. `None`: nothing came within the bound (the
/// caller blocks then); `Some(Ok(0))`: the peer closed the connection.
pub fn recv(fd: RawFd, buf: &mut [u8], bound: Duration) -> Option<io::Result<usize>> {
    let mut start: Option<Instant> = None;
    loop {
        // SAFETY: recv writes at most `buf.len()` bytes into `buf`.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n >= 0 {
            return Some(Ok(n as usize));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => {}
            _ => return Some(Err(e)),
        }
        let t = *start.get_or_insert_with(Instant::now);
        if t.elapsed() >= bound {
            return None;
        }
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn gives_what_is_there_or_nothing_after_the_bound() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut buf = [0u8; 16];
        assert!(recv(b.as_raw_fd(), &mut buf, Duration::from_micros(100)).is_none());
        a.write_all(b"abc").unwrap();
        assert_eq!(recv(b.as_raw_fd(), &mut buf, Duration::ZERO).unwrap().unwrap(), 3);
        assert_eq!(&buf[..3], b"abc");
        // Written while the reader spins: read within the bound.
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(1));
            a.write_all(b"z").unwrap();
            a
        });
        let got = recv(b.as_raw_fd(), &mut buf, Duration::from_secs(60)).unwrap().unwrap();
        assert_eq!((got, buf[0]), (1, b'z'));
        drop(h.join().unwrap());
        assert_eq!(recv(b.as_raw_fd(), &mut buf, Duration::ZERO).unwrap().unwrap(), 0, "closed");
    }
}
