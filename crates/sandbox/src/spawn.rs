//! The one way plimsoll starts a child process: empty environment unless told otherwise,
//! inherited descriptors above 2 closed at exec, a fixed working directory, and the child in a
//! session (and process group) of its own, so the whole group can be killed at once.
//!
//! A provider adds its own hardening (uid switch, rlimits, landlock, seccomp) as a hook that
//! runs in the child between fork and exec. The hook runs in a copy of a multithreaded
//! process, so it must only make system calls: no allocation, no locks. It marks each step it
//! enters with [`Stage::enter`], so a failure names the step that failed.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdout, Stdio};
use std::ptr::NonNull;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A child-side setup hook: runs after fork, before exec, in the child.
pub type PreExecHook = Box<dyn FnMut(&Stage) -> io::Result<()> + Send + Sync>;

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
    hook: Option<(PreExecHook, &'static [&'static str])>,
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
            .field("hook", &self.hook.as_ref().map(|(_, names)| names))
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
}

impl Running {
    /// Kills the child's whole process group with SIGKILL. Only valid before the child has
    /// been reaped (the group id could be reused after); a group already empty is fine.
    pub fn kill_group(&self) {
        kill_group(&self.child);
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
        /// The step that failed, as the hook named it.
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

/// Where the child-side hook says which step it is in, so the parent can name a failure.
/// Lives in a shared anonymous page, so the child's writes are visible to the parent.
#[derive(Debug)]
pub struct Stage {
    page: NonNull<AtomicUsize>,
}

// SAFETY: the page is only touched through the atomic, and it lives as long as the Stage.
unsafe impl Send for Stage {}
// SAFETY: as above: all access goes through an AtomicUsize.
unsafe impl Sync for Stage {}

const NO_STAGE: usize = usize::MAX;
const PAGE: usize = 4096;

impl Stage {
    fn new() -> io::Result<Self> {
        // SAFETY: a fresh anonymous mapping, no address hint; the kernel picks the place.
        let ptr = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                PAGE,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
            )
        }?;
        let page = NonNull::new(ptr.cast::<AtomicUsize>())
            .ok_or_else(|| io::Error::other("mmap returned null"))?;
        // SAFETY: the page is writable, page-aligned and large enough for one AtomicUsize.
        unsafe { page.as_ptr().write(AtomicUsize::new(NO_STAGE)) };
        Ok(Stage { page })
    }

    /// Marks the start of step `index` (an index into the names given to
    /// [`Spawn::before_exec`]). Async-signal-safe.
    pub fn enter(&self, index: usize) {
        self.atomic().store(index, Ordering::SeqCst);
    }

    fn current(&self) -> Option<usize> {
        let v = self.atomic().load(Ordering::SeqCst);
        (v != NO_STAGE).then_some(v)
    }

    fn atomic(&self) -> &AtomicUsize {
        // SAFETY: initialised in `new`, unmapped only in `drop`.
        unsafe { self.page.as_ref() }
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        // SAFETY: the mapping was made in `new` with this size and is not used after this.
        let _ = unsafe { rustix::mm::munmap(self.page.as_ptr().cast(), PAGE) };
    }
}

impl Spawn {
    /// A child running `program` in `cwd`, with no arguments and an empty environment.
    pub fn new(program: impl Into<PathBuf>, cwd: impl Into<PathBuf>) -> Self {
        Spawn {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            cwd: cwd.into(),
            hook: None,
        }
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

    /// A hook run in the child after the helper's own setup and before exec. `stages` names
    /// the steps the hook marks with [`Stage::enter`].
    pub fn before_exec<F>(mut self, stages: &'static [&'static str], hook: F) -> Self
    where
        F: FnMut(&Stage) -> io::Result<()> + Send + Sync + 'static,
    {
        self.hook = Some((Box::new(hook), stages));
        self
    }

    /// Starts the child: stdin from /dev/null, stdout and stderr to pipes.
    pub fn spawn(self) -> Result<Running, SpawnError> {
        become_subreaper();
        SPAWNED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let start_err = |program: &Path, source| SpawnError::Start {
            program: program.to_owned(),
            source,
        };
        let stage = Stage::new().map_err(|e| start_err(&self.program, e))?;
        let stage = std::sync::Arc::new(stage);
        #[expect(
            clippy::disallowed_methods,
            reason = "this is the spawn helper every other child goes through"
        )]
        let mut cmd = std::process::Command::new(&self.program);
        cmd.args(&self.args)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&self.cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let names: &'static [&'static str] = self.hook.as_ref().map_or(&[], |(_, n)| *n);
        let mut hook = self.hook.map(|(h, _)| h);
        let child_stage = std::sync::Arc::clone(&stage);
        // SAFETY: the closure runs in the forked child before exec; it only makes system
        // calls (setsid, close_range) and calls the provider's hook, which by contract does
        // the same. Nothing allocates or takes a lock.
        unsafe {
            cmd.pre_exec(move || {
                rustix::process::setsid()?;
                // Nothing the parent opened without O_CLOEXEC reaches the program.
                crate::fds::close_range_cloexec()?;
                match hook.as_mut() {
                    Some(h) => h(&child_stage),
                    None => Ok(()),
                }
            });
        }
        let mut child = match cmd.spawn() {
            Ok(child) => child,
            Err(source) => {
                return Err(match stage.current().and_then(|i| names.get(i)) {
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
        Ok(Running {
            child,
            stdout,
            stderr,
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
        // SAFETY: clearing FD_CLOEXEC on our own open descriptor.
        unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
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
            .before_exec(&["first", "second"], |stage| {
                stage.enter(0);
                stage.enter(1);
                Err(io::Error::from_raw_os_error(libc::EPERM))
            })
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
