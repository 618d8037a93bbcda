//! The router's HTTP API: the daemon's own, served by passing each request to a node.
//!
//! - `POST /v1/runs` and `POST /v1/sessions` go to a node that meets the request (see
//!   [`crate::place`]); a node that refuses with nothing run (capacity, environment, isolation,
//!   unsupported) is followed by the next, and when no node may take it the router refuses it
//!   itself, not dispatched, with the request id echoed.
//! - Every call of a session goes to the node named by the session id's instance part, and
//!   every call of a snapshot (`/v1/snapshots/{id}/...`) to the node named by the snapshot
//!   id's, which is the daemon that took it.
//! - `GET /v1/sessions` and `GET /v1/snapshots` ask every ready node and join their lists.
//! - `GET /v1/providers` and `GET /v1/openapi.json` are one ready node's answers.
//! - `GET /v1/nodes` is the router's view of its nodes; `/healthz`, `/readyz` and `/metrics`
//!   are the router's own.
//!
//! A node's answer is passed on untouched (status, headers, body, streamed as it comes), with
//! a `Plimsoll-Node` header naming the node, so clients check its digests exactly as they
//! would the node's. A connection to a node lost after the request was sent is never
//! "not dispatched": it is `node_lost`, with `not_dispatched: null`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use http_body_util::BodyExt as _;
use plimsoll_callers::store::CallerStore;
use plimsoll_secret::Secret;
use plimsoll_wire::{EndReason, ErrorBody, ErrorResponse, PROTOCOL, Reason};

use crate::forward::{ExchangeError, exchange};
use crate::nodes::{Cluster, SessionNode};
use crate::place::{Want, candidates};

/// The header naming the node that answered (`ip:port`).
pub const NODE_HEADER: &str = "plimsoll-node";
/// The header of a joined session list naming the nodes that did not answer.
pub const UNANSWERED_HEADER: &str = "plimsoll-nodes-unanswered";
/// The default limit of a request body (the daemon's own default).
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 << 20;
/// How long a request body may take to arrive.
const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// How much of a refused request's body is read to find its request id (as a node does).
const ID_PREFIX_BYTES: usize = 4096;
/// How long reading that prefix may take.
const ID_PREFIX_TIMEOUT: Duration = Duration::from_secs(2);
/// The most of a node's refusal read to decide whether the next node is tried.
const REFUSAL_LIMIT: usize = 1 << 20;

/// What the router serves from.
#[derive(Debug)]
pub struct Shared {
    /// The nodes.
    pub cluster: Arc<Cluster>,
    /// The callers, the same file the nodes read.
    pub callers: CallerStore,
    /// The most a request body may hold.
    pub max_body_bytes: usize,
    /// Counters for `/metrics`.
    pub counts: Counts,
}

/// The router's counters.
#[derive(Debug, Default)]
pub struct Counts {
    forwarded: AtomicU64,
    refused: AtomicU64,
    tried_next: AtomicU64,
    lost: AtomicU64,
    unreachable: AtomicU64,
}

type AppState = Arc<Shared>;

/// The router's routes.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/v1/runs", post(runs))
        .route("/v1/sessions", post(open_session).get(list_sessions))
        .route("/v1/sessions/{id}", any(session_call))
        .route("/v1/sessions/{id}/{*rest}", any(session_call))
        .route("/v1/snapshots", get(list_snapshots))
        .route("/v1/snapshots/{id}", any(snapshot_call))
        .route("/v1/snapshots/{id}/{*rest}", any(snapshot_call))
        .route("/v1/providers", get(one_node))
        .route("/v1/openapi.json", get(one_node))
        .route("/v1/nodes", get(nodes))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/mcp", any(mcp))
        .fallback(not_found)
        .with_state(state)
}

/// Marks an answer the router made itself (not a node's), with what it said: `/mcp` gives it
/// to its MCP client as a tool error.
#[derive(Debug, Clone)]
struct RouterMade(ErrorResponse);

