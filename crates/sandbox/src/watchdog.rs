//! A run's deadline kept outside the daemon: a small root process per run (`/bin/sh`, in a
//! session of its own) that sleeps until the deadline plus a grace and then kills every
//! process listed in the run's cgroups (`cgroup.procs`), until none is left. The daemon ends
//! it when the run is over; a daemon that is SIGKILLed does not, so the watchdog still ends
//! the run at its deadline (docs/isolation-tiers.md, docs/container-tier.md), unless the next
//! daemon's start-up reap removes the run first: that reap ends the watchdog too
//! ([`end_left_behind`]), which would otherwise sleep on to the deadline.
//!
//! Killing by cgroup, not by uid: a run cannot leave its cgroup (no process of a run holds
//! a capability), and its cgroup is named after its run id, which is never reused, so a
//! watchdog that outlives its run (and a reap that removed the cgroup) kills nothing else.
//! The run's code cannot signal it: it runs as root, the code never does. Root with one
//! capability: its bounding set is CAP_KILL alone before it execs the shell (so that is all
//! it holds), under no_new_privs (docs/privileges.md).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use plimsoll_sys::exec::{PreExec, Step};

use crate::spawn::{Running, Spawn, SpawnError};

/// What the watchdog holds: CAP_KILL alone (it signals other uids' processes), no_new_privs.
fn only_kill() -> PreExec {
    PreExec::new()
        .step(
            "watchdog: CAP_KILL alone",
            Step::LimitBoundingSet(1 << plimsoll_sys::caps::CAP_KILL),
        )
        .step("watchdog: no_new_privs", Step::NoNewPrivs)
}

/// The script: `$1` seconds of sleep, then SIGKILL to every pid in the files that follow,
/// again until they are empty (a fork between reading and killing is caught next turn), for
/// at most 10 s. Output goes nowhere: the daemon that held the pipes may be gone. With `$1`
/// `-` (an armed watchdog), the seconds are the first line of its standard input, which the
/// daemon writes when the run starts; an input that closes first (the daemon gone before
/// then) or an unusable line kills at once: nothing of a run was there yet.
const SCRIPT: &str = r#"exec >/dev/null 2>&1
if [ "$1" = - ]; then
  read -r d || d=0
  shift
  set -- "$d" "$@"
fi
exec </dev/null
sleep "$1"
shift
i=0
while [ "$i" -lt 200 ]; do
  pids=$(cat "$@")
  [ -z "$pids" ] && exit 0
  kill -KILL $pids
  i=$((i + 1))
  sleep 0.05
done
exit 1
"#;

/// The name the watchdog's shell shows (`$0`), so an operator can tell it in `ps`.
pub const WATCHDOG_NAME: &str = "plimsoll-watchdog";

/// A running watchdog; dropping it ends it (the run is over, the daemon handled it).
#[derive(Debug)]
pub struct Watchdog {
    running: Option<Running>,
}

/// Starts a watchdog that, `after` from now, kills every process listed in `procs` (the
/// `cgroup.procs` files of the run's cgroups; a file that does not exist is skipped).
pub fn start(procs: &[PathBuf], after: Duration) -> Result<Watchdog, SpawnError> {
    let mut args: Vec<OsString> = vec![
        "-c".into(),
        SCRIPT.into(),
        WATCHDOG_NAME.into(),
        format!("{}.{:03}", after.as_secs(), after.subsec_millis()).into(),
    ];
    args.extend(procs.iter().map(|p| p.as_os_str().to_owned()));
    let running = Spawn::new("/bin/sh", Path::new("/"))
        .args(args)
        .env("PATH", "/usr/bin:/bin")
        .before_exec(only_kill())
        .spawn()?;
    Ok(Watchdog {
        running: Some(running),
    })
}

/// A watchdog started ahead of its run (a warm member's), asleep on its input until
/// [`Armed::start`] gives it the deadline: the claim of a member does not wait for a fork.
/// Dropped unstarted, it ends.
#[derive(Debug)]
pub struct Armed {
    dog: Watchdog,
    input: std::process::ChildStdin,
}

