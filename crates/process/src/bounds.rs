//! A run's totals, beyond the per-process rlimits: its work directory is a tmpfs of
//! `disk_bytes` (so all its files together cannot fill the host's disk), and every process of
//! the run lives in a memory cgroup of `memory_bytes` (so all of them together, tmpfs pages
//! included, cannot take the host's memory). Also the reap of what a killed daemon left.
//!
//! The cgroup is `<memory hierarchy>/plimsoll-process/<run directory name>`: cgroup v1's
//! `memory` hierarchy, or the unified hierarchy when it holds the memory controller. The
//! child moves itself in between fork and exec (writing `0` to `cgroup.procs`, opened
//! before the fork), so everything it starts is inside from its first instruction.

use std::fs::{self, File, OpenOptions};
use std::io;

use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use plimsoll_sandbox::cgroup::{CgroupLayout, oom_kills_in};

/// The cgroup (below the memory hierarchy's root) that holds every process-tier run's own.
pub const CGROUP_PARENT: &str = "plimsoll-process";

/// A run's bounds could not be set up (nothing was started).
#[derive(Debug, thiserror::Error)]
pub enum BoundRunError {
    /// No memory controller is mounted.
    #[error(
        "no memory cgroup controller is mounted (neither cgroup v1 `memory` nor cgroup v2 with `memory`): the process tier bounds each run's total memory with one; mount it, or configure another provider"
    )]
    NoMemoryController,
    /// A cgroup file could not be written or made.
    #[error("cannot set up the run's memory cgroup at {path}")]
    Cgroup {
        /// What.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The work tmpfs could not be mounted.
    #[error("cannot mount the run's work tmpfs on {path} (the daemon must be root)")]
    Mount {
        /// Where.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// The host's cgroup layout, read from mountinfo once per process, not per run.
pub fn layout() -> &'static CgroupLayout {
    static LAYOUT: std::sync::OnceLock<CgroupLayout> = std::sync::OnceLock::new();
    LAYOUT.get_or_init(|| CgroupLayout::detect().unwrap_or_default())
}

/// Where the memory controller is mounted, and whether it is cgroup v2.
pub fn memory_hierarchy() -> Option<(PathBuf, bool)> {
    layout().memory_hierarchy().map(|h| (h.mount.clone(), h.v2))
}

/// One run's memory cgroup, with its `cgroup.procs` open for the child to move itself in.
#[derive(Debug)]
pub struct MemoryCgroup {
    dir: PathBuf,
    v2: bool,
    procs: File,
}

impl MemoryCgroup {
    /// The cgroup of the run whose directory is called `name`.
    pub fn path_for(root: &Path, name: &str) -> PathBuf {
        root.join(CGROUP_PARENT).join(name)
    }

    /// Creates the cgroup of run `name` with a limit of `bytes` (memory, and no swap).
    pub fn create(name: &str, bytes: u64) -> Result<Self, BoundRunError> {
        let (root, v2) = memory_hierarchy().ok_or(BoundRunError::NoMemoryController)?;
        let parent = root.join(CGROUP_PARENT);
        let err = |path: &Path| {
            let path = path.to_owned();
            move |source| BoundRunError::Cgroup { path, source }
        };
        match fs::create_dir(&parent) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(err(&parent)(e)),
        }
        if v2 {
            // The parents must hand the controller down (an error here shows at memory.max).
            let _ = fs::write(root.join("cgroup.subtree_control"), "+memory");
            let _ = fs::write(parent.join("cgroup.subtree_control"), "+memory");
        }
        let dir = parent.join(name);
        fs::create_dir(&dir).map_err(err(&dir))?;
        let made = (|| {
            let write = |file: &str, value: &str| {
                let path = dir.join(file);
                fs::write(&path, value).map_err(err(&path))
            };
            let limit = bytes.to_string();
            if v2 {
                write("memory.max", &limit)?;
                // Present only with swap accounting; without it there is no swap to bound.
                let _ = fs::write(dir.join("memory.swap.max"), "0");
            } else {
                write("memory.limit_in_bytes", &limit)?;
                // memsw = memory + swap: the same value means no swap. Present only with
                // swap accounting.
                let memsw = dir.join("memory.memsw.limit_in_bytes");
                if memsw.exists() {
                    write("memory.memsw.limit_in_bytes", &limit)?;
                }
            }
            let procs_path = dir.join("cgroup.procs");
            OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(&procs_path)
                .map_err(err(&procs_path))
        })();
        match made {
            Ok(procs) => Ok(MemoryCgroup { dir, v2, procs }),
            Err(e) => {
                let _ = fs::remove_dir(&dir);
                Err(e)
            }
        }
    }

    /// The path of `cgroup.procs` (for the watchdog).
    pub fn procs_path(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// A second handle on `cgroup.procs`, for the prepared child.
    pub fn procs_file(&self) -> io::Result<File> {
        self.procs.try_clone()
    }

    /// True when no process is in the cgroup (read from `cgroup.procs`; false when it cannot
    /// be read). Every process of a run is in its cgroup, which it cannot leave (moving a
    /// process takes writing another cgroup's root-owned `cgroup.procs`), so an empty one
    /// means nothing of the run is left.
    pub fn is_empty(&self) -> bool {
        fs::read(self.procs_path()).is_ok_and(|procs| procs.iter().all(u8::is_ascii_whitespace))
    }

    /// Whether the kernel's OOM killer ended a process of the run.
    pub fn oom_killed(&self) -> bool {
        oom_kills_in(&self.dir, self.v2).is_some_and(|n| n > 0)
    }

    /// Removes the cgroup (its processes must be gone already).
    pub fn remove(self) -> io::Result<()> {
        remove_cgroup(&self.dir)
    }
}

/// rmdir of a cgroup, retried for a moment: the kernel drops a dead process's membership
/// shortly after it is reaped. A cgroup that does not exist is removed.
pub fn remove_cgroup(dir: &Path) -> io::Result<()> {
    let start = Instant::now();
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if start.elapsed() < Duration::from_secs(2) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Mounts a tmpfs of `bytes` on `work` (`nosuid,nodev`, mode 0700, owned by `uid`:`gid`).
pub fn mount_work(work: &Path, bytes: u64, uid: u32, gid: u32) -> Result<(), BoundRunError> {
    let data = format!(
        "size={},nr_inodes={},mode=0700,uid={uid},gid={gid}",
        bytes.max(4096),
        plimsoll_sandbox::tmpfs_inodes(bytes)
    );
    rustix::mount::mount(
        "plimsoll-work",
        work,
        "tmpfs",
        rustix::mount::MountFlags::NOSUID | rustix::mount::MountFlags::NODEV,
        Some(
            std::ffi::CString::new(data)
                .expect("no NUL in numbers")
                .as_c_str(),
        ),
    )
    .map_err(|e| BoundRunError::Mount {
        path: work.to_owned(),
        source: e.into(),
    })
}

/// Unmounts `work` if something is mounted there (it lies on another device than its
/// parent); detached, so a file the run left open does not keep it.
pub fn unmount_work(work: &Path) -> io::Result<()> {
    let (Ok(w), Some(Ok(p))) = (
        fs::symlink_metadata(work),
        work.parent().map(fs::symlink_metadata),
    ) else {
        return Ok(());
    };
    if w.dev() == p.dev() {
        return Ok(());
    }
    rustix::mount::unmount(work, rustix::mount::UnmountFlags::DETACH)?;
    Ok(())
}