/// One answer of the router's own (not a node's).
fn answer(
    status: StatusCode,
    code: &str,
    not_dispatched: Option<Reason>,
    end_reason: Option<EndReason>,
    request_id: Option<String>,
    message: String,
) -> Response {
    let body = ErrorResponse {
        protocol: PROTOCOL,
        request_id,
        error: ErrorBody {
            code: code.to_owned(),
            message,
            not_dispatched,
            end_reason,
        },
    };
    let mut resp = (status, axum::Json(body.clone())).into_response();
    resp.extensions_mut().insert(RouterMade(body));
    if status == StatusCode::UNAUTHORIZED {
        resp.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    resp
}

/// The HTTP status of a refusal (the daemon's own mapping, in plimsoll-wire).
fn status_for(reason: Reason) -> StatusCode {
    StatusCode::from_u16(reason.http_status()).expect("every reason's status is a valid one")
}

/// A refusal made before a request's body was read: answered once its request id is known.
#[derive(Debug)]
struct Refusal {
    status: StatusCode,
    code: &'static str,
    reason: Reason,
    message: String,
}

impl Refusal {
    fn answer(self, request_id: Option<String>) -> Response {
        answer(
            self.status,
            self.code,
            Some(self.reason),
            None,
            request_id,
            self.message,
        )
    }

    /// The answer, with the request id read from the first bytes of `body` (as a node reads
    /// it: at most [`ID_PREFIX_BYTES`], for at most [`ID_PREFIX_TIMEOUT`]), so that the
    /// caller's client can tell that nothing of its request ran.
    async fn answer_reading(self, body: Body) -> Response {
        let (prefix, _) = read_up_to(body, ID_PREFIX_BYTES, ID_PREFIX_TIMEOUT).await;
        self.answer(plimsoll_wire::scan_request_id(&prefix))
    }
}

/// The caller's token checked against the callers file, as a node would.
fn authenticate(st: &Shared, headers: &HeaderMap) -> Result<(), Refusal> {
    let refuse = |msg: &str| Refusal {
        status: StatusCode::UNAUTHORIZED,
        code: "unauthenticated",
        reason: Reason::Permission,
        message: msg.to_owned(),
    };
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(refuse(
            "no bearer token: send `Authorization: Bearer <token>` (a caller's token, from `plimsoll callers add NAME`)",
        ));
    };
    let token = value
        .to_str()
        .ok()
        .and_then(|t| t.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| Secret::new(t.trim()));
    let callers = st.callers.current().map_err(|e| Refusal {
        status: StatusCode::SERVICE_UNAVAILABLE,
        code: "callers_unavailable",
        reason: Reason::Environment,
        message: e.to_string(),
    })?;
    match token.as_ref().and_then(|t| callers.authenticate(t)) {
        Some(_) => Ok(()),
        None => Err(refuse(
            "the bearer token is not a current caller's: check it, or ask the operator for one",
        )),
    }
}

/// How a body's reading ended.
#[derive(Debug, PartialEq, Eq)]
enum BodyEnd {
    /// All of it arrived.
    Whole,
    /// It went past the limit (what was kept is cut there).
    Over,
    /// It broke off.
    Broken(String),
    /// It did not arrive in time.
    Late,
}

/// Reads `body` until it ends, goes past `limit` bytes, breaks or `timeout` passes: what
/// arrived (at most `limit` bytes), and how it ended.
async fn read_up_to(mut body: Body, limit: usize, timeout: Duration) -> (Vec<u8>, BodyEnd) {
    let mut kept = Vec::new();
    let read = async {
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => {
                    if let Ok(data) = frame.into_data() {
                        let room = limit - kept.len();
                        if data.len() > room {
                            kept.extend_from_slice(&data[..room]);
                            return BodyEnd::Over;
                        }
                        kept.extend_from_slice(&data);
                    }
                }
                Err(e) => return BodyEnd::Broken(e.to_string()),
            }
        }
        BodyEnd::Whole
    };
    let end = tokio::time::timeout(timeout, read)
        .await
        .unwrap_or(BodyEnd::Late);
    (kept, end)
}

/// Reads a request body up to the limit, or answers why not (the request id echoed when
/// what arrived names one).
async fn read_body(st: &Shared, body: Body) -> Result<Bytes, Box<Response>> {
    let (kept, end) = read_up_to(body, st.max_body_bytes, BODY_TIMEOUT).await;
    let (status, message) = match end {
        BodyEnd::Whole => return Ok(Bytes::from(kept)),
        BodyEnd::Over => (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the body is over the router's limit of {} bytes: send less",
                st.max_body_bytes
            ),
        ),
        BodyEnd::Broken(e) => (
            StatusCode::BAD_REQUEST,
            format!("the body could not be read: {e}"),
        ),
        BodyEnd::Late => (
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the body did not arrive within {} s",
                BODY_TIMEOUT.as_secs()
            ),
        ),
    };
    let id = plimsoll_wire::scan_request_id(&kept[..kept.len().min(ID_PREFIX_BYTES)]);
    Err(Box::new(answer(
        status,
        "request",
        Some(Reason::Request),
        None,
        id,
        message,
    )))
}

