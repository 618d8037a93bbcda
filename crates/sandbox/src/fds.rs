//! Keeping descriptors from crossing an exec: every descriptor above 2 marked close-on-exec,
//! by close_range(2) where the kernel has it with the CLOEXEC flag, else one by one from
//! /proc/self/fd. Used by the spawn helper, the agent and the trial runner's launcher.

use std::io;

/// Marks every descriptor above 2 close-on-exec with one close_range(2). Async-signal-safe:
/// may run between fork and exec. EINVAL (no CLOEXEC flag, as in gVisor) and ENOSYS (no
/// close_range) come back as errors: see [`mark_cloexec_from_proc`].
pub fn close_range_cloexec() -> io::Result<()> {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets a flag on open descriptors; the
    // arguments are plain integers.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether `e` from [`close_range_cloexec`] only means the kernel cannot do it that way.
pub fn close_range_unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS))
}

/// Marks every open descriptor above 2 close-on-exec, listing them in /proc/self/fd. Not
/// async-signal-safe (it allocates): for before a fork.
pub fn mark_cloexec_from_proc() -> io::Result<()> {
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")?
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: fcntl on a descriptor number with plain integer arguments; the listing's
        // own descriptor, closed by now, answers EBADF, which is fine.
        let rc = unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        if rc != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EBADF) {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inherited_descriptor_is_marked() {
        use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
        let null = std::fs::File::open("/dev/null").unwrap();
        // SAFETY: dup of a descriptor we hold; the copy (without O_CLOEXEC) is owned below.
        let copy = unsafe { OwnedFd::from_raw_fd(libc::dup(null.as_raw_fd())) };
        // SAFETY: F_GETFD on a descriptor we own.
        let cloexec = || unsafe { libc::fcntl(copy.as_raw_fd(), libc::F_GETFD) } & libc::FD_CLOEXEC;
        assert_eq!(cloexec(), 0);
        mark_cloexec_from_proc().unwrap();
        assert_eq!(cloexec(), libc::FD_CLOEXEC);
        match close_range_cloexec() {
            Ok(()) => {}
            Err(e) => assert!(close_range_unsupported(&e), "{e}"),
        }
    }
}
