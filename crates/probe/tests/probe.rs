//! The probe binary as a sandbox would run it: one JSON report, whatever it can or cannot see.

use std::time::Duration;

use plimsoll_sandbox::{CaptureLimits, Spawn, capture};
use plimsoll_wire::ProbeReport;

fn run_probe(args: &[&str]) -> ProbeReport {
    let running = Spawn::new(env!("CARGO_BIN_EXE_plimsoll-probe"), "/")
        .args(args)
        .env("PLIMSOLL_PROBE_TEST", "1")
        .spawn()
        .expect("probe starts");
    let out = capture(
        running,
        &CaptureLimits::new(1 << 20, Duration::from_secs(30)),
    )
    .unwrap();
    assert_eq!(
        out.exit_code,
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one ProbeReport on stdout")
}

#[test]
fn reports_what_it_sees() {
    let dir = std::env::temp_dir();
    let r = run_probe(&[
        "--try-write",
        dir.to_str().unwrap(),
        "--try-write",
        "/nonexistent/dir",
        "--try-read",
        "/nonexistent/file",
        "--try-read",
        "/proc/self/status",
    ]);
    assert_eq!(r.uid, rustix::process::getuid().as_raw());
    assert_eq!(r.cwd, "/");
    assert_eq!(r.environment, vec!["PLIMSOLL_PROBE_TEST".to_owned()]);
    assert!(r.capabilities.contains_key("CapEff"));
    assert!(r.namespaces.contains_key("net"), "{:?}", r.namespaces);
    assert!(r.namespaces["net"].id.starts_with("net:["));
    assert!(r.mounts.contains_key("/"), "{:?}", r.mounts);
    assert!(r.write_attempts["/nonexistent/dir"].starts_with("error: "));
    assert_eq!(r.read_attempts["/proc/self/status"], "readable");
    assert!(r.read_attempts["/nonexistent/file"].starts_with("error: "));
    assert!(r.read_attempts.contains_key("/etc/shadow"));
    assert!(
        r.network_interfaces.iter().any(|i| i == "lo"),
        "{:?}",
        r.network_interfaces
    );
    for family in ["AF_INET", "AF_INET6", "AF_UNIX"] {
        assert!(r.socket_attempts.contains_key(family));
    }
    for limit in [
        "RLIMIT_AS",
        "RLIMIT_CPU",
        "RLIMIT_NOFILE",
        "RLIMIT_NPROC",
        "RLIMIT_FSIZE",
        "RLIMIT_CORE",
    ] {
        assert!(r.limits.contains_key(limit), "{limit}");
    }
    assert!(!r.kernel_release.is_empty());
}

#[test]
fn bad_arguments_exit_2() {
    let running = Spawn::new(env!("CARGO_BIN_EXE_plimsoll-probe"), "/")
        .arg("--try-write")
        .spawn()
        .unwrap();
    let out = capture(running, &CaptureLimits::new(4096, Duration::from_secs(30))).unwrap();
    assert_eq!(out.exit_code, Some(2));
    assert!(out.stdout.is_empty());
}
