//! Attacks on the container and kernel tiers, each run against crun, runc and runsc: what
//! sandboxed code tries (read host files, write outside /work, reach the network, fork,
//! allocate, fill the disk, flood the output, outlive the run, read another run) and what
//! must remain after every run (nothing: no container, cgroup, mount, process or directory).
//!
//! Needs root, the runtime, the sandbox image (`scripts/build-image`) and the probe and agent
//! binaries (built on demand). Without them a test prints `SKIP` and returns, unless
//! `CI=true`, where it fails.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::net::UdpSocket;
use std::time::{Duration, Instant};

#[macro_use]
mod common;

use plimsoll_oci::{OciConfig, OciProvider, RuntimeKind, spec};
use plimsoll_sandbox::broker::{BrokerChannel, BrokerPort};
use plimsoll_sandbox::reap::processes_of_uid;
use plimsoll_sandbox::{LaunchError, Provider, Spawn};
use plimsoll_testing::{
    NAMESPACE_ATTACK, fresh_id, js, limits, namespace_attack_refused, no_connection_came, py,
    quiet_listener, text,
};
use plimsoll_wire::{Project, ProjectFile, Reason, RunSpec, Step, Tier};

use common::{image, kind_index, rig};

/// A uid of its own for each scenario and runtime (common/mod.rs: the ranges).
fn uid(scenario: u32, kind: RuntimeKind) -> u32 {
    2_100_000 + scenario * 10 + kind_index(kind)
}

/// Reaps the dead processes of `uid` whose parent is this process; fails on a live one.
fn reap_our_zombies(uid: u32) {
    let me = std::process::id().to_string();
    for pid in processes_of_uid(uid) {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::trim)
                .unwrap_or("")
                .to_owned()
        };
        assert!(
            field("State:").starts_with('Z'),
            "process {pid} of uid {uid} is alive: {}",
            field("State:")
        );
        if field("PPid:") == me {
            let p = rustix::process::Pid::from_raw(pid).unwrap();
            let _ = rustix::process::waitpid(Some(p), rustix::process::WaitOptions::empty());
        }
    }
}

on_every_runtime!(
    snippets_run_as_the_run_uid,
    the_probe_passes,
    host_files_are_unreadable,
    writes_outside_work_fail,
    the_network_is_loopback_only,
    a_fork_bomb_ends_at_the_pids_limit,
    the_memory_limit_kills_and_the_run_returns,
    filling_work_hits_its_size,
    a_flood_of_output_is_truncated,
    sleeping_past_the_timeout_is_timed_out,
    background_processes_do_not_outlive_the_run,
    a_concurrent_run_cannot_be_read,
    a_project_runs_its_steps_and_returns_artifacts,
    a_grant_run_reaches_its_broker_through_its_socket,
    grant_calls_go_through_the_real_broker,
    only_a_failed_create_is_not_dispatched,
    no_namespace_can_be_created,
    a_run_ends_at_its_deadline_without_the_daemon,
);

fn snippets_run_as_the_run_uid(kind: RuntimeKind, test: &str) {
    let Some(rig) = rig(kind, test) else { return };
    let uid = uid(1, kind);
    let r = rig.run(
        py("import os\nprint(6*7, os.getuid(), os.getgid(), os.getcwd())"),
        limits(),
        uid,
    );
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert_eq!(text(&r.stdout), format!("42 {uid} {uid} /work\n"));
    let r = rig.run(
        js("console.log(6*7, process.getuid(), Object.keys(process.env).sort().join(','))"),
        limits(),
        uid,
    );
    assert_eq!(
        text(&r.stdout),
        format!("42 {uid} HOME,LANG,PATH\n"),
        "{r:?}"
    );
    // PR_GET_NO_NEW_PRIVS (39): gVisor does not show it in /proc/self/status.
    let r = rig.run(
        py("import ctypes\nprint(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))"),
        limits(),
        uid,
    );
    assert_eq!(text(&r.stdout), "1\n", "{r:?}");
    let r = rig.run(
        py("import sys\nprint('to err', file=sys.stderr)\nsys.exit(3)"),
        limits(),
        uid,
    );
    assert_eq!(r.exit_code, Some(3));
    assert_eq!(r.signal, None);
    assert_eq!(text(&r.stderr), "to err\n");
    assert!(!r.timed_out && !r.oom_killed);
}

