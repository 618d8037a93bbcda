//! The two landlock calls the `landlock` crate leaves to its caller here: the kernel's ABI
//! number, and restricting the calling thread with a ruleset built before a fork.

use std::io;
use std::os::fd::{AsFd, AsRawFd as _};

/// The landlock ABI the running kernel offers (0 when it has none).
pub fn kernel_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a null attribute pointer, size 0 and the VERSION flag, the call only
    // returns the ABI number; it reads and writes no memory.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    i32::try_from(v).unwrap_or(0).max(0)
}

/// Restricts the calling thread (and what it execs) with the ruleset `ruleset`
/// (landlock_restrict_self(2)); no_new_privs must be set. Async-signal-safe.
pub fn restrict_self(ruleset: impl AsFd) -> io::Result<()> {
    // SAFETY: landlock_restrict_self takes a ruleset descriptor (borrowed, open for the call)
    // and a flags word; it touches no memory of ours.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_landlock_restrict_self,
            ruleset.as_fd().as_raw_fd(),
            0u32,
        )
    };
    crate::check(rc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_abi_is_a_small_number() {
        assert!((0..100).contains(&kernel_abi()));
    }

    #[test]
    fn a_descriptor_that_is_no_ruleset_is_refused() {
        let null = std::fs::File::open("/dev/null").unwrap();
        assert!(restrict_self(&null).is_err());
    }
}
