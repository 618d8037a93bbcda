//! Attacks on the process tier, run for real (as root): each one must fail inside the
//! sandbox, and every run must leave nothing behind.

use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::time::Duration;

use plimsoll_process::{ProcessConfig, ProcessProvider};
use plimsoll_sandbox::reap::processes_of_uid;
use plimsoll_sandbox::{LaunchError, LaunchPlan, Outcome, Provider as _, ResolvedLimits};
use plimsoll_testing::{
    NAMESPACE_ATTACK, cpu_seconds, is_root, namespace_attack_refused, probe_binary, skip_or_fail,
};
use plimsoll_wire::{Language, Reason, RunResult, RunSpec, Snippet};

/// Each test has uids of its own (tests run in parallel, and the end of a run kills every
/// process of its uid).
const UID_BASE: u32 = 2_310_000;

struct Env {
    _tmp: tempfile::TempDir,
    state: PathBuf,
    provider: ProcessProvider,
}

fn setup(test: &str, probe_uid: u32) -> Option<Env> {
    if !is_root() {
        skip_or_fail(test, "needs root to switch uids");
        return None;
    }
    let tmp = tempfile::Builder::new()
        .prefix("plimsoll-process-test-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let state = tmp.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o711)).unwrap();
    let provider = ProcessProvider::new(ProcessConfig {
        node: "/usr/bin/node".into(),
        python: "/usr/bin/python3".into(),
        probe: probe_binary().unwrap_or_else(|e| panic!("{e}")),
        state_dir: state.clone(),
        probe_uid: UID_BASE + probe_uid,
    });
    Some(Env {
        _tmp: tmp,
        state,
        provider,
    })
}

fn limits() -> ResolvedLimits {
    ResolvedLimits {
        timeout: Duration::from_secs(20),
        memory_bytes: 1 << 30,
        output_bytes: 1 << 20,
        pids: 64,
        disk_bytes: 64 << 20,
        artifact_bytes: 1 << 20,
    }
}

fn plan(env: &Env, uid: u32, language: Language, code: &str, limits: ResolvedLimits) -> LaunchPlan {
    let run_id = format!("t{uid}-{}", std::process::id());
    LaunchPlan {
        run_dir: env.state.join("runs").join(&run_id),
        run_id,
        request_id: "test".into(),
        privileges: plimsoll_sandbox::Privileges::Unprivileged,
        spec: RunSpec::Snippet(Snippet {
            language,
            code: code.into(),
        }),
        limits,
        uid: UID_BASE + uid,
        gid: UID_BASE + uid,
        controller_uid: UID_BASE + uid + 1,
        controller_gid: UID_BASE + uid + 1,
        broker: None,
    }
}

/// Runs a plan and checks what must hold after every run: no process of the uid, no run dir.
fn run_plan(env: &Env, plan: &LaunchPlan) -> Result<Outcome, LaunchError> {
    let out = env.provider.run(plan);
    assert!(
        !plan.run_dir.exists(),
        "run dir {} left behind",
        plan.run_dir.display()
    );
    if plan.uid != 0 {
        assert_eq!(
            processes_of_uid(plan.uid),
            Vec::<i32>::new(),
            "processes of uid {} left",
            plan.uid
        );
    }
    out
}

fn run(env: &Env, uid: u32, language: Language, code: &str) -> RunResult {
    run_with(env, uid, language, code, limits())
}

fn run_with(
    env: &Env,
    uid: u32,
    language: Language,
    code: &str,
    limits: ResolvedLimits,
) -> RunResult {
    let p = plan(env, uid, language, code, limits);
    run_plan(env, &p)
        .unwrap_or_else(|e| panic!("run failed: {e}"))
        .result
}

fn stdout(r: &RunResult) -> String {
    String::from_utf8_lossy(r.stdout.as_slice()).into_owned()
}

fn explain(r: &RunResult) -> String {
    format!(
        "exit {:?} signal {:?} timed_out {} stdout {:?} stderr {:?}",
        r.exit_code,
        r.signal,
        r.timed_out,
        stdout(r),
        String::from_utf8_lossy(r.stderr.as_slice())
    )
}

use Language::{Javascript as Js, Python as Py};

#[test]
fn exit_codes_and_signals_pass_through() {
    let Some(env) = setup("exit_codes_and_signals_pass_through", 0) else {
        return;
    };
    let r = run(&env, 1, Py, "import sys\nprint('hi')\nsys.exit(42)");
    assert_eq!(
        (r.exit_code, r.signal, stdout(&r).as_str()),
        (Some(42), None, "hi\n"),
        "{}",
        explain(&r)
    );
    let r = run(&env, 1, Js, "console.log('hi'); process.exit(7)");
    assert_eq!(
        (r.exit_code, stdout(&r).as_str()),
        (Some(7), "hi\n"),
        "{}",
        explain(&r)
    );
    let r = run(
        &env,
        1,
        Py,
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    );
    assert_eq!((r.exit_code, r.signal), (None, Some(9)), "{}", explain(&r));
    assert!(!r.timed_out);
}

#[test]
fn network_sockets_are_denied() {
    let Some(env) = setup("network_sockets_are_denied", 2) else {
        return;
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let js = format!(
        "const s = require('net').connect({port}, '127.0.0.1');\n\
         s.on('connect', () => {{ console.log('CONNECTED'); process.exit(0); }});\n\
         s.on('error', (e) => {{ console.log('ERR ' + e.code); process.exit(3); }});"
    );
    let r = run(&env, 3, Js, &js);
    assert_eq!(r.exit_code, Some(3), "{}", explain(&r));
    assert!(stdout(&r).starts_with("ERR E"), "{}", explain(&r));
    let py = format!(
        "import socket\n\
         for fam in (socket.AF_INET, socket.AF_INET6, socket.AF_UNIX):\n\
         \x20   try:\n\
         \x20       s = socket.socket(fam, socket.SOCK_STREAM)\n\
         \x20       print('OPEN', fam)\n\
         \x20   except OSError as e:\n\
         \x20       print('DENIED', e.errno)\n\
         try:\n\
         \x20   socket.create_connection(('127.0.0.1', {port}), timeout=2)\n\
         \x20   print('CONNECTED')\n\
         except OSError as e:\n\
         \x20   print('DENIED', e.errno)\n"
    );
    let r = run(&env, 3, Py, &py);
    assert_eq!(r.exit_code, Some(0), "{}", explain(&r));
    assert_eq!(stdout(&r), "DENIED 1\n".repeat(4), "{}", explain(&r));
    // And nothing reached the listener.
    assert_eq!(
        listener.accept().map(|_| ()).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock
    );
}

#[test]
fn the_environment_is_empty() {
    let Some(env) = setup("the_environment_is_empty", 4) else {
        return;
    };
    let r = run(
        &env,
        5,
        Js,
        "console.log(JSON.stringify(Object.keys(process.env)))",
    );
    assert_eq!(stdout(&r), "[]\n", "{}", explain(&r));
    // What the process was given is empty. Python then adds LC_CTYPE=C.UTF-8 itself (PEP 538
    // locale coercion, which only PYTHONCOERCECLOCALE=0 turns off); nothing else appears.
    let r = run(
        &env,
        5,
        Py,
        "import os\nprint(len(open('/proc/self/environ','rb').read()), sorted(os.environ.items()))",
    );
    assert_eq!(
        stdout(&r),
        "0 [('LC_CTYPE', 'C.UTF-8')]\n",
        "{}",
        explain(&r)
    );
}

#[test]
fn namespaces_cannot_be_created_but_subprocesses_can() {
    let Some(env) = setup("namespaces_cannot_be_created_but_subprocesses_can", 28) else {
        return;
    };
    let r = run(
        &env,
        29,
        Py,
        "import ctypes, os, subprocess\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         for flag in (0x10000000, 0x40000000, 0x20000000):\n\
         \x20   rc = libc.unshare(flag)\n\
         \x20   print('unshare', rc, ctypes.get_errno())\n\
         print(subprocess.run(['/bin/echo', 'child ok'], capture_output=True).stdout.decode(), end='')\n\
         r = subprocess.run(['/usr/bin/unshare', '--user', '/bin/true'], capture_output=True)\n\
         print('unshare(1) exit', r.returncode)\n",
    );
    assert_eq!(r.exit_code, Some(0), "{}", explain(&r));
    assert_eq!(
        stdout(&r),
        "unshare -1 1\nunshare -1 1\nunshare -1 1\nchild ok\nunshare(1) exit 1\n",
        "{}",
        explain(&r)
    );
    let r = run(
        &env,
        29,
        Js,
        "console.log(require('child_process').execFileSync('/bin/echo', ['node child ok']).toString().trim())",
    );
    assert_eq!(stdout(&r), "node child ok\n", "{}", explain(&r));
}

/// The attack every provider gets (plimsoll_testing): no namespace of any kind,
/// by any call.
#[test]
fn no_namespace_can_be_created() {
    let Some(env) = setup("no_namespace_can_be_created", 60) else {
        return;
    };
    let r = run(&env, 61, Py, NAMESPACE_ATTACK);
    assert_eq!(
        stdout(&r),
        namespace_attack_refused(UID_BASE + 61),
        "{}",
        explain(&r)
    );
}

#[test]
fn etc_shadow_is_unreadable() {
    let Some(env) = setup("etc_shadow_is_unreadable", 6) else {
        return;
    };
    let r = run(
        &env,
        7,
        Py,
        "try:\n    open('/etc/shadow').read()\n    print('READ')\nexcept OSError as e:\n    print('DENIED', e.errno)",
    );
    assert_eq!(stdout(&r), "DENIED 13\n", "{}", explain(&r));
    let r = run(
        &env,
        7,
        Js,
        "try { require('fs').readFileSync('/etc/shadow'); console.log('READ') } catch (e) { console.log('DENIED ' + e.code) }",
    );
    assert_eq!(stdout(&r), "DENIED EACCES\n", "{}", explain(&r));
}

#[test]
fn the_daemons_files_cannot_be_written() {
    let Some(env) = setup("the_daemons_files_cannot_be_written", 8) else {
        return;
    };
    let secret = env.state.join("daemon-file");
    std::fs::write(&secret, "daemon data").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o666)).unwrap();
    let code = format!(
        "import os\n\
         for path in [{secret:?}]:\n\
         \x20   try:\n\
         \x20       open(path, 'a').write('x')\n\
         \x20       print('WROTE', path)\n\
         \x20   except OSError as e:\n\
         \x20       print('DENIED', e.errno)\n\
         for d in [{state:?}, {runs:?}, '/tmp', '/', '/etc', '/var/tmp', '/dev/shm']:\n\
         \x20   try:\n\
         \x20       open(os.path.join(d, 'planted'), 'x').write('x')\n\
         \x20       print('WROTE', d)\n\
         \x20   except OSError as e:\n\
         \x20       print('DENIED', e.errno)\n\
         open('mine', 'w').write('ok')\n\
         print('OWN', open('mine').read())\n",
        secret = secret.display().to_string(),
        state = env.state.display().to_string(),
        runs = env.state.join("runs").display().to_string(),
    );
    let r = run(&env, 9, Py, &code);
    let out = stdout(&r);
    assert!(!out.contains("WROTE"), "{}", explain(&r));
    assert_eq!(out.matches("DENIED").count(), 8, "{}", explain(&r));
    assert!(out.ends_with("OWN ok\n"), "{}", explain(&r));
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "daemon data");
    assert!(!env.state.join("planted").exists());
}

