//! `/mcp`: the MCP tools (crates/mcp) over streamable HTTP, for the same bearer-token callers
//! as `/v1`. Served statelessly (one POST, one answer; no MCP transport session), so every
//! call is authenticated on its own and runs as the caller its token names, through the same
//! engine path as `POST /v1/runs` (admission, per-caller limits, digests, records), counted
//! and logged the same way.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt as _;
use plimsoll_client::{RunOptions, new_request_id};
use plimsoll_engine::RunError;
use plimsoll_mcp::{Backend, BackendError, Caller, PlimsollMcp};
use plimsoll_wire::{
    ErrorBody, ErrorResponse, PROTOCOL, ProvidersResponse, Reason, RunResponse,
    not_dispatched_reason,
};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use crate::callers::Token;
use crate::metrics::outcome_label;
use crate::server::{AppState, Shared};

/// The path the MCP endpoint is served at.
pub const MCP_PATH: &str = "/mcp";
/// How long an authenticated caller's whole body may take to arrive (as for `/v1/runs`).
pub const MCP_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

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
    let service = StreamableHttpService::new(
        move || Ok(PlimsollMcp::new(Arc::clone(&backend))),
        Arc::new(NeverSessionManager::default()),
        config,
    );
    let mcp = Router::new()
        .route_service(MCP_PATH, service)
        .layer(middleware::from_fn_with_state(Arc::clone(state), guard));
    router.merge(mcp)
}

fn refusal(code: &str, reason: Reason, message: String) -> ErrorResponse {
    ErrorResponse {
        protocol: PROTOCOL,
        request_id: None,
        error: ErrorBody {
            code: code.to_owned(),
            message,
            not_dispatched: Some(reason),
        },
    }
}

fn answer(status: StatusCode, body: &ErrorResponse) -> Response {
    let mut resp = (status, axum::Json(body)).into_response();
    if status == StatusCode::UNAUTHORIZED {
        resp.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    // Answered before the body was read whole: close, so the rest is never read.
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// The caller a request's bearer token names, or the status and body refusing it.
fn authenticate(st: &Shared, req: &Request) -> Result<String, (StatusCode, ErrorResponse)> {
    let unauthenticated = |message: &str| {
        (
            StatusCode::UNAUTHORIZED,
            refusal("unauthenticated", Reason::Permission, message.to_owned()),
        )
    };
    let Some(value) = req.headers().get(header::AUTHORIZATION) else {
        return Err(unauthenticated(
            "no bearer token: send `Authorization: Bearer <token>` (an operator creates one with `plimsoll callers add NAME`)",
        ));
    };
    let invalid = "the bearer token is not valid on this daemon: check PLIMSOLL_TOKEN, or ask the operator for a token (`plimsoll callers add NAME`)";
    let token = value
        .to_str()
        .ok()
        .and_then(|t| t.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, rest)| Token::new(rest.trim()))
        .ok_or_else(|| unauthenticated(invalid))?;
    let callers = st.callers.current().map_err(|e| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            refusal("callers_unavailable", Reason::Environment, e.to_string()),
        )
    })?;
    callers
        .authenticate(&token)
        .map(str::to_owned)
        .ok_or_else(|| unauthenticated(invalid))
}

/// Before the MCP service: the bearer token (checked from the headers, before any of the
/// body is read), then the whole body within the daemon's size limit and read timeout, then
/// the caller attached for the tools.
async fn guard(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let caller = match authenticate(&st, &req) {
        Ok(c) => c,
        Err((status, body)) => {
            tracing::info!(
                route = MCP_PATH,
                outcome = "refused",
                code = %body.error.code,
                status = status.as_u16(),
                "mcp request refused"
            );
            return answer(status, &body);
        }
    };
    let (mut parts, body) = req.into_parts();
    let too_large = || {
        answer(
            StatusCode::PAYLOAD_TOO_LARGE,
            &refusal(
                "request",
                Reason::Request,
                format!(
                    "the request body is larger than this daemon's limit of {} bytes: send less (the operator sets [daemon].max_body_bytes)",
                    st.max_body_bytes
                ),
            ),
        )
    };
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > st.max_body_bytes as u64) {
        return too_large();
    }
    let limited = http_body_util::Limited::new(body, st.max_body_bytes);
    let bytes = match tokio::time::timeout(MCP_BODY_READ_TIMEOUT, limited.collect()).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => return too_large(),
        Ok(Err(e)) => {
            return answer(
                StatusCode::BAD_REQUEST,
                &refusal(
                    "request",
                    Reason::Request,
                    format!("the request body could not be read ({e}): send it again"),
                ),
            );
        }
        Err(_) => {
            return answer(
                StatusCode::REQUEST_TIMEOUT,
                &refusal(
                    "request",
                    Reason::Request,
                    format!(
                        "the request body did not arrive within {} s: send it whole and promptly",
                        MCP_BODY_READ_TIMEOUT.as_secs()
                    ),
                ),
            );
        }
    };
    parts.extensions.insert(Caller(caller));
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// The daemon's engine as the tools' backend: each run counted in the metrics and logged
/// with one line, as `/v1/runs` does.
#[derive(Debug)]
struct DaemonBackend {
    shared: AppState,
}

impl Backend for DaemonBackend {
    fn run(&self, caller: Option<&str>, options: RunOptions) -> Result<RunResponse, BackendError> {
        let started = Instant::now();
        // The guard always attaches a caller; without one nothing runs.
        let Some(caller) = caller else {
            return Err(BackendError::NotDispatched {
                reason: Reason::Permission,
                message: "no authenticated caller".into(),
            });
        };
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
            Err(err @ RunError::Refused { reason, .. }) => {
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
        }
        result.map_err(|e| match not_dispatched_reason(&e) {
            Some(reason) => BackendError::NotDispatched {
                reason,
                message: match e {
                    RunError::Refused { message, .. } => message,
                    other => other.to_string(),
                },
            },
            None => BackendError::MayHaveRun {
                message: e.to_string(),
            },
        })
    }

    fn providers(&self, _caller: Option<&str>) -> Result<ProvidersResponse, BackendError> {
        Ok(ProvidersResponse {
            protocol: PROTOCOL,
            default_floor: self.shared.engine.config().default_floor,
            providers: self.shared.engine.providers(),
        })
    }
}
