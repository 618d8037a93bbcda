//! The callers file as a server sees it (plimsolld and plimsoll-router): [`CallerStore`]
//! re-reads it when it changes.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::Callers;

/// What identifies one version of the file: reloaded when any of these changes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    ino: u64,
    ctime: (i64, i64),
}

/// Why the callers could not be consulted.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the callers file {path} is invalid ({message}): the operator must fix it")]
pub struct CallersUnavailable {
    /// The callers file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub message: String,
}

#[derive(Debug)]
struct StoreState {
    stamp: Option<Stamp>,
    loaded: Result<Arc<Callers>, CallersUnavailable>,
}

/// The callers file as a server sees it: re-read whenever the file changes (checked on
/// every authentication: its mtime, ctime, size and inode), or when [`CallerStore::reload`] is
/// called (on SIGHUP). A missing file means no callers; an invalid one refuses everyone until
/// fixed, rather than keeping callers the operator may have just removed.
#[derive(Debug)]
pub struct CallerStore {
    path: PathBuf,
    state: Mutex<StoreState>,
}

impl CallerStore {
    /// A store over this file, read now.
    pub fn open(path: &Path) -> CallerStore {
        let store = CallerStore {
            path: path.to_owned(),
            state: Mutex::new(StoreState {
                stamp: None,
                loaded: Ok(Arc::new(Callers::default())),
            }),
        };
        store.reload();
        store
    }

    /// The callers file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn stamp(&self) -> Option<Stamp> {
        let m = std::fs::metadata(&self.path).ok()?;
        Some(Stamp {
            modified: m.modified().ok(),
            len: m.len(),
            ino: m.ino(),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }

    /// Re-reads the file now.
    pub fn reload(&self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let stamp = self.stamp();
        self.load_into(&mut st, stamp);
    }

    fn load_into(&self, st: &mut StoreState, stamp: Option<Stamp>) {
        st.loaded = match std::fs::read_to_string(&self.path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::warn!(
                    path = %self.path.display(),
                    "callers file missing: no caller can authenticate; add one with `plimsoll callers add NAME`"
                );
                Ok(Arc::new(Callers::default()))
            }
            Err(e) => Err(CallersUnavailable {
                path: self.path.clone(),
                message: e.to_string(),
            }),
            Ok(text) => Callers::parse(&text)
                .map(Arc::new)
                .map_err(|message| CallersUnavailable {
                    path: self.path.clone(),
                    message,
                }),
        };
        match &st.loaded {
            Ok(c) => {
                tracing::info!(path = %self.path.display(), callers = c.len(), "callers file loaded")
            }
            Err(e) => {
                tracing::error!(error = %e, "callers file rejected: every request is refused until it is fixed")
            }
        }
        st.stamp = stamp;
    }

    /// The current callers, re-reading the file first if it changed.
    pub fn current(&self) -> Result<Arc<Callers>, CallersUnavailable> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let stamp = self.stamp();
        if stamp != st.stamp {
            self.load_into(&mut st, stamp);
        }
        st.loaded.clone()
    }
}

#[cfg(test)]
mod tests {
    use crate::add_caller;

    use super::*;

    #[test]
    fn the_store_reloads_when_the_file_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("callers.toml");
        let store = CallerStore::open(&path);
        assert!(store.current().unwrap().is_empty());
        let t = add_caller(&path, "alice").unwrap();
        assert_eq!(store.current().unwrap().authenticate(&t), Some("alice"));
        std::fs::write(&path, "nonsense = [").unwrap();
        assert!(store.current().is_err());
    }
}
