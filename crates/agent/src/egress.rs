//! The egress relay: the proxy endpoint inside a sandbox whose run holds an egress grant.
//!
//! The sandbox has only loopback. The agent listens on `127.0.0.1:`[`EGRESS_PROXY_PORT`]
//! (where `HTTPS_PROXY` and its kin point) and carries each connection, as it is, over a new
//! connection to the broker channel opened with the egress hello. It reads nothing of what
//! it carries and decides nothing: the broker outside parses every request and checks it
//! (docs/capability-grants.md, "Egress").

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use plimsoll_sandbox::broker::{EGRESS_HELLO, EGRESS_PROXY_PORT, EGRESS_RELAY_VAR};

/// Why the relay could not start.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The channel's socket is not named.
    #[error(
        "{EGRESS_RELAY_VAR} is set but PLIMSOLL_BROKER_SOCKET is not: the run has no channel to carry egress over"
    )]
    NoChannel,
    /// The loopback port could not be taken.
    #[error("cannot listen on 127.0.0.1:{EGRESS_PROXY_PORT} for the egress proxy: {0}")]
    Listen(#[source] io::Error),
    /// No thread for it.
    #[error("cannot start the egress relay's thread: {0}")]
    Thread(#[source] io::Error),
}

/// Starts the relay when the environment asks for it: `Ok(false)` when it does not.
pub fn start_relay_from_env() -> Result<bool, RelayError> {
    if plimsoll_env::get(plimsoll_env::PLIMSOLL_EGRESS_RELAY).is_none() {
        return Ok(false);
    }
    let socket: PathBuf = plimsoll_env::get(plimsoll_env::PLIMSOLL_BROKER_SOCKET)
        .map(PathBuf::from)
        .ok_or(RelayError::NoChannel)?;
    let listener =
        TcpListener::bind(("127.0.0.1", EGRESS_PROXY_PORT)).map_err(RelayError::Listen)?;
    spawn_relay(listener, socket, true).map_err(RelayError::Thread)?;
    Ok(true)
}

/// Serves the relay on `listener`, on a thread of its own: each connection is carried over a
/// new connection to the broker socket at `socket` (the benchmark serves a loopback port of
/// its choosing the same way).
pub fn serve(listener: TcpListener, socket: PathBuf) -> std::io::Result<()> {
    spawn_relay(listener, socket, false)
}

/// The uid and gid the relay's threads take when the agent that starts them is root.
const NOBODY: u32 = 65_534;

/// Starts the relay's thread; with `lower`, the thread first gives up root if it has it (a
/// trial's agent starts as 0:0 and drops only its own thread later, after the job is read):
/// no groups, every gid and uid [`NOBODY`], which clears its capabilities, and every thread
/// it starts inherits that. It needs none: the channel socket is open to every uid.
fn spawn_relay(listener: TcpListener, socket: PathBuf, lower: bool) -> std::io::Result<()> {
    let (lowered_tx, lowered_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("egress-relay".into())
        .spawn(move || {
            let lowered = if lower { lower_thread() } else { Ok(()) };
            let failed = lowered.is_err();
            let _ = lowered_tx.send(lowered);
            if failed {
                return;
            }
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                // Requests are small and answered at once: no wait for more to send.
                let _ = conn.set_nodelay(true);
                let socket = socket.clone();
                // One thread a connection; the broker bounds how many it serves at once.
                let _ = std::thread::Builder::new()
                    .name("egress-conn".into())
                    .spawn(move || relay(conn, &socket));
            }
        })?;
    lowered_rx
        .recv()
        .map_err(|_| io::Error::other("the relay's thread ended before it started"))?
}

/// The calling thread, if root, becomes [`NOBODY`] (thread-only calls: the agent's other
/// threads keep their ids).
fn lower_thread() -> io::Result<()> {
    use rustix::process::{Gid, Uid};
    use rustix::thread::{set_thread_groups, set_thread_res_gid, set_thread_res_uid};
    if !rustix::process::geteuid().is_root() && !rustix::process::getuid().is_root() {
        return Ok(());
    }
    let (uid, gid) = (Uid::from_raw(NOBODY), Gid::from_raw(NOBODY));
    set_thread_groups(&[])?;
    set_thread_res_gid(gid, gid, gid)?;
    set_thread_res_uid(uid, uid, uid)?;
    Ok(())
}

/// Carries one connection: the hello frame, then bytes both ways until both sides closed.
fn relay(conn: TcpStream, socket: &std::path::Path) {
    let Ok(channel) = UnixStream::connect(socket) else {
        let _ = (&conn).write_all(
            b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
        return;
    };
    let mut hello = (EGRESS_HELLO.len() as u32).to_be_bytes().to_vec();
    hello.extend_from_slice(EGRESS_HELLO);
    if (&channel).write_all(&hello).is_err() {
        return;
    }
    let (Ok(conn2), Ok(channel2)) = (conn.try_clone(), channel.try_clone()) else {
        return;
    };
    let up = std::thread::Builder::new()
        .name("egress-up".into())
        .spawn(move || {
            copy(&conn2, &channel2);
            let _ = channel2.shutdown(Shutdown::Write);
        });
    copy(&channel, &conn);
    let _ = conn.shutdown(Shutdown::Write);
    if let Ok(up) = up {
        let _ = up.join();
    }
}

fn copy(mut from: impl Read, mut to: impl Write) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The provider sets the variable by the sandbox crate's name; the relay reads it by the
    /// declared one.
    #[test]
    fn the_relay_reads_what_the_provider_sets() {
        assert_eq!(plimsoll_env::PLIMSOLL_EGRESS_RELAY.name, EGRESS_RELAY_VAR);
    }

    /// A trial's agent is root when it starts the relay: the relay's threads are not.
    #[test]
    fn started_by_root_the_relay_threads_hold_no_root_and_no_capability() {
        use std::os::unix::fs::PermissionsExt as _;
        let test = "started_by_root_the_relay_threads_hold_no_root_and_no_capability";
        if !plimsoll_testing::is_root() {
            plimsoll_testing::skip_or_fail(test, "needs root: it checks the relay gives it up");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join("broker.sock");
        let broker = std::os::unix::net::UnixListener::bind(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        spawn_relay(listener, path, true).unwrap();

        // A connection is carried: the broker side reads the hello, then the bytes.
        let mut code = TcpStream::connect(("127.0.0.1", port)).unwrap();
        code.write_all(b"CONNECT x:443 HTTP/1.1\r\n\r\n").unwrap();
        let (mut channel, _) = broker.accept().unwrap();
        let mut head = vec![0u8; 4 + EGRESS_HELLO.len()];
        channel.read_exact(&mut head).unwrap();
        assert_eq!(&head[4..], EGRESS_HELLO);

        // Every relay thread (the listener's and the connection's) is nobody, with no
        // capability; this thread is still root.
        let mut seen = Vec::new();
        for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            if !comm.starts_with("egress-") {
                continue;
            }
            seen.push(comm.trim().to_owned());
            let status = std::fs::read_to_string(task.path().join("status")).unwrap();
            let field = |k: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(&format!("{k}:")))
                    .unwrap()
                    .split_whitespace()
                    .collect::<Vec<_>>()
            };
            assert_eq!(field("Uid"), vec!["65534"; 4], "{comm}: {status}");
            assert_eq!(field("Gid"), vec!["65534"; 4], "{comm}: {status}");
            assert!(field("Groups").is_empty(), "{comm}: {status}");
            for caps in ["CapPrm", "CapEff", "CapAmb"] {
                assert_eq!(field(caps), vec!["0000000000000000"], "{comm} {caps}");
            }
        }
        // The listener's thread and the connection's (and its upward copy, once started).
        for name in ["egress-relay", "egress-conn"] {
            assert!(seen.iter().any(|s| s == name), "no {name} thread: {seen:?}");
        }
        assert!(rustix::process::geteuid().is_root());
    }
}
