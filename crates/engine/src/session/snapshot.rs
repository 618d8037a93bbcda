//! Snapshots and forks of sessions (docs/sessions.md, "Snapshots and forks"). A snapshot is
//! the session's sandbox saved whole by its provider (at runsc, `runsc checkpoint`: every
//! process's memory, the writable tmpfs mounts) into a directory of its own, with a digest
//! over its files; the session goes on, restored from that same image. A new session opened
//! from a snapshot, or each copy of a fork, is restored from it, given fresh randomness
//! before anything else runs in it, and says where it came from on its info and on every
//! record, inside the digest. A copy whose randomness cannot be renewed is refused.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use plimsoll_wire::{
    ForkAnswer, ForkRequest, ImageRef, SessionOrigin, SessionStart, SnapshotInfo, SnapshotList,
    SnapshotOpenRequest, SnapshotRequest, validate_snapshot_id,
};
use sha2::{Digest as _, Sha256};

use super::*;

/// The domain the snapshot digest starts with.
const SNAPSHOT_DOMAIN: &str = "plimsoll/snapshot/v1\n";
/// How long a copy's interpreter may take to take its new seed.
const RESEED_WITHIN: Duration = Duration::from_secs(20);

/// Why a JavaScript session is not snapshotted (docs/sessions.md).
const JAVASCRIPT_NOT_RESEEDED: &str = "a JavaScript session cannot be snapshotted or forked: node's `crypto.randomBytes` draws from OpenSSL's generator in the process's memory, which node gives no way to re-seed, so every copy would repeat its parent's random bytes; open a Python session to snapshot it";

/// One snapshot kept.
#[derive(Debug)]
pub(super) struct Snapshot {
    caller: String,
    /// `<state_dir>/snapshots/<id>`: its files, all of them under `image/` (the digest's).
    dir: PathBuf,
    /// What it says of itself (no request id).
    info: SnapshotInfo,
    expires: Instant,
    /// The session it was taken of, as a session restored from it is made again.
    parent: Parent,
}

/// What a session restored from a snapshot is made again from: its parent session as it
/// was when the snapshot was taken (docs/sessions.md).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Parent {
    pub(super) session_id: String,
    pub(super) caller: String,
    pub(super) language: Language,
    pub(super) provider: String,
    pub(super) floor: Tier,
    pub(super) image: Option<ImageRef>,
    pub(super) limits: SavedLimits,
    pub(super) opened_unix_ms: u64,
    pub(super) lifetime_ms: u64,
    pub(super) idle_timeout_ms: u64,
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) calls: u64,
    pub(super) last_record_sha256: Option<String>,
    /// The snapshot digest over its image's files.
    pub(super) sha256: String,
}

/// A session's limits, as saved.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SavedLimits {
    timeout_ms: u64,
    memory_bytes: u64,
    output_bytes: u64,
    pids: u64,
    disk_bytes: u64,
    artifact_bytes: u64,
}

impl From<plimsoll_sandbox::ResolvedLimits> for SavedLimits {
    fn from(l: plimsoll_sandbox::ResolvedLimits) -> Self {
        SavedLimits {
            timeout_ms: millis(l.timeout),
            memory_bytes: l.memory_bytes,
            output_bytes: l.output_bytes,
            pids: l.pids,
            disk_bytes: l.disk_bytes,
            artifact_bytes: l.artifact_bytes,
        }
    }
}

impl From<SavedLimits> for plimsoll_sandbox::ResolvedLimits {
    fn from(l: SavedLimits) -> Self {
        plimsoll_sandbox::ResolvedLimits {
            timeout: Duration::from_millis(l.timeout_ms),
            memory_bytes: l.memory_bytes,
            output_bytes: l.output_bytes,
            pids: l.pids,
            disk_bytes: l.disk_bytes,
            artifact_bytes: l.artifact_bytes,
        }
    }
}

