//! Operator settings the engine applies: the default floor, limits, concurrency, uids.

use std::path::PathBuf;
use std::time::Duration;

use plimsoll_sandbox::ResolvedLimits;
use plimsoll_wire::{Limits, Tier};

/// Default and maximum for every limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitPolicy {
    /// Used when a request does not ask.
    pub defaults: ResolvedLimits,
    /// A request asking for more is refused (`request`).
    pub maximums: ResolvedLimits,
}

impl Default for LimitPolicy {
    fn default() -> Self {
        const MIB: u64 = 1024 * 1024;
        LimitPolicy {
            defaults: ResolvedLimits {
                timeout: Duration::from_secs(10),
                memory_bytes: 1024 * MIB,
                output_bytes: MIB,
                pids: 64,
                disk_bytes: 64 * MIB,
                artifact_bytes: MIB,
            },
            maximums: ResolvedLimits {
                timeout: Duration::from_secs(600),
                memory_bytes: 8 * 1024 * MIB,
                output_bytes: 64 * MIB,
                pids: 1024,
                disk_bytes: 4 * 1024 * MIB,
                artifact_bytes: 64 * MIB,
            },
        }
    }
}

impl LimitPolicy {
    /// The request's ask, or the default; an ask above a maximum is an error naming it.
    pub fn resolve(&self, asked: Option<&Limits>) -> Result<ResolvedLimits, String> {
        let empty = Limits::default();
        let a = asked.unwrap_or(&empty);
        let d = &self.defaults;
        let m = &self.maximums;
        let pick = |name: &str, ask: Option<u64>, def: u64, max: u64| match ask {
            None => Ok(def.min(max)),
            Some(v) if v <= max => Ok(v),
            Some(v) => Err(format!(
                "limits.{name} = {v} is above this server's maximum {max}"
            )),
        };
        let timeout_ms = pick(
            "timeout_ms",
            a.timeout_ms,
            d.timeout.as_millis() as u64,
            m.timeout.as_millis() as u64,
        )?;
        Ok(ResolvedLimits {
            timeout: Duration::from_millis(timeout_ms),
            memory_bytes: pick(
                "memory_bytes",
                a.memory_bytes,
                d.memory_bytes,
                m.memory_bytes,
            )?,
            output_bytes: pick(
                "output_bytes",
                a.output_bytes,
                d.output_bytes,
                m.output_bytes,
            )?,
            pids: pick("pids", a.pids, d.pids, m.pids)?,
            disk_bytes: pick("disk_bytes", a.disk_bytes, d.disk_bytes, m.disk_bytes)?,
            artifact_bytes: pick(
                "artifact_bytes",
                a.artifact_bytes,
                d.artifact_bytes,
                m.artifact_bytes,
            )?,
        })
    }
}

/// Everything the engine needs to decide a run.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The floor a request gets when it sets none. `container` unless configured otherwise.
    pub default_floor: Tier,
    /// Limits.
    pub limits: LimitPolicy,
    /// Runs at once, over all callers.
    pub max_concurrent: usize,
    /// Runs at once per caller.
    pub max_per_caller: usize,
    /// The first of `2 × max_concurrent + providers` consecutive uids (and gids):
    /// `max_concurrent` run uids, the first provider's probe uid, `max_concurrent` controller
    /// uids (a run's second uid, for a trial's controller), then a probe uid for each further
    /// provider (`admission::probe_uid`). No two runs or probes at once share one.
    /// Must be unused on the host.
    pub sandbox_uid_base: u32,
    /// Where runs' directories live (`<state_dir>/runs/<run_id>`).
    pub state_dir: PathBuf,
    /// Warm pools, one per provider and language (docs/warm-pools.md). Their members' uids
    /// follow the range above: `uid_range_end(..)..` plus one per member at most.
    pub pools: Vec<crate::pool::PoolConfig>,
    /// Limits on sessions.
    pub sessions: SessionPolicy,
    /// The operator's images (docs/images.md): where a request's `image` is resolved, and
    /// the default image. `None`: no image store; a request naming an image is refused, and
    /// the providers run the image they were configured with.
    pub images: Option<plimsoll_image::ImageStore>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            default_floor: Tier::Container,
            limits: LimitPolicy::default(),
            max_concurrent: 8,
            max_per_caller: 4,
            sandbox_uid_base: 2_000_000,
            state_dir: PathBuf::from("/var/lib/plimsoll"),
            pools: Vec::new(),
            sessions: SessionPolicy::default(),
            images: None,
        }
    }
}