#[test]
fn another_runs_work_dir_cannot_be_written() {
    let Some(env) = setup("another_runs_work_dir_cannot_be_written", 10) else {
        return;
    };
    let first = plan(
        &env,
        11,
        Py,
        "import os, time\ntime.sleep(3)\nprint(sorted(os.listdir('.')))",
        limits(),
    );
    let first_work = first.run_dir.join("work");
    std::thread::scope(|s| {
        let a = s.spawn(|| run_plan(&env, &first));
        // Wait until the first run's work dir exists (its code is starting).
        let mut waited = 0;
        while !first_work.exists() {
            std::thread::sleep(Duration::from_millis(10));
            waited += 1;
            assert!(waited < 1000, "the first run never started");
        }
        let code = format!(
            "import os\n\
             target = {w:?}\n\
             for attempt in ('create', 'list'):\n\
             \x20   try:\n\
             \x20       if attempt == 'create':\n\
             \x20           open(os.path.join(target, 'planted'), 'x').write('x')\n\
             \x20       else:\n\
             \x20           os.listdir(target)\n\
             \x20       print('DID', attempt)\n\
             \x20   except OSError as e:\n\
             \x20       print('DENIED', attempt, e.errno)\n",
            w = first_work.display().to_string()
        );
        let second = plan(&env, 12, Py, &code, limits());
        let r = run_plan(&env, &second).unwrap().result;
        assert_eq!(
            stdout(&r),
            "DENIED create 13\nDENIED list 13\n",
            "{}",
            explain(&r)
        );
        let r = a.join().unwrap().unwrap().result;
        assert_eq!(stdout(&r), "[]\n", "{}", explain(&r));
    });
}