/// Headers that belong to one connection, not passed on.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "proxy-authorization"
            | "proxy-authenticate"
            | "host"
    )
}

/// The request to send a node: the caller's method, path, query and end-to-end headers.
fn to_node(
    addr: SocketAddr,
    method: &Method,
    uri: &axum::http::Uri,
    headers: &HeaderMap,
    body: Body,
) -> hyper::Request<Body> {
    let target = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut req = hyper::Request::builder()
        .method(method.clone())
        .uri(target)
        .body(body)
        .expect("a method and target taken from a parsed request are valid");
    let h = req.headers_mut();
    for (k, v) in headers {
        if !hop_by_hop(k) {
            h.append(k.clone(), v.clone());
        }
    }
    if let Ok(v) = HeaderValue::from_str(&addr.to_string()) {
        h.insert(header::HOST, v.clone());
    }
    req
}

/// A node's answer as the router's: untouched but for the connection's own headers, and the
/// node named.
fn from_node(addr: SocketAddr, resp: hyper::Response<hyper::body::Incoming>) -> Response {
    let (mut parts, body) = resp.into_parts();
    passed_on(&mut parts.headers, addr);
    Response::from_parts(parts, Body::new(body))
}

/// A node's answer headers as the router passes them on: the connection's own left out, the
/// node named.
fn passed_on(headers: &mut HeaderMap, addr: SocketAddr) {
    let names: Vec<HeaderName> = headers.keys().filter(|k| hop_by_hop(k)).cloned().collect();
    for k in names {
        headers.remove(k);
    }
    name_node(headers, addr);
}

fn name_node(headers: &mut HeaderMap, addr: SocketAddr) {
    if let Ok(v) = HeaderValue::from_str(&addr.to_string()) {
        headers.insert(HeaderName::from_static(NODE_HEADER), v);
    }
}

/// The "may have run" answer for a connection lost after the request was sent.
fn lost(st: &Shared, addr: SocketAddr, request_id: Option<String>, why: &str) -> Response {
    st.counts.lost.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(node = %addr, request_id = ?request_id, error = %why, "a node was lost after a request was sent to it");
    let mut resp = answer(
        StatusCode::BAD_GATEWAY,
        "node_lost",
        None,
        None,
        request_id,
        format!(
            "the connection to node {addr} failed after the request was sent ({why}): it may \
             have run there. Do not retry blindly: a run's effects, if any, are not known"
        ),
    );
    name_node(resp.headers_mut(), addr);
    resp
}

fn request_id_of(body: &serde_json::Value) -> Option<String> {
    body.get("request_id")
        .and_then(|v| v.as_str())
        .map(str::to_owned)
}

async fn runs(State(st): State<AppState>, req: Request) -> Response {
    place_and_send(st, req, false).await
}

async fn open_session(State(st): State<AppState>, req: Request) -> Response {
    place_and_send(st, req, true).await
}

