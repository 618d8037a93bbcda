//! Capability sets, as a run with a trial step needs them: exactly CAP_SETUID and
//! CAP_SETGID (docs/trials.md, "How the sandbox provides it"). The calls that set them are
//! plimsoll-sys's ([`plimsoll_sys::caps`], and as pre-exec steps [`plimsoll_sys::exec::Step`]).

pub use plimsoll_sys::caps::{CAP_SETGID, CAP_SETUID};

/// The capabilities of a trial job's agent and of the trial runner, as a bit mask (and as
/// `/proc/<pid>/status` prints it: `CapEff: 00000000000000c0`).
pub const TRIAL_CAPS: u64 = (1 << CAP_SETUID) | (1 << CAP_SETGID);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trial_mask_is_what_proc_prints() {
        assert_eq!(format!("{TRIAL_CAPS:016x}"), "00000000000000c0");
    }
}
