//! What a child does between fork and exec, as data. The child is a copy of a possibly
//! multithreaded process, so it may only make async-signal-safe system calls: no allocation,
//! no lock. A caller lists the [`Step`]s (everything they need, paths as C strings and
//! descriptors, prepared before the fork), and [`PreExec::install`] turns them into the hook
//! that runs them in order. No caller's closure ever runs there.
//!
//! Each step can carry a name; the step the child is in is written to a shared page, so the
//! parent can say which one failed ([`Stages::failed_step`]).

use std::ffi::CString;
use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::process::CommandExt as _;
use std::process::Command;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rustix::mount::MountFlags;
use rustix::process::{Pid, Resource, Signal};

use crate::mount::{self, Propagation};

/// One thing the child does before exec.
#[derive(Debug)]
pub enum Step {
    /// A session (and process group) of its own (setsid(2); not rustix's, which asserts on
    /// gVisor's answer of 0).
    NewSession,
    /// Every descriptor above 2 marked close-on-exec ([`crate::fds::close_range_cloexec`]).
    /// With `required` false, a kernel without close_range's CLOEXEC flag is let pass.
    CloseInherited {
        /// Whether a kernel that cannot do it fails the step.
        required: bool,
    },
    /// Writes `bytes` to `fd` (such as "0" to a cgroup's `cgroup.procs`, which moves the
    /// writer into that cgroup). All of it in one write, or the step fails.
    Write {
        /// Where.
        fd: OwnedFd,
        /// What.
        bytes: &'static [u8],
    },
    /// setrlimit(2).
    Rlimit {
        /// Which.
        resource: Resource,
        /// The soft limit.
        soft: u64,
        /// The hard limit.
        hard: u64,
    },
    /// No supplementary groups (setgroups(2) with an empty list, this thread).
    DropGroups,
    /// setresgid(2) on this thread; `None` leaves that id.
    SetGids(Option<u32>, Option<u32>, Option<u32>),
    /// setresuid(2) on this thread; `None` leaves that id.
    SetUids(Option<u32>, Option<u32>, Option<u32>),
    /// The bounding set reduced to a mask, the ambient set emptied
    /// ([`crate::caps::limit_bounding_set`]).
    LimitBoundingSet(u64),
    /// Effective = permitted = the mask, inheritable empty
    /// ([`crate::caps::set_effective_and_permitted`]).
    SetCapabilities(u64),
    /// `PR_SET_NO_NEW_PRIVS`.
    NoNewPrivs,
    /// `PR_SET_PDEATHSIG`: this signal when the parent thread dies (cleared by a change of
    /// credentials, so after those).
    ParentDeathSignal(Signal),
    /// Fails (ESRCH) when the parent is no longer `0`: it died before the death signal was
    /// armed.
    RequireParent(Pid),
    /// landlock_restrict_self(2) with a ruleset built before the fork.
    Landlock(OwnedFd),
    /// A descriptor at a fixed number, inherited by the program ([`crate::fds::place_at`]).
    PlaceFd {
        /// The descriptor.
        fd: OwnedFd,
        /// Its number in the program.
        at: RawFd,
    },
    /// Several descriptors at fixed numbers at once: first each copied out of the way (a
    /// source may sit on another's target number), then into place. At most four.
    PlaceFds(Vec<(OwnedFd, RawFd)>),
    /// Installs seccomp filters in order (no_new_privs first).
    Seccomp(Vec<crate::seccomp::Filter>),
    /// A mount namespace of its own ([`mount::enter_mount_namespace`]).
    MountNamespace(Propagation),
    /// Unmounts, detached ([`mount::unmount_detached`]).
    Unmount {
        /// The mount point.
        target: CString,
        /// Whether nothing mounted there is fine.
        missing_ok: bool,
    },
    /// A tmpfs ([`mount::mount_tmpfs`]).
    MountTmpfs {
        /// The name it shows in the mount table.
        source: CString,
        /// Where.
        target: CString,
        /// Its flags.
        flags: MountFlags,
        /// Its options (`size=...,mode=...`).
        data: CString,
    },
    /// mkdir(2).
    Mkdir {
        /// The directory.
        path: CString,
        /// Its mode.
        mode: u32,
    },
    /// symlink(2).
    Symlink {
        /// What the link points to.
        target: CString,
        /// The link.
        link: CString,
    },
    /// A read-only bind mount ([`mount::bind_read_only`]).
    BindReadOnly {
        /// What.
        source: CString,
        /// Where (created, as an empty file, when `is_dir` is false).
        target: CString,
        /// Whether it is a directory.
        is_dir: bool,
        /// Whether device nodes work through it (no `nodev`).
        device: bool,
    },
    /// A character device node, owned by `uid`:`gid` ([`mount::char_device`]).
    CharDevice {
        /// The node.
        path: CString,
        /// Its device number.
        dev: u64,
        /// Its mode (permission bits).
        mode: u32,
        /// Its owner.
        uid: u32,
        /// Its group.
        gid: u32,
    },
    /// pivot_root(2) into `root` with the old root detached ([`mount::pivot_into`]).
    PivotRoot(CString),
    /// The new root remounted read-only and nosuid.
    RemountRootReadOnly,
}