fn the_probe_passes(kind: RuntimeKind, test: &str) {
    let Some(rig) = rig(kind, test) else { return };
    let probed = rig.p.probe();
    let e = &probed.evidence;
    assert_eq!(probed.available, Ok(()), "checks: {:#?}", e.checks);
    assert_eq!(probed.tier, kind.tier());
    assert_eq!(e.isolation, kind.tier());
    let identity = std::fs::read_to_string(image().join("identity")).unwrap();
    assert_eq!(e.environment, identity.trim());
    let rt = &e.binaries[0];
    assert_eq!(rt.name, kind.name());
    assert!(rt.version.contains(kind.name()), "{rt:?}");
    assert_eq!(rt.sha256.len(), 64);
    // The trial runner, when built, is named with its digest (trials run it).
    let runner = &rig.p.config().trial_runner;
    if runner.is_file() {
        let named = e
            .binaries
            .iter()
            .find(|b| b.name == "plimsoll-trial-runner")
            .expect("the trial runner in the evidence");
        let bytes = std::fs::read(runner).unwrap();
        assert_eq!(
            named.sha256,
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes))
        );
    }
    let report = e.probe.as_ref().expect("a probe report");
    assert_eq!(report.uid, rig.p.config().probe_uid);
    assert_eq!(report.network_interfaces, ["lo"]);
    for (check, outcome) in &e.checks {
        assert_eq!(outcome, "ok", "{check}");
    }
    if kind == RuntimeKind::Runsc {
        assert_eq!(e.config["platform"], "ptrace");
        assert_ne!(
            report.kernel_release,
            rustix::system::uname().release().to_string_lossy()
        );
    } else {
        for ns in ["pid", "net", "mnt", "ipc", "uts"] {
            assert_eq!(report.namespaces[ns].same_as_host, Some(false), "{ns}");
        }
        assert_eq!(report.seccomp_mode, 2);
    }
    assert!(rig.p.state().run_ids().is_empty());
}

fn host_files_are_unreadable(kind: RuntimeKind, test: &str) {
    let Some(rig) = rig(kind, test) else { return };
    rig.p.state().ensure().unwrap();
    let secret = rig.p.state().base().join("daemon-secret");
    std::fs::write(&secret, "TOPSECRET-daemon-file").unwrap();
    let code = format!(
        r#"
for p in ["/etc/shadow", "{}", "/proc/1/root/etc/shadow", "/proc/1/root{}"]:
    try:
        print(p, "READ", open(p).read()[:40])
    except Exception as e:
        print(p, "denied", type(e).__name__)
"#,
        secret.display(),
        secret.display()
    );
    let r = rig.run(py(&code), limits(), uid(2, kind));
    let out = text(&r.stdout);
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert_eq!(out.matches(" denied ").count(), 4, "{out}");
    assert!(!out.contains("READ") && !out.contains("TOPSECRET"), "{out}");
}

fn writes_outside_work_fail(kind: RuntimeKind, test: &str) {
    let Some(rig) = rig(kind, test) else { return };
    let code = r#"
import os
for d in ["/", "/etc", "/usr/bin", "/opt/plimsoll/bin", "/var/tmp", "/root", "/home", "/sys/fs/cgroup", "/proc/sys/kernel", "/dev", "/work", "/tmp"]:
    try:
        with open(os.path.join(d, "plimsoll-was-here"), "w") as f:
            f.write("x")
        print(d, "WROTE")
    except Exception as e:
        print(d, "denied", type(e).__name__)
"#;
    // The shared image must come out untouched: no mount point or file created in it.
    let rootfs = image().join("rootfs");
    let listing = |d: &str| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(rootfs.join(d))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let dirs = ["", "opt/plimsoll/bin", "work", "tmp", "dev", "etc"];
    let before: Vec<Vec<String>> = dirs.iter().map(|d| listing(d)).collect();
    let r = rig.run(py(code), limits(), uid(3, kind));
    let out = text(&r.stdout);
    let wrote: Vec<&str> = out.lines().filter(|l| l.ends_with("WROTE")).collect();
    assert_eq!(
        wrote,
        ["/work WROTE", "/tmp WROTE"],
        "{out}\n{}",
        text(&r.stderr)
    );
    let after: Vec<Vec<String>> = dirs.iter().map(|d| listing(d)).collect();
    assert_eq!(before, after, "the run changed the image ({dirs:?})");
    assert!(!rootfs.join("plimsoll-was-here").exists());
}

fn the_network_is_loopback_only(kind: RuntimeKind, test: &str) {
    let Some(rig) = rig(kind, test) else { return };
    let local = quiet_listener("127.0.0.1:0");
    let any = quiet_listener("0.0.0.0:0");
    // The host's own address on its default route (no packet is sent).
    let host_ip = UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect("192.0.2.1:9").map(|()| s))
        .and_then(|s| s.local_addr())
        .map(|a| a.ip().to_string())
        .unwrap_or_else(|_| "127.0.0.1".into());
    let targets = [
        ("127.0.0.1".to_owned(), local.local_addr().unwrap().port()),
        (host_ip, any.local_addr().unwrap().port()),
        ("192.0.2.1".to_owned(), 80),
    ];
    let mut code = String::from("import socket\n");
    for (host, port) in &targets {
        code.push_str(&format!(
            "try:\n    socket.create_connection(('{host}', {port}), timeout=3)\n    print('{host}', 'CONNECTED')\nexcept Exception as e:\n    print('{host}', 'refused', type(e).__name__)\n"
        ));
    }
    let r = rig.run(py(&code), limits(), uid(4, kind));
    let out = text(&r.stdout);
    assert_eq!(
        out.matches(" refused ").count(),
        3,
        "{out}{}",
        text(&r.stderr)
    );
    assert!(!out.contains("CONNECTED"), "{out}");
    for l in [&local, &any] {
        assert!(no_connection_came(l), "the server got a connection");
    }
}

