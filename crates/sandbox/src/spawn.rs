//! The one way plimsoll starts a child process: empty environment unless told otherwise,
//! inherited descriptors above 2 closed at exec, a fixed working directory, and the child in a
//! session (and process group) of its own, so the whole group can be killed at once.
//!
//! A provider adds its own hardening (uid switch, rlimits, landlock, seccomp) as steps that
//! run in the child between fork and exec: data ([`PreExec`]) that plimsoll-sys turns into
//! the hook, since the child is a copy of a multithreaded process that may only make system
//! calls. A failure names the step that failed.

use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Stdio};
use std::sync::OnceLock;

use plimsoll_sys::exec::{PreExec, Step};

static SPAWNED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many children this process has tried to start through [`Spawn`]: the witness that a
/// refused run started nothing.
pub fn spawned_total() -> u64 {
    SPAWNED.load(std::sync::atomic::Ordering::SeqCst)
}

/// A child process to start, with a cleared environment.
pub struct Spawn {
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    cwd: PathBuf,
    steps: PreExec,
    stdin_pipe: bool,
}

impl std::fmt::Debug for Spawn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spawn")
            .field("program", &self.program)
            .field("args", &self.args)
            .field(
                "env_names",
                &self.env.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .field("cwd", &self.cwd)
            .field("steps", &self.steps.names())
            .field("stdin_pipe", &self.stdin_pipe)
            .finish()
    }
}

/// A started child: its pipes and its process group.
#[derive(Debug)]
pub struct Running {
    /// The child. Its pid is also its process group and session id.
    pub child: Child,
    /// Its standard output.
    pub stdout: ChildStdout,
    /// Its standard error.
    pub stderr: ChildStderr,
    /// The write end of its standard input, when it was asked for ([`Spawn::stdin_pipe`]).
    pub stdin: Option<ChildStdin>,
}

impl Running {
    /// Kills the child's whole process group with SIGKILL. Only valid before the child has
    /// been reaped (the group id could be reused after); a group already empty is fine.
    pub fn kill_group(&self) {
        kill_group(&self.child);
    }

    /// Kills the child's process group and reaps the child: a started process given up on.
    pub fn end(mut self) {
        self.kill_group();
        let _ = self.child.wait();
    }
}

