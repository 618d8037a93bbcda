//! Snapshots and forks of sessions (docs/sessions.md, "Snapshots and forks") over real HTTP,
//! at runsc (the one provider here whose sessions can be saved): a session holding `x = 41`
//! snapshotted and going on, a new session opened from the snapshot, a fork into 4 copies
//! that each print 42 and a random number of their own, every record's digest recomputed
//! and the calls checked as a tree by plimsoll-attest (a branch hung from another session
//! refused); then the refusals: a snapshot changed on disk, another caller's snapshot and
//! session, providers and languages that cannot be snapshotted, the quotas, expiry.

use std::collections::BTreeSet;
use std::time::Duration;

use plimsoll_test_daemon::TestDaemon;
use plimsoll_testing::workspace_root;
use plimsoll_wire::digest::record_sha256;
use plimsoll_wire::{
    ErrorResponse, ForkAnswer, Reason, RunRecord, RunResponse, SessionInfo, SessionStart,
    SnapshotInfo, SnapshotList,
};

struct Answer {
    status: u16,
    body: String,
}

impl Answer {
    fn ok<T: serde::de::DeserializeOwned>(&self) -> T {
        assert_eq!(self.status, 200, "{}", self.body);
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
    fn refused(&self, status: u16) -> ErrorResponse {
        assert_eq!(self.status, status, "{}", self.body);
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

fn call(d: &TestDaemon, token: &str, method: &str, path: &str, body: Option<String>) -> Answer {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(180)))
        .build()
        .into();
    let url = format!("{}{path}", d.url);
    let auth = format!("Bearer {token}");
    let sent = match (method, body) {
        ("GET", _) => agent.get(&url).header("Authorization", &auth).call(),
        ("DELETE", _) => agent
            .delete(&url)
            .header("Authorization", &auth)
            .header("plimsoll-request-id", "del-1")
            .call(),
        (_, Some(b)) => agent
            .post(&url)
            .header("Authorization", &auth)
            .header("Content-Type", "application/json")
            .send(b.as_bytes()),
        other => panic!("untested {other:?}"),
    };
    let mut resp = sent.expect("an HTTP answer");
    Answer {
        status: resp.status().as_u16(),
        body: resp.body_mut().read_to_string().expect("a body"),
    }
}

fn daemon(extra: &str) -> TestDaemon {
    daemon_of(&["runsc", "runc"], extra)
}

fn daemon_of(providers: &[&str], extra: &str) -> TestDaemon {
    let image = workspace_root().join("build/images/sandbox");
    TestDaemon::start(&format!(
        "default_floor = \"container\"\nproviders = {providers:?}\n[pools]\n[oci]\nimage = \"{}\"\n[sessions]\nmax_total = 8\nmax_per_caller = 8\n{extra}",
        image.display()
    ))
}

/// Whether runsc and runc are available; else SKIP, or a failure under CI=true.
fn available(test: &str, d: &TestDaemon) -> bool {
    available_of(test, d, &["runsc", "runc"])
}

fn available_of(test: &str, d: &TestDaemon, names: &[&str]) -> bool {
    let p: plimsoll_wire::ProvidersResponse = call(d, &d.token, "GET", "/v1/providers", None).ok();
    for &name in names {
        let info = p.providers.iter().find(|p| p.name == name);
        if !info.is_some_and(|i| i.available) {
            let why = info
                .and_then(|i| i.unavailable_reason.clone())
                .unwrap_or_default();
            if plimsoll_env::strict() {
                panic!("{test}: {name} is unavailable under CI=true: {why}");
            }
            eprintln!("SKIP {test}: {name} is unavailable: {why}");
            return false;
        }
    }
    true
}

fn open(d: &TestDaemon, token: &str, language: &str, provider: &str) -> SessionInfo {
    let body = serde_json::json!({"protocol": 1, "request_id": "open", "language": language, "provider": provider});
    call(d, token, "POST", "/v1/sessions", Some(body.to_string())).ok()
}

fn small(id: &str) -> String {
    serde_json::json!({"protocol": 1, "request_id": id}).to_string()
}

/// A cell, its digests checked as a client checks them.
fn cell(d: &TestDaemon, session: &str, id: &str, code: &str) -> RunResponse {
    let body = serde_json::json!({"protocol": 1, "request_id": id, "run": {"kind": "snippet", "language": "python", "code": code}});
    let r: RunResponse = call(
        d,
        &d.token,
        "POST",
        &format!("/v1/sessions/{session}/cells"),
        Some(body.to_string()),
    )
    .ok();
    assert_eq!(r.result.exit_code, Some(0), "{:?}", r.result);
    assert_eq!(r.record.record_sha256, record_sha256(&r.record));
    r
}

fn stdout(r: &RunResponse) -> String {
    String::from_utf8_lossy(r.result.stdout.as_slice())
        .trim()
        .to_owned()
}

#[test]
fn a_runsc_session_is_snapshotted_restored_and_forked_with_fresh_randomness() {
    let test = "a_runsc_session_is_snapshotted_restored_and_forked_with_fresh_randomness";
    let d = daemon("");
    if !available(test, &d) {
        return;
    }
    let parent = open(&d, &d.token, "python", "runsc");
    assert_eq!(parent.origin, None);
    let p = &parent.session_id;
    let r1 = cell(&d, p, "c1", "import os, random\nx = 41\nprint(x)");

    // A snapshot: the session goes on from it.
    let snap: SnapshotInfo = call(
        &d,
        &d.token,
        "POST",
        &format!("/v1/sessions/{p}/snapshot"),
        Some(small("snap-1")),
    )
    .ok();
    assert_eq!(snap.request_id.as_deref(), Some("snap-1"));
    assert_eq!((snap.session_id.as_str(), snap.calls), (p.as_str(), 1));
    assert_eq!(
        snap.last_record_sha256.as_ref(),
        Some(&r1.record.record_sha256)
    );
    assert!(snap.bytes > 0 && snap.sha256.len() == 64, "{snap:?}");
    let r2 = cell(&d, p, "c2", "print(x + 1)");
    assert_eq!(stdout(&r2), "42");
    let link = r2.record.session.as_ref().unwrap();
    assert_eq!((link.sequence, link.origin.as_ref()), (2, None));
    assert_eq!(r2.result.wall.as_ref(), Some(&parent.wall), "the wall kept");

    // A session opened from the snapshot: x there, its chain going on from call 1.
    let restored: SessionInfo = call(
        &d,
        &d.token,
        "POST",
        &format!("/v1/snapshots/{}/sessions", snap.snapshot_id),
        Some(
            serde_json::json!({"protocol": 1, "request_id": "restore-1", "sha256": snap.sha256})
                .to_string(),
        ),
    )
    .ok();
    let origin = restored.origin.clone().expect("a restored session says so");
    assert_eq!(origin.start, SessionStart::Restored);
    assert_eq!(origin.snapshot_sha256, snap.sha256);
    assert_eq!(origin.parent_session_id, *p);
    assert_eq!(restored.calls, 1);
    let rr = cell(&d, &restored.session_id, "r2", "print(x + 1)");
    assert_eq!(stdout(&rr), "42");
    let link = rr.record.session.as_ref().unwrap();
    assert_eq!(link.sequence, 2);
    assert_eq!(
        link.previous_record_sha256.as_ref(),
        Some(&r1.record.record_sha256)
    );
    assert_eq!(
        link.origin.as_ref(),
        Some(&origin),
        "the origin is on every record"
    );

    // A fork into 4 after call 2.
    let fork: ForkAnswer = call(
        &d,
        &d.token,
        "POST",
        &format!("/v1/sessions/{p}/fork"),
        Some(serde_json::json!({"protocol": 1, "request_id": "fork-1", "count": 4}).to_string()),
    )
    .ok();
    assert_eq!(fork.sessions.len(), 4);
    assert_eq!(fork.snapshot.calls, 2);
    let probe = "print(x + 1, random.random(), os.urandom(8).hex())";
    let mut randoms = BTreeSet::new();
    let mut urandoms = BTreeSet::new();
    let mut branches: Vec<RunRecord> = Vec::new();
    for (i, copy) in fork.sessions.iter().enumerate() {
        let o = copy.origin.as_ref().expect("a copy says it was forked");
        assert_eq!(o.start, SessionStart::Forked);
        assert_eq!(o.parent_session_id, *p);
        assert_eq!(
            o.parent_record_sha256.as_ref(),
            Some(&r2.record.record_sha256)
        );
        assert_eq!(o.snapshot_sha256, fork.snapshot.sha256);
        let r = cell(&d, &copy.session_id, &format!("f{i}"), probe);
        let out = stdout(&r);
        let parts: Vec<&str> = out.split(' ').collect();
        assert_eq!(parts[0], "42", "{out}");
        randoms.insert(parts[1].to_owned());
        urandoms.insert(parts[2].to_owned());
        let link = r.record.session.clone().unwrap();
        assert_eq!(link.sequence, 3);
        assert_eq!(
            link.previous_record_sha256.as_ref(),
            Some(&r2.record.record_sha256)
        );
        branches.push(r.record);
    }
    // The parent, unchanged by the fork, draws from its own state.
    let r3 = cell(&d, p, "c3", probe);
    let parent_random = stdout(&r3).split(' ').nth(1).unwrap().to_owned();
    println!("copies' random.random(): {randoms:?}; the parent's: {parent_random}");
    assert_eq!(
        randoms.len(),
        4,
        "every copy's Python random differs: {randoms:?}"
    );
    assert!(
        !randoms.contains(&parent_random),
        "no copy repeats its parent"
    );
    assert_eq!(
        urandoms.len(),
        4,
        "every copy's os.urandom differs: {urandoms:?}"
    );

    // The calls as a tree: the parent's chain, each branch hanging from its call 2.
    let mut tree = vec![r1.record.clone(), r2.record.clone()];
    tree.extend(branches.iter().cloned());
    tree.push(r3.record.clone());
    tree.push(rr.record.clone());
    let refs: Vec<&RunRecord> = tree.iter().collect();
    plimsoll_attest::check_session_chains(&refs).expect("the fork's tree verifies");
    // A branch hung from another session's chain (the restored session's call 2) is refused.
    let swapped = [&r1.record, &rr.record, &branches[0]];
    let (at, e) = plimsoll_attest::check_session_chains(&swapped).unwrap_err();
    assert_eq!(at, 2, "{e}");
    assert!(
        matches!(e, plimsoll_attest::SessionChainError::Detached { .. }),
        "{e}"
    );
    // And one whose parent's record is missing.
    let (_, e) = plimsoll_attest::check_session_chains(&[&r1.record, &branches[1]]).unwrap_err();
    assert!(
        matches!(e, plimsoll_attest::SessionChainError::Detached { .. }),
        "{e}"
    );

    // Listed; and the snapshot of another caller, or its sessions, as an unknown id.
    let list: SnapshotList = call(&d, &d.token, "GET", "/v1/snapshots", None).ok();
    assert_eq!(list.snapshots.len(), 2);
    let other = d.add_caller("other");
    let unknown = format!(
        "snp_{}",
        &snap.snapshot_id[4..].replace(|c: char| c != '_', "0")
    );
    let theirs = call(
        &d,
        &other,
        "POST",
        &format!("/v1/snapshots/{}/sessions", snap.snapshot_id),
        Some(small("o-1")),
    )
    .refused(404);
    let nobody = call(
        &d,
        &other,
        "POST",
        &format!("/v1/snapshots/{unknown}/sessions"),
        Some(small("o-1")),
    )
    .refused(404);
    assert_eq!(theirs.error.message, nobody.error.message);
    assert_eq!(theirs.error.code, "snapshot_not_found");
    assert_eq!(theirs.error.not_dispatched, Some(Reason::Request));
    let theirs = call(
        &d,
        &other,
        "POST",
        &format!("/v1/sessions/{p}/snapshot"),
        Some(small("o-2")),
    )
    .refused(404);
    assert_eq!(theirs.error.code, "session_not_found");
    let theirs = call(
        &d,
        &other,
        "DELETE",
        &format!("/v1/snapshots/{}", snap.snapshot_id),
        None,
    )
    .refused(404);
    assert_eq!(theirs.error.code, "snapshot_not_found");
    let none: SnapshotList = call(&d, &other, "GET", "/v1/snapshots", None).ok();
    assert!(none.snapshots.is_empty());

    // A snapshot changed on disk is refused at restore, and nothing is opened.
    let dir = d
        .engine()
        .config()
        .state_dir
        .join("snapshots")
        .join(&snap.snapshot_id);
    // The snapshot's memory image is root's alone: no sandbox uid reads another's state.
    for d in [dir.parent().unwrap(), &dir, &dir.join("image")] {
        let mode =
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(d).unwrap().permissions());
        assert_eq!(mode & 0o077, 0, "{}: {mode:o}", d.display());
    }
    let file = largest_file(&dir);
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&file, bytes).unwrap();
    let open_before = d.engine().sessions_open();
    refused_post(
        &d,
        &format!("/v1/snapshots/{}/sessions", snap.snapshot_id),
        small("tampered"),
        503,
        Reason::Environment,
        "changed on disk",
    );
    assert_eq!(d.engine().sessions_open(), open_before);

    // Deleted: its files gone, its id unknown.
    let gone: SnapshotInfo = call(
        &d,
        &d.token,
        "DELETE",
        &format!("/v1/snapshots/{}", snap.snapshot_id),
        None,
    )
    .ok();
    assert_eq!(gone.snapshot_id, snap.snapshot_id);
    assert!(!dir.exists());
}

