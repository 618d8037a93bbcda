//! The split daemon (docs/privileges.md, "The split daemon"): with `[daemon] serving_user`,
//! plimsolld keeps root only in a launcher process of its own (`plimsolld launcher`, which
//! hosts the providers behind a Unix socket, `plimsoll_engine::launch`), and the process
//! that serves HTTP and MCP, parses requests and what sandboxes send back, and keeps sessions
//! runs as the serving user, with no capability and no_new_privs.
//!
//! What must be root happens first, in `main`, before any other thread: the listen address
//! is bound, the launcher's socket made and the launcher started (as root, dying with this
//! process), the serving user's lease directory made. Then this process drops to the serving
//! user for good and only then starts its runtime, so every thread it will ever have is
//! unprivileged from its first instruction.

use std::io;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use plimsoll_broker::apart::ProcessUser;
use plimsoll_engine::settings::Settings;
use plimsoll_sandbox::spawn::{Running, Spawn};
use plimsoll_sandbox::{PreExec, Step};

use crate::daemon::{DaemonOptions, StartDaemonError};

pub mod filter;

/// `plimsolld launcher`: the hidden first argument that makes plimsolld the launcher.
pub const LAUNCHER_ARG: &str = "launcher";

/// Where the launcher finds its listening socket.
const LAUNCHER_FD: i32 = 3;

/// Where the launcher finds the read end of a pipe carrying the values of the variables the
/// grants file names (`NAME=value`, each followed by a NUL byte), when it is given a grants
/// file.
const SECRETS_FD: i32 = 5;

/// The most bytes of grant variables the launcher takes.
const SECRETS_MAX: usize = 1 << 20;

/// Where the launcher finds the read end of a pipe whose only writer is the daemon: its end
/// is the daemon's. (A parent-death signal cannot do it: the daemon, no longer root by then,
/// may not signal a root process, and the kernel checks that for the parent-death signal too.)
const DAEMON_GONE_FD: i32 = 4;

/// What `main` made as root for the serving process, which is unprivileged from then on.
#[derive(Debug)]
pub struct Prepared {
    /// The bound listen address.
    pub listener: std::net::TcpListener,
    /// The launcher's socket.
    pub socket: PathBuf,
    /// The launcher process.
    launcher: Option<Running>,
    /// The write end of the launcher's pipe, held for this process's life.
    _alive: std::io::PipeWriter,
    /// The options the settings give.
    pub options: DaemonOptions,
    /// The serving user.
    pub user: ProcessUser,
    /// Whether the launcher was given a grants file (it holds it, its secrets and the
    /// broker process).
    pub grants: bool,
}

impl Prepared {
    /// The launcher's process id.
    pub fn launcher_pid(&self) -> Option<u32> {
        self.launcher.as_ref().map(|r| r.child.id())
    }

    /// Copies the launcher's log lines to this process's standard error on a thread of its
    /// own (started after the drop, so unprivileged like every other thread), and logs its
    /// end.
    pub fn forward_launcher_log(&mut self) {
        let Some(running) = self.launcher.take() else {
            return;
        };
        let _ = std::thread::Builder::new()
            .name("launcher-log".into())
            .spawn(move || {
                use std::io::{BufRead as _, Write as _};
                let mut running = running;
                let stderr = io::BufReader::new(&mut running.stderr);
                for line in stderr.split(b'\n') {
                    let Ok(line) = line else { break };
                    let mut err = io::stderr().lock();
                    let _ = err.write_all(&line);
                    let _ = err.write_all(b"\n");
                }
                let status = running.child.wait();
                tracing::error!(
                    ?status,
                    "the launcher ended: no run can start until plimsolld is restarted"
                );
            });
    }
}

/// The serving user `[daemon] serving_user` names, when it names one.
pub fn serving_user(settings: &Settings) -> Option<&str> {
    settings.daemon.serving_user.as_deref()
}

