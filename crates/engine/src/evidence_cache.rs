//! Evidence this host checked recently, kept across processes, so a one-shot engine (the
//! CLI) need not run every probe again on each invocation.
//!
//! The cache is one JSON file that only root may write: a file not owned by root, writable
//! by group or others, a symbolic link, or in a directory others may write is not read. An
//! entry is used only when all of these hold, and the provider is probed again otherwise:
//! - the key matches: the digest of the settings, the engine version, the running binary's
//!   file identity and the boot id (so any change of settings, a rebuilt `plimsoll`, or a
//!   reboot re-probes);
//! - it is younger than the stated maximum age, and not from the future;
//! - the evidence digest recomputed over the stored evidence equals the stored digest;
//! - every binary the evidence names still has the digest it had. A digest is computed again
//!   only when the file's identity (device, inode, size, modification and change times to
//!   the nanosecond) differs from the one stored beside it; any write or replacement of the
//!   file changes its change time.
//!
//! Only evidence of a provider whose probe passed is stored: a failed provider is always
//! probed again, so fixing the host takes effect at once.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use plimsoll_wire::Evidence;
use plimsoll_wire::digest::{evidence_sha256, sha256_hex};
use serde_json::{Value, json};

/// The cache file's name in the state directory.
pub const CACHE_FILE: &str = "evidence-cache.json";
/// Default longest age of cached evidence, in seconds (`evidence_cache_secs`).
pub const DEFAULT_MAX_AGE_SECS: u64 = 300;
/// The format number written in the file; another is not read.
const FORMAT: u64 = 1;
/// How far in the future an entry's check time may lie (clock adjustments) before the entry
/// is judged tampered with.
const FUTURE_SLACK_MS: u64 = 5_000;

use plimsoll_sandbox::evidence::{FileIdentity as Identity, file_identity as identity};

/// The evidence cache of one engine configuration.
#[derive(Debug, Clone)]
pub struct EvidenceCache {
    path: PathBuf,
    max_age: Duration,
    key: String,
}

/// Why a cached entry was not used (logged, then the provider is probed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheMiss {
    /// No file, or no entry for the provider.
    #[error("no cached evidence")]
    Absent,
    /// The file is not trustworthy: wrong owner, mode, type, or directory.
    #[error("the cache file {path} is not used: {why}")]
    Untrusted {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The file does not read as a cache.
    #[error("the cache file does not read: {0}")]
    Unreadable(String),
    /// Settings, engine, binary or boot changed since it was written.
    #[error("the settings, the engine or the boot changed since the evidence was cached")]
    KeyChanged,
    /// Older than the maximum age.
    #[error("the cached evidence is {age_ms} ms old, over the maximum of {max_ms} ms")]
    Stale {
        /// Its age.
        age_ms: u64,
        /// The maximum.
        max_ms: u64,
    },
    /// Its content contradicts itself (digest, time, provider).
    #[error("the cached evidence does not check: {0}")]
    Tampered(String),
    /// A binary it names changed.
    #[error("{path} changed since its evidence was cached")]
    BinaryChanged {
        /// The binary.
        path: String,
    },
    /// The provider says the evidence no longer describes it (a rebuilt image, say).
    #[error("the provider does not take it: {0}")]
    Provider(plimsoll_sandbox::Stale),
}

impl EvidenceCache {
    /// The cache at `path`, whose entries live `max_age` at most, keyed on `settings_digest`
    /// (a digest of every setting that shaped the providers) with the engine's version, the
    /// running binary's identity and the boot id added.
    pub fn new(path: PathBuf, max_age: Duration, settings_digest: &str) -> EvidenceCache {
        let exe = std::env::current_exe()
            .and_then(std::fs::metadata)
            .map(|m| format!("{:?}", identity(&m)))
            .unwrap_or_default();
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let key = sha256_hex(
            format!(
                "plimsoll/evidence-cache/v{FORMAT}\n{}\n{settings_digest}\n{exe}\n{}",
                crate::ENGINE_VERSION,
                boot.trim()
            )
            .as_bytes(),
        );
        EvidenceCache { path, max_age, key }
    }

