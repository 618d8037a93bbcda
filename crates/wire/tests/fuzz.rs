//! Property-based fuzzing of the wire contract: `parse_request` on arbitrary and mutated
//! bodies, request round trips, trial-step parsing, and the digest encoder checked against
//! the independent Python implementation (`tests/independent/digests.py`) on generated
//! requests, results, records and evidence.
//!
//! Each property runs a bounded number of cases (`PROPTEST_CASES` raises it; DEVELOPERS.md).
//! A failing case proptest finds is written to `tests/fuzz.proptest-regressions` (beside this
//! file) and replayed first on every later run: commit that file.

use std::collections::BTreeMap;
use std::path::Path;

use plimsoll_wire::digest::{
    canonical_evidence_json, encode_record, encode_request, encode_result, record_sha256,
    sha256_hex,
};
use plimsoll_wire::trial_step::{TRIAL_RUNNER, scenario_paths, trial_step};
use plimsoll_wire::{
    Artifact, BinaryIdentity, Bytes, CredentialKind, EgressReceipt, Evidence, GrantCall, Language,
    Limits, NamespaceSeen, ProbeReport, Project, ProjectFile, Reason, RunRecord, RunRequest,
    RunResult, RunSpec, Score, SimulatorRef, Snippet, Start, Step, StepResult, TrialEnd,
    TrialOutcome, TrialStepRecord, Wall, WallNamespace, parse_request,
};
use proptest::prelude::*;

#[path = "../../../tests/fuzz/common.rs"]
mod common;
use common::{cases, config, mutated, tier};
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};

fn strict() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

// --- Strategies ---------------------------------------------------------------------------

/// Text with the characters that tend to break encoders: controls, quotes, backslashes,
/// non-ASCII of every UTF-8 length, U+2028, DEL, NUL.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[ -~]{0,12}",
        2 => any::<String>(),
        1 => proptest::collection::vec(
            prop_oneof![
                Just('\0'), Just('\u{7f}'), Just('"'), Just('\\'), Just('\n'), Just('\u{1f}'),
                Just('é'), Just('\u{2028}'), Just('\u{fffd}'), Just('\u{10ffff}'), Just('/'),
            ],
            0..6
        )
        .prop_map(|cs| cs.into_iter().collect()),
    ]
}

fn bytes() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        text().prop_map(|s| Bytes(s.into_bytes())),
        proptest::collection::vec(any::<u8>(), 0..24).prop_map(Bytes),
    ]
}

fn opt_limit() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![
        3 => Just(None),
        2 => (1u64..=u64::MAX).prop_map(Some),
        1 => prop_oneof![Just(0u64), Just(1), Just(u64::MAX)].prop_map(Some),
    ]
}

fn limits() -> impl Strategy<Value = Limits> {
    (
        opt_limit(),
        opt_limit(),
        opt_limit(),
        opt_limit(),
        opt_limit(),
        opt_limit(),
    )
        .prop_map(
            |(timeout_ms, memory_bytes, output_bytes, pids, disk_bytes, artifact_bytes)| Limits {
                timeout_ms,
                memory_bytes,
                output_bytes,
                pids,
                disk_bytes,
                artifact_bytes,
            },
        )
}

fn path() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z0-9_]{1,6}(/[a-z0-9_.-]{1,6}){0,2}",
        1 => prop_oneof![
            Just(String::new()), Just("..".into()), Just("a/../b".into()), Just("/etc/passwd".into()),
            Just("a//b".into()), Just("./a".into()), Just("a\\b".into()), Just("a\0b".into()),
        ],
    ]
}

fn step() -> impl Strategy<Value = Step> {
    let run = prop_oneof![
        4 => "[ -~]{1,24}",
        1 => Just("   ".to_owned()),
        2 => trial_words().prop_map(|w| w.join(" ")),
    ];
    (proptest::option::of(text()), run).prop_map(|(name, run)| Step { name, run })
}

