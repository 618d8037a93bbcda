//! The one crate of the workspace that holds `unsafe`: every system call plimsoll makes that
//! needs it, behind safe functions. Every other crate forbids `unsafe_code` (the workspace
//! lint table says so).
//!
//! Code that runs between fork and exec is the delicate part: it runs in a copy of a
//! multithreaded process, so it may only make system calls (no allocation, no lock). So this
//! crate never runs a caller's closure there; a caller describes the steps as data
//! ([`exec::Step`]) and [`exec::PreExec`] turns them into the hook itself.
//!
//! rustix where rustix has the call (and its safe API), libc only where it lacks it.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod caps;
pub mod exec;
pub mod fds;
pub mod ids;
pub mod landlock;
pub mod mount;
pub mod net;
pub mod process;
pub mod seccomp;
pub mod signals;

/// The result of a raw system call that returns 0 or -1 with errno: async-signal-safe.
fn check(rc: libc::c_long) -> std::io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
