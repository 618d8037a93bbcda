//! The checks on every result: the echoed request id, the tier against the floor it was
//! held to (the one asked for, or the daemon's default floor when none was), the record's
//! applied floor (present, met, equal to that floor), the provider against the one asked for
//! (if any), the three digests recomputed here, and the record against the response around
//! it.
//!
//! What this can catch without a signature: an answer meant for another request, a tier
//! below the floor, and any change to the request, the result or the record that leaves a
//! stated digest stale. A party in the middle that rewrites a field *and* recomputes every
//! digest over it is caught only when the field is the tier and it falls below the floor;
//! that is what signed records (plimsoll-attest) are for.

use plimsoll_wire::digest::{record_sha256, request_sha256, result_sha256};
use plimsoll_wire::{PROTOCOL, RunRequest, RunResponse, Tier};

use crate::error::{ClientError, DigestKind};

/// Checks the tier of a result against the floor a request asked for. With no floor, the
/// client does not know the daemon's default, so it checks nothing (the tier is present by
/// construction: a response without one does not parse).
pub fn check_tier(
    request_id: &str,
    floor: Option<Tier>,
    provider: &str,
    isolation: Tier,
) -> Result<(), ClientError> {
    match floor {
        Some(floor) if isolation < floor => Err(ClientError::EvidenceMismatch {
            request_id: request_id.to_owned(),
            provider: provider.to_owned(),
            isolation,
            floor,
        }),
        _ => Ok(()),
    }
}

/// Checks that a record's image answers to `asked` (a name or an identity), the image a
/// request or its session named.
pub fn check_image(
    request_id: &str,
    asked: &str,
    image: Option<&plimsoll_wire::ImageRef>,
) -> Result<(), ClientError> {
    if image.is_some_and(|i| i.answers(asked)) {
        return Ok(());
    }
    Err(ClientError::ImageMismatch {
        request_id: request_id.to_owned(),
        asked: asked.to_owned(),
        image: image.map(|i| format!("{} ({})", i.name, i.identity)),
    })
}

/// Verifies a `200` answer to `sent` (the request exactly as serialised and sent) against
/// the floor it sent. With none sent, only against the floor the record states: what a
/// client that does not know the daemon's default floor can check; [`Client::run`] knows it
/// and calls [`verify_response_held_to`]. Returns the response when every check passes.
///
/// [`Client::run`]: crate::Client::run
pub fn verify_response(
    sent: &RunRequest,
    response: RunResponse,
) -> Result<RunResponse, ClientError> {
    verify(sent, sent.minimum_isolation, response)
}

/// Verifies a `200` answer to `sent` (the request exactly as serialised and sent) held to
/// `floor`: the floor sent, or, none sent, the daemon's default floor (a session's floor for
/// its calls). The tier must meet it and the record must state exactly it as the floor it
/// applied. Returns the response when every check passes.
pub fn verify_response_held_to(
    sent: &RunRequest,
    floor: Tier,
    response: RunResponse,
) -> Result<RunResponse, ClientError> {
    verify(sent, Some(floor), response)
}

