//! `/mcp`: the MCP tools (crates/mcp) over streamable HTTP, for the same bearer-token callers
//! as `/v1`. Served statelessly (one POST, one answer; no MCP transport session), so every
//! call is authenticated on its own and runs as the caller its token names, through the same
//! engine path as `POST /v1/runs` (admission, per-caller limits, digests, records), counted
//! and logged the same way. Sessions are the caller's own on the engine, as on
//! `/v1/sessions`: one opened here is seen there and the other way round, and another
//! caller's session id is not found; a session is named by the tools' `session_id`
//! argument, never by the transport.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use http_body_util::BodyExt as _;
use plimsoll_client::{RunOptions, SessionOptions, new_request_id};
use plimsoll_engine::RunError;
use plimsoll_mcp::{Backend, BackendError, Caller, PlimsollMcp, SessionCall, on_engine};
use plimsoll_wire::{
    ProvidersResponse, Reason, RunResponse, SessionInfo, SessionList, SnapshotInfo, SnapshotList,
};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use crate::metrics::outcome_label;
use crate::server::{
    AppState, BODY_READ_TIMEOUT, Failure, authenticate, closing, declared_over, method_not_allowed,
    read_body, too_large,
};

/// The path the MCP endpoint is served at.
pub const MCP_PATH: &str = "/mcp";

/// Mounts `/mcp` on the daemon's router.
pub fn mount(router: Router<AppState>, state: &AppState) -> Router<AppState> {
    let backend: Arc<dyn Backend> = Arc::new(DaemonBackend {
        shared: Arc::clone(state),
    });
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        // Host checks guard unauthenticated servers on loopback against DNS rebinding; here
        // every request must carry a caller's bearer token, which a rebinding page does not
        // have, and the daemon may listen on any name an operator gives it.
        .disable_allowed_hosts()
        .with_max_request_body_bytes(state.max_body_bytes);
    // One server for every request: stateless, so each POST is served by a clone of it
    // (the tool router is built once, not per request).
    let server = PlimsollMcp::new(backend);
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(NeverSessionManager::default()),
        config,
    );
    let mcp = Router::new()
        .route_service(MCP_PATH, service)
        .layer(middleware::from_fn_with_state(Arc::clone(state), guard));
    router.merge(mcp)
}

/// Before the MCP service: POST only, the bearer token (checked from the headers, before any
/// of the body is read), then the whole body within the daemon's size limit and read timeout,
/// then the caller attached for the tools. Every refusal here, and the transport's own
/// refusals of a wrong `Accept` or `Content-Type`, is an `ErrorResponse` marked not
/// dispatched, as on `/v1/runs`.
async fn guard(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let refuse = |failure: Failure, message: String| {
        tracing::info!(
            route = MCP_PATH,
            outcome = "refused",
            code = failure.code(),
            status = failure.status().as_u16(),
            "mcp request refused"
        );
        closing(failure.respond(None, message))
    };
    if req.method() != Method::POST {
        // RFC 9110: a 405 names the methods the target takes.
        let mut resp = method_not_allowed(req.method().clone(), req.uri().clone()).await;
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return closing(resp);
    }
    let caller = match authenticate(&st, req.headers()) {
        Ok(c) => c,
        Err(a) => {
            let (failure, message) = a.failure();
            return refuse(failure, message);
        }
    };
    let (mut parts, body) = req.into_parts();
    if declared_over(&parts.headers, st.max_body_bytes) {
        return refuse(Failure::BodyTooLarge, too_large(st.max_body_bytes));
    }
    let bytes = match read_body(body, st.max_body_bytes, BODY_READ_TIMEOUT).await {
        Ok(bytes) => bytes,
        Err(e) => {
            let (failure, message, _) = e.failure(st.max_body_bytes);
            return refuse(failure, message);
        }
    };
    parts.extensions.insert(Caller(caller));
    let resp = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    let failure = match resp.status() {
        StatusCode::NOT_ACCEPTABLE => Failure::NotAcceptable,
        StatusCode::UNSUPPORTED_MEDIA_TYPE => Failure::UnsupportedMediaType,
        _ => return resp,
    };
    let text = match http_body_util::Limited::new(resp.into_body(), 4096)
        .collect()
        .await
    {
        Ok(c) => String::from_utf8_lossy(&c.to_bytes()).into_owned(),
        Err(_) => String::new(),
    };
    let message = match failure {
        Failure::NotAcceptable => {
            format!("{text}: send `Accept: application/json, text/event-stream` (see docs/mcp.md)")
        }
        _ => format!("{text}: send `Content-Type: application/json` (see docs/mcp.md)"),
    };
    refuse(failure, message)
}

