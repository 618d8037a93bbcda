//! The container and kernel tiers: crun and runc (`container`) and gVisor's runsc
//! (`kernel`), each driven directly with one OCI bundle per run, no daemon in between.
//!
//! - [`spec`]: the OCI `config.json` of a run, a pure function of the launch plan and the
//!   provider's settings (namespaces, cgroup limits, seccomp, mounts, uid).
//! - [`seccomp`]: the allowlist, checked in as `data/seccomp.json`.
//! - [`runtime`]: how each runtime binary is invoked (and crun's cgroup workaround).
//! - [`cgroup`]: the host's cgroup layout and the removal of a run's cgroups.
//! - `follow`: `create`, then `start`, then the container's output until it exits.
//! - `phases`: where one run's time goes, one `debug` event per run.
//! - [`state`]: run directories and the locks that tell live runs from leftovers.
//! - [`provider`]: [`OciProvider`], the `crun`, `runc` and `runsc` providers.
//! - [`probe`]: the startup probe and its checks.
//!
//! docs/container-tier.md describes the policy these modules apply.

/// The host's cgroup layout and per-run cgroups (shared with the process tier).
pub use plimsoll_sandbox::cgroup;
mod follow;
mod phases;
pub mod probe;
pub mod provider;
pub mod runtime;
pub mod seccomp;
mod session;
pub mod spec;
pub mod state;
mod warm;

pub use provider::{OciConfig, OciProvider, ReapReport, WATCHDOG_GRACE};
pub use runtime::RuntimeKind;