    /// The cache file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The longest age of an entry used.
    pub fn max_age(&self) -> Duration {
        self.max_age
    }

    /// The cached evidence of `provider`, if every check of the module's doc holds.
    pub fn lookup(&self, provider: &str, now_ms: u64) -> Result<Evidence, CacheMiss> {
        let file = self.read()?;
        self.check_entry(&file, provider, now_ms)
    }

    fn check_entry(
        &self,
        file: &Value,
        provider: &str,
        now_ms: u64,
    ) -> Result<Evidence, CacheMiss> {
        if file.get("format").and_then(Value::as_u64) != Some(FORMAT) {
            return Err(CacheMiss::Unreadable("another format".into()));
        }
        if file.get("key").and_then(Value::as_str) != Some(self.key.as_str()) {
            return Err(CacheMiss::KeyChanged);
        }
        let entry = file
            .get("providers")
            .and_then(|p| p.get(provider))
            .ok_or(CacheMiss::Absent)?;
        let evidence: Evidence =
            serde_json::from_value(entry.get("evidence").cloned().unwrap_or_default())
                .map_err(|e| CacheMiss::Unreadable(format!("evidence of {provider}: {e}")))?;
        if evidence.provider != provider {
            return Err(CacheMiss::Tampered(format!(
                "the entry of {provider} holds the evidence of {}",
                evidence.provider
            )));
        }
        let stored = entry.get("evidence_sha256").and_then(Value::as_str);
        if stored != Some(evidence_sha256(&evidence).as_str()) {
            return Err(CacheMiss::Tampered(format!(
                "the evidence of {provider} does not match its digest"
            )));
        }
        if evidence.checked_unix_ms > now_ms + FUTURE_SLACK_MS {
            return Err(CacheMiss::Tampered(format!(
                "the evidence of {provider} was checked in the future"
            )));
        }
        let age_ms = now_ms.saturating_sub(evidence.checked_unix_ms);
        let max_ms = self.max_age.as_millis() as u64;
        if age_ms > max_ms {
            return Err(CacheMiss::Stale { age_ms, max_ms });
        }
        let identities = entry.get("identities");
        for b in &evidence.binaries {
            let known: Option<Identity> = identities
                .and_then(|i| i.get(&b.path))
                .and_then(|v| serde_json::from_value(v.clone()).ok());
            let changed = || CacheMiss::BinaryChanged {
                path: b.path.clone(),
            };
            let now = std::fs::metadata(&b.path).map_err(|_| changed())?;
            if known == Some(identity(&now)) {
                continue;
            }
            // The file was touched or replaced: only its digest can say it is the same.
            let digest = plimsoll_sandbox::evidence::sha256_file(Path::new(&b.path))
                .map_err(|_| changed())?;
            if digest != b.sha256 {
                return Err(changed());
            }
        }
        Ok(evidence)
    }