impl Parent {
    /// `s` as it is now (its state `st`), its snapshot's digest `sha256`.
    pub(super) fn of(s: &Session, st: &State, sha256: String) -> Parent {
        Parent {
            session_id: s.id.clone(),
            caller: s.caller.clone(),
            language: s.language,
            provider: s.provider.clone(),
            floor: s.floor,
            image: s.image.clone(),
            limits: s.limits.into(),
            opened_unix_ms: s.opened_unix_ms,
            lifetime_ms: millis(s.lifetime),
            idle_timeout_ms: millis(s.idle_timeout),
            uid: s.uid,
            gid: s.gid,
            calls: st.calls,
            last_record_sha256: st.last_record.clone(),
            sha256,
        }
    }

    /// The origin of a session restored from this parent's snapshot.
    pub(super) fn origin(&self, start: SessionStart) -> SessionOrigin {
        SessionOrigin {
            start,
            snapshot_sha256: self.sha256.clone(),
            parent_session_id: self.session_id.clone(),
            parent_record_sha256: self.last_record_sha256.clone(),
            parent_calls: self.calls,
        }
    }
}

impl Snapshot {
    fn remove(&self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::error!(snapshot_id = %self.info.snapshot_id, error = %e, "a snapshot's files were not removed");
        }
    }
}

/// Why `s` cannot be snapshotted whatever its provider, if it cannot.
pub(super) fn not_snapshottable(s: &Session, st: &State) -> Option<(Reason, &'static str)> {
    if s.broker.is_some() {
        Some((
            Reason::Unsupported,
            "a session holding a grant cannot be snapshotted: its grant's broker and connections are outside its sandbox and are not saved; open the session without a grant",
        ))
    } else if s.language == Language::Javascript {
        Some((Reason::Unsupported, JAVASCRIPT_NOT_RESEEDED))
    } else if !st.interpreter_alive {
        Some((
            Reason::Request,
            "the session's interpreter has ended, so there is no state to save: send a cell with ?restart=true first",
        ))
    } else {
        None
    }
}

/// The snapshot digest (docs/sessions.md, "The snapshot digest") of the provider's image in
/// `dir`: SHA-256 over the domain, then, for every regular file under `dir` in the byte order
/// of its path relative to `dir`,
/// `PATH \0 SIZE \0 SHA256-HEX \n`; and the files' total size. Anything but a directory or a
/// regular file is refused: a provider writes nothing else.
pub(crate) fn files_digest(dir: &Path) -> Result<(String, u64), String> {
    let mut files = Vec::new();
    let mut dirs = vec![PathBuf::new()];
    while let Some(rel) = dirs.pop() {
        let entries = std::fs::read_dir(dir.join(&rel))
            .map_err(|e| format!("cannot list {}: {e}", rel.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("cannot list {}: {e}", rel.display()))?;
            let kind = entry.file_type().map_err(|e| e.to_string())?;
            let path = rel.join(entry.file_name());
            if kind.is_dir() {
                dirs.push(path);
            } else if kind.is_file() {
                files.push(path);
            } else {
                return Err(format!(
                    "{} is neither a file nor a directory",
                    path.display()
                ));
            }
        }
    }
    files.sort_by(|a, b| {
        a.as_os_str()
            .as_encoded_bytes()
            .cmp(b.as_os_str().as_encoded_bytes())
    });
    let mut all = Sha256::new();
    all.update(SNAPSHOT_DOMAIN.as_bytes());
    let mut total = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    for rel in files {
        let mut f = std::fs::File::open(dir.join(&rel))
            .map_err(|e| format!("cannot read {}: {e}", rel.display()))?;
        let mut one = Sha256::new();
        let mut size = 0u64;
        loop {
            let n = f
                .read(&mut buf)
                .map_err(|e| format!("cannot read {}: {e}", rel.display()))?;
            if n == 0 {
                break;
            }
            one.update(&buf[..n]);
            size += n as u64;
        }
        total += size;
        all.update(rel.as_os_str().as_encoded_bytes());
        all.update(format!("\0{size}\0{}\n", hex::encode(one.finalize())).as_bytes());
    }
    Ok((hex::encode(all.finalize()), total))
}

impl Sessions {
    /// Bytes of snapshots kept: `caller`'s, and everyone's.
    fn snapshot_bytes(snapshots: &HashMap<String, Arc<Snapshot>>, caller: &str) -> (u64, u64) {
        snapshots.values().fold((0, 0), |(mine, all), s| {
            let b = s.info.bytes;
            (if s.caller == caller { mine + b } else { mine }, all + b)
        })
    }

