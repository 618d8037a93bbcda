//! One hardened launch, shared by runs and the probe: the run directory, the child, its
//! output, and the cleanup that leaves nothing behind (no process of the uid, no files).

use std::ffi::OsString;
use std::fs::{self, File};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{
    DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _,
};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use plimsoll_sandbox::{
    CaptureLimits, Captured, LaunchError, ResolvedLimits, Spawn, capture, end_processes_of_uid,
    unix_ms_now,
};

use crate::bounds::{self, BoundRunError, MemoryCgroup};
use crate::harden::Hardening;

/// How long after the deadline the watchdog outside the daemon kills the run's processes,
/// should the daemon be gone (a live daemon has killed them at the deadline).
pub const WATCHDOG_GRACE: Duration = Duration::from_secs(2);

/// How long leftover processes of a run's uid get to die after SIGKILL.
const KILL_PATIENCE: Duration = Duration::from_secs(5);

/// A run's directory: `<run_dir>/code` (root with the run's group, read-only to the run and
/// closed to every other uid) and `<run_dir>/work` (the run's uid, its only writable place and
/// its working directory).
#[derive(Debug)]
pub struct RunDir {
    /// The run directory.
    pub root: PathBuf,
    /// Owned by root and the run's gid, 0750: the code (its files 0640 or 0750, same owners),
    /// so no other local user can read it while the run is in flight.
    pub code: PathBuf,
    /// Owned by the run's uid, 0700: the working directory.
    pub work: PathBuf,
    /// The run's gid: the group of the code directory and its files.
    pub gid: u32,
    /// `<run_dir>/process.lock`, flocked for as long as this value lives: a run directory
    /// whose lock can be taken is a leftover of a killed daemon ([`reap`]).
    _lock: File,
}

/// The lock file that marks a process-tier run directory (others share `<state_dir>/runs`).
pub const LOCK_FILE: &str = "process.lock";

/// The run directory could not be made (nothing was started).
#[derive(Debug, thiserror::Error)]
pub enum PrepareRunDirError {
    /// The run directory has no parent.
    #[error("run directory {0} has no parent directory")]
    NoParent(PathBuf),
    /// A directory or file could not be created or set up.
    #[error("cannot create {path}")]
    Create {
        /// What.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The runs root is owned by someone else or writable by others.
    #[error(
        "{path} must be owned by root and writable by nobody else (it is uid {uid}, mode {mode:o}): fix it with chown root {path} && chmod 0711 {path}"
    )]
    UnsafeRoot {
        /// The runs root.
        path: PathBuf,
        /// Its owner.
        uid: u32,
        /// Its mode.
        mode: u32,
    },
    /// The run's work tmpfs could not be mounted.
    #[error(transparent)]
    Bound(#[from] BoundRunError),
    /// A parent directory cannot be traversed by the run's uid.
    #[error(
        "{path} (mode {mode:o}) cannot be traversed by the sandbox uid, so the run could not reach its files: chmod o+x {path}, or choose a state_dir whose every parent is traversable (e.g. /var/lib/plimsoll)"
    )]
    Untraversable {
        /// The directory.
        path: PathBuf,
        /// Its mode.
        mode: u32,
    },
}

