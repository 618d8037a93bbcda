//! The HTTP surface: routes, authentication, one mapping from every failure to its status and
//! `ErrorResponse` ([`Failure`]), and one log line per run answer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, delete, get, post, put};
use http_body_util::BodyExt;
use plimsoll_engine::{Engine, RunError};
use plimsoll_wire::{ErrorBody, ErrorResponse, PROTOCOL, Reason, RunResponse, parse_request};

use plimsoll_callers::Token;

use crate::callers::CallerStore;
use crate::metrics::{Metrics, OUTCOME_CANCELLED, outcome_label};

/// The OpenAPI document of this daemon (docs/openapi.json), served at `GET /v1/openapi.json`.
pub const OPENAPI_JSON: &str = include_str!("../../../docs/openapi.json");

/// Seconds a client is told to wait after a `capacity` refusal.
pub const RETRY_AFTER_SECS: u64 = 1;

/// What every handler shares.
#[derive(Debug)]
pub struct Shared {
    /// The engine runs are handed to.
    pub engine: Arc<Engine>,
    /// Who may call.
    pub callers: CallerStore,
    /// Counters for `/metrics`.
    pub metrics: Metrics,
    /// Largest accepted `POST /v1/runs` body.
    pub max_body_bytes: usize,
    /// Streamed answers being delivered, bounded in all and per caller.
    pub(crate) deliveries: Arc<crate::streams::Deliveries>,
}

/// Handler state: cheap to clone.
pub type AppState = Arc<Shared>;

/// One route the router serves.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    /// The HTTP method.
    pub method: &'static str,
    /// The path.
    pub path: &'static str,
    /// Whether it needs a bearer token.
    pub auth: bool,
    make: fn() -> MethodRouter<AppState>,
}

/// Every route, in one table: the router is built from it, and a test checks that each one
/// appears in the OpenAPI document.
pub const ROUTES: &[Route] = &[
    Route {
        method: "POST",
        path: "/v1/runs",
        auth: true,
        make: || post(runs),
    },
    Route {
        method: "POST",
        path: "/v1/sessions",
        auth: true,
        make: || post(crate::sessions::open),
    },
    Route {
        method: "GET",
        path: "/v1/sessions",
        auth: true,
        make: || get(crate::sessions::list),
    },
    Route {
        method: "GET",
        path: "/v1/sessions/{id}",
        auth: true,
        make: || get(crate::sessions::show),
    },
    Route {
        method: "DELETE",
        path: "/v1/sessions/{id}",
        auth: true,
        make: || delete(crate::sessions::close),
    },
    Route {
        method: "POST",
        path: "/v1/sessions/{id}/cells",
        auth: true,
        make: || post(crate::sessions::cell),
    },
    Route {
        method: "POST",
        path: "/v1/sessions/{id}/steps",
        auth: true,
        make: || post(crate::sessions::steps),
    },
    Route {
        method: "PUT",
        path: "/v1/sessions/{id}/files/{*path}",
        auth: true,
        make: || put(crate::sessions::put_file),
    },
    Route {
        method: "GET",
        path: "/v1/sessions/{id}/files/{*path}",
        auth: true,
        make: || get(crate::sessions::get_file),
    },
    Route {
        method: "POST",
        path: "/v1/sessions/{id}/snapshot",
        auth: true,
        make: || post(crate::sessions::snapshot),
    },
    Route {
        method: "POST",
        path: "/v1/sessions/{id}/fork",
        auth: true,
        make: || post(crate::sessions::fork),
    },
    Route {
        method: "GET",
        path: "/v1/snapshots",
        auth: true,
        make: || get(crate::sessions::list_snapshots),
    },
    Route {
        method: "POST",
        path: "/v1/snapshots/{id}/sessions",
        auth: true,
        make: || post(crate::sessions::open_snapshot),
    },
    Route {
        method: "DELETE",
        path: "/v1/snapshots/{id}",
        auth: true,
        make: || delete(crate::sessions::delete_snapshot),
    },
    Route {
        method: "GET",
        path: "/v1/providers",
        auth: true,
        make: || get(providers),
    },
    Route {
        method: "GET",
        path: "/healthz",
        auth: false,
        make: || get(healthz),
    },
    Route {
        method: "GET",
        path: "/readyz",
        auth: false,
        make: || get(readyz),
    },
    Route {
        method: "GET",
        path: "/metrics",
        auth: false,
        make: || get(metrics),
    },
    Route {
        method: "GET",
        path: "/v1/openapi.json",
        auth: false,
        make: || get(openapi),
    },
];