/// Kills the process group led by `child` (SIGKILL). Call only before `child` is reaped.
pub(crate) fn kill_group(child: &Child) {
    if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
        // ESRCH (group empty) is the normal case after a clean exit.
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

/// The child could not be started. Nothing of the program ran.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// A setup step in the child (between fork and exec) failed.
    #[error("cannot start {program}: setup step `{stage}` failed")]
    Setup {
        /// The program.
        program: PathBuf,
        /// The step that failed, as the provider named it.
        stage: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Fork, the helper's own setup, or exec failed.
    #[error("cannot start {program}")]
    Start {
        /// The program.
        program: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// The uid and gid [`Spawn::as_nobody`] gives a helper.
pub const NOBODY: u32 = 65_534;

impl Spawn {
    /// A child running `program` in `cwd`, with no arguments and an empty environment.
    pub fn new(program: impl Into<PathBuf>, cwd: impl Into<PathBuf>) -> Self {
        Spawn {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            cwd: cwd.into(),
            steps: PreExec::new(),
            stdin_pipe: false,
        }
    }

    /// Gives the child a pipe as its standard input, its write end in [`Running::stdin`]
    /// (instead of /dev/null).
    pub fn stdin_pipe(mut self) -> Self {
        self.stdin_pipe = true;
        self
    }

    /// Adds an argument.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    /// Adds arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Sets one environment variable (the environment starts empty).
    pub fn env(mut self, name: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((name.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// For a helper that needs no privilege and whose output is all that is wanted (a
    /// binary's `--version` at a probe): when this process is root, the child gives it all up
    /// before exec: its bounding set emptied, no groups, every uid and gid nobody's (65534),
    /// no_new_privs. Not root: unchanged (it runs as this process's user).
    pub fn as_nobody(self) -> Self {
        if !rustix::process::geteuid().is_root() {
            return self;
        }
        self.before_exec(PreExec::new().become_user(NOBODY, NOBODY))
    }

    /// Steps the child takes after the helper's own setup and before exec, in order.
    pub fn before_exec(mut self, steps: PreExec) -> Self {
        self.steps = self.steps.extend(steps);
        self
    }

    /// Starts the child: stdin from /dev/null (or a pipe), stdout and stderr to pipes.
    pub fn spawn(self) -> Result<Running, SpawnError> {
        become_subreaper();
        SPAWNED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let start_err = |program: &Path, source| SpawnError::Start {
            program: program.to_owned(),
            source,
        };
        #[expect(
            clippy::disallowed_methods,
            reason = "this is the spawn helper every other child goes through"
        )]
        let mut cmd = std::process::Command::new(&self.program);
        cmd.args(&self.args)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&self.cwd)
            .stdin(if self.stdin_pipe {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // A session of its own; nothing the parent opened without O_CLOEXEC reaches the
        // program. Unnamed: their failure is a failure to start.
        let stages = PreExec::new()
            .unnamed(Step::NewSession)
            .unnamed(Step::CloseInherited { required: true })
            .extend(self.steps)
            .install(&mut cmd)
            .map_err(|e| start_err(&self.program, e))?;
        let mut child = match cmd.spawn() {
            Ok(child) => child,
            Err(source) => {
                return Err(match stages.failed_step() {
                    Some(name) => SpawnError::Setup {
                        program: self.program,
                        stage: name,
                        source,
                    },
                    None => start_err(&self.program, source),
                });
            }
        };
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            kill_group(&child);
            let _ = child.wait();
            return Err(start_err(
                &self.program,
                io::Error::other("the child's pipes are missing"),
            ));
        };
        let stdin = child.stdin.take();
        Ok(Running {
            child,
            stdout,
            stderr,
            stdin,
        })
    }
}

/// Makes this process a child subreaper, once: orphans of a sandbox (a process that called
/// setsid and whose parent exited) come back to us instead of init, so
/// [`crate::reap::end_processes_of_uid`] can find and reap them among our own children.
/// Returns whether this process is a subreaper.
pub(crate) fn become_subreaper() -> bool {
    static SUBREAPER: OnceLock<bool> = OnceLock::new();
    *SUBREAPER.get_or_init(|| {
        let me = rustix::process::getpid();
        match rustix::process::set_child_subreaper(Some(me)) {
            Ok(()) => true,
            Err(e) => {
                eprintln!("plimsoll: cannot become a child subreaper ({e}); orphans go to init");
                false
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;

    /// A helper started as nobody, from root, holds nothing of root's: its ids, groups,
    /// capability sets and no_new_privs as its own /proc shows them.
    #[test]
    fn a_helper_as_nobody_holds_nothing_of_roots() {
        if !plimsoll_testing::is_root() {
            plimsoll_testing::skip_or_fail(
                "a_helper_as_nobody_holds_nothing_of_roots",
                "needs root to give a helper up",
            );
            return;
        }
        let mut r = Spawn::new("/bin/cat", "/")
            .arg("/proc/self/status")
            .as_nobody()
            .spawn()
            .unwrap();
        let mut out = String::new();
        r.stdout.read_to_string(&mut out).unwrap();
        assert!(r.child.wait().unwrap().success(), "{out}");
        let field = |name: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}:")))
                .map(str::trim)
                .unwrap_or_else(|| panic!("no {name} in {out}"))
                .to_owned()
        };
        assert_eq!(field("Uid"), "65534\t65534\t65534\t65534");
        assert_eq!(field("Gid"), "65534\t65534\t65534\t65534");
        assert_eq!(field("Groups"), "");
        for caps in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            assert_eq!(field(caps), "0000000000000000", "{caps}");
        }
        assert_eq!(field("NoNewPrivs"), "1");
    }

    #[test]
    fn environment_is_empty_and_cwd_is_set() {
        let mut r = Spawn::new("/bin/sh", "/")
            .args(["-c", "env; pwd"])
            .spawn()
            .unwrap();
        let mut out = String::new();
        r.stdout.read_to_string(&mut out).unwrap();
        r.child.wait().unwrap();
        // sh itself sets PWD (and may set SHLVL/_); nothing from our environment arrives.
        for line in out.lines().filter(|l| l.contains('=')) {
            let name = line.split('=').next().unwrap();
            assert!(matches!(name, "PWD" | "SHLVL" | "_" | "OLDPWD"), "{line}");
        }
        assert!(out.lines().any(|l| l == "/"), "{out}");
    }

    #[test]
    fn inherited_descriptors_are_closed() {
        // A descriptor without CLOEXEC, as a careless library might leave one.
        let f = std::fs::File::open("/dev/null").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
        plimsoll_sys::fds::set_cloexec(&f, false).unwrap();
        let mut r = Spawn::new("/bin/sh", "/")
            .args([
                "-c",
                &format!("test -e /proc/self/fd/{fd} && echo leaked || echo closed"),
            ])
            .spawn()
            .unwrap();
        let mut out = String::new();
        r.stdout.read_to_string(&mut out).unwrap();
        r.child.wait().unwrap();
        assert_eq!(out.trim(), "closed");
    }

    #[test]
    fn child_leads_its_own_session() {
        let mut r = Spawn::new("/bin/sh", "/")
            .args(["-c", "cut -d' ' -f6 /proc/self/stat; echo $$"])
            .spawn()
            .unwrap();
        let mut out = String::new();
        r.stdout.read_to_string(&mut out).unwrap();
        r.child.wait().unwrap();
        let lines: Vec<&str> = out.lines().collect();
        // `cut` is a child of sh: its session id is sh's pid.
        assert_eq!(lines[0], lines[1], "{out}");
        assert_eq!(lines[1], r.child.id().to_string());
    }

    #[test]
    fn a_failing_hook_names_its_stage() {
        let e = Spawn::new("/bin/true", "/")
            .before_exec(PreExec::new().step("first", Step::NoNewPrivs).step(
                "second",
                // Read-only: the write fails.
                Step::Write {
                    fd: std::fs::File::open("/dev/null").unwrap().into(),
                    bytes: b"x",
                },
            ))
            .spawn()
            .unwrap_err();
        match e {
            SpawnError::Setup { stage, .. } => assert_eq!(stage, "second"),
            other => panic!("{other:?}"),
        }
        let e = Spawn::new("/nonexistent/program", "/").spawn().unwrap_err();
        assert!(matches!(e, SpawnError::Start { .. }), "{e:?}");
    }
}
