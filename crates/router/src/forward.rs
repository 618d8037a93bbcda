//! One HTTP exchange with a node, telling "nothing was sent" apart from "sent, then lost".
//!
//! Each exchange opens its own connection: a TCP connect that fails sent nothing, so the
//! request may go to another node; once the connection is up and the request is being
//! written, any failure is "may have run" (the node may have read it whole and started the
//! run before it went away). The connection keeps TCP keepalive probes going, so a node whose
//! link is dropped while a run is in flight is noticed within [`KEEPALIVE_GIVE_UP`] instead of
//! never.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use plimsoll_sandbox::error_chain;
use tokio::net::TcpStream;

/// How long a TCP connect to a node may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Keepalive: first probe after this much silence on a connection...
const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
/// ...then one every this long...
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);
/// ...and the connection is given up after this many unanswered ones.
const KEEPALIVE_PROBES: u32 = 3;
/// How long a node that stopped answering at the TCP level can hold an exchange:
/// keepalive's idle time plus its unanswered probes.
pub const KEEPALIVE_GIVE_UP: Duration = Duration::from_secs(
    KEEPALIVE_IDLE.as_secs() + KEEPALIVE_INTERVAL.as_secs() * KEEPALIVE_PROBES as u64,
);
/// Data written and not acknowledged for this long ends the connection (a dropped link
/// while the request or its body is being sent).
const USER_TIMEOUT: Duration = Duration::from_secs(10);

/// Why an exchange with a node gave no answer.
#[derive(Debug)]
pub enum ExchangeError {
    /// No connection was made: nothing of the request reached the node.
    NotSent(String),
    /// The connection was made and the request (or part of it) sent, then it failed: the
    /// node may have acted on it.
    Lost(String),
}

/// Connects to `addr`, nothing sent yet. Keepalive and the user timeout are set on the socket.
pub async fn connect(addr: SocketAddr) -> Result<TcpStream, ExchangeError> {
    let stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(ExchangeError::NotSent(format!("cannot connect: {e}"))),
        Err(_) => {
            return Err(ExchangeError::NotSent(format!(
                "no connection within {} s",
                CONNECT_TIMEOUT.as_secs()
            )));
        }
    };
    let sock = socket2::SockRef::from(&stream);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    let set = sock
        .set_tcp_keepalive(&keepalive)
        .and_then(|()| sock.set_tcp_user_timeout(Some(USER_TIMEOUT)))
        .and_then(|()| stream.set_nodelay(true));
    if let Err(e) = set {
        return Err(ExchangeError::NotSent(format!(
            "cannot set the connection's keepalive: {e}"
        )));
    }
    Ok(stream)
}

/// Sends `req` to the node at `addr` and returns its answer's head (the body streams on).
pub async fn exchange(
    addr: SocketAddr,
    req: hyper::Request<Body>,
) -> Result<hyper::Response<Incoming>, ExchangeError> {
    let stream = connect(addr).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| ExchangeError::NotSent(format!("cannot start HTTP: {e}")))?;
    tokio::spawn(async move {
        // Ends with the answer's body (or the node's failure, which the body then reports).
        let _ = conn.await;
    });
    sender
        .send_request(req)
        .await
        .map_err(|e| ExchangeError::Lost(error_chain(&e)))
}