fn spec() -> impl Strategy<Value = RunSpec> {
    let language = prop_oneof![Just(Language::Javascript), Just(Language::Python)];
    let snippet = (language, text())
        .prop_map(|(language, code)| RunSpec::Snippet(Snippet { language, code }));
    let file =
        (path(), bytes(), any::<bool>()).prop_map(|(path, content, executable)| ProjectFile {
            path,
            content,
            executable,
        });
    let project = (
        proptest::collection::vec(file, 0..4),
        proptest::collection::vec(step(), 0..4),
        proptest::collection::vec(path(), 0..3),
    )
        .prop_map(|(files, steps, artifacts)| {
            RunSpec::Project(Project {
                files,
                steps,
                artifacts,
            })
        });
    prop_oneof![snippet, project]
}

fn request() -> impl Strategy<Value = RunRequest> {
    (
        prop_oneof![9 => Just(1u32), 1 => any::<u32>()],
        prop_oneof![9 => "[A-Za-z0-9._:-]{1,16}", 1 => text()],
        proptest::option::of(tier()),
        proptest::option::of(text()),
        proptest::option::of(limits()),
        spec(),
        proptest::option::of(text()),
    )
        .prop_map(
            |(protocol, request_id, minimum_isolation, provider, limits, run, grant)| RunRequest {
                image: None,
                protocol,
                request_id,
                minimum_isolation,
                provider,
                limits,
                run,
                grant,
            },
        )
}

fn outcome() -> impl Strategy<Value = (Option<i32>, Option<i32>, [bool; 4], Bytes, Bytes)> {
    (
        proptest::option::of(any::<i32>()),
        proptest::option::of(any::<i32>()),
        any::<[bool; 4]>(),
        bytes(),
        bytes(),
    )
}