impl Step {
    /// No core dumps: `RLIMIT_CORE` 0, soft and hard.
    pub fn no_core_dumps() -> Step {
        Step::Rlimit {
            resource: Resource::Core,
            soft: 0,
            hard: 0,
        }
    }

    /// Runs the step in the calling process. Async-signal-safe.
    fn run(&self) -> io::Result<()> {
        use rustix::process::{Gid, Uid};
        match self {
            Step::NewSession => crate::process::new_session(),
            Step::CloseInherited { required } => match crate::fds::close_range_cloexec() {
                Err(e) if *required || !crate::fds::close_range_unsupported(&e) => Err(e),
                _ => Ok(()),
            },
            Step::Write { fd, bytes } => {
                if rustix::io::write(fd, bytes)? == bytes.len() {
                    Ok(())
                } else {
                    Err(io::Error::from_raw_os_error(libc::EIO))
                }
            }
            Step::Rlimit {
                resource,
                soft,
                hard,
            } => Ok(rustix::process::setrlimit(
                *resource,
                rustix::process::Rlimit {
                    current: Some(*soft),
                    maximum: Some(*hard),
                },
            )?),
            Step::DropGroups => Ok(rustix::thread::set_thread_groups(&[])?),
            Step::SetGids(r, e, s) => Ok(rustix::thread::set_thread_res_gid(
                r.map(Gid::from_raw),
                e.map(Gid::from_raw),
                s.map(Gid::from_raw),
            )?),
            Step::SetUids(r, e, s) => Ok(rustix::thread::set_thread_res_uid(
                r.map(Uid::from_raw),
                e.map(Uid::from_raw),
                s.map(Uid::from_raw),
            )?),
            Step::LimitBoundingSet(keep) => {
                crate::caps::limit_bounding_set(*keep);
                Ok(())
            }
            Step::SetCapabilities(caps) => crate::caps::set_effective_and_permitted(*caps),
            Step::NoNewPrivs => Ok(rustix::thread::set_no_new_privs(true)?),
            Step::ParentDeathSignal(signal) => Ok(
                rustix::process::set_parent_process_death_signal(Some(*signal))?,
            ),
            Step::RequireParent(parent) => {
                if rustix::process::getppid() == Some(*parent) {
                    Ok(())
                } else {
                    Err(io::Error::from_raw_os_error(libc::ESRCH))
                }
            }
            Step::Landlock(ruleset) => crate::landlock::restrict_self(ruleset),
            Step::PlaceFd { fd, at } => crate::fds::place_at(fd, *at),
            Step::PlaceFds(fds) => {
                let mut high: [Option<OwnedFd>; 4] = [None, None, None, None];
                if fds.len() > high.len() {
                    return Err(io::Error::from_raw_os_error(libc::EINVAL));
                }
                for (slot, (fd, _)) in high.iter_mut().zip(fds) {
                    *slot = Some(rustix::io::fcntl_dupfd_cloexec(fd, 100)?);
                }
                for (copy, (_, at)) in high.iter().zip(fds) {
                    if let Some(copy) = copy {
                        crate::fds::place_at(copy, *at)?;
                    }
                }
                Ok(())
            }
            Step::Seccomp(filters) => {
                for f in filters {
                    f.install()?;
                }
                Ok(())
            }
            Step::MountNamespace(p) => mount::enter_mount_namespace(*p),
            Step::Unmount { target, missing_ok } => {
                match mount::unmount_detached(target) {
                    // Not mounted (any more), or not there.
                    Err(e)
                        if *missing_ok
                            && matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOENT)) =>
                    {
                        Ok(())
                    }
                    r => r,
                }
            }
            Step::MountTmpfs {
                source,
                target,
                flags,
                data,
            } => mount::mount_tmpfs(source, target, *flags, data),
            Step::Mkdir { path, mode } => Ok(rustix::fs::mkdir(
                path.as_c_str(),
                rustix::fs::Mode::from_raw_mode(*mode),
            )?),
            Step::Symlink { target, link } => {
                Ok(rustix::fs::symlink(target.as_c_str(), link.as_c_str())?)
            }
            Step::BindReadOnly {
                source,
                target,
                is_dir,
                device,
            } => mount::bind_read_only(source, target, *is_dir, *device),
            Step::CharDevice {
                path,
                dev,
                mode,
                uid,
                gid,
            } => mount::char_device(path, *dev, *mode, *uid, *gid),
            Step::PivotRoot(root) => mount::pivot_into(root),
            Step::RemountRootReadOnly => mount::remount_root_read_only(),
        }
    }
}