fn a_fork_bomb_ends_at_the_pids_limit(kind: RuntimeKind, test: &str) {
    let Some(rig) = rig(kind, test) else { return };
    let uid = uid(5, kind);
    let mut l = limits();
    l.pids = 24;
    l.timeout = Duration::from_secs(20);
    let code = r#"
import os, time
kids = 0
try:
    for _ in range(1000):
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
        kids += 1
    print("forked", kids, "without limit")
except OSError as e:
    print("forked", kids, "then", type(e).__name__)
"#;
    let r = rig.run(py(code), l, uid);
    let out = text(&r.stdout);
    if kind == RuntimeKind::Runsc {
        // gVisor: the host pids limit counts the Sentry's threads; when it bites, guest forks
        // fail or the sandbox ends. Either way the run ends and nothing stays (checked).
        assert!(!out.contains("without limit"), "{out}");
    } else {
        let kids: u64 = out
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(u64::MAX);
        assert!(kids < 24, "forked {kids} with a limit of 24: {out}");
        assert!(out.contains("then"), "{out}");
    }
    // A real bomb: every child forks forever. The first process counts its own forks until
    // one fails and then exits, which (as the container's init) ends the whole container:
    // the limit held if that fork failed with EAGAIN long before the deadline.
    l.timeout = Duration::from_secs(20);
    if kind == RuntimeKind::Runsc {
        // The Sentry holds every guest process's pages in the container's memory cgroup, so
        // under load 256 MiB can run out before the pids limit bites; this test is about the
        // pids limit, so memory is given room (the memory wall has its own test).
        l.memory_bytes = 1 << 30;
    }
    let bomb = r#"
import errno, os, time
kids = 0
failed = None
while kids < 5000:
    try:
        pid = os.fork()
    except OSError as e:
        failed = errno.errorcode.get(e.errno, e.errno)
        break
    if pid == 0:
        while True:
            try:
                os.fork()
            except OSError:
                time.sleep(0.001)
    kids += 1
print("bomb forked", kids, "then", failed, flush=True)
os._exit(0)
"#;
    let r = rig.run(py(bomb), l, uid);
    let out = text(&r.stdout);
    eprintln!("{test}: {out:?} {:?} {:?}", r.exit_code, r.signal);
    assert!(
        !r.timed_out,
        "the bomb was ended by the deadline, not the limit: {r:?}"
    );
    if kind == RuntimeKind::Runsc {
        // gVisor: the limit (64 + 8 x pids host tasks) counts the Sentry's threads and a stub
        // per guest process; when it bites either a guest fork fails or the Sentry cannot
        // start a thread and the sandbox ends with an error. Either way the bomb is stopped.
        assert!(
            out.contains("then EAGAIN") || (r.exit_code.is_some_and(|c| c != 0) && out.is_empty()),
            "the bomb was not stopped by the limit: {out} {r:?}"
        );
    } else {
        assert!(out.starts_with("bomb forked "), "{out}{}", text(&r.stderr));
        assert!(out.trim_end().ends_with("then EAGAIN"), "{out}");
        assert_eq!(r.exit_code, Some(0), "{r:?}");
        let kids: u64 = out
            .split_whitespace()
            .nth(2)
            .and_then(|n| n.parse().ok())
            .unwrap_or(u64::MAX);
        assert!(
            kids < 24,
            "the bomb forked {kids} with a limit of 24: {out}"
        );
    }
}

fn the_memory_limit_kills_and_the_run_returns(kind: RuntimeKind, test: &str) {
    let Some(rig) = rig(kind, test) else { return };
    let mut l = limits();
    l.memory_bytes = 128 << 20;
    let r = rig.run(
        js("const a = []; for (;;) { a.push(Buffer.alloc(1 << 20).fill(1)); }"),
        l,
        uid(6, kind),
    );
    assert!(!r.timed_out, "{r:?}");
    assert_ne!(r.exit_code, Some(0), "{r:?}");
    assert!(
        r.oom_killed || r.signal == Some(9),
        "neither oom_killed nor killed: {r:?}"
    );
    if kind != RuntimeKind::Runsc {
        assert!(r.oom_killed, "{r:?}");
    }
}

