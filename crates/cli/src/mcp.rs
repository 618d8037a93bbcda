//! `plimsoll mcp`: the MCP tools (crates/mcp) over stdio, on the embedded engine or a daemon.
//! On the embedded engine, sessions are caller `local`'s and end when the server does.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, anyhow};
use clap::Args;
use plimsoll_mcp::{Backend, ClientBackend, EngineBackend};

use crate::local::{client, daemon_url, granted_engine, load_settings};
use crate::run::LOCAL_CALLER;
use crate::{EXIT_OK, Failure};

/// `plimsoll mcp`.
#[derive(Debug, Args)]
pub struct McpArgs {
    /// Send runs to this daemon (token from PLIMSOLL_TOKEN). Default: PLIMSOLL_DAEMON, else
    /// the embedded engine (built from the same settings as `plimsoll run`).
    #[arg(long, value_name = "URL")]
    pub daemon: Option<String>,
    /// Grant profiles for the embedded engine (TOML, docs/capability-grants.md); the secrets
    /// it names are read from this environment, and runs are by caller `local`. A daemon's
    /// grants are its operator's.
    #[arg(long, value_name = "FILE", conflicts_with = "daemon")]
    pub grants: Option<PathBuf>,
}

/// Runs `plimsoll mcp` until the client closes stdin.
pub fn mcp(config: Option<&Path>, a: &McpArgs) -> Result<u8, Failure> {
    // The embedded engine, if that is where the tools go: its sessions end with this process.
    let mut embedded = None;
    let backend: Arc<dyn Backend> = match daemon_url(a.daemon.as_deref()) {
        Some(url) => {
            if a.grants.is_some() {
                return Err(Failure::usage(anyhow!(
                    "--grants is for the embedded engine: a daemon's grant profiles are its operator's (plimsolld --grants)"
                )));
            }
            Arc::new(ClientBackend::new(client(&url)?))
        }
        None => {
            let engine = Arc::new(granted_engine(
                &load_settings(config)?,
                a.grants.as_deref(),
            )?);
            embedded = Some(Arc::clone(&engine));
            // Providers are probed at the first call that needs them, so the client's
            // handshake is answered at once.
            Arc::new(EngineBackend::lazy(engine, LOCAL_CALLER))
        }
    };
    let rt = tokio::runtime::Runtime::new()
        .context("cannot start the async runtime")
        .map_err(Failure::failed)?;
    let served = rt.block_on(plimsoll_mcp::serve_stdio(backend));
    // A run still going when the client left must not hold the process open for long.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    // Sessions do not outlive the server that opened them: their sandboxes are removed now
    // (`daemon_restarted`), not left to their lifetime's watchdog and the next reap.
    if let Some(engine) = embedded {
        engine.end_all_sessions();
    }
    served.map_err(|e| Failure::failed(anyhow!(e)))?;
    Ok(EXIT_OK)
}
