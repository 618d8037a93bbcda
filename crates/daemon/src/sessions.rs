//! The sessions API (docs/sessions.md): open, list, show and close a caller's sessions;
//! cells, steps and files in one. Every answer to a call is a run response whose record is
//! chained to the session's previous call; with `Accept: application/x-ndjson`, cells and
//! steps send output chunks as they come (a preview, in no digest), then the answer.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use plimsoll_engine::{RunError, SessionCallKind};
use plimsoll_wire::{
    Bytes as WireBytes, PROTOCOL, Project, ProjectFile, RunRequest, RunSpec, StreamLine,
    parse_session_call, parse_session_open, validate_request_id,
};

use crate::server::{
    AppState, BODY_READ_TIMEOUT, Failure, authenticate, closing, declared_over, failure_of,
    read_body, scanned_request_id, too_large,
};

/// The header carrying the request id of a request without a JSON body (`DELETE`, and a
/// file's `PUT` and `GET`).
pub const REQUEST_ID_HEADER: &str = "plimsoll-request-id";
/// The media type of a streamed answer.
pub const NDJSON: &str = "application/x-ndjson";

/// The caller, the request head and its whole body; or the answer that refuses it.
async fn caller_and_body(
    st: &AppState,
    req: Request,
) -> Result<(String, axum::http::request::Parts, axum::body::Bytes), Response> {
    let (parts, body) = req.into_parts();
    let caller = authenticate(st, &parts.headers).map_err(|f| {
        let (failure, message) = f.failure();
        closing(failure.respond(header_request_id(&parts.headers), message))
    })?;
    if declared_over(&parts.headers, st.max_body_bytes) {
        return Err(closing(Failure::BodyTooLarge.respond(
            header_request_id(&parts.headers),
            too_large(st.max_body_bytes),
        )));
    }
    let bytes = read_body(body, st.max_body_bytes, BODY_READ_TIMEOUT)
        .await
        .map_err(|e| {
            let (failure, message, _) = e.failure(st.max_body_bytes);
            closing(failure.respond(header_request_id(&parts.headers), message))
        })?;
    Ok((caller, parts, bytes))
}

/// The caller a request's token names, or the refusal (echoing the header's request id).
fn caller_of(st: &AppState, headers: &HeaderMap) -> Result<String, Box<Response>> {
    authenticate(st, headers).map_err(|f| {
        let (failure, message) = f.failure();
        Box::new(failure.respond(header_request_id(headers), message))
    })
}

fn header_request_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|id| validate_request_id(id).is_ok())
        .map(str::to_owned)
}

/// What a route's path or query extractor gave; or, when it could not read them (a `%ff`
/// in the path, `?restart=maybe`), the answer: the token checked first, as on every session
/// route (401 without one), then `400`, not dispatched (`request`), an `ErrorResponse` with
/// the header's request id. Closes the connection: a body is left unread.
fn target<T>(
    st: &AppState,
    headers: &HeaderMap,
    got: Result<T, String>,
) -> Result<T, Box<Response>> {
    let why = match got {
        Ok(t) => return Ok(t),
        Err(why) => why,
    };
    let refusal = match caller_of(st, headers) {
        Err(refusal) => *refusal,
        Ok(_) => {
            st.metrics.refused(plimsoll_wire::Reason::Request);
            Failure::Refused(plimsoll_wire::Reason::Request).respond(
                header_request_id(headers),
                format!("{why}: see GET /v1/openapi.json for this route's path and query"),
            )
        }
    };
    Err(Box::new(closing(refusal)))
}

fn path_of<T>(p: Result<Path<T>, PathRejection>) -> Result<T, String> {
    p.map(|Path(t)| t).map_err(|e| e.body_text())
}

