//! The engine with the real process provider: probing, floors, refusals that ran nothing,
//! admission, and digests a client can recompute. Runs real sandboxes (needs root).

use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use plimsoll_engine::{Engine, Reason, RunError, Settings, not_dispatched_reason};
use plimsoll_testing::{TestDir, is_root, probe_binary, skip_or_fail};
use plimsoll_wire::digest::{evidence_sha256, record_sha256, request_sha256, result_sha256};
use plimsoll_wire::{Language, PROTOCOL, RunRequest, RunSpec, Snippet, Start, Tier};

/// A probed engine offering only the process provider. `uid_base` is the test's own: tests
/// run in parallel, and the end of a run kills every process of its uid.
fn engine(test: &str, uid_base: u32, extra: &str) -> Option<(Engine, TestDir)> {
    if !is_root() {
        skip_or_fail(test, "needs root to run the process provider");
        return None;
    }
    let dir = TestDir::new("engine", test);
    let probe = probe_binary().unwrap_or_else(|e| panic!("{e}"));
    let toml = format!(
        "providers = [\"process\"]\n\
         state_dir = {state:?}\n\
         sandbox_uid_base = {uid_base}\n\
         max_concurrent = 4\n\
         {extra}\n\
         [process]\n\
         probe = {probe:?}\n",
        state = dir.path().join("state").display().to_string(),
        probe = probe.display().to_string(),
    );
    let settings = Settings::parse(&toml).unwrap();
    let engine = settings.build_engine(&[]).unwrap();
    engine.probe_all();
    Some((engine, dir))
}

fn request(id: &str, floor: Option<Tier>, language: Language, code: &str) -> RunRequest {
    RunRequest {
        image: None,
        protocol: PROTOCOL,
        request_id: id.into(),
        minimum_isolation: floor,
        provider: None,
        limits: None,
        run: RunSpec::Snippet(Snippet {
            language,
            code: code.into(),
        }),
        grant: None,
    }
}

#[test]
fn the_process_provider_is_offered_with_its_evidence() {
    let Some((engine, _dir)) = engine("offered", 2_320_000, "") else {
        return;
    };
    let providers = engine.providers();
    assert_eq!(providers.len(), 1);
    let p = &providers[0];
    assert_eq!(p.name, "process");
    assert_eq!(p.isolation, Tier::Process);
    assert!(p.available, "{:?}", p.unavailable_reason);
    let report = p
        .evidence
        .probe
        .as_ref()
        .expect("the evidence holds a probe report");
    assert_eq!(
        report.uid,
        2_320_000 + 4,
        "the probe runs as the uid past the run uids"
    );
    assert_eq!(p.evidence_sha256, evidence_sha256(&p.evidence));
    assert!(engine.ready());
}

#[test]
fn a_run_at_the_process_floor_works_and_its_digests_verify() {
    let Some((engine, _dir)) = engine("digests", 2_320_100, "") else {
        return;
    };
    let req = request(
        "r-digest",
        Some(Tier::Process),
        Language::Javascript,
        "console.log(6 * 7)",
    );
    let resp = engine.run("alice", &req).unwrap();
    assert_eq!(resp.result.stdout.as_slice(), b"42\n");
    assert_eq!(resp.result.exit_code, Some(0));
    assert_eq!(
        (resp.provider.as_str(), resp.isolation),
        ("process", Tier::Process)
    );
    assert_eq!(resp.request_id, "r-digest");
    // What a client recomputes:
    assert_eq!(resp.request_sha256, request_sha256(&req));
    assert_eq!(resp.result_sha256, result_sha256(&resp.result));
    assert_eq!(resp.record.request_sha256, resp.request_sha256);
    assert_eq!(resp.record.result_sha256, resp.result_sha256);
    assert_eq!(resp.record.record_sha256, record_sha256(&resp.record));
    assert_eq!(
        resp.record.evidence_sha256,
        engine.providers()[0].evidence_sha256
    );
    assert!(resp.record.environment.starts_with("plimsoll-engine/"));
    assert!(resp.record.started_unix_ms <= resp.record.ended_unix_ms);
    // The sandbox was started for this request, and the result says so.
    assert_eq!(resp.result.start, Some(Start::Cold));
    assert_eq!(resp.result.member_age_ms, None);
    // And a changed result no longer matches.
    let mut tampered = resp.result.clone();
    tampered.stdout.0.push(b'!');
    assert_ne!(result_sha256(&tampered), resp.result_sha256);
}