/// [`verify_response_held_to`], with the tier and applied floor unchecked against any floor
/// but the record's when `floor` is `None`.
fn verify(
    sent: &RunRequest,
    floor: Option<Tier>,
    response: RunResponse,
) -> Result<RunResponse, ClientError> {
    let id = sent.request_id.as_str();
    if response.request_id != sent.request_id {
        return Err(ClientError::RequestIdMismatch {
            sent: sent.request_id.clone(),
            echoed: response.request_id,
        });
    }
    if response.record.request_id != sent.request_id {
        return Err(ClientError::RequestIdMismatch {
            sent: sent.request_id.clone(),
            echoed: response.record.request_id,
        });
    }
    if response.protocol != PROTOCOL {
        return Err(ClientError::BadResponse {
            request_id: id.to_owned(),
            status: 200,
            message: format!(
                "the result speaks protocol {}, this client protocol {PROTOCOL}",
                response.protocol
            ),
        });
    }
    // The tier comes before the digests: whatever else is wrong, a run below the floor is
    // the fact the caller most needs, and it is an error even if every digest matched.
    let weakest = response.isolation.min(response.record.isolation);
    check_tier(id, floor, &response.provider, weakest)?;
    // The record states the floor the daemon applied: the one sent, or the operator's default
    // when none was sent. It must be there, the tier must meet it, and it must be the floor
    // this client held the run to (which also catches a daemon whose listing and records
    // disagree).
    let Some(applied) = response.record.minimum_isolation else {
        return Err(ClientError::BadResponse {
            request_id: id.to_owned(),
            status: 200,
            message: "the record states no applied floor (`record.minimum_isolation`): the daemon is older than this client or faulty, and the code may have run".into(),
        });
    };
    check_tier(id, Some(applied), &response.provider, weakest)?;
    if let Some(floor) = floor
        && floor != applied
    {
        return Err(ClientError::RecordMismatch {
            request_id: id.to_owned(),
            field: "minimum_isolation",
            response: floor.as_str().to_owned(),
            record: applied.as_str().to_owned(),
        });
    }
    // So does the provider, when the request named one.
    if let Some(asked) = &sent.provider {
        for named in [&response.provider, &response.record.provider] {
            if named != asked {
                return Err(ClientError::ProviderMismatch {
                    request_id: id.to_owned(),
                    asked: asked.clone(),
                    provider: named.clone(),
                });
            }
        }
    }
    // And the image: served by the one named or refused, never by another.
    if let Some(asked) = &sent.image {
        check_image(id, asked, response.record.image.as_ref())?;
    }
    // What serde cannot check: a pool member's age only with a warm start, and always with one.
    if let Err(e) = response.result.validate() {
        return Err(ClientError::BadResponse {
            request_id: id.to_owned(),
            status: 200,
            message: e.to_string(),
        });
    }

    let digest = |kind, computed: String, claimed: &str| {
        if computed == claimed {
            Ok(computed)
        } else {
            Err(ClientError::DigestMismatch {
                request_id: id.to_owned(),
                kind,
                computed,
                claimed: claimed.to_owned(),
            })
        }
    };
    let request_sha = digest(
        DigestKind::Request,
        request_sha256(sent),
        &response.request_sha256,
    )?;
    let result_sha = digest(
        DigestKind::Result,
        result_sha256(&response.result),
        &response.result_sha256,
    )?;
    let record = &response.record;
    digest(
        DigestKind::Record,
        record_sha256(record),
        &record.record_sha256,
    )?;

    let agree = |field: &'static str, response: &str, record: &str| {
        if response == record {
            Ok(())
        } else {
            Err(ClientError::RecordMismatch {
                request_id: id.to_owned(),
                field,
                response: response.to_owned(),
                record: record.to_owned(),
            })
        }
    };
    agree("request_sha256", &request_sha, &record.request_sha256)?;
    agree("result_sha256", &result_sha, &record.result_sha256)?;
    agree("provider", &response.provider, &record.provider)?;
    agree(
        "isolation",
        response.isolation.as_str(),
        record.isolation.as_str(),
    )?;
    Ok(response)
}

#[cfg(test)]
mod tests {
    use plimsoll_wire::{
        Language, RunRecord, RunResult, RunSpec, Snippet, Start, not_dispatched_reason,
    };

    use super::*;

    fn request(floor: Option<Tier>) -> RunRequest {
        RunRequest {
            image: None,
            protocol: PROTOCOL,
            request_id: "r-1".into(),
            minimum_isolation: floor,
            provider: None,
            limits: None,
            run: RunSpec::Snippet(Snippet {
                language: Language::Javascript,
                code: "console.log(1)".into(),
            }),
            grant: None,
        }
    }

