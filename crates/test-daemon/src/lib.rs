//! An in-process daemon for tests, only ever a dev-dependency: a real HTTP server on a
//! loopback port, with its own tokio runtime thread, stopped when dropped.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use plimsoll_broker::GrantProfiles;
use plimsoll_engine::Engine;
use plimsoll_engine::settings::Settings;
use tokio::sync::oneshot;

use plimsoll_callers::add_caller;
use plimsoll_daemon::{Daemon, DaemonOptions, build_engine};

pub use plimsoll_daemon::testing::{UIDS_PER_PORT, uid_base_for_port};

/// A daemon serving on a loopback port, stopped when dropped.
#[derive(Debug)]
pub struct TestDaemon {
    /// Base URL, e.g. `http://127.0.0.1:43121`.
    pub url: String,
    /// A caller token valid on it (caller name `test`).
    pub token: String,
    callers_file: PathBuf,
    engine: Arc<Engine>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    // Last, so the directory outlives the server thread.
    _dir: tempfile::TempDir,
}

impl TestDaemon {
    /// Starts a daemon with these settings (TOML, as in a settings file). `[daemon].listen`
    /// and `callers_file` are overridden: it listens on an ephemeral loopback port and uses a
    /// fresh callers file holding one caller `test`; `max_body_bytes` and `recheck_secs` are
    /// kept. When the settings name no `providers`, it offers `process`; when they set no
    /// `state_dir`, runs live in a fresh temporary directory; when they set no
    /// `sandbox_uid_base`, it takes [`uid_base_for_port`] of its port, so test daemons running
    /// at once never share a sandbox uid. Returns once every provider has
    /// been probed (whether or not one passed: see `GET /readyz`). Panics on invalid settings.
    pub fn start(settings_toml: &str) -> TestDaemon {
        TestDaemon::start_with_grants(settings_toml, GrantProfiles::none())
    }

    /// [`TestDaemon::start`], with these grant profiles in its engine.
    pub fn start_with_grants(settings_toml: &str, grants: GrantProfiles) -> TestDaemon {
        let dir = tempfile::tempdir().expect("create a temporary directory for the test daemon");
        // Sandbox uids must traverse it to reach their run directories under `state`.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
            .expect("make the test daemon's directory traversable");
        let mut settings = Settings::parse(settings_toml)
            .unwrap_or_else(|e| panic!("TestDaemon: invalid settings: {e}"));
        if settings.providers.is_none() {
            settings.providers = Some(vec!["process".into()]);
        }
        if settings.state_dir.is_none() {
            let state = dir.path().join("state");
            std::fs::create_dir_all(&state).expect("create the test daemon's state directory");
            settings.state_dir = Some(state);
        }
        // The port is bound first: it is unique on the host while this daemon lives, so it
        // also picks a sandbox uid range no other test daemon uses (the end of a run kills
        // every process of its uid, so two daemons must never share one).
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        listener
            .set_nonblocking(true)
            .expect("make the listener non-blocking");
        let addr = listener.local_addr().expect("the listener's address");
        if settings.sandbox_uid_base.is_none() {
            let wanted = settings.max_concurrent.unwrap_or(8);
            assert!(
                2 * wanted < UIDS_PER_PORT as usize,
                "TestDaemon: max_concurrent {wanted} needs an explicit sandbox_uid_base"
            );
            settings.sandbox_uid_base = Some(uid_base_for_port(addr.port()));
        }
        let callers_file = dir.path().join("callers.toml");
        let token = add_caller(&callers_file, "test")
            .expect("write the test callers file")
            .expose()
            .clone();
        settings.daemon.listen = Some(addr.to_string());
        settings.daemon.callers_file = Some(callers_file.clone());

        let options = DaemonOptions::from_settings(&settings, None)
            .unwrap_or_else(|e| panic!("TestDaemon: {e}"));
        let engine = Arc::new(
            build_engine(&settings)
                .unwrap_or_else(|e| panic!("TestDaemon: {e}"))
                .with_grants(grants),
        );
        let daemon = Daemon::new(Arc::clone(&engine), options);

        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let (probed_tx, probed_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("test-daemon-{}", addr.port()))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("build the test daemon's runtime");
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener)
                        .expect("hand the listener to tokio");
                    let daemon = Arc::new(daemon);
                    let prober = Arc::clone(&daemon);
                    tokio::spawn(async move {
                        prober.probe_all().await;
                        let _ = probed_tx.send(());
                        prober.spawn_recheck();
                    });
                    let stopped = async move {
                        let _ = stop_rx.await;
                    };
                    if let Err(e) = daemon.serve(listener, stopped).await {
                        eprintln!("TestDaemon: {e}");
                    }
                });
            })
            .expect("spawn the test daemon's thread");
        // Serving has started already; wait for the probes so callers see a settled daemon.
        let _ = probed_rx.recv();
        TestDaemon {
            url: format!("http://{addr}"),
            token,
            callers_file,
            engine,
            stop: Some(stop_tx),
            thread: Some(thread),
            _dir: dir,
        }
    }

    /// Adds a caller to this daemon's callers file and returns its token. The daemon sees
    /// the change on the next request.
    pub fn add_caller(&self, name: &str) -> String {
        add_caller(&self.callers_file, name)
            .unwrap_or_else(|e| panic!("TestDaemon::add_caller: {e}"))
            .expose()
            .clone()
    }

    /// The callers file this daemon reads.
    pub fn callers_file(&self) -> &Path {
        &self.callers_file
    }

    /// The engine behind the daemon (to look at `in_flight()` or `providers()`).
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