fn filling_work_hits_its_size(kind: RuntimeKind, test: &str) {
    let Some(rig) = rig(kind, test) else { return };
    let code = r#"
import errno
n = 0
try:
    with open("/work/big", "wb") as f:
        while n < 200 << 20:
            f.write(b"\0" * 65536)
            f.flush()
            n += 65536
    print("wrote", n, "no error")
except OSError as e:
    print("wrote", n, errno.errorcode.get(e.errno, e.errno))
"#;
    let r = rig.run(py(code), limits(), uid(7, kind));
    let out = text(&r.stdout);
    let written: u64 = out
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(u64::MAX);
    let work = spec::tmpfs_sizes(limits().disk_bytes).work;
    assert!(
        written <= work,
        "wrote {written} bytes into a {work}-byte /work: {out}"
    );
    assert!(out.contains("ENOSPC"), "{out}{}", text(&r.stderr));
}

/// The code cannot make a user namespace (where it would be uid 0 with every capability) nor
/// any other: not through `unshare(2)`, `clone(2)` or `clone3(2)` with a namespace flag, nor
/// the `unshare` program. Each attempt runs in a child of its own and prints whether it
/// worked (and then the uid and capabilities it got); the first line is where the code
/// starts. Before runsc applied its namespace deny list, `unshare -r` gave uid 0 there.
fn no_namespace_can_be_created(kind: RuntimeKind, test: &str) {
    let Some(rig) = rig(kind, test) else { return };
    let uid = uid(17, kind);
    let r = rig.run(py(NAMESPACE_ATTACK), limits(), uid);
    assert_eq!(
        text(&r.stdout),
        namespace_attack_refused(uid),
        "{}",
        text(&r.stderr)
    );
}

fn a_flood_of_output_is_truncated(kind: RuntimeKind, test: &str) {
    let Some(rig) = rig(kind, test) else { return };
    let r = rig.run(
        py("import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(100):\n    sys.stdout.write(chunk)\nsys.stdout.flush()\nprint('done', file=sys.stderr)"),
        limits(),
        uid(8, kind),
    );
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert!(r.stdout_truncated);
    assert_eq!(r.stdout.len() as u64, limits().output_bytes);
    assert!(r.stdout.as_slice().iter().all(|b| *b == b'x'));
    assert_eq!(text(&r.stderr), "done\n");
    assert!(!r.stderr_truncated);
}

fn sleeping_past_the_timeout_is_timed_out(kind: RuntimeKind, test: &str) {
    let Some(rig) = rig(kind, test) else { return };
    let mut l = limits();
    l.timeout = Duration::from_secs(2);
    let r = rig.run(
        py("import time\nprint('sleeping', flush=True)\ntime.sleep(60)\nprint('woke')"),
        l,
        uid(9, kind),
    );
    assert!(r.timed_out, "{r:?}");
    assert_eq!(r.signal, Some(9));
    assert!(!r.oom_killed);
    assert_eq!(text(&r.stdout), "sleeping\n");
}

fn background_processes_do_not_outlive_the_run(kind: RuntimeKind, test: &str) {
    let Some(rig) = rig(kind, test) else { return };
    let code = r#"
import os, subprocess, time
subprocess.Popen(["sleep", "300"], start_new_session=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(300)
    os._exit(0)
time.sleep(0.5)
print("left them running")
"#;
    // assert_clean (in run) checks that no process of the uid and no container remains.
    let r = rig.run(py(code), limits(), uid(10, kind));
    assert_eq!(text(&r.stdout), "left them running\n", "{r:?}");
}

fn a_concurrent_run_cannot_be_read(kind: RuntimeKind, test: &str) {
    let Some(rig) = rig(kind, test) else { return };
    let secret = format!("SECRET-{}", fresh_id("s"));
    // The writer stamps (wall clock, shared with the host and every container) when its
    // secret exists and when it stops existing; the reader stamps its attempts; the test
    // checks the attempts fell inside the writer's window, so the reader did run beside it.
    let hold = if kind == RuntimeKind::Runsc { 12 } else { 8 };
    let writer = format!(
        "import time\nfor p in ['/work/secret', '/tmp/secret']:\n    open(p, 'w').write('{secret}')\nprint('written', time.time(), flush=True)\ntime.sleep({hold})\nprint('ending', time.time(), flush=True)\n"
    );
    let reader = r#"
import glob, os, time
began = time.time()
found = []
tried = 0
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
paths = ["/work/secret", "/tmp/secret"] + glob.glob("/proc/*/root/work/secret") + glob.glob("/proc/*/root/tmp/secret")
paths += [f"/proc/{p}/root{f}" for p in pids for f in ("/work/secret", "/tmp/secret")]
for p in paths:
    tried += 1
    try:
        found.append(open(p).read())
    except Exception:
        pass
print("found", found)
print("tried", tried)
print("pids", pids)
print("attempts", began, time.time())
"#;
    let mut l = limits();
    l.timeout = Duration::from_secs(hold + 20);
    std::thread::scope(|s| {
        let a = s.spawn(|| rig.run(py(&writer), l, uid(11, kind)));
        // Give the writer time to start (checked below, not assumed).
        std::thread::sleep(Duration::from_secs(if kind == RuntimeKind::Runsc {
            4
        } else {
            2
        }));
        let b = rig.run(py(reader), limits(), uid(12, kind));
        let out = text(&b.stdout);
        assert_eq!(b.exit_code, Some(0), "{b:?}");
        assert!(out.contains("found []"), "{out}{}", text(&b.stderr));
        assert!(!out.contains(&secret), "{out}");
        let a = a.join().unwrap();
        let written = text(&a.stdout);
        let stamp = |text: &str, key: &str, nth: usize| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|rest| rest.split_whitespace().nth(nth))
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| panic!("no `{key}` stamp in {text:?}"))
        };
        let (window_start, window_end) = (
            stamp(&written, "written ", 0),
            stamp(&written, "ending ", 0),
        );
        let (tried_start, tried_end) = (stamp(&out, "attempts ", 0), stamp(&out, "attempts ", 1));
        assert!(
            window_start < tried_start && tried_end < window_end,
            "the reader did not run while the secret existed: secret from {window_start} to \
             {window_end}, attempts from {tried_start} to {tried_end}"
        );
        let tried: u64 = stamp(&out, "tried ", 0) as u64;
        assert!(tried >= 2, "{out}");
    });
}