fn result() -> impl Strategy<Value = RunResult> {
    let step = (outcome(), proptest::option::of(text()), any::<u64>()).prop_map(
        |((exit_code, signal, f, stdout, stderr), name, duration_ms)| StepResult {
            name,
            exit_code,
            signal,
            timed_out: f[0],
            oom_killed: f[1],
            stdout,
            stdout_truncated: f[2],
            stderr,
            stderr_truncated: f[3],
            duration_ms,
        },
    );
    let artifact = (text(), any::<bool>(), any::<u64>(), bytes(), any::<bool>()).prop_map(
        |(path, found, size, content, truncated)| Artifact {
            path,
            found,
            size,
            content,
            truncated,
        },
    );
    let call = (
        text(),
        proptest::option::of(text()),
        proptest::option::of(any::<u16>()),
        proptest::option::of(text()),
        any::<[u64; 3]>(),
        proptest::option::of(prop_oneof![
            Just(CredentialKind::Static),
            Just(CredentialKind::Minted)
        ]),
    )
        .prop_map(|(method, route, status, error, n, credential)| GrantCall {
            method,
            route,
            status,
            error,
            request_bytes: n[0],
            response_bytes: n[1],
            latency_ms: n[2],
            credential,
        });
    // Receipts as the broker writes them, and any other strings: the encoding is defined for
    // every value of every member.
    let word = |known: &'static [&'static str]| {
        prop_oneof![
            3 => proptest::sample::select(known).prop_map(str::to_owned),
            1 => text(),
        ]
    };
    let receipt = (
        (text(), any::<u16>(), word(&["connect", "http"])),
        (proptest::option::of(text()), proptest::option::of(text())),
        any::<[u64; 4]>(),
        word(&["allowed", "refused"]),
        word(&[
            "host *.example.com port 443",
            "host db.internal port 5432 via 10.0.0.0/8",
            "host_not_allowed",
            "ip_literal",
            "sni_mismatch",
        ]),
        proptest::option::of(word(&[
            "closed",
            "deadline",
            "budget_bytes",
            "connect_failed",
        ])),
    )
        .prop_map(
            |((host, port, kind), (address, sni), n, verdict, rule, ended)| EgressReceipt {
                host,
                port,
                kind,
                address,
                sni,
                bytes_up: n[0],
                bytes_down: n[1],
                start_ms: n[2],
                end_ms: n[3],
                verdict,
                rule,
                ended,
            },
        );
    let namespace = (text(), text(), proptest::option::of(any::<bool>())).prop_map(
        |(name, id, same_as_host)| WallNamespace {
            name,
            id,
            same_as_host,
        },
    );
    let cap = || proptest::option::of(text());
    let wall = (
        any::<[u32; 3]>(),
        proptest::collection::vec(any::<u32>(), 0..3),
        (cap(), cap(), cap(), cap(), cap()),
        (
            proptest::option::of(any::<bool>()),
            proptest::option::of(any::<u32>()),
        ),
        proptest::collection::vec(namespace, 0..3),
        any::<bool>(),
        proptest::collection::vec(text(), 0..3),
        (
            proptest::option::of(any::<u64>()),
            proptest::option::of(any::<u64>()),
        ),
    )
        .prop_map(
            |(ids, groups, caps, (no_new_privs, seccomp), namespaces, ro, net, (mem, pids))| Wall {
                uid: ids[0],
                euid: ids[1],
                gid: ids[2],
                groups,
                cap_inh: caps.0,
                cap_prm: caps.1,
                cap_eff: caps.2,
                cap_bnd: caps.3,
                cap_amb: caps.4,
                no_new_privs,
                seccomp,
                namespaces,
                root_read_only: ro,
                network_interfaces: net,
                memory_limit_bytes: mem,
                pids_limit: pids,
            },
        );
    (
        outcome(),
        proptest::collection::vec(step, 0..3),
        proptest::collection::vec(artifact, 0..3),
        proptest::collection::vec(call, 0..3),
        // Every combination, the malformed ones too: the encoding is defined for all of them.
        proptest::option::of(prop_oneof![Just(Start::Warm), Just(Start::Cold)]),
        proptest::option::of(any::<u64>()),
        proptest::option::of(wall),
        proptest::collection::vec(receipt, 0..4),
    )
        .prop_map(
            |(
                (exit_code, signal, f, stdout, stderr),
                steps,
                artifacts,
                calls,
                start,
                member_age_ms,
                wall,
                egress,
            )| RunResult {
                exit_code,
                signal,
                timed_out: f[0],
                oom_killed: f[1],
                stdout,
                stdout_truncated: f[2],
                stderr,
                stderr_truncated: f[3],
                steps,
                artifacts,
                calls,
                start,
                member_age_ms,
                wall,
                state_kept: None,
                interpreter_end: None,
                egress,
            },
        )
}

/// Any finite score, the awkward ones often: signed zeros, subnormals, the extremes,
/// integers (which JSON may write without a fraction).
fn score() -> impl Strategy<Value = Score> {
    prop_oneof![
        3 => any::<f64>().prop_filter_map("finite", Score::new),
        1 => prop_oneof![
            Just(0.0), Just(-0.0), Just(f64::MIN_POSITIVE / 2.0), Just(f64::MAX), Just(f64::MIN),
            Just(1.0), Just(-3.0), Just(0.1), Just(1e21), Just(2f64.powi(53) + 2.0),
        ]
        .prop_map(|n| Score::new(n).unwrap()),
    ]
}

