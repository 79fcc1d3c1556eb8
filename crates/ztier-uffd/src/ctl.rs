//! The datagrams of `ztier run`'s control socket, with their senders.
//!
//! A program under `ztier run` answers `ztier stats PID` on the abstract
//! datagram socket `@ztier-PID`; the client binds `@ztier-stats-ITSPID`
//! for the answer. Abstract names have no owner and no permission check,
//! so both sides ask the kernel to attach each datagram's sender
//! ([`pass_credentials`]) and read it with the datagram ([`recv`]): the
//! library answers only its program's user and root, and `ztier stats`
//! trusts an answer only from the process it asked.
//!
//! ```text
//!  ztier stats (PID C)                      program (PID P), library thread
//!  bind @ztier-stats-C, SO_PASSCRED         bind @ztier-P, SO_PASSCRED
//!  "stats" ───────────────────────────────▶ recv: sender uid U, name
//!                                           U is the program's or root?
//!  recv: sender pid == P? ◀──────────────── one JSON datagram, or
//!                                           {"denied": "..."}
//! ```

use std::io;
use std::os::fd::RawFd;

/// Has the kernel attach each datagram's sender to it (`SO_PASSCRED`).
pub fn pass_credentials(fd: RawFd) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: a valid option value of its own size, on the caller's socket.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One datagram received by [`recv`].
pub struct Received {
    /// Its length (at most the buffer's).
    pub len: usize,
    /// Its sender's process, user and group IDs, as the kernel attached
    /// them (`None` without [`pass_credentials`] on the socket).
    pub sender: Option<libc::ucred>,
    /// How many bytes of the address given to [`recv`] name the sender
    /// (no more than the address family's for an unnamed sender).
    pub name_len: libc::socklen_t,
}

/// Receives one datagram into `buf` (`flags` as for `recvmsg`), its
/// sender's address into `from` if given.
pub fn recv(
    fd: RawFd,
    buf: &mut [u8],
    from: Option<&mut libc::sockaddr_un>,
    flags: libc::c_int,
) -> io::Result<Received> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // Room for one SCM_CREDENTIALS message (CMSG_SPACE(12) = 32), aligned
    // as a cmsghdr.
    let mut control = [0u64; 8];
    // SAFETY: msghdr is a plain C struct; all zeros is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    if let Some(from) = from {
        msg.msg_name = (from as *mut libc::sockaddr_un).cast();
        msg.msg_namelen = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    }
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    // SAFETY: msg points at live buffers of the sizes it names.
    let n = unsafe { libc::recvmsg(fd, &mut msg, flags) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut sender = None;
    // SAFETY: msg was filled in by recvmsg; CMSG_FIRSTHDR and CMSG_NXTHDR
    // stay within its control buffer, and a credentials message's data is
    // a ucred (read unaligned: CMSG_DATA does not promise alignment).
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_CREDENTIALS {
                sender = Some(libc::CMSG_DATA(c).cast::<libc::ucred>().read_unaligned());
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(Received { len: n as usize, sender, name_len: msg.msg_namelen })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixDatagram;

    #[test]
    fn a_datagram_comes_with_its_sender_only_when_asked() {
        let (a, b) = UnixDatagram::pair().unwrap();
        let mut buf = [0u8; 16];
        a.send(b"one").unwrap();
        let r = recv(b.as_raw_fd(), &mut buf, None, 0).unwrap();
        assert_eq!((&buf[..r.len], r.sender.is_none()), (&b"one"[..], true));
        pass_credentials(b.as_raw_fd()).unwrap();
        a.send(b"two").unwrap();
        let r = recv(b.as_raw_fd(), &mut buf, None, 0).unwrap();
        let s = r.sender.expect("credentials");
        assert_eq!(&buf[..r.len], b"two");
        assert_eq!(s.pid, std::process::id() as i32);
        // SAFETY: getuid has no preconditions.
        assert_eq!(s.uid, unsafe { libc::getuid() });
        assert!(recv(b.as_raw_fd(), &mut buf, None, libc::MSG_DONTWAIT).is_err(), "nothing more");
    }
}
