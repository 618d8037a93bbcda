//! The privilege split of a trial job (docs/agent.md, "Trial jobs: the one step with two
//! capabilities"). A trial job starts the agent as uid 0 with exactly CAP_SETUID and
//! CAP_SETGID and no_new_privs. The agent keeps uid 0 only as its real and saved uid, works
//! as the run's uid R, runs every ordinary step as R with no capability at all, and only the
//! trial runner as uid 0 with the two capabilities. Any other job refuses to run as root.
//!
//! Only setresuid, setresgid, setgroups, prctl and kill are used: they behave the same in
//! gVisor (which lacks setfsuid and pidfd_open, and resets the effective uid to the real one
//! on exec under no_new_privs).

use std::process::Command;

use plimsoll_sys::exec::{PreExec, Step};
use plimsoll_wire::{AgentJob, RunSpec, TrialIds};
use rustix::io::Errno;
use rustix::process::{Pid, Signal, kill_process};

/// CAP_SETGID's bit.
const CAP_SETGID: u32 = 6;
/// CAP_SETUID's bit.
const CAP_SETUID: u32 = 7;
/// The two capabilities a trial job's agent starts with, as /proc/self/status shows them.
const TRIAL_CAPS: u64 = (1 << CAP_SETGID) | (1 << CAP_SETUID);
/// "Leave this id unchanged" for setresuid and setresgid.
const UNCHANGED: u32 = u32::MAX;

/// What the sandbox must provide for a trial job, for the refusal line.
const TRIAL_START: &str = "for a trial job the sandbox must start the agent as uid 0 and gid 0 \
    with capabilities effective = permitted = {CAP_SETUID, CAP_SETGID}, inheritable and \
    ambient empty, and no_new_privs set (docs/trials.md, \"What the sandbox must provide for a \
    trial step\")";

/// How the agent runs this job's children.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Privileges {
    /// An ordinary job: the agent runs as the run's uid (never root) and its children inherit
    /// it.
    Plain,
    /// A trial job: the agent's real and saved uid and gid are 0, its effective ones R and G,
    /// the two capabilities permitted but not effective.
    Trial(TrialIds),
}

/// The agent may not run this job with the privileges it was started with; nothing was
/// written and nothing ran.
#[derive(Debug, thiserror::Error)]
pub enum TakePrivilegesError {
    /// Root without a trial job.
    #[error(
        "the agent runs as uid 0 but the job is not a trial job: only a trial job may start \
         it as root; start it as the run's own uid"
    )]
    RootWithoutTrial,
    /// A snippet with trial ids.
    #[error("the job is a snippet with trial ids: only a project runs the trial runner")]
    TrialSnippet,
    /// Unusable trial ids.
    #[error(
        "the job's trial ids are refused ({0}): the run's and the controller's uid and gid \
         must be non-zero, and the two sides must differ"
    )]
    BadIds(&'static str),
    /// The agent was not started the way a trial job needs.
    #[error("the agent was not started for a trial job ({found}): {TRIAL_START}")]
    NotProvided {
        /// What is wrong.
        found: String,
    },
    /// Becoming the run's uid failed.
    #[error("cannot {step} for a trial job")]
    Drop {
        /// The step.
        step: &'static str,
        /// Why.
        #[source]
        source: Errno,
    },
}

/// A session's agent started as uid 0 to drop (`--drop-to UID:GID`) could not; nothing was
/// read or written.
#[derive(Debug, thiserror::Error)]
pub enum DropToError {
    /// The ids are root's.
    #[error("--drop-to takes the run's uid and gid, never 0")]
    Root,
    /// It was not started as uid 0 with exactly the two capabilities and no_new_privs.
    #[error("the agent was not started to drop to the run's uid ({found}): {TRIAL_START}")]
    NotProvided {
        /// What is wrong.
        found: String,
    },
    /// A step of the drop failed.
    #[error("cannot {step} to drop to the run's uid")]
    Drop {
        /// The step.
        step: &'static str,
        /// Why.
        #[source]
        source: Errno,
    },
    /// After the drop it still holds a root id or a capability.
    #[error("after the drop to the run's uid it still holds {0}")]
    Kept(String),
}

