//! The guest's PID 1 (`plimsoll-guest-init`), started by the initramfs stage
//! (`crates/vm/guest/init`) once the sandbox image is mounted read-only under a tmpfs overlay
//! and switched to: it opens the channel, says hello, receives the run's limits and job,
//! sets up `/dev`, `/work`, `/tmp`, the run's cgroup and loopback, remounts the root
//! read-only, runs `plimsoll-agent` as the unprivileged `sandbox` user (for a job with a
//! trial step: as uid 0 with exactly CAP_SETUID and CAP_SETGID, which the agent splits
//! itself), streams its answer back and powers the VM off.
//!
//! Everything here runs inside the guest as root; nothing here is trusted by the host.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::process::Stdio;
use std::time::Instant;

use crate::channel::{self, GuestLimits};

/// Where the initramfs stage puts the tools.
pub const TOOLS_DIR: &str = "/opt/plimsoll/bin";
/// The agent.
pub const AGENT: &str = "/opt/plimsoll/bin/plimsoll-agent";
/// The name of the virtio-serial port (QEMU `virtserialport,name=`).
pub const PORT_NAME: &str = "plimsoll";
/// The name of the broker's virtio-serial port, present only in a run with a grant.
pub const BROKER_PORT_NAME: &str = "plimsoll.broker";
/// The directory of the broker socket (a small tmpfs of its own, writable by root only).
pub const BROKER_DIR: &str = "/run/plimsoll";
/// The socket the in-guest clients connect to; the guest init relays it to the broker port.
pub const BROKER_SOCKET: &str = plimsoll_sandbox::broker::BROKER_SOCKET_IN_SANDBOX;
/// The JavaScript client, preloaded by every node (`NODE_OPTIONS=--require ...`).
pub const JS_CLIENT_PATH: &str = "/opt/plimsoll/bin/plimsoll-host.js";
/// The Python client's directory (`PYTHONPATH`, and a `.pth` file for `python3 -I`).
pub const PYTHON_CLIENT_DIR: &str = "/opt/plimsoll/bin";
/// Debian's system-wide module directory, read even under `python3 -I` (the agent runs
/// Python snippets isolated): a `.pth` file here puts [`PYTHON_CLIENT_DIR`] on `sys.path`.
const PYTHON_SITE_DIR: &str = "/usr/lib/python3/dist-packages";
/// The environment a run with a grant adds to [`ENVIRONMENT`].
pub const BROKER_ENVIRONMENT: [(&str, &str); 3] = [
    ("PLIMSOLL_BROKER_SOCKET", BROKER_SOCKET),
    (
        "NODE_OPTIONS",
        "--require /opt/plimsoll/bin/plimsoll-host.js",
    ),
    ("PYTHONPATH", PYTHON_CLIENT_DIR),
];
/// Largest request frame the relay forwards (the broker's largest `max_request_bytes` is
/// 16 MiB, plus the JSON around the body); a larger one is refused in the guest.
const RELAY_REQUEST_MAX: usize = (16 << 20) + (64 << 10);
/// The uid and gid code runs as in the guest (the image's `sandbox` user).
pub const SANDBOX_UID: u32 = 1000;
/// The uid and gid of a trial's controller in the guest (the image's `controller` user).
pub const CONTROLLER_UID: u32 = 1001;
/// The agent's environment (the same as the container tier's).
pub const ENVIRONMENT: [(&str, &str); 3] = [
    ("PATH", "/usr/local/bin:/usr/bin:/bin"),
    ("HOME", "/tmp"),
    ("LANG", "C.UTF-8"),
];
/// The run's cgroup (cgroup v2, below the guest's root).
pub const RUN_CGROUP: &str = "/sys/fs/cgroup/run";
/// The sysctl that bounds user namespaces; the guest init sets it to 0 before the agent starts.
pub const MAX_USER_NAMESPACES: &str = "/proc/sys/user/max_user_namespaces";
/// A root-only scratch directory for the guest's own mounts.
const PRIVATE: &str = "/.plimsoll";
/// Stderr of the agent kept (it is one line when it fails).
const STDERR_KEPT: usize = 64 * 1024;
/// Largest job accepted (the agent's own limit is 256 MiB).
const JOB_MAX: usize = 256 * 1024 * 1024 + 1024;
/// How long to wait for the host's ack before powering off anyway.
const ACK_WAIT_MS: i32 = 10_000;

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
    let (s, t, f, d) = (cstr(source), cstr(target), cstr(fstype), cstr(data));
    // SAFETY: mount(2) with valid NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            s.as_ptr(),
            t.as_ptr(),
            f.as_ptr(),
            flags,
            if data.is_empty() {
                std::ptr::null()
            } else {
                d.as_ptr().cast()
            },
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(GuestInitError::Mount {
            target: target.to_owned(),
            fstype: fstype.to_owned(),
            source: io::Error::last_os_error(),
        })
    }
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
    // SAFETY: sync(2) and reboot(2) take no pointers. With `reboot=t` on the kernel command
    // line and QEMU's `-no-reboot`, a reboot ends QEMU.
    unsafe {
        libc::sync();
        libc::reboot(libc::RB_AUTOBOOT);
    }
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
    // The broker's port exists only in a run with a grant.
    let broker_port = match find_named_port(BROKER_PORT_NAME) {
        Some(dev) => {
            let path = format!("{private_dev}/{dev}");
            Some(
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_CLOEXEC)
                    .open(&path)
                    .map_err(setup_err(&path))?,
            )
        }
        None => None,
    };
    let port = port_slot.insert(port);
    let pd = cstr(&private_dev);
    // SAFETY: umount2(2) with a valid path.
    unsafe { libc::umount2(pd.as_ptr(), libc::MNT_DETACH) };
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
            GuestLimits::decode(&p).map_err(GuestInitError::Protocol)?
        }
        Ok(other) => {
            return Err(GuestInitError::Protocol(format!(
                "expected the limits, got {:?}",
                other.map(|(t, _)| t as char)
            )));
        }
        Err(e) => return Err(GuestInitError::Channel(e)),
    };
    let job = match channel::read_frame(port, JOB_MAX) {
        Ok(Some((channel::JOB, p))) => p,
        Ok(other) => {
            return Err(GuestInitError::Protocol(format!(
                "expected the job, got {:?}",
                other.map(|(t, _)| t as char)
            )));
        }
        Err(e) => return Err(GuestInitError::Channel(e)),
    };

    let broker = match broker_port {
        Some(p) => {
            start_broker_relay(p)?;
            true
        }
        None => false,
    };
    let procs = prepare_run(&limits)?;
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
    let status = run_agent(port, &job, procs, broker, limits.trial)?;
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
        let c = cstr(&path);
        // SAFETY: mknod(2) with a valid path; a character device in our own tmpfs.
        let rc = unsafe {
            libc::mknod(
                c.as_ptr(),
                libc::S_IFCHR | 0o666,
                libc::makedev(major, minor),
            )
        };
        if rc != 0 {
            return Err(setup_err(&path)(io::Error::last_os_error()));
        }
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
            "size={},mode=0755,uid={SANDBOX_UID},gid={SANDBOX_UID}",
            l.work_bytes.max(4096)
        ),
    )?;
    mount(
        "tmp",
        "/tmp",
        "tmpfs",
        nosuid_nodev,
        &format!("size={},mode=1777", l.tmp_bytes.max(4096)),
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
    // SAFETY: socket(2) with constant arguments; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads into the ifreq we own.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the union's flags member is the one SIOCGIFFLAGS filled in.
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: SIOCSIFFLAGS reads the ifreq we own.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub use plimsoll_sandbox::caps::TRIAL_CAPS;

/// The steps both agents take first, as root: into the run's cgroup (`procs_fd`, opened by
/// PID 1; `None` only in tests), no core dumps, the ambient set emptied, and the bounding set
/// reduced to `keep` (a bit mask; numbers past the kernel's last capability fail, harmlessly).
///
/// # Safety
/// Runs between fork and exec: async-signal-safe system calls only, nothing allocated.
unsafe fn agent_common(procs_fd: Option<libc::c_int>, keep: u64) -> io::Result<()> {
    // SAFETY: write(2), setrlimit(2) and prctl(2) on values that live on this stack.
    unsafe {
        // "0" moves the writing process; the descriptor was opened by root.
        if let Some(fd) = procs_fd
            && libc::write(fd, b"0".as_ptr().cast(), 1) != 1
        {
            return Err(io::Error::last_os_error());
        }
        let core = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::setrlimit(libc::RLIMIT_CORE, &core) != 0 {
            return Err(io::Error::last_os_error());
        }
        // While still root (CAP_SETPCAP): nothing outside `keep` can ever come back.
        plimsoll_sandbox::caps::limit_bounding_set(keep);
    }
    Ok(())
}

/// The agent of an ordinary job: uid and gid 1000 (`sandbox`), no supplementary groups, no
/// capability in any set, no_new_privs, in the run's cgroup.
///
/// # Safety
/// Runs between fork and exec: async-signal-safe system calls only, nothing allocated.
pub unsafe fn become_sandbox_agent(procs_fd: Option<libc::c_int>) -> io::Result<()> {
    // SAFETY: async-signal-safe system calls with constant arguments.
    unsafe {
        agent_common(procs_fd, 0)?;
        if libc::setgroups(0, std::ptr::null()) != 0
            || libc::setresgid(SANDBOX_UID, SANDBOX_UID, SANDBOX_UID) != 0
            || libc::setresuid(SANDBOX_UID, SANDBOX_UID, SANDBOX_UID) != 0
            || libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The agent of a trial job (design: docs/trials.md, "What the sandbox must provide for a
/// trial step"): uid and gid 0, no supplementary groups, bounding = permitted = effective =
/// {CAP_SETUID, CAP_SETGID}, inheritable and ambient empty, no_new_privs, in the run's
/// cgroup. After exec the agent, still uid 0, has exactly the two capabilities (the new
/// permitted set is the bounding set, no_new_privs caps it at the old permitted set); it
/// checks that itself, becomes euid 1000 at once, and keeps the two only to start the trial
/// runner.
///
/// # Safety
/// Runs between fork and exec: async-signal-safe system calls only, nothing allocated.
pub unsafe fn become_trial_agent(procs_fd: Option<libc::c_int>) -> io::Result<()> {
    // SAFETY: async-signal-safe system calls with constant arguments; capset(2) through
    // plimsoll_sandbox::caps, on values on its stack.
    unsafe {
        agent_common(procs_fd, TRIAL_CAPS)?;
        if libc::setgroups(0, std::ptr::null()) != 0
            || libc::setresgid(0, 0, 0) != 0
            || libc::setresuid(0, 0, 0) != 0
        {
            return Err(io::Error::last_os_error());
        }
        plimsoll_sandbox::caps::set_effective_and_permitted(TRIAL_CAPS)?;
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The job in an anonymous memory file, to be the agent's stdin.
fn job_file(job: &[u8]) -> io::Result<File> {
    let name = cstr("plimsoll-job");
    // SAFETY: memfd_create(2) with a valid name; the result is checked.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own.
    let mut f = unsafe { File::from_raw_fd(fd) };
    f.write_all(job)?;
    io::Seek::seek(&mut f, io::SeekFrom::Start(0))?;
    Ok(f)
}

/// Runs the agent in the run's cgroup, as the sandbox user (or, for a trial job, as uid 0
/// with exactly CAP_SETUID and CAP_SETGID), streaming its stdout to the host
/// as it comes and its stderr (kept short) at the end.
fn run_agent(
    port: &mut File,
    job: &[u8],
    procs: File,
    broker: bool,
    trial: bool,
) -> Result<std::process::ExitStatus, GuestInitError> {
    let stdin = job_file(job).map_err(GuestInitError::Agent)?;
    #[expect(
        clippy::disallowed_methods,
        reason = "inside the guest, PID 1 starts the agent with its job on stdin; the host's Spawn helper gives /dev/null"
    )]
    let mut cmd = std::process::Command::new(AGENT);
    cmd.env_clear()
        .envs(ENVIRONMENT)
        .envs(BROKER_ENVIRONMENT.into_iter().filter(|_| broker))
        .current_dir("/work")
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let procs_fd = procs.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and only makes system calls
    // on values prepared before the fork (no allocation, no locks).
    unsafe {
        cmd.pre_exec(move || {
            if trial {
                become_trial_agent(Some(procs_fd))
            } else {
                become_sandbox_agent(Some(procs_fd))
            }
        });
    }
    let mut child = cmd.spawn().map_err(GuestInitError::Agent)?;
    drop(procs);
    let (Some(mut stdout), Some(mut stderr)) = (child.stdout.take(), child.stderr.take()) else {
        let _ = child.kill();
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

/// Waits (bounded) for the host's ack, so the last frame is out of QEMU before power-off.
fn wait_for_ack(port: &mut File) {
    let mut fds = [libc::pollfd {
        fd: port.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    // SAFETY: poll(2) on one descriptor we own, with a bounded timeout.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), 1, ACK_WAIT_MS) };
    if ready > 0 {
        let _ = channel::read_frame(port, channel::RECORD_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plimsoll_sandbox::Spawn;
    use plimsoll_sandbox::testing::{is_root, skip_or_fail};

    /// `/proc/self/status` and `/proc/self/limits` of a real process started with `hook`
    /// between fork and exec, as the guest init starts the agent (without the cgroup).
    fn status_after(hook: unsafe fn(Option<libc::c_int>) -> io::Result<()>) -> String {
        let mut r = Spawn::new("/bin/cat", "/")
            .args(["/proc/self/status", "/proc/self/limits"])
            // SAFETY: the hooks make async-signal-safe system calls only.
            .before_exec(&[], move |_| unsafe { hook(None) })
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
        let s = status_after(become_trial_agent);
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
        let s = status_after(become_sandbox_agent);
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
