//! The agent binary, run the way a sandbox runs it: a job on stdin, an almost empty
//! environment, a result on stdout (or exit 2 and one line on stderr).

use std::io::{Read as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use plimsoll_sys::exec::{PreExec, Step};
use plimsoll_sys::mount::{MountFlags, Propagation};
use plimsoll_testing::project;

use plimsoll_wire::{AgentJob, Bytes, Language, ProjectFile, RunResult, RunSpec, Snippet};

const AGENT: &str = env!("CARGO_BIN_EXE_plimsoll-agent");

/// What the agent did: its exit status, stdout and stderr.
struct Ran {
    code: Option<i32>,
    stdout: Vec<u8>,
    stderr: String,
}

#[expect(
    clippy::disallowed_methods,
    reason = "the test runs the agent binary itself, as a provider does"
)]
fn agent_command() -> Command {
    Command::new(AGENT)
}

/// The uid (and gid) the agent runs as in an ordinary job when the tests run as root: the
/// agent refuses root for anything but a trial job.
const AGENT_UID: u32 = 2_190_998;

/// How a test starts the agent.
enum Start {
    /// As a sandbox starts it for an ordinary job: as [`AGENT_UID`] when the test is root,
    /// else as the test's own uid.
    Unprivileged,
    /// As the test's root, with every capability.
    Root,
    /// As a sandbox starts it for a trial job: uid 0, capabilities bounding = effective =
    /// permitted = {CAP_SETUID, CAP_SETGID}, no_new_privs. With a runner, in a private mount
    /// namespace where that file is bound at TRIAL_RUNNER_PATH (under a tmpfs on /opt).
    Trial { runner: Option<PathBuf> },
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A temporary directory the agent's uid can use (mode 0755, owned by [`AGENT_UID`] when the
/// test is root).
fn tempdir() -> tempfile::TempDir {
    owned_tempdir(AGENT_UID)
}

/// A temporary directory owned by `uid` (when root; gid alike), mode 0755.
fn owned_tempdir(uid: u32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    give(dir.path(), uid);
    dir
}

fn give(path: &Path, uid: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    if is_root() {
        std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
    }
}

fn agent_with(input: Vec<u8>, cwd: &Path, configure: impl FnOnce(&mut Command)) -> Ran {
    agent_started(input, cwd, &Start::Unprivileged, configure)
}

fn agent_started(
    input: Vec<u8>,
    cwd: &Path,
    start: &Start,
    configure: impl FnOnce(&mut Command),
) -> Ran {
    let mut cmd = agent_command();
    cmd.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", "/tmp")
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    configure(&mut cmd);
    match start {
        Start::Unprivileged if is_root() => become_uid(&mut cmd, AGENT_UID),
        Start::Unprivileged | Start::Root => {}
        Start::Trial { runner } => {
            if let Some(runner) = runner {
                runner_at_its_path(&mut cmd, runner);
            }
            keep_two_capabilities(&mut cmd);
        }
    }
    let mut child = cmd.spawn().expect("start the agent");
    let mut stdin = child.stdin.take().unwrap();
    // A writer thread: the input may be larger than a pipe holds. The agent may stop reading
    // early (and the write then fails), which is its right.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let mut stderr = String::new();
    let mut err_pipe = child.stderr.take().unwrap();
    let err_reader = std::thread::spawn(move || {
        let _ = err_pipe.read_to_string(&mut stderr);
        stderr
    });
    let mut stdout = Vec::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut stdout)
        .unwrap();
    let status = child.wait().unwrap();
    writer.join().unwrap();
    Ran {
        code: status.code(),
        stdout,
        stderr: err_reader.join().unwrap(),
    }
}

fn agent(input: Vec<u8>, cwd: &Path) -> Ran {
    agent_with(input, cwd, |_| {})
}

fn job(work: &Path, spec: RunSpec) -> AgentJob {
    AgentJob {
        spec,
        work_dir: work.to_str().unwrap().to_owned(),
        output_bytes: 1 << 20,
        artifact_bytes: 1 << 20,
        deadline_ms: 60_000,
        trial: None,
    }
}

fn file(path: &str, content: &[u8], executable: bool) -> ProjectFile {
    ProjectFile {
        path: path.into(),
        content: Bytes(content.to_vec()),
        executable,
    }
}

/// Runs a job that must succeed (exit 0) and parses its result.
fn run(job: &AgentJob) -> RunResult {
    let ran = agent(serde_json::to_vec(job).unwrap(), Path::new(&job.work_dir));
    assert_eq!(ran.code, Some(0), "agent failed: {}", ran.stderr);
    assert!(
        ran.stderr.is_empty(),
        "agent wrote to stderr: {}",
        ran.stderr
    );
    serde_json::from_slice(&ran.stdout)
        .unwrap_or_else(|e| panic!("bad result ({e}): {}", String::from_utf8_lossy(&ran.stdout)))
}

/// Runs a job that must be refused (exit 2, one line on stderr, nothing on stdout). The
/// agent starts in `/`: the work directory may be missing.
fn refused(job: &AgentJob) -> String {
    let ran = agent(serde_json::to_vec(job).unwrap(), Path::new("/"));
    assert_eq!(
        ran.code,
        Some(2),
        "stdout: {}",
        String::from_utf8_lossy(&ran.stdout)
    );
    assert!(ran.stdout.is_empty());
    one_line(&ran.stderr)
}

fn one_line(stderr: &str) -> String {
    assert!(stderr.starts_with("plimsoll-agent: "), "{stderr:?}");
    assert_eq!(stderr.lines().count(), 1, "{stderr:?}");
    stderr.trim_end().to_owned()
}

fn text(b: &Bytes) -> String {
    b.to_string_lossy()
}