fn a_project_runs_its_steps_and_returns_artifacts(kind: RuntimeKind, test: &str) {
    let Some(rig) = rig(kind, test) else { return };
    let spec = RunSpec::Project(Project {
        files: vec![
            ProjectFile {
                path: "main.py".into(),
                content: "import sys\nprint(open('data/in.txt').read().upper(), end='')\n".into(),
                executable: false,
            },
            ProjectFile {
                path: "data/in.txt".into(),
                content: "hello from a project\n".into(),
                executable: false,
            },
        ],
        steps: vec![
            Step {
                name: Some("build".into()),
                run: "python3 main.py > out.txt && echo built".into(),
            },
            Step {
                name: Some("check".into()),
                run: "wc -c < out.txt; node -e 'console.log(require(\"fs\").readFileSync(\"out.txt\", \"utf8\").length)'".into(),
            },
        ],
        artifacts: vec!["out.txt".into(), "missing.txt".into()],
    });
    let r = rig.run(spec, limits(), uid(13, kind));
    assert_eq!(r.steps.len(), 2, "{r:?}");
    assert_eq!(r.steps[0].exit_code, Some(0), "{:?}", r.steps[0]);
    assert_eq!(text(&r.steps[0].stdout), "built\n");
    assert_eq!(text(&r.steps[1].stdout), "21\n21\n", "{:?}", r.steps[1]);
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(r.artifacts.len(), 2);
    assert!(r.artifacts[0].found);
    assert_eq!(text(&r.artifacts[0].content), "HELLO FROM A PROJECT\n");
    assert!(!r.artifacts[1].found);

    // A step past the deadline: the agent stops it and still answers.
    let mut l = limits();
    l.timeout = Duration::from_secs(2);
    let sleepy = RunSpec::Project(Project {
        files: vec![],
        steps: vec![
            Step {
                name: None,
                run: "echo first".into(),
            },
            Step {
                name: None,
                run: "sleep 60".into(),
            },
            Step {
                name: None,
                run: "echo never".into(),
            },
        ],
        artifacts: vec![],
    });
    let r = rig.run(sleepy, l, uid(13, kind));
    assert!(r.timed_out, "{r:?}");
    assert_eq!(r.steps.len(), 2, "{r:?}");
    assert!(r.steps[1].timed_out);
    assert_eq!(text(&r.steps[0].stdout), "first\n");

    // A step past the memory limit.
    let mut l = limits();
    l.memory_bytes = 128 << 20;
    let hungry = RunSpec::Project(Project {
        files: vec![],
        steps: vec![Step {
            name: None,
            run: "node -e 'const a = []; for (;;) a.push(Buffer.alloc(1 << 20).fill(1))'".into(),
        }],
        artifacts: vec![],
    });
    let r = rig.run(hungry, l, uid(13, kind));
    assert!(!r.timed_out, "{r:?}");
    // crun, runc: the agent sees the step die and the OOM count rise. runsc: the whole
    // sandbox is killed, agent included; the provider reports it from the run's cgroup.
    assert!(r.oom_killed, "{r:?}");
    if kind != RuntimeKind::Runsc {
        assert!(r.steps[0].oom_killed, "{r:?}");
    }
}

/// A broker that answers every line it reads with `pong:<line>`.
#[derive(Debug)]
struct EchoBroker;