    /// A response whose digests and record are all consistent with `req`.
    fn honest(req: &RunRequest, isolation: Tier) -> RunResponse {
        let result = RunResult {
            exit_code: Some(0),
            stdout: "1\n".into(),
            start: None,
            member_age_ms: None,
            ..RunResult::default()
        };
        let mut record = RunRecord {
            image: None,
            trials: Vec::new(),
            request_id: req.request_id.clone(),
            request_sha256: request_sha256(req),
            result_sha256: result_sha256(&result),
            provider: "p".into(),
            isolation,
            minimum_isolation: Some(req.minimum_isolation.unwrap_or(Tier::Process)),
            evidence_sha256: "e".repeat(64),
            environment: "test".into(),
            started_unix_ms: 1,
            ended_unix_ms: 2,
            record_sha256: String::new(),
            session: None,
        };
        record.record_sha256 = record_sha256(&record);
        RunResponse {
            protocol: PROTOCOL,
            request_id: req.request_id.clone(),
            provider: "p".into(),
            isolation,
            duration_ms: 1,
            request_sha256: record.request_sha256.clone(),
            result_sha256: record.result_sha256.clone(),
            result,
            record,
        }
    }

    #[test]
    fn tier_below_the_floor_is_an_evidence_mismatch_not_a_refusal() {
        let e = check_tier("r", Some(Tier::Container), "p", Tier::Process).unwrap_err();
        assert!(matches!(
            e,
            ClientError::EvidenceMismatch {
                isolation: Tier::Process,
                floor: Tier::Container,
                ..
            }
        ));
        assert_eq!(not_dispatched_reason(&e), None);
        assert!(e.to_string().contains("the code ran"), "{e}");
    }

    #[test]
    fn tier_at_or_above_the_floor_or_no_floor_passes() {
        for floor in Tier::ALL {
            for tier in Tier::ALL {
                let r = check_tier("r", Some(floor), "p", tier);
                assert_eq!(r.is_ok(), tier >= floor, "floor {floor}, tier {tier}");
            }
        }
        for tier in Tier::ALL {
            check_tier("r", None, "p", tier).unwrap();
        }
    }

    #[test]
    fn an_honest_response_verifies() {
        let req = request(Some(Tier::Process));
        verify_response(&req, honest(&req, Tier::Process)).unwrap();
        let req = request(None);
        verify_response(&req, honest(&req, Tier::Process)).unwrap();
    }