/// The process `pid` (a `sleep`) has ended: waits up to 5 s for it to go (or be a zombie).
fn sleep_is_gone(pid: i32) -> bool {
    for _ in 0..100 {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            Ok(s) if !s.contains("(sleep)") || s.contains(") Z ") => return true,
            Ok(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    // Do not leave it behind for the next test run.
    if let Some(pid) = rustix::process::Pid::from_raw(pid) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
    false
}

fn read_pid(work: &Path, name: &str) -> i32 {
    std::fs::read_to_string(work.join(name))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn skip(test: &str, reason: &str) {
    assert!(
        !plimsoll_env::strict(),
        "{test} needs {reason} (CI=true forbids skipping)"
    );
    println!("SKIP {test}: {reason}");
}

#[test]
fn files_are_written_exactly_with_their_modes() {
    let work = tempdir();
    let all_bytes: Vec<u8> = (0..=255u8).chain(0..=255u8).collect();
    let spec = project(
        vec![
            file("data/all.bin", &all_bytes, false),
            file("bin/tool.sh", b"#!/bin/sh\necho tool \"$@\"\n", true),
            file("empty", b"", false),
        ],
        &[
            "./bin/tool.sh a b",
            "test -x bin/tool.sh && ! test -x data/all.bin && echo modes",
        ],
        &[],
    );
    let r = run(&job(work.path(), spec));
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(text(&r.steps[0].stdout), "tool a b\n");
    assert_eq!(text(&r.steps[1].stdout), "modes\n");
    assert_eq!(
        std::fs::read(work.path().join("data/all.bin")).unwrap(),
        all_bytes
    );
    assert_eq!(std::fs::read(work.path().join("empty")).unwrap(), b"");
    let mode = |p: &str| {
        std::fs::metadata(work.path().join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("bin/tool.sh"), 0o755);
    assert_eq!(mode("data/all.bin"), 0o644);
}

#[test]
fn steps_run_in_order_and_stop_at_the_first_failure() {
    let work = tempdir();
    let mut spec = project(
        vec![],
        &[
            "echo one >> log; echo out1; echo err1 >&2",
            "echo two >> log; printf out2; exit 3",
            "echo three >> log",
        ],
        &["log"],
    );
    if let RunSpec::Project(p) = &mut spec {
        p.steps[0].name = Some("first".into());
    }
    let r = run(&job(work.path(), spec));
    assert_eq!(r.steps.len(), 2);
    assert_eq!(r.steps[0].name.as_deref(), Some("first"));
    assert_eq!(r.steps[1].name, None);
    assert_eq!(
        (
            r.steps[0].exit_code,
            text(&r.steps[0].stdout),
            text(&r.steps[0].stderr)
        ),
        (Some(0), "out1\n".into(), "err1\n".into())
    );
    assert_eq!(r.steps[1].exit_code, Some(3));
    // The top level mirrors the last step that ran.
    assert_eq!(
        (r.exit_code, text(&r.stdout), text(&r.stderr)),
        (Some(3), "out2".into(), "".into())
    );
    assert!(!r.timed_out && !r.oom_killed);
    assert_eq!(text(&r.artifacts[0].content), "one\ntwo\n");
}

#[test]
fn a_step_killed_by_a_signal_stops_the_run() {
    let work = tempdir();
    let spec = project(vec![], &["echo before", "kill -TERM $$", "echo never"], &[]);
    let r = run(&job(work.path(), spec));
    assert_eq!(r.steps.len(), 2);
    assert_eq!((r.exit_code, r.signal), (None, Some(15)));
    assert_eq!((r.steps[1].exit_code, r.steps[1].signal), (None, Some(15)));
    assert!(!r.timed_out);
}

#[test]
fn artifacts_found_missing_truncated_and_links_never_followed() {
    let work = tempdir();
    let outside = tempdir();
    std::fs::write(outside.path().join("secret"), b"secret").unwrap();
    let out = outside.path().to_str().unwrap();
    let setup = format!(
        "mkdir d dir && printf 12345678 > d/big && ln -s {out}/secret esc && \
         ln -s {out} outdir && ln -s five inside && mkfifo fifo"
    );
    let spec = project(
        vec![file("five", b"\x00\xff345", false)],
        &[&setup],
        &[
            "five",
            "d/big",
            "missing",
            "esc",
            "outdir/secret",
            "inside",
            "dir",
            "fifo",
            "five",
        ],
    );
    let mut j = job(work.path(), spec);
    j.artifact_bytes = 5;
    let r = run(&j);
    assert_eq!(r.exit_code, Some(0), "{}", text(&r.stderr));
    let a = &r.artifacts;
    assert_eq!(a.len(), 9, "one per artifact asked, in order");
    assert_eq!(
        (a[0].path.as_str(), a[0].found, a[0].size, a[0].truncated),
        ("five", true, 5, false)
    );
    assert_eq!(a[0].content.as_slice(), b"\x00\xff345");
    assert_eq!((a[1].found, a[1].size, a[1].truncated), (true, 8, true));
    assert_eq!(text(&a[1].content), "12345");
    for (i, what) in [
        (2, "missing"),
        (3, "esc"),
        (4, "outdir/secret"),
        (5, "inside"),
        (6, "dir"),
        (7, "fifo"),
    ] {
        assert_eq!(a[i].path, what);
        assert!(!a[i].found, "{what} must not be found");
        assert!(
            a[i].content.is_empty() && a[i].size == 0 && !a[i].truncated,
            "{what}"
        );
    }
    assert_eq!(a[8], a[0]);
}

#[test]
fn snippet_in_python() {
    if !Path::new("/usr/bin/python3").exists() {
        return skip("snippet_in_python", "/usr/bin/python3");
    }
    let work = tempdir();
    let code = "import os, sys\nprint(os.getcwd(), sys.flags.isolated)\nsys.stderr.write('é')\nsys.exit(5)\n";
    let r = run(&job(
        work.path(),
        RunSpec::Snippet(Snippet {
            language: Language::Python,
            code: code.into(),
        }),
    ));
    let cwd = work.path().canonicalize().unwrap();
    assert_eq!(text(&r.stdout), format!("{} 1\n", cwd.display()));
    assert_eq!(text(&r.stderr), "é");
    assert_eq!(r.exit_code, Some(5));
    assert!(r.steps.is_empty() && r.artifacts.is_empty());
    assert_eq!(
        std::fs::read_dir(work.path()).unwrap().count(),
        0,
        "nothing written to work_dir"
    );
}

#[test]
fn snippet_in_javascript() {
    if !Path::new("/usr/bin/node").exists() && which("node").is_none() {
        return skip("snippet_in_javascript", "node");
    }
    let work = tempdir();
    let code =
        "console.log(6 * 7, process.cwd());\nprocess.stderr.write('err');\nprocess.exitCode = 4;\n";
    let r = run(&job(
        work.path(),
        RunSpec::Snippet(Snippet {
            language: Language::Javascript,
            code: code.into(),
        }),
    ));
    let cwd = work.path().canonicalize().unwrap();
    assert_eq!(text(&r.stdout), format!("42 {}\n", cwd.display()));
    assert_eq!(text(&r.stderr), "err");
    assert_eq!(r.exit_code, Some(4));
    assert_eq!(
        std::fs::read_dir(work.path()).unwrap().count(),
        0,
        "nothing written to work_dir"
    );
}

fn which(name: &str) -> Option<std::path::PathBuf> {
    ["/usr/local/bin", "/usr/bin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
}

#[test]
fn output_past_the_cap_is_drained_and_flagged() {
    let work = tempdir();
    // 100 MB on each stream at once: far more than a pipe holds, so the step would block
    // for ever if the agent stopped reading either stream at the cap.
    let spec = project(
        vec![],
        &["head -c 100000000 /dev/zero & head -c 100000000 /dev/zero >&2; wait; echo done"],
        &[],
    );
    let mut j = job(work.path(), spec);
    j.output_bytes = 1000;
    let r = run(&j);
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(r.stdout.as_slice(), &[0u8; 1000][..]);
    assert_eq!(r.stderr.as_slice(), &[0u8; 1000][..]);
    assert!(r.stdout_truncated && r.stderr_truncated);
    assert!(r.steps[0].stdout_truncated && r.steps[0].stderr_truncated);

    let small = project(vec![], &["printf 12345"], &[]);
    let mut j = job(work.path(), small);
    j.output_bytes = 5;
    let r = run(&j);
    assert_eq!(text(&r.stdout), "12345");
    assert!(!r.stdout_truncated, "exactly the cap is not truncated");
}

#[test]
fn the_deadline_kills_the_step_and_its_children() {
    let work = tempdir();
    let spec = project(
        vec![],
        &[
            "echo started; sleep 100 & echo $! > bg.pid; sleep 100",
            "echo never",
        ],
        &["bg.pid"],
    );
    let mut j = job(work.path(), spec);
    j.deadline_ms = 1500;
    let r = run(&j);
    assert!(r.timed_out);
    assert_eq!((r.exit_code, r.signal), (None, Some(9)));
    assert_eq!(r.steps.len(), 1, "the second step must not run");
    assert!(r.steps[0].timed_out);
    assert_eq!(text(&r.stdout), "started\n");
    assert!(
        r.artifacts[0].found,
        "artifacts are collected after a timeout"
    );
    assert!(
        sleep_is_gone(read_pid(work.path(), "bg.pid")),
        "the background sleep survived"
    );
}

#[test]
fn a_deadline_already_past_runs_nothing_and_a_huge_one_is_none() {
    let work = tempdir();
    let mut j = job(work.path(), project(vec![], &["echo ran > ran"], &[]));
    j.deadline_ms = 0;
    let r = run(&j);
    assert!(r.timed_out);
    assert!(r.steps.is_empty());
    assert_eq!((r.exit_code, r.signal), (None, None));
    assert!(!work.path().join("ran").exists());
    j.deadline_ms = u64::MAX;
    let r = run(&j);
    assert_eq!(r.exit_code, Some(0));
    assert!(!r.timed_out);
    assert!(work.path().join("ran").exists());
}

#[test]
fn background_processes_live_until_the_last_step_then_die() {
    let work = tempdir();
    let spec = project(
        vec![],
        &[
            "sleep 100 >/dev/null 2>&1 & echo $! > quiet.pid",
            "kill -0 $(cat quiet.pid) && echo alive",
            // Holds the step's stdout open: the agent must not wait for it.
            "sleep 100 & echo $! > holder.pid",
            // Leaves the step's process group and session.
            "setsid sleep 100 & echo $! > escaped.pid",
        ],
        &[],
    );
    let r = run(&job(work.path(), spec));
    assert_eq!(r.exit_code, Some(0), "{}", text(&r.stderr));
    assert_eq!(r.steps.len(), 4);
    assert_eq!(text(&r.steps[1].stdout), "alive\n");
    for name in ["quiet.pid", "holder.pid", "escaped.pid"] {
        assert!(
            sleep_is_gone(read_pid(work.path(), name)),
            "{name} survived the agent"
        );
    }
}

#[test]
fn non_utf8_output_is_exact() {
    let work = tempdir();
    let spec = project(
        vec![],
        &[r"printf '\377\376\000a'; printf '\200\n' >&2"],
        &[],
    );
    let r = run(&job(work.path(), spec));
    assert_eq!(r.stdout.as_slice(), b"\xff\xfe\x00a");
    assert_eq!(r.stderr.as_slice(), b"\x80\n");
}

#[test]
fn steps_see_no_inherited_descriptor_or_blocked_signal() {
    let work = tempdir();
    let spec = project(
        vec![],
        &[
            "test -e /proc/self/fd/50 && echo leaked || echo closed; grep SigBlk /proc/self/status; echo \"$HOME\"; ls /proc/self/fd | wc -l",
        ],
        &[],
    );
    let input = serde_json::to_vec(&job(work.path(), spec)).unwrap();
    let leak = std::fs::File::open("/dev/null").unwrap();
    let ran = agent_with(input, work.path(), |cmd| {
        // In the child between fork and exec: fd 50 without close-on-exec, as a careless
        // parent would leave it.
        PreExec::new()
            .unnamed(Step::PlaceFd {
                fd: leak.try_clone().unwrap().into(),
                at: 50,
            })
            .install_untracked(cmd);
    });
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let r: RunResult = serde_json::from_slice(&ran.stdout).unwrap();
    // 0, 1, 2 and the one `ls` opens to list the directory.
    assert_eq!(
        text(&r.stdout),
        "closed\nSigBlk:\t0000000000000000\n/tmp\n4\n"
    );
}

#[test]
fn bad_job_json_is_refused_with_exit_2() {
    let work = tempdir();
    let msg = one_line(&agent(b"{not json".to_vec(), work.path()).stderr);
    assert!(msg.contains("not a valid AgentJob in JSON"), "{msg}");
    let ran = agent(b"{not json".to_vec(), work.path());
    assert_eq!(ran.code, Some(2));
    assert!(ran.stdout.is_empty());

    let mut value =
        serde_json::to_value(job(work.path(), project(vec![], &["true"], &[]))).unwrap();
    value["colour"] = "red".into();
    let ran = agent(serde_json::to_vec(&value).unwrap(), work.path());
    assert_eq!(ran.code, Some(2));
    assert!(one_line(&ran.stderr).contains("colour"), "{}", ran.stderr);

    let ran = agent(Vec::new(), work.path());
    assert_eq!(ran.code, Some(2));
    assert!(one_line(&ran.stderr).contains("empty"), "{}", ran.stderr);

    let huge = vec![b' '; 256 * 1024 * 1024 + 1];
    let ran = agent(huge, work.path());
    assert_eq!(ran.code, Some(2));
    assert!(
        one_line(&ran.stderr).contains("larger than"),
        "{}",
        ran.stderr
    );
}

#[test]
fn an_unusable_work_dir_is_refused_with_exit_2() {
    let parent = tempdir();
    let missing = parent.path().join("missing");
    let mut j = job(parent.path(), project(vec![], &["echo ran > ../ran"], &[]));
    j.work_dir = missing.to_str().unwrap().to_owned();
    let msg = refused(&j);
    assert!(msg.contains("cannot open the work directory"), "{msg}");
    // A file where the directory should be.
    std::fs::write(&missing, b"a file").unwrap();
    let msg = refused(&j);
    assert!(msg.contains("cannot open the work directory"), "{msg}");
    assert!(!parent.path().join("ran").exists());
}

#[test]
fn path_escapes_are_refused_before_anything_is_written() {
    let parent = tempdir();
    let work = parent.path().join("work");
    std::fs::create_dir(&work).unwrap();
    give(&work, AGENT_UID);
    for bad in [
        "../escape",
        "/tmp/plimsoll-agent-abs",
        "a/../../escape",
        "a//b",
        "./a",
        "a/./b",
        "",
    ] {
        let spec = project(
            vec![file("first", b"x", false), file(bad, b"x", false)],
            &["echo ran > ran"],
            &[],
        );
        let msg = refused(&job(&work, spec));
        assert!(
            msg.contains("run.files[1] is refused: path"),
            "{bad:?}: {msg}"
        );
        assert_eq!(
            std::fs::read_dir(&work).unwrap().count(),
            0,
            "{bad:?}: something was written"
        );
    }
    assert!(!parent.path().join("escape").exists());
    assert!(!Path::new("/tmp/plimsoll-agent-abs").exists());
    let spec = project(vec![], &["echo ran > ran"], &["ok", "../x"]);
    let msg = refused(&job(&work, spec));
    assert!(msg.contains("run.artifacts[1] is refused"), "{msg}");
    assert!(!work.join("ran").exists());

    // Links already in the work directory are not followed, last component or not.
    let outside = tempdir();
    std::fs::write(outside.path().join("target"), b"untouched").unwrap();
    std::os::unix::fs::symlink(outside.path(), work.join("dirlink")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("target"), work.join("filelink")).unwrap();
    for path in ["dirlink/new", "dirlink/target", "filelink"] {
        let spec = project(vec![file(path, b"overwritten", false)], &["true"], &[]);
        let msg = refused(&job(&work, spec));
        assert!(msg.contains("symbolic link"), "{path}: {msg}");
    }
    assert_eq!(
        std::fs::read(outside.path().join("target")).unwrap(),
        b"untouched"
    );
    assert!(!outside.path().join("new").exists());
}

/// A memory cgroup the test creates (root only), removed on drop.
struct MemoryCgroup {
    dir: std::path::PathBuf,
}

impl MemoryCgroup {
    fn create(limit: u64) -> Result<Self, String> {
        let name = format!("plimsoll-agent-test-{}", std::process::id());
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let v2_controllers = std::fs::read_to_string("/sys/fs/cgroup/cgroup.subtree_control");
        let (dir, files): (_, Vec<(&str, String)>) = if v1.join("memory.limit_in_bytes").exists() {
            let mut f = vec![("memory.limit_in_bytes", limit.to_string())];
            if v1.join("memory.memsw.limit_in_bytes").exists() {
                f.push(("memory.memsw.limit_in_bytes", limit.to_string()));
            }
            (v1.join(&name), f)
        } else if v2_controllers.is_ok_and(|c| c.split_whitespace().any(|w| w == "memory")) {
            let f = vec![
                ("memory.max", limit.to_string()),
                ("memory.swap.max", "0".into()),
            ];
            (Path::new("/sys/fs/cgroup").join(&name), f)
        } else {
            return Err("a writable memory cgroup controller".into());
        };
        std::fs::create_dir(&dir)
            .map_err(|e| format!("creating {} ({e}; root?)", dir.display()))?;
        let cg = MemoryCgroup { dir };
        for (file, value) in files {
            std::fs::write(cg.dir.join(file), value)
                .map_err(|e| format!("writing {file} ({e})"))?;
        }
        Ok(cg)
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[test]
fn a_step_killed_by_the_memory_limit_is_marked() {
    let cg = match MemoryCgroup::create(64 * 1024 * 1024) {
        Ok(cg) => cg,
        Err(reason) => return skip("a_step_killed_by_the_memory_limit_is_marked", &reason),
    };
    let work = tempdir();
    let spec = project(
        vec![],
        &[
            "echo small",
            "/usr/bin/python3 -c 'x = bytes(range(256)) * (2 * 1024 * 1024); print(len(x))'",
        ],
        &[],
    );
    let input = serde_json::to_vec(&job(work.path(), spec)).unwrap();
    let procs = cg.dir.join("cgroup.procs");
    let ran = agent_with(input, work.path(), move |cmd| {
        // In the child before exec: a write to the cgroup's procs file (opened here), moving
        // the agent into the test's memory cgroup.
        let fd = std::fs::OpenOptions::new()
            .write(true)
            .open(&procs)
            .unwrap();
        PreExec::new()
            .unnamed(Step::Write {
                fd: fd.into(),
                bytes: b"0\n",
            })
            .install_untracked(cmd);
    });
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let r: RunResult = serde_json::from_slice(&ran.stdout).unwrap();
    assert!(!r.steps[0].oom_killed);
    assert_eq!(r.steps.len(), 2);
    assert!(
        r.signal == Some(9) || r.exit_code == Some(137),
        "python was not killed: {:?} {:?} {}",
        r.exit_code,
        r.signal,
        text(&r.stderr)
    );
    assert!(r.oom_killed && r.steps[1].oom_killed);
    assert!(!r.timed_out);
}

// ---- Trial jobs: the privilege split (docs/agent.md, "Trial jobs") ----

/// In the child before exec: becomes `uid` (gid alike, no supplementary group), as a sandbox
/// starts the agent for an ordinary job.
fn become_uid(cmd: &mut Command, uid: u32) {
    let id = Some(uid);
    PreExec::new()
        .unnamed(Step::DropGroups)
        .unnamed(Step::SetGids(id, id, id))
        .unnamed(Step::SetUids(id, id, id))
        .install_untracked(cmd);
}

/// In the child before exec, as root: reduces the bounding set to {CAP_SETUID, CAP_SETGID},
/// sets effective = permitted = those two, inheritable and ambient empty, and no_new_privs:
/// what a container or guest gives the agent for a trial job.
fn keep_two_capabilities(cmd: &mut Command) {
    use plimsoll_sandbox::caps::TRIAL_CAPS;
    PreExec::new()
        .unnamed(Step::LimitBoundingSet(TRIAL_CAPS))
        .unnamed(Step::SetCapabilities(TRIAL_CAPS))
        .unnamed(Step::NoNewPrivs)
        .install_untracked(cmd);
}

/// In the child before exec, as root: a private mount namespace with a tmpfs on /opt and
/// `runner` bound read-only at TRIAL_RUNNER_PATH (the host has no /opt/plimsoll).
fn runner_at_its_path(cmd: &mut Command, runner: &Path) {
    use std::ffi::CString;
    let c = |s: &str| CString::new(s).unwrap();
    let dir = |path: &str| Step::Mkdir {
        path: c(path),
        mode: 0o755,
    };
    PreExec::new()
        .unnamed(Step::MountNamespace(Propagation::Private))
        .unnamed(Step::MountTmpfs {
            source: c("tmpfs"),
            target: c("/opt"),
            flags: MountFlags::NOSUID | MountFlags::NODEV,
            data: c("mode=0755"),
        })
        .unnamed(dir("/opt/plimsoll"))
        .unnamed(dir("/opt/plimsoll/bin"))
        .unnamed(dir("/opt/plimsoll/simulators"))
        .unnamed(Step::BindReadOnly {
            source: c(runner.to_str().unwrap()),
            target: c(plimsoll_wire::trial_step::TRIAL_RUNNER_PATH),
            is_dir: false,
            device: false,
        })
        .unnamed(Step::BindReadOnly {
            source: c(simulators_dir().to_str().unwrap()),
            target: c("/opt/plimsoll/simulators"),
            is_dir: true,
            device: false,
        })
        .install_untracked(cmd);
}

/// A directory laid out as an image's /opt/plimsoll/simulators (docs/simulators.md): the
/// shipped cart-pole and its index, written once per test process.
fn simulators_dir() -> &'static Path {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        use sha2::Digest as _;
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let wasm = plimsoll_sims::get("cartpole").unwrap().wasm;
        std::fs::write(dir.path().join("cartpole.wasm"), wasm).unwrap();
        let index = serde_json::json!({
            "format": plimsoll_wire::simulators::INDEX_FORMAT,
            "simulators": [{
                "name": "cartpole",
                "path": "/opt/plimsoll/simulators/cartpole.wasm",
                "sha256": hex::encode(sha2::Sha256::digest(wasm)),
            }],
        });
        std::fs::write(dir.path().join("index.json"), index.to_string()).unwrap();
        dir
    })
    .path()
}

/// The run's ids for a trial test: R = G = `base`, C = D = `base + 1`. Each test has its own
/// base, so parallel tests never share a uid.
fn trial_ids(base: u32) -> plimsoll_wire::TrialIds {
    plimsoll_wire::TrialIds {
        uid: base,
        gid: base,
        controller_uid: base + 1,
        controller_gid: base + 1,
    }
}

fn trial_job(work: &Path, spec: RunSpec, ids: plimsoll_wire::TrialIds) -> AgentJob {
    AgentJob {
        trial: Some(ids),
        ..job(work, spec)
    }
}

/// Runs a trial job started as `start`, which must succeed.
fn run_started(job: &AgentJob, start: &Start) -> RunResult {
    let input = serde_json::to_vec(job).unwrap();
    let ran = agent_started(input, Path::new(&job.work_dir), start, |_| {});
    assert_eq!(ran.code, Some(0), "agent failed: {}", ran.stderr);
    assert!(
        ran.stderr.is_empty(),
        "agent wrote to stderr: {}",
        ran.stderr
    );
    serde_json::from_slice(&ran.stdout)
        .unwrap_or_else(|e| panic!("bad result ({e}): {}", String::from_utf8_lossy(&ran.stdout)))
}

/// Runs a job started as `start` that must be refused: exit 2, one line, nothing on stdout.
fn refused_started(job: &AgentJob, start: &Start) -> String {
    let input = serde_json::to_vec(job).unwrap();
    let ran = agent_started(input, Path::new("/"), start, |_| {});
    assert_eq!(
        ran.code,
        Some(2),
        "stdout: {}",
        String::from_utf8_lossy(&ran.stdout)
    );
    assert!(ran.stdout.is_empty());
    one_line(&ran.stderr)
}

/// The owner (uid, gid) of a file.
fn owner(path: &Path) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::symlink_metadata(path).unwrap();
    (m.uid(), m.gid())
}

/// Processes (not zombies) whose real uid is `uid`, after waiting up to 5 s for them to go.
fn processes_left(uid: u32) -> Vec<String> {
    let mut left = Vec::new();
    for _ in 0..100 {
        left.clear();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
                continue;
            };
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .unwrap_or("")
                    .trim()
                    .to_owned()
            };
            let real = field("Uid:");
            let real = real.split_whitespace().next().unwrap_or("");
            if real == uid.to_string() && !field("State:").starts_with('Z') {
                left.push(format!(
                    "{} {}",
                    field("Name:"),
                    entry.file_name().display()
                ));
            }
        }
        if left.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    left
}

/// The status lines a step prints with `grep -E '^(Uid|Gid|Groups|Cap...|NoNewPrivs)'`, as
/// name → value.
fn status_lines(out: &str) -> std::collections::HashMap<String, String> {
    out.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.trim().replace('\t', " ")))
        .collect()
}