/// The router over [`ROUTES`], with JSON 404 and 405 answers and request counting.
pub fn router(state: AppState) -> Router {
    let mut r: Router<AppState> = Router::new();
    for route in ROUTES {
        r = r.route(route.path, (route.make)());
    }
    let r = crate::mcp::mount(r, &state);
    r.fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), count_http))
        .with_state(state)
}

/// Every answer that is not a run response. Each gets its HTTP status, its `error.code` and
/// its not-dispatched mark here and nowhere else; every one is sent as an `ErrorResponse`,
/// hyper's own answers to a head it cannot parse included ([`AutoErrorBodies`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Refused before anything ran, by the parser or the engine, for this reason.
    Refused(Reason),
    /// No bearer token, or one this daemon does not know.
    Unauthenticated,
    /// The callers file cannot be read, so no caller can be checked.
    CallersUnavailable,
    /// The body is over `[daemon].max_body_bytes`.
    BodyTooLarge,
    /// The body did not arrive in time.
    BodyTimedOut,
    /// The body could not be read (the connection failed, or its framing was broken).
    BodyUnreadable,
    /// No such route.
    NotFound,
    /// The route does not take this method.
    MethodNotAllowed,
    /// The request's `Accept` does not admit what the route answers with (`/mcp`).
    NotAcceptable,
    /// The request's `Content-Type` is not one the route reads (`/mcp`).
    UnsupportedMediaType,
    /// hyper could not parse the request line or a header.
    HeadMalformed,
    /// The request head is over hyper's size or header-count limit.
    HeadTooLarge,
    /// The request target is over hyper's length limit.
    UriTooLong,
    /// A session's open or call refused before anything of it ran, with a code of its own
    /// (docs/sessions.md): `session_not_found` and `snapshot_not_found` (404), `session_ended` (410),
    /// `sandbox_changed` and `interpreter_ended` (409).
    Session {
        /// The code on the wire.
        code: &'static str,
        /// The not-dispatched reason.
        reason: Reason,
        /// Why the session ended, when it has.
        end_reason: Option<plimsoll_wire::EndReason>,
    },
    /// The run failed after its code may have started.
    SandboxFailed,
    /// The run was cancelled after it was dispatched: its client went away (a streamed
    /// run); its code may have run. Only a client that left is ever answered this.
    Cancelled,
    /// The daemon failed while handling the run; its code may have started.
    Internal,
}

impl Failure {
    /// The HTTP status.
    pub fn status(self) -> StatusCode {
        match self {
            Failure::Refused(reason) => status_for(reason),
            Failure::Session { code, reason, .. } => match code {
                "session_not_found" | "snapshot_not_found" => StatusCode::NOT_FOUND,
                "session_ended" => StatusCode::GONE,
                "sandbox_changed" | "interpreter_ended" => StatusCode::CONFLICT,
                _ => status_for(reason),
            },
            Failure::Unauthenticated => StatusCode::UNAUTHORIZED,
            Failure::CallersUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Failure::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Failure::BodyTimedOut => StatusCode::REQUEST_TIMEOUT,
            Failure::BodyUnreadable | Failure::HeadMalformed => StatusCode::BAD_REQUEST,
            Failure::NotFound => StatusCode::NOT_FOUND,
            Failure::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Failure::NotAcceptable => StatusCode::NOT_ACCEPTABLE,
            Failure::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Failure::HeadTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Failure::UriTooLong => StatusCode::URI_TOO_LONG,
            Failure::SandboxFailed | Failure::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            // nginx's "client closed request": the client that would read it is gone.
            Failure::Cancelled => StatusCode::from_u16(499).expect("499 is a valid status"),
        }
    }

