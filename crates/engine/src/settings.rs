//! The operator's settings file (TOML), shared by plimsolld and the CLI's embedded engine:
//! parsed, then validated against the host, then turned into an [`Engine`].
//!
//! ```toml
//! default_floor = "container"      # the floor of a request that sets none
//! providers = ["process"]          # which providers to offer; none means nothing runs
//! state_dir = "/var/lib/plimsoll"
//! max_concurrent = 8
//! max_per_caller = 4
//! sandbox_uid_base = 2000000
//! grants_file = "/etc/plimsoll/grants.toml"   # grant profiles; absent: every grant is refused
//! evidence_cache_secs = 300        # the CLI reuses evidence this young (0: always probe)
//!
//! [limits.defaults]                # any subset; the rest keep the built-in values
//! timeout_ms = 10000
//! [limits.maximums]
//! timeout_ms = 600000
//!
//! [process]
//! node = "/usr/bin/node"
//! python = "/usr/bin/python3"
//! probe = "/usr/local/lib/plimsoll/plimsoll-probe"   # default: beside the running binary
//!
//! [qemu]                           # the VM provider (docs/vm-tier.md)
//! accelerator = "auto"             # auto | kvm | tcg
//! trial_runner = "/usr/local/lib/plimsoll/plimsoll-trial-runner"   # default: beside the running binary
//!
//! [oci]                            # the crun, runc and runsc providers (docs/container-tier.md)
//! image = "/var/lib/plimsoll/build/images/sandbox"   # default: the repository's build/images/sandbox
//! agent = "/usr/local/lib/plimsoll/plimsoll-agent"   # default: beside the running binary
//! probe = "/usr/local/lib/plimsoll/plimsoll-probe"   # default: beside the running binary
//! trial_runner = "/usr/local/lib/plimsoll/plimsoll-trial-runner"   # default: beside the running binary
//! state_root = "/run/plimsoll"     # each provider keeps its state in <state_root>/<name>
//! cgroup_parent = "/plimsoll"      # runs' cgroups: <cgroup_parent>/<name>/<run_id>
//! cpu_millis = 1000                # CPU per run, in thousandths of a CPU
//! crun = "/usr/bin/crun"
//! runc = "/usr/sbin/runc"
//! runsc = "/usr/bin/runsc"
//! runsc_platform = "ptrace"
//!
//! [images]                         # the image store (docs/images.md)
//! store = "/var/lib/plimsoll/build/images"   # default: the directory holding [oci] image
//! default = "sandbox"              # default: the last component of [oci] image
//!
//! [pools.crun.javascript]          # warm pools (docs/warm-pools.md); absent: the default floor's
//! min_idle = 1                      # provider keeps one member per language warm
//! max_members = 2                   # grows towards it while claims outpace the refill
//! max_age_secs = 300
//! shrink_after_secs = 30            # a grown pool drops one member after this long unclaimed
//! images = ["sandbox", "python-data"]   # one pool per image (default: the default image's)
//!
//! [sessions]                       # docs/sessions.md
//! max_total = 4                    # open at once; each holds one of max_concurrent's uid slots
//! max_per_caller = 2
//! idle_timeout_secs = 300          # default; a session may ask for up to max_idle_timeout_secs
//! max_idle_timeout_secs = 3600
//! lifetime_secs = 3600             # default; a session may ask for up to max_lifetime_secs
//! max_lifetime_secs = 86400
//! max_fork = 8                     # copies one fork may ask for
//! snapshot_bytes_per_caller = 1073741824
//! snapshot_bytes = 4294967296      # over all callers
//! snapshot_lifetime_secs = 3600    # then a snapshot is removed
//!
//! [daemon]
//! listen = "127.0.0.1:7878"
//! callers_file = "/etc/plimsoll/callers.toml"
//! max_body_bytes = 8388608
//! recheck_secs = 300
//! header_timeout_secs = 10         # request head must arrive within it; also the idle keep-alive cap
//! max_connections = 512            # connections open at once; more are closed unanswered
//! max_connections_per_peer = 64    # the same, from one IPv4 address or IPv6 /64
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use plimsoll_oci::{OciConfig, OciProvider, RuntimeKind};
use plimsoll_process::{ProcessConfig, ProcessProvider};
use plimsoll_sandbox::ResolvedLimits;
use plimsoll_vm::{AccelChoice, VmConfig, VmProvider};
use plimsoll_wire::Tier;
use serde::Deserialize;

use crate::config::{EngineConfig, LimitPolicy};
use crate::engine::{Engine, PoolsReplaced};
use crate::error::BuildEngineError;
use crate::pool::{PoolConfig, PoolSettings};
use crate::providers::AnyProvider;

