//! The simulators an image carries (docs/simulators.md, "Simulators in images"): an index file
//! at a fixed path inside the image naming each simulator, the path of its module inside the
//! image, and the module's SHA-256. The trial runner loads a trial's simulator through it;
//! the image store lists it.

use serde::{Deserialize, Serialize};

/// Where an image's simulator index lives, inside the image.
pub const IMAGE_INDEX: &str = "/opt/plimsoll/simulators/index.json";

/// The index's format name.
pub const INDEX_FORMAT: &str = "plimsoll-simulators/1";

/// The largest index read.
pub const MAX_INDEX_BYTES: u64 = 256 * 1024;

/// Directories whose files a sandbox's code can write or create: an index never points into
/// them, so a trial's simulator is always the image's, never the caller's.
pub const WRITABLE_PREFIXES: &[&str] = &[
    "/work", "/tmp", "/var/tmp", "/dev", "/proc", "/sys", "/run", "/home", "/root",
];

/// An image's simulator index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimulatorIndex {
    /// [`INDEX_FORMAT`].
    pub format: String,
    /// Every simulator, each name once.
    pub simulators: Vec<SimulatorEntry>,
}

/// One simulator an image declares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimulatorEntry {
    /// `[a-z0-9][a-z0-9._-]{0,63}`; its metadata must say the same name.
    pub name: String,
    /// The module's absolute path inside the image.
    pub path: String,
    /// Lowercase hex SHA-256 of the module's bytes.
    pub sha256: String,
}

impl SimulatorIndex {
    /// Parses and checks an index's bytes.
    pub fn parse(bytes: &[u8]) -> Result<SimulatorIndex, String> {
        let index: SimulatorIndex = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if index.format != INDEX_FORMAT {
            return Err(format!(
                "format is {:?}, not {INDEX_FORMAT:?}",
                index.format
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for s in &index.simulators {
            s.check()?;
            if !seen.insert(s.name.as_str()) {
                return Err(format!("simulator {} is listed twice", s.name));
            }
        }
        Ok(index)
    }

    /// The entry named `name`.
    pub fn get(&self, name: &str) -> Option<&SimulatorEntry> {
        self.simulators.iter().find(|s| s.name == name)
    }

    /// Every name, in the index's order, comma-separated (`none` when empty).
    pub fn names(&self) -> String {
        if self.simulators.is_empty() {
            return "none".into();
        }
        self.simulators
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl SimulatorEntry {
    fn check(&self) -> Result<(), String> {
        if !simulator_name_ok(&self.name) {
            return Err(format!(
                "simulator name {:?} does not match [a-z0-9][a-z0-9._-]{{0,63}}",
                self.name
            ));
        }
        if !is_sha256_hex(&self.sha256) {
            return Err(format!(
                "simulator {}: sha256 must be 64 lowercase hex digits",
                self.name
            ));
        }
        path_ok(&self.path).map_err(|why| format!("simulator {}: path {why}", self.name))
    }

    /// For an image's own index: the module is not under a directory a sandbox's code can
    /// write ([`WRITABLE_PREFIXES`]), so the simulator is the image's, never the caller's.
    pub fn check_in_image(&self) -> Result<(), String> {
        if let Some(p) = WRITABLE_PREFIXES
            .iter()
            .find(|p| self.path == **p || self.path.starts_with(&format!("{p}/")))
        {
            return Err(format!(
                "simulator {}: path {:?} is under {p}, where a sandbox's code can write; a simulator must be part of the image",
                self.name, self.path
            ));
        }
        Ok(())
    }
}

/// Whether `name` is a valid simulator name: `[a-z0-9][a-z0-9._-]{0,63}`.
pub fn simulator_name_ok(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"._-".contains(&c))
}

/// Whether `s` is 64 lowercase hex digits.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A module path an index may name: absolute, normalised (no `.`, `..` or empty component),
/// at most 256 bytes.
fn path_ok(path: &str) -> Result<(), String> {
    if !path.starts_with('/') || path.len() > 256 {
        return Err(format!("{path:?} must be absolute and at most 256 bytes"));
    }
    if path[1..]
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(format!(
            "{path:?} must be normalised (no empty, . or .. part)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(entries: &str) -> String {
        format!(r#"{{"format": "plimsoll-simulators/1", "simulators": [{entries}]}}"#)
    }

    #[test]
    fn a_good_index_parses() {
        let sha = "ab".repeat(32);
        let text = index(&format!(
            r#"{{"name": "cartpole", "path": "/opt/plimsoll/simulators/cartpole.wasm", "sha256": "{sha}"}}"#
        ));
        let i = SimulatorIndex::parse(text.as_bytes()).unwrap();
        assert_eq!(i.get("cartpole").unwrap().sha256, sha);
        assert_eq!(i.names(), "cartpole");
        assert!(i.get("tank").is_none());
    }

    #[test]
    fn a_module_under_a_writable_directory_or_a_bad_entry_is_refused() {
        let sha = "ab".repeat(32);
        for path in ["/work/x.wasm", "/tmp/x.wasm", "/dev/shm/x"] {
            let text = index(&format!(
                r#"{{"name": "x", "path": "{path}", "sha256": "{sha}"}}"#
            ));
            let i = SimulatorIndex::parse(text.as_bytes()).unwrap();
            let e = i.simulators[0].check_in_image().unwrap_err();
            assert!(
                e.contains("where a sandbox's code can write"),
                "{path}: {e}"
            );
        }
        for (name, path, sha, want) in [
            ("x", "/opt/../work/x.wasm", sha.as_str(), "normalised"),
            ("x", "opt/x.wasm", &sha, "absolute"),
            ("x", "/opt//x.wasm", &sha, "normalised"),
            ("X", "/opt/x.wasm", &sha, "does not match"),
            ("x", "/opt/x.wasm", "AB", "64 lowercase"),
        ] {
            let text = index(&format!(
                r#"{{"name": "{name}", "path": "{path}", "sha256": "{sha}"}}"#
            ));
            let e = SimulatorIndex::parse(text.as_bytes()).unwrap_err();
            assert!(e.contains(want), "{path}: {e}");
        }
        let twice = index(&format!(
            r#"{{"name": "x", "path": "/opt/a", "sha256": "{sha}"}}, {{"name": "x", "path": "/opt/b", "sha256": "{sha}"}}"#
        ));
        assert!(
            SimulatorIndex::parse(twice.as_bytes())
                .unwrap_err()
                .contains("twice")
        );
        let other = r#"{"format": "plimsoll-simulators/2", "simulators": []}"#;
        assert!(
            SimulatorIndex::parse(other.as_bytes())
                .unwrap_err()
                .contains("format")
        );
    }
}