    fn snapshots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Snapshot>>> {
        self.snapshots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Removes every snapshot past its expiry.
    pub(super) fn reap_snapshots(&self) {
        let now = Instant::now();
        let expired: Vec<Arc<Snapshot>> = {
            let mut all = self.snapshots();
            let gone: Vec<String> = all
                .iter()
                .filter(|(_, s)| s.expires <= now)
                .map(|(id, _)| id.clone())
                .collect();
            gone.iter().filter_map(|id| all.remove(id)).collect()
        };
        for s in expired {
            s.remove();
            tracing::info!(snapshot_id = %s.info.snapshot_id, caller = %s.caller, "snapshot expired and removed");
        }
    }

    /// The caller's snapshot `id`, or the refusal: the same for an unknown id, another
    /// caller's and an expired one's removed files.
    fn find_snapshot(
        &self,
        caller: &str,
        id: &str,
        request_id: Option<&str>,
    ) -> Result<Arc<Snapshot>, RunError> {
        let found = validate_snapshot_id(id)
            .ok()
            .and_then(|()| self.snapshots().get(id).cloned())
            .filter(|s| s.caller == caller && s.expires > Instant::now());
        found.ok_or_else(|| RunError::SessionRefused {
            request_id: request_id.map(str::to_owned),
            reason: Reason::Request,
            code: "snapshot_not_found",
            message: "no such snapshot of this caller (snapshots expire, and do not outlive the daemon that took them): take one with POST /v1/sessions/ID/snapshot".into(),
            end_reason: None,
        })
    }
}

impl Engine {
    /// Takes a snapshot of `caller`'s session `id`; the session goes on. Refused (the session
    /// untouched) where its provider cannot, for a JavaScript session, a session holding a
    /// grant, and over the snapshot quotas.
    pub fn snapshot_session(
        &self,
        caller: &str,
        id: &str,
        req: &SnapshotRequest,
    ) -> Result<SnapshotInfo, RunError> {
        let s = self.sessions.find(caller, id, Some(&req.request_id))?;
        let snap = self.take_snapshot(caller, &s, &req.request_id)?;
        Ok(SnapshotInfo {
            request_id: Some(req.request_id.clone()),
            ..snap.info.clone()
        })
    }