/// The steps a child takes between fork and exec, in order.
#[derive(Debug, Default)]
pub struct PreExec {
    steps: Vec<(Option<&'static str>, Step)>,
}

impl PreExec {
    /// No steps.
    pub fn new() -> Self {
        PreExec::default()
    }

    /// Adds a step whose failure is named `name` ([`Stages::failed_step`]).
    pub fn step(mut self, name: &'static str, step: Step) -> Self {
        self.steps.push((Some(name), step));
        self
    }

    /// Adds the steps that make the child `uid`:`gid` for good, holding nothing of root's:
    /// its bounding set emptied (first, while still root: emptying it needs CAP_SETPCAP; the
    /// ambient set goes with it), no supplementary groups, every gid and then every uid set
    /// (the uid change clears the permitted and effective sets), and no_new_privs.
    pub fn become_user(self, uid: u32, gid: u32) -> Self {
        let (uid, gid) = (Some(uid), Some(gid));
        self.step("empty the bounding set", Step::LimitBoundingSet(0))
            .step("drop the groups", Step::DropGroups)
            .step("set the gids", Step::SetGids(gid, gid, gid))
            .step("set the uids", Step::SetUids(uid, uid, uid))
            .step("no_new_privs", Step::NoNewPrivs)
    }

    /// Adds a step without a name (its failure reads as a failure to start at all).
    pub fn unnamed(mut self, step: Step) -> Self {
        self.steps.push((None, step));
        self
    }

    /// Adds every step of `other`, after these.
    pub fn extend(mut self, other: PreExec) -> Self {
        self.steps.extend(other.steps);
        self
    }

    /// Whether there is no step.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The names of the steps, in order (unnamed ones left out).
    pub fn names(&self) -> Vec<&'static str> {
        self.steps.iter().filter_map(|(n, _)| *n).collect()
    }

    /// Makes `cmd`'s child run the steps between fork and exec (after any hook installed
    /// before), without noting which step it is in: a failure reads as the spawn's error
    /// alone. Cannot fail.
    pub fn install_untracked(self, cmd: &mut Command) {
        let steps = self.steps;
        // SAFETY: as in `install`: the closure only runs the steps, each of which makes
        // async-signal-safe system calls on values prepared before the fork.
        unsafe {
            cmd.pre_exec(move || {
                for (_, step) in &steps {
                    step.run()?;
                }
                Ok(())
            });
        }
    }

    /// Makes `cmd`'s child run the steps between fork and exec (after any hook installed
    /// before). The returned [`Stages`] says, after a failed spawn, which step failed.
    pub fn install(self, cmd: &mut Command) -> io::Result<Stages> {
        let page = Arc::new(StagePage::new()?);
        let child_page = Arc::clone(&page);
        let steps = self.steps;
        let names: Vec<Option<&'static str>> = steps.iter().map(|(n, _)| *n).collect();
        // SAFETY: the closure runs in the forked child before exec. It only runs the steps
        // above, each of which makes async-signal-safe system calls on values prepared
        // before the fork (`Step::run`), and stores an integer in a shared page: nothing
        // allocates, nothing takes a lock, no caller's code runs.
        unsafe {
            cmd.pre_exec(move || {
                for (i, (_, step)) in steps.iter().enumerate() {
                    child_page.enter(i);
                    step.run()?;
                }
                Ok(())
            });
        }
        Ok(Stages { page, names })
    }
}