impl RunDir {
    /// Creates `run_dir` (which must not exist) for a run as `uid`:`gid`, its work directory
    /// a tmpfs of `disk_bytes`. The runs root (its parent) is created 0711 and root-owned if
    /// missing, and every ancestor is checked to be traversable by others.
    pub fn create(
        run_dir: &Path,
        uid: u32,
        gid: u32,
        disk_bytes: u64,
    ) -> Result<RunDir, PrepareRunDirError> {
        let create_err = |path: &Path| {
            let path = path.to_owned();
            move |source| PrepareRunDirError::Create { path, source }
        };
        let runs_root = run_dir
            .parent()
            .ok_or_else(|| PrepareRunDirError::NoParent(run_dir.to_owned()))?;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(runs_root)
            .map_err(create_err(runs_root))?;
        let meta = fs::metadata(runs_root).map_err(create_err(runs_root))?;
        if meta.uid() != 0 || meta.mode() & 0o022 != 0 {
            return Err(PrepareRunDirError::UnsafeRoot {
                path: runs_root.to_owned(),
                uid: meta.uid(),
                mode: meta.mode() & 0o7777,
            });
        }
        for dir in runs_root.ancestors() {
            let meta = fs::metadata(dir).map_err(create_err(dir))?;
            if meta.mode() & 0o001 == 0 {
                return Err(PrepareRunDirError::Untraversable {
                    path: dir.to_owned(),
                    mode: meta.mode() & 0o7777,
                });
            }
        }
        let mkdir = |path: &Path, mode: u32| -> Result<(), PrepareRunDirError> {
            fs::DirBuilder::new()
                .mode(mode)
                .create(path)
                .map_err(create_err(path))?;
            // The umask may have cleared bits; set the mode exactly.
            fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(create_err(path))
        };
        mkdir(run_dir, 0o711)?;
        // Locked under another name, then renamed: a reap (which opens only LOCK_FILE) never
        // finds the file before it is locked, so it cannot take a new run's directory.
        let lock_path = run_dir.join(LOCK_FILE);
        let unlocked_path = run_dir.join(format!("{LOCK_FILE}.new"));
        let lock = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(&unlocked_path)
            .and_then(|f| {
                rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive)?;
                fs::rename(&unlocked_path, &lock_path)?;
                Ok(f)
            });
        let lock = match lock {
            Ok(l) => l,
            Err(e) => {
                let _ = fs::remove_dir_all(run_dir);
                return Err(create_err(&lock_path)(e));
            }
        };
        let dir = RunDir {
            root: run_dir.to_owned(),
            code: run_dir.join("code"),
            work: run_dir.join("work"),
            gid,
            _lock: lock,
        };
        let made = (|| {
            mkdir(&dir.code, 0o750)?;
            dir.give_to_run_group(&dir.code)
                .map_err(create_err(&dir.code))?;
            mkdir(&dir.work, 0o700)?;
            rustix::fs::chown(
                &dir.work,
                Some(rustix::fs::Uid::from_raw(uid)),
                Some(rustix::fs::Gid::from_raw(gid)),
            )
            .map_err(|e| create_err(&dir.work)(e.into()))?;
            // All the run's files together, not only each one (RLIMIT_FSIZE).
            bounds::mount_work(&dir.work, disk_bytes, uid, gid)?;
            Ok(())
        })();
        if let Err(e) = made {
            let _ = bounds::unmount_work(&dir.work);
            let _ = fs::remove_dir_all(&dir.root);
            return Err(e);
        }
        Ok(dir)
    }

    /// The directory's name (the run's cgroup is named after it).
    pub fn name(&self) -> String {
        self.root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// Makes `path` root-owned with the run's group (set before any mode that opens it to
    /// the group, so the group never has access to a file of another run's group).
    fn give_to_run_group(&self, path: &Path) -> io::Result<()> {
        rustix::fs::chown(
            path,
            Some(rustix::fs::Uid::ROOT),
            Some(rustix::fs::Gid::from_raw(self.gid)),
        )
        .map_err(io::Error::from)
    }

    /// Writes a file into the code directory, owned by root and the run's gid, with `mode`
    /// (give the group read, never others: 0640, or 0750 for a program).
    pub fn add_code(
        &self,
        name: &str,
        content: &[u8],
        mode: u32,
    ) -> Result<PathBuf, PrepareRunDirError> {
        let path = self.code.join(name);
        let err = |source| PrepareRunDirError::Create {
            path: path.clone(),
            source,
        };
        fs::write(&path, content).map_err(err)?;
        self.give_to_run_group(&path).map_err(err)?;
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).map_err(err)?;
        Ok(path)
    }

    /// Copies a file into the code directory, owned by root and the run's gid, with `mode`.
    pub fn copy_code(
        &self,
        name: &str,
        from: &Path,
        mode: u32,
    ) -> Result<PathBuf, PrepareRunDirError> {
        let path = self.code.join(name);
        let err = |source| PrepareRunDirError::Create {
            path: path.clone(),
            source,
        };
        fs::copy(from, &path).map_err(err)?;
        self.give_to_run_group(&path).map_err(err)?;
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).map_err(err)?;
        Ok(path)
    }
}

