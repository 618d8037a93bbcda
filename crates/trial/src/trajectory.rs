//! The trajectory file and its fingerprint (docs/trials.md, "Trajectory"): one record per
//! tick, the state values sent to the controller at that tick and then the action values it
//! answered as parsed (before the runner's clamp), each a little-endian IEEE 754 double. No
//! header. Fingerprint = SHA-256 of the file's bytes. The cart-pole's record is 40 bytes:
//! `x x_dot theta theta_dot force`.

use std::io::{self, BufWriter, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

/// Bytes per record for `state` state values and `action` action values.
pub fn record_bytes(state: usize, action: usize) -> usize {
    8 * (state + action)
}

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
    pub fn append(&mut self, state: &[f64], action: &[f64]) -> Result<(), TrajectoryError> {
        let record = encode(state, action);
        self.hash.update(&record);
        self.bytes += record.len() as u64;
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
pub fn encode(state: &[f64], action: &[f64]) -> Vec<u8> {
    state
        .iter()
        .chain(action)
        .flat_map(|v| v.to_le_bytes())
        .collect()
}

/// Splits a trajectory file's bytes into (state, action) records of `state` and `action`
/// values. `None` if the length is not a whole number of records.
pub fn decode(bytes: &[u8], state: usize, action: usize) -> Option<Vec<(Vec<f64>, Vec<f64>)>> {
    let size = record_bytes(state, action);
    if size == 0 || !bytes.len().is_multiple_of(size) {
        return None;
    }
    Some(
        bytes
            .chunks_exact(size)
            .map(|r| {
                let values: Vec<f64> = r
                    .chunks_exact(8)
                    .map(|v| f64::from_le_bytes(v.try_into().expect("8 bytes")))
                    .collect();
                let (s, a) = values.split_at(state);
                (s.to_vec(), a.to_vec())
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
        let s = [1.0, -2.0, 0.5, 0.25];
        w.append(&s, &[3.0]).unwrap();
        w.append(&s, &[-0.0]).unwrap();
        let written = w.finish().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 80);
        assert_eq!(written.bytes, 80);
        assert_eq!(&bytes[..8], &1.0f64.to_le_bytes());
        assert_eq!(&bytes[32..40], &3.0f64.to_le_bytes());
        assert_eq!(&bytes[72..80], &[0, 0, 0, 0, 0, 0, 0, 0x80]);
        assert_eq!(written.fingerprint, hex::encode(Sha256::digest(&bytes)));
        let back = decode(&bytes, 4, 1).unwrap();
        assert_eq!(
            back,
            vec![(s.to_vec(), vec![3.0]), (s.to_vec(), vec![-0.0])]
        );
        assert!(decode(&bytes[..79], 4, 1).is_none());
        assert_eq!(decode(&bytes, 3, 2).unwrap()[1].1, vec![0.25, -0.0]);
    }
}