/// Places a run or a session's open and sends it, trying the next node while a node
/// refuses with nothing run.
async fn place_and_send(st: AppState, req: Request, session: bool) -> Response {
    let (parts, body) = req.into_parts();
    if let Err(r) = authenticate(&st, &parts.headers) {
        return r.answer_reading(body).await;
    }
    let bytes = match read_body(&st, body).await {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let parsed: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let request_id = request_id_of(&parsed);
    let want = Want::of(&parsed, session);
    place(&st, &parts, bytes, &want, request_id, true).await
}

/// Sends a request to the nodes that may take `want`, in placement order; the router's own
/// refusal when there is none.
async fn place(
    st: &Shared,
    parts: &axum::http::request::Parts,
    bytes: Bytes,
    want: &Want,
    request_id: Option<String>,
    next_on_refusal: bool,
) -> Response {
    let order = match candidates(&st.cluster, want) {
        Ok(o) => o,
        Err(no) => {
            st.counts.refused.fetch_add(1, Ordering::Relaxed);
            return answer(
                status_for(no.reason),
                no.reason.as_str(),
                Some(no.reason),
                None,
                request_id,
                no.message,
            );
        }
    };
    send_in_order(st, parts, bytes, &order, request_id, next_on_refusal).await
}

/// Sends a request to the first node of `order` that can be reached. A node that cannot be
/// reached got nothing, so the next is tried; with `next_on_refusal`, so is one that refused
/// with nothing run for a reason another node may not have (capacity, environment,
/// isolation, unsupported).
async fn send_in_order(
    st: &Shared,
    parts: &axum::http::request::Parts,
    bytes: Bytes,
    order: &[SocketAddr],
    request_id: Option<String>,
    next_on_refusal: bool,
) -> Response {
    let mut last_refusal: Option<Response> = None;
    let mut unreachable = Vec::new();
    for (i, addr) in order.iter().copied().enumerate() {
        let more = i + 1 < order.len();
        let _counted = st.cluster.start_exchange(addr);
        let to = to_node(
            addr,
            &parts.method,
            &parts.uri,
            &parts.headers,
            Body::from(bytes.clone()),
        );
        let resp = match exchange(addr, to).await {
            Ok(r) => r,
            Err(ExchangeError::NotSent(why)) => {
                // Nothing reached it: the next node may take the request.
                st.counts.unreachable.fetch_add(1, Ordering::Relaxed);
                st.cluster.mark_unreachable(addr, &why);
                unreachable.push(format!("{addr}: {why}"));
                continue;
            }
            Err(ExchangeError::Lost(why)) => return lost(st, addr, request_id, &why),
        };
        let refusal_status = matches!(resp.status().as_u16(), 422 | 429 | 503);
        if !(more && refusal_status && next_on_refusal) {
            st.counts.forwarded.fetch_add(1, Ordering::Relaxed);
            return from_node(addr, resp);
        }
        // A refusal that may be another node's to take: read it whole (it is small).
        let (mut head, body) = resp.into_parts();
        let read = tokio::time::timeout(
            BODY_TIMEOUT,
            http_body_util::Limited::new(body, REFUSAL_LIMIT).collect(),
        )
        .await;
        let text = match read {
            Ok(Ok(c)) => c.to_bytes(),
            // The refusal broke off: what it said is unknown, so the run may have started.
            _ => return lost(st, addr, request_id, "its answer broke off"),
        };
        let retry = serde_json::from_slice::<ErrorResponse>(&text).is_ok_and(|e| {
            e.request_id == request_id
                && matches!(
                    e.error.not_dispatched,
                    Some(
                        Reason::Capacity
                            | Reason::Environment
                            | Reason::Isolation
                            | Reason::Unsupported
                    )
                )
        });
        passed_on(&mut head.headers, addr);
        let whole = Response::from_parts(head, Body::from(text));
        if !retry {
            st.counts.forwarded.fetch_add(1, Ordering::Relaxed);
            return whole;
        }
        st.counts.tried_next.fetch_add(1, Ordering::Relaxed);
        tracing::info!(node = %addr, request_id = ?request_id, "a node refused with nothing run; trying the next");
        last_refusal = Some(whole);
    }
    if let Some(r) = last_refusal {
        st.counts.forwarded.fetch_add(1, Ordering::Relaxed);
        return r;
    }
    st.counts.refused.fetch_add(1, Ordering::Relaxed);
    answer(
        StatusCode::SERVICE_UNAVAILABLE,
        "environment",
        Some(Reason::Environment),
        None,
        request_id,
        format!(
            "no node that could take this request could be reached, so it ran nowhere: {}",
            unreachable.join("; ")
        ),
    )
}

/// What a call names: a session, or a snapshot (which lives on the node of the daemon that
/// took it, its id naming that daemon's instance as a session id does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    Session,
    Snapshot,
}

impl Held {
    fn prefix(self) -> &'static str {
        match self {
            Held::Session => "/v1/sessions/",
            Held::Snapshot => "/v1/snapshots/",
        }
    }
    fn not_found(self) -> &'static str {
        match self {
            Held::Session => "session_not_found",
            Held::Snapshot => "snapshot_not_found",
        }
    }
    fn noun(self) -> &'static str {
        match self {
            Held::Session => "session",
            Held::Snapshot => "snapshot",
        }
    }
    /// The id whose instance names the node: a snapshot's, spelt as a session's.
    fn session_like(self, id: &str) -> String {
        match (self, id.strip_prefix("snp_")) {
            (Held::Snapshot, Some(rest)) => format!("ses_{rest}"),
            _ => id.to_owned(),
        }
    }
}