impl BrokerPort for EchoBroker {
    fn serve_stream(&self, _stream: std::os::unix::net::UnixStream) -> std::io::Result<()> {
        Err(std::io::Error::other(
            "containers are served through a listener",
        ))
    }

    fn serve_listener(&self, listener: std::os::unix::net::UnixListener) -> std::io::Result<()> {
        use std::io::{BufRead as _, Write as _};
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                std::thread::spawn(move || {
                    let mut line = String::new();
                    let mut reader = std::io::BufReader::new(&conn);
                    if reader.read_line(&mut line).is_ok() {
                        let _ = (&conn).write_all(format!("pong:{line}").as_bytes());
                    }
                });
            }
        });
        Ok(())
    }
}

fn a_grant_run_reaches_its_broker_through_its_socket(kind: RuntimeKind, test: &str) {
    let Some(rig) = rig(kind, test) else { return };
    let uid = uid(15, kind);
    let broker = || Some(BrokerChannel::new(std::sync::Arc::new(EchoBroker)));
    let code = r#"
import os, socket
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["PLIMSOLL_BROKER_SOCKET"])
s.sendall(b"ping\n")
print(s.recv(100).decode(), end="")
import plimsoll_host
print("client", callable(plimsoll_host.get))
"#;
    let mut plan = rig.plan(py(code), limits(), uid);
    plan.broker = broker();
    let r = rig.run_plan(&plan);
    assert_eq!(
        text(&r.stdout),
        "pong:ping\nclient True\n",
        "{}",
        text(&r.stderr)
    );
    let mut plan = rig.plan(
        js("console.log(typeof host, typeof host.get)"),
        limits(),
        uid,
    );
    plan.broker = broker();
    let r = rig.run_plan(&plan);
    assert_eq!(text(&r.stdout), "object function\n", "{}", text(&r.stderr));
    let project = RunSpec::Project(Project {
        files: vec![],
        steps: vec![Step {
            name: None,
            run: "node -e 'console.log(typeof host)' && python3 -c 'import plimsoll_host; print(plimsoll_host.__name__)'".into(),
        }],
        artifacts: vec![],
    });
    let mut plan = rig.plan(project, limits(), uid);
    plan.broker = broker();
    let r = rig.run_plan(&plan);
    assert_eq!(text(&r.steps[0].stdout), "object\nplimsoll_host\n", "{r:?}");
    // Without a grant there is no socket and no client.
    let r = rig.run(py("import os\nprint(sorted(os.listdir('/opt/plimsoll/bin')), os.environ.get('PLIMSOLL_BROKER_SOCKET'))"), limits(), uid);
    assert_eq!(text(&r.stdout), "['main.py'] None\n", "{r:?}");
}

/// The in-sandbox clients, the run's socket, the real broker and an API behind it: the API
/// sees the credential, the sandbox never does.
fn grant_calls_go_through_the_real_broker(kind: RuntimeKind, test: &str) {
    use plimsoll_broker::{Broker, GrantProfiles};
    use plimsoll_testing::api::{Expect, TestApi};
    let Some(rig) = rig(kind, test) else { return };
    let uid = uid(16, kind);
    let secret = "tok-never-in-the-sandbox";
    let api = TestApi::start(Expect::Static {
        header: "authorization".into(),
        value: format!("Bearer {secret}"),
    });
    let grants = GrantProfiles::parse(
        &format!(
            "[profiles.orders]\nbase_url = \"{}\"\nroutes = [\"GET /orders/*\"]\ncallers = [\"alice\"]\ncall_budget = 5\n[profiles.orders.credential]\nkind = \"static\"\nsecret_env = \"ORDERS_API_TOKEN\"\n",
            api.url()
        ),
        |name| (name == "ORDERS_API_TOKEN").then(|| secret.to_owned()),
    )
    .unwrap();
    let profile = grants.authorize("orders", "alice").unwrap();
    let cases = [
        py(
            "import os, plimsoll_host as host\nprint(host.get('/orders/3')['path'])\ntry:\n    host.get('/admin')\nexcept host.HostError as e:\n    print('refused', e.code)\nprint(any('tok-' in v for v in os.environ.values()))",
        ),
        js(
            "host.get('/orders/4').then((r) => console.log(r.path)).then(() => host.get('/admin')).catch((e) => console.log('refused', e.code))",
        ),
    ];
    for (i, spec) in cases.into_iter().enumerate() {
        let mut plan = rig.plan(spec, limits(), uid);
        let broker = Broker::start(
            std::sync::Arc::clone(&profile),
            "alice",
            &plan.run_id,
            Duration::from_secs(30),
        );
        plan.broker = Some(BrokerChannel::new(std::sync::Arc::new(broker.clone())));
        let r = rig.run_plan(&plan);
        let calls = broker.finish();
        let out = text(&r.stdout);
        assert!(
            out.starts_with(&format!("/orders/{}\nrefused ", 3 + i)),
            "{out}{}",
            text(&r.stderr)
        );
        assert!(!out.contains(secret) && !text(&r.stderr).contains(secret));
        assert_eq!(calls.len(), 2, "{calls:?}");
        assert_eq!(calls[0].status, Some(200));
        assert!(calls[1].error.is_some(), "{calls:?}");
    }
    let seen = api.seen();
    assert_eq!(seen.len(), 2, "only the allowed calls reached the API");
    assert!(seen.iter().all(|s| s.authorized));
}

