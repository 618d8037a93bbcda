//! Running the daemon: settings to options, the accept loop (HTTP/1.1 with a header-read
//! timeout and a cap on connections open at once), the evidence re-check loop, callers and grants reload on SIGHUP, and graceful
//! shutdown on SIGTERM/SIGINT.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use plimsoll_broker::{GrantProfiles, LoadGrantsError};
use plimsoll_engine::settings::Settings;
use plimsoll_engine::{BuildEngineError, Engine, PoolsReplaced};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

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
/// Default seconds a client has to send a whole request head (request line and headers),
/// and the longest a kept-alive connection may sit idle between requests.
pub const DEFAULT_HEADER_TIMEOUT_SECS: u64 = 10;
/// The largest `header_timeout_secs` accepted: an hour (far beyond any honest client, and
/// small enough that no deadline overflows).
pub const MAX_HEADER_TIMEOUT_SECS: u64 = 3600;
/// Default largest number of connections open at once.
pub const DEFAULT_MAX_CONNECTIONS: u64 = 512;
/// The largest `max_connections` accepted.
pub const MAX_MAX_CONNECTIONS: u64 = 65536;
/// Default largest number of connections open at once from one peer: enough for a busy
/// honest client's pool, a small share of [`DEFAULT_MAX_CONNECTIONS`].
pub const DEFAULT_MAX_CONNECTIONS_PER_PEER: u64 = 64;
/// The shortest interval between two log lines saying the connection cap was reached.
pub const CAP_WARN_INTERVAL: Duration = Duration::from_secs(1);
/// How long a connection over its peer's cap waits for one of the peer's connections to
/// close before it is closed unanswered. A connection the peer has just closed is counted
/// until the daemon's task for it runs again, so a client's next connection can arrive
/// while its last one still holds a place; it then waits for that place rather than being
/// refused. At most [`DaemonOptions::max_connections_per_peer`] of a peer's connections
/// wait at once.
pub const PEER_WAIT: Duration = Duration::from_secs(1);
/// How long the accept loop pauses after an accept error other than a connection's own
/// failure (e.g. `EMFILE`, out of file descriptors), before accepting again.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(200);
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
    /// How long a client has to send a whole request head, counted from the connection's
    /// start or the end of the previous answer on it; past it the connection is closed
    /// without an answer.
    pub header_timeout: Duration,
    /// The most connections open at once; one accepted beyond it is closed at once,
    /// without an answer.
    pub max_connections: usize,
    /// The most connections open at once from one peer ([`peer_key`]); one accepted beyond it
    /// waits up to [`PEER_WAIT`] for one of the peer's connections to close, and is then
    /// closed without an answer, so one client cannot hold every place.
    pub max_connections_per_peer: usize,
    /// How long shutdown waits for runs in flight: the longest run timeout the settings
    /// allow, plus [`SHUTDOWN_SLACK`].
    pub shutdown_grace: Duration,
    /// The grants file (docs/capability-grants.md), if any: without one, every request
    /// naming a grant is refused.
    pub grants_file: Option<PathBuf>,
    /// The settings file the daemon was started with, if any: SIGHUP re-reads its
    /// `[pools]` section.
    pub settings_file: Option<PathBuf>,
    /// The user the broker process runs as, when there is a grants file.
    pub broker_user: String,
    /// In the split daemon with a grants file: the launcher, which loads the grants file
    /// (holding its secrets) and keeps the broker process; SIGHUP asks it to read the file
    /// again.
    pub launcher_grants: Option<Arc<plimsoll_engine::launch::LauncherBrokers>>,
}