    /// The stable `error.code`.
    pub fn code(self) -> &'static str {
        match self {
            Failure::Refused(reason) => reason.as_str(),
            Failure::Session { code, .. } => code,
            Failure::Unauthenticated => "unauthenticated",
            Failure::CallersUnavailable => "callers_unavailable",
            Failure::BodyTooLarge
            | Failure::BodyTimedOut
            | Failure::BodyUnreadable
            | Failure::HeadMalformed
            | Failure::HeadTooLarge
            | Failure::UriTooLong
            | Failure::NotAcceptable
            | Failure::UnsupportedMediaType => "request",
            Failure::NotFound => "not_found",
            Failure::MethodNotAllowed => "method_not_allowed",
            Failure::SandboxFailed => "sandbox_failed",
            Failure::Cancelled => "cancelled",
            Failure::Internal => "internal",
        }
    }

    /// The not-dispatched mark: set for every failure before a run could start.
    pub fn not_dispatched(self) -> Option<Reason> {
        match self {
            Failure::Refused(reason) | Failure::Session { reason, .. } => Some(reason),
            Failure::Unauthenticated => Some(Reason::Permission),
            Failure::CallersUnavailable => Some(Reason::Environment),
            Failure::BodyTooLarge
            | Failure::BodyTimedOut
            | Failure::BodyUnreadable
            | Failure::NotFound
            | Failure::MethodNotAllowed
            | Failure::HeadMalformed
            | Failure::HeadTooLarge
            | Failure::UriTooLong
            | Failure::NotAcceptable
            | Failure::UnsupportedMediaType => Some(Reason::Request),
            Failure::SandboxFailed | Failure::Cancelled | Failure::Internal => None,
        }
    }

    /// The `ErrorResponse` of this failure.
    pub fn body(self, request_id: Option<String>, message: String) -> ErrorResponse {
        ErrorResponse {
            protocol: PROTOCOL,
            request_id,
            error: ErrorBody {
                code: self.code().to_owned(),
                message,
                not_dispatched: self.not_dispatched(),
                end_reason: match self {
                    Failure::Session { end_reason, .. } => end_reason,
                    _ => None,
                },
            },
        }
    }

    /// The whole HTTP answer: status, the headers the status calls for, the JSON body.
    pub fn respond(self, request_id: Option<String>, message: String) -> Response {
        let status = self.status();
        let mut resp = (status, axum::Json(self.body(request_id, message))).into_response();
        if status == StatusCode::TOO_MANY_REQUESTS {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
        }
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}

/// The failure a refusal of the engine answers with.
pub(crate) fn failure_of(err: &RunError) -> Failure {
    match err {
        RunError::SessionRefused {
            reason,
            code,
            end_reason,
            ..
        } => Failure::Session {
            code,
            reason: *reason,
            end_reason: *end_reason,
        },
        RunError::Refused { reason, .. } => Failure::Refused(*reason),
        RunError::Failed { .. } => Failure::SandboxFailed,
        RunError::Cancelled { .. } => Failure::Cancelled,
    }
}

/// The HTTP status of a refusal with this reason.
pub fn status_for(reason: Reason) -> StatusCode {
    StatusCode::from_u16(reason.http_status()).expect("every reason's status is a valid one")
}

async fn count_http(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    // Only known paths become labels, so arbitrary URLs cannot grow the metrics.
    let route = ROUTES
        .iter()
        .map(|r| r.path)
        .chain([crate::mcp::MCP_PATH])
        .find(|p| *p == path)
        .unwrap_or("other");
    let resp = next.run(req).await;
    st.metrics.http(route, resp.status().as_u16());
    resp
}

/// Why a request could not be authenticated.
pub(crate) enum AuthFailure {
    Missing,
    Invalid,
    Unavailable(String),
}

impl AuthFailure {
    pub(crate) fn failure(self) -> (Failure, String) {
        match self {
            AuthFailure::Missing => (
                Failure::Unauthenticated,
                "no bearer token: send `Authorization: Bearer <token>` (an operator creates one with `plimsoll callers add NAME`)".into(),
            ),
            AuthFailure::Invalid => (
                Failure::Unauthenticated,
                "the bearer token is not valid on this daemon: check PLIMSOLL_TOKEN, or ask the operator for a token (`plimsoll callers add NAME`)".into(),
            ),
            AuthFailure::Unavailable(message) => (Failure::CallersUnavailable, message),
        }
    }
}

pub(crate) fn authenticate(st: &Shared, headers: &HeaderMap) -> Result<String, AuthFailure> {
    let value = headers
        .get(header::AUTHORIZATION)
        .ok_or(AuthFailure::Missing)?;
    let text = value.to_str().map_err(|_| AuthFailure::Invalid)?;
    let (scheme, rest) = text.split_once(' ').ok_or(AuthFailure::Invalid)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(AuthFailure::Invalid);
    }
    let token = Token::new(rest.trim());
    let callers = st
        .callers
        .current()
        .map_err(|e| AuthFailure::Unavailable(e.to_string()))?;
    callers
        .authenticate(&token)
        .map(str::to_owned)
        .ok_or(AuthFailure::Invalid)
}

