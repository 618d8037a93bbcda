//! The launcher: a small process of its own, forked by the runner while the runner still
//! holds CAP_SETUID/CAP_SETGID, that alone holds the controller uid afterwards. It starts each
//! controller as that uid and, at the end of a trial, kills and reaps every process of it. The
//! runner then keeps nothing of the controller uid, so the controller can neither signal it
//! nor read any of its /proc files (docs/trials.md, "Two uids").
//!
//! The launcher runs with `ruid=R euid=C suid=R` (R the runner's uid, C the controller's), no
//! capability, no_new_privs, not dumpable, with the runner's (empty) environment. It is a
//! fork, not an exec: gVisor resets the effective uid to the real one at an exec under
//! no_new_privs, which would lose C. It talks to the runner over a SOCK_SEQPACKET socket, one
//! message per request, the controller's pipe ends passed with SCM_RIGHTS:
//!
//! | runner → launcher | launcher → runner |
//! |---|---|
//! | `spawn` + 3 descriptors (stdin, stdout, stderr) | `started PID` or `error MESSAGE` |
//! | `end` | `ended code N`, `ended signal N`, `ended unknown`, or `error MESSAGE` |
//! | end of stream | (kills every process of C, exits) |
//!
//! Before the first request it sends `ready` (or `error MESSAGE`) once it has checked its own
//! credentials.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::ExitStatusExt as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use plimsoll_sandbox::fds::mark_cloexec_from_proc;
use plimsoll_sys::exec::{PreExec, Step};
use plimsoll_sys::process::{Forked, fork_single_threaded};
use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};
use rustix::process::{Pid, PidfdFlags, Signal, WaitOptions};

use crate::controller::{CONTROLLER_ENV, ControllerCommand, ExitInfo};
use crate::creds::{Identities, check_status, make_undumpable};

/// How long the runner waits for any reply of the launcher (its start included).
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the end of a trial waits for the controller's processes to be gone after SIGKILL.
pub const END_PATIENCE: Duration = Duration::from_secs(2);
/// The largest message.
const MAX_MESSAGE: usize = 256 * 1024;