/// Starts a watchdog for `procs` (as [`start`]) that waits for its deadline.
pub fn arm(procs: &[PathBuf]) -> Result<Armed, SpawnError> {
    let mut args: Vec<OsString> =
        vec!["-c".into(), SCRIPT.into(), WATCHDOG_NAME.into(), "-".into()];
    args.extend(procs.iter().map(|p| p.as_os_str().to_owned()));
    let mut running = Spawn::new("/bin/sh", Path::new("/"))
        .args(args)
        .env("PATH", "/usr/bin:/bin")
        .before_exec(only_kill())
        .stdin_pipe()
        .spawn()?;
    let input = running.stdin.take().ok_or_else(|| SpawnError::Start {
        program: "/bin/sh".into(),
        source: std::io::Error::other("no input pipe"),
    })?;
    Ok(Armed {
        dog: Watchdog {
            running: Some(running),
        },
        input,
    })
}

impl Armed {
    /// Sets the deadline, `after` from now: from here it is a [`Watchdog`] like a started one.
    pub fn start(self, after: Duration) -> std::io::Result<Watchdog> {
        use std::io::Write as _;
        let Armed { dog, mut input } = self;
        writeln!(input, "{}.{:03}", after.as_secs(), after.subsec_millis())?;
        Ok(dog)
    }
}

/// Ends the watchdogs a dead daemon left (one SIGKILLed, then restarted): every watchdog
/// process on the host (a `/bin/sh` running this module's script, named
/// [`WATCHDOG_NAME`], leading its own process group) one of whose listed files lies under
/// one of `cgroups` (the cgroup directories of runs a reap found left behind). Its process
/// group (the shell and the `sleep` it waits in) is killed: it would otherwise live on until
/// its run's deadline, killing nothing, since the reap removes the run's cgroups. A
/// watchdog of a live run is never named by a left-behind run's cgroups (each run's cgroup
/// is its own, named after its run id). Returns the pids of the watchdogs ended.
///
/// A dead daemon's watchdogs are not this process's children (they went to init, or to the
/// nearest child subreaper), so they are not reaped here.
pub fn end_left_behind(cgroups: &[PathBuf]) -> Vec<i32> {
    let mut ended = Vec::new();
    if cgroups.is_empty() {
        return ended;
    }
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return ended;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if !watches_under(pid, cgroups) {
            continue;
        }
        let Some(p) = rustix::process::Pid::from_raw(pid) else {
            continue;
        };
        // A pidfd, then the same check again: the pid now names that watchdog, not a process
        // that took its pid in between. Its group's id is its pid while it lives.
        let Ok(fd) = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()) else {
            continue;
        };
        if watches_under(pid, cgroups)
            && rustix::process::kill_process_group(p, rustix::process::Signal::KILL).is_ok()
        {
            ended.push(pid);
        }
        drop(fd);
    }
    ended
}