#[test]
fn a_refused_run_ran_nothing() {
    let Some((engine, dir)) = engine("refused", 2_320_200, "") else {
        return;
    };
    let drop_box = dir.path().join("drop");
    std::fs::create_dir(&drop_box).unwrap();
    std::fs::set_permissions(&drop_box, std::fs::Permissions::from_mode(0o777)).unwrap();
    let marker = drop_box.join("marker");
    let code = format!("open({:?}, 'w').write('ran')", marker.display().to_string());
    // The marker's directory is open to everyone, but landlock confines a process-tier run
    // to its own work directory, so the marker alone could not catch a run that slipped
    // through. The spawn counter can: a positive control below shows it moves for a real run.
    let spawned_before = plimsoll_sandbox::spawned_total();
    let req = request("r-refused", Some(Tier::Container), Language::Python, &code);
    let err = engine.run("alice", &req).unwrap_err();
    assert_eq!(
        plimsoll_sandbox::spawned_total(),
        spawned_before,
        "a refused run started a process"
    );
    assert_eq!(
        not_dispatched_reason(&err),
        Some(Reason::Isolation),
        "{err}"
    );
    assert_eq!(err.request_id(), Some("r-refused"));
    let wire = err.to_response();
    assert_eq!(wire.error.not_dispatched, Some(Reason::Isolation));
    assert_eq!(wire.request_id.as_deref(), Some("r-refused"));
    assert!(!marker.exists(), "a refused run wrote its marker");
    assert_eq!(engine.in_flight(), 0);

    // Positive control: the same snippet at a floor the process tier meets does start.
    let req = request("r-ran", Some(Tier::Process), Language::Python, &code);
    let ran = engine.run("alice", &req).unwrap();
    assert!(plimsoll_sandbox::spawned_total() > spawned_before);
    assert_eq!(ran.isolation, Tier::Process);
}

#[test]
fn no_floor_means_the_default_floor_container() {
    let Some((engine, _dir)) = engine("default-floor", 2_320_300, "") else {
        return;
    };
    let req = request("r-nofloor", None, Language::Javascript, "console.log(1)");
    let err = engine.run("alice", &req).unwrap_err();
    assert_eq!(
        not_dispatched_reason(&err),
        Some(Reason::Isolation),
        "{err}"
    );
    let message = err.to_string();
    assert!(message.contains("container"), "{message}");
    assert!(message.contains("--min-isolation process"), "{message}");
}

#[test]
fn a_second_run_of_the_same_caller_is_refused_for_capacity() {
    let Some((engine, _dir)) = engine("capacity", 2_320_400, "max_per_caller = 1") else {
        return;
    };
    let slow = request(
        "r-slow",
        Some(Tier::Process),
        Language::Python,
        "import time\ntime.sleep(3)\nprint('slept')",
    );
    std::thread::scope(|s| {
        let first = s.spawn(|| engine.run("alice", &slow));
        let mut waited = 0;
        while engine.in_flight() == 0 {
            std::thread::sleep(Duration::from_millis(5));
            waited += 1;
            assert!(waited < 2000, "the first run never started");
        }
        let second = request(
            "r-second",
            Some(Tier::Process),
            Language::Python,
            "print(2)",
        );
        let err = engine.run("alice", &second).unwrap_err();
        assert_eq!(not_dispatched_reason(&err), Some(Reason::Capacity), "{err}");
        // Another caller still gets in: the limit is per caller.
        let other = engine.run("bob", &second).unwrap();
        assert_eq!(other.result.stdout.as_slice(), b"2\n");
        let first = first.join().unwrap().unwrap();
        assert_eq!(first.result.stdout.as_slice(), b"slept\n");
    });
    assert_eq!(engine.in_flight(), 0);
}

#[test]
fn errors_after_the_start_carry_no_refusal_mark() {
    let failed = RunError::Failed {
        request_id: "r".into(),
        provider: "process".into(),
        message: "lost".into(),
    };
    assert_eq!(not_dispatched_reason(&failed), None);
    assert_eq!(failed.to_response().error.not_dispatched, None);
    let refused = RunError::refused(Some("r"), Reason::Capacity, "full");
    assert_eq!(not_dispatched_reason(&refused), Some(Reason::Capacity));
}