/// How much of a body that will not be read whole (no valid token, or over the size limit)
/// is read anyway, only to find its request id.
pub const ID_PREFIX_BYTES: usize = 4096;
/// How long reading that prefix may take.
pub const ID_PREFIX_TIMEOUT: Duration = Duration::from_secs(2);
/// How long an authenticated caller's whole body may take to arrive.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The request id of a body that will not be run, if one can be read from its first bytes
/// (in plimsoll-wire, shared with plimsoll-router).
pub(crate) use plimsoll_wire::scan_request_id as scanned_request_id;

/// Reads at most `limit` bytes of `body`, for at most `timeout` and only until a request id
/// can be read from them, and returns what arrived.
async fn read_prefix(mut body: Body, limit: usize, timeout: Duration) -> Vec<u8> {
    let mut prefix = Vec::new();
    let read = async {
        while prefix.len() < limit {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        let take = data.len().min(limit - prefix.len());
                        prefix.extend_from_slice(&data[..take]);
                    }
                    // Found already: no need to wait for more.
                    if scanned_request_id(&prefix).is_some() {
                        break;
                    }
                }
                Some(Err(_)) | None => break,
            }
        }
    };
    let _ = tokio::time::timeout(timeout, read).await;
    prefix
}

/// Why a request body could not be read whole.
#[derive(Debug)]
pub(crate) enum ReadBodyError {
    /// It is longer than the limit.
    TooLarge { prefix: Vec<u8> },
    /// It did not arrive in time.
    TimedOut { prefix: Vec<u8> },
    /// The connection failed.
    Failed { prefix: Vec<u8>, message: String },
}

impl ReadBodyError {
    /// The failure, its message (for a body limit of `limit` bytes), and the first bytes
    /// that arrived.
    pub(crate) fn failure(self, limit: usize) -> (Failure, String, Vec<u8>) {
        match self {
            ReadBodyError::TooLarge { prefix } => (Failure::BodyTooLarge, too_large(limit), prefix),
            ReadBodyError::TimedOut { prefix } => (
                Failure::BodyTimedOut,
                format!(
                    "the request body did not arrive within {} s: send it whole and promptly",
                    BODY_READ_TIMEOUT.as_secs()
                ),
                prefix,
            ),
            ReadBodyError::Failed { prefix, message } => (
                Failure::BodyUnreadable,
                format!("the request body could not be read ({message}): send it again"),
                prefix,
            ),
        }
    }
}

/// What a body over the daemon's limit of `limit` bytes is told.
pub(crate) fn too_large(limit: usize) -> String {
    format!(
        "the request body is larger than this daemon's limit of {limit} bytes: send less (the operator sets [daemon].max_body_bytes)"
    )
}

/// Whether the headers declare a body over `limit` bytes (refused before reading any).
pub(crate) fn declared_over(headers: &HeaderMap, limit: usize) -> bool {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > limit as u64)
}

/// Reads a whole body of at most `limit` bytes within `timeout`. On failure, returns the
/// first [`ID_PREFIX_BYTES`] that arrived, to find the request id in.
pub(crate) async fn read_body(
    mut body: Body,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes, ReadBodyError> {
    let mut buf: Vec<u8> = Vec::new();
    let mut failed = None;
    let read = async {
        loop {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        if buf.len() + data.len() > limit {
                            let room = ID_PREFIX_BYTES.saturating_sub(buf.len());
                            buf.extend_from_slice(&data[..data.len().min(room)]);
                            return false;
                        }
                        buf.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => {
                    failed = Some(e.to_string());
                    return true;
                }
                None => return true,
            }
        }
    };
    let within = tokio::time::timeout(timeout, read).await;
    let prefix = |mut buf: Vec<u8>| {
        buf.truncate(ID_PREFIX_BYTES);
        buf
    };
    match within {
        Err(_) => Err(ReadBodyError::TimedOut {
            prefix: prefix(buf),
        }),
        Ok(false) => Err(ReadBodyError::TooLarge {
            prefix: prefix(buf),
        }),
        Ok(true) => match failed {
            Some(message) => Err(ReadBodyError::Failed {
                prefix: prefix(buf),
                message,
            }),
            None => Ok(Bytes::from(buf)),
        },
    }
}