/// A call of one session, sent to the node that holds it.
async fn session_call(State(st): State<AppState>, req: Request) -> Response {
    held_call(st, req, Held::Session).await
}

/// A call of one snapshot (open a session from it, delete it), sent to the node that holds it.
async fn snapshot_call(State(st): State<AppState>, req: Request) -> Response {
    held_call(st, req, Held::Snapshot).await
}

async fn held_call(st: AppState, req: Request, held: Held) -> Response {
    let (parts, body) = req.into_parts();
    if let Err(r) = authenticate(&st, &parts.headers) {
        return r.answer_reading(body).await;
    }
    let id = parts
        .uri
        .path()
        .trim_start_matches(held.prefix())
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let bytes = match read_body(&st, body).await {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let request_id = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| request_id_of(&v));
    send_to_session(
        &st,
        &parts,
        bytes,
        &held.session_like(&id),
        request_id,
        held,
    )
    .await
}

/// Sends a call of session `id` (or of the snapshot it spells, `held`) to the node that
/// holds it.
async fn send_to_session(
    st: &Shared,
    parts: &axum::http::request::Parts,
    bytes: Bytes,
    id: &str,
    request_id: Option<String>,
    held: Held,
) -> Response {
    let noun = held.noun();
    let addr = match st.cluster.session_node(id) {
        SessionNode::At(addr) => addr,
        SessionNode::Gone { addr, why } => {
            let mut r = answer(
                StatusCode::NOT_FOUND,
                held.not_found(),
                Some(Reason::Request),
                (held == Held::Session).then_some(EndReason::DaemonRestarted),
                request_id,
                format!("no such {noun}: {why}, and a {noun} does not outlive its node's daemon"),
            );
            name_node(r.headers_mut(), addr);
            return r;
        }
        SessionNode::Unknown => {
            return answer(
                StatusCode::NOT_FOUND,
                held.not_found(),
                Some(Reason::Request),
                None,
                request_id,
                format!("no such {noun}: no node of this router gave this id"),
            );
        }
    };
    let _counted = st.cluster.start_exchange(addr);
    let to = to_node(
        addr,
        &parts.method,
        &parts.uri,
        &parts.headers,
        Body::from(bytes),
    );
    match exchange(addr, to).await {
        Ok(resp) => {
            st.counts.forwarded.fetch_add(1, Ordering::Relaxed);
            from_node(addr, resp)
        }
        Err(ExchangeError::NotSent(why)) => {
            st.counts.unreachable.fetch_add(1, Ordering::Relaxed);
            st.cluster.mark_unreachable(addr, &why);
            let mut r = answer(
                StatusCode::SERVICE_UNAVAILABLE,
                "node_unreachable",
                Some(Reason::Environment),
                None,
                request_id,
                format!(
                    "node {addr}, which holds this {noun}, cannot be reached ({why}); nothing \
                     was sent. Try again later: the {noun} lives on if its node does"
                ),
            );
            name_node(r.headers_mut(), addr);
            r
        }
        Err(ExchangeError::Lost(why)) => lost(st, addr, request_id, &why),
    }
}

/// The caller's sessions on every ready node, joined (oldest first).
async fn list_sessions(State(st): State<AppState>, req: Request) -> Response {
    let (parts, _) = req.into_parts();
    if let Err(r) = authenticate(&st, &parts.headers) {
        return r.answer(None);
    }
    let (sessions, unanswered) = joined_sessions(&st, &parts.headers).await;
    joined_answer("sessions", sessions, &unanswered)
}

/// The caller's snapshots on every ready node, joined (oldest first).
async fn list_snapshots(State(st): State<AppState>, req: Request) -> Response {
    let (parts, _) = req.into_parts();
    if let Err(r) = authenticate(&st, &parts.headers) {
        return r.answer(None);
    }
    let (snapshots, unanswered) = joined(
        &st,
        &parts.headers,
        "/v1/snapshots",
        "snapshots",
        "created_unix_ms",
    )
    .await;
    joined_answer("snapshots", snapshots, &unanswered)
}

