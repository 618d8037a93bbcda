//! The engine: a library that runs requests on providers, usable in-process without any
//! daemon. It decides policy (floor, provider, limits, uid) and hands providers one fully
//! resolved [`LaunchPlan`](plimsoll_sandbox::LaunchPlan).

mod admission;
mod cancel;
mod config;
mod engine;
mod error;
pub mod evidence_cache;
mod ids;
pub mod launch;
pub mod plan;
pub mod pool;
mod providers;
mod recheck;
mod routing;
mod session;
pub mod settings;

pub use admission::{Admission, Permit, uid_range_end};
pub use cancel::{Cancel, RunHooks};
pub use config::{EngineConfig, LimitPolicy, SessionPolicy};
pub use engine::{Engine, PoolsReplaced, ProviderEvidence};
pub use error::{BuildEngineError, RunError};
pub use evidence_cache::{CacheMiss, EvidenceCache};
pub use plan::{Plan, ProviderView, Unavailable, plan};
pub use plimsoll_sandbox::{OutputTap, ResolvedLimits, error_chain};
pub use plimsoll_wire::{NotDispatched, Reason, not_dispatched_reason};
pub use pool::{PoolConfig, PoolSettings};
pub use providers::AnyProvider;
pub use routing::{Candidate, RouteError, route};
pub use session::CallKind as SessionCallKind;
pub use settings::{LoadSettingsError, Settings};

/// The engine's version, reported as the environment identity of runs without an image.
pub const ENGINE_VERSION: &str = concat!("plimsoll-engine/", env!("CARGO_PKG_VERSION"));