const STATUS_GREP: &str =
    "grep -E '^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapAmb|NoNewPrivs):' /proc/self/status";

#[test]
fn a_trial_job_works_as_the_run_uid_and_its_steps_have_no_capability() {
    if !is_root() {
        return skip(
            "a_trial_job_works_as_the_run_uid_and_its_steps_have_no_capability",
            "root (the agent starts as uid 0 for a trial job)",
        );
    }
    let ids = trial_ids(2_190_000);
    let r_id = ids.uid;
    let work = owned_tempdir(r_id);
    let spec = project(
        vec![file("sub/written.txt", b"by the agent", false)],
        &[
            &format!("id -u; id -g; id -G; {STATUS_GREP}"),
            "if python3 -c 'import os; os.setuid(0)' 2>err; then echo became-root; \
             else tail -n 1 err; fi",
            "kill -0 $PPID 2>/dev/null && echo signalled-the-agent || echo agent-out-of-reach; \
             echo step > by-step.txt",
        ],
        &["sub/written.txt"],
    );
    let r = run_started(
        &trial_job(work.path(), spec, ids),
        &Start::Trial { runner: None },
    );
    assert_eq!(r.exit_code, Some(0), "{}", text(&r.stderr));
    assert_eq!(r.steps.len(), 3);
    let out = text(&r.steps[0].stdout);
    assert!(
        out.starts_with(&format!("{r_id}\n{r_id}\n{r_id}\n")),
        "{out}"
    );
    let status = status_lines(&out);
    let four = format!("{r_id} {r_id} {r_id} {r_id}");
    let zero = "0000000000000000";
    for (name, want) in [
        ("Uid", four.as_str()),
        ("Gid", four.as_str()),
        ("Groups", ""),
        ("CapInh", zero),
        ("CapPrm", zero),
        ("CapEff", zero),
        ("CapAmb", zero),
        ("NoNewPrivs", "1"),
    ] {
        assert_eq!(
            status.get(name).map(String::as_str),
            Some(want),
            "{name}: {out}"
        );
    }
    assert_eq!(
        text(&r.steps[1].stdout),
        "PermissionError: [Errno 1] Operation not permitted\n"
    );
    assert_eq!(text(&r.steps[2].stdout), "agent-out-of-reach\n");
    assert_eq!(text(&r.artifacts[0].content), "by the agent");
    for path in ["sub", "sub/written.txt", "by-step.txt"] {
        assert_eq!(owner(&work.path().join(path)), (r_id, r_id), "{path}");
    }
    assert_eq!(processes_left(r_id), Vec::<String>::new());
}