fn trial_step_record() -> impl Strategy<Value = TrialStepRecord> {
    let end = proptest::sample::select(vec![
        TrialEnd::Completed,
        TrialEnd::Failed,
        TrialEnd::ControllerTimeout,
        TrialEnd::ControllerGarbage,
        TrialEnd::ControllerExited,
        TrialEnd::ControllerFlood,
    ]);
    let outcome = (
        proptest::option::of(text()),
        end,
        proptest::option::of(text()),
        any::<u64>(),
        proptest::option::of(score()),
        any::<bool>(),
        text(),
    )
        .prop_map(
            |(scenario, end, reason, ticks, score, pass, fingerprint)| TrialOutcome {
                scenario,
                end,
                reason,
                ticks,
                score,
                pass,
                fingerprint,
            },
        );
    (
        any::<u32>(),
        proptest::collection::vec(text(), 3),
        any::<bool>(),
        proptest::collection::vec(outcome, 0..3),
    )
        .prop_map(|(step, sim, pass, trials)| TrialStepRecord {
            step,
            simulator: SimulatorRef {
                name: sim[0].clone(),
                version: sim[1].clone(),
                sha256: sim[2].clone(),
            },
            pass,
            trials,
        })
}

fn record() -> impl Strategy<Value = RunRecord> {
    (
        proptest::collection::vec(text(), 5),
        tier(),
        proptest::option::of(tier()),
        any::<u64>(),
        any::<u64>(),
        proptest::collection::vec(trial_step_record(), 0..3),
    )
        .prop_map(
            |(s, isolation, minimum_isolation, started_unix_ms, ended_unix_ms, trials)| {
                let mut r = RunRecord {
                    image: None,
                    trials,
                    request_id: s[0].clone(),
                    request_sha256: s[1].clone(),
                    result_sha256: s[2].clone(),
                    provider: s[3].clone(),
                    isolation,
                    minimum_isolation,
                    evidence_sha256: "0".repeat(64),
                    environment: s[4].clone(),
                    started_unix_ms,
                    ended_unix_ms,
                    record_sha256: String::new(),
                    session: None,
                };
                r.record_sha256 = record_sha256(&r);
                r
            },
        )
}

fn map() -> impl Strategy<Value = BTreeMap<String, String>> {
    proptest::collection::btree_map(text(), text(), 0..4)
}

fn evidence() -> impl Strategy<Value = Evidence> {
    let binary = proptest::collection::vec(text(), 4).prop_map(|s| BinaryIdentity {
        name: s[0].clone(),
        path: s[1].clone(),
        version: s[2].clone(),
        sha256: s[3].clone(),
    });
    let namespaces = proptest::collection::btree_map(
        text(),
        (text(), proptest::option::of(any::<bool>()))
            .prop_map(|(id, same_as_host)| NamespaceSeen { id, same_as_host }),
        0..3,
    );
    let probe = (
        any::<[u32; 4]>(),
        proptest::collection::vec(any::<u32>(), 0..3),
        (map(), map(), map()),
        namespaces,
        proptest::collection::vec(text(), 0..3),
        proptest::collection::vec(text(), 3),
        any::<bool>(),
    )
        .prop_map(
            |(ids, groups, (caps, mounts, limits), namespaces, env, s, nnp)| ProbeReport {
                uid: ids[0],
                euid: ids[1],
                gid: ids[2],
                groups,
                capabilities: caps,
                no_new_privs: nnp,
                seccomp_mode: ids[3],
                environment: env.clone(),
                cwd: s[0].clone(),
                namespaces,
                mounts,
                write_attempts: BTreeMap::new(),
                read_attempts: BTreeMap::new(),
                network_interfaces: env,
                socket_attempts: BTreeMap::new(),
                limits,
                kernel_release: s[1].clone(),
                hostname: s[2].clone(),
            },
        );
    (
        text(),
        tier(),
        map(),
        proptest::collection::vec(binary, 0..3),
        proptest::option::of(probe),
        map(),
        text(),
        any::<u64>(),
    )
        .prop_map(
            |(provider, isolation, config, binaries, probe, checks, environment, checked)| {
                Evidence {
                    provider,
                    isolation,
                    config,
                    binaries,
                    probe,
                    checks,
                    environment,
                    checked_unix_ms: checked,
                }
            },
        )
}