/// A run that fails before it starts is answered at once: the provider's re-check runs in the
/// background, and the provider keeps serving on its last good evidence meanwhile (#28, 13:
/// it no longer refuses everyone until the check ends). The test holds the probe uid's
/// host-wide lease, so the re-check is provably still running (waiting for the lease) when
/// the answer arrives and while the next run is served.
#[test]
fn a_failed_run_is_answered_before_its_provider_is_checked_again() {
    let uid_base = 2_320_700;
    let Some((engine, dir)) = engine("recheck", uid_base, "") else {
        return;
    };
    let state = dir.path().join("state");
    let probe_uid = uid_base + 4;
    let lease = plimsoll_sandbox::try_lease(&plimsoll_sandbox::lease_dir(&state), probe_uid)
        .unwrap()
        .expect("nothing else holds this test's probe uid");
    // A run directory that cannot be made: the launch fails before any code starts.
    let runs = state.join("runs");
    std::fs::remove_dir_all(&runs).unwrap();
    std::fs::write(&runs, b"not a directory").unwrap();

    let req = request(
        "recheck-1",
        Some(Tier::Process),
        Language::Python,
        "print(1)",
    );
    match engine.run("alice", &req) {
        Err(RunError::Refused { reason, .. }) => assert_eq!(reason, Reason::Environment),
        other => panic!("a run without its directory was not refused: {other:?}"),
    }
    assert!(
        engine.rechecking("process"),
        "answered while the re-check waits for the probe uid"
    );
    // It is still offered on its last good evidence, and serves: the host is mended, and a
    // run named to it runs while its re-check still waits.
    let p = &engine.providers()[0];
    assert!(p.available, "{p:?}");
    std::fs::remove_file(&runs).unwrap();
    let named = RunRequest {
        provider: Some("process".into()),
        ..request(
            "recheck-2",
            Some(Tier::Process),
            Language::Python,
            "print(2)",
        )
    };
    let served = engine
        .run("alice", &named)
        .expect("a provider being re-checked serves on its last good evidence");
    assert_eq!(served.result.stdout.as_slice(), b"2\n");
    assert!(
        engine.rechecking("process"),
        "served while the re-check still waits"
    );
    assert_eq!(engine.in_flight(), 0);

    // The lease let go: the re-check runs, passes, and the provider serves on.
    drop(lease);
    let start = std::time::Instant::now();
    while engine.rechecking("process") {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "the re-check never ended"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(engine.providers()[0].available, "{:?}", engine.providers());
    let ok = engine
        .run(
            "alice",
            &request(
                "recheck-3",
                Some(Tier::Process),
                Language::Python,
                "print(3)",
            ),
        )
        .unwrap();
    assert_eq!(ok.result.exit_code, Some(0));
}

/// #28 (13): one caller's run that cannot run (limits below what an interpreter needs) is
/// refused before it is dispatched, `request` naming the minimum, and takes the provider
/// from no one: it is not checked again, and another caller's run right after is served.
/// The probe uid's lease is held, so a re-check, had one started, would still be running.
#[test]
fn one_caller_s_limits_below_the_minimum_take_the_provider_from_no_one() {
    let uid_base = 2_320_800;
    let Some((engine, dir)) = engine("minimums", uid_base, "") else {
        return;
    };
    let state = dir.path().join("state");
    let _lease = plimsoll_sandbox::try_lease(&plimsoll_sandbox::lease_dir(&state), uid_base + 4)
        .unwrap()
        .expect("nothing else holds this test's probe uid");
    for (i, limits) in [
        plimsoll_wire::Limits {
            memory_bytes: Some(1),
            ..Default::default()
        },
        plimsoll_wire::Limits {
            pids: Some(1),
            ..Default::default()
        },
    ]
    .into_iter()
    .enumerate()
    {
        let bad = RunRequest {
            limits: Some(limits.clone()),
            ..request(
                &format!("bad-{i}"),
                Some(Tier::Process),
                Language::Python,
                "print(1)",
            )
        };
        match engine.run("mallory", &bad) {
            Err(RunError::Refused {
                reason, message, ..
            }) => {
                assert_eq!(reason, Reason::Request, "{limits:?}: {message}");
                assert!(message.contains("below the minimum"), "{message}");
            }
            other => panic!("{limits:?} was not refused as the request's: {other:?}"),
        }
        assert!(!engine.rechecking("process"), "{limits:?}");
        let good = engine
            .run(
                "alice",
                &request(
                    &format!("good-{i}"),
                    Some(Tier::Process),
                    Language::Python,
                    "print(6 * 7)",
                ),
            )
            .expect("another caller's run is served");
        assert_eq!(good.result.stdout.as_slice(), b"42\n");
    }
}
