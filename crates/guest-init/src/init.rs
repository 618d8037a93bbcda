//! The guest's PID 1 (`plimsoll-guest-init`), started by the initramfs stage
//! (`crates/vm/guest/init`) once the sandbox image is mounted read-only under a tmpfs overlay
//! and switched to: it opens the channel, says hello, receives the run's limits and job,
//! sets up `/dev`, `/work`, `/tmp`, the run's cgroup and loopback, remounts the root
//! read-only, runs `plimsoll-agent` as the unprivileged `sandbox` user (for a job with a
//! trial step: as uid 0 with exactly CAP_SETUID and CAP_SETGID, which the agent splits
//! itself), streams its answer back and powers the VM off. A session's VM has no job: its
//! agent (`--session`) serves calls, its stdin and stdout relayed over the channel until
//! the host ends the VM.
//!
//! Everything here runs inside the guest as root; nothing here is trusted by the host.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::os::unix::process::ExitStatusExt as _;
use std::process::Stdio;
use std::time::Instant;

use plimsoll_sys::exec::{PreExec, Step};

use crate::channel::{self, GuestLimits};
use crate::layout::*;

/// The guest init failed.
#[derive(Debug, thiserror::Error)]
pub enum GuestInitError {
    /// A mount failed.
    #[error("cannot mount {fstype} on {target}")]
    Mount {
        /// Where.
        target: String,
        /// What.
        fstype: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A file or directory operation failed.
    #[error("cannot set up {path}")]
    Setup {
        /// What.
        path: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The virtio-serial port is missing.
    #[error("no virtio-serial port named `{PORT_NAME}` under /sys/class/virtio-ports")]
    NoPort,
    /// Talking to the host failed.
    #[error("the channel to the host failed")]
    Channel(#[source] io::Error),
    /// The host sent something unexpected.
    #[error("protocol: {0}")]
    Protocol(String),
    /// The agent could not be started.
    #[error("cannot start {AGENT}")]
    Agent(#[source] io::Error),
}

fn setup_err(path: &str) -> impl FnOnce(io::Error) -> GuestInitError + '_ {
    move |source| GuestInitError::Setup {
        path: path.to_owned(),
        source,
    }
}

fn cstr(s: &str) -> CString {
    // Only our own constant paths and options come here; none holds a NUL.
    CString::new(s).unwrap_or_default()
}

fn mount(
    source: &str,
    target: &str,
    fstype: &str,
    flags: libc::c_ulong,
    data: &str,
) -> Result<(), GuestInitError> {
    let d = cstr(data);
    rustix::mount::mount(
        source,
        target,
        fstype,
        // The MS_* constants are the mount flags' bits.
        rustix::mount::MountFlags::from_bits_retain(flags as _),
        (!data.is_empty()).then_some(d.as_c_str()),
    )
    .map_err(|e| GuestInitError::Mount {
        target: target.to_owned(),
        fstype: fstype.to_owned(),
        source: e.into(),
    })
}

/// Seconds since the guest kernel started, from /proc/uptime.
fn uptime() -> f64 {
    fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(-1.0)
}

/// The guest init's whole life: never returns, ends by powering the VM off.
pub fn main() -> ! {
    let mut port: Option<File> = None;
    if let Err(e) = run(&mut port) {
        let mut line = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            line.push_str(": ");
            line.push_str(&s.to_string());
            source = s.source();
        }
        eprintln!("plimsoll-guest-init: {line}");
        if let Some(p) = port.as_mut() {
            let _ = channel::write_frame(p, channel::FATAL, line.as_bytes());
            wait_for_ack(p);
        }
    }
    power_off()
}

fn power_off() -> ! {
    // With `reboot=t` on the kernel command line and QEMU's `-no-reboot`, a reboot ends QEMU.
    rustix::fs::sync();
    let _ = rustix::system::reboot(rustix::system::RebootCommand::Restart);
    // reboot(2) does not return for PID 1 with CAP_SYS_BOOT; if it did, panic the kernel
    // (`panic=-1` reboots, which also ends QEMU).
    std::process::exit(1)
}

fn run(port_slot: &mut Option<File>) -> Result<(), GuestInitError> {
    let nosuid_nodev_noexec = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    mount("proc", "/proc", "proc", nosuid_nodev_noexec, "")?;
    let uptime_init = uptime();
    mount(
        "sysfs",
        "/sys",
        "sysfs",
        nosuid_nodev_noexec | libc::MS_RDONLY,
        "",
    )?;

    // The port is found on a private devtmpfs that is gone before any code runs: code in the
    // guest gets a /dev with only the harmless nodes below.
    let private_dev = format!("{PRIVATE}/dev");
    fs::create_dir_all(&private_dev).map_err(setup_err(&private_dev))?;
    fs::set_permissions(PRIVATE, fs::Permissions::from_mode(0o700)).map_err(setup_err(PRIVATE))?;
    mount("devtmpfs", &private_dev, "devtmpfs", libc::MS_NOSUID, "")?;
    let port_dev = find_port()?;
    let port_path = format!("{private_dev}/{port_dev}");
    let port = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(&port_path)
        .map_err(setup_err(&port_path))?;
    // The broker's port exists only in a run with a grant, the egress port only in a run
    // with an egress grant.
    let broker_port = open_named_port(&private_dev, BROKER_PORT_NAME)?;
    let egress_port = open_named_port(&private_dev, EGRESS_PORT_NAME)?;
    let port = port_slot.insert(port);
    let _ = rustix::mount::unmount(private_dev.as_str(), rustix::mount::UnmountFlags::DETACH);
    let _ = fs::remove_dir(&private_dev);
    let _ = fs::remove_dir(PRIVATE);
    make_dev()?;

    let uname = rustix::system::uname();
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
        .unwrap_or_default();
    let hypervisor = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .is_some_and(|l| l.split_whitespace().any(|f| f == "hypervisor"));
    let hello = channel::encode_record([
        ("uptime_s", format!("{uptime_init:.3}")),
        ("kernel", uname.release().to_string_lossy().into_owned()),
        ("cpu", model),
        ("hypervisor_flag", hypervisor.to_string()),
        (
            "cpus",
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(0)
                .to_string(),
        ),
    ]);
    channel::write_frame(port, channel::HELLO, &hello).map_err(GuestInitError::Channel)?;

    let limits = match channel::read_frame(port, channel::RECORD_MAX) {
        Ok(Some((channel::LIMITS, p))) => {
            GuestLimits::decode(&p).map_err(|e| GuestInitError::Protocol(e.to_string()))?
        }
        Ok(other) => {
            return Err(GuestInitError::Protocol(format!(
                "expected the limits, got {:?}",
                other.map(|(t, _)| t as char)
            )));
        }
        Err(e) => return Err(GuestInitError::Channel(e)),
    };
    if limits.trial && limits.warm.is_some() {
        return Err(GuestInitError::Protocol(
            "a trial job cannot run in a warm member".into(),
        ));
    }
    if limits.session.is_some() && (limits.trial || limits.warm.is_some()) {
        return Err(GuestInitError::Protocol(
            "a session's VM is neither a trial's nor a warm member".into(),
        ));
    }
    // The agent starts first, with nothing to do, and says its wall (a trial's too, as uid
    // 0 holding its two capabilities); the host sends the job only once it has judged that.

    let broker = match broker_port {
        Some(p) => {
            start_broker_relay(p)?;
            true
        }
        None => false,
    };
    let procs = prepare_run(&limits)?;
    // After loopback is up: the proxy endpoint the egress variables point at.
    let egress = match egress_port {
        Some(p) => {
            start_egress_relay(p)?;
            true
        }
        None => false,
    };
    if limits.trial {
        // The host puts the runner in the initramfs of trial runs only.
        let runner = plimsoll_wire::trial_step::TRIAL_RUNNER_PATH;
        match fs::metadata(runner) {
            Ok(m) if m.is_file() => {}
            Ok(_) => {
                return Err(setup_err(runner)(io::Error::other(
                    "not a file: the run initramfs of a trial run must carry it",
                )));
            }
            Err(e) => return Err(setup_err(runner)(e)),
        }
    }
    let uptime_agent = uptime();
    let started = Instant::now();
    if let Some(language) = limits.session {
        return run_session(port, procs, Grants { broker, egress }, language);
    }
    let status = run_agent(port, procs, Grants { broker, egress }, &limits)?;
    let agent_ms = started.elapsed().as_millis();
    let mut exit = vec![
        ("uptime_init_s", format!("{uptime_init:.3}")),
        ("uptime_agent_s", format!("{uptime_agent:.3}")),
        ("agent_ms", agent_ms.to_string()),
    ];
    match (status.code(), status.signal()) {
        (Some(c), _) => exit.push(("code", c.to_string())),
        (None, Some(s)) => exit.push(("signal", s.to_string())),
        (None, None) => {}
    }
    channel::write_frame(port, channel::EXIT, &channel::encode_record(exit))
        .map_err(GuestInitError::Channel)?;
    wait_for_ack(port);
    Ok(())
}

/// The device name (`vport1p1`) of the port named [`PORT_NAME`].
fn find_port() -> Result<String, GuestInitError> {
    find_named_port(PORT_NAME).ok_or(GuestInitError::NoPort)
}

/// The device name of the virtio-serial port called `wanted`, if there is one.
fn find_named_port(wanted: &str) -> Option<String> {
    let dir = fs::read_dir("/sys/class/virtio-ports").ok()?;
    for e in dir.flatten() {
        let name = fs::read_to_string(e.path().join("name")).unwrap_or_default();
        if name.trim() == wanted {
            return Some(e.file_name().to_string_lossy().into_owned());
        }
    }
    None
}

/// The virtio-serial port `name`, opened through the private devtmpfs at `private_dev`, if
/// QEMU gave the guest one.
fn open_named_port(private_dev: &str, name: &str) -> Result<Option<File>, GuestInitError> {
    let Some(dev) = find_named_port(name) else {
        return Ok(None);
    };
    let path = format!("{private_dev}/{dev}");
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(&path)
        .map(Some)
        .map_err(setup_err(&path))
}

/// A run with a grant: the clients in the image (the JavaScript one preloaded through
/// `NODE_OPTIONS`, the Python one importable), a socket at [`BROKER_SOCKET`] that only the
/// sandbox user may connect to, and a thread relaying it to the broker's port. Runs before
/// the root is remounted read-only.
fn start_broker_relay(port: File) -> Result<(), GuestInitError> {
    use plimsoll_sandbox::broker::{JS_CLIENT, PYTHON_CLIENT, PYTHON_CLIENT_FILE};
    let write = |path: &str, text: &str| -> Result<(), GuestInitError> {
        fs::write(path, text).map_err(setup_err(path))?;
        fs::set_permissions(path, fs::Permissions::from_mode(0o644)).map_err(setup_err(path))
    };
    write(JS_CLIENT_PATH, JS_CLIENT)?;
    write(
        &format!("{PYTHON_CLIENT_DIR}/{PYTHON_CLIENT_FILE}"),
        PYTHON_CLIENT,
    )?;
    if fs::metadata(PYTHON_SITE_DIR).is_ok_and(|m| m.is_dir()) {
        write(
            &format!("{PYTHON_SITE_DIR}/plimsoll-host.pth"),
            &format!("{PYTHON_CLIENT_DIR}\n"),
        )?;
    }
    fs::create_dir_all(BROKER_DIR).map_err(setup_err(BROKER_DIR))?;
    mount(
        "plimsoll",
        BROKER_DIR,
        "tmpfs",
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        "mode=0755,size=16k",
    )?;
    let listener =
        std::os::unix::net::UnixListener::bind(BROKER_SOCKET).map_err(setup_err(BROKER_SOCKET))?;
    std::os::unix::fs::chown(BROKER_SOCKET, Some(SANDBOX_UID), Some(SANDBOX_UID))
        .map_err(setup_err(BROKER_SOCKET))?;
    fs::set_permissions(BROKER_SOCKET, fs::Permissions::from_mode(0o600))
        .map_err(setup_err(BROKER_SOCKET))?;
    std::thread::Builder::new()
        .name("broker-relay".into())
        .spawn(move || relay(&listener, port))
        .map_err(setup_err("the broker relay thread"))?;
    Ok(())
}

/// A run with an egress grant: PID 1 listens on the proxy endpoint,
/// `127.0.0.1:`[`EGRESS_PROXY_PORT`](plimsoll_sandbox::broker::EGRESS_PROXY_PORT), and carries
/// each connection as a stream of the egress port's mux; the host hands each stream to the
/// broker. It reads nothing of what it carries.
fn start_egress_relay(port: File) -> Result<(), GuestInitError> {
    use plimsoll_sandbox::mux::{Mux, Socket};
    let listener =
        std::net::TcpListener::bind(("127.0.0.1", plimsoll_sandbox::broker::EGRESS_PROXY_PORT))
            .map_err(setup_err("the egress proxy endpoint"))?;
    let out = port.try_clone().map_err(setup_err("the egress port"))?;
    let mux = Mux::new(Box::new(out));
    let reader = std::sync::Arc::clone(&mux);
    std::thread::Builder::new()
        .name("egress-port".into())
        .spawn(move || {
            if let Err(e) = reader.serve(&port, || None) {
                eprintln!("plimsoll-guest-init: the egress port ended: {e}");
            }
        })
        .map_err(setup_err("the egress relay thread"))?;
    std::thread::Builder::new()
        .name("egress-accept".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                // Requests are small and answered at once: no wait for more to send.
                let _ = conn.set_nodelay(true);
                let _ = mux.open(std::sync::Arc::new(conn) as std::sync::Arc<dyn Socket>);
            }
        })
        .map_err(setup_err("the egress relay thread"))?;
    Ok(())
}