#[test]
fn the_trial_step_starts_as_root_with_only_the_two_capabilities_and_c_is_ended() {
    let test = "the_trial_step_starts_as_root_with_only_the_two_capabilities_and_c_is_ended";
    if !is_root() {
        return skip(test, "root (mount namespace, uid 0 agent)");
    }
    if which("setpriv").is_none() {
        return skip(test, "setpriv (util-linux)");
    }
    // A stand-in for the runner: shows its credentials and arguments, and leaves a process
    // of the controller uid behind in a session of its own, which only the agent's end of
    // run can kill (the agent's descendant kills, as R, cannot reach a process of C).
    let tools = tempfile::tempdir().unwrap();
    give(tools.path(), 0);
    let fake = tools.path().join("fake-runner");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\necho \"args: $*\"\n{STATUS_GREP}\n\
             setpriv --reuid \"$6\" --regid \"$8\" --clear-groups setsid sleep 1000 \
             </dev/null >/dev/null 2>&1 &\n\
             # Until it is a sleep of C (else the end of the step kills it still as root).\n\
             i=0; until [ $i -ge 500 ] || awk -v c=\"$6\" '/^Name:/ {{ n = $2 }} \
             /^Uid:/ {{ u = $2 }} END {{ exit !(n == \"sleep\" && u == c) }}' /proc/$!/status; \
             do i=$((i + 1)); sleep 0.01; done\n\
             echo \"left $!\"\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let ids = trial_ids(2_190_002);
    let work = owned_tempdir(ids.uid);
    let spec = project(
        vec![],
        &["plimsoll-trial-runner --scenario s.json -- node c.js --uid 3"],
        &[],
    );
    let r = run_started(
        &trial_job(work.path(), spec, ids),
        &Start::Trial { runner: Some(fake) },
    );
    assert_eq!(r.exit_code, Some(0), "{}", text(&r.stderr));
    let out = text(&r.stdout);
    let (c_id, r_id) = (ids.controller_uid, ids.uid);
    assert!(
        out.starts_with(&format!(
            "args: --uid {r_id} --gid {r_id} --controller-uid {c_id} --controller-gid {c_id} \
             --scenario s.json -- node c.js --uid 3\n"
        )),
        "{out}"
    );
    let status = status_lines(&out);
    for (name, want) in [
        ("Uid", "0 0 0 0"),
        ("Gid", "0 0 0 0"),
        ("Groups", ""),
        ("CapInh", "0000000000000000"),
        ("CapPrm", "00000000000000c0"),
        ("CapEff", "00000000000000c0"),
        ("CapAmb", "0000000000000000"),
        ("NoNewPrivs", "1"),
    ] {
        assert_eq!(
            status.get(name).map(String::as_str),
            Some(want),
            "{name}: {out}"
        );
    }
    let left: i32 = out
        .lines()
        .find_map(|l| l.strip_prefix("left "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(sleep_is_gone(left), "the controller uid's sleep survived");
    assert_eq!(processes_left(c_id), Vec::<String>::new());
    assert_eq!(processes_left(r_id), Vec::<String>::new());
}

#[test]
fn the_accepted_controller_passes_through_the_agent() {
    let test = "the_accepted_controller_passes_through_the_agent";
    if !is_root() {
        return skip(test, "root (mount namespace, uid 0 agent)");
    }
    if which("node").is_none() {
        return skip(test, "node");
    }
    let runner = match plimsoll_testing::tool_binary("plimsoll-trial-runner", "plimsoll-trial") {
        Ok(r) => r,
        Err(e) => return skip(test, &e),
    };
    let root = plimsoll_testing::workspace_root();
    let read = |p: &str| std::fs::read(root.join(p)).unwrap();
    let ids = trial_ids(2_190_004);
    let work = owned_tempdir(ids.uid);
    let spec = project(
        vec![
            file(
                "accepted.js",
                &read("examples/controllers/accepted.js"),
                false,
            ),
            file(
                "standard.json",
                &read("sims/cartpole/scenarios/standard.json"),
                false,
            ),
        ],
        &[
            "test -f standard.json && echo scenario-present",
            // A loaded host may take seconds to start node.
            "plimsoll-trial-runner --simulator cartpole --scenario standard.json \
             --first-deadline-ms 20000 -- node accepted.js",
            "test -e standard.json && echo scenario-still-there || echo scenario-gone; \
             sha256sum trajectory.bin",
        ],
        &["trajectory.bin"],
    );
    let r = run_started(
        &trial_job(work.path(), spec, ids),
        &Start::Trial {
            runner: Some(runner),
        },
    );
    const FINGERPRINT: &str = "93585277088f4cfbd7683a2db52ab4a44906d74c74468ab9a49d4ddc8e959d41";
    assert_eq!(r.steps.len(), 3, "{}", text(&r.stderr));
    assert_eq!(text(&r.steps[0].stdout), "scenario-present\n");
    let trial = &r.steps[1];
    assert_eq!(trial.exit_code, Some(0), "{}", text(&trial.stderr));
    let verdict: serde_json::Value = serde_json::from_slice(trial.stdout.as_slice())
        .unwrap_or_else(|e| panic!("not a verdict ({e}): {}", text(&trial.stdout)));
    assert_eq!(verdict["pass"], true, "{verdict}");
    assert_eq!(
        verdict["trials"][0]["fingerprint"], FINGERPRINT,
        "{verdict}"
    );
    assert_eq!(
        text(&r.steps[2].stdout),
        format!("scenario-gone\n{FINGERPRINT}  trajectory.bin\n")
    );
    assert!(!work.path().join("standard.json").exists());
    assert!(r.artifacts[0].found && r.artifacts[0].size == 80_000);
    assert_eq!(
        owner(&work.path().join("trajectory.bin")),
        (ids.uid, ids.gid)
    );
    assert_eq!(processes_left(ids.controller_uid), Vec::<String>::new());
    assert_eq!(processes_left(ids.uid), Vec::<String>::new());
}

#[test]
fn root_is_refused_without_a_trial_and_a_trial_without_its_start() {
    if !is_root() {
        return skip(
            "root_is_refused_without_a_trial_and_a_trial_without_its_start",
            "root",
        );
    }
    let ids = trial_ids(2_190_006);
    let work = owned_tempdir(ids.uid);
    let spec = || {
        project(
            vec![file("f", b"x", false)],
            &["echo ran > ran", "plimsoll-trial-runner -- node a.js"],
            &[],
        )
    };
    let nothing_written = |why: &str| {
        assert_eq!(
            std::fs::read_dir(work.path()).unwrap().count(),
            0,
            "{why}: something was written"
        );
    };

    // Root, an ordinary job (even one without a trial step).
    let plain = job(work.path(), project(vec![], &["echo ran > ran"], &[]));
    let msg = refused_started(&plain, &Start::Root);
    assert!(
        msg.contains("runs as uid 0 but the job is not a trial job"),
        "{msg}"
    );
    nothing_written("root without trial ids");

    // A trial job, but the agent has every capability, or none (not root).
    let trial = trial_job(work.path(), spec(), ids);
    for (start, what) in [
        (Start::Root, "CapEff: is 000001"),
        (
            Start::Unprivileged,
            "Uid: is `2190998 2190998 2190998 2190998`, not all 0",
        ),
    ] {
        let msg = refused_started(&trial, &start);
        assert!(
            msg.contains("the agent was not started for a trial job")
                && msg.contains(what)
                && msg.contains(
                    "the sandbox must start the agent as uid 0 and gid 0 with capabilities \
                     effective = permitted = {CAP_SETUID, CAP_SETGID}"
                ),
            "{msg}"
        );
        nothing_written(what);
    }

    // A trial step that smuggles shell, with the right start: nothing runs.
    let mut smuggled = spec();
    if let RunSpec::Project(p) = &mut smuggled {
        p.steps[1].run = "plimsoll-trial-runner -- node a.js; id".into();
    }
    let msg = refused_started(
        &trial_job(work.path(), smuggled, ids),
        &Start::Trial { runner: None },
    );
    assert!(
        msg.contains("step #1 (plimsoll-trial-runner) is refused: holds `;`"),
        "{msg}"
    );
    nothing_written("a smuggled shell step");

    // A trial step in a job without trial ids (an ordinary start).
    let msg = refused_started(&job(work.path(), spec()), &Start::Unprivileged);
    assert!(
        msg.contains("step #1 runs plimsoll-trial-runner, but the job has no trial ids"),
        "{msg}"
    );
    nothing_written("no trial ids");

    // Unusable ids, and a snippet with trial ids.
    let same = plimsoll_wire::TrialIds {
        controller_uid: ids.uid,
        ..ids
    };
    let msg = refused_started(
        &trial_job(work.path(), spec(), same),
        &Start::Trial { runner: None },
    );
    assert!(
        msg.contains("trial ids are refused (the same uid for both)"),
        "{msg}"
    );
    let snippet = RunSpec::Snippet(Snippet {
        language: Language::Python,
        code: "print(1)".into(),
    });
    let msg = refused_started(
        &trial_job(work.path(), snippet, ids),
        &Start::Trial { runner: None },
    );
    assert!(msg.contains("a snippet with trial ids"), "{msg}");
    nothing_written("bad ids");
}

/// What a controller writes where it can (/tmp, /dev/shm: `HOME` is /tmp for every uid) is
/// gone before the next step, which runs as the run's uid and must not meet it (a planted
/// `~/.local/.../x.pth` would run as that uid); and the files a trial step names as
/// scenarios are written readable by the run's uid only, so no controller of an earlier
/// trial step reads them.
#[test]
fn the_controllers_files_go_before_the_next_step_and_scenarios_are_private() {
    let test = "the_controllers_files_go_before_the_next_step_and_scenarios_are_private";
    if !is_root() {
        return skip(test, "root (mount namespace, uid 0 agent)");
    }
    if which("setpriv").is_none() {
        return skip(test, "setpriv (util-linux)");
    }
    let ids = trial_ids(2_190_010);
    let c_id = ids.controller_uid;
    let planted = [
        format!("/tmp/plimsoll-agent-test-planted-{c_id}"),
        format!("/dev/shm/plimsoll-agent-test-planted-{c_id}"),
    ];
    // A stand-in for the runner whose "controller" (uid C) plants a tree (closed with mode
    // 0) in /tmp and a file in /dev/shm, and reads the next trial step's scenario.
    let tools = tempfile::tempdir().unwrap();
    give(tools.path(), 0);
    let fake = tools.path().join("fake-runner");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\nsetpriv --reuid \"$6\" --regid \"$8\" --clear-groups sh -c '\
             mkdir -p {0}/.local/lib && echo x > {0}/.local/lib/x.pth && chmod 0 {0}; \
             echo y > {1}; cat later.json || echo later-unreadable'\n",
            planted[0], planted[1]
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let work = owned_tempdir(ids.uid);
    let spec = project(
        vec![
            file("first.json", b"{}", false),
            file("later.json", b"the hidden scenario", false),
            file("c.js", b"", false),
        ],
        &[
            "stat -c '%n %a' first.json later.json c.js",
            "plimsoll-trial-runner --scenario first.json -- node c.js",
            &format!("ls -d {} {} 2>&1 || true", planted[0], planted[1]),
            "plimsoll-trial-runner --scenario=./later.json -- node c.js",
        ],
        &[],
    );
    let r = run_started(
        &trial_job(work.path(), spec, ids),
        &Start::Trial { runner: Some(fake) },
    );
    assert_eq!(r.steps.len(), 4, "{}", text(&r.stderr));
    assert_eq!(
        text(&r.steps[0].stdout),
        "first.json 600\nlater.json 600\nc.js 644\n"
    );
    assert_eq!(text(&r.steps[1].stdout), "later-unreadable\n");
    assert!(
        text(&r.steps[1].stderr).contains("Permission denied"),
        "{}",
        text(&r.steps[1].stderr)
    );
    let seen = text(&r.steps[2].stdout);
    for p in &planted {
        assert!(seen.contains(&format!("{p}': No such file")), "{seen}");
        assert!(!Path::new(p).exists(), "{p} is still there");
    }
    assert_eq!(processes_left(c_id), Vec::<String>::new());
}

// ---- Warm members (`--warm`, docs/agent.md "Warm members") ----

/// The agent started with `--warm LANGUAGE` in `work`, as a VM's warm member starts it; its
/// stdout and stdin, and its child the waiting interpreter.
struct WarmAgent {
    child: std::process::Child,
    stdout: std::process::ChildStdout,
    interpreter: i32,
}

fn warm_agent(language: &str, work: &Path) -> WarmAgent {
    let mut cmd = agent_command();
    cmd.arg("--warm")
        .arg(language)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", "/tmp")
        .current_dir(work)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if is_root() {
        become_uid(&mut cmd, AGENT_UID);
    }
    let mut child = cmd.spawn().expect("start the agent");
    let mut stdout = child.stdout.take().unwrap();
    let mut line = vec![0u8; plimsoll_sandbox::warm::READY_LINE.len()];
    stdout.read_exact(&mut line).expect("the ready line");
    assert_eq!(line, plimsoll_sandbox::warm::READY_LINE);
    // The interpreter is the agent's one child, already started, blocked reading its input.
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children", pid = child.id()))
            .unwrap();
    let pids: Vec<i32> = children
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 1, "one waiting interpreter: {children:?}");
    // It says it waits just before its read.
    plimsoll_sandbox::warm::wait_until_reading(pids[0] as u32, Duration::from_secs(5))
        .expect("the interpreter waits on its stdin");
    WarmAgent {
        child,
        stdout,
        interpreter: pids[0],
    }
}

impl WarmAgent {
    /// Gives the agent `job` and returns its exit status, stdout and stderr.
    fn give(mut self, job: &[u8]) -> Ran {
        let mut stdin = self.child.stdin.take().unwrap();
        stdin.write_all(job).unwrap();
        drop(stdin);
        let mut stdout = Vec::new();
        self.stdout.read_to_end(&mut stdout).unwrap();
        let mut stderr = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        let status = self.child.wait().unwrap();
        Ran {
            code: status.code(),
            stdout,
            stderr,
        }
    }
}

/// The process `pid` is gone (or a zombie) within 5 s.
fn is_gone(pid: i32) -> bool {
    (0..100).any(|_| {
        let gone = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map_or(true, |s| s.contains(") Z "));
        if !gone {
            std::thread::sleep(Duration::from_millis(50));
        }
        gone
    })
}

#[test]
fn a_warm_agent_waits_before_its_job_and_runs_one_snippet_of_its_language_from_the_job_on() {
    let (node, python) = (which("node"), which("python3"));
    if node.is_none() || python.is_none() {
        return skip("a_warm_agent_waits_…", "node and python3");
    }
    let work = tempdir();
    let snippet = |language, code: &str, deadline_ms| {
        let mut j = job(
            work.path(),
            RunSpec::Snippet(Snippet {
                language,
                code: code.into(),
            }),
        );
        j.deadline_ms = deadline_ms;
        serde_json::to_vec(&j).unwrap()
    };
    let cwd = work.path().canonicalize().unwrap();
    for (name, language, code, says) in [
        (
            "python",
            Language::Python,
            "import sys, os\nprint(__name__, sys.argv[0].endswith('/main.py'), sys.flags.isolated, os.getcwd())\nsys.exit(3)\n",
            format!("__main__ True 1 {}\n", cwd.display()),
        ),
        (
            "javascript",
            Language::Javascript,
            "console.log(require.main === module, process.argv[1].endsWith('/main.js'), process.cwd());\nprocess.exitCode = 3;\n",
            format!("true true {}\n", cwd.display()),
        ),
    ] {
        // Waiting longer than the job's deadline before the job comes: the deadline counts
        // from the job.
        let warm = warm_agent(name, work.path());
        let waiting = warm.interpreter;
        std::thread::sleep(Duration::from_millis(1500));
        let ran = warm.give(&snippet(language, code, 1000));
        assert_eq!(ran.code, Some(0), "{name}: {}", ran.stderr);
        let r: RunResult = serde_json::from_slice(&ran.stdout).unwrap();
        assert_eq!(text(&r.stdout), says, "{name}: {}", text(&r.stderr));
        assert_eq!((r.exit_code, r.timed_out), (Some(3), false), "{name}");
        assert!(is_gone(waiting));

        // The deadline still holds, from the job on.
        let sleep = match language {
            Language::Python => "import time\ntime.sleep(30)\n",
            Language::Javascript => "setTimeout(() => {}, 30000);\n",
        };
        let ran = warm_agent(name, work.path()).give(&snippet(language, sleep, 300));
        let r: RunResult = serde_json::from_slice(&ran.stdout).unwrap();
        assert!(r.timed_out, "{name}");

        // Another language, a project or a job elsewhere: refused, and nothing ran.
        let other = match language {
            Language::Python => Language::Javascript,
            Language::Javascript => Language::Python,
        };
        let mut elsewhere = job(
            Path::new("/"),
            RunSpec::Snippet(Snippet {
                language,
                code: "print(1)".into(),
            }),
        );
        elsewhere.work_dir = "/".into();
        for (job, why) in [
            (snippet(other, "print(1)", 1000), "snippet: run it cold"),
            (
                serde_json::to_vec(&job(work.path(), project(vec![], &["echo ran > ran"], &[])))
                    .unwrap(),
                "a project: run it cold",
            ),
            (serde_json::to_vec(&elsewhere).unwrap(), "in /: run it cold"),
        ] {
            let warm = warm_agent(name, work.path());
            let waiting = warm.interpreter;
            let ran = warm.give(&job);
            assert_eq!(ran.code, Some(2), "{name}");
            assert!(ran.stdout.is_empty());
            let msg = one_line(&ran.stderr);
            assert!(msg.contains(why), "{name}: {msg}");
            assert!(is_gone(waiting), "{name}: the waiting interpreter is ended");
        }
        assert_eq!(std::fs::read_dir(work.path()).unwrap().count(), 0);
    }

    let mut cmd = agent_command();
    let out = cmd.args(["--warm", "ruby"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("javascript or python"));
}

// ---- Sessions (`--session`, docs/agent.md "Sessions") ----

use plimsoll_wire::{
    OutputChunk, OutputStream, SESSION_READY_LINE, SessionAnswer, SessionCall, SessionCell,
    SessionJob, SessionLine,
};

/// A session's agent (`--session LANGUAGE`), started in `work` as a sandbox starts it; its
/// stdout read line by line on a thread of its own, so a test sees each line as it comes
/// and never hangs on a silent agent.
struct SessionAgent {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<Vec<u8>>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

/// How long a test waits for any one line of a session's agent.
const LINE_WAIT: Duration = Duration::from_secs(60);

fn session_agent(language: &str, work: &Path) -> SessionAgent {
    session_agent_with(&["--session", language], work, |_| {})
}

fn session_agent_with(
    args: &[&str],
    work: &Path,
    configure: impl FnOnce(&mut Command),
) -> SessionAgent {
    use std::io::BufRead as _;
    let mut cmd = agent_command();
    cmd.args(args)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", "/tmp")
        .current_dir(work)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    configure(&mut cmd);
    if is_root() {
        become_uid(&mut cmd, AGENT_UID);
    }
    let mut child = cmd.spawn().expect("start the agent");
    let stdout = child.stdout.take().unwrap();
    let (send, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = std::io::BufReader::new(stdout);
        loop {
            let mut line = Vec::new();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if send.send(line).is_err() {
                        break;
                    }
                }
            }
        }
    });
    let mut err = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    SessionAgent {
        stdin: child.stdin.take(),
        child,
        lines,
        stderr: Some(stderr),
    }
}