/// Which step a child was in, read after a failed spawn.
#[derive(Debug)]
pub struct Stages {
    page: Arc<StagePage>,
    names: Vec<Option<&'static str>>,
}

impl Stages {
    /// The name of the step the child entered last, if it has one: after a failed spawn,
    /// the step that failed (`None`: an unnamed step, fork, or exec).
    pub fn failed_step(&self) -> Option<&'static str> {
        self.page
            .current()
            .and_then(|i| self.names.get(i).copied().flatten())
    }
}

/// A shared anonymous page holding one atomic index, so the child's writes are visible to
/// the parent.
#[derive(Debug)]
struct StagePage {
    page: NonNull<AtomicUsize>,
}

// SAFETY: the page is only touched through the atomic, and it lives as long as the value.
unsafe impl Send for StagePage {}
// SAFETY: as above: all access goes through an AtomicUsize.
unsafe impl Sync for StagePage {}

const NO_STAGE: usize = usize::MAX;
const PAGE: usize = 4096;

impl StagePage {
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
        Ok(StagePage { page })
    }

    fn enter(&self, index: usize) {
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

impl Drop for StagePage {
    fn drop(&mut self) {
        // SAFETY: the mapping was made in `new` with this size and is not used after this.
        let _ = unsafe { rustix::mm::munmap(self.page.as_ptr().cast(), PAGE) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;
    use std::process::Stdio;

    fn run(pre: PreExec, script: &str) -> (io::Result<String>, Stages) {
        #[expect(clippy::disallowed_methods, reason = "a test of the hook itself")]
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        let stages = pre.install(&mut cmd).unwrap();
        let out = cmd.spawn().map(|mut c| {
            let mut s = String::new();
            c.stdout.take().unwrap().read_to_string(&mut s).unwrap();
            c.wait().unwrap();
            s
        });
        (out, stages)
    }

    #[test]
    fn a_failing_step_is_named() {
        let pre = PreExec::new()
            .step("first", Step::NoNewPrivs)
            .step("second", Step::RequireParent(Pid::from_raw(1).unwrap()));
        let (out, stages) = run(pre, "true");
        // The child's parent is this test, which is not PID 1 (or it is, and the step passes).
        if rustix::process::getpid().as_raw_nonzero().get() != 1 {
            assert!(out.is_err());
            assert_eq!(stages.failed_step(), Some("second"));
        }
    }

    #[test]
    fn steps_take_effect_in_the_child() {
        let null = std::fs::File::open("/dev/null").unwrap();
        let pre = PreExec::new()
            .unnamed(Step::NewSession)
            .step("no_new_privs", Step::NoNewPrivs)
            .step(
                "rlimit",
                Step::Rlimit {
                    resource: Resource::Core,
                    soft: 0,
                    hard: 0,
                },
            )
            .step(
                "fd",
                Step::PlaceFd {
                    fd: rustix::io::dup(&null).unwrap(),
                    at: 57,
                },
            );
        let (out, stages) = run(
            pre,
            "grep NoNewPrivs /proc/self/status; ulimit -c; test -e /proc/self/fd/57 && echo fd; \
             test \"$(cut -d' ' -f6 /proc/self/stat)\" = $$ && echo leader",
        );
        let out = out.unwrap();
        assert!(out.contains("NoNewPrivs:\t1"), "{out}");
        assert!(out.lines().any(|l| l == "0"), "{out}");
        assert!(out.lines().any(|l| l == "fd"), "{out}");
        assert!(out.lines().any(|l| l == "leader"), "{out}");
        assert_eq!(stages.failed_step(), Some("fd"));
    }

    #[test]
    fn descriptors_are_placed_even_when_one_sits_on_anothers_number() {
        let a = std::fs::File::open("/dev/null").unwrap();
        let b = std::fs::File::open("/dev/zero").unwrap();
        let pre = PreExec::new().step(
            "fds",
            Step::PlaceFds(vec![
                (rustix::io::dup(&a).unwrap(), 60),
                (rustix::io::dup(&b).unwrap(), 61),
            ]),
        );
        let (out, _) = run(pre, "readlink /proc/self/fd/60 /proc/self/fd/61");
        assert_eq!(out.unwrap(), "/dev/null\n/dev/zero\n");
        assert_eq!(
            PreExec::new()
                .step("a", Step::NoNewPrivs)
                .unnamed(Step::NoNewPrivs)
                .names(),
            ["a"]
        );
    }
}