/// Marks an answer given before its body was read whole: the connection is closed after it,
/// so the rest of the body is never read.
pub(crate) fn closing(mut resp: Response) -> Response {
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// The end of a `POST /v1/runs`: counts, logs one line, answers.
pub(crate) struct Answer<'a> {
    pub(crate) st: &'a Shared,
    pub(crate) started: Instant,
    pub(crate) caller: Option<&'a str>,
}

impl Answer<'_> {
    fn refused(&self, failure: Failure, request_id: Option<String>, message: String) -> Response {
        let reason = failure.not_dispatched();
        if let Some(r) = reason {
            self.st.metrics.refused(r);
        }
        tracing::info!(
            request_id = request_id.as_deref().unwrap_or(""),
            caller = self.caller.unwrap_or(""),
            outcome = "refused",
            reason = reason.map_or("", Reason::as_str),
            code = failure.code(),
            status = failure.status().as_u16(),
            duration_ms = self.started.elapsed().as_millis() as u64,
            "run refused"
        );
        failure.respond(request_id, message)
    }

    /// Accounts for what the engine answered and turns it into HTTP.
    pub(crate) fn ran(&self, result: Result<RunResponse, RunError>, request_id: &str) -> Response {
        let caller = self.caller.unwrap_or("");
        let duration_ms = self.started.elapsed().as_millis() as u64;
        match result {
            Ok(resp) => {
                let outcome = outcome_label(&resp.result);
                self.st
                    .metrics
                    .run_completed(&resp.provider, outcome, resp.duration_ms);
                tracing::info!(
                    request_id = %resp.request_id,
                    caller,
                    provider = %resp.provider,
                    isolation = %resp.isolation,
                    outcome,
                    exit_code = ?resp.result.exit_code,
                    status = 200,
                    run_ms = resp.duration_ms,
                    duration_ms,
                    "run answered"
                );
                (StatusCode::OK, axum::Json(resp)).into_response()
            }
            Err(err @ (RunError::Refused { .. } | RunError::SessionRefused { .. })) => {
                let body = err.to_response();
                self.refused(failure_of(&err), body.request_id, body.error.message)
            }
            Err(err @ RunError::Failed { .. }) => {
                if let RunError::Failed { provider, .. } = &err {
                    self.st.metrics.run_failed(provider);
                }
                tracing::error!(
                    request_id,
                    caller,
                    outcome = "sandbox_failed",
                    error = %err,
                    status = 500,
                    duration_ms,
                    "run failed after it may have started"
                );
                let body = err.to_response();
                Failure::SandboxFailed.respond(body.request_id, body.error.message)
            }
            Err(err @ RunError::Cancelled { .. }) => {
                if let RunError::Cancelled { provider, .. } = &err {
                    self.st.metrics.run_cancelled(provider);
                }
                tracing::info!(
                    request_id,
                    caller,
                    outcome = OUTCOME_CANCELLED,
                    status = Failure::Cancelled.status().as_u16(),
                    duration_ms,
                    "run cancelled: its client went away"
                );
                let body = err.to_response();
                Failure::Cancelled.respond(body.request_id, body.error.message)
            }
        }
    }
}