/// A joined list's answer: `{protocol, KEY: items}`, the nodes that did not answer named in
/// [`UNANSWERED_HEADER`].
fn joined_answer(key: &str, items: Vec<serde_json::Value>, unanswered: &[String]) -> Response {
    let mut resp =
        axum::Json(serde_json::json!({"protocol": PROTOCOL, key: items})).into_response();
    if !unanswered.is_empty()
        && let Ok(v) = HeaderValue::from_str(&unanswered.join(","))
    {
        resp.headers_mut()
            .insert(HeaderName::from_static(UNANSWERED_HEADER), v);
    }
    resp
}

/// `GET /v1/sessions` of every usable node with the caller's headers: their sessions joined,
/// oldest first, and the nodes that did not answer.
async fn joined_sessions(
    st: &Shared,
    headers: &HeaderMap,
) -> (Vec<serde_json::Value>, Vec<String>) {
    joined(st, headers, "/v1/sessions", "sessions", "opened_unix_ms").await
}

/// `GET path` of every usable node with the caller's headers: the lists under `key` joined,
/// ordered by `order` (oldest first), and the nodes that did not answer.
async fn joined(
    st: &Shared,
    headers: &HeaderMap,
    path: &'static str,
    key: &str,
    order: &str,
) -> (Vec<serde_json::Value>, Vec<String>) {
    let uri = axum::http::Uri::from_static(path);
    let mut set = tokio::task::JoinSet::new();
    for n in st.cluster.nodes().into_iter().filter(|n| n.usable()) {
        let to = to_node(n.addr, &Method::GET, &uri, headers, Body::empty());
        set.spawn(async move {
            let answer = async {
                let resp = exchange(n.addr, to).await.map_err(|_| ())?;
                if resp.status() != StatusCode::OK {
                    return Err(());
                }
                let bytes = http_body_util::Limited::new(resp.into_body(), 64 << 20)
                    .collect()
                    .await
                    .map_err(|_| ())?
                    .to_bytes();
                serde_json::from_slice::<serde_json::Value>(&bytes).map_err(|_| ())
            };
            (n.addr, answer.await)
        });
    }
    let mut items: Vec<serde_json::Value> = Vec::new();
    let mut unanswered = Vec::new();
    while let Some(Ok((addr, r))) = set.join_next().await {
        match r {
            Ok(v) => items.extend(
                v.get(key)
                    .and_then(|s| s.as_array())
                    .cloned()
                    .unwrap_or_default(),
            ),
            Err(()) => unanswered.push(addr.to_string()),
        }
    }
    items.sort_by_key(|s| s.get(order).and_then(|v| v.as_u64()));
    unanswered.sort();
    (items, unanswered)
}

/// A request any node answers alike: sent to the least loaded ready node.
async fn one_node(State(st): State<AppState>, req: Request) -> Response {
    let (parts, _) = req.into_parts();
    if parts.uri.path() != "/v1/openapi.json"
        && let Err(r) = authenticate(&st, &parts.headers)
    {
        return r.answer(None);
    }
    least_loaded(&st, &parts, Bytes::new()).await
}

/// Sends a request that runs nothing to the least loaded usable node (the next when one
/// cannot be reached).
async fn least_loaded(st: &Shared, parts: &axum::http::request::Parts, bytes: Bytes) -> Response {
    let mut ready: Vec<(u64, SocketAddr)> = st
        .cluster
        .nodes()
        .into_iter()
        .filter(|n| n.usable())
        .map(|n| (n.load + st.cluster.in_flight(n.addr), n.addr))
        .collect();
    ready.sort();
    if ready.is_empty() {
        return answer(
            StatusCode::SERVICE_UNAVAILABLE,
            "environment",
            Some(Reason::Environment),
            None,
            None,
            "no node is ready to answer: see GET /v1/nodes".into(),
        );
    }
    let order: Vec<SocketAddr> = ready.into_iter().map(|(_, a)| a).collect();
    send_in_order(st, parts, bytes, &order, None, false).await
}

/// The router's view of its nodes.
async fn nodes(State(st): State<AppState>, headers: HeaderMap) -> Response {
    if let Err(r) = authenticate(&st, &headers) {
        return r.answer(None);
    }
    let list: Vec<serde_json::Value> = st
        .cluster
        .nodes()
        .into_iter()
        .map(|n| {
            let providers: Vec<serde_json::Value> = n
                .tiers()
                .into_iter()
                .map(|(name, tier)| serde_json::json!({"name": name, "isolation": tier}))
                .collect();
            let images: Vec<&str> = n
                .providers
                .iter()
                .flat_map(|p| &p.images)
                .map(|i| i.name.as_str())
                .collect();
            serde_json::json!({
                "node": n.addr.to_string(),
                "instance": n.instance,
                "ready": n.ready,
                "usable": n.usable(),
                "load": n.load,
                "router_in_flight": st.cluster.in_flight(n.addr),
                "available_providers": providers,
                "images": images,
                "error": n.error,
            })
        })
        .collect();
    axum::Json(serde_json::json!({"nodes": list})).into_response()
}