/// `--drop-to UID:GID`, a session's agent at runsc: started as uid 0 with exactly CAP_SETUID
/// and CAP_SETGID (as a trial job's agent is), it becomes UID and GID as real, effective and
/// saved ids with no supplementary group, which leaves it no capability but the two in its
/// bounding set (no_new_privs keeps any child from gaining them), and makes itself not
/// dumpable; then it checks /proc/self/status says so. Its standard input and output, made
/// when it started as uid 0, stay uid 0's and mode 0600 in gVisor, whose /proc lets a
/// process reopen another's descriptors by their own permissions: so the code it runs as UID
/// cannot reach them (docs/sessions.md, "The agent's channel"). First thing, before it reads
/// or says anything.
pub fn drop_to(uid: u32, gid: u32) -> Result<(), DropToError> {
    if uid == 0 || gid == 0 {
        return Err(DropToError::Root);
    }
    let status = |what: &str| {
        std::fs::read_to_string("/proc/self/status").map_err(|e| DropToError::NotProvided {
            found: format!("cannot read /proc/self/status {what}: {e}"),
        })
    };
    let no_new_privs = rustix::thread::no_new_privs().unwrap_or(false);
    check_trial_start(&status("at start")?, no_new_privs)
        .map_err(|found| DropToError::NotProvided { found })?;
    let step = |step: &'static str| move |source| DropToError::Drop { step, source };
    raw_setgroups_empty().map_err(step("clear the supplementary groups"))?;
    raw_setresgid(gid, gid, gid).map_err(step("become the run's gid"))?;
    raw_setresuid(uid, uid, uid).map_err(step("become the run's uid"))?;
    not_dumpable().map_err(step("make the agent not dumpable"))?;
    let now = status("after the drop")?;
    let field = |name: &str| {
        now.lines()
            .find_map(|l| l.strip_prefix(name).map(str::trim))
            .unwrap_or("")
            .to_owned()
    };
    let mut kept = Vec::new();
    for (name, want) in [("Uid:", uid), ("Gid:", gid)] {
        if !field(name)
            .split_whitespace()
            .all(|w| w == want.to_string())
        {
            kept.push(format!("{name} {}", field(name)));
        }
    }
    for name in ["CapInh:", "CapPrm:", "CapEff:", "CapAmb:"] {
        // gVisor's status has no ambient set (and no ambient capabilities).
        if name == "CapAmb:" && field(name).is_empty() {
            continue;
        }
        if u64::from_str_radix(&field(name), 16).unwrap_or(u64::MAX) != 0 {
            kept.push(format!("{name} {}", field(name)));
        }
    }
    if !field("Groups:").is_empty() {
        kept.push(format!("Groups: {}", field("Groups:")));
    }
    if kept.is_empty() {
        Ok(())
    } else {
        Err(DropToError::Kept(kept.join(", ")))
    }
}

/// The agent could not become the run's uid again after ending the controller's processes.
/// It stops at once: it must not go on with more than the run's uid.
#[derive(Debug, thiserror::Error)]
#[error("cannot become uid {uid} again after ending the controller's processes")]
pub struct RestoreUidError {
    /// The run's uid.
    pub uid: u32,
    /// Why.
    #[source]
    pub source: Errno,
}

