//! A provider's state directory: the runtime's `--root`, one directory per run (bundle,
//! files handed to the container, a lock), and the locks that tell a live run from one a
//! killed daemon left behind.
//!
//! ```text
//! <state_root>/<provider>/
//!     lock            flock: shared while a run is being set up, exclusive while reaping
//!     runtime/        the runtime's --root
//!     runs/<id>/      one run: lock (flock held for the run's whole life), bundle/, ...
//! ```
//!
//! A run holds an exclusive flock on `runs/<id>/lock` from before its container exists until
//! everything of it is gone. The kernel drops the lock when its holder dies, so a run whose
//! lock can be taken is a leftover, whatever process created it.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, flock};

/// The state directory of one provider.
#[derive(Debug, Clone)]
pub struct StateDir {
    base: PathBuf,
}

/// One run's directory, locked for as long as this value lives.
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
    _lock: File,
}

/// The global lock, held shared (run setup) or exclusive (reap).
#[derive(Debug)]
pub struct GlobalLock {
    _file: File,
}

impl RunDir {
    /// The run's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn mkdir_private(path: &Path) -> io::Result<()> {
    match fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(path)
    {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

fn open_lock(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
}

impl StateDir {
    /// The state directory at `base` (`<state_root>/<provider>`). Nothing is created yet.
    pub fn new(base: PathBuf) -> Self {
        StateDir { base }
    }

    /// `<base>`.
    pub fn base(&self) -> &Path {
        &self.base
    }

    /// The runtime's `--root`.
    pub fn runtime_root(&self) -> PathBuf {
        self.base.join("runtime")
    }

    /// Where run directories live.
    pub fn runs(&self) -> PathBuf {
        self.base.join("runs")
    }

    /// Creates the directories (mode 0700, owned by the daemon's user).
    pub fn ensure(&self) -> io::Result<()> {
        mkdir_private(&self.base)?;
        mkdir_private(&self.runtime_root())?;
        mkdir_private(&self.runs())
    }

    /// Takes the global lock: shared to set up a run, exclusive to reap.
    pub fn global_lock(&self, exclusive: bool) -> io::Result<GlobalLock> {
        self.ensure()?;
        let file = open_lock(&self.base.join("lock"))?;
        let op = if exclusive {
            FlockOperation::LockExclusive
        } else {
            FlockOperation::LockShared
        };
        flock(&file, op)?;
        Ok(GlobalLock { _file: file })
    }

    /// Creates and locks `runs/<id>`. Fails if it exists already.
    pub fn create_run(&self, id: &str) -> io::Result<RunDir> {
        let _global = self.global_lock(false)?;
        let path = self.runs().join(id);
        fs::DirBuilder::new().mode(0o700).create(&path)?;
        let lock = open_lock(&path.join("lock"))?;
        flock(&lock, FlockOperation::NonBlockingLockExclusive)?;
        Ok(RunDir { path, _lock: lock })
    }

    /// Whether run `id` is alive: its lock is held (by this process or another one).
    /// A run with no directory is not alive.
    pub fn is_live(&self, id: &str) -> bool {
        let path = self.runs().join(id).join("lock");
        let Ok(file) = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
        else {
            return false;
        };
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => false,
            Err(rustix::io::Errno::WOULDBLOCK) => true,
            // Cannot tell: treat as alive, never reap what might be running.
            Err(_) => true,
        }
    }

    /// The ids of every run directory.
    pub fn run_ids(&self) -> Vec<String> {
        let Ok(dir) = fs::read_dir(self.runs()) else {
            return Vec::new();
        };
        let mut ids: Vec<String> = dir
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        ids.sort();
        ids
    }

    /// Removes a run's directory tree without crossing into another file system (a mount
    /// left inside is never followed). For the reap, which holds the global lock.
    pub fn remove_run(&self, id: &str) -> io::Result<()> {
        remove_tree_one_fs(&self.runs().join(id))
    }

    /// Removes a live run's own directory, still locked by `run`, under the global lock held
    /// shared. Its lock file goes with it, and a run with no lock file looks like a leftover:
    /// a reap (holding the lock exclusive) must never see the tree half removed.
    pub fn remove_own_run(&self, run: &RunDir) -> io::Result<()> {
        let _global = self.global_lock(false)?;
        remove_tree_one_fs(&run.path)
    }
}

pub use plimsoll_sandbox::reap::remove_tree_one_fs;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_live_while_its_directory_is_held() {
        let tmp = tempfile::tempdir().unwrap();
        let s = StateDir::new(tmp.path().join("crun"));
        let run = s.create_run("plimsoll-a").unwrap();
        assert!(s.is_live("plimsoll-a"));
        assert!(!s.is_live("plimsoll-b"));
        assert!(s.create_run("plimsoll-a").is_err(), "ids are unique");
        assert_eq!(s.run_ids(), ["plimsoll-a"]);
        drop(run);
        assert!(!s.is_live("plimsoll-a"));
        fs::write(s.runs().join("plimsoll-a").join("f"), "x").unwrap();
        s.remove_run("plimsoll-a").unwrap();
        assert!(s.run_ids().is_empty());
        s.remove_run("plimsoll-a").unwrap();
    }

    #[test]
    fn the_global_lock_excludes_setup_while_reaping() {
        let tmp = tempfile::tempdir().unwrap();
        let s = StateDir::new(tmp.path().join("runc"));
        let reaping = s.global_lock(true).unwrap();
        let s2 = s.clone();
        let t = std::thread::spawn(move || s2.create_run("plimsoll-x").map(|_| ()));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!t.is_finished(), "setup waits for the reap");
        drop(reaping);
        t.join().unwrap().unwrap();
    }

    #[test]
    fn a_run_removes_its_own_directory_only_between_reaps() {
        let tmp = tempfile::tempdir().unwrap();
        let s = StateDir::new(tmp.path().join("crun"));
        let run = s.create_run("plimsoll-y").unwrap();
        fs::write(run.path().join("f"), "x").unwrap();
        let reaping = s.global_lock(true).unwrap();
        let s2 = s.clone();
        let t = std::thread::spawn(move || s2.remove_own_run(&run));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!t.is_finished(), "the removal waits for the reap");
        assert!(s.runs().join("plimsoll-y").join("lock").exists());
        drop(reaping);
        t.join().unwrap().unwrap();
        assert!(s.run_ids().is_empty());
    }
}