/// A session's agent that has said it is ready.
fn ready_session(language: &str, work: &Path) -> SessionAgent {
    let mut s = session_agent(language, work);
    let line = s.next_line();
    assert_eq!(
        line,
        SESSION_READY_LINE,
        "{}",
        String::from_utf8_lossy(&line)
    );
    s
}

fn cell_call(code: &str) -> SessionCell {
    SessionCell {
        code: code.into(),
        restart: false,
        deadline_ms: 30_000,
        output_bytes: 1 << 20,
        stream: false,
    }
}

impl SessionAgent {
    fn next_line(&mut self) -> Vec<u8> {
        match self.lines.recv_timeout(LINE_WAIT) {
            Ok(line) => line,
            Err(e) => {
                let _ = self.child.kill();
                let stderr = self.stderr.take().unwrap().join().unwrap();
                panic!("no line from the session's agent ({e}); its stderr: {stderr}")
            }
        }
    }

    fn read(&mut self) -> SessionLine {
        let line = self.next_line();
        assert_eq!(line.last(), Some(&b'\n'));
        serde_json::from_slice(&line)
            .unwrap_or_else(|e| panic!("not a line ({e}): {}", String::from_utf8_lossy(&line)))
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(bytes).unwrap();
        stdin.flush().unwrap();
    }