/// The settings file, as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Floor for requests that set none (default `container`).
    pub default_floor: Option<Tier>,
    /// Providers to offer, by name. Absent: the caller's default (none for the daemon).
    pub providers: Option<Vec<String>>,
    /// Where runs' directories live.
    pub state_dir: Option<PathBuf>,
    /// Runs at once, in total.
    pub max_concurrent: Option<usize>,
    /// Runs at once per caller.
    pub max_per_caller: Option<usize>,
    /// First uid of the sandbox uid range.
    pub sandbox_uid_base: Option<u32>,
    /// The grants file (docs/capability-grants.md); absent: every grant is refused.
    pub grants_file: Option<PathBuf>,
    /// How long the CLI's embedded engine reuses evidence this host checked (seconds,
    /// default 300; 0: probe on every invocation). The daemon always probes.
    pub evidence_cache_secs: Option<u64>,
    /// Limit defaults and maximums.
    #[serde(default)]
    pub limits: LimitsSection,
    /// The process provider.
    #[serde(default)]
    pub process: ProcessSection,
    /// The OCI providers (crun, runc, runsc).
    #[serde(default)]
    pub oci: OciSection,
    /// The QEMU provider.
    #[serde(default)]
    pub qemu: QemuSection,
    /// The daemon's own settings (ignored by the CLI's embedded engine).
    #[serde(default)]
    pub daemon: DaemonSection,
    /// Limits on sessions (docs/sessions.md).
    #[serde(default)]
    pub sessions: SessionsSection,
    /// The image store (docs/images.md).
    #[serde(default)]
    pub images: ImagesSection,
    /// Warm pools by provider and language. Absent: the default floor's provider keeps
    /// [`PoolSettings::default`] for both languages; present (even empty): exactly these.
    pub pools: Option<std::collections::BTreeMap<String, PoolsOfProvider>>,
}

/// `[images]`: where the operator's images live and which one a request naming none gets.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImagesSection {
    /// The image store: one directory per image (default: the directory holding `[oci]
    /// image`, so `build/images` of the repository).
    pub store: Option<PathBuf>,
    /// The default image's name (default: the last component of `[oci] image`, `sandbox`).
    /// The OCI providers' probes run in `[oci] image`; it must be this image of the store.
    pub default: Option<String>,
}

impl Settings {
    /// The image store these settings describe: `[images]`, its absent values taken from
    /// `[oci] image` (the default image is the store's entry that directory is).
    pub fn image_store(&self) -> Result<plimsoll_image::ImageStore, String> {
        let oci_image = self.oci.image.clone().unwrap_or_else(default_image_dir);
        let store = match (&self.images.store, oci_image.parent()) {
            (Some(s), _) => s.clone(),
            (None, Some(parent)) => parent.to_owned(),
            (None, None) => {
                return Err(format!(
                    "[oci] image `{}` has no parent directory to be the image store: set [images] store",
                    oci_image.display()
                ));
            }
        };
        let default = match (&self.images.default, oci_image.file_name()) {
            (Some(d), _) => d.clone(),
            (None, Some(name)) => name.to_string_lossy().into_owned(),
            (None, None) => "sandbox".to_owned(),
        };
        if !store.is_absolute() {
            return Err(format!(
                "[images] store `{}` must be an absolute path",
                store.display()
            ));
        }
        if !plimsoll_wire::is_image_name(&default) {
            return Err(format!(
                "[images] default `{default}` is not an image name (1 to 64 characters of a-z 0-9 . _ -, starting with a letter or digit)"
            ));
        }
        if store.join(&default) != oci_image {
            return Err(format!(
                "[images] default `{default}` in store {} is not [oci] image {}: the probes run in the default image; set both to the same directory",
                store.display(),
                oci_image.display()
            ));
        }
        Ok(plimsoll_image::ImageStore::new(store, default))
    }
}

/// `[sessions]`: limits on sessions; each absent value keeps the built-in one.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionsSection {
    /// Sessions open at once, in total (default 4).
    pub max_total: Option<usize>,
    /// Sessions open at once per caller (default 2).
    pub max_per_caller: Option<usize>,
    /// The idle timeout of a session that asks for none, seconds (default 300).
    pub idle_timeout_secs: Option<u64>,
    /// The longest idle timeout a session may ask for, seconds (default 3600).
    pub max_idle_timeout_secs: Option<u64>,
    /// The lifetime of a session that asks for none, seconds (default 3600).
    pub lifetime_secs: Option<u64>,
    /// The longest lifetime a session may ask for, seconds (default 86400).
    pub max_lifetime_secs: Option<u64>,
    /// The most copies one fork may ask for (default 8).
    pub max_fork: Option<u32>,
    /// Bytes of snapshots one caller may keep at once (default 1 GiB).
    pub snapshot_bytes_per_caller: Option<u64>,
    /// Bytes of snapshots kept at once over all callers (default 4 GiB).
    pub snapshot_bytes: Option<u64>,
    /// How long a snapshot is kept, seconds (default 3600).
    pub snapshot_lifetime_secs: Option<u64>,
}

impl SessionsSection {
    fn apply(&self, d: crate::config::SessionPolicy) -> crate::config::SessionPolicy {
        let secs = |v: Option<u64>, d: Duration| v.map_or(d, Duration::from_secs);
        crate::config::SessionPolicy {
            max_total: self.max_total.unwrap_or(d.max_total),
            max_per_caller: self.max_per_caller.unwrap_or(d.max_per_caller),
            idle_timeout: secs(self.idle_timeout_secs, d.idle_timeout),
            max_idle_timeout: secs(self.max_idle_timeout_secs, d.max_idle_timeout),
            lifetime: secs(self.lifetime_secs, d.lifetime),
            max_lifetime: secs(self.max_lifetime_secs, d.max_lifetime),
            max_fork: self.max_fork.unwrap_or(d.max_fork),
            snapshot_bytes_per_caller: self
                .snapshot_bytes_per_caller
                .unwrap_or(d.snapshot_bytes_per_caller),
            snapshot_bytes: self.snapshot_bytes.unwrap_or(d.snapshot_bytes),
            snapshot_lifetime: secs(self.snapshot_lifetime_secs, d.snapshot_lifetime),
        }
    }
}

