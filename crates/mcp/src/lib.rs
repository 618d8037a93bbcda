//! plimsoll as Model Context Protocol tools: `run_code`, `run_project`, `list_providers`,
//! the session tools (`open_session`, `run_cell`, `run_session_steps`, `write_session_file`,
//! `read_session_file`, `close_session`, `list_sessions`) and the snapshot tools
//! (`snapshot_session`, `fork_session`, `open_snapshot`, `list_snapshots`,
//! `delete_snapshot`), built on the official Rust SDK
//! (rmcp). The handler ([`PlimsollMcp`]) is transport-agnostic
//! and reaches plimsoll through a [`Backend`]: the embedded engine ([`EngineBackend`]) or a
//! daemon through the Rust client ([`ClientBackend`]). `plimsoll mcp` serves it over stdio
//! ([`serve_stdio`]); plimsolld serves it over streamable HTTP at `/mcp`.
//!
//! Tool results carry structured content and a text rendering (docs/mcp.md): capped stdout
//! and stderr with truncation flags, exit code, timed out, provider, isolation and the
//! request, result and record digests; a session call's also its place in the session's
//! chain and, for a cell, `state_kept` and `interpreter_end`; a restored or forked
//! session's, and its calls', also its `origin`. A refusal is a tool error
//! saying "not dispatched (REASON): nothing ran", with its code (`session_ended`,
//! `interpreter_ended`, ...); any other error says the code may have run.

pub mod args;
mod backend;
pub mod render;
mod server;

use std::sync::Arc;

pub use backend::{Backend, BackendError, ClientBackend, EngineBackend, SessionCall, on_engine};
pub use server::{Caller, PlimsollMcp};

/// Serving over stdio stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeStdioError {
    /// The MCP handshake on stdin/stdout failed.
    #[error("the MCP client on stdin/stdout did not complete the handshake")]
    Handshake(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The server's task failed.
    #[error("the MCP server stopped unexpectedly")]
    Stopped(#[source] tokio::task::JoinError),
}

/// Serves the tools over `backend` on this process's stdin and stdout until the client goes
/// away. Logs must go to stderr: stdout carries the protocol.
pub async fn serve_stdio(backend: Arc<dyn Backend>) -> Result<(), ServeStdioError> {
    use rmcp::ServiceExt as _;
    let running = PlimsollMcp::new(backend)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| ServeStdioError::Handshake(Box::new(e)))?;
    running.waiting().await.map_err(ServeStdioError::Stopped)?;
    Ok(())
}