/// What to launch.
#[derive(Debug)]
pub struct Launch<'a> {
    /// The program (an interpreter, or a binary in the code directory).
    pub program: &'a Path,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// The uid and gid the code runs as.
    pub uid: u32,
    /// The gid.
    pub gid: u32,
    /// Limits.
    pub limits: &'a ResolvedLimits,
    /// The sandbox's end of the broker channel, inherited by the child at
    /// [`plimsoll_sandbox::BROKER_FD`] and closed in this process once the child is started.
    pub channel: Option<OwnedFd>,
}

/// How a launch went: the output, and when it started and ended.
#[derive(Debug)]
pub struct Launched {
    /// Exit, output, flags.
    pub captured: Captured,
    /// Unix ms at spawn.
    pub started_unix_ms: u64,
    /// Unix ms when the output was complete.
    pub ended_unix_ms: u64,
    /// The kernel's OOM killer ended a process of the run (its memory cgroup was full).
    pub oom_killed: bool,
}

/// Runs `launch` in `dir` (already holding its code) and always cleans up: every process of
/// the uid is killed and the run directory is removed, whether the launch worked or not.
pub fn launch_and_clean(launch: Launch<'_>, dir: RunDir) -> Result<Launched, LaunchError> {
    let uid = launch.uid;
    let cgroup = MemoryCgroup::create(&dir.name(), launch.limits.memory_bytes);
    let outcome = match &cgroup {
        Ok(cg) => launch_in(launch, &dir, cg),
        Err(e) => Err(LaunchError::environment(error_chain(e))),
    };
    let mut cleaned = clean(uid, &dir);
    if let Ok(cg) = cgroup
        && let Err(e) = cg.remove()
    {
        let e = format!("cannot remove the run's memory cgroup: {e}");
        cleaned = match cleaned {
            Ok(()) => Err(e),
            Err(c) => Err(format!("{c}; {e}")),
        };
    }
    match (outcome, cleaned) {
        (Ok(l), Ok(())) => Ok(l),
        (Ok(_), Err(c)) => Err(LaunchError::may_have_run(format!(
            "the run finished but its cleanup failed: {c}"
        ))),
        (Err(e), Ok(())) => Err(e),
        (Err(e), Err(c)) => Err(e.with_cleanup(c)),
    }
}