/// `[pools.<provider>]`: a pool per language.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolsOfProvider {
    /// `[pools.<provider>.javascript]`.
    pub javascript: Option<PoolValues>,
    /// `[pools.<provider>.python]`.
    pub python: Option<PoolValues>,
}

/// One pool's settings as written; each absent one keeps [`PoolSettings::default`]'s.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolValues {
    /// Members kept idle (0: no pool).
    pub min_idle: Option<usize>,
    /// Members at most, idle or being made.
    pub max_members: Option<usize>,
    /// An idle member older than this is replaced, in seconds.
    pub max_age_secs: Option<u64>,
    /// A pool grown past `min_idle` by demand shrinks back by one member after this many
    /// seconds without a claim (default 30).
    pub shrink_after_secs: Option<u64>,
    /// The images kept warm, by name: one pool of these settings for each (default: the
    /// default image's alone). A name not in the store keeps no member until it is there.
    pub images: Option<Vec<String>>,
}

impl PoolValues {
    fn apply(&self, d: PoolSettings) -> PoolSettings {
        PoolSettings {
            min_idle: self.min_idle.unwrap_or(d.min_idle),
            max_members: self.max_members.unwrap_or(d.max_members),
            max_age: self.max_age_secs.map_or(d.max_age, Duration::from_secs),
            shrink_after: self
                .shrink_after_secs
                .map_or(d.shrink_after, Duration::from_secs),
        }
    }
}

/// `[limits]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    /// `[limits.defaults]`.
    #[serde(default)]
    pub defaults: LimitValues,
    /// `[limits.maximums]`.
    #[serde(default)]
    pub maximums: LimitValues,
}

/// Limit values in a settings file; each absent one keeps the built-in value.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitValues {
    /// Milliseconds.
    pub timeout_ms: Option<u64>,
    /// Bytes.
    pub memory_bytes: Option<u64>,
    /// Bytes per stream.
    pub output_bytes: Option<u64>,
    /// Processes.
    pub pids: Option<u64>,
    /// Bytes.
    pub disk_bytes: Option<u64>,
    /// Bytes per artifact.
    pub artifact_bytes: Option<u64>,
}

impl LimitValues {
    fn apply(&self, base: ResolvedLimits) -> ResolvedLimits {
        ResolvedLimits {
            timeout: self.timeout_ms.map_or(base.timeout, Duration::from_millis),
            memory_bytes: self.memory_bytes.unwrap_or(base.memory_bytes),
            output_bytes: self.output_bytes.unwrap_or(base.output_bytes),
            pids: self.pids.unwrap_or(base.pids),
            disk_bytes: self.disk_bytes.unwrap_or(base.disk_bytes),
            artifact_bytes: self.artifact_bytes.unwrap_or(base.artifact_bytes),
        }
    }
}

/// `[process]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessSection {
    /// The node binary (default `/usr/bin/node`).
    pub node: Option<PathBuf>,
    /// The python3 binary (default `/usr/bin/python3`).
    pub python: Option<PathBuf>,
    /// The probe program (default: `plimsoll-probe` beside the running binary).
    pub probe: Option<PathBuf>,
}

/// `[qemu]`: the VM provider (docs/vm-tier.md).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QemuSection {
    /// The QEMU binary (default `/usr/bin/qemu-system-x86_64`).
    pub qemu: Option<PathBuf>,
    /// What scripts/build-vm-assets built (default: `build/vm` of the repository the running
    /// binary was built in, else `/var/lib/plimsoll/build/vm`).
    pub assets: Option<PathBuf>,
    /// `auto` (KVM if a guest boots under it, else TCG), `kvm` or `tcg` (default `auto`).
    pub accelerator: Option<String>,
    /// The trial runner copied into guests of runs with a trial step (default:
    /// `plimsoll-trial-runner` beside the running binary).
    pub trial_runner: Option<PathBuf>,
    /// vCPUs per VM (default 2).
    pub cpus: Option<u32>,
    /// Seconds a guest may take to boot under TCG (default 30).
    pub boot_timeout_secs: Option<u64>,
    /// Seconds a guest may take to boot under KVM before KVM is judged unusable (default 5).
    pub kvm_boot_timeout_secs: Option<u64>,
}

impl QemuSection {
    fn config(
        &self,
        state_dir: &Path,
        probe_uid: u32,
        run_uids: std::ops::Range<u32>,
    ) -> Result<VmConfig, String> {
        let mut c = VmConfig::new(
            self.assets.clone().unwrap_or_else(default_vm_assets_dir),
            default_tool_path("plimsoll-agent"),
            default_probe_path(),
            default_tool_path("plimsoll-guest-init"),
            state_dir.to_owned(),
            probe_uid,
            run_uids,
        );
        c.trial_runner = self
            .trial_runner
            .clone()
            .unwrap_or_else(|| default_tool_path("plimsoll-trial-runner"));
        if let Some(q) = &self.qemu {
            c.qemu = q.clone();
        }
        if let Some(a) = &self.accelerator {
            c.accelerator = AccelChoice::parse(a).map_err(|e| format!("[qemu] {e}"))?;
        }
        if let Some(n) = self.cpus {
            if n == 0 {
                return Err("[qemu] cpus must be at least 1".into());
            }
            c.cpus = n;
        }
        if let Some(s) = self.boot_timeout_secs {
            c.boot_timeout = Duration::from_secs(s);
        }
        if let Some(s) = self.kvm_boot_timeout_secs {
            c.kvm_boot_timeout = Duration::from_secs(s);
        }
        Ok(c)
    }
}