/// The channels a run's grant gave its guest.
#[derive(Debug, Clone, Copy)]
struct Grants {
    /// The broker's port (any grant).
    broker: bool,
    /// The egress port (an egress grant).
    egress: bool,
}

/// Serves the broker socket's connections one at a time, each until it closes, forwarding
/// whole request frames to the port and each reply back. A request frame is read whole
/// before any of it goes to the port, and each reply is read whole from the port even when
/// its client has gone, so a client that dies mid-call never leaves the port out of step.
fn relay(listener: &std::os::unix::net::UnixListener, mut port: File) {
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        if let Err(e) = relay_connection(&mut conn, &mut port) {
            eprintln!("plimsoll-guest-init: the broker port failed: {e}");
            return;
        }
    }
}

/// One client: `Ok` when it is gone, `Err` when the port failed.
fn relay_connection(conn: &mut std::os::unix::net::UnixStream, port: &mut File) -> io::Result<()> {
    loop {
        let mut head = [0u8; 4];
        if conn.read_exact(&mut head).is_err() {
            return Ok(());
        }
        let len = u32::from_be_bytes(head) as usize;
        if len > RELAY_REQUEST_MAX {
            let body = format!(
                "{{\"error\":{{\"code\":\"request_too_large\",\"message\":\"a request frame of {len} bytes is over the relay's limit of {RELAY_REQUEST_MAX}\"}}}}"
            );
            let mut reply = (body.len() as u32).to_be_bytes().to_vec();
            reply.extend_from_slice(body.as_bytes());
            let _ = conn.write_all(&reply);
            return Ok(());
        }
        let mut frame = vec![0u8; 4 + len];
        frame[..4].copy_from_slice(&head);
        if conn.read_exact(&mut frame[4..]).is_err() {
            return Ok(());
        }
        port.write_all(&frame)?;
        drop(frame);
        let mut head = [0u8; 4];
        port.read_exact(&mut head)?;
        let mut left = u32::from_be_bytes(head) as usize;
        let mut alive = conn.write_all(&head).is_ok();
        let mut buf = vec![0u8; 64 * 1024];
        while left > 0 {
            let n = port.read(&mut buf[..left.min(64 * 1024)])?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            left -= n;
            alive = alive && conn.write_all(&buf[..n]).is_ok();
        }
        if !alive {
            return Ok(());
        }
    }
}

