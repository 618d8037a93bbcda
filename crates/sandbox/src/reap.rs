//! Ending every process of a sandbox uid, so nothing a run started outlives it, even a
//! process that left the run's session.
//!
//! The kill is sent as the uid itself (`kill(-1, SIGKILL)` from a throwaway thread whose
//! credentials are switched, which Linux allows per thread): it reaches exactly the processes
//! that uid owns, atomically with respect to fork. Then we wait until none is left, reaping
//! those that are our children.
//!
//! Finding what is left: every process a run starts descends from us, and we are a child
//! subreaper ([`crate::spawn`]), so an orphan is re-parented to us, never to init. Hence no
//! process of the uid is left exactly when none of our own children has the uid, and only
//! our children need reading (`/proc/self/task/*/children`), not the whole of /proc. If this
//! process could not become a subreaper, the whole of /proc is scanned instead.

use std::io;
use std::time::{Duration, Instant};

use rustix::process::{Pid, WaitOptions};

/// Some processes of the uid could not be ended.
#[derive(Debug, thiserror::Error)]
pub enum EndProcessesError {
    /// uid 0 is never a sandbox uid; killing "all of root" is refused.
    #[error("refusing to kill every process of uid 0")]
    Root,
    /// Sending the kill failed.
    #[error("cannot signal the processes of uid {uid}")]
    Signal {
        /// The uid.
        uid: u32,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Processes of the uid were still there when patience ran out.
    #[error(
        "processes of uid {uid} survived SIGKILL for {waited_ms} ms: {pids:?} (check them with ps; they may be stuck in the kernel)"
    )]
    Survivors {
        /// The uid.
        uid: u32,
        /// How long we waited.
        waited_ms: u128,
        /// The pids still there.
        pids: Vec<i32>,
    },
}

/// Kills every process whose real, effective or saved uid is `uid`, and waits (at most
/// `patience`) until none is left, reaping those that are our children.
pub fn end_processes_of_uid(uid: u32, patience: Duration) -> Result<(), EndProcessesError> {
    if uid == 0 {
        return Err(EndProcessesError::Root);
    }
    let start = Instant::now();
    loop {
        signal_all_as(uid).map_err(|source| EndProcessesError::Signal { uid, source })?;
        let left = if crate::spawn::become_subreaper() {
            reap_children_of_uid(uid)
        } else {
            scan(uid, true)
        };
        if left.is_empty() {
            return Ok(());
        }
        if start.elapsed() >= patience {
            return Err(EndProcessesError::Survivors {
                uid,
                waited_ms: start.elapsed().as_millis(),
                pids: left,
            });
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Sends SIGKILL to every process `uid` may signal, from a thread running as `uid`.
/// Only that thread's credentials change; it ends right after.
pub fn signal_all_as(uid: u32) -> io::Result<()> {
    if uid == 0 {
        return Err(io::Error::other("refusing to signal as uid 0"));
    }
    std::thread::scope(|s| {
        s.spawn(|| -> io::Result<()> {
            let u = rustix::process::Uid::from_raw(uid);
            rustix::thread::set_thread_res_uid(u, u, u)?;
            // SAFETY: kill(2) with plain integer arguments. As `uid`, -1 reaches only the
            // processes `uid` owns (never this process: the kernel skips the caller).
            let rc = unsafe { libc::kill(-1, libc::SIGKILL) };
            // ESRCH: nothing to signal at all.
            if rc != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH) {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the signalling thread panicked")))
    })
}

/// The pids of every process of `uid` on the host (zombies included), from the whole of
/// /proc. Exact but slow (one read per process); for checks and tests.
pub fn processes_of_uid(uid: u32) -> Vec<i32> {
    scan(uid, false)
}

/// Reaps our children of `uid` that are zombies; returns those still alive.
fn reap_children_of_uid(uid: u32) -> Vec<i32> {
    let mut left = Vec::new();
    for pid in our_children() {
        let Some(info) = read_status(pid) else {
            continue;
        };
        if !info.uids.contains(&uid) {
            continue;
        }
        if !(info.zombie && reap(pid)) {
            left.push(pid);
        }
    }
    left
}

/// Our direct children, from every thread's `children` file.
fn our_children() -> Vec<i32> {
    let mut pids = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return pids;
    };
    for task in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            pids.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
    }
    pids
}

fn read_status(pid: i32) -> Option<StatusInfo> {
    // Gone between listing and reading: fine.
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    StatusInfo::parse(&status)
}

/// Reaps one zombie child; true when it was reaped.
fn reap(pid: i32) -> bool {
    Pid::from_raw(pid).is_some_and(|p| {
        matches!(
            rustix::process::waitpid(Some(p), WaitOptions::NOHANG),
            Ok(Some(_))
        )
    })
}

fn scan(uid: u32, reap_zombies: bool) -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut left = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return left;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Some(info) = read_status(pid) else {
            continue;
        };
        if !info.uids.contains(&uid) {
            continue;
        }
        if reap_zombies && info.zombie && info.ppid == me && reap(pid) {
            continue;
        }
        left.push(pid);
    }
    left
}

/// The fields of /proc/PID/status we need.
struct StatusInfo {
    uids: [u32; 3],
    ppid: i32,
    zombie: bool,
}

impl StatusInfo {
    fn parse(status: &str) -> Option<Self> {
        let mut uids = None;
        let mut ppid = None;
        let mut zombie = false;
        for line in status.lines() {
            if let Some(v) = line.strip_prefix("Uid:") {
                let ids: Vec<u32> = v
                    .split_whitespace()
                    .take(3)
                    .filter_map(|x| x.parse().ok())
                    .collect();
                uids = <[u32; 3]>::try_from(ids).ok();
            } else if let Some(v) = line.strip_prefix("PPid:") {
                ppid = v.trim().parse().ok();
            } else if let Some(v) = line.strip_prefix("State:") {
                zombie = v.trim_start().starts_with('Z');
            }
        }
        Some(StatusInfo {
            uids: uids?,
            ppid: ppid?,
            zombie,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status() {
        let s = "Name:\tsleep\nState:\tZ (zombie)\nTgid:\t5\nPid:\t5\nPPid:\t1\nUid:\t7\t8\t9\t9\n";
        let i = StatusInfo::parse(s).unwrap();
        assert_eq!(i.uids, [7, 8, 9]);
        assert_eq!(i.ppid, 1);
        assert!(i.zombie);
    }

    #[test]
    fn refuses_root() {
        assert!(matches!(
            end_processes_of_uid(0, Duration::ZERO),
            Err(EndProcessesError::Root)
        ));
        assert!(signal_all_as(0).is_err());
    }
}
