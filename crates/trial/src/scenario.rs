//! Scenario files: read, then deleted, before any controller starts (docs/trials.md,
//! "Scenario files"). A scenario can hold what the controller must not know in advance (the
//! initial state), so the runner deletes every file it was given, valid or not.

use std::io::Read as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::sim::Metadata;

/// The largest scenario file read.
pub const MAX_SCENARIO_BYTES: u64 = 64 * 1024;
/// The most ticks one trial may ask for (10,000 s of cart-pole time).
pub const MAX_TICKS: u64 = 1_000_000;

/// One scenario, as read from its file (docs/simulators.md, "Scenarios").
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Optional label, echoed in the verdict.
    #[serde(default)]
    pub name: Option<String>,
    /// The simulator's initial values, by name.
    pub initial: serde_json::Map<String, serde_json::Value>,
    /// How many ticks the trial runs if nothing ends it earlier.
    pub ticks: u64,
    /// The pass mark: hold this many ticks without a failure.
    pub pass_ticks: u64,
    /// And, for a simulator that scores, at least this score.
    #[serde(default)]
    pub min_score: Option<f64>,
}

impl Scenario {
    /// The initial values in the order the simulator's metadata lists them: exactly its
    /// `initial` variables, each a finite number.
    pub fn initial_for(&self, metadata: &Metadata) -> Result<Vec<f64>, String> {
        if let Some(extra) = self
            .initial
            .keys()
            .find(|k| !metadata.initial.iter().any(|v| &v.name == *k))
        {
            return Err(format!(
                "initial value `{extra}` is not one the simulator {} takes (it takes: {})",
                metadata.name,
                names(metadata)
            ));
        }
        metadata
            .initial
            .iter()
            .map(|v| {
                let value = self.initial.get(&v.name).ok_or_else(|| {
                    format!(
                        "initial value `{}` is missing (the simulator {} takes: {})",
                        v.name,
                        metadata.name,
                        names(metadata)
                    )
                })?;
                value
                    .as_f64()
                    .filter(|f| f.is_finite())
                    .ok_or_else(|| format!("initial value `{}` must be a finite number", v.name))
            })
            .collect()
    }

    /// Checks what depends on the simulator: the initial values and `min_score`.
    pub fn check_against(&self, metadata: &Metadata) -> Result<Vec<f64>, String> {
        if self.min_score.is_some() && metadata.score.is_none() {
            return Err(format!(
                "min_score is given but the simulator {} does not score a trial",
                metadata.name
            ));
        }
        self.initial_for(metadata)
    }
}

fn names(metadata: &Metadata) -> String {
    if metadata.initial.is_empty() {
        return "nothing".into();
    }
    metadata
        .initial
        .iter()
        .map(|v| v.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A scenario file could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum TakeScenarioError {
    /// Opening, reading or checking the file failed.
    #[error("cannot read scenario {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Not a regular file (a symlink, a directory, a device).
    #[error(
        "scenario {path} is not a regular file (symlinks are refused: deleting a link would leave its target readable)"
    )]
    NotRegular {
        /// The file.
        path: PathBuf,
    },
    /// More than one name: deleting this one would leave the contents readable.
    #[error(
        "scenario {path} has {links} hard links; the runner can make it unreadable only by deleting its only name"
    )]
    HardLinks {
        /// The file.
        path: PathBuf,
        /// Its link count.
        links: u64,
    },
    /// Too large.
    #[error("scenario {path} is larger than {MAX_SCENARIO_BYTES} bytes")]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// Deleting it failed.
    #[error("cannot delete scenario {path} (the runner's uid needs write access to its directory)")]
    Delete {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Not valid JSON of the scenario format.
    #[error("scenario {path} is not a valid scenario: {detail}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
}

