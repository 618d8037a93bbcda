//! The broker process's seccomp allowlist, installed for real: this test binary runs itself
//! again (with `PLIMSOLL_FILTER_PROBE` naming a syscall), the copy installs the filter as
//! the broker process does and tries the syscall; a forbidden one must kill it (SIGSYS),
//! an allowed one must not.

use std::os::unix::process::ExitStatusExt as _;
use std::process::Command;

use plimsoll_env as env;

/// The copy's side: only when the variable is set.
fn probe_child() {
    let Some(what) = env::get(env::PLIMSOLL_FILTER_PROBE) else {
        return;
    };
    rustix::thread::set_no_new_privs(true).expect("no_new_privs");
    plimsoll_broker::apart::filter::install().expect("install the filter");
    match what.as_str() {
        "execve" => {
            // Never returns if allowed; the filter kills it first.
            #[expect(clippy::disallowed_methods, reason = "the forbidden call under test")]
            let e = Command::new("/bin/true").status();
            println!("survived execve: {e:?}");
        }
        "fork" => {
            #[expect(clippy::disallowed_methods, reason = "the forbidden call under test")]
            let e = Command::new("/nonexistent-program").status();
            println!("survived fork: {e:?}");
        }
        "packet-socket" => {
            let e = rustix::net::socket(
                rustix::net::AddressFamily::PACKET,
                rustix::net::SocketType::RAW,
                None,
            );
            println!("survived packet socket: {e:?}");
        }
        "allowed" => {
            // What the broker does: a thread, a TCP socket, a resolver lookup, the clock.
            let t = std::thread::spawn(|| {
                // Port 1 on loopback: refused, but socket and connect were made.
                std::net::TcpStream::connect("127.0.0.1:1")
                    .map(|_| ())
                    .map_err(|e| e.kind())
            });
            let bound = t.join().expect("thread");
            let resolved =
                std::net::ToSocketAddrs::to_socket_addrs(&("localhost", 80)).map(|a| a.count());
            println!(
                "survived allowed: {bound:?} {resolved:?} {:?}",
                std::time::SystemTime::now()
            );
        }
        other => panic!("no probe {other}"),
    }
    std::process::exit(0);
}

fn run_probe(what: &str) -> std::process::Output {
    let exe = std::env::current_exe().unwrap();
    #[expect(clippy::disallowed_methods, reason = "the test runs itself again")]
    let out = Command::new(exe)
        .args(["--exact", "probe_entry", "--nocapture"])
        .env(env::PLIMSOLL_FILTER_PROBE.name, what)
        .output()
        .unwrap();
    out
}

/// The copy's entry point: a no-op in the normal run.
#[test]
fn probe_entry() {
    probe_child();
}

#[test]
fn a_forbidden_syscall_kills_the_process() {
    for what in ["execve", "fork", "packet-socket"] {
        let out = run_probe(what);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGSYS),
            "{what}: not killed by the filter: {:?}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!stdout.contains("survived"), "{what}: {stdout}");
    }
}

#[test]
fn what_the_broker_does_is_allowed() {
    let out = run_probe("allowed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("survived allowed: Err(ConnectionRefused) Ok("),
        "{:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