async fn healthz() -> Response {
    axum::Json(serde_json::json!({"status": "ok"})).into_response()
}

async fn readyz(State(st): State<AppState>) -> Response {
    let ready = st.cluster.nodes().iter().filter(|n| n.usable()).count();
    if ready > 0 {
        axum::Json(serde_json::json!({"ready": true})).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({
                "ready": false,
                "message": "no node is ready: see GET /v1/nodes and the router's log"
            })),
        )
            .into_response()
    }
}

async fn metrics(State(st): State<AppState>) -> Response {
    use std::fmt::Write as _;
    let nodes = st.cluster.nodes();
    let c = &st.counts;
    let mut out = String::new();
    let counters = [
        ("forwarded", "Requests answered by a node.", &c.forwarded),
        (
            "refused",
            "Runs and opens the router refused itself, not dispatched (no node could take them).",
            &c.refused,
        ),
        (
            "tried_next",
            "Times a node refused with nothing run and the next node was tried.",
            &c.tried_next,
        ),
        (
            "node_lost",
            "Requests whose node's connection failed after they were sent (may have run).",
            &c.lost,
        ),
        (
            "node_unreachable",
            "Connections to a node that could not be made (nothing sent).",
            &c.unreachable,
        ),
    ];
    for (name, help, n) in counters {
        let name = format!("plimsoll_router_{name}_total");
        let v = n.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP plimsoll_router_nodes Nodes found.\n# TYPE plimsoll_router_nodes gauge\nplimsoll_router_nodes {}",
        nodes.len()
    );
    let _ = writeln!(
        out,
        "# HELP plimsoll_router_nodes_usable Nodes ready, with their providers known.\n# TYPE plimsoll_router_nodes_usable gauge\nplimsoll_router_nodes_usable {}",
        nodes.iter().filter(|n| n.usable()).count()
    );
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
        .into_response()
}

/// The session tools of MCP: each call goes to the node that holds its `session_id` (a
/// snapshot or a fork is taken there, and a fork's copies live there).
const MCP_SESSION_TOOLS: [&str; 7] = [
    "run_cell",
    "run_session_steps",
    "write_session_file",
    "read_session_file",
    "close_session",
    "snapshot_session",
    "fork_session",
];

/// The snapshot tools of MCP that name one: each call goes to the node that holds its
/// `snapshot_id` (the node whose daemon took it).
const MCP_SNAPSHOT_TOOLS: [&str; 2] = ["open_snapshot", "delete_snapshot"];

