//! The runtime driver: how crun, runc and runsc are invoked (global flags, the state root,
//! crun's cgroup workaround) for `create`, `start`, `kill`, `delete -f`, `list` and
//! `--version`.
//!
//! Every invocation goes through [`plimsoll_sandbox::Spawn`] (empty environment, no inherited
//! descriptors, own session). crun on a hybrid cgroup layout (cgroup v1 plus a cgroup2 mount
//! holding controllers) refuses to run; each crun child therefore first moves into a mount
//! namespace of its own, made a slave of the host's, and unmounts the cgroup2 mount there.
//! That happens in the child between fork and exec: `unshare` in the multithreaded daemon
//! would only move one thread.

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use plimsoll_sandbox::{CaptureLimits, PreExec, Running, Spawn, SpawnError, Step, capture};
use plimsoll_sys::mount::Propagation;
use plimsoll_wire::Tier;

/// The OCI runtimes plimsoll drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RuntimeKind {
    /// crun: the container tier, cheapest.
    Crun,
    /// runc: the container tier, the reference runtime.
    Runc,
    /// gVisor's runsc: the kernel tier (a user-space kernel between the code and the host).
    Runsc,
}

impl RuntimeKind {
    /// Every kind, cheapest first.
    pub const ALL: [RuntimeKind; 3] = [RuntimeKind::Crun, RuntimeKind::Runc, RuntimeKind::Runsc];

    /// The provider name: `crun`, `runc` or `runsc`.
    pub fn name(self) -> &'static str {
        match self {
            RuntimeKind::Crun => "crun",
            RuntimeKind::Runc => "runc",
            RuntimeKind::Runsc => "runsc",
        }
    }

    /// Where Debian installs the binary.
    pub fn default_binary(self) -> &'static str {
        match self {
            RuntimeKind::Crun => "/usr/bin/crun",
            RuntimeKind::Runc => "/usr/sbin/runc",
            RuntimeKind::Runsc => "/usr/bin/runsc",
        }
    }

    /// The tier the runtime is built to give.
    pub fn tier(self) -> Tier {
        match self {
            RuntimeKind::Crun | RuntimeKind::Runc => Tier::Container,
            RuntimeKind::Runsc => Tier::Kernel,
        }
    }

    /// Rough milliseconds of a trivial run (host-findings.md, `/bin/true`).
    pub fn cost(self) -> u32 {
        match self {
            RuntimeKind::Crun => 15,
            RuntimeKind::Runc => 45,
            RuntimeKind::Runsc => 170,
        }
    }

    /// Parses a provider name.
    pub fn from_name(name: &str) -> Option<RuntimeKind> {
        RuntimeKind::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// A runtime command that is not `create` failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeCommandError {
    /// The runtime could not be started.
    #[error("cannot start `{binary} {command}`")]
    Spawn {
        /// The binary.
        binary: PathBuf,
        /// The subcommand.
        command: String,
        /// Why.
        #[source]
        source: SpawnError,
    },
    /// Its output could not be read.
    #[error("cannot read the output of `{binary} {command}`")]
    Capture {
        /// The binary.
        binary: PathBuf,
        /// The subcommand.
        command: String,
        /// Why.
        #[source]
        source: plimsoll_sandbox::CaptureError,
    },
    /// It ran and failed.
    #[error("`{binary} {command}` failed (exit {status}): {stderr}")]
    Status {
        /// The binary.
        binary: PathBuf,
        /// The subcommand.
        command: String,
        /// Exit status, or `signal N`.
        status: String,
        /// The first lines of its standard error.
        stderr: String,
    },
}

/// How a container is brought up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Begin<'a> {
    /// `create`: its process waits in the runtime's init until `start`, so nothing of a run
    /// has begun until then (a project, a trial).
    Create,
    /// `run --detach`: created and started in one invocation, for a process that itself
    /// waits for what it is to run (a member's interpreter, waiting for `go`): one runtime
    /// invocation fewer.
    Run,
    /// `restore --detach --image-path IMAGE` (runsc): created and started from a checkpoint's
    /// image, its processes as they were saved.
    Restore(&'a Path),
}

