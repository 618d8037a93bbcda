//! The MCP server handler: the tools, their descriptions, and how a call becomes a run. It
//! knows no transport; a transport that authenticates callers puts a [`Caller`] in the
//! request's extensions (or in the HTTP request parts it hands over).

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Extensions, Implementation, ServerCapabilities, ServerConfig,
};
use rmcp::{ErrorData, ServerHandler, tool, tool_handler, tool_router};
use serde_json::Value;

use crate::args::{
    ArgsError, CloseSessionArgs, DeleteSnapshotArgs, ForkSessionArgs, ListProvidersArgs,
    ListSessionsArgs, ListSnapshotsArgs, OpenSessionArgs, OpenSnapshotArgs, ReadSessionFileArgs,
    RunCellArgs, RunCodeArgs, RunProjectArgs, RunSessionStepsArgs, SnapshotSessionArgs,
    WriteSessionFileArgs,
};
use crate::backend::{Backend, BackendError, SessionCall};
use crate::render;

/// The authenticated caller of a request, set by the transport (the daemon's `/mcp` puts it
/// in the HTTP request's extensions after checking the bearer token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller(pub String);

/// What the server tells a client at initialisation.
const INSTRUCTIONS: &str = "\
plimsoll runs code in a fresh sandbox per call (or, in a session, in one sandbox kept \
across calls) and says how strong that sandbox was. \
Isolation tiers, weakest first: process (a hardened child process; no wall at the OS level), \
container (namespaces, cgroups, seccomp; the host kernel is shared), kernel (a user-space \
kernel or an emulated VM between the code and the host kernel), vm (hardware \
virtualisation). Set min_isolation (the floor) to the weakest tier you accept; a call that no \
available provider can meet is refused as `not dispatched (isolation)` and nothing runs. Any \
`not dispatched` error means nothing ran and a retry is safe; any other error means the code \
may have run. Every result states its provider and isolation and carries SHA-256 digests of \
the request, the result and the run record. \
To keep state across calls, open a session (open_session, at container or above): run_cell \
runs code in one interpreter whose variables, imports and functions carry on from cell to \
cell (state_kept), run_session_steps runs shell commands and write_session_file and \
read_session_file move files, all in the session's one sandbox and its /work; close_session \
ends it. A session ends by itself when idle or at its lifetime; a refusal coded \
session_ended means: open a new one; interpreter_ended means: send the cell with \
restart=true. \
A python session at a provider that can save one (runsc) can be saved whole: \
snapshot_session saves it (it goes on), open_snapshot opens a new session restored from a \
snapshot, fork_session makes several new sessions from it at once; each such session says \
where it came from (origin: restored or forked, the parent session, the parent's call \
count) and its calls go on from the parent's chain. list_snapshots and delete_snapshot \
manage them; a session that cannot be saved is refused `not dispatched (unsupported)`.";

/// The MCP server: `run_code`, `run_project`, `list_providers`, the session tools
/// (`open_session`, `run_cell`, `run_session_steps`, `write_session_file`,
/// `read_session_file`, `close_session`, `list_sessions`) and the snapshot tools
/// (`snapshot_session`, `fork_session`, `open_snapshot`, `list_snapshots`,
/// `delete_snapshot`) over one backend.
#[derive(Debug, Clone)]
pub struct PlimsollMcp {
    backend: Arc<dyn Backend>,
    tool_router: ToolRouter<Self>,
}

/// The caller a transport attached to this request, if any.
fn caller_of(ext: &Extensions) -> Option<String> {
    if let Some(Caller(name)) = ext.get::<Caller>() {
        return Some(name.clone());
    }
    ext.get::<http::request::Parts>()
        .and_then(|p| p.extensions.get::<Caller>())
        .map(|Caller(name)| name.clone())
}

fn ok(structured: Value, text: String) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
    r.structured_content = Some(structured);
    r
}

/// A tool's answer: `render` of what the backend gave, or the error it said.
fn answer<T>(
    result: Result<T, BackendError>,
    render: impl FnOnce(&T) -> (Value, String),
) -> CallToolResult {
    match result {
        Ok(value) => {
            let (v, text) = render(&value);
            ok(v, text)
        }
        Err(e) => failed(&e),
    }
}

fn failed(e: &BackendError) -> CallToolResult {
    let (structured, text) = render::error(e);
    let mut r = CallToolResult::error(vec![ContentBlock::text(text)]);
    r.structured_content = Some(structured);
    r
}

/// Arguments that made no request: refused, nothing sent. An id no session (or snapshot)
/// can have is answered as the engine answers an unknown one.
fn bad_args(e: &ArgsError) -> CallToolResult {
    let code = match e {
        ArgsError::SessionId(..) => Some("session_not_found".to_owned()),
        ArgsError::SnapshotId(..) => Some("snapshot_not_found".to_owned()),
        _ => None,
    };
    failed(&BackendError::NotDispatched {
        reason: plimsoll_wire::Reason::Request,
        code,
        end_reason: None,
        message: e.to_string(),
    })
}

/// Runs blocking backend work off the async threads. A panic there is a failure after the
/// code may have started.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, BackendError> + Send + 'static,
) -> Result<T, BackendError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|join| {
        Err(BackendError::MayHaveRun {
            message: format!("the server failed while handling the call ({join})"),
        })
    })
}