    fn take_snapshot(
        &self,
        caller: &str,
        s: &Arc<Session>,
        request_id: &str,
    ) -> Result<Arc<Snapshot>, RunError> {
        let rid = Some(request_id);
        let refuse = |reason, message: String| RunError::refused(rid, reason, message);
        let mut st = lock(s);
        if let Some(reason) = st.ended {
            return Err(ended_refusal(rid, &s.id, reason));
        }
        if let Some(reason) = s.expired(&st) {
            self.sessions.end(s, &mut st, reason);
            return Err(ended_refusal(rid, &s.id, reason));
        }
        if let Some((reason, why)) = not_snapshottable(s, &st) {
            return Err(refuse(reason, why.into()));
        }
        let policy = self.config.sessions;
        let (mine, all) = Sessions::snapshot_bytes(&self.sessions.snapshots(), caller);
        if mine >= policy.snapshot_bytes_per_caller || all >= policy.snapshot_bytes {
            return Err(refuse(
                Reason::Capacity,
                format!(
                    "snapshots take {mine} bytes of this caller's {} and {all} of the server's {}: delete one (DELETE /v1/snapshots/ID) or wait for one to expire",
                    policy.snapshot_bytes_per_caller, policy.snapshot_bytes
                ),
            ));
        }
        let snapshot_id = format!(
            "snp_{}_{}",
            self.sessions.instance,
            hex::encode(rand::random::<[u8; 16]>())
        );
        let dir = self.config.state_dir.join("snapshots").join(&snapshot_id);
        let image = dir.join("image");
        if let Err(e) = make_private_dir(&image) {
            return Err(refuse(
                Reason::Environment,
                format!(
                    "cannot make the snapshot's directory {}: {e}",
                    image.display()
                ),
            ));
        }
        let discard = || {
            let _ = std::fs::remove_dir_all(&dir);
        };
        let sandbox = st
            .sandbox
            .as_mut()
            .expect("an open session has its sandbox");
        let started = Instant::now();
        if let Err(e) = sandbox.checkpoint(&image, true) {
            discard();
            let message = e.message();
            return Err(match e.not_dispatched() {
                Some(reason) => refuse(reason, message),
                None => {
                    tracing::error!(session_id = %s.id, request_id, %message, "a session's snapshot failed; ending the session");
                    self.sessions.end(s, &mut st, EndReason::SandboxFailed);
                    RunError::Failed {
                        request_id: request_id.to_owned(),
                        provider: s.provider.clone(),
                        message: format!("{message}; the session has ended (sandbox_failed)"),
                    }
                }
            });
        }
        let checkpoint_ms = millis(started.elapsed());
        st.last_call = Instant::now();
        let (sha256, bytes) = match files_digest(&image) {
            Ok(d) => d,
            Err(e) => {
                discard();
                return Err(refuse(
                    Reason::Environment,
                    format!("cannot read the snapshot's files back: {e}"),
                ));
            }
        };
        let now_ms = unix_ms_now();
        let parent = Parent::of(s, &st, sha256.clone());
        let snap = Arc::new(Snapshot {
            caller: caller.to_owned(),
            dir: dir.clone(),
            info: SnapshotInfo {
                protocol: PROTOCOL,
                request_id: None,
                snapshot_id: snapshot_id.clone(),
                session_id: s.id.clone(),
                sha256,
                bytes,
                provider: s.provider.clone(),
                isolation: s.tier,
                language: s.language,
                calls: st.calls,
                last_record_sha256: st.last_record.clone(),
                checkpoint_ms,
                created_unix_ms: now_ms,
                expires_unix_ms: now_ms.saturating_add(millis(policy.snapshot_lifetime)),
            },
            expires: Instant::now() + policy.snapshot_lifetime,
            parent,
        });
        drop(st);
        {
            // Counted and kept at once, so two snapshots cannot both pass the quotas.
            let mut kept = self.sessions.snapshots();
            let (mine, all) = Sessions::snapshot_bytes(&kept, caller);
            if mine + bytes > policy.snapshot_bytes_per_caller
                || all + bytes > policy.snapshot_bytes
            {
                drop(kept);
                discard();
                return Err(refuse(
                    Reason::Capacity,
                    format!(
                        "the snapshot took {bytes} bytes, over the quota (this caller keeps {mine} of {}, the server {all} of {}); it was removed and the session goes on: delete a snapshot (DELETE /v1/snapshots/ID)",
                        policy.snapshot_bytes_per_caller, policy.snapshot_bytes
                    ),
                ));
            }
            kept.insert(snapshot_id.clone(), Arc::clone(&snap));
        }
        self.sessions.start_reaper();
        tracing::info!(snapshot_id = %snapshot_id, session_id = %s.id, request_id, caller, bytes, checkpoint_ms, sha256 = %snap.info.sha256, "snapshot taken");
        Ok(snap)
    }

