//! Providers and their evidence: what the daemon checked before it offers a tier.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::Tier;

/// The answer to `GET /v1/providers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProvidersResponse {
    /// The protocol number of the answer.
    pub protocol: u32,
    /// The floor a request gets when it sets none.
    pub default_floor: Tier,
    /// Every configured provider, cheapest first.
    pub providers: Vec<ProviderInfo>,
    /// The images a request may name, the default one marked.
    #[serde(default)]
    pub images: Vec<crate::ImageInfo>,
}

/// One provider as the daemon sees it now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderInfo {
    /// Its name, as a request's `provider` names it.
    pub name: String,
    /// The tier its evidence supports.
    pub isolation: Tier,
    /// Offered now: its last probe matched what its tier claims.
    pub available: bool,
    /// Why it is not offered, and what to do about it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable_reason: Option<String>,
    /// What was checked.
    pub evidence: Evidence,
    /// SHA-256 of the evidence's canonical JSON (see docs/protocol.md).
    pub evidence_sha256: String,
}

/// What the daemon collected about a provider. Evidence, not attestation: it records what a
/// probe saw on this host, and cannot prove the host itself is honest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Evidence {
    /// The provider's name.
    pub provider: String,
    /// The tier this evidence supports.
    pub isolation: Tier,
    /// The settings that shape the wall (limits, paths, runtime flags).
    pub config: BTreeMap<String, String>,
    /// The binaries the wall rests on.
    pub binaries: Vec<BinaryIdentity>,
    /// What the probe saw from inside, if it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeReport>,
    /// Each check made on the probe's report, and its outcome (`ok` or what was wrong).
    pub checks: BTreeMap<String, String>,
    /// The environment identity (image identity, or engine version).
    pub environment: String,
    /// When the evidence was collected, Unix milliseconds.
    pub checked_unix_ms: u64,
}

/// One binary a wall rests on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BinaryIdentity {
    /// A short name (`node`, `crun`, ...).
    pub name: String,
    /// Its absolute path.
    pub path: String,
    /// What it says its version is.
    pub version: String,
    /// SHA-256 of the file.
    pub sha256: String,
}

/// What the probe program saw from inside a sandbox. It reports; the provider judges.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeReport {
    /// Real uid.
    pub uid: u32,
    /// Effective uid.
    pub euid: u32,
    /// Real gid.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
    /// Effective, permitted and bounding capability sets, as /proc/self/status shows them.
    pub capabilities: BTreeMap<String, String>,
    /// `NoNewPrivs` from /proc/self/status.
    pub no_new_privs: bool,
    /// `Seccomp` mode from /proc/self/status (0 none, 1 strict, 2 filter).
    pub seccomp_mode: u32,
    /// Names of the environment variables it was given.
    pub environment: Vec<String>,
    /// Its working directory.
    pub cwd: String,
    /// Namespace identities (`/proc/self/ns/*` link targets), with whether they equal the host's.
    pub namespaces: BTreeMap<String, NamespaceSeen>,
    /// Mount points and whether each is read-only, from /proc/self/mountinfo.
    pub mounts: BTreeMap<String, String>,
    /// Paths the probe tried to create a file in, and what happened (`writable` or the error).
    pub write_attempts: BTreeMap<String, String>,
    /// Paths the probe tried to read, and what happened (`readable` or the error).
    pub read_attempts: BTreeMap<String, String>,
    /// Network interfaces it can see.
    pub network_interfaces: Vec<String>,
    /// What happened when it opened sockets (`AF_INET`, `AF_INET6`, `AF_UNIX`): `allowed` or
    /// the error.
    pub socket_attempts: BTreeMap<String, String>,
    /// Resource limits (`RLIMIT_*` soft values) and cgroup limits it can read.
    pub limits: BTreeMap<String, String>,
    /// The kernel release it sees (`uname -r`).
    pub kernel_release: String,
    /// Its hostname.
    pub hostname: String,
}

/// A namespace identity seen from inside.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceSeen {
    /// The link target, e.g. `net:[4026531840]`.
    pub id: String,
    /// Whether it equals the daemon's own; filled in by the provider, `None` from the probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_as_host: Option<bool>,
}