/// `[oci]`: the crun, runc and runsc providers.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OciSection {
    /// The sandbox image directory, holding `rootfs/` and `identity` (default:
    /// `build/images/sandbox` of the repository the running binary was built in, else
    /// `/var/lib/plimsoll/build/images/sandbox`).
    pub image: Option<PathBuf>,
    /// The in-sandbox agent for projects (default: `plimsoll-agent` beside the running binary).
    pub agent: Option<PathBuf>,
    /// The probe program (default: `plimsoll-probe` beside the running binary).
    pub probe: Option<PathBuf>,
    /// The trial runner for runs with a trial step (default: `plimsoll-trial-runner` beside
    /// the running binary).
    pub trial_runner: Option<PathBuf>,
    /// Runtime state, bundles and locks, per provider in `<state_root>/<name>` (default
    /// `/run/plimsoll`).
    pub state_root: Option<PathBuf>,
    /// The cgroup parent, absolute (default `/plimsoll`).
    pub cgroup_parent: Option<String>,
    /// CPU per run, in thousandths of a CPU (default 1000).
    pub cpu_millis: Option<u32>,
    /// The crun binary (default `/usr/bin/crun`).
    pub crun: Option<PathBuf>,
    /// The runc binary (default `/usr/sbin/runc`).
    pub runc: Option<PathBuf>,
    /// The runsc binary (default `/usr/bin/runsc`).
    pub runsc: Option<PathBuf>,
    /// runsc's `--platform` (default `ptrace`).
    pub runsc_platform: Option<String>,
}

impl OciSection {
    /// Checks the values that make no sense whatever the host.
    fn validate(&self) -> Result<(), String> {
        if let Some(parent) = &self.cgroup_parent {
            let ok = parent.starts_with('/')
                && parent.len() > 1
                && parent.trim_start_matches('/').split('/').all(|s| {
                    !s.is_empty()
                        && s != "."
                        && s != ".."
                        && s.chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                });
            if !ok {
                return Err(format!(
                    "[oci] cgroup_parent `{parent}` must be an absolute cgroup path such as /plimsoll"
                ));
            }
        }
        for (key, path) in [
            ("image", &self.image),
            ("agent", &self.agent),
            ("probe", &self.probe),
            ("trial_runner", &self.trial_runner),
            ("state_root", &self.state_root),
            ("crun", &self.crun),
            ("runc", &self.runc),
            ("runsc", &self.runsc),
        ] {
            if let Some(p) = path
                && !p.is_absolute()
            {
                return Err(format!(
                    "[oci] {key} `{}` must be an absolute path",
                    p.display()
                ));
            }
        }
        if self.cpu_millis == Some(0) {
            return Err("[oci] cpu_millis must be at least 1".into());
        }
        if let Some(p) = &self.runsc_platform
            && (p.is_empty() || !p.chars().all(|c| c.is_ascii_lowercase()))
        {
            return Err(format!(
                "[oci] runsc_platform `{p}` is not a platform name (ptrace, kvm)"
            ));
        }
        Ok(())
    }

    /// The provider configuration for one runtime.
    fn config(&self, kind: RuntimeKind, probe_uid: u32) -> OciConfig {
        let mut c = OciConfig::new(
            kind,
            self.image.clone().unwrap_or_else(default_image_dir),
            self.agent
                .clone()
                .unwrap_or_else(|| default_tool_path("plimsoll-agent")),
            self.probe.clone().unwrap_or_else(default_probe_path),
            probe_uid,
        );
        c.trial_runner = self
            .trial_runner
            .clone()
            .unwrap_or_else(|| default_tool_path("plimsoll-trial-runner"));
        let binary = match kind {
            RuntimeKind::Crun => &self.crun,
            RuntimeKind::Runc => &self.runc,
            RuntimeKind::Runsc => &self.runsc,
        };
        if let Some(b) = binary {
            c.binary = b.clone();
        }
        if let Some(r) = &self.state_root {
            c.state_root = r.clone();
        }
        if let Some(p) = &self.cgroup_parent {
            c.cgroup_parent = p.clone();
        }
        if let Some(m) = self.cpu_millis {
            c.cpu_millis = m;
        }
        if let Some(p) = &self.runsc_platform {
            c.platform = p.clone();
        }
        c
    }
}

/// `[daemon]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonSection {
    /// Address to listen on (default `127.0.0.1:7878`).
    pub listen: Option<String>,
    /// The callers file (default `/etc/plimsoll/callers.toml`).
    pub callers_file: Option<PathBuf>,
    /// Largest request body accepted, in bytes (default 8 MiB).
    pub max_body_bytes: Option<u64>,
    /// Seconds between evidence re-checks (default 300).
    pub recheck_secs: Option<u64>,
    /// Seconds a client has to send a whole request head, and the longest a kept-alive
    /// connection may idle between requests (default 10; 1 to 3600).
    pub header_timeout_secs: Option<u64>,
    /// Connections open at once; one beyond it is closed at once, unanswered (default 512;
    /// 1 to 65536).
    pub max_connections: Option<u64>,
    /// Connections open at once from one peer (one IPv4 address, or one IPv6 /64); one beyond
    /// it is closed at once, unanswered (default 64; 1 to 65536).
    pub max_connections_per_peer: Option<u64>,
    /// The user the broker process runs as when there is a grants file (default
    /// `plimsoll-broker`; docs/privileges.md): unprivileged, and no other process's.
    pub broker_user: Option<String>,
    /// The user the serving process runs as (docs/privileges.md, "The split daemon"): when
    /// set, plimsolld keeps root only in its launcher process and serves as this user, with
    /// no capability. Unset (the default): one process, root. `plimsoll init` sets it to
    /// [`DEFAULT_SERVING_USER`], which it and the package create.
    pub serving_user: Option<String>,
}