#[test]
fn a_fork_bomb_hits_the_process_limit() {
    let Some(env) = setup("a_fork_bomb_hits_the_process_limit", 13) else {
        return;
    };
    let small = ResolvedLimits {
        pids: 16,
        ..limits()
    };
    // Children that stay: count how many fit under the limit.
    let r = run_with(
        &env,
        14,
        Py,
        "import os, time\n\
         n = 0\n\
         try:\n\
         \x20   while True:\n\
         \x20       if os.fork() == 0:\n\
         \x20           time.sleep(60)\n\
         \x20           os._exit(0)\n\
         \x20       n += 1\n\
         except OSError as e:\n\
         \x20   print(n, e.errno)\n",
        small,
    );
    assert_eq!(r.exit_code, Some(0), "{}", explain(&r));
    let out = stdout(&r);
    let mut it = out.split_whitespace();
    let n: u64 = it.next().unwrap().parse().unwrap();
    assert_eq!(
        it.next(),
        Some("11"),
        "fork should fail with EAGAIN: {}",
        explain(&r)
    );
    assert!(n > 0 && n < 16, "{n} children under a limit of 16");
    // The classic: every process forks forever. It ends at the timeout, and cleanly.
    let r = run_with(
        &env,
        14,
        Py,
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        ResolvedLimits {
            timeout: Duration::from_secs(2),
            ..small
        },
    );
    assert!(r.timed_out, "{}", explain(&r));
}