/// A fresh, small /dev: null, zero, full, random, urandom, tty and the fd links.
fn make_dev() -> Result<(), GuestInitError> {
    mount(
        "dev",
        "/dev",
        "tmpfs",
        libc::MS_NOSUID | libc::MS_NOEXEC,
        "mode=0755,size=64k",
    )?;
    for (name, major, minor) in [
        ("null", 1, 3),
        ("zero", 1, 5),
        ("full", 1, 7),
        ("random", 1, 8),
        ("urandom", 1, 9),
        ("tty", 5, 0),
    ] {
        let path = format!("/dev/{name}");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path.as_str(),
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::from_raw_mode(0o666),
            rustix::fs::makedev(major, minor),
        )
        .map_err(|e| setup_err(&path)(e.into()))?;
        // The umask filtered the mode given to mknod.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).map_err(setup_err(&path))?;
    }
    for (link, target) in [
        ("/dev/fd", "/proc/self/fd"),
        ("/dev/stdin", "/proc/self/fd/0"),
        ("/dev/stdout", "/proc/self/fd/1"),
        ("/dev/stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(target, link).map_err(setup_err(link))?;
    }
    Ok(())
}

/// `/work` and `/tmp`, the run's cgroup, loopback, the hostname, a read-only root. Returns
/// the run cgroup's `cgroup.procs`, opened for the agent to move itself in.
fn prepare_run(l: &GuestLimits) -> Result<File, GuestInitError> {
    let nosuid_nodev = libc::MS_NOSUID | libc::MS_NODEV;
    mount(
        "work",
        "/work",
        "tmpfs",
        nosuid_nodev,
        &format!(
            "size={},nr_inodes={},mode=0755,uid={SANDBOX_UID},gid={SANDBOX_UID}",
            l.work_bytes.max(4096),
            plimsoll_sandbox::tmpfs_inodes(l.work_bytes)
        ),
    )?;
    mount(
        "tmp",
        "/tmp",
        "tmpfs",
        nosuid_nodev,
        &format!(
            "size={},nr_inodes={},mode=1777",
            l.tmp_bytes.max(4096),
            plimsoll_sandbox::tmpfs_inodes(l.tmp_bytes)
        ),
    )?;
    mount(
        "cgroup2",
        "/sys/fs/cgroup",
        "cgroup2",
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        "",
    )?;
    let write = |path: &str, value: &str| -> Result<(), GuestInitError> {
        fs::write(path, value).map_err(setup_err(path))
    };
    write("/sys/fs/cgroup/cgroup.subtree_control", "+memory +pids")?;
    fs::create_dir(RUN_CGROUP).map_err(setup_err(RUN_CGROUP))?;
    write(
        &format!("{RUN_CGROUP}/memory.max"),
        &l.memory_bytes.to_string(),
    )?;
    // No swap in the guest; the file exists only with swap accounting.
    let _ = fs::write(format!("{RUN_CGROUP}/memory.swap.max"), "0");
    write(&format!("{RUN_CGROUP}/pids.max"), &l.pids.to_string())?;
    let procs_path = format!("{RUN_CGROUP}/cgroup.procs");
    let procs = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(&procs_path)
        .map_err(setup_err(&procs_path))?;
    loopback_up().map_err(setup_err("the loopback interface"))?;
    rustix::system::sethostname(b"sandbox").map_err(|e| setup_err("the hostname")(e.into()))?;
    // No user namespace for anyone in the guest: in one, the code would be uid 0 with every
    // capability over what that namespace owns (and every other namespace needs
    // CAP_SYS_ADMIN, which no process of a run has).
    write(MAX_USER_NAMESPACES, "0")?;
    mount(
        "",
        "/",
        "",
        libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID,
        "",
    )?;
    Ok(procs)
}

