//! Descriptors: keeping them from crossing an exec (every descriptor above 2 marked
//! close-on-exec, by close_range(2) where the kernel has it with the CLOEXEC flag, else one
//! by one from /proc/self/fd), putting one at a fixed number, and adopting one inherited
//! across exec.

use std::io;
use std::os::fd::{AsFd, AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::sync::Mutex;

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
    crate::check(rc)
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
        // SAFETY: fcntl on a descriptor number with plain integer arguments (it only sets a
        // flag); the listing's own descriptor, closed by now, answers EBADF, which is fine.
        let rc = unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        if rc != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EBADF) {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Whether `fd` is close-on-exec.
pub fn is_cloexec(fd: impl AsFd) -> io::Result<bool> {
    Ok(rustix::io::fcntl_getfd(fd)?.contains(rustix::io::FdFlags::CLOEXEC))
}

/// Sets or clears `fd`'s close-on-exec flag. Async-signal-safe.
pub fn set_cloexec(fd: impl AsFd, cloexec: bool) -> io::Result<()> {
    let flags = if cloexec {
        rustix::io::FdFlags::CLOEXEC
    } else {
        rustix::io::FdFlags::empty()
    };
    rustix::io::fcntl_setfd(fd, flags)?;
    Ok(())
}

/// Puts a copy of `fd` at descriptor number `at`, without close-on-exec, so a program
/// started next inherits it there; `fd` already at `at` only loses its close-on-exec flag.
/// Whatever was open at `at` is closed first (dup2(2)), so call it only in a process about to
/// exec (between fork and exec), where nothing else uses `at`. Async-signal-safe.
///
/// Taking over a number some other part of the process owns would break that owner's
/// descriptor, not memory; a number at or below 2 (stdio) is refused all the same.
pub fn place_at(fd: impl AsFd, at: RawFd) -> io::Result<()> {
    let fd = fd.as_fd();
    if at <= 2 {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    if fd.as_raw_fd() == at {
        return set_cloexec(fd, false);
    }
    // rustix's dup2 wants the target as an OwnedFd, which this number is not.
    // SAFETY: dup2 between two descriptor numbers touches no memory; `fd` is open for the
    // call (borrowed).
    if unsafe { libc::dup2(fd.as_raw_fd(), at) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Points stdin, stdout or stderr (`at` 0, 1 or 2) at a copy of `fd`.
pub fn redirect_stdio(fd: impl AsFd, at: RawFd) -> io::Result<()> {
    match at {
        0 => rustix::stdio::dup2_stdin(fd)?,
        1 => rustix::stdio::dup2_stdout(fd)?,
        2 => rustix::stdio::dup2_stderr(fd)?,
        _ => return Err(io::Error::from_raw_os_error(libc::EBADF)),
    }
    Ok(())
}

/// Descriptor numbers already adopted, so none is owned twice.
static ADOPTED: Mutex<Vec<RawFd>> = Mutex::new(Vec::new());

/// Takes ownership of descriptor `fd`, inherited across the exec that started this program
/// (a parent left it open at a number both sides agreed on). Refuses a number at or below 2,
/// one that is not open, one that is close-on-exec (every descriptor Rust's standard library
/// and rustix open is, so such a one belongs to this process, not to the parent), and one
/// adopted before.
pub fn adopt_inherited(fd: RawFd) -> io::Result<OwnedFd> {
    if fd <= 2 {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    let mut adopted = ADOPTED.lock().unwrap_or_else(|e| e.into_inner());
    if adopted.contains(&fd) {
        return Err(io::Error::other(format!(
            "descriptor {fd} was adopted already"
        )));
    }
    // SAFETY: F_GETFD on a plain number only reads its flags (EBADF when nothing is open).
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    if flags & libc::FD_CLOEXEC != 0 {
        return Err(io::Error::other(format!(
            "descriptor {fd} is close-on-exec: it was opened here, not inherited"
        )));
    }
    adopted.push(fd);
    // SAFETY: the descriptor is open and was inherited across exec (no close-on-exec flag),
    // and no earlier call adopted it; from here the OwnedFd is its one owner. It is made
    // close-on-exec at once, so it does not pass on to a further program.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    set_cloexec(&owned, true)?;
    Ok(owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy of `f` without close-on-exec, as a careless library might leave one.
    fn leaky(f: &std::fs::File) -> OwnedFd {
        let copy = rustix::io::dup(f).unwrap();
        set_cloexec(&copy, false).unwrap();
        copy
    }

    #[test]
    fn an_inherited_descriptor_is_marked() {
        let null = std::fs::File::open("/dev/null").unwrap();
        let copy = leaky(&null);
        assert!(!is_cloexec(&copy).unwrap());
        mark_cloexec_from_proc().unwrap();
        assert!(is_cloexec(&copy).unwrap());
        match close_range_cloexec() {
            Ok(()) => {}
            Err(e) => assert!(close_range_unsupported(&e), "{e}"),
        }
    }

    #[test]
    fn adopting_refuses_our_own_descriptors_and_a_second_time() {
        let null = std::fs::File::open("/dev/null").unwrap();
        // Opened here, close-on-exec: not inherited.
        assert!(adopt_inherited(null.as_raw_fd()).is_err());
        assert!(adopt_inherited(1).is_err());
        // A leaked (not close-on-exec) one, as a parent hands it over.
        let leaked = leaky(&null);
        let n = leaked.as_raw_fd();
        std::mem::forget(leaked);
        let owned = adopt_inherited(n).unwrap();
        assert!(is_cloexec(&owned).unwrap());
        assert!(adopt_inherited(n).is_err());
        drop(owned);
    }

    #[test]
    fn placing_refuses_stdio_numbers() {
        let null = std::fs::File::open("/dev/null").unwrap();
        assert!(place_at(&null, 1).is_err());
        // At its own number: only the flag goes.
        let copy = rustix::io::dup(&null).unwrap();
        place_at(&copy, copy.as_raw_fd()).unwrap();
        assert!(!is_cloexec(&copy).unwrap());
    }
}