    /// Forks `caller`'s session `id` into `req.count` new sessions: a snapshot taken, then
    /// each copy restored from it and given fresh randomness. All or none: a copy that fails
    /// closes the others. Refused (nothing taken) over the session limits.
    pub fn fork_session(
        &self,
        caller: &str,
        id: &str,
        req: &ForkRequest,
    ) -> Result<ForkAnswer, RunError> {
        let rid = Some(req.request_id.as_str());
        let policy = self.config.sessions;
        if req.count == 0 || req.count > policy.max_fork {
            return Err(RunError::refused(
                rid,
                Reason::Request,
                format!(
                    "count = {} is not between 1 and this server's max_fork, {}",
                    req.count, policy.max_fork
                ),
            ));
        }
        let s = self.sessions.find(caller, id, rid)?;
        let n = req.count as usize;
        self.sessions.reserve(caller, n, &policy, rid)?;
        let snap = match self.take_snapshot(caller, &s, &req.request_id) {
            Ok(snap) => snap,
            Err(e) => {
                self.sessions.opened(caller, n, None);
                return Err(e);
            }
        };
        let made: Vec<Result<Arc<Session>, RunError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..n)
                .map(|_| {
                    scope.spawn(|| {
                        self.restore_copy(caller, &snap, SessionStart::Forked, &req.request_id)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(RunError::Failed {
                            request_id: req.request_id.clone(),
                            provider: snap.info.provider.clone(),
                            message: "restoring a copy failed inside the daemon".into(),
                        })
                    })
                })
                .collect()
        });
        let mut copies = Vec::with_capacity(n);
        let mut failed = None;
        for m in made {
            match m {
                Ok(copy) => copies.push(copy),
                Err(e) => {
                    self.sessions.opened(caller, 1, None);
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            for copy in copies {
                self.sessions.opened(caller, 1, None);
                // Never handed out: removed as a closed session is.
                let mut st = lock(&copy);
                self.sessions.end(&copy, &mut st, EndReason::Closed);
            }
            return Err(e);
        }
        let mut sessions = Vec::with_capacity(n);
        for copy in copies {
            self.sessions.opened(caller, 1, Some(&copy));
            let st = lock(&copy);
            sessions.push(copy.info(&st, rid));
        }
        self.sessions.start_reaper();
        tracing::info!(session_id = %s.id, snapshot_id = %snap.info.snapshot_id, request_id = %req.request_id, copies = n, "session forked");
        Ok(ForkAnswer {
            protocol: PROTOCOL,
            request_id: req.request_id.clone(),
            snapshot: SnapshotInfo {
                request_id: Some(req.request_id.clone()),
                ..snap.info.clone()
            },
            sessions,
        })
    }

    /// Opens a new session for `caller` from its snapshot `snapshot_id` (`restored`).
    pub fn open_snapshot(
        &self,
        caller: &str,
        snapshot_id: &str,
        req: &SnapshotOpenRequest,
    ) -> Result<SessionInfo, RunError> {
        let rid = Some(req.request_id.as_str());
        let snap = self.sessions.find_snapshot(caller, snapshot_id, rid)?;
        if let Some(want) = &req.sha256
            && *want != snap.info.sha256
        {
            return Err(RunError::refused(
                rid,
                Reason::Request,
                format!(
                    "snapshot {snapshot_id} has digest {}, not the {want} this request names: nothing was restored",
                    snap.info.sha256
                ),
            ));
        }
        Engine::files_unchanged(&snap.parent, &snap.dir, &req.request_id)?;
        let policy = self.config.sessions;
        self.sessions.reserve(caller, 1, &policy, rid)?;
        let made = self.restore_copy(caller, &snap, SessionStart::Restored, &req.request_id);
        self.sessions.opened(caller, 1, made.as_ref().ok());
        let s = made?;
        self.sessions.start_reaper();
        tracing::info!(session_id = %s.id, snapshot_id, request_id = %req.request_id, caller, "session restored from a snapshot");
        let st = lock(&s);
        Ok(s.info(&st, rid))
    }

    /// `caller`'s snapshots, oldest first.
    pub fn list_snapshots(&self, caller: &str) -> SnapshotList {
        let now = Instant::now();
        let mut mine: Vec<SnapshotInfo> = self
            .sessions
            .snapshots()
            .values()
            .filter(|s| s.caller == caller && s.expires > now)
            .map(|s| s.info.clone())
            .collect();
        mine.sort_by(|a, b| {
            (a.created_unix_ms, &a.snapshot_id).cmp(&(b.created_unix_ms, &b.snapshot_id))
        });
        SnapshotList {
            protocol: PROTOCOL,
            snapshots: mine,
        }
    }

    /// Deletes `caller`'s snapshot `id` (its files removed) and says what it was.
    pub fn delete_snapshot(
        &self,
        caller: &str,
        id: &str,
        request_id: Option<&str>,
    ) -> Result<SnapshotInfo, RunError> {
        let snap = self.sessions.find_snapshot(caller, id, request_id)?;
        self.sessions.snapshots().remove(id);
        snap.remove();
        tracing::info!(snapshot_id = id, caller, "snapshot deleted");
        Ok(SnapshotInfo {
            request_id: request_id.map(str::to_owned),
            ..snap.info.clone()
        })
    }

    /// A new session restored from `snap` for `caller` (counted by the caller of this),
    /// its randomness renewed before it is served.
    fn restore_copy(
        &self,
        caller: &str,
        snap: &Snapshot,
        start: SessionStart,
        request_id: &str,
    ) -> Result<Arc<Session>, RunError> {
        let lifetime = Duration::from_millis(snap.parent.lifetime_ms);
        let (mut sandbox, permit, state, environment) =
            self.restore_sandbox(caller, &snap.parent, &snap.dir, lifetime, request_id)?;
        if let Err(e) = reseed(sandbox.as_mut(), snap.parent.language) {
            let message = e.message();
            if let Err(e) = sandbox.close() {
                tracing::error!(error = %plimsoll_sandbox::error_chain(&e), "a restored copy's sandbox was not fully removed");
            }
            // Refused, not served: a copy that would repeat its parent's randomness.
            return Err(RunError::refused(
                Some(request_id),
                Reason::Environment,
                format!(
                    "the restored copy's randomness could not be renewed, so it is not served: {message}"
                ),
            ));
        }
        let session_id = format!(
            "ses_{}_{}",
            self.sessions.instance,
            hex::encode(rand::random::<[u8; 16]>())
        );
        let parent = &snap.parent;
        Ok(parent.session(
            session_id,
            parent.origin(start),
            (Instant::now(), unix_ms_now()),
            lifetime,
            (sandbox, permit, state, environment),
        ))
    }

    /// Refused (not dispatched, `environment`) unless the snapshot in `dir` (its files under
    /// `image/`) of `parent` still hashes to its digest: checked once before a session is
    /// restored from files that may have lain on disk (a fork restores from the snapshot it
    /// has just taken and digested).
    pub(super) fn files_unchanged(
        parent: &Parent,
        dir: &Path,
        request_id: &str,
    ) -> Result<(), RunError> {
        let refuse =
            |message: String| RunError::refused(Some(request_id), Reason::Environment, message);
        let (sha256, _) = files_digest(&dir.join("image")).map_err(|e| {
            refuse(format!(
                "cannot read the snapshot of session {}: {e}",
                parent.session_id
            ))
        })?;
        if sha256 != parent.sha256 {
            tracing::error!(dir = %dir.display(), taken = %parent.sha256, now = %sha256, "a snapshot's files changed on disk; refusing to restore it");
            return Err(refuse(format!(
                "the snapshot's files changed on disk since it was taken (digest {} then, {sha256} now): it is not restored",
                parent.sha256
            )));
        }
        Ok(())
    }

    /// A sandbox restored from the snapshot in `dir` (its files under `image/`) of `parent`
    /// for `caller` (its files checked first by [`Engine::files_unchanged`] where they may
    /// have changed): the provider decided again as an open is, the sandbox restored with the
    /// snapshot's uid, bounded by `lifetime`.
    pub(super) fn restore_sandbox(
        &self,
        caller: &str,
        parent: &Parent,
        dir: &Path,
        lifetime: Duration,
        request_id: &str,
    ) -> Result<Restored, RunError> {
        let rid = Some(request_id);
        let refuse = |reason, message: String| RunError::refused(rid, reason, message);
        let as_run = RunRequest {
            image: parent.image.as_ref().map(|i| i.identity.clone()),
            protocol: PROTOCOL,
            request_id: request_id.to_owned(),
            minimum_isolation: Some(parent.floor),
            provider: Some(parent.provider.clone()),
            limits: None,
            run: RunSpec::Snippet(Snippet {
                language: parent.language,
                code: "session".into(),
            }),
            grant: None,
        };
        let (decided, state, index) = self.decide(caller, &as_run, true)?;
        let permit = self
            .admission
            .try_admit(caller)
            .map_err(|m| refuse(Reason::Capacity, m))?
            .answered();
        let run_id = new_run_id();
        let mut plan = decided.launch(&as_run, &self.config, permit.slot(), &run_id, None);
        // The processes restored run as the snapshot's uid: at runsc, gVisor's own, which no
        // host process has.
        plan.uid = parent.uid;
        plan.gid = parent.gid;
        plan.limits = parent.limits.into();
        let sandbox = self.slots[index]
            .provider
            .restore_session(&plan, lifetime, &dir.join("image"))
            .map_err(|e| {
                let message = e.message();
                match e.not_dispatched() {
                    Some(reason) => refuse(reason, message),
                    None => RunError::Failed {
                        request_id: request_id.to_owned(),
                        provider: parent.provider.clone(),
                        message,
                    },
                }
            })?;
        let environment =
            crate::engine::environment_of(decided.image.as_ref(), &state.probed.evidence);
        Ok((sandbox, permit, state, environment))
    }
}

