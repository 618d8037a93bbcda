//! Where a command runs: the settings file, the embedded engine, or a daemon and its token.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, anyhow};
use plimsoll_client::{Client, Token};
use plimsoll_engine::Engine;
use plimsoll_engine::settings::{PROVIDER_NAMES, Settings};
use plimsoll_env as env;

use crate::Failure;

/// The settings file read when neither --config nor PLIMSOLL_CONFIG names one.
pub const DEFAULT_CONFIG: &str = "/etc/plimsoll/plimsoll.toml";
/// Where runs live when the settings name no state_dir and the CLI runs as root.
pub const ROOT_STATE_DIR: &str = "/var/lib/plimsoll";

/// The settings: --config, else PLIMSOLL_CONFIG, else /etc/plimsoll/plimsoll.toml if it
/// exists, else the built-in defaults.
pub fn load_settings(config: Option<&Path>) -> Result<Settings, Failure> {
    match settings_path(config) {
        Some(p) => Settings::load(&p).map_err(Failure::usage),
        None => Ok(Settings::default()),
    }
}

/// The state directory of the embedded engine when the settings name none:
/// /var/lib/plimsoll as root, else /tmp/plimsoll-UID.
pub fn default_state_dir() -> PathBuf {
    let uid = rustix::process::geteuid();
    if uid.is_root() {
        PathBuf::from(ROOT_STATE_DIR)
    } else {
        PathBuf::from(format!("/tmp/plimsoll-{}", uid.as_raw()))
    }
}

/// Creates `dir` (mode 0711: sandbox uids may pass through to their own run directory, but
/// not list it) when it does not exist.
pub fn ensure_state_dir(dir: &Path) -> anyhow::Result<()> {
    if dir.exists() {
        return Ok(());
    }
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the state directory {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
        .with_context(|| format!("cannot set the mode of {}", dir.display()))
}

/// The settings file in force, if any (see [`load_settings`]).
pub fn settings_path(config: Option<&Path>) -> Option<PathBuf> {
    config
        .map(Path::to_path_buf)
        .or_else(|| env::get(env::PLIMSOLL_CONFIG).map(PathBuf::from))
        .or_else(|| {
            let default = PathBuf::from(DEFAULT_CONFIG);
            default.exists().then_some(default)
        })
}

/// The embedded engine: the settings' providers (default: every provider this build has),
/// probed. Slow: probing runs real sandboxes.
pub fn embedded_engine(settings: &Settings) -> Result<Engine, Failure> {
    let engine = unprobed_engine(settings)?;
    engine.probe_all();
    Ok(engine)
}

/// The embedded engine, not probed yet: the caller probes what it needs
/// ([`Engine::probe_for`]), reusing the evidence cache of the settings when there is one.
pub fn unprobed_engine(settings: &Settings) -> Result<Engine, Failure> {
    let mut settings = settings.clone();
    if settings.state_dir.is_none() {
        settings.state_dir = Some(default_state_dir());
    }
    if let Some(dir) = &settings.state_dir {
        ensure_state_dir(dir).map_err(Failure::usage)?;
    }
    let mut engine = settings
        .build_engine(PROVIDER_NAMES)
        .map_err(|e| Failure::usage(anyhow!(e).context("cannot build the embedded engine")))?;
    // Evidence this host checked recently saves a probe per invocation (docs/cli.md).
    if let Some(cache) = settings.evidence_cache() {
        engine = engine.with_evidence_cache(cache);
    }
    Ok(engine)
}

/// The embedded engine, not probed yet, with the grant profiles of `--grants FILE` (or the
/// settings' `grants_file`), read before the engine is built: a missing secret fails at once.
pub fn granted_engine(settings: &Settings, grants: Option<&Path>) -> Result<Engine, Failure> {
    let grants = match grants.or(settings.grants_file.as_deref()) {
        Some(path) => Some(Engine::load_grants(path).map_err(Failure::usage)?),
        None => None,
    };
    let engine = unprobed_engine(settings)?;
    Ok(match grants {
        Some(grants) => engine.with_grants(grants),
        None => engine,
    })
}

/// The daemon URL: --daemon, else PLIMSOLL_DAEMON; `None` means the embedded engine.
pub fn daemon_url(flag: Option<&str>) -> Option<String> {
    flag.map(str::to_owned)
        .or_else(|| env::get(env::PLIMSOLL_DAEMON))
}

/// A client of `url`, with the token from PLIMSOLL_TOKEN.
pub fn client(url: &str) -> Result<Client, Failure> {
    let token = env::get(env::PLIMSOLL_TOKEN).ok_or_else(|| {
        Failure::usage(anyhow!(
            "PLIMSOLL_TOKEN is not set: export the caller token the operator gave you (`plimsoll callers add NAME` prints one) to talk to {url}"
        ))
    })?;
    Ok(Client::new(url, Token::new(token)))
}