async fn runs(State(st): State<AppState>, req: Request) -> Response {
    let mut answer = Answer {
        st: &st,
        started: Instant::now(),
        caller: None,
    };
    let (parts, body) = req.into_parts();

    // The token comes from the headers, before any of the body is read: a client without
    // one gets only a small prefix read (for its request id), never `max_body_bytes`.
    let caller = match authenticate(&st, &parts.headers) {
        Ok(c) => c,
        Err(failure) => {
            let prefix = read_prefix(body, ID_PREFIX_BYTES, ID_PREFIX_TIMEOUT).await;
            let (failure, message) = failure.failure();
            return closing(answer.refused(failure, scanned_request_id(&prefix), message));
        }
    };
    answer.caller = Some(&caller);

    if declared_over(&parts.headers, st.max_body_bytes) {
        let prefix = read_prefix(body, ID_PREFIX_BYTES, ID_PREFIX_TIMEOUT).await;
        let id = scanned_request_id(&prefix);
        return closing(answer.refused(Failure::BodyTooLarge, id, too_large(st.max_body_bytes)));
    }
    let bytes = match read_body(body, st.max_body_bytes, BODY_READ_TIMEOUT).await {
        Ok(bytes) => bytes,
        Err(e) => {
            let (failure, message, prefix) = e.failure(st.max_body_bytes);
            return closing(answer.refused(failure, scanned_request_id(&prefix), message));
        }
    };

    let request = match parse_request(&bytes) {
        Ok(r) => r,
        Err(rejection) => {
            // A body that arrived whole but does not parse (truncated, not UTF-8, a byte
            // order mark, nested too deep) still has its id echoed when it can be read.
            let id = rejection
                .request_id
                .clone()
                .or_else(|| scanned_request_id(&bytes));
            return answer.refused(Failure::Refused(rejection.reason), id, rejection.message);
        }
    };
    let started = answer.started;
    if crate::sessions::wants_stream(&parts.headers) {
        return crate::sessions::stream_run(Arc::clone(&st), caller, request, started);
    }
    // The run, its counting and its log line happen on the blocking thread, so they are
    // accounted for even when the client goes away before the answer.
    let request_id = request.request_id.clone();
    let shared = Arc::clone(&st);
    let who = caller.clone();
    let joined = tokio::task::spawn_blocking(move || {
        let answer = Answer {
            st: &shared,
            started,
            caller: Some(&who),
        };
        answer.ran(shared.engine.run(&who, &request), &request.request_id)
    })
    .await;
    match joined {
        Ok(resp) => resp,
        Err(join) => {
            // The engine panicked: the code may have started, so no not-dispatched mark.
            tracing::error!(
                request_id = %request_id,
                caller = %caller,
                outcome = "internal",
                error = %join,
                status = 500,
                duration_ms = started.elapsed().as_millis() as u64,
                "the engine failed while handling a run"
            );
            Failure::Internal.respond(
                Some(request_id),
                "the daemon failed while handling this run; it may have started: do not retry blindly, and report this to the operator".into(),
            )
        }
    }
}

async fn providers(State(st): State<AppState>, headers: HeaderMap) -> Response {
    if let Err(failure) = authenticate(&st, &headers) {
        let (failure, message) = failure.failure();
        return failure.respond(None, message);
    }
    axum::Json(st.engine.providers_response()).into_response()
}

async fn healthz() -> Response {
    axum::Json(serde_json::json!({"status": "ok"})).into_response()
}

/// The header of `/readyz` answers naming the daemon's instance (the middle of every session
/// id it gives), by which a router finds the node that holds a session.
pub const INSTANCE_HEADER: &str = "plimsoll-instance";

/// The header of `/readyz` answers naming, comma-separated, the instances of earlier daemons
/// whose sessions this one restored after a restart (docs/sessions.md): their ids are served
/// here too. Absent when there are none.
pub const ADOPTED_HEADER: &str = "plimsoll-adopted-instances";

async fn readyz(State(st): State<AppState>) -> Response {
    let mut headers = HeaderMap::new();
    let named = [
        (INSTANCE_HEADER, st.engine.instance().to_owned()),
        (ADOPTED_HEADER, st.engine.adopted_instances().join(",")),
    ];
    for (name, value) in named {
        if let Ok(v) = HeaderValue::from_str(&value)
            && !value.is_empty()
        {
            headers.insert(name, v);
        }
    }
    if st.engine.ready() {
        (headers, axum::Json(serde_json::json!({"ready": true}))).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            headers,
            axum::Json(serde_json::json!({
                "ready": false,
                "message": "no provider has passed its probe yet (or every one was withdrawn): see the daemon's log and GET /v1/providers"
            })),
        )
            .into_response()
    }
}

async fn metrics(State(st): State<AppState>) -> Response {
    let text = st.metrics.render(&st.engine, st.deliveries.in_flight());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::from(OPENAPI_JSON),
    )
        .into_response()
}

async fn not_found(method: Method, uri: axum::http::Uri) -> Response {
    Failure::NotFound.respond(
        None,
        format!(
            "no route {method} {}: see GET /v1/openapi.json for the routes this daemon serves",
            uri.path()
        ),
    )
}

pub(crate) async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> Response {
    Failure::MethodNotAllowed.respond(
        None,
        format!(
            "{} does not accept {method}: see GET /v1/openapi.json",
            uri.path()
        ),
    )
}