/// The request id a body-less request must carry in [`REQUEST_ID_HEADER`], or the refusal
/// (not dispatched, `request`) that says it is missing or malformed.
fn required_request_id(headers: &HeaderMap) -> Result<String, Box<Response>> {
    let refuse =
        |m: String| Box::new(Failure::Refused(plimsoll_wire::Reason::Request).respond(None, m));
    let Some(value) = headers.get(REQUEST_ID_HEADER) else {
        return Err(refuse(format!(
            "send the request id in the {REQUEST_ID_HEADER} header"
        )));
    };
    let id = value.to_str().unwrap_or("");
    validate_request_id(id).map_err(|m| refuse(format!("{REQUEST_ID_HEADER}: {m}")))?;
    Ok(id.to_owned())
}

/// The answer to an engine refusal or failure.
fn refused(st: &AppState, err: &RunError) -> Response {
    refused_echoing(st, err, None)
}

/// [`refused`], echoing `request_id` when the engine's answer has none (a request whose
/// id came in the [`REQUEST_ID_HEADER`]).
fn refused_echoing(st: &AppState, err: &RunError, request_id: Option<String>) -> Response {
    let body = err.to_response();
    let failure = failure_of(err);
    if let Some(reason) = failure.not_dispatched() {
        st.metrics.refused(reason);
    }
    failure.respond(body.request_id.or(request_id), body.error.message)
}

fn json<T: serde::Serialize>(value: &T) -> Response {
    (StatusCode::OK, axum::Json(value)).into_response()
}

/// Runs `f` on a blocking thread; a panic there is an internal failure (it may have run).
async fn blocking<T: Send + 'static>(
    request_id: Option<String>,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Response> {
    tokio::task::spawn_blocking(f).await.map_err(|join| {
        tracing::error!(error = %join, "the engine failed while handling a session request");
        Failure::Internal.respond(
            request_id,
            "the daemon failed while handling this session request; it may have run: do not retry blindly".into(),
        )
    })
}

/// `POST /v1/sessions`.
pub(crate) async fn open(State(st): State<AppState>, req: Request) -> Response {
    let (caller, _, bytes) = match caller_and_body(&st, req).await {
        Ok(x) => x,
        Err(resp) => return resp,
    };
    let open = match parse_session_open(&bytes) {
        Ok(o) => o,
        // A body that arrived whole but does not parse still has its id echoed when it can
        // be read, as on `/v1/runs`.
        Err(r) => {
            let id = r.request_id.or_else(|| scanned_request_id(&bytes));
            return Failure::Refused(r.reason).respond(id, r.message);
        }
    };
    let engine = Arc::clone(&st);
    let id = Some(open.request_id.clone());
    match blocking(id, move || engine.engine.open_session(&caller, &open)).await {
        Ok(Ok(info)) => json(&info),
        Ok(Err(e)) => refused(&st, &e),
        Err(resp) => resp,
    }
}

/// `GET /v1/sessions`.
pub(crate) async fn list(State(st): State<AppState>, headers: HeaderMap) -> Response {
    match caller_of(&st, &headers) {
        Ok(caller) => json(&st.engine.list_sessions(&caller)),
        Err(refusal) => *refusal,
    }
}

