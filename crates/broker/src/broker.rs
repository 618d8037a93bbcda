//! The broker of one run: it serves the run's channel, checks each call (budget, canonical
//! path, exact route and method, sizes, time left), attaches the run's credential itself,
//! calls the API, and answers; it lists every call for the result.
//!
//! It trusts the channel to be private to the run (a socketpair end only the run's child
//! inherited, or a socket only the run's sandbox can reach): whoever holds the channel is the
//! run, so there is no key to present. What the run gets through it is bounded by the grant.

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use plimsoll_sandbox::BrokerPort;
use plimsoll_wire::{EgressReceipt, GrantCall};
use serde_json::{Value, json};

use crate::credential::Credential;
use crate::egress::proxy::Egress;
use crate::frame::{ReadFrameError, read_frame_within, write_frame};
use crate::leak::Needles;
use crate::profile::{Grant, Profile};
use crate::route::{METHODS, canonical};
use crate::upstream::{Call, CallUpstreamError};

/// Every code the broker answers a refused or failed call with (and lists on the result);
/// docs/capability-grants.md explains each.
pub const ERROR_CODES: &[&str] = &[
    "bad_request",
    "budget_exhausted",
    "path_not_canonical",
    "route_not_allowed",
    "request_too_large",
    "response_too_large",
    "deadline",
    "upstream_timeout",
    "upstream_failed",
    "response_rejected",
    "too_many_connections",
    "no_api_grant",
];

/// How long the rest of a frame may take once its first byte arrived; a frame left unfinished
/// closes the connection.
const FRAME_WITHIN: Duration = Duration::from_secs(5);

/// Room in a request frame beyond the body cap, for the method, path and id.
const FRAME_OVERHEAD: u64 = 8 * 1024;

/// Why the broker refused a call or it failed: a stable code (the result lists it, the
/// sandbox's client reports it) and a message for the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Refusal {
    code: &'static str,
    message: String,
}

impl Refusal {
    fn new(code: &'static str, message: impl Into<String>) -> Self {
        Refusal {
            code,
            message: message.into(),
        }
    }
}

/// A call as the sandbox sent it.
#[derive(Debug)]
struct Request {
    method: &'static str,
    path: String,
    body: Option<Value>,
}

/// The broker of one run. Cheap to clone; [`Broker::finish`] ends it.
#[derive(Debug, Clone)]
pub struct Broker {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    grant: Grant,
    /// The API side, for an API grant.
    api: Option<Api>,
    /// The egress side: for an egress grant its proxy; for any other, one that refuses
    /// every attempt (and lists it).
    egress: Egress,
    run_id: String,
    served: Mutex<Served>,
}

/// The API side of a run's broker.
#[derive(Debug)]
struct Api {
    profile: Arc<Profile>,
    credential: Credential,
    needles: Needles,
    run_id: String,
    deadline: Instant,
    ledger: Mutex<Ledger>,
}

/// What a run's broker leaves when it ends.
#[derive(Debug, Default)]
pub struct Finished {
    /// Every API call, in order.
    pub calls: Vec<GrantCall>,
    /// Every egress attempt's receipt, in the order they began.
    pub egress: Vec<EgressReceipt>,
}

#[derive(Debug, Default)]
struct Ledger {
    used: u32,
    calls: Vec<GrantCall>,
    over_budget_listed: bool,
}