/// The operator's limits on sessions (docs/sessions.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionPolicy {
    /// Sessions open at once, in total. Each holds a uid slot of `max_concurrent` for its
    /// whole life, so this stays below it.
    pub max_total: usize,
    /// Sessions open at once per caller.
    pub max_per_caller: usize,
    /// The idle timeout of a session that asks for none.
    pub idle_timeout: Duration,
    /// The longest idle timeout a session may ask for.
    pub max_idle_timeout: Duration,
    /// The lifetime of a session that asks for none.
    pub lifetime: Duration,
    /// The longest lifetime a session may ask for.
    pub max_lifetime: Duration,
    /// The most copies one fork may ask for.
    pub max_fork: u32,
    /// Bytes of snapshots one caller may keep at once.
    pub snapshot_bytes_per_caller: u64,
    /// Bytes of snapshots kept at once over all callers.
    pub snapshot_bytes: u64,
    /// How long a snapshot is kept.
    pub snapshot_lifetime: Duration,
}

impl Default for SessionPolicy {
    fn default() -> Self {
        SessionPolicy {
            max_total: 4,
            max_per_caller: 2,
            idle_timeout: Duration::from_secs(300),
            max_idle_timeout: Duration::from_secs(3600),
            lifetime: Duration::from_secs(3600),
            max_lifetime: Duration::from_secs(24 * 3600),
            max_fork: 8,
            snapshot_bytes_per_caller: 1 << 30,
            snapshot_bytes: 4 << 30,
            snapshot_lifetime: Duration::from_secs(3600),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_default_and_refuse_above_maximum() {
        let p = LimitPolicy::default();
        let r = p.resolve(None).unwrap();
        assert_eq!(r, p.defaults);
        let asked = Limits {
            timeout_ms: Some(2500),
            ..Limits::default()
        };
        assert_eq!(
            p.resolve(Some(&asked)).unwrap().timeout,
            Duration::from_millis(2500)
        );
        let asked = Limits {
            pids: Some(1_000_000),
            ..Limits::default()
        };
        let e = p.resolve(Some(&asked)).unwrap_err();
        assert!(e.contains("limits.pids"), "{e}");
    }

    /// docs/openapi.json states the default maximums, so a schema-driven client refuses what
    /// a daemon with default settings refuses; tests/openapi/refused.json's `limits` cases are
    /// each refused here.
    #[test]
    fn the_openapi_maxima_are_the_default_maximums_and_refuse_the_refused_cases() {
        let doc: serde_json::Value =
            serde_json::from_str(include_str!("../../../docs/openapi.json")).unwrap();
        let m = LimitPolicy::default().maximums;
        let limits = &doc["components"]["schemas"]["Limits"]["properties"];
        for (name, max) in [
            ("timeout_ms", m.timeout.as_millis() as u64),
            ("memory_bytes", m.memory_bytes),
            ("output_bytes", m.output_bytes),
            ("pids", m.pids),
            ("disk_bytes", m.disk_bytes),
            ("artifact_bytes", m.artifact_bytes),
        ] {
            assert_eq!(limits[name]["maximum"].as_u64(), Some(max), "{name}");
        }
        let refused: serde_json::Value =
            serde_json::from_str(include_str!("../../../tests/openapi/refused.json")).unwrap();
        let mut n = 0;
        for case in refused["cases"].as_array().unwrap() {
            if case["refused_by"] == "limits" {
                let asked: Limits = serde_json::from_value(case["body"]["limits"].clone()).unwrap();
                assert!(
                    LimitPolicy::default().resolve(Some(&asked)).is_err(),
                    "{}",
                    case["what"]
                );
                n += 1;
            }
        }
        assert_eq!(n, 6);
    }
}