/// Everything the split daemon does as root, then the drop to the serving user. Call from
/// `main` before any other thread exists.
pub fn prepare(
    settings: &Settings,
    settings_file: Option<&Path>,
    listen: Option<&str>,
    grants_file: Option<&Path>,
) -> Result<Prepared, StartDaemonError> {
    let invalid = |message: String| StartDaemonError::Invalid {
        key: "serving_user",
        message,
    };
    let name = serving_user(settings).ok_or_else(|| invalid("is not set".into()))?;
    let user = ProcessUser::lookup(name).map_err(|problem| StartDaemonError::ServingUser {
        user: name.to_owned(),
        problem,
    })?;
    let mut options = DaemonOptions::from_settings(settings, listen)?;
    if let Some(g) = grants_file {
        options.grants_file = Some(g.to_owned());
    }
    let Some(file) = settings_file else {
        return Err(invalid(
            "needs a settings file (--config or PLIMSOLL_CONFIG): the launcher reads the same one"
                .into(),
        ));
    };
    let threads = plimsoll_sys::process::thread_count().map_err(StartDaemonError::Serve)?;
    if threads != 1 {
        return Err(StartDaemonError::Split(format!(
            "plimsolld has {threads} threads before it drops to the serving user; it must have one"
        )));
    }
    // The grants file, checked here as the default daemon checks it (its secrets read from
    // this process's environment), for the launcher, which is given those variables alone
    // and loads it again itself. They are then gone from this process.
    let grants = match &options.grants_file {
        Some(path) => {
            crate::daemon::broker_user(&options.broker_user)?;
            Some((path.clone(), crate::daemon::load_grants(Some(path))?))
        }
        None => None,
    };
    let listener =
        std::net::TcpListener::bind(options.listen).map_err(|source| StartDaemonError::Bind {
            addr: options.listen,
            source,
        })?;
    listener
        .set_nonblocking(true)
        .map_err(StartDaemonError::Serve)?;
    let split = |what: &str, e: io::Error| StartDaemonError::Split(format!("{what}: {e}"));
    // The launcher's socket: in a directory of this daemon's own, reachable by the serving
    // user, which the launcher checks by its peer credentials on every connection. Those of
    // daemons gone are removed.
    remove_stale_launch_dirs();
    let dir = PathBuf::from(format!("{LAUNCH_DIR_PREFIX}{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| split("making the launcher's directory", e))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| split("the launcher's directory", e))?;
    let socket = dir.join("launcher.sock");
    let unix = std::os::unix::net::UnixListener::bind(&socket)
        .map_err(|e| split("binding the launcher's socket", e))?;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666))
        .map_err(|e| split("the launcher's socket", e))?;
    let (gone, alive) = std::io::pipe().map_err(|e| split("the launcher's pipe", e))?;
    // The launcher starts in `/`: it is given absolute paths.
    let file = std::path::absolute(file).map_err(|e| split("the settings file's path", e))?;
    let grants = grants
        .map(|(path, profiles)| std::path::absolute(&path).map(|p| (p, profiles)))
        .transpose()
        .map_err(|e| split("the grants file's path", e))?;
    let secrets: &[(String, plimsoll_secret::Secret)] = grants
        .as_ref()
        .and_then(|(_, profiles)| profiles.source())
        .map(|source| source.env())
        .unwrap_or_default();
    let launcher = start_launcher(
        &file,
        user.uid,
        unix,
        gone,
        grants.as_ref().map(|(path, _)| path.as_path()),
        secrets,
    )
    .map_err(|e| split("starting the launcher", e))?;
    for (name, _) in secrets {
        plimsoll_sys::process::scrub_env(name)
            .map_err(|e| split("removing a grant's variable from the environment", e))?;
    }
    let has_grants = grants.is_some();
    // The values read (zeroed as they drop).
    drop(grants);
    // The serving process's uid leases (docs/privileges.md): its own directory, under the
    // state directory, which stays root's (the launcher makes run directories in it).
    let state = settings.engine_config().state_dir;
    let leases = plimsoll_sandbox::uidlease::unprivileged_lease_dir(&state);
    std::fs::create_dir_all(&leases).map_err(|e| split("making the lease directory", e))?;
    let mode = std::fs::metadata(&state)
        .map_err(|e| split("the state directory", e))?
        .permissions()
        .mode();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(mode | 0o111))
        .map_err(|e| split("the state directory", e))?;
    for entry in std::iter::once(leases.clone()).chain(
        std::fs::read_dir(&leases)
            .map_err(|e| split("the lease directory", e))?
            .flatten()
            .map(|e| e.path()),
    ) {
        rustix::fs::chown(
            &entry,
            Some(rustix::fs::Uid::from_raw(user.uid)),
            Some(rustix::fs::Gid::from_raw(user.gid)),
        )
        .map_err(|e| split("giving the lease directory to the serving user", e.into()))?;
    }
    drop_to(user).map_err(|e| split("dropping to the serving user", e))?;
    Ok(Prepared {
        listener,
        socket,
        _alive: alive,
        launcher: Some(launcher),
        options,
        user,
        grants: has_grants,
    })
}

/// Each split daemon's launcher socket is in `<this><daemon pid>`.
const LAUNCH_DIR_PREFIX: &str = "/run/plimsoll-launch-";