/// Decides how the job runs and, for a trial job, checks how the agent was started and
/// becomes the run's uid (effective), keeping uid 0 as real and saved uid. Called before the
/// agent writes anything.
pub(crate) fn take(job: &AgentJob) -> Result<Privileges, TakePrivilegesError> {
    let Some(ids) = job.trial else {
        not_root()?;
        return Ok(Privileges::Plain);
    };
    if matches!(job.spec, RunSpec::Snippet(_)) {
        return Err(TakePrivilegesError::TrialSnippet);
    }
    check_ids(&ids).map_err(TakePrivilegesError::BadIds)?;
    let status = std::fs::read_to_string("/proc/self/status").map_err(|e| {
        TakePrivilegesError::NotProvided {
            found: format!("cannot read /proc/self/status: {e}"),
        }
    })?;
    let no_new_privs = rustix::thread::no_new_privs().unwrap_or(false);
    check_trial_start(&status, no_new_privs)
        .map_err(|found| TakePrivilegesError::NotProvided { found })?;
    let step = |step: &'static str| move |source| TakePrivilegesError::Drop { step, source };
    not_dumpable().map_err(step("make the agent not dumpable"))?;
    raw_setgroups_empty().map_err(step("clear the supplementary groups"))?;
    raw_setresgid(0, ids.gid, 0).map_err(step("take the run's gid as effective gid"))?;
    // Effective uid R: the kernel clears the effective capabilities and keeps the permitted
    // ones, since the real and saved uids stay 0.
    raw_setresuid(0, ids.uid, 0).map_err(step("take the run's uid as effective uid"))?;
    // A change of effective ids resets the flag to the system's default; set it again.
    not_dumpable().map_err(step("make the agent not dumpable"))?;
    Ok(Privileges::Trial(ids))
}

/// Refuses to go on with a root uid (real, effective or saved): any would let the
/// children become root again. Every job but a trial's, and a warm member, starts so.
pub(crate) fn not_root() -> Result<(), TakePrivilegesError> {
    let res = plimsoll_sys::ids::process_res_uid().map_err(|e| TakePrivilegesError::Drop {
        step: "read the uids",
        source: Errno::from_io_error(&e).unwrap_or(Errno::IO),
    })?;
    if [res.0, res.1, res.2].contains(&0) {
        return Err(TakePrivilegesError::RootWithoutTrial);
    }
    Ok(())
}

fn check_ids(ids: &TrialIds) -> Result<(), &'static str> {
    if [ids.uid, ids.gid, ids.controller_uid, ids.controller_gid].contains(&0) {
        return Err("an id is 0");
    }
    if ids.uid == ids.controller_uid {
        return Err("the same uid for both");
    }
    if ids.gid == ids.controller_gid {
        return Err("the same gid for both");
    }
    Ok(())
}

