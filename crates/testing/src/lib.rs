//! Test support, only ever a dev-dependency: helpers for tests that need something real from
//! the host (root, a runtime, the probe binary), which skip with a visible line or fail when
//! tests run strictly (CI); requests, limits and attack programs tests start from; probe
//! reports for judging tests ([`report`]); and [`api`], a real HTTP API for the broker's
//! tests. The in-process daemon is in `plimsoll-test-daemon`, so that tests below the daemon
//! do not build it.

pub mod api;
pub mod egress;
pub mod report;

use std::net::TcpListener;
use std::path::{Path, PathBuf};

use plimsoll_wire::{Bytes, Language, Project, ProjectFile, RunSpec, Snippet, Step};

/// True when tests run strictly: env `CI` is `true` or `1` (declared as
/// `plimsoll_env::CI`; read here directly, as test support sits below every crate).
pub fn strict() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Prints `SKIP <test>: <reason>` and returns, or panics with the same text when tests run
/// strictly. Call it, then `return` from the test.
pub fn skip_or_fail(test: &str, reason: &str) {
    if strict() {
        panic!("SKIP not allowed under CI=true: {test}: {reason}");
    }
    eprintln!("SKIP {test}: {reason}");
}

/// True when this process runs as root (many sandbox tests need it).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// The `plimsoll-probe` binary of this build, built first when missing (see [`tool_binary`]).
pub fn probe_binary() -> Result<PathBuf, String> {
    tool_binary("plimsoll-probe", "plimsoll-probe")
}

/// The `plimsoll-agent` binary of this build, built first when missing (see [`tool_binary`]).
pub fn agent_binary() -> Result<PathBuf, String> {
    tool_binary("plimsoll-agent", "plimsoll-agent")
}

/// The probe and agent binaries a provider's tests hand it, each built first when missing.
pub fn probe_and_agent() -> Result<(PathBuf, PathBuf), String> {
    match (probe_binary(), agent_binary()) {
        (Ok(p), Ok(a)) => Ok((p, a)),
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

/// The workspace's root directory (where `build/` and `scripts/` are).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap_or_else(|e| panic!("cannot find the workspace root: {e}"))
}

/// The binary `name` of workspace package `package` in this build: beside the running test
/// binary's directory (`target/<profile>/`), built with `cargo build -p <package>` first when
/// it is not there yet (a `cargo nextest run -p <crate>` does not build other packages'
/// binaries).
pub fn tool_binary(name: &str, package: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the test binary: {e}"))?;
    // target/<profile>/deps/<test> -> target/<profile>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| format!("unexpected test binary path {}", exe.display()))?;
    let binary = profile_dir.join(name);
    if binary.exists() {
        return Ok(binary);
    }
    let profile = profile_dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("debug");
    let target_dir = profile_dir.parent().unwrap_or(profile_dir);
    let mut args = vec![
        "build".to_owned(),
        "-p".into(),
        package.into(),
        "--target-dir".into(),
        target_dir.display().to_string(),
    ];
    if profile == "release" {
        args.push("--release".into());
    }
    #[expect(
        clippy::disallowed_methods,
        reason = "building a test fixture needs the developer's own environment (PATH, CARGO_HOME)"
    )]
    let status = std::process::Command::new("cargo")
        .args(&args)
        .status()
        .map_err(|e| format!("cannot run cargo to build {package}: {e}"))?;
    if !status.success() || !binary.exists() {
        return Err(format!(
            "`cargo {}` did not produce {}",
            args.join(" "),
            binary.display()
        ));
    }
    Ok(binary)
}

/// The limits a sandbox attack test starts from: 30 s, 256 MiB, 1 MiB of output per stream,
/// 64 processes, 16 MiB of disk, 1 MiB per artifact.
pub fn limits() -> plimsoll_sandbox::ResolvedLimits {
    plimsoll_sandbox::ResolvedLimits {
        timeout: std::time::Duration::from_secs(30),
        memory_bytes: 256 << 20,
        output_bytes: 1 << 20,
        pids: 64,
        disk_bytes: 16 << 20,
        artifact_bytes: 1 << 20,
    }
}

/// A Python snippet.
pub fn py(code: &str) -> RunSpec {
    RunSpec::Snippet(Snippet {
        language: Language::Python,
        code: code.into(),
    })
}

/// A JavaScript snippet.
pub fn js(code: &str) -> RunSpec {
    RunSpec::Snippet(Snippet {
        language: Language::Javascript,
        code: code.into(),
    })
}

/// A project of these files, shell steps (unnamed) and artifact paths.
pub fn project(files: Vec<ProjectFile>, steps: &[&str], artifacts: &[&str]) -> RunSpec {
    RunSpec::Project(Project {
        files,
        steps: steps
            .iter()
            .map(|s| Step {
                name: None,
                run: (*s).to_owned(),
            })
            .collect(),
        artifacts: artifacts.iter().map(|s| (*s).to_owned()).collect(),
    })
}

/// Output bytes as text (lossy), for assertions and messages.
pub fn text(b: &Bytes) -> String {
    b.to_string_lossy()
}

/// The live (not zombie) processes of process group `pgid`, from /proc.
pub fn live_of_group(pgid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.first() != Some(&"Z") && fields.get(2) == Some(&pgid.to_string().as_str()) {
            out.push(pid);
        }
    }
    out
}

