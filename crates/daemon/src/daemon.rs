//! Running the daemon: settings to options, the listener, the evidence re-check loop, callers
//! reload on SIGHUP, and graceful shutdown on SIGTERM/SIGINT.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use plimsoll_broker::{GrantProfiles, LoadGrantsError};
use plimsoll_engine::settings::Settings;
use plimsoll_engine::{BuildEngineError, Engine};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::callers::CallerStore;
use crate::metrics::Metrics;
use crate::server::{AppState, Shared, router};

/// Default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7878";
/// Default callers file.
pub const DEFAULT_CALLERS_FILE: &str = "/etc/plimsoll/callers.toml";
/// Default largest request body: 8 MiB.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 8 * 1024 * 1024;
/// Default seconds between evidence re-checks.
pub const DEFAULT_RECHECK_SECS: u64 = 300;
/// How long shutdown waits beyond the longest run the settings allow.
pub const SHUTDOWN_SLACK: Duration = Duration::from_secs(10);

/// The daemon's own settings, resolved from `[daemon]` and defaults.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    /// Where to listen.
    pub listen: SocketAddr,
    /// The callers file.
    pub callers_file: PathBuf,
    /// Largest `POST /v1/runs` body, in bytes.
    pub max_body_bytes: usize,
    /// Time between evidence re-checks.
    pub recheck: Duration,
    /// How long shutdown waits for runs in flight: the longest run timeout the settings
    /// allow, plus [`SHUTDOWN_SLACK`].
    pub shutdown_grace: Duration,
    /// The grants file (docs/capability-grants.md), if any: without one, every request
    /// naming a grant is refused.
    pub grants_file: Option<PathBuf>,
}

/// The daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartDaemonError {
    /// The settings name no provider.
    #[error(
        "no provider is configured, so nothing could run: set `providers = [\"process\"]` in the settings file (--config or PLIMSOLL_CONFIG)"
    )]
    NoProviders,
    /// The engine could not be built from the settings.
    #[error("the settings cannot build an engine")]
    Engine(#[source] BuildEngineError),
    /// A `[daemon]` setting is invalid.
    #[error("invalid [daemon] setting `{key}`: {message}")]
    Invalid {
        /// The key.
        key: &'static str,
        /// What is wrong and what to write instead.
        message: String,
    },
    /// The listen address could not be bound.
    #[error(
        "cannot listen on {addr}: is another daemon running there? choose another with --listen"
    )]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("serving failed")]
    Serve(#[source] std::io::Error),
    /// The grants file could not be loaded.
    #[error("cannot load the grants file")]
    Grants(#[source] LoadGrantsError),
    /// Shutdown waited its bound and runs were still in flight.
    #[error(
        "shutdown waited {waited:?} and {in_flight} run(s) were still in flight: they were abandoned"
    )]
    ShutdownTimedOut {
        /// How long it waited.
        waited: Duration,
        /// Runs left.
        in_flight: usize,
    },
}

impl DaemonOptions {
    /// The options `settings` describe; `listen` overrides `[daemon].listen`.
    pub fn from_settings(
        settings: &Settings,
        listen: Option<&str>,
    ) -> Result<DaemonOptions, StartDaemonError> {
        let d = &settings.daemon;
        let listen_text = listen
            .map(str::to_owned)
            .or_else(|| d.listen.clone())
            .unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
        let listen = listen_text
            .parse::<SocketAddr>()
            .map_err(|e| StartDaemonError::Invalid {
                key: "listen",
                message: format!(
                    "`{listen_text}` is not an address ({e}): write e.g. \"127.0.0.1:7878\""
                ),
            })?;
        let max_body = d.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES);
        if max_body == 0 {
            return Err(StartDaemonError::Invalid {
                key: "max_body_bytes",
                message: "must be at least 1".into(),
            });
        }
        let recheck = d.recheck_secs.unwrap_or(DEFAULT_RECHECK_SECS);
        if recheck == 0 {
            return Err(StartDaemonError::Invalid {
                key: "recheck_secs",
                message: "must be at least 1".into(),
            });
        }
        Ok(DaemonOptions {
            listen,
            callers_file: d
                .callers_file
                .clone()
                .unwrap_or_else(|| DEFAULT_CALLERS_FILE.into()),
            max_body_bytes: usize::try_from(max_body).unwrap_or(usize::MAX),
            recheck: Duration::from_secs(recheck),
            shutdown_grace: settings.engine_config().limits.maximums.timeout + SHUTDOWN_SLACK,
            // `plimsolld --grants` overrides it.
            grants_file: settings.grants_file.clone(),
        })
    }
}

/// Builds the engine the daemon serves: only the providers the settings name (none by
/// default, and then the daemon does not start).
pub fn build_engine(settings: &Settings) -> Result<Engine, StartDaemonError> {
    settings.build_engine(&[]).map_err(|e| match e {
        BuildEngineError::NoProviders => StartDaemonError::NoProviders,
        other => StartDaemonError::Engine(other),
    })
}

/// Loads the grants file, reading each secret it names from this process's environment
/// ([`Engine::load_grants`]); no file means no grants.
pub fn load_grants(path: Option<&Path>) -> Result<GrantProfiles, StartDaemonError> {
    match path {
        None => Ok(GrantProfiles::none()),
        Some(p) => Engine::load_grants(p).map_err(StartDaemonError::Grants),
    }
}

/// A built daemon, not yet serving.
#[derive(Debug)]
pub struct Daemon {
    state: AppState,
    options: DaemonOptions,
}