    #[test]
    fn a_records_trial_steps_are_read_and_covered_by_its_digest() {
        let req = request(Some(Tier::Container));
        let mut resp = honest(&req, Tier::Container);
        let fp = "9".repeat(64);
        let verdict = format!(
            r#"{{"format":"plimsoll-trial-verdict/2","simulator":{{"name":"cartpole","version":"1.0.0","sha256":"{fp}"}},"controller":["node","c.js"],"pass":true,"trials":[{{"scenario":"s.json","name":"standard","end_reason":"completed","detail":null,"pass":true,"ticks":2000,"score":-0.0,"fingerprint":"{fp}","wall_ms":null}}]}}"#
        );
        let step = plimsoll_wire::TrialStepRecord::from_verdict(1, verdict.as_bytes()).unwrap();
        resp.record.trials = vec![step];
        resp.record.record_sha256 = record_sha256(&resp.record);
        // As it travels: the answer's JSON reads back to the same record, -0.0 and all.
        let json = serde_json::to_vec(&resp).unwrap();
        let read: RunResponse = serde_json::from_slice(&json).unwrap();
        assert_eq!(read.record, resp.record);
        let ok = verify_response(&req, read).unwrap();
        assert_eq!(
            ok.record.trials[0].trials[0].scenario.as_deref(),
            Some("standard")
        );
        // A score changed (0.0 for -0.0) and nothing else: the record digest no longer holds.
        let mut forged = resp.clone();
        forged.record.trials[0].trials[0].score = plimsoll_wire::Score::new(0.0);
        let e = verify_response(&req, forged).unwrap_err();
        assert!(
            matches!(
                e,
                ClientError::DigestMismatch {
                    kind: DigestKind::Record,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn a_consistent_response_below_the_floor_is_caught() {
        // Every digest matches, the record agrees: only the tier check can catch it.
        let req = request(Some(Tier::Kernel));
        let e = verify_response(&req, honest(&req, Tier::Container)).unwrap_err();
        assert!(
            matches!(
                e,
                ClientError::EvidenceMismatch {
                    isolation: Tier::Container,
                    floor: Tier::Kernel,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn the_applied_floor_is_required_equal_to_the_sent_one_and_met() {
        // None sent: the operator's default (here container) is applied, and a tier below it
        // is caught although this client set no floor of its own.
        let req = request(None);
        let mut resp = honest(&req, Tier::Process);
        resp.record.minimum_isolation = Some(Tier::Container);
        resp.record.record_sha256 = record_sha256(&resp.record);
        let e = verify_response(&req, resp).unwrap_err();
        assert!(
            matches!(
                e,
                ClientError::EvidenceMismatch {
                    isolation: Tier::Process,
                    floor: Tier::Container,
                    ..
                }
            ),
            "{e}"
        );
        // A floor was sent: the record must state exactly it, even when the tier meets both.
        let req = request(Some(Tier::Container));
        let mut resp = honest(&req, Tier::Kernel);
        resp.record.minimum_isolation = Some(Tier::Process);
        resp.record.record_sha256 = record_sha256(&resp.record);
        let e = verify_response(&req, resp).unwrap_err();
        assert!(
            matches!(
                e,
                ClientError::RecordMismatch {
                    field: "minimum_isolation",
                    ..
                }
            ),
            "{e}"
        );
        // A record without it is refused.
        let mut resp = honest(&req, Tier::Kernel);
        resp.record.minimum_isolation = None;
        resp.record.record_sha256 = record_sha256(&resp.record);
        let e = verify_response(&req, resp).unwrap_err();
        assert!(e.to_string().contains("no applied floor"), "{e}");
        assert_eq!(not_dispatched_reason(&e), None);
    }

    #[test]
    fn with_no_floor_sent_the_daemons_default_floor_holds() {
        // The daemon's default floor is container; an answer that says process throughout,
        // every digest consistent, is below it: the code ran.
        let req = request(None);
        let e = verify_response_held_to(&req, Tier::Container, honest(&req, Tier::Process))
            .unwrap_err();
        assert!(
            matches!(
                e,
                ClientError::EvidenceMismatch {
                    isolation: Tier::Process,
                    floor: Tier::Container,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(not_dispatched_reason(&e), None);
        // Without the default floor, only the record's own floor is there to check against.
        verify_response(&req, honest(&req, Tier::Process)).unwrap();
        // Above it, the record must still state it as the floor applied.
        let e =
            verify_response_held_to(&req, Tier::Container, honest(&req, Tier::Kernel)).unwrap_err();
        assert!(
            matches!(
                &e,
                ClientError::RecordMismatch {
                    field: "minimum_isolation",
                    response,
                    record,
                    ..
                } if response == "container" && record == "process"
            ),
            "{e}"
        );
        let mut resp = honest(&req, Tier::Kernel);
        resp.record.minimum_isolation = Some(Tier::Container);
        resp.record.record_sha256 = record_sha256(&resp.record);
        verify_response_held_to(&req, Tier::Container, resp).unwrap();
    }

    #[test]
    fn the_applied_floor_is_covered_by_the_record_digest() {
        let req = request(None);
        let mut resp = honest(&req, Tier::Kernel);
        resp.record.minimum_isolation = Some(Tier::Container);
        let e = verify_response(&req, resp).unwrap_err();
        assert!(
            matches!(
                e,
                ClientError::DigestMismatch {
                    kind: DigestKind::Record,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn a_record_below_the_floor_is_caught_even_if_the_response_is_not() {
        let req = request(Some(Tier::Container));
        let mut resp = honest(&req, Tier::Container);
        resp.record.isolation = Tier::Process;
        let e = verify_response(&req, resp).unwrap_err();
        assert!(matches!(e, ClientError::EvidenceMismatch { .. }), "{e}");
    }

    /// `honest`, with its result changed by `f` and every digest over it recomputed.
    fn honest_with(req: &RunRequest, f: impl FnOnce(&mut RunResult)) -> RunResponse {
        let mut resp = honest(req, Tier::Process);
        f(&mut resp.result);
        resp.result_sha256 = result_sha256(&resp.result);
        resp.record.result_sha256 = resp.result_sha256.clone();
        resp.record.record_sha256 = record_sha256(&resp.record);
        resp
    }

    #[test]
    fn a_member_age_without_a_warm_start_is_a_bad_response() {
        let req = request(None);
        for (start, age) in [(Some(Start::Warm), Some(1500)), (Some(Start::Cold), None)] {
            let resp = honest_with(&req, |r| (r.start, r.member_age_ms) = (start, age));
            let resp = verify_response(&req, resp).unwrap();
            assert_eq!((resp.result.start, resp.result.member_age_ms), (start, age));
        }
        for (start, age) in [
            (None, Some(1500)),
            (Some(Start::Cold), Some(1500)),
            (Some(Start::Warm), None),
        ] {
            let resp = honest_with(&req, |r| (r.start, r.member_age_ms) = (start, age));
            let e = verify_response(&req, resp).unwrap_err();
            let ClientError::BadResponse { message, .. } = &e else {
                panic!("{e}")
            };
            assert!(message.contains("malformed"), "{message}");
            assert!(message.contains("member_age_ms"), "{message}");
        }
    }

    #[test]
    fn each_digest_is_recomputed() {
        let req = request(None);
        let mut resp = honest(&req, Tier::Process);
        resp.result.stdout = "2\n".into();
        let e = verify_response(&req, resp).unwrap_err();
        assert!(
            matches!(
                &e,
                ClientError::DigestMismatch {
                    kind: DigestKind::Result,
                    ..
                }
            ),
            "{e}"
        );

        // The request digest is over what this client sent, not what the daemon claims.
        let other = RunRequest {
            minimum_isolation: Some(Tier::Process),
            ..req.clone()
        };
        let e = verify_response(&req, honest(&other, Tier::Process)).unwrap_err();
        let ClientError::DigestMismatch {
            kind: DigestKind::Request,
            computed,
            claimed,
            ..
        } = &e
        else {
            panic!("{e}")
        };
        assert!(e.to_string().contains(computed) && e.to_string().contains(claimed));

        let mut resp = honest(&req, Tier::Process);
        resp.record.environment = "elsewhere".into();
        let e = verify_response(&req, resp).unwrap_err();
        assert!(
            matches!(
                e,
                ClientError::DigestMismatch {
                    kind: DigestKind::Record,
                    ..
                }
            ),
            "{e}"
        );
    }

    /// A golden vector's input and digest (crates/wire/tests/golden/vectors.json, read at
    /// test time as every client reads it).
    fn vector(name: &str) -> (serde_json::Value, String) {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../wire/tests/golden/vectors.json"
        );
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let file: serde_json::Value = serde_json::from_str(&text).unwrap();
        let v = file["vectors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no golden vector {name}"));
        (v["input"].clone(), v["sha256"].as_str().unwrap().to_owned())
    }

    /// The bytes of a `200` answer to `req` carrying `result` as JSON and claiming
    /// `result_sha256` for it (a vector's digest, not one computed here); the request's and
    /// record's digests honest.
    fn answer_claiming(
        req: &RunRequest,
        result: serde_json::Value,
        result_sha256: &str,
    ) -> Vec<u8> {
        let mut record = RunRecord {
            image: None,
            trials: Vec::new(),
            request_id: req.request_id.clone(),
            request_sha256: request_sha256(req),
            result_sha256: result_sha256.to_owned(),
            provider: "crun".into(),
            isolation: Tier::Container,
            minimum_isolation: Some(Tier::Container),
            evidence_sha256: "e".repeat(64),
            environment: format!("sha256:{}", "1".repeat(64)),
            started_unix_ms: 1,
            ended_unix_ms: 2,
            record_sha256: String::new(),
            session: None,
        };
        record.record_sha256 = record_sha256(&record);
        serde_json::to_vec(&serde_json::json!({
            "protocol": PROTOCOL,
            "request_id": req.request_id,
            "provider": "crun",
            "isolation": "container",
            "duration_ms": 700,
            "request_sha256": record.request_sha256,
            "result_sha256": result_sha256,
            "result": result,
            "record": record,
        }))
        .unwrap()
    }

    /// Reads and verifies an answer as [`crate::Client`] does a run's.
    fn read_and_verify(req: &RunRequest, answer: &[u8]) -> Result<RunResponse, ClientError> {
        let response: RunResponse = serde_json::from_slice(answer).unwrap();
        verify_response_held_to(req, Tier::Container, response)
    }

    #[test]
    fn a_result_with_egress_receipts_verifies_against_the_vectors_digest() {
        for name in ["result/egress-receipts", "result/egress-receipts-nulls"] {
            let (input, sha256) = vector(name);
            let req = request(Some(Tier::Container));
            let ok = read_and_verify(&req, &answer_claiming(&req, input, &sha256))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(ok.result_sha256, sha256);
            let egress = &ok.result.egress;
            let kinds: Vec<(&str, &str)> = egress
                .iter()
                .map(|g| (g.kind.as_str(), g.verdict.as_str()))
                .collect();
            assert_eq!(
                kinds,
                [
                    ("connect", "allowed"),
                    ("http", "allowed"),
                    ("http", "refused"),
                    ("connect", "refused")
                ],
                "{name}"
            );
            assert_eq!(
                (egress[0].address.as_deref(), egress[0].sni.as_deref()),
                (Some("93.184.215.14:443"), Some("api.example.com"))
            );
            assert_eq!(
                (&egress[2].address, &egress[2].sni, &egress[2].ended),
                (&None, &None, &None)
            );
        }
    }

    #[test]
    fn a_changed_egress_receipt_fails_the_vectors_digest() {
        type Change = fn(&mut Vec<serde_json::Value>);
        let changes: [(&str, Change); 8] = [
            ("a start time", |g| g[0]["start_ms"] = 113.into()),
            ("an end time", |g| g[0]["end_ms"] = 349.into()),
            ("the address", |g| {
                g[0]["address"] = "93.184.215.15:443".into()
            }),
            ("the SNI dropped", |g| {
                g[0].as_object_mut().unwrap().remove("sni");
            }),
            ("a verdict", |g| g[2]["verdict"] = "allowed".into()),
            ("a port", |g| g[3]["port"] = 1.into()),
            ("the order", |g| g.reverse()),
            ("one dropped", |g| {
                g.pop();
            }),
        ];
        let (input, sha256) = vector("result/egress-receipts");
        for (what, change) in changes {
            let mut result = input.clone();
            change(result["egress"].as_array_mut().unwrap());
            let req = request(Some(Tier::Container));
            let e = read_and_verify(&req, &answer_claiming(&req, result, &sha256)).unwrap_err();
            assert!(
                matches!(
                    &e,
                    ClientError::DigestMismatch {
                        kind: DigestKind::Result,
                        claimed,
                        ..
                    } if *claimed == sha256
                ),
                "{what}: {e}"
            );
            assert_eq!(not_dispatched_reason(&e), None, "{what}");
        }
    }

    #[test]
    fn the_record_must_agree_with_the_response() {
        let req = request(None);
        let mut resp = honest(&req, Tier::Process);
        resp.isolation = Tier::Vm;
        let e = verify_response(&req, resp).unwrap_err();
        assert!(
            matches!(
                e,
                ClientError::RecordMismatch {
                    field: "isolation",
                    ..
                }
            ),
            "{e}"
        );
        let mut resp = honest(&req, Tier::Process);
        resp.provider = "q".into();
        assert!(matches!(
            verify_response(&req, resp).unwrap_err(),
            ClientError::RecordMismatch {
                field: "provider",
                ..
            }
        ));
    }

    #[test]
    fn another_requests_result_is_not_ours() {
        let req = request(None);
        let other = RunRequest {
            request_id: "r-2".into(),
            ..req.clone()
        };
        let e = verify_response(&req, honest(&other, Tier::Process)).unwrap_err();
        assert!(
            matches!(&e, ClientError::RequestIdMismatch { sent, echoed } if sent == "r-1" && echoed == "r-2"),
            "{e}"
        );
        assert_eq!(not_dispatched_reason(&e), None);
    }

    #[test]
    fn another_provider_than_the_one_asked_for_is_an_evidence_mismatch() {
        let req = RunRequest {
            provider: Some("p".into()),
            ..request(None)
        };
        verify_response(&req, honest(&req, Tier::Process)).unwrap();

        // Consistent everywhere (digests, record), but not the provider asked for.
        let other = RunRequest {
            provider: Some("q".into()),
            ..req.clone()
        };
        let e = verify_response(&other, honest(&other, Tier::Process)).unwrap_err();
        assert!(
            matches!(&e, ClientError::ProviderMismatch { asked, provider, .. } if asked == "q" && provider == "p"),
            "{e}"
        );
        assert_eq!(not_dispatched_reason(&e), None);
        assert_eq!(e.code(), "evidence_mismatch");
        assert!(e.to_string().contains("the code ran"), "{e}");

        // The record alone naming another provider is caught too.
        let mut resp = honest(&req, Tier::Process);
        resp.record.provider = "r".into();
        resp.record.record_sha256 = record_sha256(&resp.record);
        let e = verify_response(&req, resp).unwrap_err();
        assert!(
            matches!(&e, ClientError::ProviderMismatch { provider, .. } if provider == "r"),
            "{e}"
        );
    }

    #[test]
    fn another_image_than_the_one_asked_for_or_none_is_an_evidence_mismatch() {
        let id = format!("sha256:{}", "ab".repeat(32));
        let image = plimsoll_wire::ImageRef {
            name: "python-data".into(),
            identity: id.clone(),
        };
        let with_image = |req: &RunRequest, image: Option<plimsoll_wire::ImageRef>| {
            let mut resp = honest(req, Tier::Container);
            resp.record.image = image;
            resp.record.record_sha256 = record_sha256(&resp.record);
            resp
        };
        for asked in ["python-data", id.as_str()] {
            let req = RunRequest {
                image: Some(asked.into()),
                ..request(None)
            };
            verify_response(&req, with_image(&req, Some(image.clone()))).unwrap();
            for wrong in [
                None,
                Some(plimsoll_wire::ImageRef {
                    name: "sandbox".into(),
                    identity: format!("sha256:{}", "cd".repeat(32)),
                }),
            ] {
                let e = verify_response(&req, with_image(&req, wrong)).unwrap_err();
                assert!(
                    matches!(&e, ClientError::ImageMismatch { asked: a, .. } if a == asked),
                    "{e}"
                );
                assert_eq!(not_dispatched_reason(&e), None);
                assert_eq!(e.code(), "evidence_mismatch");
                assert!(e.to_string().contains("the code ran"), "{e}");
            }
        }
        // Naming none: any image (the default) is what was asked for.
        let req = request(None);
        verify_response(&req, with_image(&req, Some(image))).unwrap();
    }
}
