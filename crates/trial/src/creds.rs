//! Who the runner is, and what the controller can see of it (docs/trials.md, "Two uids").
//!
//! The runner starts with CAP_SETUID and CAP_SETGID (root in the container with only those two
//! capabilities, or root on a host) and, before it reads any scenario, becomes
//! `ruid=R euid=C suid=R fsuid=R` (and the same shape for gids), with no capability left, no
//! supplementary group and no_new_privs, where R is the runner's uid and C the controller's:
//! - it touches files as R (fsuid), so scenario files and trajectories are R's;
//! - the controller (ruid=euid=suid=C) cannot signal it (the kernel compares the sender's ids
//!   with the target's real and saved uid, both R) nor ptrace it or read its /proc files
//!   (that needs all three of its uids to be C, and it is not dumpable anyway);
//! - it can start the controller as C (an unprivileged process may set any uid it holds) and
//!   signal every process of C (its euid is C) without any capability.
//!
//! It also re-executes itself with its arguments in a memfd, so /proc/<runner>/cmdline, which
//! any process may read, shows only `--args-fd N`.

use std::ffi::{OsStr, OsString};
use std::io::{self, Read as _, Seek as _, Write as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::process::CommandExt as _;

use rustix::process::DumpableBehavior;

/// The argument that marks the re-executed runner.
pub const ARGS_FD_FLAG: &str = "--args-fd";

/// The uids and gids of the runner and the controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identities {
    /// The runner's uid (R).
    pub runner_uid: u32,
    /// The runner's gid.
    pub runner_gid: u32,
    /// The controller's uid (C).
    pub controller_uid: u32,
    /// The controller's gid.
    pub controller_gid: u32,
}

/// The identities given are not usable.
#[derive(Debug, thiserror::Error)]
pub enum IdentitiesError {
    /// 0 is never a runner or controller id.
    #[error("uid and gid 0 are refused for the runner and the controller")]
    Root,
    /// The runner and the controller must differ.
    #[error("the controller must run as another uid and gid than the runner (both are {0})")]
    Same(&'static str),
}

impl Identities {
    /// Checks that nothing is 0 and that the two sides differ.
    pub fn validate(&self) -> Result<(), IdentitiesError> {
        if [
            self.runner_uid,
            self.runner_gid,
            self.controller_uid,
            self.controller_gid,
        ]
        .contains(&0)
        {
            return Err(IdentitiesError::Root);
        }
        if self.runner_uid == self.controller_uid {
            return Err(IdentitiesError::Same("uid"));
        }
        if self.runner_gid == self.controller_gid {
            return Err(IdentitiesError::Same("gid"));
        }
        Ok(())
    }
}

/// Dropping privileges failed; nothing was read and nothing started.
#[derive(Debug, thiserror::Error)]
pub enum DropPrivilegesError {
    /// One step failed.
    #[error(
        "cannot {step}: the runner needs CAP_SETUID and CAP_SETGID when it starts (run it as root, or as root in a container that keeps only these two capabilities; docs/trials.md)"
    )]
    Step {
        /// The step.
        step: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The check afterwards found something left.
    #[error("after dropping privileges, {0}")]
    Check(String),
}

/// Makes this process not dumpable: no core dumps, /proc/<pid>/{mem,environ,fd,...} owned by
/// root and closed to ptrace-style access by other uids. The kernel resets the flag when the
/// credentials change and at exec, so this is called again after each.
pub fn make_undumpable() -> io::Result<()> {
    rustix::process::set_dumpable_behavior(DumpableBehavior::NotDumpable)?;
    Ok(())
}

/// Becomes `ruid=R euid=C suid=R fsuid=R` (gids alike), with no supplementary groups, no
/// capabilities, no_new_privs set and not dumpable, then checks it in /proc/self/status.
/// Must run while the process has a single thread (capability sets are per thread).
pub fn drop_privileges(ids: &Identities) -> Result<(), DropPrivilegesError> {
    let step = |step: &'static str, rc: libc::c_int| {
        if rc == 0 {
            Ok(())
        } else {
            Err(DropPrivilegesError::Step {
                step,
                source: io::Error::last_os_error(),
            })
        }
    };
    let (r, c) = (ids.runner_uid, ids.controller_uid);
    let (rg, cg) = (ids.runner_gid, ids.controller_gid);
    // SAFETY: setgroups with an empty list; the glibc wrapper applies it to every thread.
    step("clear the supplementary groups", unsafe {
        libc::setgroups(0, std::ptr::null())
    })?;
    // SAFETY: plain integer arguments; glibc applies the change to every thread.
    step("set the gids", unsafe { libc::setresgid(rg, cg, rg) })?;
    // SAFETY: as above. With every uid now non-zero, the kernel clears the permitted and
    // effective capability sets (we also clear them explicitly below).
    step("set the uids", unsafe { libc::setresuid(r, c, r) })?;
    // setresuid/setresgid set the filesystem ids to the effective ones (C); files are the
    // runner's own. Allowed without privilege: R is the real and saved id.
    // SAFETY: plain integer arguments; the call cannot fail in a way that matters here (the
    // check below reads the result back).
    unsafe {
        libc::setfsgid(rg);
        libc::setfsuid(r);
    }
    let none = rustix::thread::CapabilitySet::empty();
    rustix::thread::set_capabilities(
        None,
        rustix::thread::CapabilitySets {
            effective: none,
            permitted: none,
            inheritable: none,
        },
    )
    .map_err(|e| DropPrivilegesError::Step {
        step: "clear the capabilities",
        source: e.into(),
    })?;
    rustix::thread::clear_ambient_capability_set().map_err(|e| DropPrivilegesError::Step {
        step: "clear the ambient capabilities",
        source: e.into(),
    })?;
    rustix::thread::set_no_new_privs(true).map_err(|e| DropPrivilegesError::Step {
        step: "set no_new_privs",
        source: e.into(),
    })?;
    make_undumpable().map_err(|source| DropPrivilegesError::Step {
        step: "make the runner not dumpable",
        source,
    })?;
    check_status(ids).map_err(DropPrivilegesError::Check)
}