/// Removes the launcher directories of daemons no longer running.
fn remove_stale_launch_dirs() {
    let Ok(entries) = std::fs::read_dir("/run") else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(pid) = path
            .to_str()
            .and_then(|p| p.strip_prefix(LAUNCH_DIR_PREFIX))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// Starts `plimsolld launcher` as root, hosting the providers of the settings in `file` for
/// the serving uid, `listener` at its [`LAUNCHER_FD`]; it dies with this process. With a
/// grants file, the values of the variables it names (`secrets`) go to the launcher over a
/// pipe ([`SECRETS_FD`]), written straight from where they are held, so no copy of them is
/// left in this process (an environment given to a child is copied, and the copies are freed
/// unzeroed).
fn start_launcher(
    file: &Path,
    peer_uid: u32,
    listener: std::os::unix::net::UnixListener,
    gone: std::io::PipeReader,
    grants: Option<&Path>,
    secrets: &[(String, plimsoll_secret::Secret)],
) -> io::Result<Running> {
    let steps = PreExec::new()
        .step(
            "die with the daemon",
            Step::ParentDeathSignal(rustix::process::Signal::KILL),
        )
        .step(
            "the daemon is still there",
            Step::RequireParent(rustix::process::getpid()),
        );
    let mut spawn = Spawn::new(plimsoll_broker::apart::OWN_PROGRAM, "/")
        .arg(LAUNCHER_ARG)
        .arg(file)
        .arg(peer_uid.to_string());
    let mut carry = None;
    let mut fds: Vec<(std::os::fd::OwnedFd, i32)> = vec![
        (listener.into(), LAUNCHER_FD),
        (gone.into(), DAEMON_GONE_FD),
    ];
    if let Some(path) = grants {
        spawn = spawn.arg(path);
        let (read, write) = std::io::pipe()?;
        fds.push((read.into(), SECRETS_FD));
        carry = Some(write);
    }
    let running = spawn
        .before_exec(steps.step("the launcher's descriptors", Step::PlaceFds(fds)))
        .spawn()
        .map_err(|e| io::Error::other(plimsoll_sandbox::error_chain(&e)))?;
    if let Some(mut write) = carry {
        use std::io::Write as _;
        for (name, value) in secrets {
            write.write_all(name.as_bytes())?;
            write.write_all(b"=")?;
            write.write_all(value.expose().as_bytes())?;
            write.write_all(b"\0")?;
        }
    }
    Ok(running)
}

/// Drops this process (one thread) to `user` for good: the bounding set emptied, no
/// supplementary group, every uid and gid the user's (which clears the permitted and
/// effective sets), no_new_privs, not dumpable, the serving process's seccomp allowlist
/// ([`filter`]); then checks what the kernel says.
fn drop_to(user: ProcessUser) -> io::Result<()> {
    plimsoll_sys::caps::limit_bounding_set(0);
    plimsoll_sys::ids::clear_process_groups()?;
    plimsoll_sys::ids::set_process_res_gid(user.gid, user.gid, user.gid)?;
    plimsoll_sys::ids::set_process_res_uid(user.uid, user.uid, user.uid)?;
    rustix::thread::set_no_new_privs(true)?;
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)?;
    let ids = plimsoll_sys::ids::process_res_uid()?;
    // The filter last: from here on, only what it lets through.
    filter::install()?;
    let status = std::fs::read_to_string("/proc/self/status")?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or("")
            .to_owned()
    };
    for (name, want) in [
        ("CapEff:", "0000000000000000"),
        ("CapPrm:", "0000000000000000"),
        ("CapBnd:", "0000000000000000"),
        ("NoNewPrivs:", "1"),
        ("Seccomp:", "2"),
    ] {
        if field(name) != want {
            return Err(io::Error::other(format!(
                "after the drop {name} is {}, not {want}",
                field(name)
            )));
        }
    }
    if ids != (user.uid, user.uid, user.uid) {
        return Err(io::Error::other(format!(
            "after the drop the uids are {ids:?}"
        )));
    }
    Ok(())
}