/// `GET /v1/sessions/{id}`.
pub(crate) async fn show(
    State(st): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Response {
    let id = match target(&st, &headers, path_of(id)) {
        Ok(id) => id,
        Err(resp) => return *resp,
    };
    match caller_of(&st, &headers) {
        Ok(caller) => match st.engine.session_info(&caller, &id) {
            Ok(info) => json(&info),
            // Echoes the id a client sent in the header, as every session answer does.
            Err(e) => refused_echoing(&st, &e, header_request_id(&headers)),
        },
        Err(refusal) => *refusal,
    }
}

/// `DELETE /v1/sessions/{id}`.
pub(crate) async fn close(
    State(st): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Response {
    let id = match target(&st, &headers, path_of(id)) {
        Ok(id) => id,
        Err(resp) => return *resp,
    };
    let caller = match caller_of(&st, &headers) {
        Ok(c) => c,
        Err(refusal) => return *refusal,
    };
    let request_id = header_request_id(&headers);
    let engine = Arc::clone(&st);
    let rid = request_id.clone();
    match blocking(request_id, move || {
        engine.engine.close_session(&caller, &id, rid.as_deref())
    })
    .await
    {
        Ok(Ok(info)) => json(&info),
        Ok(Err(e)) => refused(&st, &e),
        Err(resp) => resp,
    }
}

/// `?restart=true` on a cell.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct CellQuery {
    #[serde(default)]
    restart: bool,
}

/// `POST /v1/sessions/{id}/cells`.
pub(crate) async fn cell(
    State(st): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<CellQuery>, QueryRejection>,
    req: Request,
) -> Response {
    let got = path_of(id).and_then(|id| {
        let Query(q) = query.map_err(|e| e.body_text())?;
        Ok((id, q))
    });
    let (id, q) = match target(&st, req.headers(), got) {
        Ok(x) => x,
        Err(resp) => return *resp,
    };
    posted_call(st, id, req, SessionCallKind::Cell { restart: q.restart }).await
}

/// `POST /v1/sessions/{id}/steps`.
pub(crate) async fn steps(
    State(st): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    req: Request,
) -> Response {
    let id = match target(&st, req.headers(), path_of(id)) {
        Ok(id) => id,
        Err(resp) => return *resp,
    };
    posted_call(st, id, req, SessionCallKind::Job).await
}

/// A cell or steps: the body a run request, streamed when the caller accepts NDJSON.
async fn posted_call(st: AppState, id: String, req: Request, kind: SessionCallKind) -> Response {
    let (caller, parts, bytes) = match caller_and_body(&st, req).await {
        Ok(x) => x,
        Err(resp) => return resp,
    };
    match parse_session_call(&bytes) {
        Ok(run) => call(st, caller, id, run, kind, wants_stream(&parts.headers)).await,
        Err(r) => {
            let id = r.request_id.or_else(|| scanned_request_id(&bytes));
            Failure::Refused(r.reason).respond(id, r.message)
        }
    }
}

/// `PUT /v1/sessions/{id}/files/{*path}`: the body's bytes, exactly, to /work/PATH; the
/// call is the project `{files: [{path, content}]}` (docs/sessions.md), answered as a run.
pub(crate) async fn put_file(
    State(st): State<AppState>,
    target_path: Result<Path<(String, String)>, PathRejection>,
    req: Request,
) -> Response {
    let (id, path) = match target(&st, req.headers(), path_of(target_path)) {
        Ok(x) => x,
        Err(resp) => return *resp,
    };
    let (caller, parts, bytes) = match caller_and_body(&st, req).await {
        Ok(x) => x,
        Err(resp) => return resp,
    };
    let request_id = match required_request_id(&parts.headers) {
        Ok(r) => r,
        Err(resp) => return *resp,
    };
    let run = file_request(
        request_id,
        Project {
            files: vec![ProjectFile {
                path,
                content: WireBytes::from(bytes.to_vec()),
                executable: false,
            }],
            steps: Vec::new(),
            artifacts: Vec::new(),
        },
    );
    call(st, caller, id, run, SessionCallKind::Job, false).await
}

/// `GET /v1/sessions/{id}/files/{*path}`: the file at /work/PATH as the run response of
/// the project `{artifacts: [PATH]}`, its bytes in `result.artifacts[0].content`.
pub(crate) async fn get_file(
    State(st): State<AppState>,
    target_path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
) -> Response {
    let (id, path) = match target(&st, &headers, path_of(target_path)) {
        Ok(x) => x,
        Err(resp) => return *resp,
    };
    let caller = match caller_of(&st, &headers) {
        Ok(c) => c,
        Err(refusal) => return *refusal,
    };
    let request_id = match required_request_id(&headers) {
        Ok(r) => r,
        Err(resp) => return *resp,
    };
    let run = file_request(
        request_id,
        Project {
            files: Vec::new(),
            steps: Vec::new(),
            artifacts: vec![path],
        },
    );
    call(st, caller, id, run, SessionCallKind::Job, false).await
}

/// The request a file's `PUT` or `GET` stands for (its digest is what the record names).
fn file_request(request_id: String, project: Project) -> RunRequest {
    RunRequest {
        image: None,
        protocol: PROTOCOL,
        request_id,
        minimum_isolation: None,
        provider: None,
        limits: None,
        run: RunSpec::Project(project),
        grant: None,
    }
}

pub(crate) fn wants_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|m| {
            m.trim()
                .split(';')
                .next()
                .is_some_and(|t| t.trim() == NDJSON)
        })
}