/// Starting the launcher failed; nothing of the controller ran.
#[derive(Debug, thiserror::Error)]
pub enum StartLauncherError {
    /// The socket could not be made.
    #[error("cannot create the launcher's socket")]
    Socket(#[source] io::Error),
    /// fork failed.
    #[error("cannot fork the launcher")]
    Spawn(#[source] io::Error),
    /// It started but refused or failed its own checks.
    #[error("the launcher did not start")]
    Handshake(#[source] LauncherError),
}

/// Talking to the launcher failed (a runner failure, not the controller's).
#[derive(Debug, thiserror::Error)]
pub enum LauncherError {
    /// It reported an error.
    #[error("the launcher reports: {0}")]
    Reported(String),
    /// No reply in time.
    #[error("the launcher did not reply within {} s", REPLY_TIMEOUT.as_secs())]
    Timeout,
    /// It is gone.
    #[error("the launcher exited")]
    Gone,
    /// A reply that makes no sense.
    #[error("unexpected reply from the launcher: {0:?}")]
    Protocol(String),
    /// Socket I/O failed.
    #[error("cannot talk to the launcher")]
    Io(#[source] io::Error),
}

/// The runner's handle on the launcher.
#[derive(Debug)]
pub struct Launcher {
    /// `None` once closed.
    sock: Option<OwnedFd>,
    pid: Pid,
    waited: bool,
}

impl Drop for Launcher {
    /// Closes the socket and waits for the launcher, which ends every process of the
    /// controller uid before it exits (at most [`END_PATIENCE`] and a little more).
    fn drop(&mut self) {
        self.sock = None;
        if !self.waited {
            let _ = rustix::process::waitpid(Some(self.pid), WaitOptions::empty());
        }
    }
}

impl Launcher {
    /// Forks the launcher, which becomes `ruid=R euid=C suid=R` (gids alike) with no groups,
    /// no capabilities and no_new_privs, and waits until it has checked its own credentials.
    /// Call while the runner still holds CAP_SETUID/CAP_SETGID and has one thread.
    pub fn start(
        ids: &Identities,
        command: &ControllerCommand,
    ) -> Result<Launcher, StartLauncherError> {
        let threads = std::fs::read_dir("/proc/self/task")
            .map(|d| d.count())
            .unwrap_or(0);
        if threads != 1 {
            return Err(StartLauncherError::Socket(io::Error::other(format!(
                "the runner must have one thread when it forks the launcher, not {threads}"
            ))));
        }
        let (ours, theirs) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| StartLauncherError::Socket(e.into()))?;
        // The process has one thread (checked above, and again by the fork), so the child is
        // a complete copy and may run ordinary Rust code; it never returns from
        // `launcher_child`.
        let pid = match fork_single_threaded().map_err(StartLauncherError::Spawn)? {
            Forked::Child => {
                drop(ours);
                launcher_child(ids, command, theirs);
            }
            Forked::Parent(pid) => pid,
        };
        drop(theirs);
        let mut launcher = Launcher {
            sock: Some(ours),
            pid,
            waited: false,
        };
        let reply = launcher
            .wait_reply()
            .map_err(StartLauncherError::Handshake)?;
        if reply != "ready" {
            return Err(StartLauncherError::Handshake(LauncherError::Protocol(
                reply,
            )));
        }
        Ok(launcher)
    }

    /// Starts a controller with these as its stdin, stdout and stderr; returns its pid.
    pub fn spawn(
        &mut self,
        stdin: OwnedFd,
        stdout: OwnedFd,
        stderr: OwnedFd,
    ) -> Result<i32, LauncherError> {
        let reply = self.request(b"spawn", vec![stdin, stdout, stderr])?;
        reply
            .strip_prefix("started ")
            .and_then(|p| p.parse().ok())
            .ok_or(LauncherError::Protocol(reply))
    }

    /// Ends the current controller: every process of the controller uid killed and reaped.
    /// Returns how its first process ended.
    pub fn end(&mut self) -> Result<Option<ExitInfo>, LauncherError> {
        let reply = self.request(b"end", Vec::new())?;
        let parsed = match reply.split(' ').collect::<Vec<_>>().as_slice() {
            ["ended", "code", n] => n.parse().ok().map(|n| Some(ExitInfo::Code(n))),
            ["ended", "signal", n] => n.parse().ok().map(|n| Some(ExitInfo::Signal(n))),
            ["ended", "unknown"] => Some(None),
            _ => None,
        };
        parsed.ok_or(LauncherError::Protocol(reply))
    }

    /// Closes the socket (the launcher ends what is left and exits) and waits for it.
    pub fn shutdown(mut self) -> Result<(), LauncherError> {
        self.sock = None;
        self.waited = true;
        let status = rustix::process::waitpid(Some(self.pid), WaitOptions::empty())
            .map_err(|e| LauncherError::Io(e.into()))?;
        match status.map(|(_, s)| s.exit_status()) {
            Some(Some(0)) => Ok(()),
            other => Err(LauncherError::Reported(format!("it ended with {other:?}"))),
        }
    }

    /// Sends one message and waits for one text reply. `error ...` replies become
    /// [`LauncherError::Reported`].
    fn request(&mut self, message: &[u8], fds: Vec<OwnedFd>) -> Result<String, LauncherError> {
        let sock = self.sock.as_ref().ok_or(LauncherError::Gone)?;
        send(sock, message, &fds).map_err(LauncherError::Io)?;
        // The launcher has its own copies now; ours must go, or the pipes never see EOF.
        drop(fds);
        self.wait_reply()
    }

    /// Waits for one text reply; `error ...` becomes [`LauncherError::Reported`].
    fn wait_reply(&mut self) -> Result<String, LauncherError> {
        let sock = self.sock.as_ref().ok_or(LauncherError::Gone)?;
        let deadline = Instant::now() + REPLY_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(LauncherError::Timeout);
            }
            let mut pfd = [PollFd::new(sock, PollFlags::IN)];
            let timeout = Timespec {
                tv_sec: left.as_secs() as _,
                tv_nsec: left.subsec_nanos() as _,
            };
            match poll(&mut pfd, Some(&timeout)) {
                Ok(0) | Err(rustix::io::Errno::INTR) => continue,
                Ok(_) => break,
                Err(e) => return Err(LauncherError::Io(e.into())),
            }
        }
        let (bytes, _) = recv(sock).map_err(LauncherError::Io)?;
        let Some(bytes) = bytes else {
            return Err(LauncherError::Gone);
        };
        let reply = String::from_utf8_lossy(&bytes).into_owned();
        match reply.strip_prefix("error ") {
            Some(message) => Err(LauncherError::Reported(message.to_owned())),
            None => Ok(reply),
        }
    }
}

/// The forked launcher: credentials, then [`serve`]. Never returns.
fn launcher_child(ids: &Identities, command: &ControllerCommand, sock: OwnedFd) -> ! {
    let code = match become_launcher(ids).and_then(|()| serve(ids, command, &sock)) {
        Ok(()) => 0,
        Err(e) => {
            // The runner reports it; say it here only if the runner cannot hear it.
            if send(&sock, format!("error {e}").as_bytes(), &[]).is_err() {
                eprintln!("plimsoll-trial-launcher: error: {e}");
            }
            3
        }
    };
    // At once, without the parent's atexit handlers or a flush of stdio buffers copied at the
    // fork.
    plimsoll_sys::process::exit_now(code)
}

/// In the forked launcher: stdin and stdout to /dev/null (stdout is the runner's verdict),
/// the credentials, then a check of them.
fn become_launcher(ids: &Identities) -> Result<(), String> {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| format!("/dev/null: {e}"))?;
    for target in [0, 1] {
        plimsoll_sys::fds::redirect_stdio(&null, target).map_err(|e| format!("dup2: {e}"))?;
    }
    let (r, c) = (ids.runner_uid, ids.controller_uid);
    let (rg, cg) = (ids.runner_gid, ids.controller_gid);
    // The process has one thread.
    let switched = plimsoll_sys::ids::clear_process_groups()
        .and_then(|()| plimsoll_sys::ids::set_process_res_gid(rg, cg, rg))
        .and_then(|()| plimsoll_sys::ids::set_process_res_uid(r, c, r));
    if let Err(e) = switched {
        return Err(format!(
            "cannot switch to the controller uid: the runner needs CAP_SETUID and CAP_SETGID when it starts (run it as root, or as root in a container that keeps only these two capabilities; docs/trials.md): {e}"
        ));
    }
    let none = rustix::thread::CapabilitySet::empty();
    rustix::thread::set_capabilities(
        None,
        rustix::thread::CapabilitySets {
            effective: none,
            permitted: none,
            inheritable: none,
        },
    )
    .map_err(|e| format!("cannot clear the capabilities: {e}"))?;
    match rustix::thread::clear_ambient_capability_set() {
        Ok(()) | Err(rustix::io::Errno::INVAL) => {}
        Err(e) => return Err(format!("cannot clear the ambient capabilities: {e}")),
    }
    rustix::thread::set_no_new_privs(true).map_err(|e| format!("no_new_privs: {e}"))?;
    make_undumpable().map_err(|e| format!("cannot make the launcher not dumpable: {e}"))?;
    let _ = rustix::thread::set_name(c"plimsoll-launch");
    // The filesystem ids follow the effective ones.
    check_status([r, c, r, c], [rg, cg, rg, cg]).map_err(|e| format!("launcher credentials: {e}"))
}