    /// Stores `evidence` (of a provider whose probe passed), keeping the file's other
    /// entries that are still under this key. Best effort: a cache that cannot be written
    /// only costs a probe next time.
    pub fn store(&self, evidence: &Evidence) -> Result<(), String> {
        let mut providers = match self.read() {
            Ok(v) if v.get("key").and_then(Value::as_str) == Some(self.key.as_str()) => v
                .get("providers")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
            _ => serde_json::Map::new(),
        };
        // Each binary's identity is taken from the descriptor its digest is read through
        // (remembered from the probe, unless the file changed since): a binary replaced
        // between the probe and now is not stored under its new identity with the old digest.
        let mut identities = BTreeMap::new();
        for b in &evidence.binaries {
            let (id, digest) =
                plimsoll_sandbox::evidence::sha256_file_identified(Path::new(&b.path))
                    .map_err(|e| e.to_string())?;
            if digest != b.sha256 {
                return Err(format!("{} changed since its probe", b.path));
            }
            identities.insert(b.path.clone(), id);
        }
        providers.insert(
            evidence.provider.clone(),
            json!({
                "evidence": evidence,
                "evidence_sha256": evidence_sha256(evidence),
                "identities": identities,
            }),
        );
        let file = json!({"format": FORMAT, "key": self.key, "providers": providers});
        let body = serde_json::to_vec_pretty(&file).map_err(|e| e.to_string())?;
        let dir = self
            .path
            .parent()
            .ok_or_else(|| format!("{} has no directory", self.path.display()))?;
        let tmp = dir.join(format!(".{CACHE_FILE}.{}", std::process::id()));
        let write = || -> std::io::Result<()> {
            let _ = std::fs::remove_file(&tmp);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&body)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &self.path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            format!("cannot write {}: {e}", self.path.display())
        })
    }

    /// The file, if it may be trusted.
    fn read(&self) -> Result<Value, CacheMiss> {
        let untrusted = |why: String| CacheMiss::Untrusted {
            path: self.path.clone(),
            why,
        };
        let meta = match std::fs::symlink_metadata(&self.path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(CacheMiss::Absent),
            Err(e) => return Err(untrusted(e.to_string())),
        };
        trusted(&meta, "it").map_err(untrusted)?;
        if let Some(dir) = self.path.parent() {
            let d = std::fs::metadata(dir).map_err(|e| untrusted(e.to_string()))?;
            if d.uid() != 0 || d.permissions().mode() & 0o022 != 0 {
                return Err(untrusted(format!(
                    "its directory {} must be root's and not writable by group or others",
                    dir.display()
                )));
            }
        }
        let text = std::fs::read(&self.path).map_err(|e| untrusted(e.to_string()))?;
        serde_json::from_slice(&text).map_err(|e| CacheMiss::Unreadable(e.to_string()))
    }
}