/// Words of a trial step: the runner's name, options (reserved ones among them), `--`, the
/// controller's command, and now and then a character the runner's words may not hold.
fn trial_words() -> impl Strategy<Value = Vec<String>> {
    let word = prop_oneof![
        3 => "[A-Za-z0-9_.,/:=+@%-]{1,10}",
        2 => prop_oneof![
            Just("--scenario".to_owned()), Just("--scenario=./s.json".to_owned()),
            Just("--uid".to_owned()), Just("--uid=0".to_owned()), Just("--gid".to_owned()),
            Just("--controller-uid".to_owned()), Just("--controller-gid=5".to_owned()),
            Just("--args-fd".to_owned()), Just("--sim".to_owned()), Just("--simulators-index=/i".to_owned()),
            Just("--bench-sim".to_owned()), Just("--".to_owned()), Just("/work/./s".to_owned()),
        ],
        1 => "[ -~]{1,4}",
    ];
    (
        prop_oneof![
            Just(TRIAL_RUNNER.to_owned()),
            Just("/opt/plimsoll/bin/plimsoll-trial-runner".to_owned())
        ],
        proptest::collection::vec(word, 0..8),
    )
        .prop_map(|(first, rest)| std::iter::once(first).chain(rest).collect())
}

// --- parse_request ------------------------------------------------------------------------

/// A valid request's body, to mutate.
const VALID: &str = r#"{"protocol":1,"request_id":"r-1","minimum_isolation":"container","limits":{"timeout_ms":1000,"pids":16},"run":{"kind":"project","files":[{"path":"a/b.txt","content":{"base64":"AAE="},"executable":true}],"steps":[{"name":"s","run":"cat a/b.txt"},{"run":"plimsoll-trial-runner --scenario s.json -- node c.js"}],"artifacts":["out"]},"grant":"g"}"#;