    fn send(&mut self, call: &SessionCall) {
        let mut line = serde_json::to_vec(call).unwrap();
        line.push(b'\n');
        self.send_raw(&line);
    }

    /// The chunks and the answer that follow a call.
    fn answer(&mut self) -> (Vec<OutputChunk>, SessionAnswer) {
        let mut chunks = Vec::new();
        loop {
            match self.read() {
                SessionLine::Chunk(c) => chunks.push(c),
                SessionLine::Answer(a) => return (chunks, *a),
            }
        }
    }

    fn call(&mut self, call: &SessionCall) -> (Vec<OutputChunk>, SessionAnswer) {
        self.send(call);
        self.answer()
    }

    /// A call whose answer is a result.
    fn result(&mut self, call: &SessionCall) -> RunResult {
        let (_, answer) = self.call(call);
        assert_eq!(answer.error, None, "{call:?}");
        answer.result.expect("a result")
    }

    /// A cell with the defaults of [`cell_call`].
    fn cell(&mut self, code: &str) -> RunResult {
        self.result(&SessionCall::Cell(cell_call(code)))
    }

    /// A call whose answer is an error.
    fn error(&mut self, call: &SessionCall) -> String {
        let (chunks, answer) = self.call(call);
        assert!(
            chunks.is_empty() && answer.result.is_none() && answer.wall.is_none(),
            "{chunks:?} {answer:?}"
        );
        answer.error.expect("an error")
    }

    /// The agent's children now: its interpreter, and whatever else is left.
    fn children(&self) -> Vec<i32> {
        let pid = self.child.id();
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .unwrap()
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect()
    }

    /// Its interpreter: its one child between calls.
    fn interpreter(&self) -> i32 {
        let children = self.children();
        assert_eq!(children.len(), 1, "one interpreter: {children:?}");
        children[0]
    }

    /// Closes its stdin; returns its exit status and stderr once it has ended, with no
    /// line after the last answer.
    fn close(mut self) -> (Option<i32>, String) {
        drop(self.stdin.take());
        if let Ok(line) = self.lines.recv_timeout(LINE_WAIT) {
            panic!("a line after the end: {}", String::from_utf8_lossy(&line));
        }
        let status = self.child.wait().unwrap();
        (status.code(), self.stderr.take().unwrap().join().unwrap())
    }
}

impl Drop for SessionAgent {
    fn drop(&mut self) {
        // A failed test leaves no agent behind (its interpreter ends with its pipes).
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The session's tests that need `name` (node or python3) skip without it.
fn session_languages(test: &str) -> Vec<&'static str> {
    let mut found = Vec::new();
    for (language, program) in [("python", "python3"), ("javascript", "node")] {
        if which(program).is_some() {
            found.push(language);
        } else {
            skip(test, program);
        }
    }
    found
}

fn session_job(work: &Path, spec: RunSpec, stream: bool) -> SessionCall {
    SessionCall::Job(SessionJob {
        job: job(work, spec),
        stream,
    })
}

#[test]
fn a_session_keeps_its_state_across_100_cells() {
    for language in session_languages("a_session_keeps_its_state_across_100_cells") {
        let work = tempdir();
        let mut s = ready_session(language, work.path());
        let interpreter = s.interpreter();
        // A counter, a function, an import and an open file, each used by every later cell.
        let (first, each, last) = match language {
            "python" => (
                "import json, os\ncount = 0\ndef bump():\n    global count\n    count += 1\n    return count\nlog = open('log.txt', 'w')\nprint(os.getpid())\n",
                "bump(); log.write('%d\\n' % count)",
                "log.flush()\nprint(bump(), json.dumps([count]), len(open('log.txt').read().splitlines()), os.getpid())",
            ),
            _ => (
                "let count = 0;\nconst fs = require('fs');\nfunction bump() { return ++count; }\nvar fd = fs.openSync('log.txt', 'w');\nconsole.log(process.pid);\n",
                "bump(); fs.writeSync(fd, count + '\\n');",
                "console.log(bump(), JSON.stringify([count]), fs.readFileSync('log.txt', 'utf8').split('\\n').length - 1, process.pid)",
            ),
        };
        let r = s.cell(first);
        assert_eq!(
            (r.exit_code, r.state_kept),
            (Some(0), Some(true)),
            "{language}: {}",
            text(&r.stderr)
        );
        assert_eq!(text(&r.stdout), format!("{interpreter}\n"), "{language}");
        for n in 2..100 {
            let r = s.cell(each);
            assert_eq!(
                (r.exit_code, r.state_kept, r.interpreter_end),
                (Some(0), Some(true), None),
                "{language}: cell {n}: {}",
                text(&r.stderr)
            );
            assert!(r.stdout.0.is_empty() && r.stderr.0.is_empty() && !r.timed_out);
        }
        let r = s.cell(last);
        assert_eq!(
            text(&r.stdout),
            format!("99 [99] 98 {interpreter}\n"),
            "{language}: {}",
            text(&r.stderr)
        );
        assert_eq!(r.state_kept, Some(true));
        assert_eq!(s.interpreter(), interpreter);
        let (code, stderr) = s.close();
        assert_eq!(code, Some(0), "{language}: {stderr}");
        assert!(stderr.is_empty(), "{language}: {stderr}");
        assert!(
            is_gone(interpreter),
            "{language}: the interpreter outlived stdin"
        );
    }
}

#[test]
fn a_session_job_shares_the_work_directory_with_cells() {
    if which("python3").is_none() {
        return skip(
            "a_session_job_shares_the_work_directory_with_cells",
            "python3",
        );
    }
    let work = tempdir();
    let w = work.path();
    let mut s = ready_session("python", w);
    let interpreter = s.interpreter();
    // A process the interpreter started outlives the jobs; the jobs' own do not.
    let r =
        s.cell("import subprocess\nchild = subprocess.Popen(['sleep', '1000'])\nnote = 'kept'\n");
    assert_eq!(r.exit_code, Some(0), "{}", text(&r.stderr));

    // A shell step writes a file; a cell reads it.
    let r = s.result(&session_job(
        w,
        project(
            vec![file("in.txt", b"from a file\n", false)],
            &[
                "cat in.txt; echo step > made.txt; sleep 1000 & echo $! > bg.pid",
                "echo second >&2",
            ],
            &["made.txt"],
        ),
        false,
    ));
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(r.steps.len(), 2);
    assert_eq!(text(&r.steps[0].stdout), "from a file\n");
    assert_eq!(text(&r.stderr), "second\n");
    assert_eq!(r.artifacts[0].content.0, b"step\n");
    assert_eq!((r.state_kept, r.interpreter_end), (None, None));
    assert!(
        sleep_is_gone(read_pid(w, "bg.pid")),
        "the step's sleep outlived its job"
    );
    let r = s.cell("print(open('made.txt').read().strip(), note, child.poll())");
    assert_eq!(text(&r.stdout), "step kept None\n", "{}", text(&r.stderr));
    assert_eq!(r.state_kept, Some(true));
    assert_eq!(s.interpreter(), interpreter);

    // An upload (files only), then a download (artifacts only), byte-exact.
    let bytes: Vec<u8> = (0..=255u8).rev().chain(0..=255u8).collect();
    assert!(std::str::from_utf8(&bytes).is_err());
    let r = s.result(&session_job(
        w,
        project(vec![file("up/data.bin", &bytes, false)], &[], &[]),
        false,
    ));
    assert!(r.steps.is_empty() && r.artifacts.is_empty());
    assert_eq!((r.exit_code, r.timed_out), (None, false));
    let r = s.cell("data = open('up/data.bin', 'rb').read()\nprint(len(data), data[:2].hex())");
    assert_eq!(text(&r.stdout), "512 fffe\n");
    s.cell("open('down.bin', 'wb').write(data[::-1])");
    let r = s.result(&session_job(
        w,
        project(vec![], &[], &["up/data.bin", "down.bin", "missing"]),
        false,
    ));
    assert!(r.steps.is_empty());
    assert_eq!(r.artifacts.len(), 3);
    assert_eq!(r.artifacts[0].content.0, bytes);
    let reversed: Vec<u8> = bytes.iter().rev().copied().collect();
    assert_eq!(r.artifacts[1].content.0, reversed);
    assert!(r.artifacts[0].found && r.artifacts[1].found && !r.artifacts[2].found);

    // Jobs a session does not take: nothing of them runs.
    let mut elsewhere = job(w, project(vec![], &["echo ran > ran"], &[]));
    elsewhere.work_dir = "/tmp".into();
    let mut trial_ids = job(w, project(vec![], &["echo ran > ran"], &[]));
    trial_ids.trial = Some(trial_ids_for_refusal());
    for (call, why) in [
        (
            SessionCall::Job(SessionJob {
                job: elsewhere,
                stream: false,
            }),
            "is not the session's",
        ),
        (
            SessionCall::Job(SessionJob {
                job: trial_ids,
                stream: false,
            }),
            "runs no trial",
        ),
        (
            session_job(
                w,
                project(
                    vec![],
                    &["echo ran > ran", "plimsoll-trial-runner -- node a.js"],
                    &[],
                ),
                false,
            ),
            "step #1 runs plimsoll-trial-runner",
        ),
        (
            session_job(
                w,
                RunSpec::Snippet(Snippet {
                    language: Language::Python,
                    code: "open('ran', 'w')".into(),
                }),
                false,
            ),
            "runs as a cell",
        ),
        (
            session_job(w, project(vec![file("../x", b"", false)], &[], &[]), false),
            "run.files[0] is refused",
        ),
    ] {
        let e = s.error(&call);
        assert!(e.contains(why), "{e}");
    }
    assert!(!w.join("ran").exists());
    assert_eq!(s.interpreter(), interpreter);
    let r = s.cell("print(note)");
    assert_eq!(text(&r.stdout), "kept\n");
    let child = s.cell("print(child.pid)");
    let child: i32 = text(&child.stdout).trim().parse().unwrap();
    let (code, stderr) = s.close();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        is_gone(interpreter) && sleep_is_gone(child),
        "stdin's end ends everything"
    );
}