fn send(sock: &OwnedFd, message: &[u8], fds: &[OwnedFd]) -> io::Result<()> {
    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !borrowed.is_empty() && !control.push(SendAncillaryMessage::ScmRights(&borrowed)) {
        return Err(io::Error::other("too many descriptors for one message"));
    }
    let sent = rustix::net::sendmsg(
        sock,
        &[IoSlice::new(message)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if sent != message.len() {
        return Err(io::Error::other("short send on a SOCK_SEQPACKET socket"));
    }
    Ok(())
}

/// One message and the descriptors that came with it; `None` at the end of the stream.
fn recv(sock: &OwnedFd) -> io::Result<(Option<Vec<u8>>, Vec<OwnedFd>)> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = loop {
        match rustix::net::recvmsg(
            sock,
            &mut [IoSliceMut::new(&mut buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Err(rustix::io::Errno::INTR) => continue,
            other => break other?,
        }
    };
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = m {
            fds.extend(received);
        }
    }
    if got.bytes == 0 && fds.is_empty() {
        return Ok((None, fds));
    }
    if got.flags.contains(rustix::net::ReturnFlags::TRUNC) {
        return Err(io::Error::other("message too long"));
    }
    buf.truncate(got.bytes);
    Ok((Some(buf), fds))
}

/// Serves the runner until its socket closes.
fn serve(ids: &Identities, command: &ControllerCommand, sock: &OwnedFd) -> Result<(), String> {
    let cu = ids.controller_uid;
    let reply = |text: &str| send(sock, text.as_bytes(), &[]).map_err(|e| e.to_string());
    // Orphans of the controller come back to the launcher, which reaps them. gVisor allows
    // this only to the init process (EINVAL); there, orphans go to the sandbox's init, and
    // the launcher still kills them (a zombie it cannot reap no longer counts).
    if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        && e != rustix::io::Errno::INVAL
    {
        return Err(format!("cannot become a child subreaper: {e}"));
    }
    reply("ready")?;

    let mut current: Option<Pid> = None;
    loop {
        let (message, fds) = match recv(sock) {
            Ok(m) => m,
            Err(e) => {
                let _ = end_processes_of_uid(cu, current);
                return Err(format!("cannot read from the runner: {e}"));
            }
        };
        let Some(message) = message else {
            // The runner is done (or gone): nothing of the controller outlives it.
            return match end_processes_of_uid(cu, current.take()) {
                Ok(_) => Ok(()),
                Err(left) => Err(format!("processes of uid {cu} survived SIGKILL: {left:?}")),
            };
        };
        match (message.as_slice(), <[OwnedFd; 3]>::try_from(fds)) {
            (b"spawn", Ok([stdin, stdout, stderr])) => {
                match spawn_controller(command, stdin, stdout, stderr) {
                    Ok(pid) => {
                        current = Some(pid);
                        reply(&format!("started {}", pid.as_raw_nonzero()))?;
                    }
                    Err(e) => reply(&format!("error {e}"))?,
                }
            }
            (b"end", _) => match end_processes_of_uid(cu, current.take()) {
                Ok(Some(ExitInfo::Code(n))) => reply(&format!("ended code {n}"))?,
                Ok(Some(ExitInfo::Signal(n))) => reply(&format!("ended signal {n}"))?,
                Ok(None) => reply("ended unknown")?,
                Err(left) => reply(&format!(
                    "error processes of the controller uid {cu} survived SIGKILL for {} ms: {left:?} (check them with ps; they may be stuck in the kernel)",
                    END_PATIENCE.as_millis()
                ))?,
            },
            (other, _) => {
                let text = String::from_utf8_lossy(other).into_owned();
                reply(&format!("error unknown request {text:?}"))?;
            }
        }
    }
}

/// Starts the controller: uid and gid C (all three of each), its own session, the environment
/// [`CONTROLLER_ENV`], the launcher's working directory (the runner's), no core dumps,
/// SIGKILL if the launcher dies, descriptors above 2 closed.
fn spawn_controller(
    command: &ControllerCommand,
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
) -> Result<Pid, String> {
    mark_cloexec_from_proc().map_err(|e| format!("cannot mark descriptors close-on-exec: {e}"))?;
    let (uid, gid) = (command.uid, command.gid);
    let parent = rustix::process::getpid();
    #[allow(
        clippy::disallowed_methods,
        reason = "the launcher starts the controller: it needs a stdin pipe and the uid switch"
    )]
    let mut cmd = std::process::Command::new(&command.program);
    cmd.args(&command.args)
        .env_clear()
        .envs(CONTROLLER_ENV)
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr));
    controller_child_setup(uid, gid, parent)
        .install(&mut cmd)
        .map_err(|e| format!("cannot prepare the controller's start: {e}"))?;
    let child = cmd.spawn().map_err(|e| {
        format!(
            "cannot start the controller {}: {e}",
            command.program.display()
        )
    })?;
    // The launcher reaps by pid itself (waitpid), never through `Child`.
    Ok(Pid::from_raw(child.id() as i32).expect("a child pid is positive"))
}