#[derive(Debug, Default)]
struct Served {
    finished: bool,
    threads: Vec<JoinHandle<()>>,
    /// A handle to shut down each connection being served, by connection number.
    streams: HashMap<u64, UnixStream>,
    next_stream: u64,
    /// Whether a connection over the cap was logged (once per run).
    over_cap_logged: bool,
    stop: Option<OwnedFd>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Broker {
    /// The broker of run `run_id` by `caller` under `grant`, which may last `budget`: for an
    /// API grant, mints the run's credential now (a JWT's expiry is the end of the budget at
    /// the latest).
    pub fn start(grant: Grant, caller: &str, run_id: &str, budget: Duration) -> Broker {
        let deadline = Instant::now() + budget;
        let api = grant.api().map(|profile| {
            let credential = profile
                .minter()
                .mint(caller, run_id, SystemTime::now(), budget);
            let needles = Needles::new(credential.expose().as_bytes());
            Api {
                profile: Arc::clone(profile),
                credential,
                needles,
                run_id: run_id.to_owned(),
                deadline,
                ledger: Mutex::new(Ledger::default()),
            }
        });
        let egress = Egress::new(grant.egress().cloned(), run_id, deadline);
        Broker {
            inner: Arc::new(Inner {
                grant,
                api,
                egress,
                run_id: run_id.to_owned(),
                served: Mutex::new(Served::default()),
            }),
        }
    }

    /// The grant.
    pub fn grant(&self) -> &Grant {
        &self.inner.grant
    }

    /// Ends the broker: closes every channel, waits for the calls and connections in flight
    /// (each bounded by its timeout or the run's deadline), and returns every call and every
    /// egress receipt. Call once the sandbox is gone.
    pub fn finish(&self) -> Finished {
        let threads = {
            let mut served = lock(&self.inner.served);
            served.finished = true;
            for (_, s) in served.streams.drain() {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            if let Some(stop) = &served.stop {
                // Wakes every accept loop (each polls a duplicate of this eventfd).
                let _ = rustix::io::write(stop, &1u64.to_ne_bytes());
            }
            std::mem::take(&mut served.threads)
        };
        for t in threads {
            let _ = t.join();
        }
        Finished {
            calls: self
                .inner
                .api
                .as_ref()
                .map(|a| std::mem::take(&mut lock(&a.ledger).calls))
                .unwrap_or_default(),
            egress: self.inner.egress.take_receipts(),
        }
    }

    /// Takes the calls and egress receipts listed so far, leaving the broker serving (a
    /// session's broker, between its calls). A connection still open is listed when it ends.
    pub fn drain(&self) -> Finished {
        Finished {
            calls: self
                .inner
                .api
                .as_ref()
                .map(|a| std::mem::take(&mut lock(&a.ledger).calls))
                .unwrap_or_default(),
            egress: self.inner.egress.take_receipts(),
        }
    }

    /// Serves `stream` on a thread of its own, with a handle to shut it down at the end; a
    /// connection beyond the profile's cap is answered `too_many_connections` and closed.
    fn spawn_connection(&self, stream: UnixStream) -> io::Result<()> {
        let closer = stream.try_clone()?;
        let mut served = lock(&self.inner.served);
        if served.finished {
            return Err(io::Error::other("the run is over: its broker is closed"));
        }
        let cap = match &self.inner.grant {
            Grant::Api(p) => p.max_connections(),
            // Each tunnel is a connection; the proxy refuses those over `max_open` itself,
            // with an answer the code's HTTP client reads.
            Grant::Egress(p) => p.max_open() + 4,
        };
        if served.streams.len() >= cap as usize {
            let first = !served.over_cap_logged;
            served.over_cap_logged = true;
            drop(served);
            if first {
                tracing::warn!(run_id = %self.inner.run_id, profile = self.inner.grant.name(), cap, "a run opened more broker connections at once than its grant allows; the extra ones are closed");
            }
            let refusal = Refusal::new(
                "too_many_connections",
                format!(
                    "this run already holds the {cap} connections to the broker its grant allows at once: reuse one, or close one first"
                ),
            );
            let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = write_frame(&mut &stream, &error_reply(Value::Null, &refusal));
            return Ok(());
        }
        let id = served.next_stream;
        served.next_stream += 1;
        served.streams.insert(id, closer);
        let inner = Arc::clone(&self.inner);
        let spawned = self.spawn_locked(&mut served, move || {
            inner.serve(stream);
            lock(&inner.served).streams.remove(&id);
        });
        if spawned.is_err() {
            served.streams.remove(&id);
        }
        spawned
    }

    /// Runs `work` on a thread the end waits for.
    fn spawn(&self, work: impl FnOnce() + Send + 'static) -> io::Result<()> {
        let mut served = lock(&self.inner.served);
        if served.finished {
            return Err(io::Error::other("the run is over: its broker is closed"));
        }
        self.spawn_locked(&mut served, work)
    }

    fn spawn_locked(
        &self,
        served: &mut Served,
        work: impl FnOnce() + Send + 'static,
    ) -> io::Result<()> {
        // Threads that ended need no join: only those still running keep a handle.
        served.threads.retain(|t| !t.is_finished());
        let t = std::thread::Builder::new()
            .name(format!("broker-{}", self.inner.run_id))
            .spawn(work)?;
        served.threads.push(t);
        Ok(())
    }

    fn stop_fd(&self) -> io::Result<OwnedFd> {
        let mut served = lock(&self.inner.served);
        if served.stop.is_none() {
            served.stop = Some(rustix::event::eventfd(
                0,
                rustix::event::EventfdFlags::CLOEXEC,
            )?);
        }
        let stop = served.stop.as_ref().expect("made above");
        stop.try_clone()
    }
}

impl BrokerPort for Broker {
    fn serve_stream(&self, stream: UnixStream) -> io::Result<()> {
        self.spawn_connection(stream)
    }

    fn serve_listener(&self, listener: UnixListener) -> io::Result<()> {
        let stop = self.stop_fd()?;
        let me = self.clone();
        self.spawn(move || me.accept_loop(&listener, &stop))
    }

    fn egress(&self) -> bool {
        self.inner.grant.egress().is_some()
    }
}

impl Broker {
    fn accept_loop(&self, listener: &UnixListener, stop: &OwnedFd) {
        use rustix::event::{PollFd, PollFlags, poll};
        loop {
            let mut fds = [
                PollFd::new(listener, PollFlags::IN),
                PollFd::new(stop, PollFlags::IN),
            ];
            match poll(&mut fds, None) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return,
            }
            if !fds[1].revents().is_empty() {
                return;
            }
            match listener.accept() {
                Ok((stream, _)) => {
                    if self.serve_stream(stream).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }
}

/// The frame that turns a channel connection into an egress proxy connection.
pub(crate) fn is_egress_hello(frame: &[u8]) -> bool {
    serde_json::from_slice::<Value>(frame).is_ok_and(|v| v == json!({"egress": 1}))
}

impl Inner {
    /// Serves one connection: an egress proxy connection when its first frame is the egress
    /// hello, else API calls, one frame each.
    fn serve(&self, stream: UnixStream) {
        let max = u32::try_from(
            self.api
                .as_ref()
                .map_or(0, |a| a.profile.max_request_bytes())
                + FRAME_OVERHEAD,
        )
        .unwrap_or(u32::MAX);
        let first = match read_frame_within(&stream, max, FRAME_WITHIN) {
            Ok(None) | Err(ReadFrameError::Io(_)) => return,
            Ok(Some(frame)) if is_egress_hello(&frame) => {
                self.egress.serve(&stream);
                return;
            }
            other => other,
        };
        match &self.api {
            Some(api) => api.serve(&stream, first),
            None => {
                let refusal = Refusal::new(
                    "no_api_grant",
                    "this run's grant is an egress grant: it calls no API (use HTTPS_PROXY, which the sandbox sets)",
                );
                let _ = write_frame(&mut &stream, &error_reply(Value::Null, &refusal));
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

impl Api {
    /// Serves API calls until the connection ends, fails, sends a frame it does not finish
    /// within [`FRAME_WITHIN`], or sends a frame that is not JSON (answered, then closed).
    /// `first` is the first frame, already read.
    fn serve(&self, stream: &UnixStream, first: Result<Option<Vec<u8>>, ReadFrameError>) {
        let max =
            u32::try_from(self.profile.max_request_bytes() + FRAME_OVERHEAD).unwrap_or(u32::MAX);
        let mut next = Some(first);
        loop {
            let read = match next.take() {
                Some(first) => first,
                None => read_frame_within(stream, max, FRAME_WITHIN),
            };
            let (reply, close) = match read {
                Ok(None) | Err(ReadFrameError::Io(_)) => return,
                Ok(Some(frame)) => self.handle(&frame),
                Err(ReadFrameError::TooLarge(_)) => {
                    let started = Instant::now();
                    let refusal = Refusal::new(
                        "request_too_large",
                        format!(
                            "the request is larger than this grant's cap of {} bytes",
                            self.profile.max_request_bytes()
                        ),
                    );
                    let reply = match self.spend("OTHER") {
                        Err(reply) => reply,
                        Ok(()) => self.refuse(Value::Null, "OTHER", None, refusal, started),
                    };
                    (reply, false)
                }
            };
            if write_frame(&mut &*stream, &reply).is_err() || close {
                let _ = stream.shutdown(std::net::Shutdown::Both);
                return;
            }
        }
    }

    /// One call: parse, count, check, call, record, answer; and whether the connection must
    /// close (the frame is not JSON: the peer does not speak the channel's protocol, or the
    /// stream is out of step). A JSON call of the wrong shape is refused and the connection
    /// kept, as any other refused call.
    fn handle(&self, frame: &[u8]) -> (Value, bool) {
        let started = Instant::now();
        let parsed: Result<Value, _> = serde_json::from_slice(frame);
        let not_json = parsed.is_err();
        let id = parsed
            .as_ref()
            .ok()
            .and_then(|v| v.get("id"))
            .filter(|v| v.is_u64())
            .cloned()
            .unwrap_or(Value::Null);
        let request = parsed
            .map_err(|_| Refusal::new("bad_request", "the request is not JSON"))
            .and_then(|v| parse_request(&v));
        let method = request.as_ref().map_or("OTHER", |r| r.method);
        if let Err(reply) = self.spend(method) {
            return (reply, not_json);
        }
        match request {
            Ok(r) => (self.call(id, &r, started), false),
            Err(refusal) => (self.refuse(id, method, None, refusal, started), not_json),
        }
    }

    /// Counts a call against the budget; past it, the answer is `budget_exhausted` (the
    /// first such call is listed, later ones are not, so the list stays bounded).
    fn spend(&self, method: &'static str) -> Result<(), Value> {
        let mut ledger = lock(&self.ledger);
        let budget = self.profile.call_budget();
        if ledger.used < budget {
            ledger.used += 1;
            return Ok(());
        }
        let refusal = Refusal::new(
            "budget_exhausted",
            format!("this run has used all {budget} calls its grant allows"),
        );
        if !ledger.over_budget_listed {
            ledger.over_budget_listed = true;
            ledger.calls.push(GrantCall {
                method: method.to_owned(),
                route: None,
                status: None,
                error: Some(refusal.code.to_owned()),
                request_bytes: 0,
                response_bytes: 0,
                latency_ms: 0,
                credential: Some(self.profile.minter().kind()),
            });
            drop(ledger);
            self.log(method, None, None, Some(refusal.code), 0, 0, Duration::ZERO);
        }
        Err(error_reply(Value::Null, &refusal))
    }

    fn call(&self, id: Value, r: &Request, started: Instant) -> Value {
        let p = &*self.profile;
        let path = match canonical(&r.path) {
            Ok(path) => path,
            Err(why) => {
                return self.refuse(
                    id,
                    r.method,
                    None,
                    Refusal::new("path_not_canonical", why.to_string()),
                    started,
                );
            }
        };
        let Some(route) = p.routes().iter().find(|rt| rt.matches(r.method, &path)) else {
            let refusal = Refusal::new(
                "route_not_allowed",
                format!(
                    "this grant allows no route matching {} {}",
                    r.method, r.path
                ),
            );
            return self.refuse(id, r.method, None, refusal, started);
        };
        let template = Some(route.template());
        let body = r
            .body
            .as_ref()
            .map(|v| serde_json::to_vec(v).expect("a JSON value serialises"));
        let request_bytes = body.as_ref().map_or(0, |b| b.len() as u64);
        if request_bytes > p.max_request_bytes() {
            let refusal = Refusal::new(
                "request_too_large",
                format!(
                    "the request body is larger than this grant's cap of {} bytes",
                    p.max_request_bytes()
                ),
            );
            return self.refuse(id, r.method, template, refusal, started);
        }
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let refusal = Refusal::new("deadline", "the run's time is up");
            return self.refuse(id, r.method, template, refusal, started);
        }
        let answer = p.upstream().call(&Call {
            method: r.method,
            path: &r.path,
            body,
            header: p.header(),
            scheme: p.scheme(),
            credential: &self.credential,
            timeout: p.call_timeout().min(left),
            max_response_bytes: p.max_response_bytes(),
        });
        let answer = match answer {
            Ok(a) => a,
            Err(e) => {
                if let CallUpstreamError::Failed(cause) = &e {
                    tracing::warn!(run_id = %self.run_id, profile = p.name(), error = %cause, "upstream call failed");
                }
                let code = match e {
                    CallUpstreamError::Timeout(_) => "upstream_timeout",
                    CallUpstreamError::TooLarge(_) => "response_too_large",
                    CallUpstreamError::Failed(_) => "upstream_failed",
                };
                let refusal = Refusal::new(code, e.to_string());
                return self.record_reply(
                    id,
                    r.method,
                    template,
                    None,
                    Err(refusal),
                    request_bytes,
                    0,
                    started,
                );
            }
        };
        let response_bytes = answer.body.len() as u64;
        let body = if answer.body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&answer.body).unwrap_or_else(|_| {
                Value::String(String::from_utf8_lossy(&answer.body).into_owned())
            })
        };
        // An API that echoes the request's headers, in any common encoding, would hand the
        // sandbox its credential.
        if self
            .needles
            .found(&answer.body, &body, p.max_response_bytes())
        {
            let refusal = Refusal::new(
                "response_rejected",
                "the API's response contained the credential, so the broker withheld it",
            );
            return self.record_reply(
                id,
                r.method,
                template,
                Some(answer.status),
                Err(refusal),
                request_bytes,
                response_bytes,
                started,
            );
        }
        self.record_reply(
            id,
            r.method,
            template,
            Some(answer.status),
            Ok(body),
            request_bytes,
            response_bytes,
            started,
        )
    }

    fn refuse(
        &self,
        id: Value,
        method: &'static str,
        route: Option<&str>,
        refusal: Refusal,
        started: Instant,
    ) -> Value {
        self.record_reply(id, method, route, None, Err(refusal), 0, 0, started)
    }

    #[expect(clippy::too_many_arguments, reason = "one call's whole record")]
    fn record_reply(
        &self,
        id: Value,
        method: &'static str,
        route: Option<&str>,
        status: Option<u16>,
        outcome: Result<Value, Refusal>,
        request_bytes: u64,
        response_bytes: u64,
        started: Instant,
    ) -> Value {
        let latency = started.elapsed();
        let error = outcome.as_ref().err().map(|r| r.code);
        lock(&self.ledger).calls.push(GrantCall {
            method: method.to_owned(),
            route: route.map(str::to_owned),
            status,
            error: error.map(str::to_owned),
            request_bytes,
            response_bytes,
            latency_ms: latency.as_millis() as u64,
            credential: Some(self.profile.minter().kind()),
        });
        self.log(
            method,
            route,
            status,
            error,
            request_bytes,
            response_bytes,
            latency,
        );
        match outcome {
            Ok(body) => json!({"id": id, "status": status, "body": body}),
            Err(refusal) => error_reply(id, &refusal),
        }
    }

    #[expect(clippy::too_many_arguments, reason = "one log line's fields")]
    fn log(
        &self,
        method: &str,
        route: Option<&str>,
        status: Option<u16>,
        error: Option<&str>,
        request_bytes: u64,
        response_bytes: u64,
        latency: Duration,
    ) {
        tracing::info!(
            run_id = %self.run_id,
            profile = self.profile.name(),
            // A static secret is the same for every run and outlives it: said on every call,
            // so the evidence of the run's calls shows which kind the API was handed.
            credential = if self.profile.minter().is_static() {
                "static"
            } else {
                "minted"
            },
            method,
            route = route.unwrap_or("-"),
            status = status.map_or(0, u32::from),
            error = error.unwrap_or("-"),
            request_bytes,
            response_bytes,
            latency_us = latency.as_micros() as u64,
            "grant call"
        );
    }
}

fn error_reply(id: Value, r: &Refusal) -> Value {
    json!({"id": id, "error": {"code": r.code, "message": r.message}})
}

/// Reads `{"id"?: n, "method": "...", "path": "...", "body"?: json}`; nothing else.
fn parse_request(v: &Value) -> Result<Request, Refusal> {
    let bad = |m: &str| Refusal::new("bad_request", m.to_owned());
    let obj = v
        .as_object()
        .ok_or_else(|| bad("the request must be a JSON object"))?;
    if let Some(k) = obj
        .keys()
        .find(|k| !matches!(k.as_str(), "id" | "method" | "path" | "body"))
    {
        return Err(bad(&format!(
            "unknown field `{k}`: a request has id, method, path and body only (the broker sets every header)"
        )));
    }
    let method = obj
        .get("method")
        .and_then(Value::as_str)
        .and_then(|m| METHODS.iter().find(|x| **x == m))
        .ok_or_else(|| bad("method must be one of GET, POST, PUT, PATCH, DELETE"))?;
    let path = obj
        .get("path")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("path must be a string"))?
        .to_owned();
    let body = obj.get("body").cloned();
    if body.is_some() && matches!(*method, "GET" | "DELETE") {
        return Err(bad(&format!("{method} takes no body")));
    }
    Ok(Request { method, path, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_listed_and_documented() {
        let source = include_str!("broker.rs");
        let doc = include_str!("../../../docs/capability-grants.md");
        let quoted: Vec<&str> = source.split('"').skip(1).step_by(2).collect();
        for code in ERROR_CODES {
            assert!(quoted.contains(code), "{code} is listed but never used");
            assert!(
                doc.contains(&format!("| `{code}` |")),
                "docs/capability-grants.md does not explain `{code}`"
            );
        }
        // Every literal a Refusal is made with is a listed code.
        for chunk in source.split(concat!("Refusal::", "new(")).skip(1) {
            if let Some(rest) = chunk.trim_start().strip_prefix('"') {
                let code = &rest[..rest.find('"').unwrap()];
                assert!(
                    ERROR_CODES.contains(&code),
                    "`{code}` is not in ERROR_CODES"
                );
            }
        }
    }

    #[test]
    fn requests_are_read_strictly() {
        let ok = parse_request(&json!({"id": 1, "method": "POST", "path": "/a", "body": {"x": 1}}))
            .unwrap();
        assert_eq!(ok.method, "POST");
        for bad in [
            json!([1]),
            json!({"method": "GET"}),
            json!({"method": "get", "path": "/a"}),
            json!({"method": "OPTIONS", "path": "/a"}),
            json!({"method": "GET", "path": "/a", "body": 1}),
            json!({"method": "GET", "path": "/a", "headers": {"Authorization": "x"}}),
        ] {
            assert_eq!(
                parse_request(&bad).unwrap_err().code,
                "bad_request",
                "{bad}"
            );
        }
    }
}