/// `ip link set lo up`, so a server and its client inside one run can talk (as in a
/// container's own network namespace). There is no other interface: QEMU gives the VM no
/// network device.
fn loopback_up() -> io::Result<()> {
    plimsoll_sys::net::loopback_up()
}

/// The steps both agents take first, as root: into the run's cgroup (`procs`, opened by
/// PID 1; `None` only in tests), no core dumps, the ambient set emptied, and the bounding set
/// reduced to `keep` (a bit mask; numbers past the kernel's last capability fail, harmlessly).
fn agent_common(procs: Option<OwnedFd>, keep: u64) -> PreExec {
    let mut pre = PreExec::new();
    if let Some(fd) = procs {
        // "0" moves the writing process; the descriptor was opened by root.
        pre = pre.step("join the run's cgroup", Step::Write { fd, bytes: b"0" });
    }
    pre.step("no core dumps", Step::no_core_dumps())
        // While still root (CAP_SETPCAP): nothing outside `keep` can ever come back.
        .step("limit the bounding set", Step::LimitBoundingSet(keep))
}

/// The agent of an ordinary job: uid and gid 1000 (`sandbox`), no supplementary groups, no
/// capability in any set, no_new_privs, in the run's cgroup.
pub fn sandbox_agent_steps(procs: Option<OwnedFd>) -> PreExec {
    let id = Some(SANDBOX_UID);
    agent_common(procs, 0)
        .step("drop the groups", Step::DropGroups)
        .step("set the gids", Step::SetGids(id, id, id))
        .step("set the uids", Step::SetUids(id, id, id))
        .step("no_new_privs", Step::NoNewPrivs)
}

