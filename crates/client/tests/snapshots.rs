//! Snapshots and forks through the client against a real in-process daemon at runsc (the one
//! provider here whose sessions can be saved): every answer checked where the client holds
//! the session's chain; each copy's chain going on from its parent's; a restored session's
//! records carrying its origin.

use std::collections::BTreeSet;

use plimsoll_client::{Client, ClientError, SessionOptions, Token};
use plimsoll_test_daemon::TestDaemon;
use plimsoll_wire::{Language, Reason, SessionStart};

fn runsc_daemon(test: &str) -> Option<TestDaemon> {
    let image = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../build/images/sandbox");
    let image = std::fs::canonicalize(&image).unwrap_or(image);
    let daemon = TestDaemon::start(&format!(
        "providers = [\"runsc\"]\n[pools]\n[oci]\nimage = \"{}\"\n[sessions]\nmax_total = 8\nmax_per_caller = 8\n",
        image.display()
    ));
    let client = Client::new(&daemon.url, Token::new(daemon.token.clone()));
    let runsc = client
        .providers()
        .unwrap()
        .providers
        .into_iter()
        .find(|p| p.name == "runsc")
        .map(|p| p.unavailable_reason.filter(|_| !p.available));
    if runsc != Some(None) {
        let why = format!("the runsc provider is unavailable: {runsc:?}");
        if plimsoll_env::strict() {
            panic!("{test}: {why}");
        }
        eprintln!("SKIP {test}: {why}");
        return None;
    }
    Some(daemon)
}

fn out(r: &plimsoll_wire::RunResponse) -> String {
    r.result.stdout.to_string_lossy().trim().to_owned()
}

#[test]
fn a_session_is_snapshotted_forked_and_restored_through_the_client() {
    let test = "a_session_is_snapshotted_forked_and_restored_through_the_client";
    let Some(d) = runsc_daemon(test) else {
        return;
    };
    let client = Client::new(&d.url, Token::new(d.token.clone()));
    let mut parent = client
        .open_session(SessionOptions::new(Language::Python).provider("runsc"))
        .unwrap();
    parent.cell("import random\nx = 41").unwrap();
    let snap = parent.snapshot().unwrap();
    assert_eq!((snap.session_id.as_str(), snap.calls), (parent.id(), 1));
    assert_eq!(out(&parent.cell("print(x + 1)").unwrap()), "42");

    let (forked_from, mut copies) = parent.fork(4).unwrap();
    assert_eq!(forked_from.calls, 2);
    let mut randoms = BTreeSet::new();
    for c in &mut copies {
        assert_eq!(
            c.info().origin.as_ref().unwrap().start,
            SessionStart::Forked
        );
        let r = c.cell("print(x + 1, random.random())").unwrap();
        let link = r.record.session.as_ref().unwrap();
        assert_eq!(link.sequence, 3);
        let o = out(&r);
        let (answer, random) = o.split_once(' ').unwrap();
        assert_eq!(answer, "42");
        randoms.insert(random.to_owned());
    }
    assert_eq!(randoms.len(), 4, "{randoms:?}");

    let mut restored = client.open_snapshot(&snap).unwrap();
    assert_eq!(
        restored.info().origin.as_ref().unwrap().start,
        SessionStart::Restored
    );
    let r = restored.cell("print(x + 1)").unwrap();
    assert_eq!(
        (
            out(&r).as_str(),
            r.record.session.as_ref().unwrap().sequence
        ),
        ("42", 2)
    );

    let listed = client.list_snapshots().unwrap();
    assert_eq!(listed.snapshots.len(), 2);
    let gone = client.delete_snapshot(&snap.snapshot_id).unwrap();
    assert_eq!(gone.snapshot_id, snap.snapshot_id);
    match client.open_snapshot(&snap) {
        Err(ClientError::Refused { reason, .. }) => assert_eq!(reason, Reason::Request),
        other => panic!("a deleted snapshot: {other:?}"),
    }
    // A JavaScript session: refused, nothing taken.
    let mut js = client
        .open_session(SessionOptions::new(Language::Javascript).provider("runsc"))
        .unwrap();
    match js.fork(1) {
        Err(ClientError::Refused { reason, .. }) => assert_eq!(reason, Reason::Unsupported),
        other => panic!("a JavaScript fork: {other:?}"),
    }
}