/// Reads every file, then deletes every file (even when reading one failed), and only then
/// parses. Returns the scenarios in order, or the first error once all are deleted.
pub fn take_all(paths: &[PathBuf]) -> Result<Vec<Scenario>, TakeScenarioError> {
    let mut read: Vec<Result<Vec<u8>, TakeScenarioError>> =
        paths.iter().map(|p| read_one(p)).collect();
    for (path, r) in paths.iter().zip(read.iter_mut()) {
        if let Err(source) = std::fs::remove_file(path)
            && source.kind() != std::io::ErrorKind::NotFound
            && r.is_ok()
        {
            *r = Err(TakeScenarioError::Delete {
                path: path.clone(),
                source,
            });
        }
    }
    paths
        .iter()
        .zip(read)
        .map(|(path, bytes)| parse(path, &bytes?))
        .collect()
}

fn read_one(path: &Path) -> Result<Vec<u8>, TakeScenarioError> {
    let read_err = |source| TakeScenarioError::Read {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                TakeScenarioError::NotRegular {
                    path: path.to_owned(),
                }
            } else {
                read_err(e)
            }
        })?;
    let meta = file.metadata().map_err(read_err)?;
    if !meta.file_type().is_file() {
        return Err(TakeScenarioError::NotRegular {
            path: path.to_owned(),
        });
    }
    if meta.nlink() != 1 {
        return Err(TakeScenarioError::HardLinks {
            path: path.to_owned(),
            links: meta.nlink(),
        });
    }
    let mut bytes = Vec::new();
    file.take(MAX_SCENARIO_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > MAX_SCENARIO_BYTES {
        return Err(TakeScenarioError::TooLarge {
            path: path.to_owned(),
        });
    }
    Ok(bytes)
}