/// Whether process `pid` is a watchdog (its command line this module's, leading its own
/// process group) that watches a file under one of `cgroups`.
fn watches_under(pid: i32, cgroups: &[PathBuf]) -> bool {
    use std::os::unix::ffi::OsStrExt as _;
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline
        .strip_suffix(b"\0")
        .unwrap_or(&cmdline)
        .split(|b| *b == 0)
        .collect();
    let [sh, c, script, name, _deadline, files @ ..] = args.as_slice() else {
        return false;
    };
    if *sh != b"/bin/sh" || *c != b"-c" || *script != SCRIPT.as_bytes() {
        return false;
    }
    if *name != WATCHDOG_NAME.as_bytes() {
        return false;
    }
    let leads_its_group = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
        st.rsplit_once(") ")
            .and_then(|(_, rest)| rest.split_whitespace().nth(2).map(str::to_owned))
            .is_some_and(|pgid| pgid == pid.to_string())
    });
    leads_its_group
        && files.iter().any(|f| {
            let f = Path::new(std::ffi::OsStr::from_bytes(f));
            cgroups.iter().any(|c| f.starts_with(c))
        })
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            r.kill_group();
            // The shell and the `sleep` it forked: when the shell dies, the `sleep` comes
            // back to this process (a child subreaper, as the daemon is), so both are reaped
            // here, by their group, or each run would leave a zombie behind. The group id
            // stays taken until its last member is reaped, so no other group is waited for.
            if let Some(group) = rustix::process::Pid::from_raw(r.child.id() as i32) {
                while let Ok(Some(_)) =
                    rustix::process::waitpgid(group, rustix::process::WaitOptions::empty())
                {
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The script kills what the listed file names, and nothing when the file is gone.
    #[test]
    fn it_kills_the_listed_processes_at_its_deadline() {
        let dir = plimsoll_testing::TestDir::new("watchdog", "kills");
        #[expect(
            clippy::disallowed_methods,
            reason = "a plain victim process, not a sandboxed run"
        )]
        let mut victim = std::process::Command::new("sleep")
            .arg("300")
            .spawn()
            .unwrap();
        let list = dir.path().join("cgroup.procs");
        std::fs::write(&list, format!("{}\n", victim.id())).unwrap();
        let started = std::time::Instant::now();
        let dog = start(
            &[list.clone(), dir.path().join("absent")],
            Duration::from_millis(300),
        )
        .unwrap();
        use std::os::unix::process::ExitStatusExt as _;
        let status = victim.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        assert!(started.elapsed() >= Duration::from_millis(300));
        // The victim is reaped (its pid gone from the list): the watchdog ends by itself.
        std::fs::write(&list, "").unwrap();
        drop(dog);
    }

    /// Root with CAP_KILL alone and no_new_privs, it still kills another uid's process.
    #[test]
    fn it_holds_cap_kill_alone_and_kills_another_uids_process() {
        use std::os::unix::process::CommandExt as _;
        use std::os::unix::process::ExitStatusExt as _;
        let test = "it_holds_cap_kill_alone_and_kills_another_uids_process";
        if !rustix::process::geteuid().is_root() {
            plimsoll_testing::skip_or_fail(test, "needs root: the watchdog is root's");
            return;
        }
        let dir = plimsoll_testing::TestDir::new("watchdog", "cap-kill");
        #[expect(
            clippy::disallowed_methods,
            reason = "a plain victim process of another uid, not a sandboxed run"
        )]
        let mut victim = std::process::Command::new("sleep")
            .arg("300")
            .uid(65_533)
            .gid(65_533)
            .spawn()
            .unwrap();
        let list = dir.path().join("cgroup.procs");
        std::fs::write(&list, format!("{}\n", victim.id())).unwrap();
        let dog = start(std::slice::from_ref(&list), Duration::from_secs(1)).unwrap();
        let pid = dog.running.as_ref().unwrap().child.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{k}:")))
                .unwrap()
                .trim()
                .to_owned()
        };
        let kill = format!("{:016x}", 1u64 << plimsoll_sys::caps::CAP_KILL);
        for caps in ["CapPrm", "CapEff", "CapBnd"] {
            assert_eq!(field(caps), kill, "{caps}: {status}");
        }
        assert_eq!(field("NoNewPrivs"), "1");
        assert_eq!(victim.wait().unwrap().signal(), Some(libc::SIGKILL));
        std::fs::write(&list, "").unwrap();
        drop(dog);
    }

    /// Ending a watchdog before its deadline leaves no zombie in a subreaper (the daemon is
    /// one): neither the shell nor the `sleep` it forked.
    #[test]
    fn an_ended_watchdog_leaves_no_zombie() {
        assert!(crate::spawn::become_subreaper(), "PR_SET_CHILD_SUBREAPER");
        let dir = plimsoll_testing::TestDir::new("watchdog", "zombie");
        let dog = start(&[dir.path().join("absent")], Duration::from_secs(60)).unwrap();
        // Let the shell fork its `sleep` first.
        std::thread::sleep(Duration::from_millis(300));
        drop(dog);
        let me = std::process::id();
        let children: Vec<String> = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
            .flat_map(|c| c.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
            .collect();
        let zombies: Vec<&String> = children
            .iter()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
                    st.rsplit_once(") ")
                        .is_some_and(|(_, r)| r.starts_with('Z'))
                })
            })
            .collect();
        assert!(zombies.is_empty(), "zombies left in {me}: {zombies:?}");
    }

    /// The reap's end of a dead daemon's watchdogs takes those watching a left-behind run's
    /// cgroups, shell and `sleep` both, and nothing else: not another run's watchdog, not a
    /// process that names the cgroup and the watchdog's name but runs another script.
    #[test]
    fn the_watchdogs_of_left_behind_runs_end_and_no_other() {
        use std::os::unix::process::CommandExt as _;
        let dir = plimsoll_testing::TestDir::new("watchdog", "left-behind");
        let (left, live) = (dir.path().join("left"), dir.path().join("live"));
        let dog = start(&[left.join("cgroup.procs")], Duration::from_secs(60)).unwrap();
        let other = start(&[live.join("cgroup.procs")], Duration::from_secs(60)).unwrap();
        #[expect(
            clippy::disallowed_methods,
            reason = "a plain process naming the cgroup, not a sandboxed run"
        )]
        let mut bystander = std::process::Command::new("/bin/sh")
            .args(["-c", "sleep 60", WATCHDOG_NAME, "60"])
            .arg(left.join("cgroup.procs"))
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = |w: &Watchdog| w.running.as_ref().unwrap().child.id() as i32;
        // Let each shell fork its `sleep`.
        std::thread::sleep(Duration::from_millis(300));
        let group_alive = |g: i32| {
            rustix::process::test_kill_process_group(rustix::process::Pid::from_raw(g).unwrap())
                .is_ok()
                && std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
                    std::fs::read_to_string(e.path().join("stat")).is_ok_and(|st| {
                        st.rsplit_once(") ").is_some_and(|(_, r)| {
                            let f: Vec<&str> = r.split_whitespace().collect();
                            f[0] != "Z" && f[2] == g.to_string()
                        })
                    })
                })
        };
        assert!(group_alive(pid(&dog)) && group_alive(pid(&other)));
        assert_eq!(end_left_behind(std::slice::from_ref(&left)), [pid(&dog)]);
        let start = std::time::Instant::now();
        while group_alive(pid(&dog)) {
            assert!(start.elapsed() < Duration::from_secs(5), "still alive");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(group_alive(pid(&other)), "another run's watchdog was ended");
        assert_eq!(
            bystander.try_wait().unwrap(),
            None,
            "a bystander was killed"
        );
        let group = rustix::process::Pid::from_raw(bystander.id() as i32).unwrap();
        rustix::process::kill_process_group(group, rustix::process::Signal::KILL).unwrap();
        bystander.wait().unwrap();
        drop(dog);
        drop(other);
    }

    /// An armed watchdog sleeps on its input: it kills nothing before its deadline is set,
    /// then kills at that deadline; one whose input closes unset kills at once.
    #[test]
    fn an_armed_watchdog_kills_at_the_deadline_it_is_given_or_at_once_if_never_given_one() {
        use std::os::unix::process::ExitStatusExt as _;
        let dir = plimsoll_testing::TestDir::new("watchdog", "armed");
        let victim = || {
            #[expect(
                clippy::disallowed_methods,
                reason = "a plain victim process, not a sandboxed run"
            )]
            let v = std::process::Command::new("sleep")
                .arg("300")
                .spawn()
                .unwrap();
            v
        };
        let list = dir.path().join("cgroup.procs");
        let mut v = victim();
        std::fs::write(&list, format!("{}\n", v.id())).unwrap();
        let armed = arm(std::slice::from_ref(&list)).unwrap();
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            v.try_wait().unwrap().is_none(),
            "killed before its deadline was set"
        );
        let started = std::time::Instant::now();
        let dog = armed.start(Duration::from_millis(300)).unwrap();
        assert_eq!(v.wait().unwrap().signal(), Some(libc::SIGKILL));
        assert!(started.elapsed() >= Duration::from_millis(300));
        std::fs::write(&list, "").unwrap();
        drop(dog);

        // Its input closed unset (the daemon gone before the claim): it kills at once.
        let mut v = victim();
        std::fs::write(&list, format!("{}\n", v.id())).unwrap();
        let Armed { dog, input } = arm(std::slice::from_ref(&list)).unwrap();
        drop(input);
        assert_eq!(v.wait().unwrap().signal(), Some(libc::SIGKILL));
        std::fs::write(&list, "").unwrap();
        drop(dog);
    }
}