/// Kills whatever the uid still runs, then removes the run directory.
pub fn clean(uid: u32, dir: &RunDir) -> Result<(), String> {
    let mut problems = Vec::new();
    // Processes first: a live one could keep writing into the directory.
    if let Err(e) = end_processes_of_uid(uid, KILL_PATIENCE) {
        problems.push(e.to_string());
    }
    if let Err(e) = bounds::unmount_work(&dir.work) {
        problems.push(format!("cannot unmount {}: {e}", dir.work.display()));
    }
    if let Err(e) = fs::remove_dir_all(&dir.root)
        && e.kind() != io::ErrorKind::NotFound
    {
        problems.push(format!("cannot remove {}: {e}", dir.root.display()));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

fn launch_in(
    launch: Launch<'_>,
    dir: &RunDir,
    cgroup: &MemoryCgroup,
) -> Result<Launched, LaunchError> {
    let procs = cgroup
        .procs_file()
        .map_err(|e| LaunchError::environment(format!("cannot use the memory cgroup: {e}")))?;
    let hardening = Hardening::prepare(
        launch.limits,
        launch.uid,
        launch.gid,
        &dir.code,
        &dir.work,
        launch.channel,
        procs.into(),
    )
    .map_err(|e| LaunchError::environment(error_chain(&e)))?;
    // A daemon that crashed mid-run could have left processes of this uid behind.
    plimsoll_sandbox::reap::signal_all_as(launch.uid)
        .map_err(|e| LaunchError::environment(format!("cannot clear uid {}: {e}", launch.uid)))?;
    let limits = CaptureLimits::new(launch.limits.output_bytes, launch.limits.timeout);
    // The deadline outside the daemon: should the daemon be killed mid-run, this ends every
    // process of the run's cgroup at the deadline plus a grace. Dropped (ended) with the run.
    let _outside = plimsoll_sandbox::watchdog::start(
        &[cgroup.procs_path()],
        launch.limits.timeout + WATCHDOG_GRACE,
    )
    .map_err(|e| {
        LaunchError::environment(format!(
            "cannot start the run's watchdog: {}",
            error_chain(&e)
        ))
    })?;
    let started_unix_ms = unix_ms_now();
    let running = Spawn::new(launch.program, &dir.work)
        .args(&launch.args)
        .before_exec(hardening.into_pre_exec())
        .spawn()
        .map_err(|e| LaunchError::environment(error_chain(&e)))?;
    let captured =
        capture(running, &limits).map_err(|e| LaunchError::may_have_run(error_chain(&e)))?;
    Ok(Launched {
        captured,
        started_unix_ms,
        ended_unix_ms: unix_ms_now(),
        oom_killed: cgroup.oom_killed(),
    })
}

pub use plimsoll_sandbox::error_chain;

/// What [`reap`] removed, and what it could not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReapReport {
    /// Run directories removed (with their processes, mount and cgroup).
    pub run_dirs: Vec<String>,
    /// The pids of the watchdogs a dead daemon left for these runs, ended.
    pub watchdogs: Vec<i32>,
    /// What failed.
    pub errors: Vec<String>,
}

/// How long the processes of a leftover run get to die.
const REAP_PATIENCE: Duration = Duration::from_secs(5);

/// Removes what runs of a killed daemon left under `runs_root`: every process-tier run
/// directory (one holding [`LOCK_FILE`]) whose lock no live run holds loses its processes
/// (every process of its uid, when no live engine leases that uid now), its work tmpfs, its
/// memory cgroup and its files, and the watchdog the daemon left for it ends. Safe while runs
/// are in flight: each holds its lock.
pub fn reap(runs_root: &Path, lease_dir: &Path) -> ReapReport {
    let mut report = ReapReport::default();
    let Ok(entries) = fs::read_dir(runs_root) else {
        return report;
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        let Ok(lock) = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path.join(LOCK_FILE))
        else {
            continue;
        };
        if rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
            continue;
        }
        let mut problems = Vec::new();
        // The dead daemon's watchdog for it, which would sleep on to the run's deadline.
        if let Some((root, _)) = bounds::memory_hierarchy() {
            report
                .watchdogs
                .extend(plimsoll_sandbox::watchdog::end_left_behind(&[
                    MemoryCgroup::path_for(&root, &name),
                ]));
        }
        let work = path.join("work");
        let uid = fs::metadata(&work).map(|m| m.uid()).unwrap_or(0);
        if uid != 0 {
            // A uid another engine leases now runs that engine's code: leave it alone (its
            // run's end kills every process of the uid anyway).
            match plimsoll_sandbox::try_lease(lease_dir, uid) {
                Ok(Some(_lease)) => {
                    if let Err(e) = end_leftovers(uid) {
                        problems.push(e);
                    }
                }
                Ok(None) => {}
                Err(e) => problems.push(format!("cannot lease uid {uid}: {e}")),
            }
        }
        if let Err(e) = bounds::unmount_work(&work) {
            problems.push(format!("cannot unmount {}: {e}", work.display()));
        }
        if let Some((root, _)) = bounds::memory_hierarchy()
            && let Err(e) = bounds::remove_cgroup(&MemoryCgroup::path_for(&root, &name))
        {
            problems.push(format!("cannot remove the memory cgroup of {name}: {e}"));
        }
        if problems.is_empty() {
            match plimsoll_sandbox::reap::remove_tree_one_fs(&path) {
                Ok(()) => report.run_dirs.push(name),
                Err(e) => problems.push(format!("cannot remove {}: {e}", path.display())),
            }
        }
        report.errors.extend(problems);
    }
    report
}

/// Kills every process of `uid` (orphans of a dead daemon: not our children) and waits until
/// none is left.
fn end_leftovers(uid: u32) -> Result<(), String> {
    let start = Instant::now();
    loop {
        match plimsoll_sandbox::reap::signal_all_as(uid) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("cannot signal the processes of uid {uid}: {e}")),
        }
        let left: Vec<i32> = plimsoll_sandbox::reap::processes_of_uid(uid)
            .into_iter()
            .filter(|pid| !plimsoll_sandbox::reap::is_zombie(*pid))
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        if start.elapsed() > REAP_PATIENCE {
            return Err(format!(
                "processes of uid {uid} survived SIGKILL: {left:?} (check them with ps)"
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
