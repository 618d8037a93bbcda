//! User and group ids for the whole process. The kernel's calls change one thread (rustix's
//! `rustix::thread::set_thread_res_uid` and friends make them, and are what a step between
//! fork and exec uses); glibc's wrappers here apply the change to every thread of the
//! process, through a signal to each, so they are not async-signal-safe: for a process that
//! may have more than one thread, never between fork and exec.

use std::io;

fn check(rc: libc::c_int) -> io::Result<()> {
    crate::check(libc::c_long::from(rc))
}

/// Empties the supplementary group list of every thread (glibc's setgroups(2)).
pub fn clear_process_groups() -> io::Result<()> {
    // SAFETY: a count of 0 and a null list: the kernel reads no memory.
    check(unsafe { libc::setgroups(0, std::ptr::null()) })
}

/// Sets the real, effective and saved gid of every thread (glibc's setresgid(2)).
pub fn set_process_res_gid(real: u32, effective: u32, saved: u32) -> io::Result<()> {
    // SAFETY: plain integer arguments.
    check(unsafe { libc::setresgid(real, effective, saved) })
}

/// Sets the real, effective and saved uid of every thread (glibc's setresuid(2)).
pub fn set_process_res_uid(real: u32, effective: u32, saved: u32) -> io::Result<()> {
    // SAFETY: plain integer arguments.
    check(unsafe { libc::setresuid(real, effective, saved) })
}

/// The calling thread's real, effective and saved uid (getresuid(2); rustix has none).
pub fn process_res_uid() -> io::Result<(u32, u32, u32)> {
    let (mut r, mut e, mut s) = (0, 0, 0);
    // SAFETY: getresuid writes one uid through each of three pointers to locals.
    check(unsafe { libc::getresuid(&mut r, &mut e, &mut s) })?;
    Ok((r, e, s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setting_the_ids_one_has_works() {
        let (u, g) = (rustix::process::getuid(), rustix::process::getgid());
        let (u, g) = (u.as_raw(), g.as_raw());
        assert_eq!(process_res_uid().unwrap().0, u);
        set_process_res_gid(g, g, g).unwrap();
        set_process_res_uid(u, u, u).unwrap();
        if u != 0 {
            assert!(clear_process_groups().is_err());
        }
    }
}