/// One call, answered whole, or streamed as NDJSON.
async fn call(
    st: AppState,
    caller: String,
    id: String,
    run: RunRequest,
    kind: SessionCallKind,
    stream: bool,
) -> Response {
    let request_id = Some(run.request_id.clone());
    let started = Instant::now();
    if !stream {
        let engine = Arc::clone(&st);
        let answered = blocking(request_id, move || {
            engine
                .engine
                .session_call(&caller, &id, &run, kind, &mut |_| {})
        })
        .await;
        return match answered {
            Ok(Ok(resp)) => {
                tracing::info!(request_id = %resp.request_id, duration_ms = started.elapsed().as_millis() as u64, "session call answered");
                json(&resp)
            }
            Ok(Err(e)) => refused(&st, &e),
            Err(resp) => resp,
        };
    }
    let (tx, rx) = match stream_place(&st, &caller, &run.request_id) {
        Ok(place) => crate::streams::channel(place),
        Err(resp) => return *resp,
    };
    let engine = Arc::clone(&st);
    // A client that goes away cancels its cell (the session goes on: docs/sessions.md).
    let cancel = plimsoll_engine::Cancel::new();
    let done = watch_client(&tx, &cancel, run.request_id.clone());
    tokio::task::spawn_blocking(move || {
        let answered = engine.engine.session_call_with(
            &caller,
            &id,
            &run,
            kind,
            &mut |c| {
                // A client that went away, or reads too slowly, misses chunks: a preview.
                tx.preview(line(&StreamLine::chunk(c)));
            },
            Some(cancel),
        );
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        let last = match answered {
            Ok(resp) => StreamLine::Response(Box::new(resp)),
            Err(e) => {
                if let Some(reason) = plimsoll_wire::not_dispatched_reason(&e) {
                    engine.metrics.refused(reason);
                }
                let failure = failure_of(&e);
                let body = e.to_response();
                StreamLine::Error(Box::new(failure.body(body.request_id, body.error.message)))
            }
        };
        tx.last(line(&last));
    });
    ndjson(rx)
}

/// A place for one more streamed answer of `caller`, or the refusal (`capacity`, nothing
/// ran) when its streams, or all, are at their bound (crate::streams).
fn stream_place(
    st: &AppState,
    caller: &str,
    request_id: &str,
) -> Result<crate::streams::Place, Box<Response>> {
    st.deliveries.take(caller).map_err(|why| {
        Box::new(refused(
            st,
            &RunError::refused(Some(request_id), plimsoll_wire::Reason::Capacity, why),
        ))
    })
}

/// How often a streamed run's answer gets an empty line while nothing else is sent: the
/// write is how a client that went away is noticed (and its run cancelled).
const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(1);