/// The agent of a trial job (design: docs/trials.md, "What the sandbox must provide for a
/// trial step"): uid and gid 0, no supplementary groups, bounding = permitted = effective =
/// {CAP_SETUID, CAP_SETGID}, inheritable and ambient empty, no_new_privs, in the run's
/// cgroup. After exec the agent, still uid 0, has exactly the two capabilities (the new
/// permitted set is the bounding set, no_new_privs caps it at the old permitted set); it
/// checks that itself, becomes euid 1000 at once, and keeps the two only to start the trial
/// runner.
pub fn trial_agent_steps(procs: Option<OwnedFd>) -> PreExec {
    let root = Some(0);
    agent_common(procs, TRIAL_CAPS)
        .step("drop the groups", Step::DropGroups)
        .step("set the gids", Step::SetGids(root, root, root))
        .step("set the uids", Step::SetUids(root, root, root))
        .step("set the capabilities", Step::SetCapabilities(TRIAL_CAPS))
        .step("no_new_privs", Step::NoNewPrivs)
}

/// Runs the agent in the run's cgroup, as the sandbox user (or, for a trial job, as uid 0
/// with exactly CAP_SETUID and CAP_SETGID), streaming its stdout to the host
/// as it comes and its stderr (kept short) at the end.
fn read_job(port: &mut File) -> Result<Vec<u8>, GuestInitError> {
    match channel::read_frame(port, JOB_MAX) {
        Ok(Some((channel::JOB, p))) => Ok(p),
        Ok(other) => Err(GuestInitError::Protocol(format!(
            "expected the job, got {:?}",
            other.map(|(t, _)| t as char)
        ))),
        Err(e) => Err(GuestInitError::Channel(e)),
    }
}