/// The daemon's engine as the tools' backend: each run counted in the metrics and logged
/// with one line, as `/v1/runs` does.
#[derive(Debug)]
struct DaemonBackend {
    shared: AppState,
}

/// The guard always attaches a caller; without one nothing runs.
fn authenticated(caller: Option<&str>) -> Result<&str, BackendError> {
    caller.ok_or_else(|| BackendError::refused(Reason::Permission, "no authenticated caller"))
}

impl DaemonBackend {
    /// Counts and logs a session operation's outcome as `/v1/sessions` does (a refusal in
    /// the refusals by reason), then sorts it by its mark.
    fn session_outcome<T>(
        &self,
        caller: &str,
        op: &'static str,
        session_id: Option<&str>,
        started: Instant,
        result: Result<T, RunError>,
        answered: impl FnOnce(&T) -> (String, u64),
    ) -> Result<T, BackendError> {
        let duration_ms = started.elapsed().as_millis() as u64;
        match &result {
            Ok(value) => {
                let (id, sequence) = answered(value);
                tracing::info!(
                    caller,
                    via = "mcp",
                    op,
                    session_id = %id,
                    sequence,
                    duration_ms,
                    "session call answered"
                );
            }
            Err(err) => {
                if let Some(reason) = plimsoll_wire::not_dispatched_reason(err) {
                    self.shared.metrics.refused(reason);
                }
                let code = err.to_response().error.code;
                tracing::info!(
                    request_id = err.request_id().unwrap_or(""),
                    caller,
                    via = "mcp",
                    op,
                    session_id = session_id.unwrap_or(""),
                    code,
                    duration_ms,
                    error = %err,
                    "session call not answered"
                );
            }
        }
        result.map_err(|e| BackendError::from_engine(&e))
    }
}

impl Backend for DaemonBackend {
    fn run(&self, caller: Option<&str>, options: RunOptions) -> Result<RunResponse, BackendError> {
        let started = Instant::now();
        let caller = authenticated(caller)?;
        let request = options.into_request(new_request_id());
        let st = &self.shared;
        let result = st.engine.run(caller, &request);
        let duration_ms = started.elapsed().as_millis() as u64;
        match &result {
            Ok(resp) => {
                let outcome = outcome_label(&resp.result);
                st.metrics
                    .run_completed(&resp.provider, outcome, resp.duration_ms);
                tracing::info!(
                    request_id = %resp.request_id,
                    caller,
                    via = "mcp",
                    provider = %resp.provider,
                    isolation = %resp.isolation,
                    outcome,
                    exit_code = ?resp.result.exit_code,
                    run_ms = resp.duration_ms,
                    duration_ms,
                    "run answered"
                );
            }
            Err(
                err @ (RunError::Refused { reason, .. } | RunError::SessionRefused { reason, .. }),
            ) => {
                st.metrics.refused(*reason);
                tracing::info!(
                    request_id = %request.request_id,
                    caller,
                    via = "mcp",
                    outcome = "refused",
                    reason = reason.as_str(),
                    duration_ms,
                    error = %err,
                    "run refused"
                );
            }
            Err(err @ RunError::Failed { provider, .. }) => {
                st.metrics.run_failed(provider);
                tracing::error!(
                    request_id = %request.request_id,
                    caller,
                    via = "mcp",
                    outcome = "sandbox_failed",
                    error = %err,
                    duration_ms,
                    "run failed after it may have started"
                );
            }
            // A tool call hooks no cancellation today; counted as `/v1/runs` counts one.
            Err(err @ RunError::Cancelled { provider, .. }) => {
                st.metrics.run_cancelled(provider);
                tracing::info!(
                    request_id = %request.request_id,
                    caller,
                    via = "mcp",
                    outcome = crate::metrics::OUTCOME_CANCELLED,
                    error = %err,
                    duration_ms,
                    "run cancelled: its client went away"
                );
            }
        }
        result.map_err(|e| BackendError::from_engine(&e))
    }