/// Checks /proc/self/status (and the no_new_privs flag, read with prctl because gVisor's
/// status file may lack the line) against what a trial job needs: every uid and gid 0,
/// CapEff = CapPrm = {CAP_SETUID, CAP_SETGID}, CapInh and CapAmb empty (CapAmb may be absent,
/// as in gVisor), no_new_privs set. Returns what differs.
pub(crate) fn check_trial_start(status: &str, no_new_privs: bool) -> Result<(), String> {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name).map(str::trim))
    };
    let mut wrong = Vec::new();
    for name in ["Uid:", "Gid:"] {
        match field(name) {
            Some(v) if v.split_whitespace().all(|w| w == "0") && !v.is_empty() => {}
            Some(v) => wrong.push(format!("{name} is `{}`, not all 0", v.replace('\t', " "))),
            None => wrong.push(format!("/proc/self/status has no {name}")),
        }
    }
    for (name, want, required) in [
        ("CapEff:", TRIAL_CAPS, true),
        ("CapPrm:", TRIAL_CAPS, true),
        ("CapInh:", 0, true),
        ("CapAmb:", 0, false),
    ] {
        match field(name).map(|v| (v, u64::from_str_radix(v, 16))) {
            Some((_, Ok(got))) if got == want => {}
            Some((v, _)) => wrong.push(format!("{name} is {v}, not {want:016x}")),
            None if required => wrong.push(format!("/proc/self/status has no {name}")),
            None => {}
        }
    }
    if let Some(v) = field("NoNewPrivs:")
        && v != "1"
    {
        wrong.push(format!("NoNewPrivs: is {v}, not 1"));
    } else if !no_new_privs {
        wrong.push("no_new_privs is not set".into());
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

/// Makes a trial job's ordinary step run as R (real, effective, saved uid; gid G) with no
/// supplementary group and no capability: in the child, the effective uid goes back to 0
/// (the permitted capabilities become effective), then groups, gids and uids are set, and
/// the kernel clears every capability when no uid is 0 any more.
pub(crate) fn as_run_uid(cmd: &mut Command, ids: TrialIds) {
    let (uid, gid) = (Some(ids.uid), Some(ids.gid));
    PreExec::new()
        .unnamed(Step::SetUids(None, Some(0), None))
        .unnamed(Step::DropGroups)
        .unnamed(Step::SetGids(gid, gid, gid))
        .unnamed(Step::SetUids(uid, uid, uid))
        .install_untracked(cmd);
}

/// Makes the trial runner start as uid 0 and gid 0 (real, effective, saved), no
/// supplementary group: exec under no_new_privs gives it permitted = effective = the two
/// capabilities the agent kept, and nothing more.
pub(crate) fn as_runner(cmd: &mut Command) {
    let root = Some(0);
    PreExec::new()
        .unnamed(Step::SetUids(None, root, None))
        .unnamed(Step::DropGroups)
        .unnamed(Step::SetGids(root, root, root))
        .unnamed(Step::SetUids(root, root, root))
        .install_untracked(cmd);
}

/// Kills every process whose real or saved uid is the controller's (those the kernel lets
/// euid C signal; the runner's launcher, whose real and saved uid are R, is one of the
/// agent's descendants, which it kills as R). The agent (euid R) may not signal them, so it
/// takes the controller uid as effective uid for the kills (its real and saved uid stay 0, so those processes cannot signal or trace it
/// meanwhile), then becomes R again. Best effort, except that failing to become R again is an
/// error the agent must stop on.
pub(crate) fn end_controller_processes(ids: &TrialIds) -> Result<(), RestoreUidError> {
    if raw_setresuid(UNCHANGED, 0, UNCHANGED).is_err() {
        return Ok(());
    }
    if raw_setresuid(UNCHANGED, ids.controller_uid, UNCHANGED).is_ok() {
        for pid in processes_of(ids.controller_uid) {
            if let Some(pid) = Pid::from_raw(pid) {
                let _ = kill_process(pid, Signal::KILL);
            }
        }
    }
    let restore = |source| RestoreUidError {
        uid: ids.uid,
        source,
    };
    raw_setresuid(UNCHANGED, 0, UNCHANGED).map_err(restore)?;
    raw_setresuid(UNCHANGED, ids.uid, UNCHANGED).map_err(restore)?;
    let _ = not_dumpable();
    Ok(())
}

/// The directories a controller can write to in a sandbox (the image's root is read-only and
/// the work directory belongs to the run's uid): its files there are removed after a trial
/// step.
pub(crate) const CONTROLLER_WRITABLE: [&str; 3] = ["/tmp", "/dev/shm", "/var/tmp"];

/// Files the controller left behind could not all be removed; the run stops before its next
/// step (a later step, as the run's uid, must not meet them: `HOME` is /tmp, so a planted
/// `/tmp/.local/lib/python3.11/site-packages/x.pth` would run as that uid).
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot remove what the trial's controller left in {}: the run stops here, so no later step meets it",
    .left.join(", ")
)]
pub struct ClearControllerFilesError {
    /// The entries left, each with why.
    pub left: Vec<String>,
}