/// What the controller's child does between fork and exec (system calls only; the
/// per-thread calls are per-process because the child has one thread).
fn controller_child_setup(uid: u32, gid: u32, parent: Pid) -> PreExec {
    let (u, g) = (Some(uid), Some(gid));
    PreExec::new()
        // The launcher holds C as its effective ids, so an unprivileged process may take them
        // as all three. Gid first: after the uid switch it would not be allowed.
        .step("set the gids", Step::SetGids(g, g, g))
        .step("set the uids", Step::SetUids(u, u, u))
        .step("a session of its own", Step::NewSession)
        // Set after the uid switch, which clears it.
        .step(
            "the parent death signal",
            Step::ParentDeathSignal(Signal::KILL),
        )
        // The launcher is gone.
        .step("the launcher is there", Step::RequireParent(parent))
        .step("no core dumps", Step::no_core_dumps())
        .step(
            "close inherited descriptors",
            Step::CloseInherited { required: false },
        )
}

/// Kills the process group of `main` and every process whose real, effective, saved or
/// filesystem uid is `uid` (other than this one), reaps them (orphans come back to the
/// launcher, a child subreaper), and returns how `main` ended. On timeout, the pids left.
fn end_processes_of_uid(uid: u32, main: Option<Pid>) -> Result<Option<ExitInfo>, Vec<i32>> {
    if let Some(pid) = main {
        let _ = rustix::process::kill_process_group(pid, Signal::KILL);
    }
    let started = Instant::now();
    let me = std::process::id() as i32;
    let mut exit = None;
    loop {
        let left = processes_of_uid(uid, me);
        for &pid in &left {
            kill_by_pidfd(pid, uid);
        }
        while let Ok(Some((pid, status))) = rustix::process::wait(WaitOptions::NOHANG) {
            if Some(pid) == main {
                let raw = std::process::ExitStatus::from_raw(status.as_raw());
                exit = raw
                    .code()
                    .map(ExitInfo::Code)
                    .or(raw.signal().map(ExitInfo::Signal));
            }
        }
        if left.is_empty() {
            return Ok(exit);
        }
        if started.elapsed() >= END_PATIENCE {
            return Err(left);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// SIGKILL to `pid` through a pidfd, after checking (on the process the pidfd pins) that it
/// still belongs to `uid`.
fn kill_by_pidfd(pid: i32, uid: u32) {
    let Some(p) = Pid::from_raw(pid) else {
        return;
    };
    match rustix::process::pidfd_open(p, PidfdFlags::empty()) {
        Ok(fd) => {
            if status_uids(pid).is_some_and(|uids| uids.contains(&uid)) {
                let _ = rustix::process::pidfd_send_signal(&fd, Signal::KILL);
            }
        }
        // No pidfds (gVisor, old kernels): kill(2). The launcher can signal only processes
        // of the runner's and the controller's uids, so a recycled pid could only be one of
        // those.
        Err(rustix::io::Errno::NOSYS) => {
            if status_uids(pid).is_some_and(|uids| uids.contains(&uid)) {
                let _ = rustix::process::kill_process(p, Signal::KILL);
            }
        }
        Err(_) => {} // gone
    }
}

/// Pids (other than `me`) with `uid` as real, effective, saved or filesystem uid, living or
/// zombies of `me` (which `me` can reap); a zombie of another parent is already dead.
pub fn processes_of_uid(uid: u32, me: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|&pid| {
            pid != me
                && status_info(pid)
                    .is_some_and(|s| s.uids.contains(&uid) && (!s.zombie || s.ppid == me))
        })
        .collect()
}

/// What the scan needs of /proc/PID/status.
struct StatusInfo {
    uids: Vec<u32>,
    ppid: i32,
    zombie: bool,
}

fn status_info(pid: i32) -> Option<StatusInfo> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name));
    Some(StatusInfo {
        uids: field("Uid:")?
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect(),
        ppid: field("PPid:")?.trim().parse().ok()?,
        zombie: field("State:")?.trim_start().starts_with('Z'),
    })
}

fn status_uids(pid: i32) -> Option<Vec<u32>> {
    status_info(pid).map(|s| s.uids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_carry_descriptors() {
        let (a, b) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        let (r, w) = rustix::pipe::pipe().unwrap();
        send(&a, b"spawn", &[r, w]).unwrap();
        let (m, fds) = recv(&b).unwrap();
        assert_eq!(m.as_deref(), Some(&b"spawn"[..]));
        assert_eq!(fds.len(), 2);
        drop(a);
        let (m, fds) = recv(&b).unwrap();
        assert!(m.is_none() && fds.is_empty());
    }
}