/// The broker process's user unless `[daemon] broker_user` names another.
pub const DEFAULT_BROKER_USER: &str = plimsoll_broker::apart::DEFAULT_USER;

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
    /// The broker process's user is not on this host, or is root.
    #[error(
        "the broker process runs as user `{user}`, {problem}: create it with `plimsoll init` (or `useradd --system --user-group --no-create-home --shell /usr/sbin/nologin {user}`), or name another unprivileged user in [daemon] broker_user"
    )]
    BrokerUser {
        /// The user.
        user: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The serving process's user is not on this host, or is root.
    #[error(
        "the serving process runs as user `{user}`, {problem}: create it (`useradd --system --user-group --no-create-home --shell /usr/sbin/nologin {user}`), or name another unprivileged user in [daemon] serving_user"
    )]
    ServingUser {
        /// The user.
        user: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The split daemon could not set itself up.
    #[error("cannot start the split daemon: {0}")]
    Split(String),
    /// The broker process did not start.
    #[error("cannot start the broker process (the grants' broker runs apart from the daemon)")]
    BrokerProcess(#[source] std::io::Error),
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
        let header_timeout = d.header_timeout_secs.unwrap_or(DEFAULT_HEADER_TIMEOUT_SECS);
        if !(1..=MAX_HEADER_TIMEOUT_SECS).contains(&header_timeout) {
            return Err(StartDaemonError::Invalid {
                key: "header_timeout_secs",
                message: format!(
                    "must be from 1 to {MAX_HEADER_TIMEOUT_SECS} (default {DEFAULT_HEADER_TIMEOUT_SECS}): the seconds a client has to send its request headers"
                ),
            });
        }
        let max_connections = d.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS);
        if !(1..=MAX_MAX_CONNECTIONS).contains(&max_connections) {
            return Err(StartDaemonError::Invalid {
                key: "max_connections",
                message: format!(
                    "must be from 1 to {MAX_MAX_CONNECTIONS} (default {DEFAULT_MAX_CONNECTIONS}): the connections open at once; raise the process's open-file limit to match"
                ),
            });
        }
        let per_peer = d
            .max_connections_per_peer
            .unwrap_or(DEFAULT_MAX_CONNECTIONS_PER_PEER);
        if !(1..=MAX_MAX_CONNECTIONS).contains(&per_peer) {
            return Err(StartDaemonError::Invalid {
                key: "max_connections_per_peer",
                message: format!(
                    "must be from 1 to {MAX_MAX_CONNECTIONS} (default {DEFAULT_MAX_CONNECTIONS_PER_PEER}): the connections open at once from one IPv4 address or IPv6 /64; behind a reverse proxy every client is the proxy, so raise it to max_connections there"
                ),
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
            header_timeout: Duration::from_secs(header_timeout),
            max_connections: usize::try_from(max_connections).unwrap_or(usize::MAX),
            max_connections_per_peer: usize::try_from(per_peer).unwrap_or(usize::MAX),
            shutdown_grace: settings.engine_config().limits.maximums.timeout + SHUTDOWN_SLACK,
            // `plimsolld --grants` overrides it.
            grants_file: settings.grants_file.clone(),
            // Set by `run`, which knows where the settings came from.
            settings_file: None,
            broker_user: d
                .broker_user
                .clone()
                .unwrap_or_else(|| DEFAULT_BROKER_USER.to_owned()),
            launcher_grants: None,
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
        let deliveries = crate::streams::Deliveries::new(
            engine.config().max_concurrent,
            engine.config().max_per_caller,
        );
        let state = Arc::new(Shared {
            deliveries,
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

    /// Re-reads the grants file the daemon was started with, if any (on SIGHUP), reading
    /// every secret it names from this process's environment ([`Engine::load_grants`]).
    /// Only a file that loads whole replaces the profiles, all at once (runs in flight keep
    /// theirs); otherwise the profiles in force stay and one error line says why (the
    /// loader's errors name variables, never their values). Returns the number of profiles
    /// now in force, or `None` when there is no grants file.
    pub fn reload_grants(&self) -> Option<Result<usize, LoadGrantsError>> {
        let path = self.options.grants_file.as_deref()?;
        let loaded = match &self.options.launcher_grants {
            // The split daemon: the launcher reads it, with the secrets, and loads the broker
            // process; this process gets the text.
            Some(launcher) => launcher.grants(true),
            None => Engine::load_grants(path),
        };
        match loaded {
            Ok(grants) => {
                let profiles = grants.names().count();
                let names = grants.names().collect::<Vec<_>>().join(",");
                self.state.engine.replace_grants(grants);
                tracing::info!(
                    grants_file = %path.display(),
                    profiles,
                    grant_profiles = names,
                    "grants file reloaded"
                );
                Some(Ok(profiles))
            }
            Err(e) => {
                tracing::error!(
                    grants_file = %path.display(),
                    error = %error_chain(&e),
                    "cannot reload the grants file: the grant profiles in force are kept; fix the file and send SIGHUP again"
                );
                Some(Err(e))
            }
        }
    }

    /// Re-reads the settings file the daemon was started with, if any (on SIGHUP), and puts
    /// its `[pools]` section in force ([`Engine::reload_pools`]): an unchanged section
    /// touches nothing; a changed one drains the pools in force and keeps the new ones. A
    /// file that does not load, or pools it refuses, leave the pools in force, and one error
    /// line says why. Blocks while the old pools drain (up to a minute): call it off the
    /// async threads. `None` when there is no settings file.
    pub fn reload_pools(&self) -> Option<Result<PoolsReplaced, String>> {
        let path = self.options.settings_file.as_deref()?;
        let reloaded = Settings::load(path)
            .map_err(|e| error_chain(&e))
            .and_then(|s| {
                self.state
                    .engine
                    .reload_pools(&s)
                    .map_err(|e| error_chain(&e))
            });
        match &reloaded {
            Ok(done) => {
                let pools = self
                    .state
                    .engine
                    .pool_configs()
                    .iter()
                    .map(|c| {
                        format!(
                            "{}.{}:{}/{}/{}s",
                            c.provider,
                            format!("{:?}", c.language).to_lowercase(),
                            c.settings.min_idle,
                            c.settings.max_members,
                            c.settings.max_age.as_secs()
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(",");
                let message = match done {
                    PoolsReplaced::Unchanged => "warm pools unchanged",
                    PoolsReplaced::Replaced => "warm pools replaced",
                };
                tracing::info!(settings_file = %path.display(), pools, "{message}");
            }
            Err(e) => tracing::error!(
                settings_file = %path.display(),
                error = %e,
                "cannot reload the warm pools: the pools in force are kept; fix the settings file and send SIGHUP again"
            ),
        }
        Some(reloaded)
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
        let serve = accept_loop(
            listener,
            app,
            self.options.header_timeout,
            self.options.max_connections,
            self.options.max_connections_per_peer,
            signal,
        );
        let grace = self.options.shutdown_grace;
        let deadline = async move {
            let _ = fired_rx.wait_for(|f| *f).await;
            tokio::time::sleep(grace).await;
        };
        tokio::select! {
            () = serve => {}
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

/// Accepts connections on `listener` and serves `app` on each (HTTP/1.1, as `axum::serve`
/// with axum's default features did), until `signal` completes; then stops accepting, asks
/// every connection to close once its request in flight is answered, and returns when all
/// have closed.
///
/// Each connection must send a whole request head within `header_timeout` of its start, or of
/// the end of the previous answer on it (an idle kept-alive connection); otherwise hyper
/// closes it without an answer. So a client that sends nothing, or a byte a minute, holds a
/// socket for at most `header_timeout`. At most `max_connections` are open at once: each holds
/// a permit until it ends, and one accepted while none is left is closed at once, nothing
/// written, with a `warn` line at most every [`CAP_WARN_INTERVAL`]. An accept error other than a connection's own
/// failure (e.g. `EMFILE`) is logged and retried after [`ACCEPT_BACKOFF`]: it never ends the
/// server.
async fn accept_loop(
    listener: TcpListener,
    app: Router,
    header_timeout: Duration,
    max_connections: usize,
    max_per_peer: usize,
    signal: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(max_connections));
    let peers = PeerCounts::default();
    // When the last line about each cap was logged, and connections refused since.
    let peer_warn = CapWarning::default();
    let cap_warn = CapWarning::default();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let service = TowerToHyperService::new(app);
    let graceful = GracefulShutdown::new();
    let mut signal = pin!(signal);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut signal => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                tracing::error!(
                    error = %e,
                    backoff_ms = ACCEPT_BACKOFF.as_millis() as u64,
                    "cannot accept a connection (out of file descriptors?); retrying"
                );
                tokio::select! {
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                    () = &mut signal => break,
                }
            }
        };
        let key = peer_key(peer.ip());
        let admit = Admit {
            permits: Arc::clone(&permits),
            max_connections,
            cap_warn: cap_warn.clone(),
            http: http.clone(),
            service: service.clone(),
            watcher: graceful.watcher(),
        };
        // The peer's own cap first, so a peer over it does not take a place of the global one.
        if let Some(place) = peers.try_take(key, max_per_peer) {
            admit.serve(stream, place);
            continue;
        }
        // Over it: wait a moment for a place one of its connections is giving back, off the
        // accept loop; beyond as many waiting as the cap, closed at once.
        let refuse = move |peer_warn: &CapWarning| {
            if let Some(refused) = peer_warn.refused() {
                tracing::warn!(
                    max_connections_per_peer = max_per_peer,
                    peer = %key,
                    refused,
                    "per-peer connection cap reached: closing this peer's new connections without an answer; raise [daemon].max_connections_per_peer if it is an honest proxy"
                );
            }
        };
        let Some(waiting) = peers.try_wait(key, max_per_peer) else {
            drop(stream);
            refuse(&peer_warn);
            continue;
        };
        let (peers, peer_warn) = (peers.clone(), peer_warn.clone());
        tokio::spawn(async move {
            let place = peers.take_within(key, max_per_peer, PEER_WAIT).await;
            drop(waiting);
            match place {
                Some(place) => admit.serve(stream, place),
                None => {
                    drop(stream);
                    refuse(&peer_warn);
                }
            }
        });
    }
    drop(listener);
    tracing::debug!(
        connections = graceful.count(),
        "no longer accepting; waiting for open connections to close"
    );
    graceful.shutdown().await;
}

/// What the per-peer cap counts by: an IPv4 address (an IPv4-mapped IPv6 one too), or an
/// IPv6 address's /64 (one host's usual allocation, so its 2^64 addresses count as one peer).
fn peer_key(ip: std::net::IpAddr) -> std::net::IpAddr {
    use std::net::{IpAddr, Ipv6Addr};
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// What serving one more connection takes, once it holds its peer's place: a place of the
/// global cap (or it is closed at once, nothing written), then hyper on it until it ends.
struct Admit {
    permits: Arc<Semaphore>,
    max_connections: usize,
    cap_warn: CapWarning,
    http: hyper::server::conn::http1::Builder,
    service: TowerToHyperService<Router>,
    watcher: hyper_util::server::graceful::Watcher,
}

impl Admit {
    fn serve(self, stream: tokio::net::TcpStream, peer_place: PeerPlace) {
        let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() else {
            // Over the cap: closed without a byte written.
            drop(stream);
            if let Some(refused) = self.cap_warn.refused() {
                tracing::warn!(
                    max_connections = self.max_connections,
                    refused,
                    "connection cap reached: closing new connections without an answer; raise [daemon].max_connections if clients are honest"
                );
            }
            return;
        };
        // hyper's own answers (a head it cannot parse) get an ErrorResponse body on the way out.
        let io = TokioIo::new(crate::server::AutoErrorBodies::new(stream));
        let conn = self
            .watcher
            .watch(self.http.serve_connection(io, self.service));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection closed with an error");
            }
            // Held until the connection ends.
            drop(permit);
            drop(peer_place);
        });
    }
}

/// Connections refused since a cap's last log line, and when that was: one line at most
/// every [`CAP_WARN_INTERVAL`].
#[derive(Debug, Clone, Default)]
struct CapWarning(Arc<std::sync::Mutex<(Option<tokio::time::Instant>, u64)>>);

impl CapWarning {
    /// Counts one refusal; the count to log, when a line is due.
    fn refused(&self) -> Option<u64> {
        let mut w = self.0.lock().unwrap_or_else(|p| p.into_inner());
        w.1 += 1;
        let now = tokio::time::Instant::now();
        if w.0
            .is_some_and(|t| now.duration_since(t) < CAP_WARN_INTERVAL)
        {
            return None;
        }
        w.0 = Some(now);
        Some(std::mem::take(&mut w.1))
    }
}

/// Connections open per peer key, and those waiting for a place.
#[derive(Debug, Clone, Default)]
struct PeerCounts(Arc<PeerTable>);

#[derive(Debug, Default)]
struct PeerTable {
    peers: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, Peer>>,
    /// Notified whenever a place is given back.
    freed: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Peer {
    open: usize,
    waiting: usize,
}

/// A connection's turn to wait for its peer's place, given back when dropped.
#[derive(Debug)]
struct PeerWaiting {
    counts: PeerCounts,
    key: std::net::IpAddr,
}

/// One connection's place in its peer's count, given back when dropped.
#[derive(Debug)]
struct PeerPlace {
    counts: PeerCounts,
    key: std::net::IpAddr,
}

impl PeerCounts {
    fn peers(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<std::net::IpAddr, Peer>> {
        self.0.peers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for one more connection of `key`, unless it holds `max` already.
    fn try_take(&self, key: std::net::IpAddr, max: usize) -> Option<PeerPlace> {
        let mut map = self.peers();
        let peer = map.entry(key).or_default();
        if peer.open >= max {
            return None;
        }
        peer.open += 1;
        Some(PeerPlace {
            counts: self.clone(),
            key,
        })
    }

    /// A turn to wait for a place of `key`, unless `max` of its connections wait already.
    fn try_wait(&self, key: std::net::IpAddr, max: usize) -> Option<PeerWaiting> {
        let mut map = self.peers();
        let peer = map.entry(key).or_default();
        if peer.waiting >= max {
            return None;
        }
        peer.waiting += 1;
        Some(PeerWaiting {
            counts: self.clone(),
            key,
        })
    }

    /// A place for one more connection of `key` as soon as it holds fewer than `max`,
    /// waiting at most `wait`.
    async fn take_within(
        &self,
        key: std::net::IpAddr,
        max: usize,
        wait: Duration,
    ) -> Option<PeerPlace> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Registered before looking, so a place given back in between is not missed.
            let freed = self.0.freed.notified();
            let mut freed = pin!(freed);
            freed.as_mut().enable();
            if let Some(place) = self.try_take(key, max) {
                return Some(place);
            }
            tokio::time::timeout_at(deadline, freed).await.ok()?;
        }
    }

    /// Forgets `key` once nothing of it is open or waiting, so the map stays small.
    fn release(&self, key: std::net::IpAddr, f: impl FnOnce(&mut Peer)) {
        let mut map = self.peers();
        if let Some(peer) = map.get_mut(&key) {
            f(peer);
            if peer.open == 0 && peer.waiting == 0 {
                map.remove(&key);
            }
        }
    }
}

impl Drop for PeerPlace {
    fn drop(&mut self) {
        self.counts
            .release(self.key, |p| p.open = p.open.saturating_sub(1));
        self.counts.0.freed.notify_waiters();
    }
}

impl Drop for PeerWaiting {
    fn drop(&mut self) {
        self.counts
            .release(self.key, |p| p.waiting = p.waiting.saturating_sub(1));
    }
}

/// An accept error that concerns only the connection being accepted.
fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

async fn probe_all(engine: Arc<Engine>) {
    if let Err(e) = tokio::task::spawn_blocking(move || engine.probe_all()).await {
        tracing::error!(error = %e, "a provider probe panicked; the provider stays unoffered");
    }
}

use plimsoll_engine::error_chain;

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

/// The broker process's user, refused when absent or root.
pub(crate) fn broker_user(
    name: &str,
) -> Result<plimsoll_broker::apart::ProcessUser, StartDaemonError> {
    plimsoll_broker::apart::ProcessUser::lookup(name).map_err(|problem| {
        StartDaemonError::BrokerUser {
            user: name.to_owned(),
            problem,
        }
    })
}

/// The whole daemon, as `plimsolld` runs it: build the engine (refusing to start with no
/// provider), bind, probe in the background (`/readyz` answers 503 until a provider passes),
/// re-check evidence periodically, reload callers and grants on SIGHUP, and shut down gracefully on
/// SIGTERM/SIGINT.
/// `grants_file` overrides the options' grants file.
pub async fn run(
    settings: &Settings,
    settings_file: Option<&Path>,
    listen: Option<&str>,
    grants_file: Option<&Path>,
) -> Result<(), StartDaemonError> {
    let mut options = DaemonOptions::from_settings(settings, listen)?;
    options.settings_file = settings_file.map(Path::to_owned);
    if let Some(g) = grants_file {
        options.grants_file = Some(g.to_owned());
    }
    let grants = load_grants(options.grants_file.as_deref())?;
    let mut engine = build_engine(settings)?.with_grants(grants);
    // With grants, their brokers run in a process of their own (docs/privileges.md).
    if options.grants_file.is_some() {
        let user = broker_user(&options.broker_user)?;
        let apart = plimsoll_broker::apart::Apart::start(
            std::path::Path::new(plimsoll_broker::apart::OWN_PROGRAM),
            user,
        )
        .map_err(StartDaemonError::BrokerProcess)?;
        tracing::info!(pid = apart.pid(), user = %options.broker_user, uid = user.uid, "broker process up");
        engine = engine.with_brokers(plimsoll_broker::apart::Brokers::Apart(apart));
    }
    let engine = Arc::new(engine);
    let listener =
        TcpListener::bind(options.listen)
            .await
            .map_err(|source| StartDaemonError::Bind {
                addr: options.listen,
                source,
            })?;
    serve_engine(engine, options, listener).await
}

/// The split daemon's serving process, unprivileged since `main` made `prepared` as root
/// (docs/privileges.md, "The split daemon"): its engine reaches the providers only through
/// the launcher.
pub async fn run_split(
    settings: &Settings,
    settings_file: Option<&Path>,
    mut prepared: crate::split::Prepared,
) -> Result<(), StartDaemonError> {
    let launcher_pid = prepared.launcher_pid();
    prepared.forward_launcher_log();
    let mut options = prepared.options.clone();
    options.settings_file = settings_file.map(Path::to_owned);
    let socket = prepared.socket.clone();
    let socket_path = prepared.socket.clone();
    let engine = tokio::task::spawn_blocking({
        let settings = settings.clone();
        move || settings.build_engine_through(&socket)
    })
    .await
    .map_err(|e| StartDaemonError::Split(format!("building the engine panicked: {e}")))?
    .map_err(|e| match e {
        BuildEngineError::NoProviders => StartDaemonError::NoProviders,
        other => StartDaemonError::Engine(other),
    })?;
    tracing::info!(
        user = ?crate::split::serving_user(settings),
        uid = prepared.user.uid,
        launcher_pid = ?launcher_pid,
        socket = %prepared.socket.display(),
        "serving unprivileged; the providers are the launcher's"
    );
    // With a grants file, the launcher holds it and its secrets and keeps the broker
    // process; this process authorizes by the file's text and starts each run's broker there.
    let engine = if prepared.grants {
        let launcher = Arc::new(plimsoll_engine::launch::LauncherBrokers::new(&socket_path));
        let grants = tokio::task::spawn_blocking({
            let launcher = Arc::clone(&launcher);
            move || launcher.grants(false)
        })
        .await
        .map_err(|e| StartDaemonError::Split(format!("loading the grants panicked: {e}")))?
        .map_err(StartDaemonError::Grants)?;
        tracing::info!(
            grant_profiles = grants.names().collect::<Vec<_>>().join(","),
            "grants loaded by the launcher; the broker process is the launcher's"
        );
        options.launcher_grants = Some(Arc::clone(&launcher));
        engine
            .with_grants(grants)
            .with_brokers(plimsoll_broker::apart::Brokers::Apart(
                plimsoll_broker::apart::Apart::remote(launcher),
            ))
    } else {
        engine
    };
    let listener = TcpListener::from_std(prepared.listener).map_err(StartDaemonError::Serve)?;
    serve_engine(Arc::new(engine), options, listener).await
}

/// Serves `engine` on `listener` until a terminating signal: probes in the background,
/// re-checks evidence, reloads on SIGHUP, and shuts down gracefully.
async fn serve_engine(
    engine: Arc<Engine>,
    options: DaemonOptions,
    listener: TcpListener,
) -> Result<(), StartDaemonError> {
    let addr = listener.local_addr().map_err(StartDaemonError::Serve)?;
    let daemon = Arc::new(Daemon::new(engine, options));
    let grant_names = daemon
        .engine()
        .grants()
        .names()
        .collect::<Vec<_>>()
        .join(",");
    tracing::info!(
        addr = %addr,
        callers_file = %daemon.options.callers_file.display(),
        default_floor = %daemon.engine().config().default_floor,
        grant_profiles = grant_names,
        "listening"
    );

    if daemon.engine().expect_saved_sessions() {
        tracing::info!(
            "sessions saved by the previous daemon wait to be restored: not ready until they are"
        );
    }
    let prober = Arc::clone(&daemon);
    let probes = tokio::spawn(async move {
        prober.probe_all().await;
        // Sessions an earlier daemon saved on its SIGTERM come back once providers are known.
        let engine = Arc::clone(prober.engine());
        match tokio::task::spawn_blocking(move || engine.resume_sessions()).await {
            Ok((0, 0)) => {}
            Ok((back, lost)) => {
                tracing::info!(back, lost, "sessions saved by the previous daemon restored");
            }
            Err(e) => tracing::error!(error = %e, "restoring saved sessions panicked"),
        }
        if !prober.engine().ready() {
            tracing::error!(
                "no provider passed its probe: runs are refused until one does; see GET /v1/providers"
            );
        }
        // Warm members are made only under evidence a probe of this daemon gave.
        prober.engine().start_pools();
        prober.spawn_recheck();
    });

    let reloader = Arc::clone(&daemon);
    let hup = tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            return;
        };
        while hup.recv().await.is_some() {
            tracing::info!(
                "SIGHUP: re-reading the callers file, the grants file and the settings file's [pools]"
            );
            reloader.reload_callers();
            reloader.reload_grants();
            let pools = Arc::clone(&reloader);
            if let Err(e) = tokio::task::spawn_blocking(move || pools.reload_pools()).await {
                tracing::error!(error = %e, "reloading the warm pools panicked");
            }
        }
    });

    let result = daemon.serve(listener, terminate_signal()).await;
    probes.abort();
    hup.abort();
    // Every idle warm member goes with the daemon.
    let engine = Arc::clone(daemon.engine());
    if let Err(e) = tokio::task::spawn_blocking(move || {
        engine.stop_pools();
        // Each session its provider can snapshot is saved for the next daemon; the rest end
        // (daemon_restarted), their sandboxes removed.
        let (saved, ended) = engine.suspend_sessions();
        if saved + ended > 0 {
            tracing::info!(saved, ended, "sessions saved for the next daemon, or ended");
        }
    })
    .await
    {
        tracing::error!(error = %e, "stopping the warm pools and sessions panicked");
    }
    if result.is_ok() {
        tracing::info!("stopped");
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(daemon: &str) -> Result<DaemonOptions, StartDaemonError> {
        let settings = Settings::parse(&format!("[daemon]\n{daemon}")).expect("valid TOML");
        DaemonOptions::from_settings(&settings, None)
    }

    #[test]
    fn the_header_timeout_defaults_to_ten_seconds_and_is_bounded() {
        let o = options("").unwrap();
        assert_eq!(
            o.header_timeout,
            Duration::from_secs(DEFAULT_HEADER_TIMEOUT_SECS)
        );
        assert_eq!(DEFAULT_HEADER_TIMEOUT_SECS, 10);
        let o = options("header_timeout_secs = 1").unwrap();
        assert_eq!(o.header_timeout, Duration::from_secs(1));
        let e = options("header_timeout_secs = 0").unwrap_err();
        assert!(
            matches!(
                e,
                StartDaemonError::Invalid {
                    key: "header_timeout_secs",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("from 1 to 3600"), "{e}");
        assert!(options("header_timeout_secs = 3600").is_ok());
        // Far past any deadline a timer can hold: refused, rather than panicking later.
        assert!(options(&format!("header_timeout_secs = {}", i64::MAX)).is_err());
    }

    #[test]
    fn max_connections_per_peer_defaults_to_64_and_is_bounded() {
        assert_eq!(options("").unwrap().max_connections_per_peer, 64);
        assert_eq!(
            options("max_connections_per_peer = 1")
                .unwrap()
                .max_connections_per_peer,
            1
        );
        for bad in ["0", "65537"] {
            let e = options(&format!("max_connections_per_peer = {bad}")).unwrap_err();
            assert!(
                matches!(
                    e,
                    StartDaemonError::Invalid {
                        key: "max_connections_per_peer",
                        ..
                    }
                ),
                "{e}"
            );
        }
    }

    #[test]
    fn peers_are_counted_by_ipv4_address_or_ipv6_slash_64() {
        let key = |s: &str| peer_key(s.parse().unwrap()).to_string();
        assert_eq!(key("10.0.0.1"), "10.0.0.1");
        assert_eq!(key("::ffff:10.0.0.1"), "10.0.0.1");
        assert_eq!(key("2001:db8:1:2:aaaa::1"), key("2001:db8:1:2:bbbb::9"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
        let counts = PeerCounts::default();
        let ip = peer_key("10.0.0.1".parse().unwrap());
        let a = counts.try_take(ip, 2).unwrap();
        let _b = counts.try_take(ip, 2).unwrap();
        assert!(counts.try_take(ip, 2).is_none());
        assert!(
            counts
                .try_take(peer_key("10.0.0.2".parse().unwrap()), 2)
                .is_some()
        );
        drop(a);
        assert!(counts.try_take(ip, 2).is_some());
    }

    #[test]
    fn max_connections_defaults_to_512_and_is_bounded() {
        assert_eq!(options("").unwrap().max_connections, 512);
        assert_eq!(options("max_connections = 1").unwrap().max_connections, 1);
        assert_eq!(
            options("max_connections = 65536").unwrap().max_connections,
            65536
        );
        for bad in ["0", "65537"] {
            let e = options(&format!("max_connections = {bad}")).unwrap_err();
            assert!(
                matches!(
                    e,
                    StartDaemonError::Invalid {
                        key: "max_connections",
                        ..
                    }
                ),
                "{e}"
            );
            assert!(e.to_string().contains("from 1 to 65536"), "{e}");
        }
    }
}
