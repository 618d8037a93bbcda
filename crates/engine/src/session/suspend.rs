//! Sessions that outlive a daemon restart (docs/sessions.md, "Across a restart"). On SIGTERM
//! the daemon saves every open session its provider can snapshot into
//! `<state_dir>/suspended/<session id>/` (its image, and `session.json`: what the session is
//! made again from, with the digest over the image); the rest end `daemon_restarted`. The next
//! daemon, once its providers are probed, restores each saved session under its own id, its
//! chain going on, its records saying `restored` from then on. A SIGKILL saves nothing.

use std::collections::BTreeSet;

use super::snapshot::{Parent, files_digest, make_private_dir, not_snapshottable};
use super::*;

/// Why a saved session did not come back: its id and caller when they could be read.
type NotResumed = (Option<(String, String)>, String);

/// What a saved session is written as.
const SAVED_FILE: &str = "session.json";

impl Sessions {
    /// Instances of earlier daemons whose sessions this one restored: their ids are served
    /// here (a router finds them by this, `/readyz`'s `Plimsoll-Adopted-Instances`).
    pub(crate) fn adopted(&self) -> BTreeSet<String> {
        self.adopted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Engine {
    /// Whether an earlier daemon saved sessions in this engine's state directory: if so, the
    /// engine is not ready ([`Engine::ready`]) until [`Engine::resume_sessions`] has run.
    /// Call before the first probe.
    pub fn expect_saved_sessions(&self) -> bool {
        let pending = std::fs::read_dir(self.config.state_dir.join("suspended"))
            .is_ok_and(|mut d| d.next().is_some());
        self.sessions
            .resuming
            .store(pending, std::sync::atomic::Ordering::SeqCst);
        pending
    }

    /// Whether saved sessions still wait to be restored.
    pub(crate) fn resuming(&self) -> bool {
        self.sessions
            .resuming
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The daemon is stopping: every open session whose provider can snapshot it is saved for
    /// the next daemon and its sandbox removed; every other one ends (`daemon_restarted`).
    /// Returns how many were saved and how many ended.
    pub fn suspend_sessions(&self) -> (usize, usize) {
        let root = self.config.state_dir.join("suspended");
        let open: Vec<Arc<Session>> = self.sessions.inner().open.values().cloned().collect();
        let (mut saved, mut ended) = (0, 0);
        for s in open {
            let mut st = lock(&s);
            match self.suspend(&s, &mut st, &root.join(&s.id)) {
                Ok(()) => {
                    saved += 1;
                    tracing::info!(session_id = %s.id, caller = %s.caller, calls = st.calls, "session saved for the next daemon");
                }
                Err(why) => {
                    ended += 1;
                    tracing::info!(session_id = %s.id, why = %why, "session not saved; it ends with the daemon");
                }
            }
            self.sessions.end(&s, &mut st, EndReason::DaemonRestarted);
        }
        (saved, ended)
    }

    fn suspend(&self, s: &Session, st: &mut State, dir: &std::path::Path) -> Result<(), String> {
        if st.ended.is_some() || s.expired(st).is_some() {
            return Err("it had ended".into());
        }
        if let Some((_, why)) = not_snapshottable(s, st) {
            return Err(why.into());
        }
        let image = dir.join("image");
        make_private_dir(&image).map_err(|e| format!("cannot make {}: {e}", image.display()))?;
        let discard = |why: String| {
            let _ = std::fs::remove_dir_all(dir);
            why
        };
        let sandbox = st.sandbox.as_mut().ok_or("it has no sandbox")?;
        sandbox
            .checkpoint(&image, false)
            .map_err(|e| discard(e.message()))?;
        let (sha256, _) = files_digest(&image).map_err(discard)?;
        let parent = Parent::of(s, st, sha256);
        let json = serde_json::to_vec_pretty(&parent).map_err(|e| discard(e.to_string()))?;
        std::fs::write(dir.join(SAVED_FILE), json)
            .map_err(|e| discard(format!("cannot write {SAVED_FILE}: {e}")))
    }

    /// Restores every session an earlier daemon saved (call once, after the first probe).
    /// Each comes back under its own id; one that cannot (its provider unavailable, its files
    /// changed, its lifetime over) is removed and its id answers `session_ended`
    /// (`daemon_restarted`). Returns how many came back and how many did not.
    pub fn resume_sessions(&self) -> (usize, usize) {
        let root = self.config.state_dir.join("suspended");
        let Ok(entries) = std::fs::read_dir(&root) else {
            self.sessions
                .resuming
                .store(false, std::sync::atomic::Ordering::SeqCst);
            return (0, 0);
        };
        let (mut back, mut lost) = (0, 0);
        for entry in entries.flatten() {
            let dir = entry.path();
            match self.resume(&dir) {
                Ok(s) => {
                    back += 1;
                    tracing::info!(session_id = %s.id, caller = %s.caller, "session restored after the daemon's restart");
                    self.sessions
                        .adopted
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .extend(plimsoll_wire::session_instance(&s.id).map(str::to_owned));
                    self.sessions.opened(&s.caller, 0, Some(&s));
                }
                Err((parent, why)) => {
                    lost += 1;
                    tracing::error!(dir = %dir.display(), why = %why, "a saved session could not be restored; it has ended");
                    if let Some((id, caller)) = parent {
                        let mut inner = self.sessions.inner();
                        inner
                            .ended
                            .push_back((id, caller, EndReason::DaemonRestarted));
                    }
                }
            }
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::error!(dir = %dir.display(), error = %e, "a saved session's files were not removed");
            }
        }
        if back > 0 {
            self.sessions.start_reaper();
        }
        self.sessions
            .resuming
            .store(false, std::sync::atomic::Ordering::SeqCst);
        (back, lost)
    }

    /// The session saved in `dir`, restored; or why not, with its id and caller when known.
    fn resume(&self, dir: &std::path::Path) -> Result<Arc<Session>, NotResumed> {
        let text = std::fs::read(dir.join(SAVED_FILE))
            .map_err(|e| (None, format!("cannot read {SAVED_FILE}: {e}")))?;
        let parent: Parent = serde_json::from_slice(&text)
            .map_err(|e| (None, format!("{SAVED_FILE} is not a saved session: {e}")))?;
        if validate_session_id(&parent.session_id).is_err()
            || dir.file_name() != Some(std::ffi::OsStr::new(&parent.session_id))
        {
            return Err((None, "its directory does not name its session".into()));
        }
        let lost = |why: String| {
            (
                Some((parent.session_id.clone(), parent.caller.clone())),
                why,
            )
        };
        let lifetime = Duration::from_millis(parent.lifetime_ms);
        let age = Duration::from_millis(unix_ms_now().saturating_sub(parent.opened_unix_ms));
        if age >= lifetime {
            return Err(lost(
                "its maximum lifetime passed while no daemon held it".into(),
            ));
        }
        let opened = Instant::now().checked_sub(age).unwrap_or_else(Instant::now);
        let request_id = format!("resume-{}", &parent.session_id[4..20]);
        Engine::files_unchanged(&parent, dir, &request_id).map_err(|e| lost(e.to_string()))?;
        let restored = self
            .restore_sandbox(&parent.caller, &parent, dir, lifetime - age, &request_id)
            .map_err(|e| lost(e.to_string()))?;
        let origin = parent.origin(plimsoll_wire::SessionStart::Restored);
        Ok(parent.session(
            parent.session_id.clone(),
            origin,
            (opened, parent.opened_unix_ms),
            lifetime,
            restored,
        ))
    }
}