/// The CPU time (user and system) a live process has used, from /proc/PID/stat; `None` when
/// it is gone or a zombie.
pub fn cpu_seconds(pid: i32) -> Option<f64> {
    /// /proc counts CPU time in USER_HZ ticks, 100 a second on Linux.
    const USER_HZ: f64 = 100.0;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's closing parenthesis: state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    Some((ticks(11)? + ticks(12)?) / USER_HZ)
}

/// An id unique in this host for a while: `<scenario><pid>x<counter>`.
pub fn fresh_id(scenario: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{scenario}{}x{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A non-blocking TCP listener on `addr` (port 0: any free one), for a test to show that
/// sandboxed code cannot reach the host: see [`no_connection_came`].
pub fn quiet_listener(addr: &str) -> TcpListener {
    let l = TcpListener::bind(addr).unwrap_or_else(|e| panic!("cannot listen on {addr}: {e}"));
    l.set_nonblocking(true)
        .unwrap_or_else(|e| panic!("cannot make the listener on {addr} non-blocking: {e}"));
    l
}

/// True when no connection is waiting on a [`quiet_listener`].
pub fn no_connection_came(l: &TcpListener) -> bool {
    matches!(l.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// Every run directory below `dir`: the entries of each `runs` directory there, up to three
/// levels down (the engine's, the container provider's `<state_root>/<name>/runs`, the VM
/// provider's), not looking inside a runtime's own state (`runtime`). After a run, or after a
/// daemon's reap, a test expects none.
pub fn run_dirs_under(dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, depth: u32, out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.filter_map(Result::ok) {
            let p = e.path();
            if !p.is_dir() || p.is_symlink() {
                continue;
            }
            if e.file_name() == "runs" {
                out.extend(
                    std::fs::read_dir(&p)
                        .into_iter()
                        .flatten()
                        .filter_map(Result::ok)
                        .map(|r| r.path()),
                );
            } else if depth > 0 && e.file_name() != "runtime" {
                walk(&p, depth - 1, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, 3, &mut out);
    out
}

/// A directory under the system temp dir with mode 0711, so sandbox uids can traverse it to
/// their run directories (a plain `tempdir()` is 0700 and fails every probe). Removed on drop.
#[derive(Debug)]
pub struct TestDir(PathBuf);

impl TestDir {
    /// `<tmp>/plimsoll-<prefix>-<name>-<pid>`, emptied first.
    pub fn new(prefix: &str, name: &str) -> TestDir {
        use std::os::unix::fs::PermissionsExt as _;
        let dir =
            std::env::temp_dir().join(format!("plimsoll-{prefix}-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).unwrap();
        TestDir(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The namespace attack, the same at every provider (Python): each attempt to make a
/// namespace (`unshare(2)` of each kind, `clone(2)` and `clone3(2)` with `CLONE_NEWUSER`,
/// the `unshare -r` program) runs in a child of its own, so one success does not change the
/// next, and prints `ok` with the uid and effective capabilities it got, or `refused`. The
/// first line is where the code starts. In a user namespace the code would be uid 0 with
/// every capability over what that namespace owns.
pub const NAMESPACE_ATTACK: &str = r#"
import ctypes, os, struct, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
def eff():
    caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')]
    return '%d %s' % (os.getuid(), caps[0])
def attempt(what, call):
    # In a child of its own, so that one success does not change the next attempt.
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        rc = call()
        print(what, 'ok ' + eff() if rc == 0 else 'refused', flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
print('start', eff())
for name, flag in [('user', 0x10000000), ('mount', 0x20000), ('pid', 0x20000000),
                   ('net', 0x40000000), ('ipc', 0x08000000), ('uts', 0x04000000),
                   ('cgroup', 0x02000000)]:
    attempt('unshare ' + name, lambda: libc.unshare(flag))
def clone_newuser():
    # clone(CLONE_NEWUSER | SIGCHLD) as the raw syscall; the new child exits at once.
    rc = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)
    if rc == 0:
        os._exit(0)
    if rc > 0:
        os.waitpid(rc, 0)
        return 0
    return rc
attempt('clone newuser', clone_newuser)
def clone3_newuser():
    # clone3 with struct clone_args {flags: CLONE_NEWUSER, exit_signal: SIGCHLD}.
    args = ctypes.create_string_buffer(struct.pack('QQQQQQQQ', 0x10000000, 0, 0, 0, 17, 0, 0, 0))
    rc = libc.syscall(435, args, 64)
    if rc == 0:
        os._exit(0)
    if rc > 0:
        os.waitpid(rc, 0)
        return 0
    return rc
attempt('clone3 newuser', clone3_newuser)
r = subprocess.run(['unshare', '-r', 'id', '-u'], capture_output=True, text=True)
print('unshare -r', 'ok ' + r.stdout.strip() if r.returncode == 0 else 'refused')
"#;

/// What [`NAMESPACE_ATTACK`] prints, run as `uid` with no capability, when every attempt is
/// refused.
pub fn namespace_attack_refused(uid: u32) -> String {
    format!(
        "start {uid} 0000000000000000\n\
         unshare user refused\nunshare mount refused\nunshare pid refused\n\
         unshare net refused\nunshare ipc refused\nunshare uts refused\n\
         unshare cgroup refused\nclone newuser refused\nclone3 newuser refused\n\
         unshare -r refused\n"
    )
}
