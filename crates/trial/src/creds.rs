//! Who the runner is, and what the controller can see of it (docs/trials.md, "Two uids").
//!
//! The runner starts with CAP_SETUID and CAP_SETGID (root in the container with only those two
//! capabilities, or root on a host). While it still has them it starts the launcher
//! (crate::launcher), the one process that keeps the controller uid C; then it drops to its
//! own uid R as real, effective, saved and filesystem uid (gids alike), with no supplementary
//! group, no capability, no_new_privs, not dumpable. Only then does it read anything. The
//! controller (uid C) cannot signal it, ptrace it or read its /proc files.
//!
//! It also re-executes itself with its arguments in a memfd and an empty environment, so
//! /proc/<runner>/cmdline, which any process may read, shows only `--args-fd N`, and
//! /proc/<runner>/environ (closed by the non-dumpable flag on Linux, but readable in gVisor)
//! holds nothing.

use std::ffi::{OsStr, OsString};
use std::io::{self, Read as _, Seek as _, Write as _};
use std::os::fd::AsRawFd as _;
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

/// Becomes uid R and gid R (real, effective, saved, filesystem) with no supplementary
/// groups, no capabilities, no_new_privs set and not dumpable, then checks it in
/// /proc/self/status. Must run while the process has a single thread (capability sets are
/// per thread).
pub fn drop_privileges(ids: &Identities) -> Result<(), DropPrivilegesError> {
    let (r, rg) = (ids.runner_uid, ids.runner_gid);
    // glibc's wrappers apply each change to every thread.
    step(
        "clear the supplementary groups",
        plimsoll_sys::ids::clear_process_groups(),
    )?;
    step(
        "set the gids",
        plimsoll_sys::ids::set_process_res_gid(rg, rg, rg),
    )?;
    // With every uid now non-zero, the kernel clears the permitted and effective capability
    // sets (they are also cleared explicitly below).
    step(
        "set the uids",
        plimsoll_sys::ids::set_process_res_uid(r, r, r),
    )?;
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
    // gVisor has no ambient capabilities and answers EINVAL; the status check below still
    // reads CapAmb where the kernel has it.
    match rustix::thread::clear_ambient_capability_set() {
        Ok(()) | Err(rustix::io::Errno::INVAL) => {}
        Err(e) => {
            return Err(DropPrivilegesError::Step {
                step: "clear the ambient capabilities",
                source: e.into(),
            });
        }
    }
    rustix::thread::set_no_new_privs(true).map_err(|e| DropPrivilegesError::Step {
        step: "set no_new_privs",
        source: e.into(),
    })?;
    make_undumpable().map_err(|source| DropPrivilegesError::Step {
        step: "make the runner not dumpable",
        source,
    })?;
    check_status([r; 4], [rg; 4]).map_err(DropPrivilegesError::Check)
}

fn step(step: &'static str, done: io::Result<()>) -> Result<(), DropPrivilegesError> {
    done.map_err(|source| DropPrivilegesError::Step { step, source })
}

/// Reads /proc/self/status and checks the ids (real, effective, saved, filesystem), the
/// groups, the capabilities and no_new_privs.
pub(crate) fn check_status(uids: [u32; 4], gids: [u32; 4]) -> Result<(), String> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| format!("cannot read /proc/self/status: {e}"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
            .ok_or_else(|| format!("/proc/self/status has no {name}"))
    };
    let tabbed = |ids: [u32; 4]| {
        ids.iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join("\t")
    };
    let (want_uid, want_gid) = (tabbed(uids), tabbed(gids));
    let mut wrong = Vec::new();
    let zero = "0000000000000000";
    // CapAmb is absent where the kernel has no ambient capabilities (gVisor).
    for (name, want, required) in [
        ("Uid:", want_uid.as_str(), true),
        ("Gid:", want_gid.as_str(), true),
        ("Groups:", "", true),
        ("CapInh:", zero, true),
        ("CapPrm:", zero, true),
        ("CapEff:", zero, true),
        ("CapAmb:", zero, false),
    ] {
        let got = match field(name) {
            Ok(got) => got,
            Err(_) if !required => continue,
            Err(e) => return Err(e),
        };
        if got != want {
            wrong.push(format!("{name} is `{got}`, not `{want}`"));
        }
    }
    if rustix::thread::no_new_privs() != Ok(true) {
        wrong.push("no_new_privs is not set".into());
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

/// Whether this process holds any capability (effective or permitted), from
/// /proc/self/status; an unreadable status counts as holding some.
pub fn holds_capabilities() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return true;
    };
    ["CapEff:", "CapPrm:"].iter().any(|name| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .is_none_or(|v| u64::from_str_radix(v.trim(), 16) != Ok(0))
    })
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
/// memfd and re-executes the runner with only `--args-fd N` and an empty environment (the
/// runner reads no environment variable), which does not return; in the re-executed runner,
/// reads them back from the descriptor and closes it.
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
        reason = "exec of this very program (no fork), the memfd kept on purpose"
    )]
    let err = std::process::Command::new("/proc/self/exe")
        .arg0(&argv0)
        .arg(ARGS_FD_FLAG)
        .arg(fd.to_string())
        .env_clear()
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
    // Handed over by the runner that exec'ed us; nothing else in this process owns it.
    let owned = plimsoll_sys::fds::adopt_inherited(fd)?;
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
