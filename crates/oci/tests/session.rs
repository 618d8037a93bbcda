//! What the host reads from a session's container is bounded by each call's caps, whatever
//! the container writes: a session agent that answers a call with an endless line (what a
//! cell could make of the agent's stdout before the agent was not dumpable) fails the call
//! once the line passes the call's `line_max`, and the host never holds more than that.
//!
//! The agent here is a shell script standing in for a broken or subverted
//! `plimsoll-agent --session` (bind-mounted where the real one goes): it says it is ready,
//! reads one call and writes bytes with no newline. Needs root, crun or runc and the sandbox
//! image; without them a test prints `SKIP` and returns, unless `CI=true`, where it fails.

use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

#[expect(
    unused_macros,
    reason = "the fake agent cannot say a wall, which runsc needs first: crun and runc only"
)]
mod common;

use plimsoll_oci::{OciConfig, OciProvider, RuntimeKind};
use plimsoll_sandbox::Provider as _;
use plimsoll_testing::{TestDir, limits, py};
use plimsoll_wire::{SessionCall, SessionCell};

use common::{image, kind_index, rig};

/// The high-water mark of this process's resident memory, in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/self/status");
    kb * 1024
}

const ENDLESS_AGENT: &str = "#!/bin/sh
echo 'plimsoll-session: ready'
read call
exec head -c 300000000 /dev/zero
";

#[test]
fn a_session_agents_endless_line_is_read_only_up_to_the_calls_bound() {
    let test = "a_session_agents_endless_line_is_read_only_up_to_the_calls_bound";
    for kind in [RuntimeKind::Crun, RuntimeKind::Runc] {
        let Some(r) = rig(kind, test) else { return };
        let dir = TestDir::new("plimsoll-oci-session", test);
        let agent = dir.path().join("endless-agent");
        std::fs::write(&agent, ENDLESS_AGENT).unwrap();
        std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut c = OciConfig::new(
            kind,
            image(),
            agent,
            r.p.config().probe.clone(),
            2_199_000 + kind_index(kind),
        );
        c.state_root = r.state_root.clone();
        c.cgroup_parent = r.cgroup_parent.clone();
        let p = OciProvider::new(c);
        let uid = 2_130_000 + kind_index(kind);
        let plan = r.plan(py("pass"), limits(), uid);
        let mut session = p
            .open_session(&plan, Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("{kind:?}: the session opens: {e}"));
        let call = SessionCall::Cell(SessionCell {
            code: "print(1)".into(),
            restart: false,
            deadline_ms: 30_000,
            output_bytes: 4096,
            stream: true,
        });
        let before = peak_rss();
        let answered = session.call(&call, Duration::from_secs(60), &mut |_| {});
        let grew = peak_rss().saturating_sub(before);
        let e = answered.expect_err("an endless line is no answer");
        assert!(
            e.message().contains("more than") && e.message().contains("bytes"),
            "{kind:?}: {}",
            e.message()
        );
        // The bound is 2 × 4096 × 6 bytes plus 1 MiB of framing; one pipe's worth more may
        // be read at once. 300 MB came.
        assert!(
            grew < 16 << 20,
            "{kind:?}: the host's memory grew by {grew} bytes reading one call's answer"
        );
        session.close().expect("the session's container is removed");
        r.assert_clean(&plan.run_id, uid);
    }
}