/// The serving user `plimsoll init` names and creates (and the package's postinst creates).
pub const DEFAULT_SERVING_USER: &str = "plimsoll";

/// The settings could not be read or make no sense.
#[derive(Debug, thiserror::Error)]
pub enum LoadSettingsError {
    /// The file could not be read.
    #[error("cannot read settings file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid settings TOML.
    #[error("settings file {path} is invalid: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong, with line and column.
        message: String,
    },
}

/// Every provider family this build knows, by name.
pub const PROVIDER_NAMES: &[&str] = &["process", "crun", "runc", "runsc", "qemu"];

impl Settings {
    /// Reads and parses a settings file.
    pub fn load(path: &Path) -> Result<Settings, LoadSettingsError> {
        let text = std::fs::read_to_string(path).map_err(|source| LoadSettingsError::Read {
            path: path.to_owned(),
            source,
        })?;
        Settings::parse(&text).map_err(|message| LoadSettingsError::Parse {
            path: path.to_owned(),
            message,
        })
    }

    /// Parses settings TOML.
    pub fn parse(text: &str) -> Result<Settings, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// The engine configuration these settings describe.
    pub fn engine_config(&self) -> EngineConfig {
        let d = EngineConfig::default();
        let lp = LimitPolicy::default();
        EngineConfig {
            default_floor: self.default_floor.unwrap_or(d.default_floor),
            limits: LimitPolicy {
                defaults: self.limits.defaults.apply(lp.defaults),
                maximums: self.limits.maximums.apply(lp.maximums),
            },
            max_concurrent: self.max_concurrent.unwrap_or(d.max_concurrent),
            max_per_caller: self.max_per_caller.unwrap_or(d.max_per_caller),
            sandbox_uid_base: self.sandbox_uid_base.unwrap_or(d.sandbox_uid_base),
            state_dir: self.state_dir.clone().unwrap_or(d.state_dir),
            pools: Vec::new(),
            sessions: self.sessions.apply(d.sessions),
            images: self.image_store().ok(),
        }
    }

    /// The warm pools these settings ask for over `providers` (the names in force): the
    /// `[pools]` section's, or without one, both languages at the cheapest of `providers`
    /// that makes members and is built for the default floor. Refuses a pool of an unknown
    /// or unconfigured provider, and settings that make no sense.
    pub fn pool_configs(
        &self,
        providers: &[&AnyProvider],
        default_floor: Tier,
    ) -> Result<Vec<PoolConfig>, BuildEngineError> {
        use plimsoll_sandbox::Provider as _;
        use plimsoll_wire::Language;
        let Some(pools) = &self.pools else {
            let default = providers
                .iter()
                .filter(|p| p.warms() && p.nominal_tier() >= default_floor)
                .min_by_key(|p| p.cost());
            return Ok(default.map_or_else(Vec::new, |p| {
                [Language::Javascript, Language::Python]
                    .into_iter()
                    .map(|language| PoolConfig {
                        provider: p.name().to_owned(),
                        language,
                        settings: PoolSettings::default(),
                        image: None,
                    })
                    .collect()
            }));
        };
        let mut out = Vec::new();
        for (name, langs) in pools {
            let Some(p) = providers.iter().find(|p| p.name() == name) else {
                return Err(BuildEngineError::Invalid(format!(
                    "[pools.{name}] names a provider that is not configured: add it to `providers` or remove the section"
                )));
            };
            for (language, values) in [
                (Language::Javascript, &langs.javascript),
                (Language::Python, &langs.python),
            ] {
                let Some(values) = values else { continue };
                let settings = values.apply(PoolSettings::default());
                let lang = format!("{language:?}").to_lowercase();
                if settings.min_idle == 0 {
                    continue;
                }
                if !p.warms() {
                    return Err(BuildEngineError::Invalid(format!(
                        "[pools.{name}.{lang}]: {name} has no warm pool yet; remove the section (its runs start cold)"
                    )));
                }
                if settings.min_idle > settings.max_members || settings.max_members > 64 {
                    return Err(BuildEngineError::Invalid(format!(
                        "[pools.{name}.{lang}]: min_idle ({}) must be at most max_members ({}), and max_members at most 64",
                        settings.min_idle, settings.max_members
                    )));
                }
                if settings.max_age.is_zero() {
                    return Err(BuildEngineError::Invalid(format!(
                        "[pools.{name}.{lang}]: max_age_secs must be at least 1"
                    )));
                }
                // One pool per image named (each with these settings), or the default
                // image's alone.
                let images: Vec<Option<String>> = match &values.images {
                    None => vec![None],
                    Some(list) if list.is_empty() => {
                        return Err(BuildEngineError::Invalid(format!(
                            "[pools.{name}.{lang}]: images is empty: name at least one image, or leave it out for the default image"
                        )));
                    }
                    Some(list) => {
                        if let Some(bad) = list.iter().find(|i| !plimsoll_wire::is_image_name(i)) {
                            return Err(BuildEngineError::Invalid(format!(
                                "[pools.{name}.{lang}]: `{bad}` is not an image name"
                            )));
                        }
                        list.iter().cloned().map(Some).collect()
                    }
                };
                for image in images {
                    out.push(PoolConfig {
                        provider: name.clone(),
                        language,
                        settings,
                        image,
                    });
                }
            }
        }
        Ok(out)
    }