fn trial_ids_for_refusal() -> plimsoll_wire::TrialIds {
    plimsoll_wire::TrialIds {
        uid: 2_190_990,
        gid: 2_190_990,
        controller_uid: 2_190_991,
        controller_gid: 2_190_991,
    }
}

#[test]
fn an_interpreter_that_exits_from_inside_ends_its_state_until_a_restart() {
    for language in session_languages("an_interpreter_that_exits_from_inside_…") {
        let work = tempdir();
        let mut s = ready_session(language, work.path());
        let first = s.interpreter();
        let (set, exit, read) = match language {
            "python" => (
                "old = 1",
                "import os\nprint('bye', flush=True)\nos._exit(3)",
                "print(old)",
            ),
            _ => (
                "var old = 1",
                "console.log('bye'); process.exit(3)",
                "console.log(old)",
            ),
        };
        assert_eq!(s.cell(set).exit_code, Some(0));
        let r = s.cell(exit);
        assert_eq!(
            (r.exit_code, r.signal, r.timed_out, r.oom_killed),
            (Some(3), None, false, false),
            "{language}: {}",
            text(&r.stderr)
        );
        assert_eq!(text(&r.stdout), "bye\n");
        assert_eq!(r.state_kept, Some(false));
        assert_eq!(
            r.interpreter_end,
            Some(plimsoll_wire::EndReason::InterpreterCrash)
        );
        assert!(is_gone(first));
        assert!(s.children().is_empty(), "{language}: nothing is left");

        // Without restart: refused, nothing run.
        let e = s.error(&SessionCall::Cell(cell_call("open('ran', 'w')")));
        assert!(e.contains("send the cell with restart"), "{language}: {e}");
        assert!(e.contains("exited with status 3"), "{language}: {e}");
        assert!(!work.path().join("ran").exists());

        // With restart: a fresh interpreter, without the old state.
        let mut restart = cell_call(read);
        restart.restart = true;
        let r = s.result(&SessionCall::Cell(restart.clone()));
        assert_eq!(r.exit_code, Some(1), "{language}");
        assert!(
            text(&r.stderr).contains("'old' is not defined")
                || text(&r.stderr).contains("old is not defined"),
            "{language}: {}",
            text(&r.stderr)
        );
        assert_eq!((r.state_kept, r.interpreter_end), (Some(false), None));
        let second = s.interpreter();
        assert_ne!(second, first);
        let r = s.cell(set);
        assert_eq!((r.exit_code, r.state_kept), (Some(0), Some(true)));
        // A restart of a live interpreter ends it too.
        let r = s.result(&SessionCall::Cell(restart));
        assert_eq!(
            (r.exit_code, r.state_kept),
            (Some(1), Some(false)),
            "{language}"
        );
        assert!(is_gone(second));
        let third = s.interpreter();

        // Python's own exit, and a kill from inside.
        let (exit, kill) = match language {
            "python" => (
                "import sys\nsys.exit(4)",
                "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
            ),
            _ => (
                "process.exitCode = 4; process.exit()",
                "process.kill(process.pid, 'SIGKILL')",
            ),
        };
        let r = s.cell(exit);
        assert_eq!(
            (r.exit_code, r.state_kept),
            (Some(4), Some(false)),
            "{language}"
        );
        assert!(is_gone(third));
        let mut again = cell_call(kill);
        again.restart = true;
        let r = s.result(&SessionCall::Cell(again));
        assert_eq!((r.exit_code, r.signal), (None, Some(9)), "{language}");
        assert_eq!(
            r.interpreter_end,
            Some(plimsoll_wire::EndReason::InterpreterCrash)
        );
        assert_eq!(r.state_kept, Some(false));
        let (code, stderr) = s.close();
        assert_eq!(code, Some(0), "{stderr}");
    }
}

/// The process `pid` is gone and reaped (no /proc entry) within 5 s.
fn is_reaped(pid: i32) -> bool {
    (0..100).any(|_| {
        let gone = !Path::new(&format!("/proc/{pid}")).exists();
        if !gone {
            std::thread::sleep(Duration::from_millis(50));
        }
        gone
    })
}

#[test]
fn an_interpreter_that_ends_outside_a_cell_is_told_to_the_next_cell() {
    for language in session_languages("an_interpreter_that_ends_outside_a_cell_…") {
        let work = tempdir();
        let mut s = ready_session(language, work.path());
        let first = s.interpreter();
        // It ends on its own after the cell has answered.
        let code = match language {
            "python" => concat!(
                "import os, threading, time\n",
                "threading.Thread(target=lambda: (time.sleep(0.3), os._exit(7))).start()\n",
            ),
            _ => "setTimeout(() => process.exit(7), 300);",
        };
        let r = s.cell(code);
        assert_eq!(
            (r.exit_code, r.state_kept),
            (Some(0), Some(true)),
            "{language}"
        );
        // Reaped by the agent, not only a zombie: a zombie whose other threads are still
        // ending cannot be reaped yet, and a cell sent then meets it ending.
        assert!(is_reaped(first), "{language}");
        let e = s.error(&SessionCall::Cell(cell_call("1")));
        assert!(
            e.contains("exited with status 7 outside a cell"),
            "{language}: {e}"
        );
        // A job's step that kills it: the job still answers; the next cell is told.
        let mut restart = cell_call("1");
        restart.restart = true;
        assert_eq!(s.result(&SessionCall::Cell(restart)).exit_code, Some(0));
        let second = s.interpreter();
        let kill = format!("kill -9 {second}; echo killed");
        let r = s.result(&session_job(
            work.path(),
            project(vec![], &[&kill], &[]),
            false,
        ));
        assert_eq!(text(&r.stdout), "killed\n");
        assert!(is_reaped(second));
        let e = s.error(&SessionCall::Cell(cell_call("1")));
        assert!(
            e.contains("was killed by signal 9 outside a cell"),
            "{language}: {e}"
        );
    }
}

#[test]
fn a_cell_past_its_deadline_ends_the_interpreter_and_its_processes() {
    for language in session_languages("a_cell_past_its_deadline_…") {
        let work = tempdir();
        let mut s = ready_session(language, work.path());
        let interpreter = s.interpreter();
        // A child in the interpreter's group and one in a session of its own.
        let code = match language {
            "python" => concat!(
                "import subprocess, time\n",
                "a = subprocess.Popen(['sleep', '1000'])\n",
                "b = subprocess.Popen(['sleep', '1000'], start_new_session=True)\n",
                "open('pids', 'w').write('%d %d' % (a.pid, b.pid))\n",
                "print('waiting', flush=True)\n",
                "time.sleep(1000)\n",
            ),
            _ => concat!(
                "const cp = require('child_process');\n",
                "const a = cp.spawn('sleep', ['1000']);\n",
                "const b = cp.spawn('sleep', ['1000'], { detached: true });\n",
                "require('fs').writeFileSync('pids', a.pid + ' ' + b.pid);\n",
                "console.log('waiting');\n",
                "for (;;) {}\n",
            ),
        };
        let mut call = cell_call(code);
        call.deadline_ms = 1000;
        let r = s.result(&SessionCall::Cell(call));
        assert!(r.timed_out, "{language}: {}", text(&r.stderr));
        assert_eq!((r.exit_code, r.signal), (None, Some(9)));
        assert_eq!(text(&r.stdout), "waiting\n");
        assert_eq!(r.state_kept, Some(false));
        assert_eq!(
            r.interpreter_end,
            Some(plimsoll_wire::EndReason::CellTimeout)
        );
        assert!(is_gone(interpreter), "{language}");
        let pids = std::fs::read_to_string(work.path().join("pids")).unwrap();
        for pid in pids.split_whitespace() {
            assert!(
                sleep_is_gone(pid.parse().unwrap()),
                "{language}: {pid} survived"
            );
        }
        assert!(s.children().is_empty(), "{language}");
        let e = s.error(&SessionCall::Cell(cell_call("1")));
        assert!(e.contains("past its deadline"), "{e}");
        let (code, stderr) = s.close();
        assert_eq!(code, Some(0), "{stderr}");
    }
}