/// A connection's stream that gives hyper's own answers an `ErrorResponse` body.
///
/// hyper answers a request head it cannot parse by itself, before any handler runs, with an
/// empty body: `400` (a malformed request line or header), `431` (a head over its size or
/// header-count limit), `414` (a request target too long). Such an answer is always the
/// connection's last, and its head is always exactly `HTTP/1.1 <status> <reason>` then
/// `connection: close` and `content-length: 0` (the handlers' answers always start with
/// `content-type`). This stream recognises that head where a write begins and writes the same
/// status with the [`Failure`]'s `ErrorResponse` instead. The request id is `null`: nothing of
/// the request could be read.
#[derive(Debug)]
pub struct AutoErrorBodies<S> {
    inner: S,
    /// The replacement answer not yet written.
    pending: Vec<u8>,
}

impl<S> AutoErrorBodies<S> {
    /// Wraps a connection's stream.
    pub fn new(inner: S) -> Self {
        AutoErrorBodies {
            inner,
            pending: Vec::new(),
        }
    }
}

/// The answer to send instead of `head`, when `head` is one of hyper's own.
fn replacement_for(head: &[u8]) -> Option<Vec<u8>> {
    let (failure, message) = if head.starts_with(b"HTTP/1.1 400 ") {
        (
            Failure::HeadMalformed,
            "the request line or a header could not be parsed as HTTP/1.1: send a well-formed request",
        )
    } else if head.starts_with(b"HTTP/1.1 431 ") {
        (
            Failure::HeadTooLarge,
            "the request head is too large (too many or too long headers): send fewer, shorter headers",
        )
    } else if head.starts_with(b"HTTP/1.1 414 ") {
        (
            Failure::UriTooLong,
            "the request target is too long: see GET /v1/openapi.json for the routes this daemon serves",
        )
    } else {
        return None;
    };
    let line_end = head.windows(2).position(|w| w == b"\r\n")?;
    let rest = &head[line_end..];
    if !rest.starts_with(b"\r\nconnection: close\r\ncontent-length: 0\r\n") {
        return None;
    }
    let status = failure.status();
    let body = serde_json::to_vec(&failure.body(None, message.to_owned()))
        .expect("an ErrorResponse serialises");
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    Some(out)
}