/// Parses and checks one scenario's bytes (`path` names it in errors).
pub fn parse(path: &Path, bytes: &[u8]) -> Result<Scenario, TakeScenarioError> {
    let format_err = |detail: String| TakeScenarioError::Format {
        path: path.to_owned(),
        detail,
    };
    let s: Scenario = serde_json::from_slice(bytes).map_err(|e| format_err(e.to_string()))?;
    if s.min_score.is_some_and(|m| !m.is_finite()) {
        return Err(format_err("min_score must be finite".into()));
    }
    if s.ticks == 0 || s.ticks > MAX_TICKS {
        return Err(format_err(format!(
            "ticks must be between 1 and {MAX_TICKS}, not {}",
            s.ticks
        )));
    }
    if s.pass_ticks == 0 || s.pass_ticks > s.ticks {
        return Err(format_err(format!(
            "pass_ticks must be between 1 and ticks ({}), not {}",
            s.ticks, s.pass_ticks
        )));
    }
    if s.name.as_ref().is_some_and(|n| n.len() > 200) {
        return Err(format_err("name is longer than 200 bytes".into()));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"name": "standard", "initial": {"x": 0.3, "x_dot": -0.1, "theta": 0.08, "theta_dot": 0.05}, "ticks": 2000, "pass_ticks": 2000}"#;

    #[test]
    fn parses_the_documented_example() {
        let s = parse(Path::new("s.json"), GOOD.as_bytes()).unwrap();
        assert_eq!(s.ticks, 2000);
        assert_eq!(s.initial["theta"], 0.08);
        assert_eq!(s.min_score, None);
        assert_eq!(s.name.as_deref(), Some("standard"));
        // The shipped scenario is the documented one.
        let shipped = include_str!("../../../sims/cartpole/scenarios/standard.json");
        assert_eq!(
            parse(Path::new("standard.json"), shipped.as_bytes()).unwrap(),
            s
        );
    }

    #[test]
    fn refuses_bad_scenarios() {
        for (text, want) in [
            (
                r#"{"initial": {"x": 0, "x_dot": 0, "theta": 0, "theta_dot": 0}, "ticks": 0, "pass_ticks": 0}"#,
                "ticks must be",
            ),
            (
                r#"{"initial": {"x": 0, "x_dot": 0, "theta": 0, "theta_dot": 0}, "ticks": 10, "pass_ticks": 11}"#,
                "pass_ticks must be",
            ),
            (
                r#"{"initial": {"x": 0, "x_dot": 0, "theta": 0, "theta_dot": 0}, "ticks": 10, "pass_ticks": 10, "seed": 1}"#,
                "unknown field `seed`",
            ),
            (
                r#"{"initial": {"x": 0}, "ticks": 10, "pass_ticks": 10, "min_score": -1e999}"#,
                "",
            ),
            (
                r#"{"ticks": 10, "pass_ticks": 10}"#,
                "missing field `initial`",
            ),
            (
                r#"{"initial": {"x": 1e999, "x_dot": 0, "theta": 0, "theta_dot": 0}, "ticks": 10, "pass_ticks": 10}"#,
                "",
            ),
        ] {
            let e = parse(Path::new("s.json"), text.as_bytes())
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn the_initial_values_are_exactly_the_simulators() {
        let meta = crate::sim::Metadata::parse(
            br#"{"abi": 1, "name": "p", "version": "1", "ticks_per_second": 1,
                 "state": [{"name": "a", "unit": ""}],
                 "action": [{"name": "u", "unit": "", "min": 0, "max": 1}],
                 "initial": [{"name": "b", "unit": ""}, {"name": "a", "unit": ""}]}"#,
        )
        .unwrap();
        let scenario = |initial: &str, extra: &str| {
            parse(
                Path::new("s.json"),
                format!(r#"{{"initial": {initial}, "ticks": 5, "pass_ticks": 5{extra}}}"#)
                    .as_bytes(),
            )
            .unwrap()
        };
        // In the metadata's order, whatever the file's.
        assert_eq!(
            scenario(r#"{"a": 1, "b": 2.5}"#, "")
                .check_against(&meta)
                .unwrap(),
            [2.5, 1.0]
        );
        for (initial, extra, want) in [
            (r#"{"a": 1}"#, "", "`b` is missing"),
            (r#"{"a": 1, "b": 2, "c": 3}"#, "", "`c` is not one"),
            (r#"{"a": "1", "b": 2}"#, "", "`a` must be a finite number"),
            (
                r#"{"a": 1, "b": 2}"#,
                r#", "min_score": 0.5"#,
                "does not score",
            ),
        ] {
            let e = scenario(initial, extra).check_against(&meta).unwrap_err();
            assert!(e.contains(want), "{initial}: {e}");
        }
    }

    #[test]
    fn every_file_is_deleted_even_when_one_is_bad() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.json");
        let bad = dir.path().join("bad.json");
        let linked = dir.path().join("linked.json");
        let link = dir.path().join("link.json");
        std::fs::write(&good, GOOD).unwrap();
        std::fs::write(&bad, "{not json").unwrap();
        std::fs::write(&linked, GOOD).unwrap();
        std::os::unix::fs::symlink(&linked, &link).unwrap();
        let e = take_all(&[good.clone(), bad.clone(), link.clone()]).unwrap_err();
        assert!(matches!(e, TakeScenarioError::Format { .. }), "{e}");
        assert!(!good.exists() && !bad.exists() && !link.exists());

        std::fs::write(&good, GOOD).unwrap();
        let e = take_all(&[good.clone(), link.clone()]).unwrap_err();
        assert!(matches!(e, TakeScenarioError::Read { .. }), "{e}");

        std::os::unix::fs::symlink(&linked, &link).unwrap();
        std::fs::write(&good, GOOD).unwrap();
        let e = take_all(&[good.clone(), link.clone()]).unwrap_err();
        assert!(matches!(e, TakeScenarioError::NotRegular { .. }), "{e}");
        assert!(!link.exists() && linked.exists());

        let hard = dir.path().join("hard.json");
        std::fs::hard_link(&linked, &hard).unwrap();
        let e = take_all(std::slice::from_ref(&hard)).unwrap_err();
        assert!(
            matches!(e, TakeScenarioError::HardLinks { links: 2, .. }),
            "{e}"
        );

        std::fs::write(&good, GOOD).unwrap();
        let all = take_all(&[good.clone(), linked.clone()]).unwrap();
        assert_eq!(all.len(), 2);
        assert!(!good.exists() && !linked.exists());
    }
}