/// Reads /proc/self/status and checks the ids, groups, capabilities and flags.
fn check_status(ids: &Identities) -> Result<(), String> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| format!("cannot read /proc/self/status: {e}"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
            .ok_or_else(|| format!("/proc/self/status has no {name}"))
    };
    let want_uid = format!(
        "{r}\t{c}\t{r}\t{r}",
        r = ids.runner_uid,
        c = ids.controller_uid
    );
    let want_gid = format!(
        "{r}\t{c}\t{r}\t{r}",
        r = ids.runner_gid,
        c = ids.controller_gid
    );
    let mut wrong = Vec::new();
    for (name, want) in [
        ("Uid:", want_uid.as_str()),
        ("Gid:", want_gid.as_str()),
        ("Groups:", ""),
        ("CapInh:", "0000000000000000"),
        ("CapPrm:", "0000000000000000"),
        ("CapEff:", "0000000000000000"),
        ("CapAmb:", "0000000000000000"),
        ("NoNewPrivs:", "1"),
    ] {
        let got = field(name)?;
        if got != want {
            wrong.push(format!("{name} is `{got}`, not `{want}`"));
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

/// Hiding the command line failed.
#[derive(Debug, thiserror::Error)]
pub enum ReexecError {
    /// Writing the arguments to a memfd failed.
    #[error("cannot store the arguments in a memfd")]
    Memfd(#[source] io::Error),
    /// exec of /proc/self/exe failed.
    #[error("cannot re-execute the runner through /proc/self/exe (is /proc mounted?)")]
    Exec(#[source] io::Error),
    /// Reading the arguments back failed.
    #[error("cannot read the arguments from descriptor {0}")]
    Read(i32, #[source] io::Error),
}

/// The arguments (without argv\[0\]). If they are not the `--args-fd N` form, stores them in a
/// memfd and re-executes the runner with only `--args-fd N`, which does not return; in the
/// re-executed runner, reads them back from the descriptor and closes it.
pub fn args_with_hidden_command_line() -> Result<Vec<OsString>, ReexecError> {
    let mut argv: Vec<OsString> = std::env::args_os().collect();
    let argv0 = if argv.is_empty() {
        OsString::from("plimsoll-trial-runner")
    } else {
        argv.remove(0)
    };
    if let [flag, fd] = argv.as_slice()
        && flag == ARGS_FD_FLAG
    {
        let fd: i32 = fd
            .to_str()
            .and_then(|s| s.parse().ok())
            .filter(|fd| *fd > 2)
            .ok_or_else(|| {
                ReexecError::Read(-1, io::Error::other("the descriptor is not a number > 2"))
            })?;
        // exec of /proc/self/exe names the process `exe`; give it its name back (ps, top).
        let _ = rustix::thread::set_name(c"plimsoll-trial");
        return read_args(fd).map_err(|e| ReexecError::Read(fd, e));
    }
    let mut memfd = std::fs::File::from(
        rustix::fs::memfd_create("plimsoll-trial-args", rustix::fs::MemfdFlags::empty())
            .map_err(|e| ReexecError::Memfd(e.into()))?,
    );
    let mut bytes = Vec::new();
    for a in &argv {
        bytes.extend_from_slice(a.as_bytes());
        bytes.push(0);
    }
    memfd.write_all(&bytes).map_err(ReexecError::Memfd)?;
    memfd.rewind().map_err(ReexecError::Memfd)?;
    let fd = memfd.as_raw_fd();
    #[allow(
        clippy::disallowed_methods,
        reason = "exec of this very program (no fork): the environment and the memfd are kept on purpose"
    )]
    let err = std::process::Command::new("/proc/self/exe")
        .arg0(&argv0)
        .arg(ARGS_FD_FLAG)
        .arg(fd.to_string())
        .exec();
    Err(ReexecError::Exec(err))
}

fn read_args(fd: i32) -> io::Result<Vec<OsString>> {
    // The descriptor must be open and be the memfd we made.
    let path = std::fs::read_link(format!("/proc/self/fd/{fd}"))?;
    if !path
        .as_os_str()
        .as_bytes()
        .starts_with(b"/memfd:plimsoll-trial-args")
    {
        return Err(io::Error::other(format!(
            "descriptor {fd} is {}, not the runner's argument memfd",
            path.display()
        )));
    }
    // SAFETY: the descriptor is open (checked above) and was handed over by the runner that
    // exec'ed us; nothing else in this process owns it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut bytes = Vec::new();
    std::fs::File::from(owned).read_to_end(&mut bytes)?;
    // Each argument ends with a NUL.
    let Some(body) = bytes.strip_suffix(&[0]) else {
        return Ok(Vec::new());
    };
    Ok(body
        .split(|b| *b == 0)
        .map(|a| OsStr::from_bytes(a).to_owned())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_must_differ_and_not_be_root() {
        let ok = Identities {
            runner_uid: 1000,
            runner_gid: 1000,
            controller_uid: 1001,
            controller_gid: 1001,
        };
        ok.validate().unwrap();
        for bad in [
            Identities {
                runner_uid: 0,
                ..ok
            },
            Identities {
                controller_gid: 0,
                ..ok
            },
            Identities {
                controller_uid: 1000,
                ..ok
            },
            Identities {
                controller_gid: 1000,
                ..ok
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