/// How one runtime binary is driven.
#[derive(Debug, Clone)]
pub struct Runtime {
    kind: RuntimeKind,
    binary: PathBuf,
    root: PathBuf,
    platform: String,
    /// The cgroup2 mount crun must not see (hybrid layout), as a C string for the child.
    hide_unified: Option<CString>,
}

/// What a short runtime command printed.
#[derive(Debug)]
struct CommandOutput {
    stdout: String,
}

const CONTROL_TIMEOUT: Duration = Duration::from_secs(30);
const CONTROL_OUTPUT: u64 = 1024 * 1024;
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl Runtime {
    /// A driver for `binary` of this kind, keeping container state under `root` (the
    /// runtime's `--root`). `platform` is runsc's `--platform`, ignored otherwise.
    /// `hide_unified` is the cgroup2 mount to unmount in crun's own mount namespace (from
    /// [`crate::cgroup::CgroupLayout::crun_must_hide`]); ignored for runc and runsc.
    pub fn new(
        kind: RuntimeKind,
        binary: PathBuf,
        root: PathBuf,
        platform: String,
        hide_unified: Option<&Path>,
    ) -> Self {
        let hide_unified = match kind {
            RuntimeKind::Crun => {
                hide_unified.and_then(|p| CString::new(p.as_os_str().as_bytes()).ok())
            }
            _ => None,
        };
        Runtime {
            kind,
            binary,
            root,
            platform,
            hide_unified,
        }
    }

    /// The runtime kind.
    pub fn kind(&self) -> RuntimeKind {
        self.kind
    }

    /// The binary.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// The state root given as `--root`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether crun children unmount a cgroup2 mount first.
    pub fn hides_unified(&self) -> bool {
        self.hide_unified.is_some()
    }

    /// The global flags, in order, before the subcommand.
    pub fn global_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec!["--root".into(), self.root.clone().into()];
        if self.kind == RuntimeKind::Runsc {
            args.push(format!("--platform={}", self.platform).into());
            args.push("--network=none".into());
            // The config's seccomp profile (the namespace deny list) applied inside.
            args.push("--oci-seccomp".into());
        }
        args
    }

    /// The full argument list of `create` (after the global flags), or with `Begin::Run` of
    /// `run --detach` (created and started in one invocation).
    pub fn create_args(
        bundle: &Path,
        id: &str,
        pid_file: &Path,
        begin: Begin<'_>,
    ) -> Vec<OsString> {
        let mut args: Vec<OsString> = match begin {
            Begin::Create => vec!["create".into()],
            Begin::Run => vec!["run".into(), "--detach".into()],
            Begin::Restore(image) => vec![
                "restore".into(),
                "--detach".into(),
                "--image-path".into(),
                image.into(),
            ],
        };
        args.extend([
            "--bundle".into(),
            bundle.into(),
            "--pid-file".into(),
            pid_file.into(),
            id.into(),
        ]);
        args
    }

    fn command(&self, args: &[OsString]) -> Spawn {
        let spawn = Spawn::new(&self.binary, "/")
            .env("PATH", PATH)
            .args(self.global_args())
            .args(args);
        match self.hide_unified.clone() {
            Some(unified) => spawn.before_exec(
                PreExec::new()
                    .step(
                        "unshare(CLONE_NEWNS) and make / a recursive slave mount",
                        // Slave: nothing below propagates back to the host.
                        Step::MountNamespace(Propagation::Slave),
                    )
                    .step(
                        "unmount the cgroup2 mount",
                        // Not mounted (any more): nothing to hide.
                        Step::Unmount {
                            target: unified,
                            missing_ok: true,
                        },
                    ),
            ),
            None => spawn,
        }
    }

    /// Starts `create` for the bundle: the container's process, waiting for `start`,
    /// inherits the pipes of the returned child as its stdout and stderr. `host_sockets`: the
    /// container connects to a host Unix socket bound into it (the broker); runsc needs
    /// `--host-uds=open` for that, crun and runc nothing.
    pub fn spawn_create(
        &self,
        bundle: &Path,
        id: &str,
        pid_file: &Path,
        host_sockets: bool,
        stdin: bool,
        begin: Begin<'_>,
    ) -> Result<Running, SpawnError> {
        let mut args = Vec::new();
        if host_sockets && self.kind == RuntimeKind::Runsc {
            args.push(OsString::from("--host-uds=open"));
        }
        args.extend(Runtime::create_args(bundle, id, pid_file, begin));
        let command = self.command(&args);
        // The container's process inherits `create`'s standard input (pass-through).
        if stdin { command.stdin_pipe() } else { command }.spawn()
    }

    /// `start ID`: lets a created container's process run the code.
    pub fn start(&self, id: &str) -> Result<(), RuntimeCommandError> {
        self.control(&["start", id]).map(|_| ())
    }

    fn control(&self, args: &[&str]) -> Result<CommandOutput, RuntimeCommandError> {
        let command = args.join(" ");
        let os: Vec<OsString> = args.iter().map(OsString::from).collect();
        let running = self
            .command(&os)
            .spawn()
            .map_err(|source| RuntimeCommandError::Spawn {
                binary: self.binary.clone(),
                command: command.clone(),
                source,
            })?;
        let captured = capture(
            running,
            &CaptureLimits::new(CONTROL_OUTPUT, CONTROL_TIMEOUT),
        )
        .map_err(|source| RuntimeCommandError::Capture {
            binary: self.binary.clone(),
            command: command.clone(),
            source,
        })?;
        if captured.exit_code != Some(0) {
            let status = match (captured.exit_code, captured.signal) {
                (Some(c), _) => c.to_string(),
                (None, Some(s)) => format!("signal {s}"),
                (None, None) => "unknown".into(),
            };
            let stderr = String::from_utf8_lossy(&captured.stderr);
            let stderr: Vec<&str> = stderr
                .lines()
                .filter(|l| !l.trim().is_empty())
                .take(3)
                .collect();
            return Err(RuntimeCommandError::Status {
                binary: self.binary.clone(),
                command,
                status,
                stderr: stderr.join(" / "),
            });
        }
        Ok(CommandOutput {
            stdout: String::from_utf8_lossy(&captured.stdout).into_owned(),
        })
    }

    /// `checkpoint --image-path IMAGE ID` (runsc): saves the container whole into the
    /// directory `image` and stops it. Never `--leave-running`, which at this runsc restores
    /// the container as a child of the command and does not return.
    pub fn checkpoint(&self, id: &str, image: &Path) -> Result<(), RuntimeCommandError> {
        let image = image.to_string_lossy();
        self.control(&["checkpoint", "--image-path", &image, id])
            .map(|_| ())
    }

    /// `kill ID KILL`: ends the container's init (and with it its pid namespace).
    pub fn kill(&self, id: &str) -> Result<(), RuntimeCommandError> {
        self.control(&["kill", id, "KILL"]).map(|_| ())
    }

    /// `delete --force ID`: kills what is left and removes the container and its cgroup.
    pub fn delete_force(&self, id: &str) -> Result<(), RuntimeCommandError> {
        self.control(&["delete", "--force", id]).map(|_| ())
    }

    /// The ids of every container under the state root (`list -q`).
    pub fn list(&self) -> Result<Vec<String>, RuntimeCommandError> {
        if !self.root.exists() {
            return Ok(Vec::new());
        }
        let out = self.control(&["list", "--quiet"])?;
        Ok(out
            .stdout
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect())
    }

    /// Whether the state root holds anything for this container (its state directory or,
    /// for runsc, its state files).
    pub fn has_state(&self, id: &str) -> bool {
        let Ok(dir) = std::fs::read_dir(&self.root) else {
            return false;
        };
        dir.flatten().any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name == id || name.starts_with(&format!("{id}_")) || name.contains(&format!(":{id}."))
        })
    }

    /// The runtime's helper processes for a created container that outlive `create` beside
    /// the container's own process: runsc's gofer (`goferPid` of its state file); none for
    /// crun and runc.
    pub fn helper_pids(&self, id: &str) -> Vec<rustix::process::Pid> {
        if self.kind != RuntimeKind::Runsc {
            return Vec::new();
        }
        let path = self.root.join(format!("{id}_sandbox:{id}.state"));
        let Ok(text) = std::fs::read(&path) else {
            return Vec::new();
        };
        serde_json::from_slice::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v.get("goferPid")?.as_i64())
            .and_then(|p| rustix::process::Pid::from_raw(i32::try_from(p).ok()?))
            .into_iter()
            .collect()
    }

    /// `--version`, as one line (`crun version 1.8.1 (commit ...)`).
    pub fn version(&self) -> Result<String, RuntimeCommandError> {
        let out = Spawn::new(&self.binary, "/")
            .env("PATH", PATH)
            .arg("--version")
            .as_nobody()
            .spawn()
            .map_err(|source| RuntimeCommandError::Spawn {
                binary: self.binary.clone(),
                command: "--version".into(),
                source,
            })?;
        let captured =
            capture(out, &CaptureLimits::new(64 * 1024, CONTROL_TIMEOUT)).map_err(|source| {
                RuntimeCommandError::Capture {
                    binary: self.binary.clone(),
                    command: "--version".into(),
                    source,
                }
            })?;
        let text = String::from_utf8_lossy(&captured.stdout);
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('+'))
            .collect();
        if captured.exit_code != Some(0) || lines.is_empty() {
            return Err(RuntimeCommandError::Status {
                binary: self.binary.clone(),
                command: "--version".into(),
                status: format!("{:?}", captured.exit_code),
                stderr: String::from_utf8_lossy(&captured.stderr).trim().to_owned(),
            });
        }
        Ok(lines.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_costs_and_tiers() {
        for k in RuntimeKind::ALL {
            assert_eq!(RuntimeKind::from_name(k.name()), Some(k));
        }
        assert!(RuntimeKind::Crun.cost() < RuntimeKind::Runc.cost());
        assert!(RuntimeKind::Runc.cost() < RuntimeKind::Runsc.cost());
        assert_eq!(RuntimeKind::Runsc.tier(), Tier::Kernel);
        assert_eq!(RuntimeKind::Crun.tier(), Tier::Container);
        assert_eq!(RuntimeKind::from_name("docker"), None);
    }

    #[test]
    fn global_flags_per_runtime() {
        let rt = |k| {
            Runtime::new(
                k,
                "/x".into(),
                "/run/r".into(),
                "ptrace".into(),
                Some(Path::new("/sys/fs/cgroup/unified")),
            )
        };
        assert_eq!(
            rt(RuntimeKind::Crun).global_args(),
            ["--root", "/run/r"].map(OsString::from)
        );
        assert!(rt(RuntimeKind::Crun).hides_unified());
        assert!(!rt(RuntimeKind::Runc).hides_unified());
        assert_eq!(
            rt(RuntimeKind::Runsc).global_args(),
            [
                "--root",
                "/run/r",
                "--platform=ptrace",
                "--network=none",
                "--oci-seccomp"
            ]
            .map(OsString::from)
        );
        let rest = ["--bundle", "/b", "--pid-file", "/b/pid", "plimsoll-x"];
        for (begin, first) in [
            (Begin::Create, &["create"][..]),
            (Begin::Run, &["run", "--detach"][..]),
        ] {
            let args =
                Runtime::create_args(Path::new("/b"), "plimsoll-x", Path::new("/b/pid"), begin);
            let want: Vec<OsString> = first.iter().chain(&rest).map(OsString::from).collect();
            assert_eq!(args, want, "{begin:?}");
        }
    }
}