/// After a trial step: kills every process of the controller uid, then removes every entry
/// the controller owns at the top of `roots` (recursively, without following symbolic
/// links), acting as the controller uid (the agent keeps real uid 0, so nothing of C can
/// touch it meanwhile), and becomes the run's uid again.
pub(crate) fn clear_controller(
    ids: &TrialIds,
    roots: &[&str],
) -> Result<(), ClearControllerFilesError> {
    end_controller_processes(ids).map_err(|e| ClearControllerFilesError {
        left: vec![crate::one_line(&e)],
    })?;
    let mut left = Vec::new();
    let became = raw_setresuid(UNCHANGED, 0, UNCHANGED)
        .and_then(|()| raw_setresuid(UNCHANGED, ids.controller_uid, UNCHANGED));
    if let Err(e) = became {
        left.push(format!("cannot act as uid {}: {e}", ids.controller_uid));
    } else {
        for root in roots {
            let Ok(entries) = std::fs::read_dir(root) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let owned = std::fs::symlink_metadata(&path)
                    .is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == ids.controller_uid);
                if owned && let Err(e) = remove_tree(&path) {
                    left.push(format!("{}: {e}", path.display()));
                }
            }
        }
    }
    let restored = raw_setresuid(UNCHANGED, 0, UNCHANGED)
        .and_then(|()| raw_setresuid(UNCHANGED, ids.uid, UNCHANGED));
    let _ = not_dumpable();
    if let Err(e) = restored {
        left.push(format!("cannot become uid {} again: {e}", ids.uid));
    }
    if left.is_empty() {
        Ok(())
    } else {
        Err(ClearControllerFilesError { left })
    }
}

/// Removes `path` and, for a directory, everything below it, never following a symbolic
/// link; a directory its owner closed (mode 0) is opened up first.
fn remove_tree(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let meta = std::fs::symlink_metadata(path)?;
    if !meta.is_dir() {
        return std::fs::remove_file(path);
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))?;
    for entry in std::fs::read_dir(path)? {
        remove_tree(&entry?.path())?;
    }
    std::fs::remove_dir(path)
}

/// Every process but the agent (not a zombie) with `uid` as real or saved uid, found in
/// /proc.
fn processes_of(uid: u32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    // The agent itself shows `uid` as its effective uid while it kills.
    let me = std::process::id();
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| u32::try_from(pid).is_ok_and(|p| p != me))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/status"))
                .is_ok_and(|s| status_has_uid(&s, uid))
        })
        .collect()
}

/// Whether a /proc/PID/status text shows `uid` as real or saved uid, and the process is not
/// a zombie.
fn status_has_uid(status: &str, uid: u32) -> bool {
    let mut zombie = false;
    let mut found = false;
    for line in status.lines() {
        if let Some(state) = line.strip_prefix("State:") {
            zombie = state.trim_start().starts_with('Z');
        } else if let Some(ids) = line.strip_prefix("Uid:") {
            let ids: Vec<&str> = ids.split_whitespace().collect();
            found = [ids.first(), ids.get(2)]
                .into_iter()
                .flatten()
                .any(|w| w.parse() == Ok(uid));
        }
    }
    found && !zombie
}

/// Makes the agent not dumpable (again: a change of effective ids resets the flag): its
/// /proc/<pid>/{fd,mem,environ,...} are then root's, so a process of the same uid (a
/// session's cell) can neither open its pipes nor read or write its memory.
pub(crate) fn not_dumpable() -> Result<(), Errno> {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
}

fn uid(id: u32) -> Option<rustix::process::Uid> {
    (id != UNCHANGED).then(|| rustix::process::Uid::from_raw(id))
}

/// setresuid(2) of the calling thread (the agent is single-threaded), as the kernel's call
/// (rustix's), not glibc's wrapper that broadcasts to every thread; [`UNCHANGED`] leaves an
/// id.
fn raw_setresuid(r: u32, e: u32, s: u32) -> Result<(), Errno> {
    rustix::thread::set_thread_res_uid(uid(r), uid(e), uid(s))
}

/// setresgid(2) of the calling thread (see [`raw_setresuid`]).
fn raw_setresgid(r: u32, e: u32, s: u32) -> Result<(), Errno> {
    let gid = |id: u32| (id != UNCHANGED).then(|| rustix::process::Gid::from_raw(id));
    rustix::thread::set_thread_res_gid(gid(r), gid(e), gid(s))
}

