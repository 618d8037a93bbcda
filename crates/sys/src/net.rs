//! The loopback interface brought up (rustix has no interface ioctls).

use std::io;
use std::os::fd::AsRawFd as _;

/// `ip link set lo up`: the loopback interface of the calling network namespace up.
pub fn loopback_up() -> io::Result<()> {
    let sock = rustix::net::socket_with(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::DGRAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )?;
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS writes into the ifreq we own, for the socket we own.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the union's flags member is the one SIOCGIFFLAGS filled in.
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: SIOCSIFFLAGS reads the ifreq we own.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_privilege_it_is_refused_or_already_up() {
        // Setting the flag needs CAP_NET_ADMIN; with it, it is harmless (lo is up already).
        if let Err(e) = loopback_up() {
            assert!(
                matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)),
                "{e}"
            );
        }
    }
}
