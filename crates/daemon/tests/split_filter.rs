//! The split daemon's serving process's seccomp allowlist, installed for real: this test
//! binary runs itself again (with `PLIMSOLL_FILTER_PROBE` naming a syscall), the copy sets
//! no_new_privs and installs the filter as the serving process does and tries the call; a
//! forbidden one must kill it (SIGSYS), what the serving process does must not.

use std::os::unix::process::ExitStatusExt as _;
use std::process::Command;

use plimsoll_env as env;

/// The copy's side: only when the variable is set.
fn probe_child() {
    let Some(what) = env::get(env::PLIMSOLL_FILTER_PROBE) else {
        return;
    };
    // Bound before the filter, as the daemon binds its listen address before the drop.
    let bound = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
    bound.set_nonblocking(true).expect("non-blocking");
    rustix::thread::set_no_new_privs(true).expect("no_new_privs");
    plimsoll_daemon::split::filter::install().expect("install the filter");
    match what.as_str() {
        "execve" => {
            #[expect(clippy::disallowed_methods, reason = "the forbidden call under test")]
            let e = Command::new("/bin/true").status();
            println!("survived execve: {e:?}");
        }
        "fork" => {
            #[expect(clippy::disallowed_methods, reason = "the forbidden call under test")]
            let e = Command::new("/nonexistent-program").status();
            println!("survived fork: {e:?}");
        }
        "setuid" => {
            let e = plimsoll_sys::ids::set_process_res_uid(0, 0, 0);
            println!("survived setuid: {e:?}");
        }
        "kill" => {
            let e = rustix::process::kill_process(
                rustix::process::Pid::from_raw(1).unwrap(),
                rustix::process::Signal::TERM,
            );
            println!("survived kill: {e:?}");
        }
        "allowed" => {
            // What the serving process does: an async runtime with worker threads, its TCP
            // listener's connections, a Unix connection, a file read, the clock.
            let rt = tokio::runtime::Runtime::new().expect("a runtime");
            let served = rt.block_on(async {
                let listener = tokio::net::TcpListener::from_std(bound)?;
                let addr = listener.local_addr()?;
                let accept = tokio::spawn(async move { listener.accept().await.map(|_| ()) });
                let _client = tokio::net::TcpStream::connect(addr).await?;
                accept.await.map_err(std::io::Error::other)??;
                let (a, _b) = tokio::net::UnixStream::pair()?;
                a.writable().await?;
                tokio::task::spawn_blocking(|| std::fs::read_to_string("/proc/self/status"))
                    .await
                    .map_err(std::io::Error::other)??;
                Ok::<_, std::io::Error>(())
            });
            println!(
                "survived allowed: {served:?} {:?}",
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
fn a_forbidden_syscall_kills_the_serving_process() {
    for what in ["execve", "fork", "setuid", "kill"] {
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
fn what_the_serving_process_does_is_allowed() {
    let out = run_probe("allowed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("survived allowed: Ok(())"),
        "{:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