/// setgroups(2) with an empty list, of the calling thread (see [`raw_setresuid`]).
fn raw_setgroups_empty() -> Result<(), Errno> {
    rustix::thread::set_thread_groups(&[])
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tplimsoll-agent\nState:\tR (running)\nUid:\t0\t0\t0\t0\n\
        Gid:\t0\t0\t0\t0\nGroups:\t\nCapInh:\t0000000000000000\nCapPrm:\t00000000000000c0\n\
        CapEff:\t00000000000000c0\nCapBnd:\t00000000000000c0\nCapAmb:\t0000000000000000\n\
        NoNewPrivs:\t1\n";

    #[test]
    fn a_trial_start_needs_root_the_two_caps_and_no_new_privs() {
        assert_eq!(check_trial_start(STATUS, true), Ok(()));
        // gVisor: no CapAmb and no NoNewPrivs line; the flag comes from prctl.
        let gvisor = STATUS.replace("CapAmb:\t0000000000000000\n", "");
        let gvisor = gvisor.replace("NoNewPrivs:\t1\n", "");
        assert_eq!(check_trial_start(&gvisor, true), Ok(()));
        let e = check_trial_start(&gvisor, false).unwrap_err();
        assert_eq!(e, "no_new_privs is not set");
        let full = STATUS.replace("00000000000000c0", "000001ffffffffff");
        let e = check_trial_start(&full, true).unwrap_err();
        assert!(
            e.contains("CapEff: is 000001ffffffffff, not 00000000000000c0")
                && e.contains("CapPrm:"),
            "{e}"
        );
        let user = STATUS.replace("Uid:\t0\t0\t0\t0", "Uid:\t1000\t1000\t1000\t1000");
        let e = check_trial_start(&user, true).unwrap_err();
        assert_eq!(e, "Uid: is `1000 1000 1000 1000`, not all 0");
        let inh = STATUS.replace("CapInh:\t0000000000000000", "CapInh:\t0000000000000080");
        assert!(check_trial_start(&inh, true).is_err());
        let one_cap = STATUS.replace("CapEff:\t00000000000000c0", "CapEff:\t0000000000000080");
        assert!(check_trial_start(&one_cap, true).is_err());
        let nnp = STATUS.replace("NoNewPrivs:\t1", "NoNewPrivs:\t0");
        assert_eq!(
            check_trial_start(&nnp, true).unwrap_err(),
            "NoNewPrivs: is 0, not 1"
        );
        assert!(check_trial_start("", true).is_err());
    }

    #[test]
    fn trial_ids_must_be_non_zero_and_differ() {
        let ids = TrialIds {
            uid: 10,
            gid: 11,
            controller_uid: 12,
            controller_gid: 13,
        };
        assert_eq!(check_ids(&ids), Ok(()));
        assert!(check_ids(&TrialIds { gid: 0, ..ids }).is_err());
        assert!(
            check_ids(&TrialIds {
                controller_uid: 10,
                ..ids
            })
            .is_err()
        );
        assert!(
            check_ids(&TrialIds {
                controller_gid: 11,
                ..ids
            })
            .is_err()
        );
    }

    #[test]
    fn controller_processes_by_real_or_saved_uid_not_zombies() {
        let status = |state: &str, uids: &str| format!("State:\t{state}\nUid:\t{uids}\n");
        assert!(status_has_uid(&status("S (sleeping)", "7\t7\t7\t7"), 7));
        assert!(status_has_uid(&status("R (running)", "5\t5\t7\t7"), 7));
        // The launcher: real and saved uid R, effective uid C; the agent kills it as R.
        assert!(!status_has_uid(&status("S (sleeping)", "5\t7\t5\t7"), 7));
        assert!(!status_has_uid(&status("Z (zombie)", "7\t7\t7\t7"), 7));
        assert!(!status_has_uid(
            &status("S (sleeping)", "70\t70\t70\t70"),
            7
        ));
    }
}
