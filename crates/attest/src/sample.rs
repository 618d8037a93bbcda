//! Fixed, internally consistent exchanges for golden vectors, tests and the `bench`
//! subcommand. Nothing here ran: the digests are computed, not received.

use plimsoll_wire::digest::{record_sha256, request_sha256, result_sha256, sha256_hex};
use plimsoll_wire::{
    Language, PROTOCOL, RunRecord, RunRequest, RunResponse, RunResult, RunSpec, SessionLink,
    Snippet, Tier,
};

use crate::bundle::{sign_close, sign_exchange};
use crate::exchange::Exchange;
use crate::keys::AttestKey;
use crate::line::envelope_sha256;
use crate::statement::GENESIS_SHA256;

/// The lines (without newlines) of a closed bundle of `n` sample exchanges numbered from
/// `first`, signed by `key`.
pub fn sample_bundle_lines(key: &AttestKey, first: u64, n: u64) -> Vec<Vec<u8>> {
    let exchanges: Vec<Exchange> = (first..first + n).map(sample_exchange).collect();
    signed_lines(key, &exchanges)
}

/// The lines (without newlines) of a closed bundle of `exchanges`, in order, signed by `key`.
/// Each exchange is checked on its own, but nothing across entries (a session's chain): this
/// signs what `sign_chain` would refuse, for tests of what `verify` refuses.
pub fn signed_lines(key: &AttestKey, exchanges: &[Exchange]) -> Vec<Vec<u8>> {
    let mut lines = Vec::new();
    let mut previous = GENESIS_SHA256.to_owned();
    for (i, ex) in (0u64..).zip(exchanges) {
        let line = sign_exchange(key, ex, i, &previous).expect("the exchange checks");
        previous = envelope_sha256(&line.envelope);
        lines.push(line.to_bytes());
    }
    lines.push(sign_close(key, exchanges.len() as u64, &previous).to_bytes());
    lines
}

/// `lines` as a bundle file: each followed by a newline.
pub fn join_lines(lines: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for l in lines {
        out.extend_from_slice(l);
        out.push(b'\n');
    }
    out
}

/// The `n`th sample: a Python snippet printing `n`, run on the process tier at fixed times.
pub fn sample_exchange(n: u64) -> Exchange {
    let request = RunRequest {
        image: None,
        protocol: PROTOCOL,
        request_id: format!("sample-{n}"),
        minimum_isolation: Some(Tier::Process),
        provider: None,
        limits: None,
        run: RunSpec::Snippet(Snippet {
            language: Language::Python,
            code: format!("print({n})"),
        }),
        grant: None,
    };
    let result = RunResult {
        exit_code: Some(0),
        stdout: format!("{n}\n").as_str().into(),
        start: None,
        member_age_ms: None,
        ..Default::default()
    };
    let started = 1_700_000_000_000 + n * 1000;
    let record = RunRecord {
        image: None,
        trials: Vec::new(),
        request_id: request.request_id.clone(),
        request_sha256: String::new(),
        result_sha256: String::new(),
        provider: "process".into(),
        isolation: Tier::Process,
        minimum_isolation: Some(Tier::Process),
        evidence_sha256: sha256_hex(b"sample evidence"),
        environment: "plimsoll-engine 0.1.0".into(),
        started_unix_ms: started,
        ended_unix_ms: started + 42,
        record_sha256: String::new(),
        session: None,
    };
    let mut ex = Exchange {
        response: RunResponse {
            protocol: PROTOCOL,
            request_id: request.request_id.clone(),
            provider: "process".into(),
            isolation: Tier::Process,
            duration_ms: 42,
            request_sha256: String::new(),
            result_sha256: String::new(),
            result,
            record,
        },
        request,
    };
    restate_digests(&mut ex);
    ex
}

/// `n` calls of one session, in order: sample exchanges numbered from `first`, each record
/// linked to the session `session_id` (sequence 1, 2, …, each naming the record digest of the
/// call before it), every digest computed.
pub fn sample_session(session_id: &str, first: u64, n: u64) -> Vec<Exchange> {
    let mut calls: Vec<Exchange> = Vec::new();
    for i in 0..n {
        let mut ex = sample_exchange(first + i);
        ex.request.request_id = format!("{session_id}-call-{}", i + 1);
        ex.response.request_id = ex.request.request_id.clone();
        ex.response.record.request_id = ex.request.request_id.clone();
        ex.response.record.session = Some(SessionLink {
            session_id: session_id.to_owned(),
            sequence: i + 1,
            previous_record_sha256: calls
                .last()
                .map(|p| p.response.record.record_sha256.clone()),
            origin: None,
        });
        restate_digests(&mut ex);
        calls.push(ex);
    }
    calls
}

/// Recomputes and writes every digest the response states, as a daemon would.
pub fn restate_digests(ex: &mut Exchange) {
    let req = request_sha256(&ex.request);
    let res = result_sha256(&ex.response.result);
    ex.response.request_sha256 = req.clone();
    ex.response.result_sha256 = res.clone();
    ex.response.record.request_sha256 = req;
    ex.response.record.result_sha256 = res;
    ex.response.record.record_sha256 = record_sha256(&ex.response.record);
}