/// What every answer of `parse_request` must satisfy, whatever the body.
fn check_parse(body: &[u8]) -> Result<(), TestCaseError> {
    match parse_request(body) {
        Ok(r) => {
            // Accepted: it validates, and serialise → parse gives it back with the same
            // digest (nothing the parser accepted is lost or changed by the round trip).
            prop_assert!(r.validate().is_ok());
            let again = serde_json::to_vec(&r).unwrap();
            let back = parse_request(&again)
                .map_err(|e| TestCaseError::fail(format!("round trip refused: {e:?}")))?;
            prop_assert_eq!(&back, &r);
            prop_assert_eq!(encode_request(&back), encode_request(&r));
        }
        Err(e) => {
            // Refused: only a request or protocol refusal, and an echoed id is a valid one
            // (a client matches it against its own).
            prop_assert!(
                matches!(e.reason, Reason::Request | Reason::Protocol),
                "reason {:?}",
                e.reason
            );
            if let Some(id) = &e.request_id {
                prop_assert!(plimsoll_wire::validate_request_id(id).is_ok());
            }
            prop_assert!(!e.message.is_empty());
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn parse_request_survives_arbitrary_bytes(body in proptest::collection::vec(any::<u8>(), 0..256)) {
        check_parse(&body)?;
    }

    #[test]
    fn parse_request_survives_mutated_requests(body in mutated(VALID)) {
        check_parse(&body)?;
    }

    #[test]
    fn a_generated_request_parses_back_exactly_when_it_validates(r in request()) {
        let body = serde_json::to_vec(&r).unwrap();
        match (r.validate(), parse_request(&body)) {
            (Ok(()), Ok(parsed)) => {
                prop_assert_eq!(&parsed, &r);
                prop_assert_eq!(encode_request(&parsed), encode_request(&r));
            }
            (Err(want), Err(got)) => {
                prop_assert_eq!(want.reason, got.reason);
                prop_assert_eq!(want.request_id, got.request_id);
            }
            (want, got) => {
                return Err(TestCaseError::fail(format!(
                    "validate says {want:?}, parse_request says {got:?}"
                )));
            }
        }
        check_parse(&body)?;
    }

    #[test]
    fn a_record_reads_back_from_its_json_exactly(r in record()) {
        // Through text, as a client reads it: every score is the binary64 that was written.
        let text = serde_json::to_string(&r).unwrap();
        let back: RunRecord = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(&back, &r);
        prop_assert_eq!(record_sha256(&back), record_sha256(&r));
    }

    #[test]
    fn the_request_id_is_outside_the_digest(r in request(), id in "[A-Za-z0-9]{1,8}") {
        let mut other = r.clone();
        other.request_id = id;
        prop_assert_eq!(encode_request(&r), encode_request(&other));
    }
}

// --- Trial steps --------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn a_trial_step_never_passes_shell_syntax_or_reserved_options(
        words in trial_words(),
        sep in prop_oneof![Just(" "), Just("  "), Just("\t"), Just(" \n ")],
        lead in prop_oneof![Just(""), Just(" "), Just("\t")],
    ) {
        let run = format!("{lead}{}", words.join(sep));
        let step = Step { name: None, run: run.clone() };
        match trial_step(&step) {
            None => prop_assert!(false, "a step starting with the runner is a trial step: {run:?}"),
            Some(Err(_)) => {}
            Some(Ok(args)) => {
                let allowed = |c: char| c.is_ascii_alphanumeric() || "-_.,/:=+@%".contains(c);
                for a in &args {
                    prop_assert!(!a.is_empty() && a.chars().all(allowed), "word {a:?} of {run:?}");
                }
                for a in args.iter().take_while(|a| *a != "--") {
                    let name = a.split('=').next().unwrap();
                    prop_assert!(
                        !["--uid", "--gid", "--controller-uid", "--controller-gid", "--args-fd",
                          "--bench-sim", "--sim", "--simulators-index"].contains(&name),
                        "reserved option {a:?} passed in {run:?}"
                    );
                }
                for p in scenario_paths(&args) {
                    prop_assert!(!p.starts_with("./") && !p.starts_with("/work/"), "{p:?}");
                }
            }
        }
    }

    #[test]
    fn any_step_text_is_read_without_panic(run in any::<String>()) {
        let step = Step { name: None, run: run.clone() };
        if let Some(Ok(args)) = trial_step(&step) {
            prop_assert!(run.split_ascii_whitespace().next().is_some());
            let _ = scenario_paths(&args);
        }
    }
}

// --- The digest encoder against the independent implementation ---------------------------

/// One generated vector in the format `tests/independent/digests.py` reads.
fn vector(
    name: String,
    kind: &str,
    input: serde_json::Value,
    encoding: Vec<u8>,
) -> serde_json::Value {
    let mut v = serde_json::json!({
        "name": name,
        "kind": kind,
        "note": "generated by crates/wire/tests/fuzz.rs",
        "input": input,
        "encoding_hex": hex::encode(&encoding),
        "sha256": sha256_hex(&encoding),
    });
    if kind == "evidence" {
        v["canonical_json"] = String::from_utf8(encoding).unwrap().into();
    }
    v
}