impl<S: tokio::io::AsyncWrite + Unpin> AutoErrorBodies<S> {
    /// Writes what is pending; ready once nothing is.
    fn poll_pending(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        while !self.pending.is_empty() {
            match std::pin::Pin::new(&mut self.inner).poll_write(cx, &self.pending) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => {
                    self.pending.drain(..n);
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for AutoErrorBodies<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for AutoErrorBodies<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        use std::task::Poll;
        let this = &mut *self;
        match this.poll_pending(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        }
        if let Some(answer) = replacement_for(buf) {
            // hyper's head is taken whole; the replacement goes out in its place.
            this.pending = answer;
            return match this.poll_pending(cx) {
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                _ => Poll::Ready(Ok(buf.len())),
            };
        }
        std::pin::Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        match self.poll_pending(cx) {
            Poll::Ready(Ok(())) => std::pin::Pin::new(&mut self.inner).poll_flush(cx),
            other => other,
        }
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        match self.poll_pending(cx) {
            Poll::Ready(Ok(())) => std::pin::Pin::new(&mut self.inner).poll_shutdown(cx),
            other => other,
        }
    }
    // Not vectored: hyper then hands each head over as one buffer, where it can be recognised.
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_a_client_error_or_unavailable_status() {
        for r in Reason::ALL {
            let s = status_for(r);
            assert!(
                s.is_client_error() || s == StatusCode::SERVICE_UNAVAILABLE,
                "{r}"
            );
        }
        assert_eq!(status_for(Reason::Capacity), StatusCode::TOO_MANY_REQUESTS);
    }

    #[test]
    fn only_hyper_own_answers_are_replaced_and_with_an_error_response() {
        let hyper = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\ndate: Wed, 02 Dec 2026 06:28:42 GMT\r\n\r\n";
        let out = String::from_utf8(replacement_for(hyper).unwrap()).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 "), "{head}");
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        let e: ErrorResponse = serde_json::from_str(body).unwrap();
        assert_eq!(e.request_id, None);
        assert_eq!(e.error.not_dispatched, Some(Reason::Request));
        // A handler's answer (content-type first, a body) is left alone.
        let ours = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 10\r\n\r\n";
        assert!(replacement_for(ours).is_none());
        assert!(
            replacement_for(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")
                .is_none()
        );
    }

    #[test]
    fn every_failure_is_marked_unless_the_code_may_have_run() {
        for f in [
            Failure::Unauthenticated,
            Failure::CallersUnavailable,
            Failure::BodyTooLarge,
            Failure::BodyTimedOut,
            Failure::BodyUnreadable,
            Failure::NotFound,
            Failure::MethodNotAllowed,
            Failure::NotAcceptable,
            Failure::UnsupportedMediaType,
            Failure::HeadMalformed,
            Failure::HeadTooLarge,
            Failure::UriTooLong,
        ] {
            assert!(f.not_dispatched().is_some(), "{f:?}");
            assert!(
                f.status().is_client_error() || f.status().is_server_error(),
                "{f:?}"
            );
        }
        for f in [Failure::SandboxFailed, Failure::Internal] {
            assert_eq!(f.not_dispatched(), None, "{f:?}");
            assert_eq!(f.status(), StatusCode::INTERNAL_SERVER_ERROR);
        }
        // A cancelled run may have run: no mark, and its own code and status.
        assert_eq!(Failure::Cancelled.not_dispatched(), None);
        assert_eq!(
            (
                Failure::Cancelled.code(),
                Failure::Cancelled.status().as_u16()
            ),
            ("cancelled", 499)
        );
        for r in Reason::ALL {
            assert_eq!(Failure::Refused(r).status(), status_for(r));
            assert_eq!(Failure::Refused(r).not_dispatched(), Some(r));
        }
    }

    #[test]
    fn request_ids_are_read_only_when_valid() {
        assert_eq!(
            scanned_request_id(br#"{"request_id":"r-1","x":1}"#).as_deref(),
            Some("r-1")
        );
        assert_eq!(scanned_request_id(br#"{"request_id":"a b"}"#), None);
        assert_eq!(scanned_request_id(b"{nope"), None);
    }

    #[test]
    fn request_ids_are_found_in_a_cut_off_prefix() {
        let cut =
            br#"{"protocol":1, "request_id" : "r-2", "run":{"kind":"snippet","code":"print('xx"#;
        assert_eq!(scanned_request_id(cut).as_deref(), Some("r-2"));
        // An id cut off before its closing quote, or with an escape, is not guessed at.
        assert_eq!(scanned_request_id(br#"{"request_id":"r-3"#), None);
        assert_eq!(
            scanned_request_id(br#"{"request_id":"r\u002d4","run":"#),
            None
        );
        // A key quoted inside a string is escaped, so it is not the request's id.
        let inner = br#"{"run":{"code":"x = {\"request_id\":\"evil\"}"#;
        assert_eq!(scanned_request_id(inner), None);
        assert_eq!(
            scanned_request_id(br#"{"request_id":"bad id","run":"#),
            None
        );
    }

    /// A body that sends one chunk and then nothing, never ending.
    struct Stalled(Option<Bytes>);

    impl http_body::Body for Stalled {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
            match self.0.take() {
                Some(b) => std::task::Poll::Ready(Some(Ok(http_body::Frame::data(b)))),
                None => std::task::Poll::Pending,
            }
        }
    }

    #[tokio::test]
    async fn a_body_that_stalls_is_given_up_on_with_its_prefix() {
        let first = Bytes::from_static(br#"{"request_id":"slow-1","run":"#);
        let body = Body::new(Stalled(Some(first.clone())));
        let e = read_body(body, 1 << 20, Duration::from_millis(50))
            .await
            .unwrap_err();
        let ReadBodyError::TimedOut { prefix } = e else {
            panic!("{e:?}")
        };
        assert_eq!(scanned_request_id(&prefix).as_deref(), Some("slow-1"));

        let body = Body::new(Stalled(Some(first.clone())));
        let prefix = read_prefix(body, 4096, Duration::from_millis(50)).await;
        assert_eq!(prefix, first.to_vec());
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_cut_off_with_its_prefix() {
        let body = Body::from(format!(
            r#"{{"request_id":"big-1","run":"{}"}}"#,
            "x".repeat(10_000)
        ));
        let e = read_body(body, 5000, Duration::from_secs(60))
            .await
            .unwrap_err();
        let ReadBodyError::TooLarge { prefix } = e else {
            panic!("{e:?}")
        };
        assert!(prefix.len() <= ID_PREFIX_BYTES);
        assert_eq!(scanned_request_id(&prefix).as_deref(), Some("big-1"));
        let body = Body::from(r#"{"request_id":"ok-1"}"#);
        let bytes = read_body(body, 5000, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(&bytes[..], br#"{"request_id":"ok-1"}"#);
    }
}