    /// The evidence cache of an engine built from these settings: `evidence-cache.json` in
    /// the state directory, keyed on a digest of every setting; `None` when
    /// `evidence_cache_secs` is 0 or this process is not root (only root's file is trusted).
    pub fn evidence_cache(&self) -> Option<crate::EvidenceCache> {
        let secs = self
            .evidence_cache_secs
            .unwrap_or(crate::evidence_cache::DEFAULT_MAX_AGE_SECS);
        if secs == 0 || !rustix::process::geteuid().is_root() {
            return None;
        }
        let config = self.engine_config();
        // Every setting, as parsed (the derived Debug form is deterministic), and the
        // resolved engine configuration.
        let digest = plimsoll_wire::digest::sha256_hex(format!("{self:?}\n{config:?}").as_bytes());
        Some(crate::EvidenceCache::new(
            config.state_dir.join(crate::evidence_cache::CACHE_FILE),
            Duration::from_secs(secs),
            &digest,
        ))
    }

    /// Builds the engine: validates the settings, then creates the providers named in
    /// `providers` (or `default_providers` when the file names none). Probes nothing.
    pub fn build_engine(&self, default_providers: &[&str]) -> Result<Engine, BuildEngineError> {
        let (config, providers) = self.build_providers(default_providers)?;
        let refs: Vec<&AnyProvider> = providers.iter().collect();
        let pools = self.pool_configs(&refs, config.default_floor)?;
        Engine::new(EngineConfig { pools, ..config }, providers)
    }

    /// The launcher for these settings: their providers, hosted for the process running as
    /// `peer_uid`, and every plan checked against their uid range, runs directory, image
    /// store and limit maximums (docs/privileges.md, "The launcher").
    pub fn build_launcher(
        &self,
        default_providers: &[&str],
        peer_uid: u32,
    ) -> Result<crate::launch::Launcher, BuildEngineError> {
        let (config, providers) = self.build_providers(default_providers)?;
        let refs: Vec<&AnyProvider> = providers.iter().collect();
        let pools = self.pool_configs(&refs, config.default_floor)?;
        // Run, probe and controller uids, then the warm members' (as `Engine::new` lays
        // them out).
        let end = crate::admission::uid_range_end(
            config.sandbox_uid_base,
            config.max_concurrent,
            providers.len(),
        )
        .and_then(|end| end.checked_add(u32::try_from(crate::pool::Pools::uid_count(&pools)).ok()?))
        .ok_or_else(|| BuildEngineError::Invalid("the sandbox uids are out of range".into()))?;
        let store = self.image_store().map_err(BuildEngineError::Invalid)?;
        // Resolved once here, not for every plan; a store not there yet stays as written
        // (and no image is inside it until it is).
        let image_root = store
            .dir()
            .canonicalize()
            .unwrap_or_else(|_| store.dir().to_owned());
        let bounds = crate::launch::Bounds {
            uids: config.sandbox_uid_base..end,
            runs_dir: config.state_dir.join("runs"),
            image_root,
            maximums: config.limits.maximums,
        };
        Ok(crate::launch::Launcher::new(providers, bounds, peer_uid))
    }

    /// The engine for these settings whose providers are the launcher's at `socket`, each
    /// reached over it (cold runs, warm members and sessions alike).
    pub fn build_engine_through(&self, socket: &Path) -> Result<Engine, BuildEngineError> {
        let remotes = crate::launch::Remote::all(socket).map_err(|e| {
            BuildEngineError::Invalid(format!(
                "the launcher at {} did not answer: {e}",
                socket.display()
            ))
        })?;
        let config = self.engine_config();
        let providers: Vec<AnyProvider> = remotes
            .into_iter()
            .map(|r| AnyProvider::Remote(Box::new(r)))
            .collect();
        let refs: Vec<&AnyProvider> = providers.iter().collect();
        let pools = self.pool_configs(&refs, config.default_floor)?;
        Engine::new(EngineConfig { pools, ..config }, providers)
    }