    fn providers(&self, _caller: Option<&str>) -> Result<ProvidersResponse, BackendError> {
        Ok(self.shared.engine.providers_response())
    }

    fn open_session(
        &self,
        caller: Option<&str>,
        options: SessionOptions,
    ) -> Result<SessionInfo, BackendError> {
        let started = Instant::now();
        let caller = authenticated(caller)?;
        let opened = on_engine::open(&self.shared.engine, caller, options);
        self.session_outcome(caller, "open", None, started, opened, |info| {
            (info.session_id.clone(), 0)
        })
    }

    fn session_call(
        &self,
        caller: Option<&str>,
        session_id: &str,
        call: &SessionCall,
    ) -> Result<RunResponse, BackendError> {
        let started = Instant::now();
        let caller = authenticated(caller)?;
        let op = match call {
            SessionCall::Cell { .. } => "cell",
            SessionCall::Steps { .. } => "steps",
            SessionCall::Put { .. } => "put",
            SessionCall::Get { .. } => "get",
        };
        let answered = on_engine::call(&self.shared.engine, caller, session_id, call);
        self.session_outcome(caller, op, Some(session_id), started, answered, |resp| {
            let sequence = resp.record.session.as_ref().map_or(0, |l| l.sequence);
            (session_id.to_owned(), sequence)
        })
    }

    fn close_session(
        &self,
        caller: Option<&str>,
        session_id: &str,
    ) -> Result<SessionInfo, BackendError> {
        let started = Instant::now();
        let caller = authenticated(caller)?;
        let closed = on_engine::close(&self.shared.engine, caller, session_id);
        self.session_outcome(caller, "close", Some(session_id), started, closed, |info| {
            (info.session_id.clone(), info.calls)
        })
    }

    fn sessions(&self, caller: Option<&str>) -> Result<SessionList, BackendError> {
        Ok(self.shared.engine.list_sessions(authenticated(caller)?))
    }

    fn snapshot_session(
        &self,
        caller: Option<&str>,
        session_id: &str,
    ) -> Result<SnapshotInfo, BackendError> {
        let started = Instant::now();
        let caller = authenticated(caller)?;
        let taken = on_engine::snapshot(&self.shared.engine, caller, session_id);
        self.session_outcome(caller, "snapshot", Some(session_id), started, taken, |s| {
            (s.session_id.clone(), s.calls)
        })
    }

    fn fork_session(
        &self,
        caller: Option<&str>,
        session_id: &str,
        count: u32,
    ) -> Result<(SnapshotInfo, Vec<SessionInfo>), BackendError> {
        let started = Instant::now();
        let caller = authenticated(caller)?;
        let forked = on_engine::fork(&self.shared.engine, caller, session_id, count);
        self.session_outcome(
            caller,
            "fork",
            Some(session_id),
            started,
            forked,
            |(s, _)| (s.session_id.clone(), s.calls),
        )
    }

    fn open_snapshot(
        &self,
        caller: Option<&str>,
        snapshot_id: &str,
    ) -> Result<SessionInfo, BackendError> {
        let started = Instant::now();
        let caller = authenticated(caller)?;
        let opened = on_engine::open_snapshot(&self.shared.engine, caller, snapshot_id);
        self.session_outcome(caller, "open_snapshot", None, started, opened, |info| {
            (info.session_id.clone(), info.calls)
        })
    }

    fn snapshots(&self, caller: Option<&str>) -> Result<SnapshotList, BackendError> {
        Ok(self.shared.engine.list_snapshots(authenticated(caller)?))
    }

    fn delete_snapshot(
        &self,
        caller: Option<&str>,
        snapshot_id: &str,
    ) -> Result<SnapshotInfo, BackendError> {
        let started = Instant::now();
        let caller = authenticated(caller)?;
        let deleted = on_engine::delete_snapshot(&self.shared.engine, caller, snapshot_id);
        self.session_outcome(caller, "delete_snapshot", None, started, deleted, |s| {
            (s.session_id.clone(), s.calls)
        })
    }
}
