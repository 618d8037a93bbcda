//! plimsolld: HTTP/JSON in front of the engine, the only HTTP server in front of one
//! (plimsoll-router serves the same API in front of many daemons, over HTTP).
//!
//! Routes, statuses, authentication and settings are described in docs/daemon.md; the
//! OpenAPI document is docs/openapi.json (also served at `GET /v1/openapi.json`).

pub mod callers;
mod daemon;
pub mod logging;
mod mcp;
mod metrics;
mod server;
mod sessions;
pub mod split;
mod streams;
pub mod testing;

pub use daemon::{
    DEFAULT_CALLERS_FILE, DEFAULT_LISTEN, DEFAULT_MAX_BODY_BYTES, DEFAULT_RECHECK_SECS, Daemon,
    DaemonOptions, SHUTDOWN_SLACK, StartDaemonError, build_engine, load_grants, run, run_split,
};
pub use mcp::MCP_PATH;
pub use server::{
    AutoErrorBodies, Failure, OPENAPI_JSON, RETRY_AFTER_SECS, ROUTES, Route, status_for,
};