/// Reads the agent's next line (its wall, or a warm member's ready line) after what was
/// `seen` already, at most `WALL_MAX` bytes; what came after the newline is returned too, to
/// be sent on as output.
fn next_line(stdout: &mut impl io::Read, mut seen: Vec<u8>) -> io::Result<(Vec<u8>, Vec<u8>)> {
    let mut buf = [0u8; 4096];
    loop {
        if let Some(i) = seen.iter().position(|b| *b == b'\n') {
            let rest = seen.split_off(i + 1);
            seen.pop();
            return Ok((seen, rest));
        }
        if seen.len() > channel::WALL_MAX {
            return Err(io::Error::other("the agent's wall is too long"));
        }
        match stdout.read(&mut buf) {
            Ok(0) => return Err(io::Error::other("the agent ended before it said its line")),
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Starts the agent with `args` in the run's cgroup, as the sandbox user (or, for a trial
/// job, as uid 0 with exactly CAP_SETUID and CAP_SETGID), its three standard streams pipes;
/// returns it, its stdout, and a thread keeping the first [`STDERR_KEPT`] bytes of its
/// stderr.
fn start_agent(
    args: &[&str],
    procs: File,
    grants: Grants,
    trial: bool,
) -> Result<
    (
        std::process::Child,
        std::process::ChildStdout,
        std::thread::JoinHandle<Vec<u8>>,
    ),
    GuestInitError,
> {
    #[expect(
        clippy::disallowed_methods,
        reason = "inside the guest, PID 1 starts the agent with its job on stdin; the host's Spawn helper gives /dev/null"
    )]
    let mut cmd = std::process::Command::new(AGENT);
    cmd.args(args)
        .env_clear()
        .envs(ENVIRONMENT)
        .envs(BROKER_ENVIRONMENT.into_iter().filter(|_| grants.broker))
        .envs(
            plimsoll_sandbox::broker::egress_env()
                .into_iter()
                .filter(|_| grants.egress)
                .filter_map(|kv| {
                    kv.split_once('=')
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                }),
        )
        .current_dir("/work")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let procs = Some(OwnedFd::from(procs));
    let steps = if trial {
        trial_agent_steps(procs)
    } else {
        sandbox_agent_steps(procs)
    };
    steps.install(&mut cmd).map_err(GuestInitError::Agent)?;
    let mut child = cmd.spawn().map_err(GuestInitError::Agent)?;
    // The hook's copy of the cgroup descriptor goes with the command.
    drop(cmd);
    let (Some(stdout), Some(mut stderr)) = (child.stdout.take(), child.stderr.take()) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(GuestInitError::Agent(io::Error::other("no pipes")));
    };
    let errors = std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match stderr.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let room = STDERR_KEPT.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
            }
        }
        kept
    });
    Ok((child, stdout, errors))
}