/// The daemon is SIGKILLed mid-run: the container, its cgroup and its run directory stay.
/// The next provider's `reap` removes them all.
#[test]
fn crun_reap_after_the_daemon_was_killed() {
    let test = "crun_reap_after_the_daemon_was_killed";
    let Some(rig) = rig(RuntimeKind::Crun, test) else {
        return;
    };
    let uid = uid(14, RuntimeKind::Crun);
    let run_id = fresh_id("killed");
    let id = format!("plimsoll-{run_id}");
    let mut child = Spawn::new(env!("CARGO_BIN_EXE_plimsoll-oci-run"), "/")
        .args(["run", "crun", "python", "import time\ntime.sleep(120)"])
        .arg("--state-root")
        .arg(&rig.state_root)
        .args([
            "--cgroup-parent",
            &rig.cgroup_parent,
            "--run-id",
            &run_id,
            "--timeout-ms",
            "100000",
        ])
        .args(["--uid", &uid.to_string(), "--image"])
        .arg(image())
        .spawn()
        .expect("start plimsoll-oci-run");
    let start = Instant::now();
    let mut seen = BTreeMap::new();
    loop {
        let listed = rig.p.runtime().list().unwrap_or_default().contains(&id);
        let procs = !processes_of_uid(uid).is_empty();
        seen.insert("listed", listed);
        seen.insert("processes", procs);
        if listed && procs {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the run never started: {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // SIGKILL the "daemon" alone: its runtime child and the container carry on.
    let pid = rustix::process::Pid::from_raw(child.child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    child.child.wait().unwrap();
    let mut drained = Vec::new();
    let _ = child.stdout.read_to_end(&mut drained);
    assert!(
        rig.p.runtime().list().unwrap().contains(&id),
        "the container should have outlived the daemon"
    );
    assert!(
        !rig.p.state().is_live(&id),
        "the dead daemon's lock is released"
    );

    // A new daemon starts: a fresh provider on the same state root reaps.
    let mut c = rig.p.config().clone();
    c.state_root = rig.state_root.clone();
    let again = OciProvider::new(c);
    let report = again.reap();
    assert!(report.errors.is_empty(), "{report:?}");
    assert_eq!(report.containers, std::slice::from_ref(&id));
    assert_eq!(report.run_dirs, std::slice::from_ref(&id));
    assert_eq!(report.cgroups, std::slice::from_ref(&run_id));
    // The container's init lost its parent (the killed runtime) and came to this test
    // process, the nearest child subreaper: dead, it waits here to be reaped. A restarted
    // daemon is not its parent; init reaps it there.
    reap_our_zombies(uid);
    rig.assert_clean(&run_id, uid);
    assert!(
        again
            .reap()
            .summary()
            .starts_with("removed 0 containers, 0 cgroups, 0 run directories")
    );
}

/// The real runtime behind a wrapper that makes `create` fail (while `fail-create` exists)
/// or runs the real `start` and then reports failure: a failed `create` ran nothing and is
/// refused as not dispatched; a failure from `start` on may have run code and is `Failed`.
fn only_a_failed_create_is_not_dispatched(kind: RuntimeKind, test: &str) {
    let Some(mut rig) = rig(kind, test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("fail-create");
    let wrapper = dir.path().join(kind.name());
    let real = kind.default_binary();
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do\n  if [ \"$a\" = start ]; then\n    {real} \"$@\"\n    echo 'wrapper: start failed after starting' >&2\n    exit 1\n  fi\n  if [ \"$a\" = create ] && [ -e {flag} ]; then\n    echo 'wrapper: create refused' >&2\n    exit 1\n  fi\ndone\nexec {real} \"$@\"\n",
            flag = flag.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mut c = rig.p.config().clone();
    c.binary = wrapper;
    rig.p = OciProvider::new(c);
    let uid = uid(13, kind);

    let plan = rig.plan(py("print('ran')"), limits(), uid);
    let e = rig.p.run(&plan).expect_err("start was made to fail");
    rig.assert_clean(&plan.run_id, uid);
    match e {
        e @ LaunchError::MayHaveRun { .. } => {
            let message = e.message();
            assert!(message.contains("start failed after starting"), "{message}")
        }
        other => panic!("a failure after start was refused as not dispatched: {other:?}"),
    }

    std::fs::write(&flag, b"").unwrap();
    let plan = rig.plan(py("print('ran')"), limits(), uid);
    let e = rig.p.run(&plan).expect_err("create was made to fail");
    rig.assert_clean(&plan.run_id, uid);
    match e {
        e @ LaunchError::NotStarted { .. } => {
            let (reason, message) = (e.not_dispatched().expect("not started"), e.message());
            assert_eq!(reason, Reason::Environment);
            assert!(message.contains("create refused"), "{message}");
        }
        other => panic!("a failed create was not refused: {other:?}"),
    }
}

/// A provider whose runtime is missing is not offered, and says why.
#[test]
fn a_missing_runtime_is_not_offered() {
    let mut c = OciConfig::new(
        RuntimeKind::Crun,
        image(),
        "/nonexistent/agent".into(),
        "/nonexistent/probe".into(),
        2_199_100,
    );
    c.binary = "/nonexistent/crun".into();
    c.state_root = std::env::temp_dir().join(format!("plimsoll-missing-{}", std::process::id()));
    c.cgroup_parent = format!("/plimsoll-test/missing-{}", std::process::id());
    let p = OciProvider::new(c.clone());
    let probed = p.probe();
    let why = probed.available.unwrap_err().to_string();
    assert!(
        why.contains("runtime") && why.contains("/nonexistent/crun"),
        "{why}"
    );
    assert_eq!(probed.tier, Tier::Container);
    assert!(probed.evidence.probe.is_none(), "nothing ran");
    let _ = std::fs::remove_dir_all(&c.state_root);
}

/// The "daemon" (plimsoll-oci-run) is SIGKILLed one second into a run of an endless loop
/// with a 3 s timeout, and nothing restarts it: the watchdog it left ends the container's
/// processes at the deadline plus [`plimsoll_oci::WATCHDOG_GRACE`]. The container cgroup's
/// CPU time (cpuacct) stops there. Before, the loop went on until a daemon started again.
fn a_run_ends_at_its_deadline_without_the_daemon(kind: RuntimeKind, test: &str) {
    let Some(rig) = rig(kind, test) else { return };
    let uid = uid(18, kind);
    let run_id = fresh_id("deadline");
    let timeout = Duration::from_secs(3);
    let start = Instant::now();
    let mut child = Spawn::new(env!("CARGO_BIN_EXE_plimsoll-oci-run"), "/")
        .args(["run", kind.name(), "python", "while True:\n    pass"])
        .arg("--state-root")
        .arg(&rig.state_root)
        .args(["--cgroup-parent", &rig.cgroup_parent, "--run-id", &run_id])
        .args(["--timeout-ms", &timeout.as_millis().to_string()])
        .args(["--uid", &uid.to_string(), "--image"])
        .arg(image())
        .spawn()
        .expect("start plimsoll-oci-run");
    let layout = rig.p.layout().unwrap();
    let ctr = spec::container_cgroup(rig.p.cgroup_parent(), &run_id);
    let procs_of = |dirs: &[std::path::PathBuf]| -> usize {
        dirs.iter()
            .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
            .map(|t| t.lines().count())
            .max()
            .unwrap_or(0)
    };
    while procs_of(&layout.dirs(&ctr)) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the run never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_secs(1));
    let pid = rustix::process::Pid::from_raw(child.child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    child.child.wait().unwrap();
    let mut drained = Vec::new();
    let _ = child.stdout.read_to_end(&mut drained);
    let cpu_ns = || -> Option<u64> {
        layout
            .dirs(&ctr)
            .iter()
            .find_map(|d| std::fs::read_to_string(d.join("cpuacct.usage")).ok())
            .and_then(|t| t.trim().parse().ok())
    };
    let bound = timeout + plimsoll_oci::WATCHDOG_GRACE;
    loop {
        if procs_of(&layout.dirs(&ctr)) == 0 {
            break;
        }
        assert!(
            start.elapsed() < bound + Duration::from_secs(20),
            "the container's processes outlived the deadline by far ({:?})",
            start.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let ended = start.elapsed();
    let first = cpu_ns();
    std::thread::sleep(Duration::from_secs(1));
    let cpu = cpu_ns();
    eprintln!(
        "{}: processes gone {ended:?} after start (deadline {timeout:?} + grace {:?}); cgroup CPU {:?} s",
        kind.name(),
        plimsoll_oci::WATCHDOG_GRACE,
        cpu.map(|n| n as f64 / 1e9)
    );
    assert_eq!(first, cpu, "CPU time still grows");
    if let Some(ns) = cpu {
        // One CPU per run (the cpu quota): never more CPU time than wall time.
        assert!(
            Duration::from_nanos(ns) <= bound + Duration::from_secs(2),
            "{ns} ns of CPU"
        );
    }
    // The dead daemon's leftovers (container state, cgroups, directory) go with a reap.
    let _ = rig.p.reap();
    reap_our_zombies(uid);
}