impl Daemon {
    /// A daemon in front of `engine`. Reads the callers file now.
    pub fn new(engine: Arc<Engine>, options: DaemonOptions) -> Daemon {
        let state = Arc::new(Shared {
            engine,
            callers: CallerStore::open(&options.callers_file),
            metrics: Metrics::default(),
            max_body_bytes: options.max_body_bytes,
        });
        Daemon { state, options }
    }

    /// The engine.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.state.engine
    }

    /// The options in force.
    pub fn options(&self) -> &DaemonOptions {
        &self.options
    }

    /// Re-reads the callers file (on SIGHUP).
    pub fn reload_callers(&self) {
        self.state.callers.reload();
    }

    /// Probes every provider now, off the async threads. A probe that panics is logged and
    /// leaves that provider unoffered; the daemon keeps serving.
    pub async fn probe_all(&self) {
        probe_all(Arc::clone(&self.state.engine)).await;
    }

    /// Re-checks every provider's evidence every `recheck`, forever. The first check is one
    /// period from now; call [`Daemon::probe_all`] for the start-up probe.
    pub fn spawn_recheck(&self) -> tokio::task::JoinHandle<()> {
        let engine = Arc::clone(&self.state.engine);
        let period = self.options.recheck;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                tracing::debug!("re-checking provider evidence");
                probe_all(Arc::clone(&engine)).await;
            }
        })
    }

    /// Serves on `listener` until `shutdown` completes, then stops accepting and lets the
    /// requests in flight finish, waiting at most `shutdown_grace` (and, after that, for runs
    /// whose client went away, whose sandboxes the engine still owns).
    pub async fn serve(
        &self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), StartDaemonError> {
        let (fired_tx, mut fired_rx) = watch::channel(false);
        let engine = Arc::clone(&self.state.engine);
        let fired_at = Arc::new(std::sync::OnceLock::new());
        let stamp = Arc::clone(&fired_at);
        let signal = async move {
            shutdown.await;
            let _ = stamp.set(tokio::time::Instant::now());
            tracing::info!(
                in_flight = engine.in_flight(),
                "shutting down: no new connections; waiting for runs in flight"
            );
            let _ = fired_tx.send(true);
        };
        let app = router(Arc::clone(&self.state));
        let serve = axum::serve(listener, app).with_graceful_shutdown(signal);
        let grace = self.options.shutdown_grace;
        let deadline = async move {
            let _ = fired_rx.wait_for(|f| *f).await;
            tokio::time::sleep(grace).await;
        };
        tokio::select! {
            served = serve => served.map_err(StartDaemonError::Serve)?,
            () = deadline => {
                return Err(StartDaemonError::ShutdownTimedOut {
                    waited: grace,
                    in_flight: self.state.engine.in_flight(),
                });
            }
        }
        // A run whose client disconnected is still running in the blocking pool: wait for it.
        let limit = *fired_at.get_or_init(tokio::time::Instant::now) + grace;
        while self.state.engine.in_flight() > 0 {
            if tokio::time::Instant::now() >= limit {
                return Err(StartDaemonError::ShutdownTimedOut {
                    waited: grace,
                    in_flight: self.state.engine.in_flight(),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }
}

async fn probe_all(engine: Arc<Engine>) {
    if let Err(e) = tokio::task::spawn_blocking(move || engine.probe_all()).await {
        tracing::error!(error = %e, "a provider probe panicked; the provider stays unoffered");
    }
}

/// Resolves on the first SIGTERM or SIGINT.
async fn terminate_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("install the SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install the SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!(signal = "SIGTERM", "shutdown requested"),
        _ = int.recv() => tracing::info!(signal = "SIGINT", "shutdown requested"),
    }
}

/// The whole daemon, as `plimsolld` runs it: build the engine (refusing to start with no
/// provider), bind, probe in the background (`/readyz` answers 503 until a provider passes),
/// re-check evidence periodically, reload callers on SIGHUP, and shut down gracefully on
/// SIGTERM/SIGINT.
/// `grants_file` overrides the options' grants file.
pub async fn run(
    settings: &Settings,
    listen: Option<&str>,
    grants_file: Option<&Path>,
) -> Result<(), StartDaemonError> {
    let mut options = DaemonOptions::from_settings(settings, listen)?;
    if let Some(g) = grants_file {
        options.grants_file = Some(g.to_owned());
    }
    let grants = load_grants(options.grants_file.as_deref())?;
    let engine = Arc::new(build_engine(settings)?.with_grants(grants));
    let listener =
        TcpListener::bind(options.listen)
            .await
            .map_err(|source| StartDaemonError::Bind {
                addr: options.listen,
                source,
            })?;
    let addr = listener.local_addr().map_err(StartDaemonError::Serve)?;
    let daemon = Arc::new(Daemon::new(engine, options));
    tracing::info!(
        addr = %addr,
        callers_file = %daemon.options.callers_file.display(),
        default_floor = %daemon.engine().config().default_floor,
        grant_profiles = daemon.engine().grants().names().collect::<Vec<_>>().join(","),
        "listening"
    );

    let prober = Arc::clone(&daemon);
    let probes = tokio::spawn(async move {
        prober.probe_all().await;
        if !prober.engine().ready() {
            tracing::error!(
                "no provider passed its probe: runs are refused until one does; see GET /v1/providers"
            );
        }
        prober.spawn_recheck();
    });

    let reloader = Arc::clone(&daemon);
    let hup = tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            return;
        };
        while hup.recv().await.is_some() {
            tracing::info!("SIGHUP: re-reading the callers file");
            reloader.reload_callers();
        }
    });

    let result = daemon.serve(listener, terminate_signal()).await;
    probes.abort();
    hup.abort();
    if result.is_ok() {
        tracing::info!("stopped");
    }
    result
}
