//! Host-wide leases on sandbox uids. Every run's end kills every process of its uid, so two
//! engines on one host (a daemon and a CLI, two test binaries) must never hold the same uid at
//! once. A lease is an exclusive `flock` on a per-uid file: the kernel drops it when the holder
//! exits, even by SIGKILL, so a crashed engine never strands a uid.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, flock};

/// Where leases live when the engine runs as root: a tmpfs, emptied at boot.
pub const ROOT_LEASE_DIR: &str = "/run/plimsoll/uid-leases";

/// A held uid; released when dropped.
#[derive(Debug)]
pub struct UidLease {
    uid: u32,
    _file: File,
}

impl UidLease {
    /// The uid held.
    pub fn uid(&self) -> u32 {
        self.uid
    }
}

/// The lease directory for an engine: [`ROOT_LEASE_DIR`] for root, else under `state_dir`.
pub fn lease_dir(state_dir: &Path) -> PathBuf {
    if rustix::process::geteuid().is_root() {
        PathBuf::from(ROOT_LEASE_DIR)
    } else {
        unprivileged_lease_dir(state_dir)
    }
}

/// Where an engine that is not root keeps its leases: under its state directory.
pub fn unprivileged_lease_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("uid-leases")
}

/// Takes the lease on `uid` if nobody on this host holds it; `Ok(None)` when someone does.
pub fn try_lease(dir: &Path, uid: u32) -> io::Result<Option<UidLease>> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(dir.join(format!("uid-{uid}")))?;
    match flock(&file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(UidLease { uid, _file: file })),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uid_is_held_once_until_released() {
        let dir = std::env::temp_dir().join(format!("plimsoll-lease-test-{}", std::process::id()));
        let first = try_lease(&dir, 7).unwrap().expect("free");
        assert_eq!(first.uid(), 7);
        assert!(try_lease(&dir, 7).unwrap().is_none(), "held twice");
        assert!(try_lease(&dir, 8).unwrap().is_some());
        drop(first);
        assert!(try_lease(&dir, 7).unwrap().is_some(), "not released");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