fn run_agent(
    port: &mut File,
    procs: File,
    grants: Grants,
    limits: &GuestLimits,
) -> Result<std::process::ExitStatus, GuestInitError> {
    let mut args = vec!["--wall-first"];
    // A warm member: the interpreter starts waiting before the job is known.
    match limits.warm {
        Some(plimsoll_wire::Language::Javascript) => args.extend(["--warm", "javascript"]),
        Some(plimsoll_wire::Language::Python) => args.extend(["--warm", "python"]),
        None => {}
    }
    let (mut child, mut stdout, errors) = start_agent(&args, procs, grants, limits.trial)?;
    // Its wall first; then its job, once the host has judged the wall (a host that refuses
    // sends no job: the guest is killed with the agent waiting).
    let handed = (|| {
        let (wall, mut rest) = next_line(&mut stdout, Vec::new()).map_err(GuestInitError::Agent)?;
        channel::write_frame(port, channel::WALL, &wall).map_err(GuestInitError::Channel)?;
        if limits.warm.is_some() {
            // Said once the interpreter waits; the host judges it (it must be the ready line).
            let (mut ready, after) = next_line(&mut stdout, rest).map_err(GuestInitError::Agent)?;
            ready.push(b'\n');
            rest = after;
            channel::write_frame(port, channel::READY, &ready).map_err(GuestInitError::Channel)?;
        }
        let job = read_job(port)?;
        let mut input = child
            .stdin
            .take()
            .ok_or_else(|| GuestInitError::Agent(io::Error::other("no stdin pipe")))?;
        input.write_all(&job).map_err(GuestInitError::Agent)?;
        drop(input);
        if !rest.is_empty() {
            channel::write_frame(port, channel::STDOUT, &rest).map_err(GuestInitError::Channel)?;
        }
        Ok(())
    })();
    if let Err(e) = handed {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    let mut buf = vec![0u8; channel::CHUNK];
    loop {
        match stdout.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => channel::write_frame(port, channel::STDOUT, &buf[..n])
                .map_err(GuestInitError::Channel)?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(GuestInitError::Channel(e)),
        }
    }
    let status = child.wait().map_err(GuestInitError::Agent)?;
    let kept = errors.join().unwrap_or_default();
    if !kept.is_empty() {
        channel::write_frame(port, channel::STDERR, &kept).map_err(GuestInitError::Channel)?;
    }
    Ok(status)
}

