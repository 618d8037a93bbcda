//! Capability sets: the bounding and ambient sets emptied (but for a kept mask) and the
//! effective and permitted sets set, per thread. Each function is a system call or a loop of
//! them on integers, so each may also run between fork and exec (as an [`crate::exec::Step`]).

use std::io;

/// `CAP_KILL`.
pub const CAP_KILL: u32 = 5;
/// `CAP_SETGID`.
pub const CAP_SETGID: u32 = 6;
/// `CAP_SETUID`.
pub const CAP_SETUID: u32 = 7;

/// Reduces the calling thread's bounding set to `keep` (a bit mask) and empties its ambient
/// set. Needs CAP_SETPCAP; numbers past the kernel's last capability fail, harmlessly, and
/// so does a drop without CAP_SETPCAP (check the result in /proc/self/status if it matters).
/// Async-signal-safe.
pub fn limit_bounding_set(keep: u64) {
    for cap in 0..64u32 {
        if keep & (1 << cap) == 0 {
            // rustix names only the capabilities it knows; the loop covers every number.
            // SAFETY: prctl(2) with integer arguments; it touches no memory of ours.
            unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) };
        }
    }
    let _ = rustix::thread::clear_ambient_capability_set();
}

/// Sets the calling thread's effective and permitted sets to `caps` and its inheritable set
/// to nothing (capset(2)); the caller must hold every capability in `caps`.
/// Async-signal-safe.
pub fn set_effective_and_permitted(caps: u64) -> io::Result<()> {
    let set = rustix::thread::CapabilitySet::from_bits_retain(caps);
    rustix::thread::set_capabilities(
        None,
        rustix::thread::CapabilitySets {
            effective: set,
            permitted: set,
            inheritable: rustix::thread::CapabilitySet::empty(),
        },
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_numbers_are_the_kernels() {
        assert_eq!(
            1u64 << CAP_SETUID,
            rustix::thread::CapabilitySet::SETUID.bits()
        );
        assert_eq!(
            1u64 << CAP_SETGID,
            rustix::thread::CapabilitySet::SETGID.bits()
        );
    }

    #[test]
    fn setting_the_sets_one_holds_already_works() {
        // Whatever this process holds, it may set exactly that again.
        let now = rustix::thread::capabilities(None).unwrap();
        let held = now.effective.bits() & now.permitted.bits();
        if held == now.permitted.bits() {
            set_effective_and_permitted(held).unwrap();
            let after = rustix::thread::capabilities(None).unwrap();
            assert_eq!(after.permitted.bits(), held);
            // Back to what it was (the inheritable set aside).
            let _ = rustix::thread::set_capabilities(None, now);
        }
    }
}