#[test]
fn sleeping_past_the_timeout_is_killed() {
    let Some(env) = setup("sleeping_past_the_timeout_is_killed", 15) else {
        return;
    };
    let r = run_with(
        &env,
        16,
        Py,
        "import time\nprint('start', flush=True)\ntime.sleep(60)\nprint('never')",
        ResolvedLimits {
            timeout: Duration::from_secs(1),
            ..limits()
        },
    );
    assert!(r.timed_out, "{}", explain(&r));
    assert_eq!((r.exit_code, r.signal), (None, Some(9)));
    assert_eq!(stdout(&r), "start\n");
}

#[test]
fn a_hundred_megabytes_of_output_is_capped() {
    let Some(env) = setup("a_hundred_megabytes_of_output_is_capped", 17) else {
        return;
    };
    let r = run(
        &env,
        18,
        Js,
        "const chunk = Buffer.alloc(1 << 20, 120);\n\
         for (let i = 0; i < 100; i++) process.stdout.write(chunk);\n\
         process.stderr.write('done\\n');",
    );
    assert_eq!(r.exit_code, Some(0), "{}", explain(&r));
    assert_eq!(r.stdout.as_slice().len(), 1 << 20);
    assert!(r.stdout.as_slice().iter().all(|b| *b == b'x'));
    assert!(r.stdout_truncated);
    assert_eq!(r.stderr.as_slice(), b"done\n");
    assert!(!r.stderr_truncated);
}