/// MCP (JSON-RPC over HTTP; each POST stands alone at a node). A tool call that runs goes
/// where a run with its placement would go, a session's tool call to the session's node, a
/// snapshot's to the snapshot's node, and `list_sessions` and `list_snapshots` are answered
/// from every node's; anything else (initialize, tools/list, list_providers, ...) goes to the
/// least loaded ready node. What the router says itself (no node can take it, a node lost)
/// comes back as the tool's error, as a node says it.
async fn mcp(State(st): State<AppState>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    if let Err(r) = authenticate(&st, &parts.headers) {
        return r.answer(None);
    }
    let bytes = match read_body(&st, body).await {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let rpc: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let tool = (rpc.get("method").and_then(|m| m.as_str()) == Some("tools/call"))
        .then(|| rpc.pointer("/params/name").and_then(|n| n.as_str()))
        .flatten();
    let args = rpc
        .pointer("/params/arguments")
        .cloned()
        .unwrap_or_default();
    let resp = match tool {
        Some(t @ ("run_code" | "run_project" | "open_session")) => {
            let want = Want::of_tool(&args, t == "open_session");
            place(&st, &parts, bytes, &want, None, false).await
        }
        Some(t) if MCP_SESSION_TOOLS.contains(&t) => {
            match args.get("session_id").and_then(|v| v.as_str()) {
                Some(id) => send_to_session(&st, &parts, bytes, id, None, Held::Session).await,
                // The node refuses it as it refuses any call without an id.
                None => least_loaded(&st, &parts, bytes).await,
            }
        }
        Some(t) if MCP_SNAPSHOT_TOOLS.contains(&t) => {
            match args.get("snapshot_id").and_then(|v| v.as_str()) {
                Some(id) => {
                    let like = Held::Snapshot.session_like(id);
                    send_to_session(&st, &parts, bytes, &like, None, Held::Snapshot).await
                }
                // The node refuses it as it refuses any call without an id.
                None => least_loaded(&st, &parts, bytes).await,
            }
        }
        Some("list_sessions") => {
            let (sessions, unanswered) = joined_sessions(&st, &parts.headers).await;
            return mcp_list(
                &rpc,
                "sessions",
                sessions,
                &unanswered,
                plimsoll_mcp::render::session_list,
            );
        }
        Some("list_snapshots") => {
            let (snapshots, unanswered) = joined(
                &st,
                &parts.headers,
                "/v1/snapshots",
                "snapshots",
                "created_unix_ms",
            )
            .await;
            return mcp_list(
                &rpc,
                "snapshots",
                snapshots,
                &unanswered,
                plimsoll_mcp::render::snapshot_list,
            );
        }
        _ => least_loaded(&st, &parts, bytes).await,
    };
    match resp.extensions().get::<RouterMade>() {
        Some(RouterMade(said)) => mcp_tool_error(&rpc, said),
        None => resp,
    }
}

/// A JSON-RPC answer to `rpc` carrying a tool result.
fn mcp_result(
    rpc: &serde_json::Value,
    structured: serde_json::Value,
    text: String,
    error: bool,
) -> Response {
    axum::Json(serde_json::json!({
        "jsonrpc": "2.0",
        "id": rpc.get("id").cloned().unwrap_or_default(),
        "result": {
            "content": [{"type": "text", "text": text}],
            "structuredContent": structured,
            "isError": error,
        },
    }))
    .into_response()
}

/// What the router said itself, as a node's MCP says a refusal or a failure.
fn mcp_tool_error(rpc: &serde_json::Value, said: &ErrorResponse) -> Response {
    let e = match said.error.not_dispatched {
        Some(reason) => plimsoll_mcp::BackendError::NotDispatched {
            reason,
            code: Some(said.error.code.clone()),
            end_reason: said.error.end_reason,
            message: said.error.message.clone(),
        },
        None => plimsoll_mcp::BackendError::MayHaveRun {
            message: said.error.message.clone(),
        },
    };
    let (structured, text) = plimsoll_mcp::render::error(&e);
    mcp_result(rpc, structured, text, true)
}

/// `list_sessions` or `list_snapshots` over MCP: the caller's sessions (or snapshots, `key`)
/// of every node, as a node lists its own, with the nodes that did not answer.
fn mcp_list<T: serde::de::DeserializeOwned>(
    rpc: &serde_json::Value,
    key: &str,
    items: Vec<serde_json::Value>,
    unanswered: &[String],
    render: fn(&T) -> (serde_json::Value, String),
) -> Response {
    let list = serde_json::json!({"protocol": PROTOCOL, key: items});
    match serde_json::from_value::<T>(list) {
        Ok(list) => {
            let (mut structured, mut text) = render(&list);
            if !unanswered.is_empty() {
                text.push_str(&format!(
                    "\nNodes that did not answer (their {key} are not listed): {}",
                    unanswered.join(", ")
                ));
                if let Some(o) = structured.as_object_mut() {
                    o.insert("nodes_unanswered".into(), serde_json::json!(unanswered));
                }
            }
            mcp_result(rpc, structured, text, false)
        }
        Err(e) => mcp_tool_error(
            rpc,
            &ErrorResponse {
                protocol: PROTOCOL,
                request_id: None,
                error: ErrorBody {
                    code: "internal".into(),
                    message: format!("a node's {key} list does not parse: {e}"),
                    not_dispatched: Some(Reason::Environment),
                    end_reason: None,
                },
            },
        ),
    }
}

async fn not_found(method: Method, uri: axum::http::Uri) -> Response {
    answer(
        StatusCode::NOT_FOUND,
        "not_found",
        Some(Reason::Request),
        None,
        None,
        format!("no route {method} {}: see docs/cluster.md", uri.path()),
    )
}