/// `plimsolld launcher FILE PEER_UID [GRANTS_FILE]`: the launcher, as the split daemon starts
/// it. Serves until the daemon goes (it is killed with it). With a grants file, it starts the
/// broker process (as `[daemon] broker_user`) and keeps it running.
pub fn launcher_main(mut args: impl Iterator<Item = std::ffi::OsString>) -> io::Result<()> {
    let (Some(file), Some(peer)) = (args.next(), args.next()) else {
        return Err(io::Error::other(
            "usage: plimsolld launcher SETTINGS_FILE PEER_UID [GRANTS_FILE] (plimsolld starts it itself)",
        ));
    };
    let grants_file = args.next().map(PathBuf::from);
    // The grant variables' values, read at once (the daemon writes them after starting this
    // process, then closes its end), into one buffer that never grows (so no copy is freed
    // unzeroed) and is zeroed when dropped.
    let secrets = match &grants_file {
        Some(_) => read_secrets(plimsoll_sys::fds::adopt_inherited(SECRETS_FD)?)?,
        None => Vec::new(),
    };
    let peer: u32 = peer
        .to_str()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| io::Error::other("the peer uid is not a number"))?;
    let fd = plimsoll_sys::fds::adopt_inherited(LAUNCHER_FD)?;
    let listener = std::os::unix::net::UnixListener::from(fd);
    let gone = plimsoll_sys::fds::adopt_inherited(DAEMON_GONE_FD)?;
    std::thread::Builder::new()
        .name("daemon-gone".into())
        .spawn(move || {
            use std::io::Read as _;
            let mut gone = std::fs::File::from(gone);
            let _ = gone.read(&mut [0u8; 1]);
            // Nothing to say: its log went to the daemon, which is gone.
            plimsoll_sys::process::exit_now(0);
        })?;
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)?;
    let settings =
        Settings::load(Path::new(&file)).map_err(|e| io::Error::other(format!("{e:#}")))?;
    let mut launcher = settings
        .build_launcher(&[], peer)
        .map_err(|e| io::Error::other(plimsoll_sandbox::error_chain(&e)))?;
    if let Some(path) = grants_file {
        let name = settings
            .daemon
            .broker_user
            .clone()
            .unwrap_or_else(|| plimsoll_broker::apart::DEFAULT_USER.to_owned());
        let user = ProcessUser::lookup(&name).map_err(|problem| {
            io::Error::other(format!("the broker process's user `{name}`, {problem}"))
        })?;
        let grants = plimsoll_engine::launch::LauncherGrants::start(&path, user, secrets)
            .map_err(io::Error::other)?;
        tracing::info!(
            broker_pid = grants.broker_pid(),
            grants_file = %path.display(),
            "the launcher loaded the grants file and keeps the broker process"
        );
        launcher = launcher.with_grants(grants);
    }
    tracing::info!(peer_uid = peer, "launcher up");
    std::sync::Arc::new(launcher).serve(listener)
}

/// The `NAME=value` pairs (each followed by a NUL byte) the daemon writes on `fd`, up to its
/// end: at most [`SECRETS_MAX`] bytes, read into one buffer of that capacity.
fn read_secrets(fd: std::os::fd::OwnedFd) -> io::Result<Vec<(String, plimsoll_secret::Secret)>> {
    use std::io::Read as _;
    let mut raw = Vec::with_capacity(SECRETS_MAX + 1);
    std::fs::File::from(fd)
        .take(SECRETS_MAX as u64 + 1)
        .read_to_end(&mut raw)?;
    let raw = plimsoll_secret::Secret::<Vec<u8>>::new(raw);
    if raw.expose().len() > SECRETS_MAX {
        return Err(io::Error::other(format!(
            "the grants' variables are over {SECRETS_MAX} bytes"
        )));
    }
    raw.expose()
        .split(|b| *b == 0)
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            let text = std::str::from_utf8(entry)
                .map_err(|_| io::Error::other("a grant variable is not UTF-8"))?;
            let (name, value) = text
                .split_once('=')
                .ok_or_else(|| io::Error::other("a grant variable without `=`"))?;
            Ok((name.to_owned(), plimsoll_secret::Secret::new(value)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the daemon wrote on a pipe, read as the launcher reads it.
    fn read(bytes: Vec<u8>) -> io::Result<Vec<(String, String)>> {
        let (r, mut w) = std::io::pipe().unwrap();
        let writer = std::thread::spawn(move || {
            use std::io::Write as _;
            // The reader stops at its limit and closes: a longer write ends in EPIPE.
            let _ = w.write_all(&bytes);
        });
        let read = read_secrets(r.into());
        writer.join().unwrap();
        read.map(|pairs| {
            pairs
                .into_iter()
                .map(|(n, v)| (n, v.expose().clone()))
                .collect()
        })
    }

    #[test]
    fn the_launcher_reads_each_variable_and_refuses_what_is_not_one() {
        assert_eq!(
            read(b"A=1\0B=x=y\0".to_vec()).unwrap(),
            [("A".into(), "1".into()), ("B".into(), "x=y".into())]
        );
        assert_eq!(read(Vec::new()).unwrap(), []);
        let e = read(b"A\0".to_vec()).unwrap_err().to_string();
        assert!(e.contains("without `=`"), "{e}");
        let e = read(b"A=\xff\0".to_vec()).unwrap_err().to_string();
        assert!(e.contains("not UTF-8"), "{e}");
        // SECRETS_MAX bytes are taken; one more is refused, not read on without end.
        let mut at_most = b"A=".to_vec();
        at_most.resize(SECRETS_MAX, b'v');
        assert_eq!(read(at_most).unwrap()[0].1.len(), SECRETS_MAX - 2);
        let mut over = b"A=".to_vec();
        over.resize(SECRETS_MAX + 1, b'v');
        let e = read(over).unwrap_err().to_string();
        assert!(e.contains("over 1048576 bytes"), "{e}");
    }
}