/// Keeps a streamed answer's client watched until `done` is set: an empty line each
/// [`KEEPALIVE`] while nothing else is sent (the write is how a client that went away is
/// noticed); once the client is gone, `cancel` is cancelled, again each second until the
/// run or call is over (its processes may not have existed at the first).
fn watch_client(
    tx: &crate::streams::Outbox,
    cancel: &Arc<plimsoll_engine::Cancel>,
    request_id: String,
) -> Arc<std::sync::atomic::AtomicBool> {
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (watch, cancel, watch_done) = (tx.clone(), Arc::clone(cancel), Arc::clone(&done));
    tokio::spawn(async move {
        let gone = loop {
            tokio::select! {
                () = watch.closed() => break true,
                () = tokio::time::sleep(KEEPALIVE) => {
                    if watch_done.load(std::sync::atomic::Ordering::SeqCst) {
                        break false;
                    }
                    watch.preview(b"\n".to_vec());
                }
            }
        };
        if !gone {
            return;
        }
        tracing::info!(request_id = %request_id, "the client of a streamed answer went away; cancelling");
        while !watch_done.load(std::sync::atomic::Ordering::SeqCst) {
            let c = Arc::clone(&cancel);
            let _ = tokio::task::spawn_blocking(move || c.cancel()).await;
            tokio::time::sleep(KEEPALIVE).await;
        }
    });
    done
}

/// `POST /v1/runs` with `Accept: application/x-ndjson`: output chunks as the run prints them
/// (a preview), an empty line each [`KEEPALIVE`] of silence, then the response or error. A
/// client that goes away cancels the run: its sandbox's processes are killed (again each
/// second while it still runs), and it is cleaned up as any run is.
pub(crate) fn stream_run(
    st: AppState,
    caller: String,
    request: RunRequest,
    started: Instant,
) -> Response {
    use plimsoll_engine::{Cancel, RunHooks};
    let (tx, rx) = match stream_place(&st, &caller, &request.request_id) {
        Ok(place) => crate::streams::channel(place),
        Err(resp) => return *resp,
    };
    let cancel = Cancel::new();
    let chunks = tx.clone();
    let tap = plimsoll_engine::OutputTap::new(move |stream, offset, bytes| {
        let chunk = plimsoll_wire::OutputChunk {
            stream,
            offset,
            bytes: WireBytes::from(bytes.to_vec()),
        };
        // A client that reads too slowly misses chunks (a preview): never waited for.
        chunks.preview(line(&StreamLine::chunk(chunk)));
    });
    let done = watch_client(&tx, &cancel, request.request_id.clone());
    tokio::task::spawn_blocking(move || {
        let hooks = RunHooks {
            tap: Some(tap),
            cancel: Some(cancel),
        };
        let result = st.engine.run_with(&caller, &request, hooks);
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        let last = match &result {
            Ok(resp) => StreamLine::Response(Box::new(resp.clone())),
            Err(e) => {
                let body = e.to_response();
                StreamLine::Error(Box::new(
                    failure_of(e).body(body.request_id, body.error.message),
                ))
            }
        };
        // Counted and logged as a run answered whole is.
        let answer = crate::server::Answer {
            st: &st,
            started,
            caller: Some(&caller),
        };
        drop(answer.ran(result, &request.request_id));
        tx.last(line(&last));
    });
    ndjson(rx)
}

fn line(l: &StreamLine) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(l).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// A streamed answer over the lines `rx` gives.
fn ndjson(rx: crate::streams::Inbox) -> Response {
    let mut resp = Response::new(Body::from_stream(rx));
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(NDJSON));
    resp
}

/// A snapshot route's body, parsed; or the refusal echoing its request id.
fn small_body<T: serde::de::DeserializeOwned>(
    bytes: &axum::body::Bytes,
    what: &str,
) -> Result<T, Box<Response>> {
    plimsoll_wire::parse_small_body(bytes, what).map_err(|r| {
        let id = r.request_id.or_else(|| scanned_request_id(bytes));
        Box::new(Failure::Refused(r.reason).respond(id, r.message))
    })
}

