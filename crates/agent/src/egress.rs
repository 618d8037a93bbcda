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
    serve(listener, socket).map_err(RelayError::Thread)?;
    Ok(true)
}

/// Serves the relay on `listener`, on a thread of its own: each connection is carried over a
/// new connection to the broker socket at `socket` (the benchmark serves a loopback port of
/// its choosing the same way).
pub fn serve(listener: TcpListener, socket: PathBuf) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("egress-relay".into())
        .spawn(move || {
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
        })
        .map(drop)
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
}