/// POSTs `body` to `path` as the test caller and checks the refusal: `status`, not
/// dispatched for `reason`, its message naming `says`.
fn refused_post(
    d: &TestDaemon,
    path: &str,
    body: String,
    status: u16,
    reason: Reason,
    says: &str,
) -> ErrorResponse {
    let e = call(d, &d.token, "POST", path, Some(body)).refused(status);
    assert_eq!(e.error.not_dispatched, Some(reason), "{path}");
    assert!(
        e.error.message.contains(says),
        "{path}: {}",
        e.error.message
    );
    e
}

fn largest_file(dir: &std::path::Path) -> std::path::PathBuf {
    let mut best = (0, None);
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(d).unwrap() {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() {
                dirs.push(e.path());
            } else if m.len() >= best.0 {
                best = (m.len(), Some(e.path()));
            }
        }
    }
    best.1.expect("a snapshot has files")
}

#[test]
fn snapshots_are_refused_where_they_cannot_be_honest_and_over_their_limits() {
    let test = "snapshots_are_refused_where_they_cannot_be_honest_and_over_their_limits";
    let all = ["runsc", "runc", "crun", "qemu"];
    let d = daemon_of(&all, "snapshot_bytes_per_caller = 1\nmax_fork = 2\n");
    if !available_of(test, &d, &all) {
        return;
    }
    // runc and crun (CRIU), qemu (the guest's randomness): each says why, and the session
    // goes on.
    for (provider, why) in [("runc", "CRIU"), ("crun", "CRIU"), ("qemu", "VMGENID")] {
        let s = open(&d, &d.token, "python", provider);
        let e = call(
            &d,
            &d.token,
            "POST",
            &format!("/v1/sessions/{}/snapshot", s.session_id),
            Some(small("s-no")),
        )
        .refused(422);
        assert_eq!(
            e.error.not_dispatched,
            Some(Reason::Unsupported),
            "{provider}"
        );
        assert!(
            e.error.message.contains(why),
            "{provider}: {}",
            e.error.message
        );
        assert_eq!(stdout(&cell(&d, &s.session_id, "after", "print(7)")), "7");
        let closed = call(
            &d,
            &d.token,
            "DELETE",
            &format!("/v1/sessions/{}", s.session_id),
            None,
        );
        assert_eq!(closed.status, 200, "{}", closed.body);
    }
    // JavaScript: node's OpenSSL generator cannot be re-seeded in place.
    let js = open(&d, &d.token, "javascript", "runsc");
    refused_post(
        &d,
        &format!("/v1/sessions/{}/fork", js.session_id),
        serde_json::json!({"protocol": 1, "request_id": "f-js", "count": 1}).to_string(),
        422,
        Reason::Unsupported,
        "crypto.randomBytes",
    );
    // Over max_fork, and a count of 0: refused before anything is taken.
    let py = open(&d, &d.token, "python", "runsc");
    for count in [0, 3] {
        let e = call(
            &d,
            &d.token,
            "POST",
            &format!("/v1/sessions/{}/fork", py.session_id),
            Some(
                serde_json::json!({"protocol": 1, "request_id": "f-n", "count": count}).to_string(),
            ),
        )
        .refused(400);
        assert_eq!(e.error.not_dispatched, Some(Reason::Request));
    }
    // Over the caller's quota (1 byte): taken, found too big, removed; the session goes on.
    cell(&d, &py.session_id, "x", "x = 41");
    refused_post(
        &d,
        &format!("/v1/sessions/{}/snapshot", py.session_id),
        small("s-big"),
        429,
        Reason::Capacity,
        "over the quota",
    );
    let left = std::fs::read_dir(d.engine().config().state_dir.join("snapshots"))
        .map(|r| r.count())
        .unwrap_or(0);
    assert_eq!(left, 0, "nothing of it is kept");
    assert_eq!(stdout(&cell(&d, &py.session_id, "y", "print(x + 1)")), "42");
}

#[test]
fn a_snapshot_expires() {
    let test = "a_snapshot_expires";
    let d = daemon("snapshot_lifetime_secs = 1\n");
    if !available(test, &d) {
        return;
    }
    let s = open(&d, &d.token, "python", "runsc");
    let snap: SnapshotInfo = call(
        &d,
        &d.token,
        "POST",
        &format!("/v1/sessions/{}/snapshot", s.session_id),
        Some(small("s")),
    )
    .ok();
    let dir = d
        .engine()
        .config()
        .state_dir
        .join("snapshots")
        .join(&snap.snapshot_id);
    assert!(dir.exists());
    std::thread::sleep(Duration::from_millis(1600));
    let e = call(
        &d,
        &d.token,
        "POST",
        &format!("/v1/snapshots/{}/sessions", snap.snapshot_id),
        Some(small("late")),
    )
    .refused(404);
    assert_eq!(e.error.code, "snapshot_not_found");
    assert!(!dir.exists(), "an expired snapshot's files are removed");
}
