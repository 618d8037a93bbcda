//! plimsoll-router: parses its arguments, learns the nodes, serves (docs/cluster.md).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::serve::ListenerExt as _;
use clap::Parser;
use plimsoll_callers::store::CallerStore;
use plimsoll_router::serve::{Counts, DEFAULT_MAX_BODY_BYTES};
use plimsoll_router::{Cluster, DEFAULT_REFRESH, Seeds, Shared};
use plimsoll_secret::Secret;
use tokio::signal::unix::{SignalKind, signal};

/// One front for many plimsolld nodes: places each run on a node that meets its floor, sends
/// each session call to the node that holds the session, passes answers on untouched.
#[derive(Debug, Parser)]
#[command(name = "plimsoll-router", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7879")]
    listen: String,
    /// The nodes, as `host:port` separated by commas (or the option given again).
    #[arg(
        long,
        value_name = "HOST:PORT",
        value_delimiter = ',',
        conflicts_with = "dns"
    )]
    nodes: Vec<String>,
    /// A name whose every address is a node (a Kubernetes headless Service), resolved again
    /// at every refresh.
    #[arg(long, value_name = "NAME", requires = "node_port")]
    dns: Option<String>,
    /// The nodes' port, with --dns.
    #[arg(long, value_name = "PORT")]
    node_port: Option<u16>,
    /// The callers file: the same one every node reads (the router checks tokens as they do).
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/etc/plimsoll/callers.toml"
    )]
    callers: PathBuf,
    /// A file holding the router's own caller token (a caller of every node), with which it
    /// reads each node's GET /v1/providers.
    #[arg(long, value_name = "FILE")]
    token_file: PathBuf,
    /// How often the nodes are found and learned again, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_REFRESH.as_millis() as u64)]
    refresh_ms: u64,
    /// The most a request body may hold.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_BODY_BYTES)]
    max_body_bytes: usize,
}

/// JSON lines on stderr, filtered by `PLIMSOLL_LOG` (default `info`), as plimsolld logs.
fn init_logging() {
    let wanted = plimsoll_env::get(plimsoll_env::PLIMSOLL_LOG).unwrap_or_else(|| "info".to_owned());
    let filter = tracing_subscriber::EnvFilter::try_new(&wanted)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let seeds = match (&args.dns, args.node_port) {
        (Some(name), Some(port)) => Seeds::Dns {
            name: name.clone(),
            port,
        },
        _ if !args.nodes.is_empty() => Seeds::Static(args.nodes.clone()),
        _ => anyhow::bail!("name the nodes: --nodes HOST:PORT,... or --dns NAME --node-port PORT"),
    };
    let token = std::fs::read_to_string(&args.token_file)
        .with_context(|| format!("cannot read the token file {}", args.token_file.display()))?;
    let token: Secret = Secret::new(token.trim());
    anyhow::ensure!(
        !token.expose().is_empty(),
        "the token file {} is empty: put a caller's token in it (`plimsoll callers add router`)",
        args.token_file.display()
    );
    anyhow::ensure!(args.refresh_ms > 0, "--refresh-ms must be at least 1");
    let cluster = Arc::new(Cluster::new(seeds, token));
    let shared = Arc::new(Shared {
        cluster: Arc::clone(&cluster),
        callers: CallerStore::open(&args.callers),
        max_body_bytes: args.max_body_bytes,
        counts: Counts::default(),
    });
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let learning = plimsoll_router::keep_learning(
        Arc::clone(&cluster),
        Duration::from_millis(args.refresh_ms),
    );
    tracing::info!(addr = %addr, "listening");
    let mut term = signal(SignalKind::terminate()).context("install the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("install the SIGINT handler")?;
    // Answers are passed on as they come, in pieces: none waits for the last one's ack.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on a connection");
        }
    });
    axum::serve(listener, plimsoll_router::serve::app(shared))
        .with_graceful_shutdown(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::info!("stopping: answering the requests in flight, taking no new ones");
        })
        .await?;
    learning.abort();
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    init_logging();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "plimsoll-router stopped");
            eprintln!("plimsoll-router: {e:#}");
            ExitCode::FAILURE
        }
    }
}