#[test]
fn a_background_process_does_not_outlive_the_run() {
    let Some(env) = setup("a_background_process_does_not_outlive_the_run", 19) else {
        return;
    };
    // The escapee leaves the run's session, sends its pid back through a pipe and sleeps;
    // the run checks it is alive (not a zombie, in another session) before it exits.
    let r = run(
        &env,
        20,
        Py,
        "import os, time\n\
         r, w = os.pipe()\n\
         pid = os.fork()\n\
         if pid == 0:\n\
         \x20   os.close(r)\n\
         \x20   os.setsid()\n\
         \x20   if os.fork() == 0:\n\
         \x20       null = os.open('/dev/null', os.O_RDWR)\n\
         \x20       for fd in (0, 1, 2):\n\
         \x20           os.dup2(null, fd)\n\
         \x20       os.write(w, str(os.getpid()).encode())\n\
         \x20       os.close(w)\n\
         \x20       time.sleep(300)\n\
         \x20   os._exit(0)\n\
         os.close(w)\n\
         os.waitpid(pid, 0)\n\
         esc = int(os.read(r, 32))\n\
         os.kill(esc, 0)\n\
         state = open(f'/proc/{esc}/stat').read().rpartition(')')[2].split()[0]\n\
         print('ESCAPEE', esc, state, os.getsid(esc) != os.getsid(0))\n",
    );
    assert_eq!(r.exit_code, Some(0), "{}", explain(&r));
    let out = stdout(&r);
    let fields: Vec<&str> = out.split_whitespace().collect();
    // Alive: sleeping, or still running on its way to the sleep (seen once under load);
    // never a zombie or dead.
    assert!(
        matches!(fields.as_slice(), ["ESCAPEE", _, "S" | "R", "True"]),
        "the escapee was not alive in its own session during the run: {}",
        explain(&r)
    );
    // run() already checked no process of the uid is left; the escapee's pid in particular
    // is gone (or reused by a process of another uid).
    let pid: i32 = fields[1].parse().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let uid = (UID_BASE + 20).to_string();
    assert!(
        !status
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().any(|u| u == uid)),
        "the escapee {pid} outlived the run: {status}"
    );
}

/// The code directory is closed to other uids: its path (with the random run id) shows in
/// `/proc/PID/cmdline`, so knowing it must not be enough to read a run's code.
#[test]
fn another_user_cannot_read_a_running_snippets_code() {
    let Some(env) = setup("another_user_cannot_read_a_running_snippets_code", 40) else {
        return;
    };
    let p = plan(
        &env,
        41,
        Py,
        "import time\ntime.sleep(3)\nprint(open(__file__).read().count('sleep'))",
        limits(),
    );
    let code_dir = p.run_dir.join("code");
    let main = code_dir.join("main.py");
    std::thread::scope(|s| {
        let running = s.spawn(|| run_plan(&env, &p));
        // Wait until the code is in place with its final mode.
        let mut waited = 0;
        while !std::fs::metadata(&main).is_ok_and(|m| m.permissions().mode() & 0o777 == 0o640) {
            std::thread::sleep(Duration::from_millis(10));
            waited += 1;
            assert!(waited < 1000, "the run never started");
        }
        for (what, args) in [
            ("read the code", ["cat", main.to_str().unwrap()]),
            ("list the code dir", ["ls", code_dir.to_str().unwrap()]),
        ] {
            use std::os::unix::process::CommandExt as _;
            #[expect(
                clippy::disallowed_methods,
                reason = "another local user's plain process, not a sandboxed run"
            )]
            let out = std::process::Command::new(args[0])
                .arg(args[1])
                .env("LC_ALL", "C")
                .uid(65534)
                .gid(65534)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success() && stderr.contains("Permission denied"),
                "nobody could {what}: {:?} {stderr}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        let r = running.join().unwrap().unwrap().result;
        assert_eq!(stdout(&r), "2\n", "{}", explain(&r));
    });
}

#[test]
fn non_utf8_output_comes_back_exact() {
    let Some(env) = setup("non_utf8_output_comes_back_exact", 21) else {
        return;
    };
    let r = run(
        &env,
        22,
        Py,
        "import sys\nsys.stdout.buffer.write(bytes(range(256)))\nsys.stderr.buffer.write(b'\\xff\\xfe\\x00end')",
    );
    assert_eq!(r.exit_code, Some(0), "{}", explain(&r));
    assert_eq!(
        r.stdout.as_slice(),
        (0..=255u8).collect::<Vec<u8>>().as_slice()
    );
    assert_eq!(r.stderr.as_slice(), b"\xff\xfe\x00end");
}

