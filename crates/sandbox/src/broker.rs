//! The broker channel as a provider sees it: a port to hand connected streams to, the fixed
//! descriptor number of the process tier, and the in-sandbox clients to preload.
//!
//! The broker itself (grant profiles, routes, credentials, the upstream HTTP call) lives in
//! `plimsoll-broker`; a provider only moves bytes. What a provider does with a plan whose
//! `broker` is set (docs/capability-grants.md, "For provider authors"):
//!
//! - process tier: a socketpair; the broker serves one end, the child inherits the other at
//!   [`BROKER_FD`] (seccomp denies `socket()`, so the child could open no channel itself).
//! - container and gVisor: a Unix socket in a directory only root can reach, bind-mounted
//!   into this run's container alone at [`BROKER_SOCKET_IN_SANDBOX`]; the broker accepts on it
//!   ([`BrokerPort::serve_listener`]); `PLIMSOLL_BROKER_SOCKET` tells the clients where it is.
//! - VM: a virtio-serial port (or vsock) whose host side is a Unix socket; hand the broker the
//!   connected stream (or the listener QEMU connects to); the guest agent relays it to a
//!   socket inside the guest.
//!
//! In every case the channel is private to the run: nothing outside the run's sandbox can
//! reach it, so it needs no key of its own.

use std::fmt;
use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;

/// The descriptor number at which a process-tier child inherits its broker channel.
pub const BROKER_FD: i32 = 3;

/// Where container, gVisor and VM sandboxes find the broker socket, unless the provider sets
/// `PLIMSOLL_BROKER_SOCKET` in the sandbox's environment to another path.
pub const BROKER_SOCKET_IN_SANDBOX: &str = "/run/plimsoll/broker.sock";

/// The loopback port inside a sandbox where the egress proxy endpoint listens (the agent's
/// relay): each connection to it is carried over the broker channel, opened with
/// [`EGRESS_HELLO`].
pub const EGRESS_PROXY_PORT: u16 = 3128;

/// The variable that asks the agent inside for the egress relay.
pub const EGRESS_RELAY_VAR: &str = "PLIMSOLL_EGRESS_RELAY";

/// The frame a channel connection opens with to carry HTTP proxy traffic from then on.
pub const EGRESS_HELLO: &[u8] = br#"{"egress":1}"#;

/// The environment an egress grant's project steps and session cells get, beside the
/// channel's: every spelling of the proxy variables that Python (urllib, pip), node
/// (`NODE_USE_ENV_PROXY`: `fetch` and `http`) and npm read, and nothing exempted.
pub fn egress_env() -> Vec<String> {
    let url = format!("http://127.0.0.1:{EGRESS_PROXY_PORT}");
    let mut env: Vec<String> = ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"]
        .iter()
        .map(|k| format!("{k}={url}"))
        .collect();
    env.push("NODE_USE_ENV_PROXY=1".into());
    env
}

/// The JavaScript client: defines the global `host` (`node --require` it).
pub const JS_CLIENT: &str = include_str!("../../../sandbox-clients/js/plimsoll-host.js");
/// The file name the JavaScript client is given in the sandbox.
pub const JS_CLIENT_FILE: &str = "plimsoll-host.js";
/// The Python client: the module `plimsoll_host` (put its directory on `sys.path`).
pub const PYTHON_CLIENT: &str = include_str!("../../../sandbox-clients/python/plimsoll_host.py");
/// The file name the Python client is given in the sandbox.
pub const PYTHON_CLIENT_FILE: &str = "plimsoll_host.py";

/// The broker of one run, as a provider uses it.
pub trait BrokerPort: Send + Sync + fmt::Debug {
    /// Serves one stream connected to the sandbox, on a thread of its own, until the stream
    /// closes or the run ends. The stream must be private to this run.
    fn serve_stream(&self, stream: UnixStream) -> io::Result<()>;
    /// Accepts connections on `listener` (reachable from this run's sandbox only) and serves
    /// each, until the run ends.
    fn serve_listener(&self, listener: UnixListener) -> io::Result<()>;
    /// True when the run's grant is an egress grant: the provider gives the sandbox the
    /// proxy endpoint ([`EGRESS_PROXY_PORT`]) as well as the channel.
    fn egress(&self) -> bool {
        false
    }
}

/// A handle on the run's broker, cheap to clone.
#[derive(Clone)]
pub struct BrokerChannel(Arc<dyn BrokerPort>);

impl BrokerChannel {
    /// A handle on `port`.
    pub fn new(port: Arc<dyn BrokerPort>) -> Self {
        BrokerChannel(port)
    }

    /// See [`BrokerPort::serve_stream`].
    pub fn serve_stream(&self, stream: UnixStream) -> io::Result<()> {
        self.0.serve_stream(stream)
    }

    /// See [`BrokerPort::egress`].
    pub fn egress(&self) -> bool {
        self.0.egress()
    }

    /// See [`BrokerPort::serve_listener`].
    pub fn serve_listener(&self, listener: UnixListener) -> io::Result<()> {
        self.0.serve_listener(listener)
    }
}

impl fmt::Debug for BrokerChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BrokerChannel").field(&self.0).finish()
    }
}