/// A restored sandbox, its uid slot, the provider's state it was restored under, and the
/// environment it runs on.
pub(super) type Restored = (
    Box<dyn plimsoll_sandbox::SessionSandbox>,
    crate::admission::Permit,
    Arc<crate::engine::ProbedState>,
    String,
);

impl Parent {
    /// The session `id` made of a sandbox restored from this parent's snapshot, opened at
    /// `opened` (with `opened_unix_ms`: now, or when the saved session first opened) for
    /// `lifetime` in all.
    pub(super) fn session(
        &self,
        id: String,
        origin: SessionOrigin,
        (opened, opened_unix_ms): (Instant, u64),
        lifetime: Duration,
        (sandbox, permit, state, environment): Restored,
    ) -> Arc<Session> {
        Arc::new(Session {
            id,
            caller: self.caller.clone(),
            language: self.language,
            provider: self.provider.clone(),
            tier: state.probed.tier,
            floor: self.floor,
            evidence_sha256: state.evidence_sha256.clone(),
            environment,
            image: self.image.clone(),
            limits: self.limits.into(),
            opened_unix_ms,
            opened,
            lifetime,
            idle_timeout: Duration::from_millis(self.idle_timeout_ms),
            wall: sandbox.wall_at_open().clone(),
            broker: None,
            uid: self.uid,
            gid: self.gid,
            origin: Some(origin),
            state: Mutex::new(State {
                sandbox: Some(sandbox),
                permit: Some(permit),
                calls: self.calls,
                last_record: self.last_record_sha256.clone(),
                last_call: Instant::now(),
                interpreter_alive: true,
                ended: None,
            }),
        })
    }
}

