//! Keeping descriptors from crossing an exec: every descriptor above 2 marked close-on-exec,
//! by close_range(2) where the kernel has it with the CLOEXEC flag, else one by one from
//! /proc/self/fd. Used by the spawn helper, the agent and the trial runner's launcher; the
//! calls are plimsoll-sys's.

pub use plimsoll_sys::fds::{close_range_cloexec, close_range_unsupported, mark_cloexec_from_proc};