/// A cache file is trusted when it is a regular file, root's, written by no one else.
fn trusted(meta: &std::fs::Metadata, what: &str) -> Result<(), String> {
    if !meta.file_type().is_file() {
        return Err(format!("{what} is not a regular file"));
    }
    if meta.uid() != 0 {
        return Err(format!("{what} is owned by uid {}, not root", meta.uid()));
    }
    if meta.permissions().mode() & 0o022 != 0 {
        return Err(format!(
            "{what} has mode {:o}: group or others may write it",
            meta.permissions().mode() & 0o7777
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use plimsoll_wire::{BinaryIdentity, Tier};

    fn root() -> bool {
        if rustix::process::geteuid().is_root() {
            return true;
        }
        plimsoll_testing::skip_or_fail(
            "evidence_cache",
            "the cache is trusted only when root owns it",
        );
        false
    }

    fn evidence(dir: &Path, now_ms: u64) -> Evidence {
        let bin = dir.join("tool");
        std::fs::write(&bin, b"version 1").unwrap();
        Evidence {
            provider: "process".into(),
            isolation: Tier::Process,
            config: [("probe_uid".to_owned(), "1".to_owned())].into(),
            binaries: vec![BinaryIdentity {
                name: "tool".into(),
                path: bin.display().to_string(),
                version: "1".into(),
                sha256: plimsoll_sandbox::evidence::sha256_file(&bin).unwrap(),
            }],
            probe: None,
            checks: [("probe".to_owned(), "ok".to_owned())].into(),
            environment: "test".into(),
            checked_unix_ms: now_ms,
        }
    }

    fn setup() -> (tempfile::TempDir, EvidenceCache, Evidence, u64) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let now = plimsoll_sandbox::unix_ms_now();
        let ev = evidence(dir.path(), now);
        let cache = EvidenceCache::new(
            dir.path().join(CACHE_FILE),
            Duration::from_secs(300),
            "settings-a",
        );
        cache.store(&ev).unwrap();
        (dir, cache, ev, now)
    }

    #[test]
    fn fresh_evidence_is_reused_and_the_file_is_root_only() {
        if !root() {
            return;
        }
        let (_dir, cache, ev, now) = setup();
        assert_eq!(cache.lookup("process", now + 1000).unwrap(), ev);
        assert_eq!(cache.lookup("crun", now), Err(CacheMiss::Absent));
        let m = std::fs::metadata(cache.path()).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        assert_eq!(m.uid(), 0);
    }

    #[test]
    fn stale_evidence_is_not_used() {
        if !root() {
            return;
        }
        let (_dir, cache, _ev, now) = setup();
        assert!(matches!(
            cache.lookup("process", now + 301_000),
            Err(CacheMiss::Stale { .. })
        ));
        // From the future: a clock trick or a forged time.
        assert!(matches!(
            cache.lookup("process", now - 60_000),
            Err(CacheMiss::Tampered(_))
        ));
    }

    #[test]
    fn other_settings_do_not_read_it() {
        if !root() {
            return;
        }
        let (_dir, cache, _ev, now) = setup();
        let other = EvidenceCache::new(cache.path().to_owned(), cache.max_age(), "settings-b");
        assert_eq!(other.lookup("process", now), Err(CacheMiss::KeyChanged));
    }

    #[test]
    fn a_changed_binary_invalidates_it() {
        if !root() {
            return;
        }
        let (_dir, cache, ev, now) = setup();
        let bin = &ev.binaries[0].path;
        // Same content written again: the identity changed, the digest did not.
        std::fs::write(bin, b"version 1").unwrap();
        assert_eq!(cache.lookup("process", now).unwrap(), ev);
        std::fs::write(bin, b"version 2").unwrap();
        assert_eq!(
            cache.lookup("process", now),
            Err(CacheMiss::BinaryChanged { path: bin.clone() })
        );
        std::fs::remove_file(bin).unwrap();
        assert!(matches!(
            cache.lookup("process", now),
            Err(CacheMiss::BinaryChanged { .. })
        ));
    }

    /// A binary replaced between its probe and the store is not stored under its new
    /// identity beside the digest of the old content.
    #[test]
    fn a_binary_replaced_since_its_probe_is_not_stored() {
        if !root() {
            return;
        }
        let (_dir, cache, ev, now) = setup();
        let bin = &ev.binaries[0].path;
        std::fs::write(bin, b"replaced after the probe").unwrap();
        let e = cache.store(&ev).unwrap_err();
        assert!(e.contains("changed since its probe"), "{e}");
        assert_eq!(
            cache.lookup("process", now),
            Err(CacheMiss::BinaryChanged { path: bin.clone() })
        );
    }

    #[test]
    fn a_tampered_file_is_not_used() {
        if !root() {
            return;
        }
        let (_dir, cache, _ev, now) = setup();
        let path = cache.path().to_owned();
        let original = std::fs::read_to_string(&path).unwrap();

        // A widened tier with the old digest.
        let forged = original.replacen("\"isolation\": \"process\"", "\"isolation\": \"vm\"", 1);
        assert_ne!(forged, original);
        std::fs::write(&path, &forged).unwrap();
        assert!(matches!(
            cache.lookup("process", now),
            Err(CacheMiss::Tampered(_))
        ));

        // Writable by others: not read at all.
        std::fs::write(&path, &original).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(matches!(
            cache.lookup("process", now),
            Err(CacheMiss::Untrusted { .. })
        ));

        // Owned by someone else.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
        assert!(matches!(
            cache.lookup("process", now),
            Err(CacheMiss::Untrusted { .. })
        ));

        // A symbolic link to a root-owned copy.
        std::os::unix::fs::chown(&path, Some(0), None).unwrap();
        let real = path.with_extension("real");
        std::fs::rename(&path, &real).unwrap();
        std::os::unix::fs::symlink(&real, &path).unwrap();
        assert!(matches!(
            cache.lookup("process", now),
            Err(CacheMiss::Untrusted { .. })
        ));

        // In a directory others may write.
        std::fs::remove_file(&path).unwrap();
        std::fs::rename(&real, &path).unwrap();
        assert!(cache.lookup("process", now).is_ok());
        let dir = path.parent().unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            cache.lookup("process", now),
            Err(CacheMiss::Untrusted { .. })
        ));
    }
}
