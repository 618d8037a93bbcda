//! The uid range a test daemon takes from its port. Kept in the daemon, not in the dev-only
//! `plimsoll-test-daemon` (which re-exports it), because the oracle example's binary uses it
//! for the daemon it starts.

/// How many uids each port's range holds (run uids, the probe's, controller uids).
pub const UIDS_PER_PORT: u32 = 1024;

/// The first sandbox uid of the range a test daemon bound to `port` uses when its settings
/// set none: `1_000_000_000 + port * 1024`. A test holding a bound port can use it for a daemon
/// of its own (e.g. `plimsolld` as a child process) without meeting any other test's uids.
pub fn uid_base_for_port(port: u16) -> u32 {
    1_000_000_000 + u32::from(port) * UIDS_PER_PORT
}