/// Generates requests, results, records and evidence, writes their Rust encodings as
/// vectors, and has the Python implementation (written from docs/protocol.md alone) check
/// every one. One Python run for all cases keeps the cost to a fraction of a second.
#[test]
#[allow(
    clippy::disallowed_methods,
    reason = "runs the Python checker on a file of test data, with an empty environment; the wire crate cannot depend on plimsoll-sandbox's spawn helper"
)]
fn the_digest_encoder_agrees_with_the_independent_implementation() {
    let python = Path::new("/usr/bin/python3");
    if !python.exists() {
        assert!(
            !strict(),
            "/usr/bin/python3 is missing and CI=true: install python3"
        );
        eprintln!(
            "SKIP the_digest_encoder_agrees_with_the_independent_implementation: /usr/bin/python3 is missing"
        );
        return;
    }
    let n = cases(100);
    let mut runner = TestRunner::new(Config::with_cases(n));
    let mut vectors = Vec::new();
    let mut gen_n =
        |kind: &str,
         vectors: &mut Vec<serde_json::Value>,
         f: &mut dyn FnMut(&mut TestRunner) -> (serde_json::Value, Vec<u8>)| {
            for i in 0..n {
                let (input, encoding) = f(&mut runner);
                vectors.push(vector(format!("{kind}/{i}"), kind, input, encoding));
            }
        };
    gen_n("request", &mut vectors, &mut |runner| {
        let r = request().new_tree(runner).unwrap().current();
        (serde_json::to_value(&r).unwrap(), encode_request(&r))
    });
    gen_n("result", &mut vectors, &mut |runner| {
        let r = result().new_tree(runner).unwrap().current();
        (serde_json::to_value(&r).unwrap(), encode_result(&r))
    });
    gen_n("record", &mut vectors, &mut |runner| {
        let r = record().new_tree(runner).unwrap().current();
        (serde_json::to_value(&r).unwrap(), encode_record(&r))
    });
    gen_n("evidence", &mut vectors, &mut |runner| {
        let e = evidence().new_tree(runner).unwrap().current();
        (
            serde_json::to_value(&e).unwrap(),
            canonical_evidence_json(&e),
        )
    });
    // Inputs that ever disagreed, kept as regression cases and checked first.
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-regressions/digests.json");
    let kept: Vec<serde_json::Value> = match std::fs::read(&corpus) {
        Ok(text) => serde_json::from_slice(&text)
            .expect("tests/fuzz-regressions/digests.json is a JSON list"),
        Err(_) => Vec::new(),
    };
    for (i, case) in kept.iter().enumerate() {
        let (kind, input) = (case["kind"].as_str().unwrap(), case["input"].clone());
        let encoding = match kind {
            "request" => encode_request(&serde_json::from_value(input.clone()).unwrap()),
            "result" => encode_result(&serde_json::from_value(input.clone()).unwrap()),
            "record" => encode_record(&serde_json::from_value(input.clone()).unwrap()),
            "evidence" => canonical_evidence_json(&serde_json::from_value(input.clone()).unwrap()),
            other => panic!("{}: unknown kind {other}", corpus.display()),
        };
        vectors.insert(i, vector(format!("kept/{i}"), kind, input, encoding));
    }
    let count = vectors.len();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("vectors.json");
    std::fs::write(
        &file,
        serde_json::to_vec(&serde_json::json!({"about": "generated", "vectors": vectors})).unwrap(),
    )
    .unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/independent/digests.py");
    let out = std::process::Command::new(python)
        .arg(&script)
        .arg(&file)
        .env_clear()
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let failures: Vec<&str> = stdout.lines().filter(|l| !l.starts_with("ok ")).collect();
    if !out.status.success() {
        // Keep every input that disagreed as a regression case (commit the file).
        let failed: Vec<&str> = failures
            .iter()
            .filter_map(|l| l.strip_prefix("FAIL "))
            .collect();
        let mut keep = kept.clone();
        for v in &vectors {
            if failed.contains(&v["name"].as_str().unwrap())
                && !v["name"].as_str().unwrap().starts_with("kept/")
            {
                keep.push(serde_json::json!({"kind": v["kind"], "input": v["input"]}));
            }
        }
        std::fs::create_dir_all(corpus.parent().unwrap()).unwrap();
        std::fs::write(&corpus, serde_json::to_vec_pretty(&keep).unwrap()).unwrap();
        panic!(
            "the Python implementation disagrees ({}); the inputs are kept in {}:\n{}\n{}",
            out.status,
            corpus.display(),
            failures.join("\n"),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let expected = format!("{count} passed, 0 failed");
    assert!(
        stdout.lines().any(|l| l.trim() == expected),
        "expected `{expected}`:\n{}",
        failures.join("\n")
    );
}
