//! Processes: a new session, fork of a single-threaded process, an immediate exit, and
//! SIGKILL to every process of a uid from a short-lived child that switches to it.

use std::io;

/// A session (and process group) of the caller's own (setsid(2)). Not rustix's: gVisor
/// returns 0 rather than the new session's id, which trips rustix's `Pid` assertion in
/// debug builds; only the error matters. Async-signal-safe.
pub fn new_session() -> io::Result<()> {
    // SAFETY: setsid(2) takes no argument and touches no memory of ours.
    if unsafe { libc::setsid() } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Ends the process at once with `code` (_exit(2)): no atexit handlers, no flush of stdio
/// buffers (a forked child must not flush the parent's copies).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit takes an integer and never returns; it runs no code of this process.
    unsafe { libc::_exit(code) }
}

/// Which side of [`fork_single_threaded`] this is.
#[derive(Debug, PartialEq, Eq)]
pub enum Forked {
    /// The child.
    Child,
    /// The parent, with the child's pid.
    Parent(rustix::process::Pid),
}

/// The number of threads of this process, from /proc/self/task.
pub fn thread_count() -> io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

/// Removes variable `name` from this process's environment after overwriting it, name and
/// value, where it lies (for the variables the process started with, that is the start of
/// its stack, which /proc/PID/environ shows): so a secret it was given is gone from its
/// memory, not only from `std::env`. It finds the entry by walking the environment array
/// itself (this is not a read of the variable: its value is never looked at). Refused
/// (nothing done) unless this process has exactly one thread. Returns whether the variable
/// was set.
pub fn scrub_env(name: &str) -> io::Result<bool> {
    unsafe extern "C" {
        static mut environ: *mut *mut libc::c_char;
    }
    let threads = thread_count()?;
    if threads != 1 {
        return Err(io::Error::other(format!(
            "this process must have one thread to scrub its environment, not {threads}"
        )));
    }
    let c_name = std::ffi::CString::new(name)
        .map_err(|_| io::Error::other("a variable name holds a NUL byte"))?;
    let prefix = format!("{name}=");
    // SAFETY: one thread (checked above), so nothing reads or changes the environment
    // meanwhile. The array is NULL-terminated and each entry a NUL-terminated "NAME=value"
    // string; the entry found stays where it is when unsetenv drops it from the array (glibc
    // never frees an environment string), and every write stays within its length.
    unsafe {
        let mut slot = std::ptr::addr_of!(environ).read();
        let mut found = None;
        while !slot.is_null() && !(*slot).is_null() {
            let entry = *slot;
            let len = libc::strlen(entry);
            let bytes = std::slice::from_raw_parts(entry.cast::<u8>(), len);
            if bytes.starts_with(prefix.as_bytes()) {
                found = Some((entry, len));
                break;
            }
            slot = slot.add(1);
        }
        let Some((entry, len)) = found else {
            return Ok(false);
        };
        // The value first, then the name once unsetenv has found it by that name.
        std::ptr::write_bytes(entry.add(prefix.len()), 0, len - prefix.len());
        if libc::unsetenv(c_name.as_ptr()) != 0 {
            return Err(io::Error::last_os_error());
        }
        std::ptr::write_bytes(entry, 0, prefix.len());
    }
    Ok(true)
}

/// fork(2), refused (before forking) unless this process has exactly one thread. With one
/// thread the child is a complete copy: no lock is held by a thread that is not there, so it
/// may run ordinary Rust code. It should end with [`exit_now`] rather than return into code
/// that could run the parent's destructors twice.
pub fn fork_single_threaded() -> io::Result<Forked> {
    let threads = thread_count()?;
    if threads != 1 {
        return Err(io::Error::other(format!(
            "this process must have one thread to fork, not {threads}"
        )));
    }
    // SAFETY: the process has one thread (checked above, and only this thread could have
    // started another since), so the child is a complete, consistent copy.
    let pid = unsafe { libc::fork() };
    match pid {
        p if p < 0 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        p => Ok(Forked::Parent(
            rustix::process::Pid::from_raw(p).expect("fork returned a positive pid"),
        )),
    }
}

/// The gid the signalling child takes: the kernel's overflow gid ("nogroup"), so the child
/// holds neither root's group nor any group a file could be shared with.
const SIGNALLER_GID: u32 = 65534;

