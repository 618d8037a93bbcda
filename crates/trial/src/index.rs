//! Finding a trial's simulator by name in a simulator index (docs/simulators.md, "Simulators
//! in images"). In a sandbox the index is the image's own ([`IMAGE_INDEX`]): it and the module
//! must sit on a read-only filesystem, so the simulator is the image's, never the caller's.

use std::io::Read as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

pub use plimsoll_wire::simulators::{IMAGE_INDEX, INDEX_FORMAT};
use plimsoll_wire::simulators::{MAX_INDEX_BYTES, SimulatorEntry, SimulatorIndex};
use sha2::{Digest as _, Sha256};

use crate::sim::MAX_MODULE_BYTES;

/// The simulator could not be found or read through the index.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// The index or the module could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Too large.
    #[error("{path} is larger than {limit} bytes")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The limit.
        limit: u64,
    },
    /// The index is not as docs/simulators.md says.
    #[error("the simulator index {path} is not valid: {detail}")]
    Format {
        /// The index.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The image's index or module is on a writable filesystem.
    #[error(
        "{path} is on a writable filesystem; a trial's simulator must come from the image, mounted read-only"
    )]
    Writable {
        /// The file.
        path: PathBuf,
    },
    /// No simulator of that name.
    #[error("this image has no simulator named {name} (it has: {available})")]
    NotFound {
        /// The name asked for.
        name: String,
        /// Every name the index holds.
        available: String,
    },
    /// The step asked for another digest than the image declares.
    #[error(
        "the step asks for simulator {name} with SHA-256 {wanted}, but this image's {name} is {declared}"
    )]
    Sha256Mismatch {
        /// The name.
        name: String,
        /// The digest the step asked for.
        wanted: String,
        /// The digest the index declares.
        declared: String,
    },
    /// The module's bytes are not the ones the index declares.
    #[error(
        "the module of simulator {name} ({path}) has SHA-256 {actual}, not the {declared} its image declares"
    )]
    ModuleDigest {
        /// The name.
        name: String,
        /// The module.
        path: PathBuf,
        /// What the index says.
        declared: String,
        /// What the bytes hash to.
        actual: String,
    },
    /// The module's metadata names another simulator.
    #[error("the image declares simulator {declared}, but its module's metadata says {said}")]
    NameMismatch {
        /// The index's name.
        declared: String,
        /// The metadata's.
        said: String,
    },
}

/// Finds `name` in the index at `index` (for the image's index, `image` is true: the index and
/// the module must be on a read-only filesystem), checks the digest the step asked for (if
/// any) and the module's bytes against the index, and returns the entry and the bytes.
pub fn load(
    index: &Path,
    image: bool,
    name: &str,
    sha256: Option<&str>,
) -> Result<(SimulatorEntry, Vec<u8>), IndexError> {
    let text = read_bounded(index, MAX_INDEX_BYTES, image)?;
    let parsed = SimulatorIndex::parse(&text).map_err(|detail| IndexError::Format {
        path: index.to_owned(),
        detail,
    })?;
    let entry = parsed
        .get(name)
        .ok_or_else(|| IndexError::NotFound {
            name: name.to_owned(),
            available: parsed.names(),
        })?
        .clone();
    if image {
        entry
            .check_in_image()
            .map_err(|detail| IndexError::Format {
                path: index.to_owned(),
                detail,
            })?;
    }
    if let Some(wanted) = sha256
        && wanted != entry.sha256
    {
        return Err(IndexError::Sha256Mismatch {
            name: name.to_owned(),
            wanted: wanted.to_owned(),
            declared: entry.sha256,
        });
    }
    let path = PathBuf::from(&entry.path);
    let bytes = read_bounded(&path, MAX_MODULE_BYTES, image)?;
    let actual = hex::encode(Sha256::digest(&bytes));
    if actual != entry.sha256 {
        return Err(IndexError::ModuleDigest {
            name: name.to_owned(),
            path,
            declared: entry.sha256,
            actual,
        });
    }
    Ok((entry, bytes))
}

/// Whether `file` (opened from `path`) lies on a read-only mount: the filesystem says so
/// (`statvfs`), or the mount that holds the path's real location is mounted `ro` in
/// /proc/self/mountinfo (gVisor's `statvfs` flags leave out a read-only bind).
fn on_read_only_mount(file: &std::fs::File, path: &Path) -> bool {
    if rustix::fs::fstatvfs(file)
        .is_ok_and(|vfs| vfs.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY))
    {
        return true;
    }
    let (Ok(real), Ok(mountinfo)) = (
        std::fs::canonicalize(path),
        std::fs::read_to_string("/proc/self/mountinfo"),
    ) else {
        return false;
    };
    real.to_str()
        .is_some_and(|p| plimsoll_sandbox::wall::path_read_only(&mountinfo, p))
}

/// Reads at most `limit` bytes of a regular file; with `read_only`, the file must be on a
/// read-only filesystem.
fn read_bounded(path: &Path, limit: u64, read_only: bool) -> Result<Vec<u8>, IndexError> {
    let read = |source| IndexError::Read {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(read)?;
    if !file.metadata().map_err(read)?.file_type().is_file() {
        return Err(read(std::io::Error::other("not a regular file")));
    }
    if read_only && !on_read_only_mount(&file, path) {
        return Err(IndexError::Writable {
            path: path.to_owned(),
        });
    }
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes).map_err(read)?;
    if bytes.len() as u64 > limit {
        return Err(IndexError::TooLarge {
            path: path.to_owned(),
            limit,
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An index in `dir` declaring `name` at `path` with the digest of `module`.
    fn index(dir: &Path, name: &str, path: &str, module: &[u8]) -> PathBuf {
        let index = dir.join("index.json");
        let text = serde_json::json!({
            "format": INDEX_FORMAT,
            "simulators": [{"name": name, "path": path, "sha256": hex::encode(Sha256::digest(module))}],
        });
        std::fs::write(&index, text.to_string()).unwrap();
        index
    }

    /// The wall: an image's index that code in the sandbox could have written is refused,
    /// whatever it says (the containers' and the guest's read-only roots are the accepted
    /// case, in the trial tests at every provider; a path under /work in an image's index is
    /// refused by `SimulatorEntry::check_in_image`, tested in the wire crate).
    #[test]
    fn an_image_index_on_a_writable_mount_or_pointing_where_code_writes_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let module = dir.path().join("m.wasm");
        std::fs::write(&module, b"\0asm").unwrap();
        let at = index(dir.path(), "m", module.to_str().unwrap(), b"\0asm");
        // A temporary directory is writable: as the image's index, refused.
        let e = load(&at, true, "m", None).unwrap_err();
        assert!(matches!(e, IndexError::Writable { .. }), "{e}");
        // Outside a sandbox (an index given on the command line), taken.
        let (entry, bytes) = load(&at, false, "m", None).unwrap();
        assert_eq!(
            (entry.name.as_str(), bytes.as_slice()),
            ("m", &b"\0asm"[..])
        );
        // A module whose bytes are not the declared ones.
        std::fs::write(&module, b"\0asm\x01").unwrap();
        let e = load(&at, false, "m", None).unwrap_err();
        assert!(matches!(e, IndexError::ModuleDigest { .. }), "{e}");
    }

    #[test]
    fn an_index_past_its_limit_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join("index.json");
        std::fs::write(&at, vec![b' '; MAX_INDEX_BYTES as usize + 1]).unwrap();
        let e = load(&at, false, "m", None).unwrap_err();
        assert!(matches!(e, IndexError::TooLarge { .. }), "{e}");
    }
}