/// A snapshot route's `POST`: the caller, the path's id and the parsed body (a `what`)
/// handed to `f` on a blocking thread; its answer as JSON, or the refusal.
async fn posted<B, T>(
    st: AppState,
    id: Result<Path<String>, PathRejection>,
    req: Request,
    what: &str,
    f: fn(&plimsoll_engine::Engine, &str, &str, &B) -> Result<T, RunError>,
) -> Response
where
    B: serde::de::DeserializeOwned + HasRequestId + Send + 'static,
    T: serde::Serialize + Send + 'static,
{
    let id = match target(&st, req.headers(), path_of(id)) {
        Ok(id) => id,
        Err(resp) => return *resp,
    };
    let (caller, _, bytes) = match caller_and_body(&st, req).await {
        Ok(x) => x,
        Err(resp) => return resp,
    };
    let body: B = match small_body(&bytes, what) {
        Ok(b) => b,
        Err(resp) => return *resp,
    };
    let request_id = Some(body.request_id().to_owned());
    let engine = Arc::clone(&st);
    answered(&st, request_id, move || {
        f(&engine.engine, &caller, &id, &body)
    })
    .await
}

/// An engine answer on a blocking thread, as JSON or its refusal.
async fn answered<T: serde::Serialize + Send + 'static>(
    st: &AppState,
    request_id: Option<String>,
    f: impl FnOnce() -> Result<T, RunError> + Send + 'static,
) -> Response {
    match blocking(request_id.clone(), f).await {
        Ok(Ok(v)) => json(&v),
        Ok(Err(e)) => refused_echoing(st, &e, request_id),
        Err(resp) => resp,
    }
}

/// A snapshot route's body: its request id.
trait HasRequestId {
    fn request_id(&self) -> &str;
}

impl HasRequestId for plimsoll_wire::SnapshotRequest {
    fn request_id(&self) -> &str {
        &self.request_id
    }
}

impl HasRequestId for plimsoll_wire::ForkRequest {
    fn request_id(&self) -> &str {
        &self.request_id
    }
}

impl HasRequestId for plimsoll_wire::SnapshotOpenRequest {
    fn request_id(&self) -> &str {
        &self.request_id
    }
}

/// `POST /v1/sessions/{id}/snapshot`.
pub(crate) async fn snapshot(
    State(st): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    req: Request,
) -> Response {
    posted(
        st,
        id,
        req,
        "snapshot request",
        plimsoll_engine::Engine::snapshot_session,
    )
    .await
}

/// `POST /v1/sessions/{id}/fork`.
pub(crate) async fn fork(
    State(st): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    req: Request,
) -> Response {
    posted(
        st,
        id,
        req,
        "fork request",
        plimsoll_engine::Engine::fork_session,
    )
    .await
}

/// `POST /v1/snapshots/{id}/sessions`.
pub(crate) async fn open_snapshot(
    State(st): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    req: Request,
) -> Response {
    posted(
        st,
        id,
        req,
        "snapshot open request",
        plimsoll_engine::Engine::open_snapshot,
    )
    .await
}

/// `GET /v1/snapshots`.
pub(crate) async fn list_snapshots(State(st): State<AppState>, headers: HeaderMap) -> Response {
    match caller_of(&st, &headers) {
        Ok(caller) => json(&st.engine.list_snapshots(&caller)),
        Err(refusal) => *refusal,
    }
}

/// `DELETE /v1/snapshots/{id}`.
pub(crate) async fn delete_snapshot(
    State(st): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Response {
    let id = match target(&st, &headers, path_of(id)) {
        Ok(id) => id,
        Err(resp) => return *resp,
    };
    let caller = match caller_of(&st, &headers) {
        Ok(c) => c,
        Err(refusal) => return *refusal,
    };
    let request_id = header_request_id(&headers);
    let engine = Arc::clone(&st);
    let rid = request_id.clone();
    answered(&st, request_id, move || {
        engine.engine.delete_snapshot(&caller, &id, rid.as_deref())
    })
    .await
}