    /// The engine's settings and its providers, each made from these settings.
    fn build_providers(
        &self,
        default_providers: &[&str],
    ) -> Result<(EngineConfig, Vec<AnyProvider>), BuildEngineError> {
        let config = self.engine_config();
        let d = &config.limits.defaults;
        let m = &config.limits.maximums;
        if d.timeout > m.timeout
            || d.memory_bytes > m.memory_bytes
            || d.output_bytes > m.output_bytes
            || d.pids > m.pids
            || d.disk_bytes > m.disk_bytes
            || d.artifact_bytes > m.artifact_bytes
        {
            return Err(BuildEngineError::Invalid(
                "a limit default is above its maximum: lower [limits.defaults] or raise [limits.maximums]".into(),
            ));
        }
        // What no request may ask for, no default may give (docs/protocol.md, "Limits").
        let below = plimsoll_wire::Limits {
            memory_bytes: Some(d.memory_bytes.min(m.memory_bytes)),
            pids: Some(d.pids.min(m.pids)),
            disk_bytes: Some(d.disk_bytes.min(m.disk_bytes)),
            ..Default::default()
        };
        if let Some((name, value, min)) = below.below_minimum() {
            return Err(BuildEngineError::Invalid(format!(
                "[limits] {name} = {value} is below the minimum {min} a sandbox's interpreter needs: raise it"
            )));
        }
        let names: Vec<String> = match &self.providers {
            Some(list) => list.clone(),
            None => default_providers.iter().map(|s| (*s).to_owned()).collect(),
        };
        self.oci.validate().map_err(BuildEngineError::Invalid)?;
        self.image_store().map_err(BuildEngineError::Invalid)?;
        crate::admission::validate_uid_range(
            config.sandbox_uid_base,
            config.max_concurrent,
            names.len(),
        )?;
        let mut providers = Vec::new();
        for (index, name) in names.iter().enumerate() {
            // Never a run's uid, and each provider's own, so all may probe at once; the
            // engine leases the same uid for it (`Engine::new`).
            let probe_uid =
                crate::admission::probe_uid(config.sandbox_uid_base, config.max_concurrent, index);
            if let Some(kind) = RuntimeKind::from_name(name) {
                providers.push(AnyProvider::Oci(Box::new(OciProvider::new(
                    self.oci.config(kind, probe_uid),
                ))));
                continue;
            }
            match name.as_str() {
                "qemu" => {
                    let base = config.sandbox_uid_base;
                    let vm = self
                        .qemu
                        .config(
                            &config.state_dir,
                            probe_uid,
                            base..base + config.max_concurrent as u32,
                        )
                        .map_err(BuildEngineError::Invalid)?;
                    providers.push(AnyProvider::Vm(Box::new(VmProvider::new(vm))));
                }
                "process" => {
                    providers.push(AnyProvider::Process(ProcessProvider::new(ProcessConfig {
                        node: self
                            .process
                            .node
                            .clone()
                            .unwrap_or_else(|| "/usr/bin/node".into()),
                        python: self
                            .process
                            .python
                            .clone()
                            .unwrap_or_else(|| "/usr/bin/python3".into()),
                        probe: self
                            .process
                            .probe
                            .clone()
                            .unwrap_or_else(default_probe_path),
                        state_dir: config.state_dir.clone(),
                        probe_uid,
                    })))
                }
                other => {
                    return Err(BuildEngineError::Invalid(format!(
                        "unknown provider `{other}` in `providers`: known are {}",
                        PROVIDER_NAMES.join(", ")
                    )));
                }
            }
        }
        Ok((config, providers))
    }
}

/// `plimsoll-probe` beside the running executable (or in its parent, for test binaries
/// under `target/*/deps`).
pub fn default_probe_path() -> PathBuf {
    default_tool_path("plimsoll-probe")
}

/// A plimsoll binary (`plimsoll-probe`, `plimsoll-agent`) beside the running executable, or
/// in its parent directory (test binaries live in `target/*/deps`).
pub fn default_tool_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    let beside = dir.join(name);
    if beside.exists() {
        return beside;
    }
    match dir.parent() {
        Some(up) if up.join(name).exists() => up.join(name),
        _ => beside,
    }
}

/// The VM assets: `build/vm` of the repository the running executable was built in (found by
/// walking up from it), else `/var/lib/plimsoll/build/vm`.
pub fn default_vm_assets_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    exe.ancestors()
        .map(|d| d.join("build/vm"))
        .find(|d| d.join("vmlinux").is_file())
        .unwrap_or_else(|| PathBuf::from("/var/lib/plimsoll/build/vm"))
}

/// The sandbox image: `build/images/sandbox` of the repository the running executable was
/// built in (found by walking up from it), else `/var/lib/plimsoll/build/images/sandbox`.
pub fn default_image_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    exe.ancestors()
        .map(|d| d.join("build/images/sandbox"))
        .find(|d| d.join("identity").is_file())
        .unwrap_or_else(|| PathBuf::from("/var/lib/plimsoll/build/images/sandbox"))
}