/// A session's VM: the agent (`--wall-first --session LANGUAGE`, as the sandbox user) says
/// its wall and that its interpreter is ready; then its stdin takes what the host sends
/// ([`channel::INPUT`] frames) and its stdout goes to the host as it comes, until the host
/// ends the session (an ack, or the end of the channel) or kills the VM. If the agent ends
/// first, its stderr and exit record follow its last output.
fn run_session(
    port: &mut File,
    procs: File,
    grants: Grants,
    language: plimsoll_wire::Language,
) -> Result<(), GuestInitError> {
    let name = match language {
        plimsoll_wire::Language::Javascript => "javascript",
        plimsoll_wire::Language::Python => "python",
    };
    let started = Instant::now();
    let (mut child, mut stdout, errors) =
        start_agent(&["--wall-first", "--session", name], procs, grants, false)?;
    let said = (|| {
        let (wall, rest) = next_line(&mut stdout, Vec::new()).map_err(GuestInitError::Agent)?;
        channel::write_frame(port, channel::WALL, &wall).map_err(GuestInitError::Channel)?;
        // Said once the interpreter takes calls; the host judges it.
        let (mut ready, rest) = next_line(&mut stdout, rest).map_err(GuestInitError::Agent)?;
        ready.push(b'\n');
        channel::write_frame(port, channel::READY, &ready).map_err(GuestInitError::Channel)?;
        let input = child
            .stdin
            .take()
            .ok_or_else(|| GuestInitError::Agent(io::Error::other("no stdin pipe")))?;
        let out = port.try_clone().map_err(GuestInitError::Channel)?;
        Ok((rest, input, out))
    })();
    let (rest, input, mut out) = match said {
        Ok(s) => s,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    };
    // Agent → host, on a thread of its own: only this thread writes to the port from now on.
    let relay = std::thread::spawn(move || -> io::Result<()> {
        if !rest.is_empty() {
            channel::write_frame(&mut out, channel::STDOUT, &rest)?;
        }
        let mut buf = vec![0u8; channel::CHUNK];
        loop {
            match stdout.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => channel::write_frame(&mut out, channel::STDOUT, &buf[..n])?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let status = child.wait()?;
        let kept = errors.join().unwrap_or_default();
        if !kept.is_empty() {
            channel::write_frame(&mut out, channel::STDERR, &kept)?;
        }
        let mut exit = vec![("agent_ms", started.elapsed().as_millis().to_string())];
        match (status.code(), status.signal()) {
            (Some(c), _) => exit.push(("code", c.to_string())),
            (None, Some(s)) => exit.push(("signal", s.to_string())),
            (None, None) => {}
        }
        channel::write_frame(&mut out, channel::EXIT, &channel::encode_record(exit))
    });
    // Host → agent, until the host ends the session. Input the agent no longer reads (it
    // ended: the relay says so) is dropped.
    let mut input = Some(input);
    let ended = loop {
        match channel::read_frame(port, channel::INPUT_MAX) {
            Ok(Some((channel::INPUT, bytes))) => {
                if let Some(i) = input.as_mut()
                    && i.write_all(&bytes).and_then(|()| i.flush()).is_err()
                {
                    input = None;
                }
            }
            Ok(Some((channel::ACK, _)) | None) => break Ok(()),
            Ok(Some((tag, _))) => {
                break Err(GuestInitError::Protocol(format!(
                    "expected the session's input, got {:?}",
                    tag as char
                )));
            }
            Err(e) => break Err(GuestInitError::Channel(e)),
        }
    };
    // The agent reads the end of its input, ends its interpreter and exits.
    drop(input);
    let _ = relay.join();
    ended
}

/// Waits (bounded) for the host's ack, so the last frame is out of QEMU before power-off.
fn wait_for_ack(port: &mut File) {
    let mut fds = [rustix::event::PollFd::new(
        port,
        rustix::event::PollFlags::IN,
    )];
    let timeout = rustix::event::Timespec {
        tv_sec: i64::from(ACK_WAIT_MS / 1000),
        tv_nsec: i64::from(ACK_WAIT_MS % 1000) * 1_000_000,
    };
    let ready = rustix::event::poll(&mut fds, Some(&timeout)).unwrap_or(0);
    if ready > 0 {
        let _ = channel::read_frame(port, channel::RECORD_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plimsoll_sandbox::Spawn;
    use plimsoll_testing::{is_root, skip_or_fail};

    /// `/proc/self/status` and `/proc/self/limits` of a real process started with `hook`
    /// between fork and exec, as the guest init starts the agent (without the cgroup).
    fn status_after(steps: fn(Option<OwnedFd>) -> PreExec) -> String {
        let mut r = Spawn::new("/bin/cat", "/")
            .args(["/proc/self/status", "/proc/self/limits"])
            .before_exec(steps(None))
            .spawn()
            .unwrap();
        let mut out = String::new();
        r.stdout.read_to_string(&mut out).unwrap();
        assert!(r.child.wait().unwrap().success(), "{out}");
        out
    }

    fn field<'a>(status: &'a str, name: &str) -> &'a str {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .unwrap_or_else(|| panic!("no {name} in {status}"))
            .trim()
    }

    #[test]
    fn a_trial_agent_is_root_with_exactly_setuid_and_setgid() {
        let test = "a_trial_agent_is_root_with_exactly_setuid_and_setgid";
        if !is_root() {
            skip_or_fail(
                test,
                "needs root (it sets the credentials the guest init sets)",
            );
            return;
        }
        let s = status_after(trial_agent_steps);
        assert_eq!(TRIAL_CAPS, 0xc0);
        for (name, want) in [
            ("Uid", "0\t0\t0\t0"),
            ("Gid", "0\t0\t0\t0"),
            ("Groups", ""),
            ("CapInh", "0000000000000000"),
            ("CapPrm", "00000000000000c0"),
            ("CapEff", "00000000000000c0"),
            ("CapBnd", "00000000000000c0"),
            ("CapAmb", "0000000000000000"),
            ("NoNewPrivs", "1"),
        ] {
            assert_eq!(field(&s, name), want, "{name}: {s}");
        }
        assert!(
            s.lines()
                .any(|l| l.starts_with("Max core file size") && l.contains(" 0 ")),
            "{s}"
        );
    }

    #[test]
    fn an_ordinary_agent_is_the_sandbox_user_without_capabilities() {
        let test = "an_ordinary_agent_is_the_sandbox_user_without_capabilities";
        if !is_root() {
            skip_or_fail(
                test,
                "needs root (it sets the credentials the guest init sets)",
            );
            return;
        }
        let s = status_after(sandbox_agent_steps);
        for (name, want) in [
            ("Uid", "1000\t1000\t1000\t1000"),
            ("Gid", "1000\t1000\t1000\t1000"),
            ("Groups", ""),
            ("CapInh", "0000000000000000"),
            ("CapPrm", "0000000000000000"),
            ("CapEff", "0000000000000000"),
            ("CapBnd", "0000000000000000"),
            ("CapAmb", "0000000000000000"),
            ("NoNewPrivs", "1"),
        ] {
            assert_eq!(field(&s, name), want, "{name}: {s}");
        }
    }
}
