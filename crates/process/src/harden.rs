//! The hardened child: everything is prepared in the parent (landlock ruleset, seccomp
//! programs, limits), and the child, between fork and exec, only makes system calls in a
//! fixed order: the memory cgroup, rlimits, drop groups, gid, uid, no_new_privs, landlock, the broker channel
//! to its descriptor, seccomp.

use std::os::fd::OwnedFd;
use std::path::Path;

use plimsoll_sandbox::{BROKER_FD, PreExec, ResolvedLimits, Step};
use plimsoll_sys::seccomp::Filter;

use crate::policy::{self, Rlimit};

/// The steps of [`Hardening::into_pre_exec`], named for errors.
pub const STAGES: &[&str] = &[
    "memory_cgroup",
    "rlimits",
    "bounding_set",
    "setgroups",
    "setresgid",
    "setresuid",
    "no_new_privs",
    "landlock",
    "broker_channel",
    "seccomp",
];

/// Everything the child needs, prepared before fork.
#[derive(Debug)]
pub struct Hardening {
    rlimits: [Rlimit; 6],
    uid: u32,
    gid: u32,
    landlock: Option<OwnedFd>,
    filters: Vec<Filter>,
    channel: Option<OwnedFd>,
    cgroup_procs: OwnedFd,
}

/// Preparing the hardening failed (nothing was started).
#[derive(Debug, thiserror::Error)]
pub enum PrepareHardeningError {
    /// The run would be root.
    #[error(
        "refusing to run sandboxed code as uid {uid} / gid {gid}: give runs an unprivileged uid range (sandbox_uid_base)"
    )]
    Root {
        /// The uid asked for.
        uid: u32,
        /// The gid asked for.
        gid: u32,
    },
    /// The landlock ruleset could not be built.
    #[error("cannot build the landlock ruleset")]
    Landlock(#[source] landlock::RulesetError),
    /// The seccomp filters could not be built.
    #[error(transparent)]
    Seccomp(#[from] policy::CompileSeccompError),
    /// A compiled seccomp filter is empty or too long to install.
    #[error("a compiled seccomp filter cannot be installed")]
    Filter(#[source] std::io::Error),
}

impl Hardening {
    /// Prepares the hardening of a run as `uid`:`gid` with `limits`, its code read-only in
    /// `code_dir` and its files in `work_dir`; `channel`, when given, is the sandbox's end of
    /// the broker channel, which the child inherits at [`BROKER_FD`] (and nothing else does);
    /// `cgroup_procs` is the run's memory cgroup's `cgroup.procs`, which the child joins first.
    pub fn prepare(
        limits: &ResolvedLimits,
        uid: u32,
        gid: u32,
        code_dir: &Path,
        work_dir: &Path,
        channel: Option<OwnedFd>,
        cgroup_procs: OwnedFd,
    ) -> Result<Self, PrepareHardeningError> {
        if uid == 0 || gid == 0 {
            return Err(PrepareHardeningError::Root { uid, gid });
        }
        let landlock = policy::landlock_ruleset(code_dir, work_dir)
            .map_err(PrepareHardeningError::Landlock)?;
        Ok(Hardening {
            rlimits: policy::rlimits(limits),
            uid,
            gid,
            landlock,
            filters: policy::seccomp_filters()?
                .iter()
                .map(|p| Filter::new(p.iter().map(|i| (i.code, i.jt, i.jf, i.k))))
                .collect::<Result<_, _>>()
                .map_err(PrepareHardeningError::Filter)?,
            channel,
            cgroup_procs,
        })
    }

    /// The steps the child takes between fork and exec, in a fixed order, as plimsoll-sys
    /// runs them there (system calls only). The calls are per-thread, which in the
    /// single-threaded child is the whole process.
    pub fn into_pre_exec(self) -> PreExec {
        let [
            memory_cgroup,
            rlimits,
            bounding_set,
            setgroups,
            setresgid,
            setresuid,
            no_new_privs,
            landlock,
            broker_channel,
            seccomp,
        ] = STAGES
        else {
            unreachable!("ten stages")
        };
        // "0" moves the writer: the child, and so everything it starts, is in the run's
        // memory cgroup from before the code's first instruction.
        let mut pre = PreExec::new().step(
            memory_cgroup,
            Step::Write {
                fd: self.cgroup_procs,
                bytes: b"0",
            },
        );
        for r in self.rlimits {
            pre = pre.step(
                rlimits,
                Step::Rlimit {
                    resource: r.resource,
                    soft: r.soft,
                    hard: r.hard,
                },
            );
        }
        let (uid, gid) = (Some(self.uid), Some(self.gid));
        pre = pre
            // While still root (emptying it needs CAP_SETPCAP): no capability can ever come
            // back to the code, whatever it execs; the ambient set is emptied with it.
            .step(bounding_set, Step::LimitBoundingSet(0))
            .step(setgroups, Step::DropGroups)
            .step(setresgid, Step::SetGids(gid, gid, gid))
            .step(setresuid, Step::SetUids(uid, uid, uid))
            .step(no_new_privs, Step::NoNewPrivs);
        if let Some(fd) = self.landlock {
            pre = pre.step(landlock, Step::Landlock(fd));
        }
        // The spawn helper marked every inherited descriptor close-on-exec; this one alone is
        // kept, at its fixed number. After landlock, whose ruleset descriptor could sit at
        // that number.
        if let Some(fd) = self.channel {
            pre = pre.step(broker_channel, Step::PlaceFd { fd, at: BROKER_FD });
        }
        pre.step(seccomp, Step::Seccomp(self.filters))
    }
}
