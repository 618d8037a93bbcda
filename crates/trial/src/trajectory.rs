//! The trajectory file and its fingerprint (docs/trials.md, "Trajectory"): one 40-byte record
//! per tick, five little-endian IEEE 754 doubles `x x_dot theta theta_dot force`, where the
//! state is the one sent to the controller at that tick and the force is its answer as parsed
//! (before the simulator's clamp). No header. Fingerprint = SHA-256 of the file's bytes.

use std::io::{self, BufWriter, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use crate::sim::State;

/// Bytes per record.
pub const RECORD_BYTES: usize = 40;

/// Writing the trajectory failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot write the trajectory {path}")]
pub struct TrajectoryError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub source: io::Error,
}

/// An open trajectory file, hashed as it is written.
#[derive(Debug)]
pub struct TrajectoryWriter {
    path: PathBuf,
    file: BufWriter<std::fs::File>,
    hash: Sha256,
    bytes: u64,
}

/// A written trajectory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// Lowercase hex SHA-256 of the file.
    pub fingerprint: String,
    /// Its size.
    pub bytes: u64,
}

impl TrajectoryWriter {
    /// Creates (or truncates) the file, mode 0644.
    pub fn create(path: &Path) -> Result<Self, TrajectoryError> {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(|source| TrajectoryError {
                path: path.to_owned(),
                source,
            })?;
        Ok(TrajectoryWriter {
            path: path.to_owned(),
            file: BufWriter::with_capacity(64 * 1024, file),
            hash: Sha256::new(),
            bytes: 0,
        })
    }

    /// Appends one record.
    pub fn append(&mut self, state: &State, force: f64) -> Result<(), TrajectoryError> {
        let record = encode(state, force);
        self.hash.update(record);
        self.bytes += RECORD_BYTES as u64;
        self.file
            .write_all(&record)
            .map_err(|source| TrajectoryError {
                path: self.path.clone(),
                source,
            })
    }

    /// Flushes and syncs the file; returns its fingerprint.
    pub fn finish(self) -> Result<Written, TrajectoryError> {
        let path = self.path;
        let file = self.file.into_inner().map_err(|e| TrajectoryError {
            path: path.clone(),
            source: e.into_error(),
        })?;
        file.sync_all().map_err(|source| TrajectoryError {
            path: path.clone(),
            source,
        })?;
        Ok(Written {
            fingerprint: hex::encode(self.hash.finalize()),
            bytes: self.bytes,
        })
    }
}

/// One record's bytes.
pub fn encode(state: &State, force: f64) -> [u8; RECORD_BYTES] {
    let mut out = [0u8; RECORD_BYTES];
    for (i, v) in [state.x, state.x_dot, state.theta, state.theta_dot, force]
        .iter()
        .enumerate()
    {
        out[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    out
}

/// Splits a trajectory file's bytes into (state, force) records. `None` if the length is not a
/// whole number of records.
pub fn decode(bytes: &[u8]) -> Option<Vec<(State, f64)>> {
    if !bytes.len().is_multiple_of(RECORD_BYTES) {
        return None;
    }
    Some(
        bytes
            .chunks_exact(RECORD_BYTES)
            .map(|r| {
                let v =
                    |i: usize| f64::from_le_bytes(r[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
                (
                    State {
                        x: v(0),
                        x_dot: v(1),
                        theta: v(2),
                        theta_dot: v(3),
                    },
                    v(4),
                )
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_five_little_endian_doubles_and_the_fingerprint_is_the_file_hash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.bin");
        let mut w = TrajectoryWriter::create(&path).unwrap();
        let s = State {
            x: 1.0,
            x_dot: -2.0,
            theta: 0.5,
            theta_dot: 0.25,
        };
        w.append(&s, 3.0).unwrap();
        w.append(&s, -0.0).unwrap();
        let written = w.finish().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 80);
        assert_eq!(written.bytes, 80);
        assert_eq!(&bytes[..8], &1.0f64.to_le_bytes());
        assert_eq!(&bytes[32..40], &3.0f64.to_le_bytes());
        assert_eq!(&bytes[72..80], &[0, 0, 0, 0, 0, 0, 0, 0x80]);
        assert_eq!(written.fingerprint, hex::encode(Sha256::digest(&bytes)));
        let back = decode(&bytes).unwrap();
        assert_eq!(back, vec![(s, 3.0), (s, -0.0)]);
        assert!(decode(&bytes[..79]).is_none());
    }
}