#[tool_router(router = tool_router)]
impl PlimsollMcp {
    /// A server over `backend`, showing at most [`render::DEFAULT_OUTPUT_CAP`] bytes per
    /// output stream.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        PlimsollMcp {
            backend,
            tool_router: Self::tool_router(),
        }
    }

    async fn run(
        &self,
        caller: Option<String>,
        options: plimsoll_client::RunOptions,
    ) -> CallToolResult {
        let backend = Arc::clone(&self.backend);
        let cap = render::DEFAULT_OUTPUT_CAP;
        match blocking(move || backend.run(caller.as_deref(), options)).await {
            Ok(resp) => {
                let v = render::run_structured(&resp, cap);
                let text = render::run_text(&resp, &v);
                ok(v, text)
            }
            Err(e) => failed(&e),
        }
    }

    /// One call in a session, its answer rendered by `render`.
    async fn session_call(
        &self,
        caller: Option<String>,
        parsed: Result<(&str, SessionCall), ArgsError>,
        render: impl FnOnce(&plimsoll_wire::RunResponse, &SessionCall) -> (Value, String),
    ) -> CallToolResult {
        let (id, call) = match parsed {
            Ok((id, call)) => (id.to_owned(), call),
            Err(e) => return bad_args(&e),
        };
        let backend = Arc::clone(&self.backend);
        let sent = call.clone();
        answer(
            blocking(move || backend.session_call(caller.as_deref(), &id, &call)).await,
            |resp| render(resp, &sent),
        )
    }

    /// A run's rendering, for cells and steps.
    fn as_run(resp: &plimsoll_wire::RunResponse, _: &SessionCall) -> (Value, String) {
        let v = render::run_structured(resp, render::DEFAULT_OUTPUT_CAP);
        let text = render::run_text(resp, &v);
        (v, text)
    }

    /// Runs one snippet.
    #[tool(
        name = "run_code",
        description = "Run a JavaScript or Python snippet in a fresh sandbox and return its stdout, stderr (each capped at 64 KiB for your context, with truncation flags; non-UTF-8 output comes back as base64), exit code, whether it timed out, the provider and isolation tier that ran it, and SHA-256 digests of the request, result and run record. Tiers, weakest first: process < container < kernel < vm; min_isolation is the floor. A tool error starting `not dispatched (REASON)` means nothing ran and retrying is safe; any other error means the code may have run. A timeout is a result (timed_out: true), not an error.",
        annotations(
            title = "Run code in a sandbox",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn run_code(
        &self,
        Parameters(args): Parameters<RunCodeArgs>,
        ext: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(self.run(caller_of(&ext), args.to_options()).await)
    }

    /// Runs a project.
    #[tool(
        name = "run_project",
        description = "Write files under /work in a fresh sandbox, run shell steps in order (the first failing step stops the run), and return each step's exit code and output, the last step's stdout and stderr (capped at 64 KiB per stream, with truncation flags), the artifacts asked for (capped likewise), the provider and isolation tier, and SHA-256 digests of the request, result and run record. Tiers, weakest first: process < container < kernel < vm; min_isolation is the floor (shell steps need container or higher: the process tier runs snippets only). A tool error starting `not dispatched (REASON)` means nothing ran and retrying is safe; any other error means the code may have run.",
        annotations(
            title = "Run a project (files and shell steps) in a sandbox",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn run_project(
        &self,
        Parameters(args): Parameters<RunProjectArgs>,
        ext: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        let options = match args.to_options() {
            Ok(o) => o,
            Err(e) => return Ok(bad_args(&e)),
        };
        Ok(self.run(caller_of(&ext), options).await)
    }

    /// Lists providers.
    #[tool(
        name = "list_providers",
        description = "List the sandbox providers this plimsoll offers: each one's name, isolation tier (process < container < kernel < vm), whether it is available now (and why not), and the digest of its evidence; plus the default floor applied when a run sets no min_isolation. Runs nothing.",
        annotations(
            title = "List sandbox providers",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_providers(
        &self,
        Parameters(_args): Parameters<ListProvidersArgs>,
        ext: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        let backend = Arc::clone(&self.backend);
        let caller = caller_of(&ext);
        Ok(answer(
            blocking(move || backend.providers(caller.as_deref())).await,
            render::providers,
        ))
    }

    /// Opens a session.
    #[tool(
        name = "open_session",
        description = "Open a session: one sandbox kept across calls, with an interpreter (python or javascript) whose state (variables, imports, functions) carries on from one run_cell to the next, and a /work directory that run_session_steps, write_session_file and read_session_file share with it. Returns the session_id to pass to those tools, the provider and isolation tier it runs at (measured at open; process < container < kernel < vm; sessions need container or above), the digest of the provider's evidence, and when it expires. min_isolation is the floor. With grant (a profile the operator defined: an API grant, or an egress grant for hosts such as a package index) the session's code may call that API or reach those hosts for the session's whole life, and each call's result lists what it did through the grant since the call before (calls, egress). It ends after idle_timeout_ms without a call or at max_lifetime_ms; close it with close_session when done. A tool error starting `not dispatched (REASON)` means nothing was opened and retrying is safe.",
        annotations(
            title = "Open a sandbox session",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn open_session(
        &self,
        Parameters(args): Parameters<OpenSessionArgs>,
        ext: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        let backend = Arc::clone(&self.backend);
        let caller = caller_of(&ext);
        let options = args.to_options();
        let grant = options.grant.clone();
        Ok(answer(
            blocking(move || backend.open_session(caller.as_deref(), options)).await,
            |info| render::session_opened(info, grant.as_deref()),
        ))
    }

    /// Runs a cell.
    #[tool(
        name = "run_cell",
        description = "Run code in a session's interpreter (open_session first): what earlier cells defined is still there, and what this one defines stays for the next. Returns stdout, stderr (capped at 64 KiB each, with truncation flags; non-UTF-8 as base64), exit code, timed_out, state_kept (true: the interpreter and its state carry on), interpreter_end (present when the interpreter died during this cell: its state is lost, so the next run_cell must set restart=true), the session's provider and isolation tier, the call's sequence number in the session, and SHA-256 digests of the request, result and record. A tool error starting `not dispatched (REASON)` means nothing ran and retrying is safe: its code says why (session_not_found, session_ended: open a new session; interpreter_ended: send the cell with restart=true). Any other error means the code may have run.",
        annotations(
            title = "Run a cell in a sandbox session",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn run_cell(
        &self,
        Parameters(args): Parameters<RunCellArgs>,
        ext: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(self
            .session_call(caller_of(&ext), args.to_call(), Self::as_run)
            .await)
    }

    /// Runs shell steps in a session.
    #[tool(
        name = "run_session_steps",
        description = "Run shell commands in a session's sandbox (open_session first), in order, each by /bin/sh -c in the session's /work (the directory its cells see); the first that fails stops them. Files they write stay for later cells, steps and read_session_file. Returns each command's exit code and output (capped at 64 KiB per stream, with truncation flags), the session's provider and isolation tier, the call's sequence number in the session and SHA-256 digests of the request, result and record. A tool error starting `not dispatched (REASON)` means nothing ran and retrying is safe (its code says why); any other error means the commands may have run.",
        annotations(
            title = "Run shell commands in a sandbox session",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn run_session_steps(
        &self,
        Parameters(args): Parameters<RunSessionStepsArgs>,
        ext: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(self
            .session_call(caller_of(&ext), args.to_call(), Self::as_run)
            .await)
    }

    /// Writes a file into a session.
    #[tool(
        name = "write_session_file",
        description = "Write a file into a session's /work (open_session first), exactly: text in `content`, or any bytes base64-encoded in `content_base64`. Cells and shell steps of the session then see it. Returns the bytes written, the session's provider and isolation tier, the call's sequence number and SHA-256 digests of the request, result and record. A tool error starting `not dispatched (REASON)` means nothing was written and retrying is safe (its code says why).",
        annotations(
            title = "Write a file into a sandbox session",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn write_session_file(
        &self,
        Parameters(args): Parameters<WriteSessionFileArgs>,
        ext: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(self
            .session_call(caller_of(&ext), args.to_call(), |resp, call| {
                let (path, bytes) = match call {
                    SessionCall::Put { path, content } => (path.as_str(), content.len()),
                    _ => ("", 0),
                };
                render::file_written(resp, path, bytes, render::DEFAULT_OUTPUT_CAP)
            })
            .await)
    }

    /// Reads a file from a session.
    #[tool(
        name = "read_session_file",
        description = "Read a file from a session's /work (open_session first). Returns found (false when there is no such file), its size, and its content (UTF-8 text, or base64 for other bytes; capped at 64 KiB for your context, with truncation flags), the session's provider and isolation tier, the call's sequence number and SHA-256 digests of the request, result and record. A tool error starting `not dispatched (REASON)` means nothing was read and retrying is safe (its code says why).",
        annotations(
            title = "Read a file from a sandbox session",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn read_session_file(
        &self,
        Parameters(args): Parameters<ReadSessionFileArgs>,
        ext: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(self
            .session_call(caller_of(&ext), args.to_call(), |resp, call| {
                let path = match call {
                    SessionCall::Get { path } => path.as_str(),
                    _ => "",
                };
                render::file_read(resp, path, render::DEFAULT_OUTPUT_CAP)
            })
            .await)
    }

    /// Closes a session.
    #[tool(
        name = "close_session",
        description = "Close a session: its sandbox, its interpreter's state and its /work are removed, and its id is dead from then on (a later call is refused `session_ended`). Returns how many calls it answered and its last record digest. A tool error starting `not dispatched (REASON)` means nothing changed (code session_not_found: no such session of yours; session_ended: it had already ended).",
        annotations(
            title = "Close a sandbox session",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn close_session(
        &self,
        Parameters(args): Parameters<CloseSessionArgs>,
        ext: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        let id = match crate::args::session_id(&args.session_id) {
            Ok(id) => id.to_owned(),
            Err(e) => return Ok(bad_args(&e)),
        };
        let backend = Arc::clone(&self.backend);
        let caller = caller_of(&ext);
        Ok(answer(
            blocking(move || backend.close_session(caller.as_deref(), &id)).await,
            render::session_closed,
        ))
    }

    /// Lists the caller's sessions.
    #[tool(
        name = "list_sessions",
        description = "List your open sessions: each one's session_id, language, provider and isolation tier, how many calls it answered, whether its interpreter is alive (if not, the next run_cell must set restart=true), its idle timeout and when it expires. Runs nothing.",
        annotations(
            title = "List sandbox sessions",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_sessions(
        &self,
        Parameters(_args): Parameters<ListSessionsArgs>,
        ext: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        let backend = Arc::clone(&self.backend);
        let caller = caller_of(&ext);
        Ok(answer(
            blocking(move || backend.sessions(caller.as_deref())).await,
            render::session_list,
        ))
    }

    /// Takes a snapshot of a session.
    #[tool(
        name = "snapshot_session",
        description = "Save a session whole (its interpreter's memory with every variable, import and function, and its /work) as a snapshot; the session is paused while it is saved, then goes on. Only a python session at a provider that can save one (runsc), opened without a grant, can be saved. Returns the snapshot_id (to pass to open_snapshot or delete_snapshot), its SHA-256 digest, its size in bytes, the session's call count and last record digest when it was taken, and when it expires. A tool error starting `not dispatched (REASON)` means nothing was saved and the session is as it was (unsupported: this session cannot be saved; session_not_found, session_ended: see the message; capacity: delete a snapshot first).",
        annotations(
            title = "Snapshot a sandbox session",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn snapshot_session(
        &self,
        Parameters(args): Parameters<SnapshotSessionArgs>,
        ext: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        let id = match crate::args::session_id(&args.session_id) {
            Ok(id) => id.to_owned(),
            Err(e) => return Ok(bad_args(&e)),
        };
        let backend = Arc::clone(&self.backend);
        let caller = caller_of(&ext);
        Ok(answer(
            blocking(move || backend.snapshot_session(caller.as_deref(), &id)).await,
            render::snapshot_taken,
        ))
    }

    /// Forks a session into copies.
    #[tool(
        name = "fork_session",
        description = "Fork a session into `count` new sessions: it is saved once as a snapshot, and each copy is a new session restored from it, with the session's state (variables, imports, functions, /work) at the fork and fresh randomness of its own; the session itself goes on. Use copies to try several continuations from one state. Only a python session at a provider that can save one (runsc), opened without a grant, can be forked. Returns the copies' session_ids (each used like any session's, and closed with close_session), each copy's origin (forked from this session, after its call N: the copy's calls go on from sequence N+1) and the snapshot (its snapshot_id; it stays until it expires or delete_snapshot removes it). Each copy counts against your session limits. A tool error starting `not dispatched (REASON)` means no copy was made and the session is as it was (unsupported: this session cannot be forked; capacity: too many sessions or snapshots; request: count out of range).",
        annotations(
            title = "Fork a sandbox session",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn fork_session(
        &self,
        Parameters(args): Parameters<ForkSessionArgs>,
        ext: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        let id = match crate::args::session_id(&args.session_id) {
            Ok(id) => id.to_owned(),
            Err(e) => return Ok(bad_args(&e)),
        };
        let backend = Arc::clone(&self.backend);
        let caller = caller_of(&ext);
        let count = args.count;
        Ok(answer(
            blocking(move || backend.fork_session(caller.as_deref(), &id, count)).await,
            |(snapshot, copies)| render::forked(snapshot, copies),
        ))
    }

    /// Opens a session from a snapshot.
    #[tool(
        name = "open_snapshot",
        description = "Open a new session restored from a snapshot (from snapshot_session, fork_session or list_snapshots): its interpreter's state and /work are the snapshotted session's when it was taken, with fresh randomness, at the same provider and isolation tier. Returns its new session_id (used like any session's; close_session when done) and its origin: restored from that session, after its call N (its calls go on from sequence N+1), with the snapshot's digest. The snapshot stays, and can be opened again. A tool error starting `not dispatched (REASON)` means nothing was opened (snapshot_not_found: no such snapshot of yours, it expired or was deleted; capacity: too many sessions).",
        annotations(
            title = "Open a session from a snapshot",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn open_snapshot(
        &self,
        Parameters(args): Parameters<OpenSnapshotArgs>,
        ext: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        let id = match crate::args::snapshot_id(&args.snapshot_id) {
            Ok(id) => id.to_owned(),
            Err(e) => return Ok(bad_args(&e)),
        };
        let backend = Arc::clone(&self.backend);
        let caller = caller_of(&ext);
        let shown = id.clone();
        Ok(answer(
            blocking(move || backend.open_snapshot(caller.as_deref(), &id)).await,
            |info| render::snapshot_opened(info, &shown),
        ))
    }

    /// Lists the caller's snapshots.
    #[tool(
        name = "list_snapshots",
        description = "List your snapshots, oldest first: each one's snapshot_id, the session it was taken of and that session's call count then, its provider, isolation tier and language, its digest and size, and when it expires. Runs nothing.",
        annotations(
            title = "List session snapshots",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_snapshots(
        &self,
        Parameters(_args): Parameters<ListSnapshotsArgs>,
        ext: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        let backend = Arc::clone(&self.backend);
        let caller = caller_of(&ext);
        Ok(answer(
            blocking(move || backend.snapshots(caller.as_deref())).await,
            render::snapshot_list,
        ))
    }

    /// Deletes a snapshot.
    #[tool(
        name = "delete_snapshot",
        description = "Delete a snapshot: its files are removed and it cannot be opened again (sessions already opened or forked from it go on). Returns what it was. A tool error starting `not dispatched (REASON)` means nothing was deleted (snapshot_not_found: no such snapshot of yours, or it already expired or was deleted).",
        annotations(
            title = "Delete a session snapshot",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn delete_snapshot(
        &self,
        Parameters(args): Parameters<DeleteSnapshotArgs>,
        ext: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        let id = match crate::args::snapshot_id(&args.snapshot_id) {
            Ok(id) => id.to_owned(),
            Err(e) => return Ok(bad_args(&e)),
        };
        let backend = Arc::clone(&self.backend);
        let caller = caller_of(&ext);
        Ok(answer(
            blocking(move || backend.delete_snapshot(caller.as_deref(), &id)).await,
            render::snapshot_deleted,
        ))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for PlimsollMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("plimsoll", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use plimsoll_client::{RunOptions, SessionOptions};
    use plimsoll_wire::{
        EndReason, Language, PROTOCOL, ProvidersResponse, Reason, RunRecord, RunResponse,
        RunResult, SessionInfo, SessionLink, SessionList, SessionOrigin, SessionStart,
        SnapshotInfo, SnapshotList, Tier, Wall,
    };

    use crate::args::{
        DeleteSnapshotArgs, ForkSessionArgs, ListSnapshotsArgs, OpenSnapshotArgs,
        SnapshotSessionArgs,
    };
    use serde_json::json;

    use super::*;

    /// A fake session: its owner, its calls, why it ended.
    type Kept = (String, u64, Option<EndReason>);

    /// Sessions kept by caller as the engine keeps them (another caller's id is not found, an
    /// ended one is refused with its end reason), answering each call with its chain link.
    #[derive(Debug, Default)]
    struct Fake {
        /// id → (caller, calls, ended).
        sessions: Mutex<HashMap<String, Kept>>,
        /// Calls that reached the backend.
        calls: Mutex<Vec<(Option<String>, String, SessionCall)>>,
        /// The options of every open that reached the backend.
        opened: Mutex<Vec<SessionOptions>>,
        /// Where each restored or forked session came from.
        origins: Mutex<HashMap<String, SessionOrigin>>,
        /// id → (caller, the snapshot).
        snapshots: Mutex<HashMap<String, (String, SnapshotInfo)>>,
        /// Snapshot, fork and open-snapshot operations that reached the backend.
        snapshot_ops: Mutex<Vec<String>>,
    }

    /// A session the fake cannot save (as the engine refuses a JavaScript session's).
    const JS_ID: &str = "ses_0123456789abcdef_ffeeddccbbaa99887766554433221100";
    /// A snapshot id no snapshot of the fake has.
    const SNAP: &str = "snp_0123456789abcdef_ffffffffffffffffffffffffffffffff";

    fn snapshot_not_found() -> BackendError {
        BackendError::NotDispatched {
            reason: Reason::Request,
            code: Some("snapshot_not_found".into()),
            end_reason: None,
            message: "no such snapshot of this caller".into(),
        }
    }

    impl Fake {
        /// The session `id` of `caller`, open: its call count.
        fn open_calls(&self, caller: &str, id: &str) -> Result<u64, BackendError> {
            match self.sessions.lock().unwrap().get(id) {
                Some((owner, calls, None)) if owner == caller => Ok(*calls),
                _ => Err(not_found()),
            }
        }

        fn session_info(&self, id: &str) -> SessionInfo {
            let (_, calls, ended) = self.sessions.lock().unwrap()[id].clone();
            SessionInfo {
                origin: self.origins.lock().unwrap().get(id).cloned(),
                last_record_sha256: (calls > 0).then(|| "c".repeat(64)),
                ..info(id, calls, ended)
            }
        }

        /// A new session of `caller` restored from `snap`.
        fn restore(&self, caller: &str, snap: &SnapshotInfo, start: SessionStart) -> SessionInfo {
            let n = self.sessions.lock().unwrap().len();
            let id = format!("ses_0123456789abcdef_{n:032x}");
            self.sessions
                .lock()
                .unwrap()
                .insert(id.clone(), (caller.into(), snap.calls, None));
            self.origins.lock().unwrap().insert(
                id.clone(),
                SessionOrigin {
                    start,
                    snapshot_sha256: snap.sha256.clone(),
                    parent_session_id: snap.session_id.clone(),
                    parent_record_sha256: snap.last_record_sha256.clone(),
                    parent_calls: snap.calls,
                },
            );
            self.session_info(&id)
        }

        fn take(&self, caller: &str, id: &str) -> Result<SnapshotInfo, BackendError> {
            let calls = self.open_calls(caller, id)?;
            if id == JS_ID {
                return Err(BackendError::NotDispatched {
                    reason: Reason::Unsupported,
                    code: Some("unsupported".into()),
                    end_reason: None,
                    message: "a JavaScript session cannot be snapshotted or forked".into(),
                });
            }
            let n = self.snapshots.lock().unwrap().len();
            let snap = SnapshotInfo {
                protocol: PROTOCOL,
                request_id: Some(format!("s-{n}")),
                snapshot_id: format!("snp_0123456789abcdef_{:032x}", n + 10),
                session_id: id.into(),
                sha256: "5".repeat(64),
                bytes: 4096,
                provider: "runsc".into(),
                isolation: Tier::Kernel,
                language: Language::Python,
                calls,
                last_record_sha256: (calls > 0).then(|| "c".repeat(64)),
                checkpoint_ms: 12,
                created_unix_ms: 1_000 + n as u64,
                expires_unix_ms: 3_601_000,
            };
            self.snapshots
                .lock()
                .unwrap()
                .insert(snap.snapshot_id.clone(), (caller.into(), snap.clone()));
            Ok(snap)
        }

        fn snapshot_of(&self, caller: &str, id: &str) -> Result<SnapshotInfo, BackendError> {
            match self.snapshots.lock().unwrap().get(id) {
                Some((owner, snap)) if owner == caller => Ok(snap.clone()),
                _ => Err(snapshot_not_found()),
            }
        }
    }

    const ID: &str = "ses_0123456789abcdef_00112233445566778899aabbccddeeff";

    fn info(id: &str, calls: u64, end_reason: Option<EndReason>) -> SessionInfo {
        SessionInfo {
            image: None,
            protocol: PROTOCOL,
            request_id: None,
            session_id: id.into(),
            language: Language::Python,
            provider: "crun".into(),
            isolation: Tier::Container,
            minimum_isolation: Tier::Container,
            evidence_sha256: "e".repeat(64),
            environment: "image".into(),
            wall: Wall::default(),
            opened_unix_ms: 0,
            expires_unix_ms: 3_600_000,
            idle_timeout_ms: 300_000,
            calls,
            last_record_sha256: None,
            interpreter_alive: true,
            end_reason,
            origin: None,
        }
    }

    fn not_found() -> BackendError {
        BackendError::NotDispatched {
            reason: Reason::Request,
            code: Some("session_not_found".into()),
            end_reason: None,
            message: "no such session of this caller".into(),
        }
    }

    impl Backend for Fake {
        fn run(&self, _: Option<&str>, _: RunOptions) -> Result<RunResponse, BackendError> {
            Err(BackendError::MayHaveRun {
                message: "not dispatched (isolation): a message is not a mark".into(),
            })
        }
        fn providers(&self, _: Option<&str>) -> Result<ProvidersResponse, BackendError> {
            Err(BackendError::refused(Reason::Environment, "none"))
        }
        fn open_session(
            &self,
            caller: Option<&str>,
            options: SessionOptions,
        ) -> Result<SessionInfo, BackendError> {
            self.opened.lock().unwrap().push(options);
            self.sessions
                .lock()
                .unwrap()
                .insert(ID.into(), (caller.unwrap_or("local").into(), 0, None));
            Ok(info(ID, 0, None))
        }
        fn session_call(
            &self,
            caller: Option<&str>,
            id: &str,
            call: &SessionCall,
        ) -> Result<RunResponse, BackendError> {
            let caller = caller.unwrap_or("local");
            self.calls
                .lock()
                .unwrap()
                .push((Some(caller.into()), id.into(), call.clone()));
            let mut sessions = self.sessions.lock().unwrap();
            let Some((owner, calls, ended)) = sessions.get_mut(id) else {
                return Err(not_found());
            };
            if owner != caller {
                return Err(not_found());
            }
            if let Some(end) = ended {
                return Err(BackendError::NotDispatched {
                    reason: Reason::Request,
                    code: Some("session_ended".into()),
                    end_reason: Some(*end),
                    message: format!("session {id} has ended ({end})"),
                });
            }
            *calls += 1;
            let stdout = match call {
                SessionCall::Cell { code, .. } => code.clone().into_bytes(),
                _ => Vec::new(),
            };
            Ok(RunResponse {
                protocol: PROTOCOL,
                request_id: format!("r-{calls}"),
                provider: "crun".into(),
                isolation: Tier::Container,
                duration_ms: 1,
                request_sha256: "a".repeat(64),
                result_sha256: "b".repeat(64),
                result: RunResult {
                    exit_code: Some(0),
                    stdout: stdout.into(),
                    state_kept: matches!(call, SessionCall::Cell { .. }).then_some(true),
                    ..RunResult::default()
                },
                record: RunRecord {
                    image: None,
                    trials: Vec::new(),
                    request_id: format!("r-{calls}"),
                    request_sha256: "a".repeat(64),
                    result_sha256: "b".repeat(64),
                    provider: "crun".into(),
                    isolation: Tier::Container,
                    minimum_isolation: Some(Tier::Container),
                    evidence_sha256: "e".repeat(64),
                    environment: "image".into(),
                    started_unix_ms: 0,
                    ended_unix_ms: 1,
                    record_sha256: "c".repeat(64),
                    session: Some(SessionLink {
                        session_id: id.into(),
                        sequence: *calls,
                        previous_record_sha256: (*calls > 1).then(|| "c".repeat(64)),
                        origin: self.origins.lock().unwrap().get(id).cloned(),
                    }),
                },
            })
        }
        fn close_session(
            &self,
            caller: Option<&str>,
            id: &str,
        ) -> Result<SessionInfo, BackendError> {
            let mut sessions = self.sessions.lock().unwrap();
            match sessions.get_mut(id) {
                Some((owner, calls, ended @ None)) if owner == caller.unwrap_or("local") => {
                    *ended = Some(EndReason::Closed);
                    Ok(info(id, *calls, Some(EndReason::Closed)))
                }
                _ => Err(not_found()),
            }
        }
        fn sessions(&self, caller: Option<&str>) -> Result<SessionList, BackendError> {
            let open: Vec<String> = self
                .sessions
                .lock()
                .unwrap()
                .iter()
                .filter(|(_, (owner, _, ended))| {
                    owner == caller.unwrap_or("local") && ended.is_none()
                })
                .map(|(id, _)| id.clone())
                .collect();
            Ok(SessionList {
                protocol: PROTOCOL,
                sessions: open.iter().map(|id| self.session_info(id)).collect(),
            })
        }
        fn snapshot_session(
            &self,
            caller: Option<&str>,
            id: &str,
        ) -> Result<SnapshotInfo, BackendError> {
            self.snapshot_ops
                .lock()
                .unwrap()
                .push(format!("snapshot {id}"));
            self.take(caller.unwrap_or("local"), id)
        }
        fn fork_session(
            &self,
            caller: Option<&str>,
            id: &str,
            count: u32,
        ) -> Result<(SnapshotInfo, Vec<SessionInfo>), BackendError> {
            self.snapshot_ops
                .lock()
                .unwrap()
                .push(format!("fork {id} {count}"));
            let caller = caller.unwrap_or("local");
            let snap = self.take(caller, id)?;
            let copies = (0..count)
                .map(|_| self.restore(caller, &snap, SessionStart::Forked))
                .collect();
            Ok((snap, copies))
        }
        fn open_snapshot(
            &self,
            caller: Option<&str>,
            id: &str,
        ) -> Result<SessionInfo, BackendError> {
            self.snapshot_ops.lock().unwrap().push(format!("open {id}"));
            let caller = caller.unwrap_or("local");
            let snap = self.snapshot_of(caller, id)?;
            Ok(self.restore(caller, &snap, SessionStart::Restored))
        }
        fn snapshots(&self, caller: Option<&str>) -> Result<SnapshotList, BackendError> {
            let mut snapshots: Vec<SnapshotInfo> = self
                .snapshots
                .lock()
                .unwrap()
                .values()
                .filter(|(owner, _)| owner == caller.unwrap_or("local"))
                .map(|(_, s)| SnapshotInfo {
                    request_id: None,
                    ..s.clone()
                })
                .collect();
            snapshots.sort_by_key(|s| s.created_unix_ms);
            Ok(SnapshotList {
                protocol: PROTOCOL,
                snapshots,
            })
        }
        fn delete_snapshot(
            &self,
            caller: Option<&str>,
            id: &str,
        ) -> Result<SnapshotInfo, BackendError> {
            self.snapshot_ops
                .lock()
                .unwrap()
                .push(format!("delete {id}"));
            let snap = self.snapshot_of(caller.unwrap_or("local"), id)?;
            self.snapshots.lock().unwrap().remove(id);
            Ok(snap)
        }
    }

    fn as_caller(name: &str) -> Extensions {
        let mut ext = Extensions::new();
        ext.insert(Caller(name.into()));
        ext
    }

    fn text(r: &CallToolResult) -> String {
        r.content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect()
    }

    fn cell(code: &str) -> Parameters<RunCellArgs> {
        Parameters(RunCellArgs {
            session_id: ID.into(),
            code: code.into(),
            restart: false,
            timeout_ms: None,
        })
    }

    #[test]
    fn every_tool_is_listed_with_a_schema() {
        let tools = PlimsollMcp::tool_router().list_all();
        let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "close_session",
                "delete_snapshot",
                "fork_session",
                "list_providers",
                "list_sessions",
                "list_snapshots",
                "open_session",
                "open_snapshot",
                "read_session_file",
                "run_cell",
                "run_code",
                "run_project",
                "run_session_steps",
                "snapshot_session",
                "write_session_file"
            ]
        );
        for t in &tools {
            let schema = serde_json::to_string(&t.input_schema).unwrap();
            if t.name.contains("session") || t.name == "run_cell" {
                let desc = t.description.as_deref().unwrap_or("");
                assert!(
                    t.name == "list_sessions"
                        || schema.contains("session_id")
                        || t.name == "open_session",
                    "{}: {schema}",
                    t.name
                );
                assert!(
                    t.name == "list_sessions" || desc.contains("not dispatched"),
                    "{}: {desc}",
                    t.name
                );
            }
            if t.name.contains("snapshot") && t.name != "snapshot_session" {
                let desc = t.description.as_deref().unwrap_or("");
                assert!(
                    t.name == "list_snapshots" || schema.contains("snapshot_id"),
                    "{}: {schema}",
                    t.name
                );
                assert!(
                    t.name == "list_snapshots" || desc.contains("snapshot_not_found"),
                    "{}: {desc}",
                    t.name
                );
            }
        }
        // A fork's count is at least one in the schema a model sees.
        let fork = tools.iter().find(|t| t.name == "fork_session").unwrap();
        let schema = serde_json::to_value(&fork.input_schema).unwrap();
        assert_eq!(schema["properties"]["count"]["minimum"], 1, "{schema}");
        assert_eq!(
            schema["required"],
            json!(["session_id", "count"]),
            "{schema}"
        );
    }

    fn opened_by(fake: &Fake, caller: &str, id: &str) {
        fake.sessions
            .lock()
            .unwrap()
            .insert(id.into(), (caller.into(), 0, None));
    }

    #[tokio::test]
    async fn a_fork_and_a_restore_say_where_they_came_from_and_go_on_from_its_chain() {
        let fake = Arc::new(Fake::default());
        let server = PlimsollMcp::new(Arc::clone(&fake) as Arc<dyn Backend>);
        opened_by(&fake, "alice", ID);
        let r = server
            .run_cell(cell("x = 41"), as_caller("alice"))
            .await
            .unwrap();
        assert_ne!(r.is_error, Some(true), "{}", text(&r));

        let r = server
            .fork_session(
                Parameters(ForkSessionArgs {
                    session_id: ID.into(),
                    count: 2,
                }),
                as_caller("alice"),
            )
            .await
            .unwrap();
        assert_ne!(r.is_error, Some(true), "{}", text(&r));
        let v = r.structured_content.clone().unwrap();
        let copies: Vec<String> = v["session_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap().to_owned())
            .collect();
        assert_eq!(copies.len(), 2, "{v}");
        assert!(!copies.contains(&ID.to_owned()), "{v}");
        assert_eq!(
            (&v["status"], &v["session_id"]),
            (&json!("forked"), &json!(ID))
        );
        assert_eq!(
            (
                &v["snapshot"]["session_id"],
                &v["snapshot"]["calls"],
                &v["snapshot"]["sha256"]
            ),
            (&json!(ID), &json!(1), &json!("5".repeat(64)))
        );
        for (i, c) in copies.iter().enumerate() {
            let s = &v["sessions"][i];
            assert_eq!(s["session_id"], c.as_str());
            assert_eq!(
                s["origin"],
                json!({"start": "forked", "snapshot_sha256": "5".repeat(64),
                       "parent_session_id": ID, "parent_record_sha256": "c".repeat(64),
                       "parent_calls": 1}),
                "{v}"
            );
        }
        let t = text(&r);
        assert!(
            t.starts_with(&format!("forked session {ID} into 2 new session(s)")),
            "{t}"
        );
        assert!(
            t.contains(&copies[0])
                && t.contains(&copies[1])
                && t.contains(&format!("forked from session {ID} after its call 1")),
            "{t}"
        );
        assert_eq!(
            fake.snapshot_ops.lock().unwrap().as_slice(),
            [format!("fork {ID} 2")]
        );

        // A copy is used as any session, and each of its results says where it came from.
        let mut on_copy = cell("print(x + 1)");
        on_copy.0.session_id = copies[1].clone();
        let r = server.run_cell(on_copy, as_caller("alice")).await.unwrap();
        assert_ne!(r.is_error, Some(true), "{}", text(&r));
        let v = r.structured_content.clone().unwrap();
        assert_eq!(v["session"]["sequence"], 2, "{v}");
        assert_eq!(v["session"]["origin"]["start"], "forked", "{v}");
        assert_eq!(v["session"]["origin"]["parent_session_id"], ID, "{v}");
        let t = text(&r);
        assert!(
            t.contains(&format!(
                "forked from session {ID} after its call 1 (snapshot sha256 {})",
                "5".repeat(64)
            )) && t.contains("from sequence 2"),
            "{t}"
        );
        // The parent's own results say nothing of an origin.
        let r = server
            .run_cell(cell("x"), as_caller("alice"))
            .await
            .unwrap();
        let v = r.structured_content.clone().unwrap();
        assert!(v["session"].get("origin").is_none(), "{v}");
        assert!(!text(&r).contains("forked"), "{}", text(&r));

        // A snapshot of the parent, now at its call 2; a session opened from it.
        let r = server
            .snapshot_session(
                Parameters(SnapshotSessionArgs {
                    session_id: ID.into(),
                }),
                as_caller("alice"),
            )
            .await
            .unwrap();
        assert_ne!(r.is_error, Some(true), "{}", text(&r));
        let snap = r.structured_content.clone().unwrap();
        assert_eq!(
            (&snap["status"], &snap["session_id"], &snap["calls"]),
            (&json!("taken"), &json!(ID), &json!(2))
        );
        assert_eq!(
            (&snap["bytes"], &snap["provider"], &snap["isolation"]),
            (&json!(4096), &json!("runsc"), &json!("kernel"))
        );
        let snapshot_id = snap["snapshot_id"].as_str().unwrap().to_owned();
        let t = text(&r);
        assert!(
            t.starts_with(&format!(
                "took snapshot {snapshot_id} of session {ID} after its call 2"
            )) && t.contains("goes on")
                && t.contains("open_snapshot"),
            "{t}"
        );

        let r = server
            .open_snapshot(
                Parameters(OpenSnapshotArgs {
                    snapshot_id: snapshot_id.clone(),
                }),
                as_caller("alice"),
            )
            .await
            .unwrap();
        assert_ne!(r.is_error, Some(true), "{}", text(&r));
        let v = r.structured_content.clone().unwrap();
        let restored = v["session_id"].as_str().unwrap().to_owned();
        assert!(restored != ID && !copies.contains(&restored), "{v}");
        assert_eq!(
            (&v["status"], &v["snapshot_id"], &v["calls"]),
            (&json!("open"), &json!(snapshot_id), &json!(2))
        );
        assert_eq!(
            v["origin"],
            json!({"start": "restored", "snapshot_sha256": "5".repeat(64),
                   "parent_session_id": ID, "parent_record_sha256": "c".repeat(64),
                   "parent_calls": 2}),
            "{v}"
        );
        let t = text(&r);
        assert!(
            t.starts_with(&format!(
                "opened session {restored} (python) from snapshot {snapshot_id}"
            )) && t.contains(&format!(
                "restored from a snapshot of session {ID} after its call 2"
            )),
            "{t}"
        );
        // list_sessions says it too.
        let listed = server
            .list_sessions(Parameters(ListSessionsArgs {}), as_caller("alice"))
            .await
            .unwrap();
        assert!(
            text(&listed).contains(&format!(
                "restored from a snapshot of session {ID} after its call 2"
            )),
            "{}",
            text(&listed)
        );
    }

    #[tokio::test]
    async fn snapshots_are_their_caller_s_and_their_refusals_say_nothing_ran() {
        let fake = Arc::new(Fake::default());
        let server = PlimsollMcp::new(Arc::clone(&fake) as Arc<dyn Backend>);
        opened_by(&fake, "alice", ID);
        opened_by(&fake, "alice", JS_ID);
        let snapshot = |id: &str, caller: &str| {
            server.snapshot_session(
                Parameters(SnapshotSessionArgs {
                    session_id: id.into(),
                }),
                as_caller(caller),
            )
        };
        let first = snapshot(ID, "alice").await.unwrap();
        let second = snapshot(ID, "alice").await.unwrap();
        let ids: Vec<String> = [&first, &second]
            .iter()
            .map(|r| {
                r.structured_content.as_ref().unwrap()["snapshot_id"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();

        let list = |caller: &str| {
            server.list_snapshots(Parameters(ListSnapshotsArgs {}), as_caller(caller))
        };
        let r = list("alice").await.unwrap();
        let listed: Vec<&str> = r.structured_content.as_ref().unwrap()["snapshots"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["snapshot_id"].as_str().unwrap())
            .collect();
        assert_eq!(listed, [ids[0].as_str(), ids[1].as_str()]);
        assert!(
            text(&r).starts_with(&format!(
                "2 snapshot(s)\nsnapshot {} of session {ID} after its call 0: python on provider runsc at isolation kernel, 4096 bytes",
                ids[0]
            )),
            "{}",
            text(&r)
        );
        let r = list("mallory").await.unwrap();
        assert_eq!(r.structured_content.unwrap()["snapshots"], json!([]));

        // Another caller's snapshot is not found, as an unknown one; nothing was restored.
        let open = |id: &str, caller: &str| {
            server.open_snapshot(
                Parameters(OpenSnapshotArgs {
                    snapshot_id: id.into(),
                }),
                as_caller(caller),
            )
        };
        for (id, caller) in [(ids[0].as_str(), "mallory"), (SNAP, "alice")] {
            let r = open(id, caller).await.unwrap();
            assert_eq!(r.is_error, Some(true), "{}", text(&r));
            let t = text(&r);
            assert!(
                t.starts_with("not dispatched (request): nothing ran")
                    && t.contains("Code snapshot_not_found.")
                    && t.contains("list_snapshots"),
                "{t}"
            );
            let v = r.structured_content.unwrap();
            assert_eq!(
                (&v["code"], &v["nothing_ran"]),
                (&json!("snapshot_not_found"), &json!(true))
            );
        }
        let theirs = server
            .delete_snapshot(
                Parameters(DeleteSnapshotArgs {
                    snapshot_id: ids[0].clone(),
                }),
                as_caller("mallory"),
            )
            .await
            .unwrap();
        assert_eq!(
            theirs.structured_content.unwrap()["code"],
            "snapshot_not_found"
        );

        // Deleted: gone from the list, and opening it is refused.
        let r = server
            .delete_snapshot(
                Parameters(DeleteSnapshotArgs {
                    snapshot_id: ids[0].clone(),
                }),
                as_caller("alice"),
            )
            .await
            .unwrap();
        assert_ne!(r.is_error, Some(true), "{}", text(&r));
        let v = r.structured_content.clone().unwrap();
        assert_eq!(
            (&v["status"], &v["snapshot_id"]),
            (&json!("deleted"), &json!(ids[0]))
        );
        assert!(
            text(&r).starts_with(&format!("deleted snapshot {} of session {ID}", ids[0])),
            "{}",
            text(&r)
        );
        let r = list("alice").await.unwrap();
        assert_eq!(
            r.structured_content.unwrap()["snapshots"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
        let r = open(&ids[0], "alice").await.unwrap();
        assert_eq!(r.structured_content.unwrap()["code"], "snapshot_not_found");

        // A session that cannot be saved: refused unsupported, with the backend's code.
        for r in [
            snapshot(JS_ID, "alice").await.unwrap(),
            server
                .fork_session(
                    Parameters(ForkSessionArgs {
                        session_id: JS_ID.into(),
                        count: 1,
                    }),
                    as_caller("alice"),
                )
                .await
                .unwrap(),
        ] {
            assert_eq!(r.is_error, Some(true), "{}", text(&r));
            let t = text(&r);
            assert!(
                t.starts_with("not dispatched (unsupported): nothing ran")
                    && t.contains("Code unsupported."),
                "{t}"
            );
            let v = r.structured_content.unwrap();
            assert_eq!(
                (&v["code"], &v["reason"], &v["retry_safe"]),
                (&json!("unsupported"), &json!("unsupported"), &json!(true))
            );
        }
        // Another caller's session is not found.
        let r = snapshot(ID, "mallory").await.unwrap();
        assert_eq!(r.structured_content.unwrap()["code"], "session_not_found");
    }

    #[tokio::test]
    async fn a_snapshot_or_session_id_that_cannot_be_one_never_reaches_the_backend() {
        let fake = Arc::new(Fake::default());
        let server = PlimsollMcp::new(Arc::clone(&fake) as Arc<dyn Backend>);
        opened_by(&fake, "local", ID);
        let bad_snapshots = [
            format!("{SNAP}/sessions"),
            ID.to_owned(),
            "snp_../../v1/runs".to_owned(),
            String::new(),
        ];
        for bad in &bad_snapshots {
            for r in [
                server
                    .open_snapshot(
                        Parameters(OpenSnapshotArgs {
                            snapshot_id: bad.clone(),
                        }),
                        Extensions::new(),
                    )
                    .await
                    .unwrap(),
                server
                    .delete_snapshot(
                        Parameters(DeleteSnapshotArgs {
                            snapshot_id: bad.clone(),
                        }),
                        Extensions::new(),
                    )
                    .await
                    .unwrap(),
            ] {
                assert!(
                    text(&r).starts_with("not dispatched (request): nothing ran"),
                    "{bad}: {}",
                    text(&r)
                );
                assert_eq!(
                    r.structured_content.unwrap()["code"],
                    "snapshot_not_found",
                    "{bad}"
                );
            }
        }
        let bad_session = format!("{ID}/snapshot");
        let r = server
            .snapshot_session(
                Parameters(SnapshotSessionArgs {
                    session_id: bad_session.clone(),
                }),
                Extensions::new(),
            )
            .await
            .unwrap();
        assert_eq!(r.structured_content.unwrap()["code"], "session_not_found");
        let r = server
            .fork_session(
                Parameters(ForkSessionArgs {
                    session_id: bad_session,
                    count: 2,
                }),
                Extensions::new(),
            )
            .await
            .unwrap();
        assert_eq!(r.structured_content.unwrap()["code"], "session_not_found");
        assert!(
            fake.snapshot_ops.lock().unwrap().is_empty(),
            "{:?}",
            fake.snapshot_ops.lock().unwrap()
        );
    }

    #[tokio::test]
    async fn a_session_is_its_caller_s_and_its_refusals_say_nothing_ran() {
        let fake = Arc::new(Fake::default());
        let server = PlimsollMcp::new(Arc::clone(&fake) as Arc<dyn Backend>);
        let opened = server
            .open_session(
                Parameters(OpenSessionArgs {
                    image: None,
                    language: crate::args::LanguageArg::Python,
                    min_isolation: Some(crate::args::TierArg::Container),
                    provider: None,
                    grant: Some("pkgs".into()),
                    idle_timeout_ms: None,
                    max_lifetime_ms: None,
                }),
                as_caller("alice"),
            )
            .await
            .unwrap();
        let s = opened.structured_content.clone().unwrap();
        assert_eq!(
            (&s["session_id"], &s["isolation"], &s["provider"]),
            (&json!(ID), &json!("container"), &json!("crun"))
        );
        assert_eq!(s["evidence_sha256"], "e".repeat(64));
        // The grant goes to the backend with the open, and the answer says the session holds it.
        assert_eq!(
            fake.opened.lock().unwrap()[0].grant.as_deref(),
            Some("pkgs")
        );
        assert_eq!(s["grant"], "pkgs");
        assert!(
            text(&opened).contains("holds grant pkgs for its whole life"),
            "{}",
            text(&opened)
        );

        for (i, code) in ["x = 41", "print(x + 1)"].into_iter().enumerate() {
            let r = server
                .run_cell(cell(code), as_caller("alice"))
                .await
                .unwrap();
            assert_ne!(r.is_error, Some(true), "{}", text(&r));
            let v = r.structured_content.unwrap();
            assert_eq!(v["session"]["sequence"], i + 1);
            assert_eq!(v["session"]["session_id"], ID);
            assert_eq!(v["state_kept"], true);
            assert_eq!(v["isolation"], "container");
        }

        // Another caller's session id is not found, and nothing of it ran.
        let r = server
            .run_cell(cell("1"), as_caller("mallory"))
            .await
            .unwrap();
        assert_eq!(r.is_error, Some(true));
        assert!(
            text(&r).starts_with("not dispatched (request): nothing ran"),
            "{}",
            text(&r)
        );
        assert_eq!(r.structured_content.unwrap()["code"], "session_not_found");
        let listed = server
            .list_sessions(Parameters(ListSessionsArgs {}), as_caller("mallory"))
            .await
            .unwrap();
        assert_eq!(listed.structured_content.unwrap()["sessions"], json!([]));
        let listed = server
            .list_sessions(Parameters(ListSessionsArgs {}), as_caller("alice"))
            .await
            .unwrap();
        assert_eq!(
            listed.structured_content.unwrap()["sessions"][0]["session_id"],
            ID
        );

        let closed = server
            .close_session(
                Parameters(CloseSessionArgs {
                    session_id: ID.into(),
                }),
                as_caller("alice"),
            )
            .await
            .unwrap();
        assert_eq!(closed.structured_content.unwrap()["end_reason"], "closed");
        let r = server
            .run_cell(cell("x"), as_caller("alice"))
            .await
            .unwrap();
        assert_eq!(r.is_error, Some(true));
        let t = text(&r);
        assert!(
            t.starts_with("not dispatched (request): nothing ran"),
            "{t}"
        );
        assert!(t.contains("session_ended") && t.contains("closed"), "{t}");
        let v = r.structured_content.unwrap();
        assert_eq!(
            (&v["code"], &v["end_reason"], &v["retry_safe"]),
            (&json!("session_ended"), &json!("closed"), &json!(true))
        );
    }

    #[tokio::test]
    async fn arguments_that_make_no_call_never_reach_the_backend() {
        let fake = Arc::new(Fake::default());
        let server = PlimsollMcp::new(Arc::clone(&fake) as Arc<dyn Backend>);
        let mut bad = cell("1");
        bad.0.session_id = format!("{ID}/../../runs");
        let r = server.run_cell(bad, as_caller("alice")).await.unwrap();
        assert_eq!(r.is_error, Some(true));
        assert_eq!(r.structured_content.unwrap()["code"], "session_not_found");
        let r = server
            .write_session_file(
                Parameters(WriteSessionFileArgs {
                    session_id: ID.into(),
                    path: "a".into(),
                    content: None,
                    content_base64: None,
                }),
                as_caller("alice"),
            )
            .await
            .unwrap();
        assert!(
            text(&r).starts_with("not dispatched (request)"),
            "{}",
            text(&r)
        );
        let r = server
            .run_session_steps(
                Parameters(RunSessionStepsArgs {
                    session_id: ID.into(),
                    commands: Vec::new(),
                    timeout_ms: None,
                }),
                as_caller("alice"),
            )
            .await
            .unwrap();
        assert!(
            text(&r).starts_with("not dispatched (request)"),
            "{}",
            text(&r)
        );
        assert!(fake.calls.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn files_go_in_and_come_back_through_the_session() {
        let fake = Arc::new(Fake::default());
        let server = PlimsollMcp::new(Arc::clone(&fake) as Arc<dyn Backend>);
        fake.open_session(None, SessionOptions::new(Language::Python))
            .unwrap();
        let r = server
            .write_session_file(
                Parameters(WriteSessionFileArgs {
                    session_id: ID.into(),
                    path: "data/in.bin".into(),
                    content: None,
                    content_base64: Some("AP8=".into()),
                }),
                Extensions::new(),
            )
            .await
            .unwrap();
        let v = r.structured_content.unwrap();
        assert_eq!(
            (&v["path"], &v["bytes_written"]),
            (&json!("data/in.bin"), &json!(2))
        );
        assert_eq!(
            fake.calls.lock().unwrap()[0],
            (
                Some("local".into()),
                ID.into(),
                SessionCall::Put {
                    path: "data/in.bin".into(),
                    content: vec![0x00, 0xff]
                }
            )
        );
        let r = server
            .read_session_file(
                Parameters(ReadSessionFileArgs {
                    session_id: ID.into(),
                    path: "data/in.bin".into(),
                }),
                Extensions::new(),
            )
            .await
            .unwrap();
        // The fake reads back no artifact: the file is not found, which is a result.
        assert_ne!(r.is_error, Some(true));
        assert_eq!(r.structured_content.unwrap()["found"], false);
    }

    #[tokio::test]
    async fn a_failure_that_reads_like_a_refusal_still_may_have_run() {
        let server = PlimsollMcp::new(Arc::new(Fake::default()));
        let r = server
            .run_code(
                Parameters(RunCodeArgs {
                    language: crate::args::LanguageArg::Python,
                    code: "1".into(),
                    placement: crate::args::Placement::default(),
                }),
                Extensions::new(),
            )
            .await
            .unwrap();
        let v = r.structured_content.clone().unwrap();
        assert_eq!(
            (&v["status"], &v["nothing_ran"]),
            (&json!("may_have_run"), &json!(false))
        );
        assert!(
            text(&r).starts_with("the code may have run"),
            "{}",
            text(&r)
        );
    }
}