/// Renews a restored interpreter's randomness before anything else runs in it: Python's
/// `random` seeded from 32 bytes the host drew for this copy alone. (`os.urandom`, `secrets`
/// and `uuid4` draw from the sandbox's kernel: at runsc, gVisor's getrandom reads the host's
/// on every call, so each copy's already differ.)
fn reseed(
    sandbox: &mut dyn plimsoll_sandbox::SessionSandbox,
    language: Language,
) -> Result<(), LaunchError> {
    let seed = hex::encode(rand::random::<[u8; 32]>());
    let code = match language {
        Language::Python => format!("__import__('random').seed(int('{seed}', 16))"),
        Language::Javascript => {
            return Err(LaunchError::not_started(
                Reason::Unsupported,
                JAVASCRIPT_NOT_RESEEDED,
            ));
        }
    };
    let call = plimsoll_wire::SessionCall::Cell(plimsoll_wire::SessionCell {
        code,
        restart: false,
        deadline_ms: millis(RESEED_WITHIN),
        output_bytes: 4096,
        stream: false,
    });
    let answer = sandbox.call(&call, RESEED_WITHIN + CALL_GRACE, &mut |_| {})?;
    match (answer.result, answer.error) {
        (Some(r), None) if r.exit_code == Some(0) && r.interpreter_end.is_none() => Ok(()),
        (Some(r), _) => Err(LaunchError::may_have_run(format!(
            "the interpreter did not take its new seed (exit code {:?}, stderr {:?})",
            r.exit_code,
            String::from_utf8_lossy(r.stderr.as_slice())
        ))),
        (None, error) => Err(LaunchError::may_have_run(format!(
            "the agent did not run the new seed: {}",
            error.unwrap_or_else(|| "it answered no result".into())
        ))),
    }
}

/// `dir` and its parents, `dir` itself readable by root alone.
pub(super) fn make_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}
