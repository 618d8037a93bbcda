//! Where things are in the guest and who runs there: the constants the host side (the vm
//! crate's QEMU command line, probe and tests) shares with the guest's PID 1.

/// Where the initramfs stage puts the tools.
pub const TOOLS_DIR: &str = "/opt/plimsoll/bin";
/// The agent.
pub const AGENT: &str = "/opt/plimsoll/bin/plimsoll-agent";
/// The name of the virtio-serial port (QEMU `virtserialport,name=`).
pub const PORT_NAME: &str = "plimsoll";
/// The name of the broker's virtio-serial port, present only in a run with a grant.
pub const BROKER_PORT_NAME: &str = "plimsoll.broker";
/// The name of the egress port, present only in a run with an egress grant: the streams of
/// the proxy endpoint's connections, multiplexed (`plimsoll_sandbox::mux`).
pub const EGRESS_PORT_NAME: &str = "plimsoll.egress";
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
pub(crate) const PYTHON_SITE_DIR: &str = "/usr/lib/python3/dist-packages";
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
pub(crate) const RELAY_REQUEST_MAX: usize = (16 << 20) + (64 << 10);
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
pub(crate) const PRIVATE: &str = "/.plimsoll";
/// Stderr of the agent kept (it is one line when it fails).
pub(crate) const STDERR_KEPT: usize = 64 * 1024;
/// Largest job accepted (the agent's own limit is 256 MiB).
pub(crate) const JOB_MAX: usize = 256 * 1024 * 1024 + 1024;
/// How long to wait for the host's ack before powering off anyway.
pub(crate) const ACK_WAIT_MS: i32 = 10_000;

pub use plimsoll_sandbox::caps::TRIAL_CAPS;
