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

use crate::args::{ListProvidersArgs, RunCodeArgs, RunProjectArgs};
use crate::backend::{Backend, BackendError};
use crate::render;

/// The authenticated caller of a request, set by the transport (the daemon's `/mcp` puts it
/// in the HTTP request's extensions after checking the bearer token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller(pub String);

/// What the server tells a client at initialisation.
const INSTRUCTIONS: &str = "\
plimsoll runs code in a fresh sandbox per call and says how strong that sandbox was. \
Isolation tiers, weakest first: process (a hardened child process; no wall at the OS level), \
container (namespaces, cgroups, seccomp; the host kernel is shared), kernel (a user-space \
kernel or an emulated VM between the code and the host kernel), vm (hardware \
virtualisation). Set min_isolation (the floor) to the weakest tier you accept; a call that no \
available provider can meet is refused as `not dispatched (isolation)` and nothing runs. Any \
`not dispatched` error means nothing ran and a retry is safe; any other error means the code \
may have run. Every result states its provider and isolation and carries SHA-256 digests of \
the request, the result and the run record.";

/// The MCP server: `run_code`, `run_project`, `list_providers` over one backend.
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

fn failed(e: &BackendError) -> CallToolResult {
    let (structured, text) = render::error(e);
    let mut r = CallToolResult::error(vec![ContentBlock::text(text)]);
    r.structured_content = Some(structured);
    r
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
            Err(e) => {
                return Ok(failed(&BackendError::NotDispatched {
                    reason: plimsoll_wire::Reason::Request,
                    message: e.to_string(),
                }));
            }
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
        Ok(
            match blocking(move || backend.providers(caller.as_deref())).await {
                Ok(resp) => {
                    let (v, text) = render::providers(&resp);
                    ok(v, text)
                }
                Err(e) => failed(&e),
            },
        )
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