#[test]
fn a_streamed_cell_sends_its_output_while_it_runs() {
    for language in session_languages("a_streamed_cell_sends_its_output_while_it_runs") {
        let work = tempdir();
        let mut s = ready_session(language, work.path());
        // The cell waits for a file the test creates only once it has the first chunk: that
        // chunk came while the cell ran, before its answer.
        let code = match language {
            "python" => concat!(
                "import os, time\n",
                "print('first')\n",
                "while not os.path.exists('go'):\n",
                "    time.sleep(0.01)\n",
                "print('second')\n",
            ),
            _ => concat!(
                "const fs = require('fs');\n",
                "console.log('first');\n",
                "(async () => {\n",
                "  while (!fs.existsSync('go')) await new Promise((r) => setTimeout(r, 10));\n",
                "  console.log('second');\n",
                "})()\n",
            ),
        };
        let mut call = cell_call(code);
        call.stream = true;
        s.send(&SessionCall::Cell(call));
        let SessionLine::Chunk(first) = s.read() else {
            panic!("{language}: the first line is not a chunk");
        };
        assert_eq!(
            (first.stream, first.offset, text(&first.bytes)),
            (OutputStream::Stdout, 0, "first\n".to_owned()),
            "{language}"
        );
        std::fs::write(work.path().join("go"), b"").unwrap();
        let (chunks, answer) = s.answer();
        let r = answer.result.expect("a result");
        assert_eq!(text(&r.stdout), "first\nsecond\n");
        let rest: Vec<(u64, String)> = chunks.iter().map(|c| (c.offset, text(&c.bytes))).collect();
        assert_eq!(rest, [(6, "second\n".to_owned())], "{language}");
        assert_eq!((r.exit_code, r.state_kept), (Some(0), Some(true)));

        // Chunks never hold more than the result keeps.
        let code = match language {
            "python" => "import sys\nprint('0123456789')\nsys.stderr.write('abc')",
            _ => "console.log('0123456789'); process.stderr.write('abc')",
        };
        let mut call = cell_call(code);
        call.stream = true;
        call.output_bytes = 4;
        let (chunks, answer) = s.call(&SessionCall::Cell(call));
        let r = answer.result.unwrap();
        assert_eq!(
            (text(&r.stdout).as_str(), r.stdout_truncated),
            ("0123", true)
        );
        assert_eq!(
            (text(&r.stderr).as_str(), r.stderr_truncated),
            ("abc", false)
        );
        for (stream, kept) in [
            (OutputStream::Stdout, "0123"),
            (OutputStream::Stderr, "abc"),
        ] {
            let mut joined = Vec::new();
            for c in chunks.iter().filter(|c| c.stream == stream) {
                assert_eq!(c.offset, joined.len() as u64);
                joined.extend_from_slice(&c.bytes.0);
            }
            assert_eq!(joined, kept.as_bytes(), "{language}");
        }
        // Without stream, no chunk.
        let (chunks, _) = s.call(&SessionCall::Cell(cell_call(code)));
        assert!(chunks.is_empty());
    }
}

#[test]
fn a_streamed_job_sends_each_steps_output_with_offsets_across_the_job() {
    let work = tempdir();
    let Some(language) = session_languages("a_streamed_job_…").into_iter().next() else {
        return;
    };
    let mut s = ready_session(language, work.path());
    let spec = project(vec![], &["echo one; echo e >&2", "echo two"], &[]);
    let (chunks, answer) = s.call(&session_job(work.path(), spec, true));
    let r = answer.result.unwrap();
    assert_eq!(r.steps.len(), 2);
    let got: Vec<(OutputStream, u64, String)> = chunks
        .iter()
        .map(|c| (c.stream, c.offset, text(&c.bytes)))
        .collect();
    let out: Vec<_> = got.iter().filter(|c| c.0 == OutputStream::Stdout).collect();
    assert_eq!(
        out,
        [
            &(OutputStream::Stdout, 0, "one\n".to_owned()),
            &(OutputStream::Stdout, 4, "two\n".to_owned())
        ]
    );
    assert!(got.contains(&(OutputStream::Stderr, 0, "e\n".to_owned())));
}

#[test]
fn an_exception_in_a_cell_is_exit_1_with_its_traceback_and_the_state_stays() {
    for language in session_languages("an_exception_in_a_cell_…") {
        let work = tempdir();
        let mut s = ready_session(language, work.path());
        let (set, raise, says, read) = match language {
            "python" => (
                "kept = 5",
                "def f():\n    raise ValueError('boom')\nf()",
                &[
                    "Traceback (most recent call last):\n",
                    "  File \"<cell 2>\", line 3, in <module>\n",
                    "  File \"<cell 2>\", line 2, in f\n    raise ValueError('boom')\n",
                    "ValueError: boom\n",
                ][..],
                "print(kept)",
            ),
            _ => (
                "let kept = 5",
                "function f() {\n  throw new Error('boom');\n}\nf()",
                &[
                    "Error: boom\n",
                    "    at f (<cell 2>:2:9)\n",
                    "    at <cell 2>:4:1",
                ][..],
                "console.log(kept)",
            ),
        };
        assert_eq!(s.cell(set).exit_code, Some(0));
        let r = s.cell(raise);
        let stderr = text(&r.stderr);
        assert_eq!(
            (r.exit_code, r.state_kept, r.interpreter_end),
            (Some(1), Some(true), None)
        );
        for part in says {
            assert!(stderr.contains(part), "{language}: {part:?} in {stderr}");
        }
        // The driver's own frames are not shown.
        assert!(
            !stderr.contains("_plimsoll_session") && !stderr.contains("[eval]"),
            "{stderr}"
        );
        let r = s.cell(read);
        assert_eq!(text(&r.stdout), "5\n", "{language}");
        // A syntax error too.
        let r = s.cell("(");
        assert_eq!(
            (r.exit_code, r.state_kept),
            (Some(1), Some(true)),
            "{language}"
        );
        assert!(
            text(&r.stderr).contains("SyntaxError"),
            "{language}: {}",
            text(&r.stderr)
        );
    }
}

#[test]
fn the_wall_call_answers_the_agents_wall_and_bad_lines_an_error() {
    let Some(language) = session_languages("the_wall_call_…").into_iter().next() else {
        return;
    };
    let work = tempdir();
    // With --wall-first, the wall comes first, then the ready line.
    let mut s = session_agent_with(
        &["--wall-first", "--session", language],
        work.path(),
        |_| {},
    );
    let said: plimsoll_wire::Wall = serde_json::from_slice(&s.next_line()).unwrap();
    assert_eq!(s.next_line(), SESSION_READY_LINE);
    let (_, answer) = s.call(&SessionCall::Wall);
    let wall = answer.wall.expect("a wall");
    assert!(answer.result.is_none() && answer.error.is_none());
    let uid = if is_root() {
        AGENT_UID
    } else {
        rustix::process::getuid().as_raw()
    };
    assert_eq!((wall.uid, said.uid), (uid, uid));
    assert_eq!(wall.namespaces, said.namespaces);

    // A line that is not a call, or too long, is answered with an error; the session goes on.
    s.send_raw(b"nonsense\n");
    assert!(s.answer().1.error.unwrap().contains("not a SessionCall"));
    s.send_raw(b"{\"cell\":{\"code\":\"1\"}}\n");
    assert!(s.answer().1.error.unwrap().contains("missing field"));
    let mut long = vec![b' '; plimsoll_agent::MAX_CALL_BYTES + 10];
    long.push(b'\n');
    s.send_raw(&long);
    let e = s.answer().1.error.unwrap();
    assert!(e.contains("longer than"), "{e}");
    let code = if language == "python" {
        "print(6 * 7)"
    } else {
        "console.log(6 * 7)"
    };
    assert_eq!(text(&s.cell(code).stdout), "42\n");
    let (status, stderr) = s.close();
    assert_eq!(status, Some(0), "{stderr}");
}

#[test]
fn a_session_is_refused_what_it_cannot_serve() {
    let out = agent_command()
        .args(["--session", "ruby"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("javascript or python"));
    let out = agent_command()
        .args(["--warm", "python", "--session", "python"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("do not go together"));
    let out = agent_command().arg("--help").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("--session LANGUAGE"));
    if is_root() && which("python3").is_some() {
        // Started as root (no sandbox's uid): refused before anything starts.
        let work = tempdir();
        let out = agent_command()
            .args(["--session", "python"])
            .current_dir(work.path())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert!(out.stdout.is_empty());
        assert!(String::from_utf8_lossy(&out.stderr).contains("uid 0"));
    }
}

#[test]
fn a_cell_killed_by_the_memory_limit_ends_the_interpreter_as_out_of_memory() {
    if which("python3").is_none() {
        return skip("a_cell_killed_by_the_memory_limit_…", "python3");
    }
    let cg = match MemoryCgroup::create(64 * 1024 * 1024) {
        Ok(cg) => cg,
        Err(reason) => return skip("a_cell_killed_by_the_memory_limit_…", &reason),
    };
    let work = tempdir();
    let procs = cg.dir.join("cgroup.procs");
    let mut s = session_agent_with(&["--session", "python"], work.path(), move |cmd| {
        let fd = std::fs::OpenOptions::new()
            .write(true)
            .open(&procs)
            .unwrap();
        PreExec::new()
            .unnamed(Step::Write {
                fd: fd.into(),
                bytes: b"0\n",
            })
            .install_untracked(cmd);
    });
    assert_eq!(s.next_line(), SESSION_READY_LINE);
    assert_eq!(s.cell("small = 1").exit_code, Some(0));
    let r = s.cell("x = bytes(range(256)) * (2 * 1024 * 1024)\nprint(len(x))");
    assert_eq!(r.signal, Some(9), "{:?} {}", r.exit_code, text(&r.stderr));
    assert!(r.oom_killed && !r.timed_out);
    assert_eq!(r.state_kept, Some(false));
    assert_eq!(
        r.interpreter_end,
        Some(plimsoll_wire::EndReason::OutOfMemory)
    );
    let e = s.error(&SessionCall::Cell(cell_call("print(small)")));
    assert!(e.contains("the memory limit killed it"), "{e}");
    let (code, stderr) = s.close();
    assert_eq!(code, Some(0), "{stderr}");
}
