//! The hardened child: everything is prepared in the parent (landlock ruleset, seccomp
//! programs, limits), and the child, between fork and exec, only makes system calls in a
//! fixed order: the memory cgroup, rlimits, drop groups, gid, uid, no_new_privs, landlock, the broker channel
//! to its descriptor, seccomp.

use std::io;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::Path;

use plimsoll_sandbox::{BROKER_FD, ResolvedLimits, Stage};
use rustix::process::{Gid, Uid};

use crate::policy::{self, BpfProgram, Rlimit};

/// The steps of [`Hardening::apply`], named for errors.
pub const STAGES: &[&str] = &[
    "memory_cgroup",
    "rlimits",
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
    filters: Vec<BpfProgram>,
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
            filters: policy::seccomp_filters()?,
            channel,
            cgroup_procs,
        })
    }

    /// Applies it to the calling process. Runs in the forked child: system calls only, no
    /// allocation. The calls are per-thread, which in the single-threaded child is the
    /// whole process.
    pub fn apply(&self, stage: &Stage) -> io::Result<()> {
        stage.enter(0);
        // "0" moves the writer: the child, and so everything it starts, is in the run's
        // memory cgroup from before the code's first instruction.
        rustix::io::write(&self.cgroup_procs, b"0")?;
        stage.enter(1);
        for r in &self.rlimits {
            rustix::process::setrlimit(
                r.resource,
                rustix::process::Rlimit {
                    current: Some(r.soft),
                    maximum: Some(r.hard),
                },
            )?;
        }
        stage.enter(2);
        rustix::thread::set_thread_groups(&[])?;
        stage.enter(3);
        let gid = Gid::from_raw(self.gid);
        rustix::thread::set_thread_res_gid(gid, gid, gid)?;
        stage.enter(4);
        let uid = Uid::from_raw(self.uid);
        rustix::thread::set_thread_res_uid(uid, uid, uid)?;
        stage.enter(5);
        rustix::thread::set_no_new_privs(true)?;
        stage.enter(6);
        if let Some(fd) = &self.landlock {
            // SAFETY: landlock_restrict_self takes a ruleset descriptor we own and a flags
            // word; it touches no memory of ours.
            let rc =
                unsafe { libc::syscall(libc::SYS_landlock_restrict_self, fd.as_raw_fd(), 0u32) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        stage.enter(7);
        if let Some(fd) = &self.channel {
            // The spawn helper marked every inherited descriptor close-on-exec; this one
            // alone is kept, at its fixed number. After landlock, whose ruleset descriptor
            // could sit at that number.
            if fd.as_raw_fd() == BROKER_FD {
                rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())?;
            } else {
                // SAFETY: dup2 between two descriptor numbers; it touches no memory, and the
                // number it replaces was marked close-on-exec by the spawn helper, so nothing
                // the program expects lived there.
                if unsafe { libc::dup2(fd.as_raw_fd(), BROKER_FD) } < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        stage.enter(8);
        for program in &self.filters {
            install_filter(program)?;
        }
        Ok(())
    }
}

/// Installs one seccomp filter on the calling thread (no_new_privs must be set).
fn install_filter(program: &BpfProgram) -> io::Result<()> {
    let len =
        u16::try_from(program.len()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let fprog = libc::sock_fprog {
        len,
        // seccompiler's sock_filter is #[repr(C)] with the kernel's layout.
        filter: program.as_ptr().cast::<libc::sock_filter>().cast_mut(),
    };
    // SAFETY: the kernel copies `len` instructions from `filter`, which points into
    // `program`, alive for the whole call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0u32,
            &fprog as *const libc::sock_fprog,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