#[test]
fn setup_failures_are_refusals_and_leave_nothing() {
    let Some(env) = setup("setup_failures_are_refusals_and_leave_nothing", 23) else {
        return;
    };
    // uid 0 is refused before anything starts.
    let mut p = plan(&env, 24, Py, "print(1)", limits());
    p.uid = 0;
    p.gid = 0;
    let e = run_plan(&env, &p).unwrap_err();
    assert!(
        matches!(
            e,
            LaunchError::NotStarted {
                reason: Reason::Environment,
                ..
            }
        ),
        "{e:?}"
    );
    // A missing interpreter: nothing ran, nothing left.
    let broken = ProcessProvider::new(ProcessConfig {
        node: "/nonexistent/node".into(),
        ..env.provider.config().clone()
    });
    let p = plan(&env, 24, Js, "console.log(1)", limits());
    let e = broken.run(&p).unwrap_err();
    assert!(
        matches!(
            e,
            LaunchError::NotStarted {
                reason: Reason::Environment,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(!p.run_dir.exists());
    // A state dir the sandbox uid cannot traverse is named, with the fix.
    let closed = env.state.join("closed");
    std::fs::create_dir(&closed).unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut p = plan(&env, 24, Py, "print(1)", limits());
    p.run_dir = closed.join("runs").join("x");
    let e = run_plan(&env, &p).unwrap_err();
    assert!(e.to_string().contains("cannot be traversed"), "{e}");
    assert!(matches!(e, LaunchError::NotStarted { .. }));
}

#[test]
fn the_probe_passes_and_reports() {
    let Some(env) = setup("the_probe_passes_and_reports", 25) else {
        return;
    };
    let probed = env.provider.probe();
    assert_eq!(probed.available, Ok(()), "{:#?}", probed.evidence.checks);
    let ev = &probed.evidence;
    assert!(ev.checks.values().all(|v| v == "ok"), "{:#?}", ev.checks);
    let report = ev.probe.as_ref().expect("a probe report");
    assert_eq!(report.uid, UID_BASE + 25);
    assert!(report.environment.is_empty());
    assert_eq!(report.seccomp_mode, 2);
    assert_eq!(report.namespaces["net"].same_as_host, Some(true));
    let names: Vec<&str> = ev.binaries.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["node", "python3", "plimsoll-probe"]);
    assert!(ev.binaries.iter().all(|b| b.sha256.len() == 64));
    assert!(
        ev.environment.starts_with("plimsoll-engine/"),
        "{}",
        ev.environment
    );
    assert!(ev.config.contains_key("landlock.abi_enforced"));
    assert_eq!(processes_of_uid(UID_BASE + 25), Vec::<i32>::new());
    // Nothing of the probe runs is left in the runs root.
    let left: Vec<_> = std::fs::read_dir(env.state.join("runs")).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_missing_binary_withdraws_the_provider() {
    let Some(env) = setup("a_missing_binary_withdraws_the_provider", 26) else {
        return;
    };
    let p = ProcessProvider::new(ProcessConfig {
        python: "/nonexistent/python3".into(),
        ..env.provider.config().clone()
    });
    let probed = p.probe();
    let why = probed.available.unwrap_err().to_string();
    assert!(why.contains("/nonexistent/python3"), "{why}");
    assert_ne!(probed.evidence.checks["binary.python3"], "ok");
}

/// Many files, each under the per-file limit (RLIMIT_FSIZE), together past the run's disk
/// bound: the writes stop with ENOSPC at `disk_bytes` (the work directory is a tmpfs of that
/// size). Before, the sum was unbounded (1.28 GiB in 64 MiB files).
#[test]
fn writing_past_the_disk_bound_fails() {
    let Some(env) = setup("writing_past_the_disk_bound_fails", 63) else {
        return;
    };
    let mut l = limits();
    l.disk_bytes = 32 << 20;
    let r = run_with(
        &env,
        64,
        Py,
        "import errno, os\n\
         n = 0\n\
         try:\n\
         \x20   for i in range(40):\n\
         \x20       with open('f%d' % i, 'wb') as f:\n\
         \x20           for _ in range(4):\n\
         \x20               f.write(b'x' * (1 << 20))\n\
         \x20               f.flush()\n\
         \x20               n += 1 << 20\n\
         \x20   print('wrote', n, 'no error')\n\
         except OSError as e:\n\
         \x20   print('wrote', n, errno.errorcode.get(e.errno, e.errno))\n",
        l,
    );
    let out = stdout(&r);
    let written: u64 = out
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(u64::MAX);
    assert!(out.ends_with("ENOSPC\n"), "{}", explain(&r));
    assert!(written <= l.disk_bytes, "wrote {written}: {}", explain(&r));
}

/// Four processes, each under the per-process address-space limit, together past the run's
/// memory bound: the run's memory cgroup holds them all, so they cannot all hold their
/// memory at once; the kernel's OOM killer ends one and the result says `oom_killed`.
/// Before, 4 processes held 384 MiB each at once.
#[test]
fn allocating_past_the_memory_bound_across_processes_fails() {
    let Some(env) = setup(
        "allocating_past_the_memory_bound_across_processes_fails",
        66,
    ) else {
        return;
    };
    let mut l = limits();
    l.memory_bytes = 256 << 20;
    let r = run_with(
        &env,
        67,
        Py,
        "import os, sys, time\n\
         pids = []\n\
         for i in range(4):\n\
         \x20   pid = os.fork()\n\
         \x20   if pid == 0:\n\
         \x20       b = bytearray(100 << 20)\n\
         \x20       for j in range(0, len(b), 4096):\n\
         \x20           b[j] = 1\n\
         \x20       print('held', i, flush=True)\n\
         \x20       time.sleep(3)\n\
         \x20       os._exit(0)\n\
         \x20   pids.append(pid)\n\
         codes = [os.waitpid(p, 0)[1] for p in pids]\n\
         print('killed', sum(1 for c in codes if os.WIFSIGNALED(c)))\n",
        l,
    );
    let out = stdout(&r);
    let held = out.matches("held").count();
    assert!(held < 4, "all four held 100 MiB at once: {}", explain(&r));
    assert!(r.oom_killed, "{}", explain(&r));
}

/// The "daemon" (plimsoll-process-run) is SIGKILLed mid-run: its snippet's process, work
/// tmpfs, memory cgroup and run directory (holding the code) stay behind. The next
/// provider's probe reaps them all. Before, the orphan outlived the restart and the
/// directory was never removed.
#[test]
fn nothing_is_left_after_the_daemon_is_killed_and_restarted() {
    let test = "nothing_is_left_after_the_daemon_is_killed_and_restarted";
    let Some(env) = setup(test, 68) else {
        return;
    };
    let uid = UID_BASE + 69;
    let run_id = format!("killed-{}", std::process::id());
    let run_dir = env.state.join("runs").join(&run_id);
    let mut child = plimsoll_sandbox::Spawn::new(env!("CARGO_BIN_EXE_plimsoll-process-run"), "/")
        .args([
            "run",
            "python",
            "import time\nprint('up', flush=True)\ntime.sleep(120)",
        ])
        .arg("--state-dir")
        .arg(&env.state)
        .args(["--uid", &uid.to_string(), "--run-id", &run_id])
        .args(["--timeout-ms", "100000"])
        .spawn()
        .expect("start plimsoll-process-run");
    let start = std::time::Instant::now();
    while processes_of_uid(uid).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the run never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = rustix::process::Pid::from_raw(child.child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    child.child.wait().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let orphans = processes_of_uid(uid);
    assert!(!orphans.is_empty(), "the snippet should outlive the daemon");
    assert!(
        run_dir.join("code/main.py").exists(),
        "the code stays behind"
    );
    let cgroup = memory_cgroup_of(&run_id);
    assert!(cgroup.exists(), "{} stays behind", cgroup.display());

    // A new daemon starts: its probe reaps.
    let again = ProcessProvider::new(env.provider.config().clone());
    let probed = again.probe();
    assert_eq!(
        probed.evidence.checks.get("reap").map(String::as_str),
        Some("ok")
    );
    let start = std::time::Instant::now();
    loop {
        let alive: Vec<i32> = processes_of_uid(uid)
            .into_iter()
            .filter(|p| {
                !std::fs::read_to_string(format!("/proc/{p}/stat"))
                    .unwrap_or_default()
                    .contains(") Z")
            })
            .collect();
        if alive.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "processes of uid {uid} survived the reap: {alive:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!run_dir.exists(), "{} left behind", run_dir.display());
    assert!(!cgroup.exists(), "{} left behind", cgroup.display());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&run_id),
        "the work tmpfs of {run_id} is still mounted"
    );
    assert_eq!(again.reap().run_dirs, Vec::<String>::new());
}

/// The memory cgroup a run named `run_id` gets (cgroup v1's memory hierarchy here).
fn memory_cgroup_of(run_id: &str) -> PathBuf {
    let v1 = PathBuf::from("/sys/fs/cgroup/memory");
    let root = if v1.join("memory.limit_in_bytes").exists() {
        v1
    } else {
        PathBuf::from("/sys/fs/cgroup")
    };
    root.join("plimsoll-process").join(run_id)
}

/// The "daemon" (plimsoll-process-run) is SIGKILLed one second into a run of an endless
/// loop with a 3 s timeout, and nothing restarts it: the watchdog it left kills the run's
/// processes at the deadline plus [`plimsoll_process::WATCHDOG_GRACE`], and their CPU time
/// stops there. Before, only RLIMIT_CPU bounded the loop, and a sleeping process stayed.
#[test]
fn a_run_ends_at_its_deadline_without_the_daemon() {
    let test = "a_run_ends_at_its_deadline_without_the_daemon";
    let Some(env) = setup(test, 70) else {
        return;
    };
    let uid = UID_BASE + 71;
    let run_id = format!("deadline-{}", std::process::id());
    let timeout = Duration::from_secs(3);
    let start = std::time::Instant::now();
    // A busy loop and a sleeper beside it (RLIMIT_CPU alone would never end the sleeper).
    let code = "import os, time\nif os.fork() == 0:\n    time.sleep(300)\nwhile True:\n    pass";
    let mut child = plimsoll_sandbox::Spawn::new(env!("CARGO_BIN_EXE_plimsoll-process-run"), "/")
        .args(["run", "python", code])
        .arg("--state-dir")
        .arg(&env.state)
        .args(["--uid", &uid.to_string(), "--run-id", &run_id])
        .args(["--timeout-ms", &timeout.as_millis().to_string()])
        .spawn()
        .expect("start plimsoll-process-run");
    while processes_of_uid(uid).len() < 2 {
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
    // CPU seconds (utime + stime) of each process of the uid, as last seen alive.
    let mut cpu = std::collections::BTreeMap::new();
    let bound = timeout + plimsoll_process::WATCHDOG_GRACE;
    loop {
        let mut alive = 0;
        for p in processes_of_uid(uid) {
            if let Some(t) = cpu_seconds(p) {
                alive += 1;
                cpu.insert(p, t);
            }
        }
        if alive == 0 {
            break;
        }
        assert!(
            start.elapsed() < bound + Duration::from_secs(20),
            "the run's processes outlived the deadline by far ({:?})",
            start.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let ended = start.elapsed();
    let total: f64 = cpu.values().sum();
    eprintln!(
        "processes gone {ended:?} after start (deadline {timeout:?} + grace {:?}); CPU {total:.2} s",
        plimsoll_process::WATCHDOG_GRACE
    );
    assert!(
        total <= (bound + Duration::from_secs(2)).as_secs_f64(),
        "{total} s of CPU"
    );
    // The dead daemon's leftovers (mount, cgroup, directory) go with a reap.
    let report = env.provider.reap();
    assert!(report.errors.is_empty(), "{report:?}");
}
