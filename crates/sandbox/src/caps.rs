//! Capability sets, as a run with a trial step needs them: exactly CAP_SETUID and
//! CAP_SETGID (docs/trials.md, "How the sandbox provides it"). Raw system calls only, so
//! every function here may run between fork and exec.

use std::io;

/// `CAP_SETGID`.
pub const CAP_SETGID: u32 = 6;
/// `CAP_SETUID`.
pub const CAP_SETUID: u32 = 7;
/// The capabilities of a trial job's agent and of the trial runner, as a bit mask (and as
/// `/proc/<pid>/status` prints it: `CapEff: 00000000000000c0`).
pub const TRIAL_CAPS: u64 = (1 << CAP_SETUID) | (1 << CAP_SETGID);

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// `struct __user_cap_header_struct`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct`: one word (capabilities 0..32, then 32..64) of each set.
#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Reduces the calling thread's bounding set to `keep` (a bit mask) and empties its ambient
/// set. Needs CAP_SETPCAP; numbers past the kernel's last capability fail, harmlessly, and
/// so does a drop without CAP_SETPCAP (check the result in /proc/self/status if it matters).
///
/// # Safety
/// Safe to call between fork and exec: prctl(2) with integer arguments, nothing allocated.
pub unsafe fn limit_bounding_set(keep: u64) {
    for cap in 0..64u32 {
        if keep & (1 << cap) == 0 {
            // SAFETY: prctl(2) with integer arguments.
            unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) };
        }
    }
    // SAFETY: prctl(2) with integer arguments.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
}

/// Sets the calling thread's effective and permitted sets to `caps` and its inheritable set
/// to nothing (capset(2)); the caller must hold every capability in `caps`.
///
/// # Safety
/// Safe to call between fork and exec: one system call on values on this stack.
pub unsafe fn set_effective_and_permitted(caps: u64) -> io::Result<()> {
    let header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let word = |w: u32| CapData {
        effective: (caps >> (32 * w)) as u32,
        permitted: (caps >> (32 * w)) as u32,
        inheritable: 0,
    };
    let data = [word(0), word(1)];
    // SAFETY: capset(2) reads the header and the two data words, which live on this stack
    // for the call.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trial_mask_is_what_proc_prints() {
        assert_eq!(format!("{TRIAL_CAPS:016x}"), "00000000000000c0");
    }
}
