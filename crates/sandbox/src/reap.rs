//! Ending every process of a sandbox uid, so nothing a run started outlives it, even a
//! process that left the run's session.
//!
//! The kill is sent as the uid itself (`kill(-1, SIGKILL)` from a short-lived forked child
//! that switches to the uid): it reaches exactly the processes that uid owns, atomically with
//! respect to fork. Then we wait until none is left, reaping those that are our children.
//!
//! Why a child process and not a thread of ours: while a task runs as the uid, every process of
//! that uid may signal it, and a SIGKILL or SIGSTOP sent to one thread (tgkill) ends or freezes
//! the whole thread group. A leftover of the run could thus take down the daemon; only Landlock
//! signal scoping (ABI 6, Linux 6.12) would stop it. A forked child is its own thread group: the
//! worst a leftover can do is kill or stop that child, which we notice, end, and retry.
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
        match signal_all_as(uid) {
            Ok(()) => {}
            // A leftover interfered with the signalling child: retry within the patience.
            Err(e) if e.kind() == io::ErrorKind::Interrupted && start.elapsed() < patience => {
                continue;
            }
            Err(source) => return Err(EndProcessesError::Signal { uid, source }),
        }
        let left = if crate::spawn::become_subreaper() {
            reap_children_of_uid(uid)
        } else {
            scan(uid..uid + 1, true)
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

/// Sends SIGKILL to every process `uid` may signal, from a short-lived child process that
/// switches to `uid`; see [`plimsoll_sys::process::signal_all_as`].
pub use plimsoll_sys::process::signal_all_as;

/// The pids of every process of `uid` on the host (zombies included), from the whole of
/// /proc. Exact but slow (one read per process); for checks and tests.
pub fn processes_of_uid(uid: u32) -> Vec<i32> {
    scan(uid..uid + 1, false)
}

/// [`processes_of_uid`] for every uid in `uids` (a daemon's whole sandbox range), in one
/// pass over /proc.
pub fn processes_of_uids(uids: std::ops::Range<u32>) -> Vec<i32> {
    scan(uids, false)
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

fn scan(uids: std::ops::Range<u32>, reap_zombies: bool) -> Vec<i32> {
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
        if !info.uids.iter().any(|u| uids.contains(u)) {
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

/// `rm -rf --one-file-system`: removes a run's directory tree, refusing to descend into a
/// mount point (a mount a run left inside is never followed; the error says to unmount it).
/// A path that does not exist is already removed.
pub fn remove_tree_one_fs(path: &std::path::Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    fn walk(p: &std::path::Path, dev: u64) -> io::Result<()> {
        let meta = std::fs::symlink_metadata(p)?;
        if meta.is_dir() {
            if meta.dev() != dev {
                return Err(io::Error::other(format!(
                    "{} is a mount point (left behind?); unmount it first",
                    p.display()
                )));
            }
            for e in std::fs::read_dir(p)? {
                walk(&e?.path(), dev)?;
            }
            std::fs::remove_dir(p)
        } else {
            std::fs::remove_file(p)
        }
    }
    walk(path, meta.dev())
}

/// True when process `pid` has exited and waits to be reaped (its state is `Z`).
pub fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

/// Kills (SIGKILL) every process listed in `procs` (the `cgroup.procs` files of a run's
/// cgroups; one that does not exist is skipped), again until they list none or `patience`
/// has passed (a fork between reading and killing is caught next turn). What ends a
/// cancelled run at the OCI providers, gVisor's own processes included.
pub fn kill_cgroup_processes(
    procs: &[std::path::PathBuf],
    patience: Duration,
) -> Result<(), String> {
    let until = Instant::now() + patience;
    loop {
        let pids: Vec<i32> = procs
            .iter()
            .filter_map(|p| std::fs::read_to_string(p).ok())
            .flat_map(|text| {
                text.lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect();
        if pids.is_empty() {
            return Ok(());
        }
        for pid in &pids {
            if let Some(pid) = Pid::from_raw(*pid) {
                // Gone already is as good as killed.
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        if Instant::now() >= until {
            return Err(format!(
                "{} processes still listed after {} ms",
                pids.len(),
                patience.as_millis()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
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

    /// A uid of this test only (the kill reaches every process of it).
    const TEST_UID: u32 = 2_395_000;

    fn uid_line(path: &str) -> String {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .unwrap()
            .to_owned()
    }

    /// The kill is sent from a child process: no thread of ours ever runs as the uid (one
    /// that did could be SIGSTOPped or SIGKILLed by a leftover of the run, freezing or ending
    /// the daemon). The calling thread's credentials are unchanged right after the call, and
    /// a watcher that reads every thread of this process during a hundred calls never sees
    /// the uid. (The watcher can only catch a thread-based switch probabilistically: the
    /// window lasts microseconds and no deterministic hook into it exists.)
    #[test]
    fn the_kill_is_sent_from_a_child_process_not_a_thread() {
        if !plimsoll_testing::is_root() {
            plimsoll_testing::skip_or_fail(
                "the_kill_is_sent_from_a_child_process_not_a_thread",
                "needs root to switch uids",
            );
            return;
        }
        use std::os::unix::process::CommandExt as _;
        use std::sync::atomic::{AtomicBool, Ordering};
        #[expect(
            clippy::disallowed_methods,
            reason = "a plain victim process of the uid, not a sandboxed run"
        )]
        let mut victim = std::process::Command::new("sleep")
            .arg("300")
            .uid(TEST_UID)
            .gid(TEST_UID)
            .spawn()
            .unwrap();
        let before_thread = uid_line("/proc/thread-self/status");
        let before_process = uid_line("/proc/self/status");
        let done = AtomicBool::new(false);
        let seen = std::thread::scope(|s| {
            let watcher = s.spawn(|| {
                let mut seen = Vec::new();
                while !done.load(Ordering::Relaxed) {
                    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
                        let Ok(st) = std::fs::read_to_string(task.path().join("status")) else {
                            continue;
                        };
                        if let Some(i) = StatusInfo::parse(&st)
                            && i.uids.contains(&TEST_UID)
                        {
                            seen.push(task.file_name());
                        }
                    }
                }
                seen
            });
            for _ in 0..100 {
                signal_all_as(TEST_UID).unwrap();
                assert_eq!(uid_line("/proc/thread-self/status"), before_thread);
            }
            done.store(true, Ordering::Relaxed);
            watcher.join().unwrap()
        });
        assert_eq!(
            seen,
            Vec::<std::ffi::OsString>::new(),
            "threads of ours ran as the uid"
        );
        assert_eq!(uid_line("/proc/self/status"), before_process);
        // And the kill did reach the uid's process.
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(victim.wait().unwrap().signal(), Some(libc::SIGKILL));
        assert_eq!(processes_of_uid(TEST_UID), Vec::<i32>::new());
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