impl Engine {
    /// Puts the warm pools `settings` ask for in force ([`Engine::replace_pools`]): only its
    /// `[pools]` section is read, over the providers and the default floor in force (a
    /// change to anything else needs a restart).
    pub fn reload_pools(&self, settings: &Settings) -> Result<PoolsReplaced, BuildEngineError> {
        let providers: Vec<&AnyProvider> = self.slots.iter().map(|s| &s.provider).collect();
        let configs = settings.pool_configs(&providers, self.config.default_floor)?;
        self.replace_pools(configs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_full_file() {
        let s = Settings::parse(
            r#"
default_floor = "process"
providers = ["process"]
max_concurrent = 3
[limits.defaults]
timeout_ms = 2000
[process]
node = "/opt/node"
[daemon]
listen = "127.0.0.1:0"
"#,
        )
        .unwrap();
        let c = s.engine_config();
        assert_eq!(c.default_floor, Tier::Process);
        assert_eq!(c.max_concurrent, 3);
        assert_eq!(c.limits.defaults.timeout, Duration::from_secs(2));
        assert!(s.build_engine(&[]).is_ok());
    }

    #[test]
    fn builds_the_oci_providers() {
        let s = Settings::parse(
            r#"
providers = ["crun", "runc", "runsc", "process"]
sandbox_uid_base = 3000000
max_concurrent = 4
[oci]
image = "/srv/images/sandbox"
state_root = "/run/plimsoll-x"
cgroup_parent = "/plimsoll-x"
cpu_millis = 500
runc = "/opt/runc"
runsc_platform = "kvm"
"#,
        )
        .unwrap();
        let oci: Vec<_> = RuntimeKind::ALL
            .iter()
            .map(|k| s.oci.config(*k, 7))
            .collect();
        assert_eq!(oci[0].binary, Path::new("/usr/bin/crun"));
        assert_eq!(oci[1].binary, Path::new("/opt/runc"));
        assert_eq!(oci[2].platform, "kvm");
        assert!(
            oci.iter()
                .all(|c| c.image == Path::new("/srv/images/sandbox")
                    && c.state_root == Path::new("/run/plimsoll-x")
                    && c.cgroup_parent == "/plimsoll-x"
                    && c.cpu_millis == 500
                    && c.probe_uid == 7)
        );
        let engine = s.build_engine(&[]).unwrap();
        assert!(engine.providers().is_empty(), "nothing is probed yet");
        for bad in [
            "[oci]\ncgroup_parent = \"plimsoll\"",
            "[oci]\ncgroup_parent = \"/a/../b\"",
            "[oci]\nimage = \"relative\"",
            "[oci]\ncpu_millis = 0",
            "[oci]\nrunsc_platform = \"--debug\"",
        ] {
            let s = Settings::parse(&format!("providers = [\"crun\"]\n{bad}")).unwrap();
            assert!(
                matches!(s.build_engine(&[]), Err(BuildEngineError::Invalid(_))),
                "{bad}"
            );
        }
        assert!(Settings::parse("[oci]\ncolour = 1").is_err());
    }

    #[test]
    fn refuses_uid_ranges_that_reach_system_accounts_or_wrap() {
        for bad in [
            "sandbox_uid_base = 0",
            "sandbox_uid_base = 1000",
            "sandbox_uid_base = 4294967290",
        ] {
            let s = Settings::parse(&format!("providers = [\"process\"]\n{bad}")).unwrap();
            let e = s.build_engine(&[]).unwrap_err().to_string();
            assert!(e.contains("out of range"), "{bad}: {e}");
        }
    }

    #[test]
    fn pools_default_to_the_default_floor_s_provider_and_refuse_what_makes_no_sense() {
        let build = |toml: &str| Settings::parse(toml).unwrap().build_engine(&[]);
        let pools = |toml: &str| {
            let e = build(toml).unwrap_or_else(|e| panic!("{e}"));
            e.config()
                .pools
                .iter()
                .map(|p| (p.provider.clone(), p.language, p.settings.min_idle))
                .collect::<Vec<_>>()
        };
        use plimsoll_wire::Language::{Javascript, Python};
        // No [pools]: the default floor's cheapest provider that warms, both languages.
        assert_eq!(
            pools("providers = [\"process\"]\ndefault_floor = \"process\"\n"),
            vec![
                ("process".into(), Javascript, 1),
                ("process".into(), Python, 1)
            ]
        );
        // The default floor above what warms: none.
        assert!(pools("providers = [\"process\"]\n").is_empty());
        // A fresh install's default floor (container): crun, the cheapest container provider.
        assert_eq!(
            pools("providers = [\"process\", \"runsc\", \"crun\", \"runc\"]\n"),
            vec![("crun".into(), Javascript, 1), ("crun".into(), Python, 1)]
        );
        // An empty [pools]: none; min_idle = 0: that pool is off.
        assert!(
            pools("providers = [\"process\"]\ndefault_floor = \"process\"\n[pools]\n").is_empty()
        );
        assert_eq!(
            pools(
                "providers = [\"process\"]\n[pools.process.python]\nmin_idle = 2\nmax_members = 3\n[pools.process.javascript]\nmin_idle = 0\n"
            ),
            vec![("process".into(), Python, 2)]
        );
        for (toml, says) in [
            (
                "providers = [\"process\"]\n[pools.crun.python]\n",
                "not configured",
            ),
            (
                "providers = [\"process\"]\n[pools.process.python]\nmin_idle = 3\nmax_members = 2\n",
                "at most max_members",
            ),
            (
                "providers = [\"process\"]\n[pools.process.python]\nmax_age_secs = 0\n",
                "at least 1",
            ),
        ] {
            let e = build(toml).expect_err(toml).to_string();
            assert!(e.contains(says), "{toml}: {e}");
        }
        assert!(Settings::parse("[pools.process.ruby]\nmin_idle = 1\n").is_err());
        assert!(Settings::parse("[pools.process.python]\nwarmth = 1\n").is_err());
    }

    #[test]
    fn refuses_unknown_keys_providers_and_empty_lists() {
        assert!(
            Settings::parse("colour = 1")
                .unwrap_err()
                .contains("colour")
        );
        let s = Settings::parse(r#"providers = ["docker"]"#).unwrap();
        assert!(
            s.build_engine(&[])
                .unwrap_err()
                .to_string()
                .contains("docker")
        );
        let s = Settings::parse(r#"providers = []"#).unwrap();
        assert!(matches!(
            s.build_engine(&["process"]),
            Err(BuildEngineError::NoProviders)
        ));
        assert!(matches!(
            Settings::default().build_engine(&[]),
            Err(BuildEngineError::NoProviders)
        ));
    }
}
