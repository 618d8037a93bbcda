//! SIGCHLD as a descriptor: blocked in the calling thread and read from a signalfd(2)
//! (rustix has no signalfd), so a single-threaded supervisor can poll it with its pipes.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd as _, OwnedFd};

/// SIGCHLD, blocked in the calling thread, readable from a non-blocking descriptor.
#[derive(Debug)]
pub struct ChildSignals {
    fd: OwnedFd,
}

impl ChildSignals {
    /// Blocks SIGCHLD in the calling thread and opens a signalfd for it (non-blocking,
    /// close-on-exec). Another thread with SIGCHLD unblocked would take the signals.
    pub fn new() -> io::Result<Self> {
        // SAFETY: sigset_t is plain data; sigemptyset initialises it before any use.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: sigemptyset, sigaddset and pthread_sigmask on the set on this stack, with a
        // null old-set pointer (not asked for).
        let rc = unsafe {
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGCHLD);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        // SAFETY: signalfd with -1 (a new descriptor) reads the set on this stack.
        let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor, owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(ChildSignals { fd })
    }

    /// Reads every pending SIGCHLD; returns how many there were.
    pub fn drain(&self) -> usize {
        let mut n = 0;
        let mut buf = [0u8; std::mem::size_of::<libc::signalfd_siginfo>()];
        while let Ok(got) = rustix::io::read(&self.fd, &mut buf) {
            if got < buf.len() {
                break;
            }
            n += 1;
        }
        n
    }
}

impl AsFd for ChildSignals {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_sigchld_is_read() {
        let s = ChildSignals::new().unwrap();
        // A child's SIGCHLD goes to any thread of the test runner that does not block it (and
        // is ignored there), so the test sends one to this thread itself; blocked here, it
        // stays pending for the signalfd.
        // SAFETY: raise(3) sends a signal to the calling thread; SIGCHLD is blocked.
        assert_eq!(unsafe { libc::raise(libc::SIGCHLD) }, 0);
        let mut fds = [rustix::event::PollFd::new(&s, rustix::event::PollFlags::IN)];
        let timeout = rustix::event::Timespec {
            tv_sec: 5,
            tv_nsec: 0,
        };
        let ready = rustix::event::poll(&mut fds, Some(&timeout)).unwrap();
        assert_eq!(ready, 1);
        assert!(s.drain() >= 1);
        assert_eq!(s.drain(), 0);
    }
}