/// Sends SIGKILL to every process `uid` may signal, from a short-lived child process that
/// drops its groups and switches to `uid`. No thread of this process ever changes credentials.
///
/// If a process of the uid kills or stops the child before it could send the kill, the child
/// is ended and the error is [`io::ErrorKind::Interrupted`]: try again.
pub fn signal_all_as(uid: u32) -> io::Result<()> {
    if uid == 0 {
        return Err(io::Error::other("refusing to signal as uid 0"));
    }
    // SAFETY: fork(2) in a possibly multithreaded process. The child runs only raw system
    // calls that are async-signal-safe (setgroups, setresgid, setresuid, kill, _exit): no
    // allocation, no lock, no return into Rust code that could touch the parent's state.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: the child of the fork above; raw syscalls with integer arguments only, and
        // _exit never returns. Exit codes: 0 sent (or nothing to signal), 1 cannot drop to
        // the uid, 2 kill failed.
        unsafe { signaller_child(uid) }
    }
    wait_signaller(pid, uid)
}

/// The body of the forked child. Never returns.
///
/// # Safety
///
/// Call only in the child of `fork`: it switches credentials and calls `_exit`.
unsafe fn signaller_child(uid: u32) -> ! {
    let (u, g) = (libc::c_long::from(uid), libc::c_long::from(SIGNALLER_GID));
    // SAFETY: raw system calls with integer (or null with count 0) arguments; the libc
    // wrappers of the credential calls are avoided because glibc's broadcast them to threads
    // through locks.
    unsafe {
        if libc::syscall(
            libc::SYS_setgroups,
            0 as libc::c_long,
            std::ptr::null::<u32>(),
        ) != 0
            || libc::syscall(libc::SYS_setresgid, g, g, g) != 0
            || libc::syscall(libc::SYS_setresuid, u, u, u) != 0
        {
            libc::_exit(1);
        }
        // As `uid`, -1 reaches only the processes `uid` owns (never this child: the kernel
        // skips the caller). ESRCH: nothing to signal at all.
        if libc::syscall(
            libc::SYS_kill,
            -1 as libc::c_long,
            libc::SIGKILL as libc::c_long,
        ) != 0
            && *libc::__errno_location() != libc::ESRCH
        {
            libc::_exit(2);
        }
        libc::_exit(0)
    }
}

/// Waits for the signalling child `pid`; ends it if a process of the uid stopped it.
fn wait_signaller(pid: libc::pid_t, uid: u32) -> io::Result<()> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid(2) on our own child with a valid out-pointer.
        let rc = unsafe { libc::waitpid(pid, &mut status, libc::WUNTRACED) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                // Reaped by someone else's waitpid(-1): its outcome is unknown.
                Some(libc::ECHILD) => {
                    return Err(io::Error::new(
                        io::ErrorKind::Interrupted,
                        format!("the child signalling as uid {uid} was reaped elsewhere; retry"),
                    ));
                }
                _ => return Err(e),
            }
        }
        if libc::WIFSTOPPED(status) {
            // A process of the uid stopped it: end it (we are root) and reap it next turn.
            // SAFETY: kill(2) on our own, not yet reaped, child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            continue;
        }
        if libc::WIFEXITED(status) {
            return match libc::WEXITSTATUS(status) {
                0 => Ok(()),
                1 => Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "cannot switch to uid {uid} to signal its processes (is this process root?)"
                    ),
                )),
                code => Err(io::Error::other(format!(
                    "kill(-1, SIGKILL) as uid {uid} failed (signalling child exited {code})"
                ))),
            };
        }
        // Killed (or stopped, then killed) before it could finish: a leftover interfered.
        return Err(io::Error::new(
            io::ErrorKind::Interrupted,
            format!("the child signalling as uid {uid} was ended by a signal; retry"),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uid_0_is_refused() {
        assert!(signal_all_as(0).is_err());
    }

    #[test]
    fn fork_is_refused_with_threads() {
        // A multithreaded test runner is refused before the fork.
        if thread_count().unwrap() > 1 {
            assert!(fork_single_threaded().is_err());
        }
    }

    #[test]
    fn a_uid_without_processes_is_signalled_quietly() {
        if !rustix::process::geteuid().is_root() {
            assert!(signal_all_as(65533).is_err());
            return;
        }
        signal_all_as(65533).unwrap();
    }
}
