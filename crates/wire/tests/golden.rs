//! Golden vectors for every digest (docs/protocol.md): each input in
//! `tests/golden/vectors.json` is parsed with serde, encoded and hashed, and compared with the
//! stored hex and SHA-256. `PLIMSOLL_BLESS=1` rewrites the file from the current code and
//! prints what changed (never under `CI=true`). The same file is checked by an independent
//! Python implementation, `tests/independent/digests.py`, run from here.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use plimsoll_wire::digest::{
    canonical_evidence_json, encode_record, encode_request, encode_result, sha256_hex,
};
use plimsoll_wire::{Evidence, RunRecord, RunRequest, RunResult, Start, parse_request};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The command that rewrites the vectors, for messages.
const BLESS_HINT: &str = "PLIMSOLL_BLESS=1 cargo nextest run -p plimsoll-wire --test golden";

const ABOUT: &str = "Golden vectors of the plimsoll digest encoding (docs/protocol.md). Each \
vector: a kind (request, result, record, evidence), an input as it travels in JSON, the hex of \
its digest encoding (for evidence: of its canonical JSON) and the SHA-256 of that. Checked by \
crates/wire/tests/golden.rs and by tests/independent/digests.py. Edit inputs here; rewrite the \
outputs with: PLIMSOLL_BLESS=1 cargo nextest run -p plimsoll-wire --test golden";

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct VectorFile {
    about: String,
    vectors: Vec<Vector>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Vector {
    name: String,
    kind: String,
    note: String,
    input: Value,
    /// Another vector whose digest this one must equal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    same_digest_as: Option<String>,
    /// Evidence only: the canonical JSON as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    canonical_json: Option<String>,
    encoding_hex: String,
    sha256: String,
}

/// A parsed input, with the fields the digest does not cover reset by [`Parsed::normalized`].
#[derive(Debug, Clone, PartialEq)]
enum Parsed {
    Request(Box<RunRequest>),
    Result(Box<RunResult>),
    Record(Box<RunRecord>),
    Evidence(Box<Evidence>),
}

fn parse(kind: &str, input: &Value) -> Result<Parsed, String> {
    let e = |e: serde_json::Error| e.to_string();
    Ok(match kind {
        "request" => Parsed::Request(serde_json::from_value(input.clone()).map_err(e)?),
        "result" => Parsed::Result(serde_json::from_value(input.clone()).map_err(e)?),
        "record" => Parsed::Record(serde_json::from_value(input.clone()).map_err(e)?),
        "evidence" => Parsed::Evidence(serde_json::from_value(input.clone()).map_err(e)?),
        other => return Err(format!("unknown vector kind `{other}`")),
    })
}

impl Parsed {
    /// The bytes the digest is taken over.
    fn encoding(&self) -> Vec<u8> {
        match self {
            Parsed::Request(r) => encode_request(r),
            Parsed::Result(r) => encode_result(r),
            Parsed::Record(r) => encode_record(r),
            Parsed::Evidence(e) => canonical_evidence_json(e),
        }
    }

    /// The value with every field the digest leaves out reset: two inputs have the same
    /// digest exactly when their normalized values are equal.
    fn normalized(&self) -> Parsed {
        let mut p = self.clone();
        match &mut p {
            Parsed::Request(r) => r.request_id.clear(),
            Parsed::Result(r) => {
                r.steps.iter_mut().for_each(|s| s.duration_ms = 0);
                r.calls.iter_mut().for_each(|c| c.latency_ms = 0);
            }
            Parsed::Record(r) => r.record_sha256.clear(),
            Parsed::Evidence(_) => {}
        }
        p
    }
}

fn vectors_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/vectors.json")
}

fn load() -> (String, VectorFile) {
    let path = vectors_path();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let file: VectorFile = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not a vector file: {e}", path.display()));
    (text, file)
}

fn render(file: &VectorFile) -> String {
    let mut text = serde_json::to_string_pretty(file).expect("the vector file serialises");
    text.push('\n');
    text
}

/// `CI=true` (or `1`): declared in `plimsoll_env` (`CI`), read directly because the
/// engine depends on this crate.
fn strict() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// `PLIMSOLL_BLESS=1`: declared in `plimsoll_env` (`PLIMSOLL_BLESS`).
fn blessing() -> bool {
    std::env::var("PLIMSOLL_BLESS").is_ok_and(|v| v == "1")
}

/// A minimal line diff (longest common subsequence), `-`/`+` for changed lines.
fn line_diff(old: &str, new: &str) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, String::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            i += 1;
            j += 1;
        } else if j < b.len() && (i == a.len() || lcs[i][j + 1] >= lcs[i + 1][j]) {
            out.push_str(&format!("+{:>4} {}\n", j + 1, b[j]));
            j += 1;
        } else {
            out.push_str(&format!("-{:>4} {}\n", i + 1, a[i]));
            i += 1;
        }
    }
    out
}

/// Recomputes every vector's outputs from its input (and a record's `record_sha256`).
fn recompute(file: &VectorFile) -> VectorFile {
    let vectors = file
        .vectors
        .iter()
        .map(|v| {
            let parsed = parse(&v.kind, &v.input)
                .unwrap_or_else(|e| panic!("vector {}: input does not parse: {e}", v.name));
            let encoding = parsed.encoding();
            let sha256 = sha256_hex(&encoding);
            let mut input = v.input.clone();
            if v.kind == "record" {
                input["record_sha256"] = Value::String(sha256.clone());
            }
            Vector {
                input,
                canonical_json: (v.kind == "evidence")
                    .then(|| String::from_utf8(encoding.clone()).expect("canonical JSON is UTF-8")),
                encoding_hex: hex::encode(&encoding),
                sha256,
                ..v.clone()
            }
        })
        .collect();
    VectorFile {
        about: ABOUT.to_owned(),
        vectors,
    }
}

#[test]
fn golden_vectors_match_the_code() {
    let (text, file) = load();
    let fresh = recompute(&file);
    let fresh_text = render(&fresh);
    if blessing() {
        assert!(
            !strict(),
            "PLIMSOLL_BLESS=1 with CI=true: CI never rewrites golden vectors; bless locally and commit"
        );
        if fresh_text == text {
            eprintln!("golden vectors unchanged");
        } else {
            std::fs::write(vectors_path(), &fresh_text).expect("write the vector file");
            eprintln!(
                "rewrote {}:\n{}",
                vectors_path().display(),
                line_diff(&text, &fresh_text)
            );
        }
        return;
    }
    let mut problems = Vec::new();
    for (old, new) in file.vectors.iter().zip(&fresh.vectors) {
        if old.encoding_hex != new.encoding_hex {
            problems.push(format!(
                "{}: encoding differs\n  stored   {}\n  computed {}",
                old.name, old.encoding_hex, new.encoding_hex
            ));
        }
        if old.sha256 != new.sha256 {
            problems.push(format!(
                "{}: sha256 differs: stored {}, computed {}",
                old.name, old.sha256, new.sha256
            ));
        }
        if old.input != new.input {
            problems.push(format!(
                "{}: input.record_sha256 is not the record's digest {}",
                old.name, new.sha256
            ));
        }
        if old.canonical_json != new.canonical_json {
            problems.push(format!(
                "{}: canonical_json differs: stored {:?}, computed {:?}",
                old.name, old.canonical_json, new.canonical_json
            ));
        }
    }
    if problems.is_empty() && text != fresh_text {
        problems.push(format!(
            "the file is not in its rendered form:\n{}",
            line_diff(&text, &fresh_text)
        ));
    }
    assert!(
        problems.is_empty(),
        "golden vectors do not match the code. A changed digest breaks every client and every \
         stored record: if the change is meant, say so in docs/protocol.md, then run `{BLESS_HINT}` \
         and review the diff.\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_vectors_cover_every_kind_and_case() {
    let (_, file) = load();
    let names: Vec<&str> = file.vectors.iter().map(|v| v.name.as_str()).collect();
    for needed in [
        "request/minimal-snippet",
        "request/every-optional-field",
        "request/project",
        "result/plain",
        "result/killed-by-signal",
        "result/truncated-binary-output",
        "result/project",
        "result/grant-calls",
        "result/grant-calls-credential",
        "record/plain",
        "record/applied-floor",
        "record/null-floor",
        "record/image",
        "record/trials",
        "record/trials-nulls",
        "record/trials-two-steps",
        "record/null-trials",
        "request/null-limit-member",
        "request/project-nested-nulls",
        "result/nested-nulls",
        "result/warm-start",
        "result/cold-start",
        "result/null-start",
        "result/wall-container",
        "result/wall-lines-absent",
        "result/wall-null-lists",
        "result/wall-empty-lists",
        "result/session-file-put",
        "result/session-file-get",
        "result/egress-receipts",
        "result/egress-receipts-nulls",
        "result/empty-egress",
        "evidence/process",
        "evidence/container-with-probe",
    ] {
        assert!(names.contains(&needed), "vector {needed} is missing");
    }
    let mut seen = std::collections::BTreeSet::new();
    for v in &file.vectors {
        assert!(seen.insert(&v.name), "vector name {} appears twice", v.name);
        assert!(
            v.name.starts_with(&format!("{}/", v.kind)),
            "vector {} should be named {}/...",
            v.name,
            v.kind
        );
    }
    // The request vectors are requests a server accepts, not only shapes serde accepts.
    for v in file.vectors.iter().filter(|v| v.kind == "request") {
        let body = serde_json::to_vec(&v.input).unwrap();
        if let Err(e) = parse_request(&body) {
            panic!("vector {} is not a valid request: {e}", v.name);
        }
    }
    // The result vectors cover what the brief names.
    let result = |name: &str| -> RunResult {
        let v = file.vectors.iter().find(|v| v.name == name).unwrap();
        serde_json::from_value(v.input.clone()).unwrap()
    };
    let killed = result("result/killed-by-signal");
    assert!(killed.exit_code.is_none() && killed.signal.is_some());
    let trunc = result("result/truncated-binary-output");
    assert!(trunc.stdout_truncated && std::str::from_utf8(trunc.stdout.as_slice()).is_err());
    let project = result("result/project");
    assert!(project.steps.iter().any(|s| s.name.is_none()));
    assert!(project.steps.iter().any(|s| s.name.is_some()));
    assert!(project.artifacts.iter().any(|a| a.found));
    assert!(project.artifacts.iter().any(|a| !a.found));
    // The nested-null vectors hold a null at every optional member they name.
    let input = |name: &str| &file.vectors.iter().find(|v| v.name == name).unwrap().input;
    for (name, pointers) in [
        (
            "request/project-nested-nulls",
            &[
                "/minimum_isolation",
                "/provider",
                "/limits",
                "/grant",
                "/run/files/0/executable",
                "/run/steps/0/name",
                "/run/artifacts",
            ][..],
        ),
        ("request/null-limit-member", &["/limits/timeout_ms"][..]),
        (
            "result/nested-nulls",
            &[
                "/signal",
                "/oom_killed",
                "/steps/0/name",
                "/steps/0/signal",
                "/steps/0/oom_killed",
                "/artifacts",
                "/calls/0/route",
                "/calls/0/status",
                "/calls/0/error",
            ][..],
        ),
        ("result/null-start", &["/start", "/member_age_ms"][..]),
        (
            "result/wall-null-lists",
            &[
                "/wall/groups",
                "/wall/namespaces",
                "/wall/network_interfaces",
            ][..],
        ),
        (
            "result/egress-receipts-nulls",
            &[
                "/egress/1/sni",
                "/egress/2/address",
                "/egress/2/sni",
                "/egress/2/ended",
                "/egress/3/address",
                "/egress/3/sni",
                "/egress/3/ended",
            ][..],
        ),
        ("record/null-floor", &["/minimum_isolation"][..]),
        (
            "record/trials-nulls",
            &[
                "/trials/0/trials/0/reason",
                "/trials/0/trials/0/score",
                "/trials/0/trials/1/scenario",
            ][..],
        ),
        ("record/null-trials", &["/trials"][..]),
    ] {
        for p in pointers {
            assert_eq!(input(name).pointer(p), Some(&Value::Null), "{name} {p}");
        }
    }
    let floor: RunRecord = serde_json::from_value(input("record/applied-floor").clone()).unwrap();
    assert!(floor.minimum_isolation.is_some());
    let warm = result("result/warm-start");
    assert!(warm.start == Some(Start::Warm) && warm.member_age_ms.is_some());
    let cold = result("result/cold-start");
    assert!(cold.start == Some(Start::Cold) && cold.member_age_ms.is_none());
    // A session's file call ran no step: no exit status and no signal; as every session
    // call's, no start; not a cell, so nothing of an interpreter (docs/protocol.md).
    for name in ["result/session-file-put", "result/session-file-get"] {
        let r = result(name);
        assert!(r.exit_code.is_none() && r.signal.is_none(), "{name}");
        assert!(r.start.is_none() && r.state_kept.is_none(), "{name}");
        assert!(r.steps.is_empty() && r.wall.is_some(), "{name}");
    }
    // The egress vector holds an allowed CONNECT tunnel with its address and SNI, an allowed
    // plain-HTTP request, and refusals without address, SNI or end; the empty list is none.
    let egress = result("result/egress-receipts").egress;
    let allowed = |kind: &str| {
        egress.iter().any(|g| {
            g.verdict == "allowed"
                && g.kind == kind
                && g.address.is_some()
                && g.ended.is_some()
                && (kind == "http") != g.sni.is_some()
        })
    };
    assert!(allowed("connect") && allowed("http"), "{egress:?}");
    assert!(egress.iter().any(|g| g.verdict == "refused"
        && g.address.is_none()
        && g.sni.is_none()
        && g.ended.is_none()));
    assert!(egress.iter().any(|g| g.port == 0) && egress.iter().any(|g| g.rule.contains(" via ")));
    assert_eq!(
        result("result/egress-receipts-nulls"),
        result("result/egress-receipts")
    );
    assert!(result("result/empty-egress").egress.is_empty());
    // The result vectors are results a client accepts, not only shapes serde accepts.
    for v in file.vectors.iter().filter(|v| v.kind == "result") {
        if let Err(e) = result(&v.name).validate() {
            panic!("vector {} is not a valid result: {e}", v.name);
        }
    }
    // So are the record vectors, trial steps included; between them they hold a passing and
    // a failing trial, scores and none, and two trial steps in one record.
    let record = |name: &str| -> RunRecord {
        let v = file.vectors.iter().find(|v| v.name == name).unwrap();
        serde_json::from_value(v.input.clone()).unwrap()
    };
    for v in file.vectors.iter().filter(|v| v.kind == "record") {
        if let Err(e) = record(&v.name).validate() {
            panic!("vector {} is not a valid record: {e}", v.name);
        }
    }
    let trials = record("record/trials").trials;
    assert_eq!(trials.len(), 1);
    let outcomes = &trials[0].trials;
    assert!(outcomes.iter().any(|t| t.pass) && outcomes.iter().any(|t| !t.pass));
    assert!(outcomes.iter().any(|t| t.score.is_some()));
    assert!(outcomes.iter().any(|t| t.score.is_none()));
    assert_eq!(record("record/trials-two-steps").trials.len(), 2);
    assert!(record("record/null-trials").trials.is_empty());
}

#[test]
fn same_digest_as_links_hold() {
    let (_, file) = load();
    let fresh = recompute(&file);
    let mut links = 0;
    for v in &fresh.vectors {
        if let Some(other) = &v.same_digest_as {
            let o = fresh
                .vectors
                .iter()
                .find(|o| &o.name == other)
                .unwrap_or_else(|| panic!("{}: same_digest_as names no vector {other}", v.name));
            assert_eq!(
                v.sha256, o.sha256,
                "{} and {other} should share a digest",
                v.name
            );
            assert_ne!(
                v.input, o.input,
                "{} and {other} should differ in JSON",
                v.name
            );
            links += 1;
        }
    }
    assert!(
        links >= 2,
        "expected the null-vs-absent and base64-vs-string links"
    );
}

/// One change to an input: what it is, and the candidate inputs, tried in order until one
/// parses. `must_parse`: a leaf of the value, which some candidate has to change.
struct Mutation {
    what: String,
    candidates: Vec<Value>,
    must_parse: bool,
}

/// JSON pointer segment escaping (RFC 6901).
fn seg(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Candidate replacements for a leaf, the simplest first.
fn leaf_candidates(key: &str, leaf: &Value) -> Vec<Value> {
    match leaf {
        Value::Bool(b) => vec![Value::Bool(!b)],
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => vec![Value::from(u + 1), Value::from(u.saturating_sub(1))],
            (None, Some(i)) => vec![Value::from(i + 1)],
            // A float (a trial's score).
            _ => n
                .as_f64()
                .map(|f| Value::from(f + 1.0))
                .into_iter()
                .collect(),
        },
        Value::Null => vec![Value::from(0), Value::from("x")],
        Value::String(s) if key == "base64" => {
            let mut bytes = STANDARD.decode(s).expect("vector base64 decodes");
            bytes.push(0);
            vec![Value::String(STANDARD.encode(bytes))]
        }
        Value::String(s) => {
            let mut out = vec![Value::String(format!("{s}x"))];
            for alt in [
                "process",
                "container",
                "kernel",
                "vm",
                "python",
                "javascript",
                "warm",
                "cold",
                "static",
                "minted",
                "cell_timeout",
                "out_of_memory",
                "completed",
                "failed",
                "controller_timeout",
                "restored",
                "forked",
            ] {
                if alt != s {
                    out.push(Value::String(alt.to_owned()));
                }
            }
            out
        }
        Value::Array(_) | Value::Object(_) => vec![],
    }
}

/// Every single change: each leaf replaced, each object member removed, each list item
/// removed, each list of two or more reversed.
fn mutations(root: &Value) -> Vec<Mutation> {
    fn walk(root: &Value, at: &Value, ptr: &str, key: &str, out: &mut Vec<Mutation>) {
        let with = |new: Value| {
            let mut input = root.clone();
            *input.pointer_mut(ptr).expect("pointer from the walk") = new;
            input
        };
        let one = |what: String, input: Value| Mutation {
            what,
            candidates: vec![input],
            must_parse: false,
        };
        match at {
            Value::Object(map) => {
                for (k, v) in map {
                    let mut less = map.clone();
                    less.remove(k);
                    let child = format!("{ptr}/{}", seg(k));
                    out.push(one(format!("remove {child}"), with(Value::Object(less))));
                    walk(root, v, &child, k, out);
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    let mut less = items.clone();
                    less.remove(i);
                    out.push(one(format!("remove {ptr}/{i}"), with(Value::Array(less))));
                    walk(root, v, &format!("{ptr}/{i}"), "", out);
                }
                if items.len() >= 2 {
                    let reversed = items.iter().rev().cloned().collect();
                    out.push(one(format!("reverse {ptr}"), with(Value::Array(reversed))));
                }
            }
            leaf => out.push(Mutation {
                what: format!("set {ptr}"),
                candidates: leaf_candidates(key, leaf).into_iter().map(with).collect(),
                // Every leaf can change into something that still parses, except the run
                // kind (the two kinds have different fields) and nulls.
                must_parse: key != "kind" && !leaf.is_null(),
            }),
        }
    }
    let mut out = Vec::new();
    walk(root, root, "", "", &mut out);
    out
}

/// Changing any single field changes the digest, unless the field is one the digest leaves
/// out (`request_id` of a request, `duration_ms` of a step, `record_sha256` of a record) or the
/// change leaves the value the same (removing a member that defaults to what it held): digests
/// are equal exactly when the normalized values are.
#[test]
fn every_field_change_changes_the_digest_and_only_those() {
    let (_, file) = load();
    let (mut checked, mut request_id_changes, mut duration_changes) = (0, 0, 0);
    let (mut start_changes, mut member_age_changes, mut wall_changes) = (0, 0, 0);
    let (mut egress_changes, mut egress_time_changes) = (0, 0);
    let mut failures = Vec::new();
    for v in &file.vectors {
        let original = parse(&v.kind, &v.input).unwrap();
        let digest = sha256_hex(&original.encoding());
        for m in mutations(&v.input) {
            let Some(changed) = m.candidates.iter().find_map(|c| parse(&v.kind, c).ok()) else {
                if m.must_parse {
                    failures.push(format!("{}: no change of {} parses", v.name, m.what));
                }
                continue;
            };
            checked += 1;
            if v.kind == "result" && m.what == "set /start" {
                start_changes += 1;
            }
            if v.kind == "result" && m.what == "set /member_age_ms" {
                member_age_changes += 1;
            }
            if v.kind == "result" && m.what.starts_with("set /wall/") {
                wall_changes += 1;
            }
            if v.kind == "result" && m.what.starts_with("set /egress/") {
                egress_changes += 1;
                if m.what.ends_with("/start_ms") || m.what.ends_with("/end_ms") {
                    egress_time_changes += 1;
                }
            }
            let same_value = changed.normalized() == original.normalized();
            let same_digest = sha256_hex(&changed.encoding()) == digest;
            let uncovered = if v.kind == "request" && m.what == "set /request_id" {
                request_id_changes += 1;
                true
            } else if v.kind == "result"
                && m.what.ends_with("/duration_ms")
                && m.what.starts_with("set ")
            {
                duration_changes += 1;
                true
            } else {
                false
            };
            if uncovered && !same_digest {
                failures.push(format!("{}: {} changed the digest", v.name, m.what));
            }
            if same_value != same_digest {
                failures.push(format!(
                    "{}: {}: value {}, digest {}",
                    v.name,
                    m.what,
                    if same_value { "same" } else { "changed" },
                    if same_digest { "same" } else { "changed" },
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        request_id_changes >= 3,
        "request_id was changed in too few vectors"
    );
    assert!(
        duration_changes >= 2,
        "duration_ms was changed in too few vectors"
    );
    // The start of a result (warm or cold) and a warm member's age are covered: each was
    // changed, and the checks above saw the digest change with it.
    assert!(
        start_changes >= 2,
        "start was changed in too few vectors ({start_changes})"
    );
    assert!(
        member_age_changes >= 1,
        "member_age_ms was changed in too few vectors ({member_age_changes})"
    );
    // Every member of a wall is covered: each leaf of both wall vectors was changed.
    assert!(
        wall_changes >= 30,
        "the wall was changed in too few places ({wall_changes})"
    );
    // Every member of an egress receipt is covered, its times included (unlike a call's
    // latency): each leaf of the receipts was changed, and the digest changed with it.
    assert!(
        egress_changes >= 40,
        "the egress receipts were changed in too few places ({egress_changes})"
    );
    assert!(
        egress_time_changes >= 8,
        "egress start_ms/end_ms were changed in too few places ({egress_time_changes})"
    );
    assert!(checked > 300, "only {checked} mutations parsed");
}

/// docs/protocol.md's worked example is the vector `request/minimal-snippet`, byte for byte.
#[test]
fn the_worked_example_in_the_docs_is_the_vector() {
    let doc_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/protocol.md");
    let doc = std::fs::read_to_string(&doc_path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", doc_path.display()));
    let (_, file) = load();
    let v = file
        .vectors
        .iter()
        .find(|v| v.name == "request/minimal-snippet")
        .expect("the worked example's vector");
    let fresh = recompute(&file);
    let f = fresh.vectors.iter().find(|f| f.name == v.name).unwrap();
    for (what, text) in [("encoding", &f.encoding_hex), ("sha256", &f.sha256)] {
        assert!(
            doc.contains(text.as_str()),
            "docs/protocol.md's worked example does not show the {what} of request/minimal-snippet ({text}): update it"
        );
    }
    let bytes = f.encoding_hex.len() / 2;
    assert!(
        doc.contains(&format!("{bytes} bytes")),
        "docs/protocol.md should give the example's length, {bytes} bytes"
    );
}

/// The independent implementation (plain Python, standard library) agrees with every vector.
#[test]
#[allow(
    clippy::disallowed_methods,
    reason = "runs the Python checker on a file of test data, with an empty environment; the wire crate cannot depend on plimsoll-sandbox's spawn helper"
)]
fn independent_python_implementation_agrees() {
    let python = Path::new("/usr/bin/python3");
    if !python.exists() {
        assert!(
            !strict(),
            "/usr/bin/python3 is missing and CI=true: install python3"
        );
        eprintln!("SKIP independent_python_implementation_agrees: /usr/bin/python3 is missing");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let script = root.join("tests/independent/digests.py");
    let out = std::process::Command::new(python)
        .arg(&script)
        .arg(vectors_path())
        .env_clear()
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} failed ({}):\n{stdout}\n{stderr}",
        script.display(),
        out.status
    );
    let (_, file) = load();
    let expected = format!("{} passed, 0 failed", file.vectors.len());
    assert!(
        stdout.lines().any(|l| l.trim() == expected),
        "expected `{expected}` from {}:\n{stdout}\n{stderr}",
        script.display()
    );
}

/// What a replay compares: the result without how its sandbox started or what its wall was.
/// Two results that differ only there have the same outcome digest and different result
/// digests; any other change changes both, the egress receipts' included (they are what the
/// code reached, not how its sandbox was made).
#[test]
fn the_outcome_digest_leaves_out_only_the_sandbox() {
    let (_, file) = load();
    let walled: RunResult = serde_json::from_value(
        file.vectors
            .iter()
            .find(|v| v.name == "result/wall-container")
            .unwrap()
            .input
            .clone(),
    )
    .unwrap();
    let fresh = RunResult {
        start: Some(Start::Cold),
        member_age_ms: None,
        wall: None,
        ..walled.clone()
    };
    assert_ne!(
        plimsoll_wire::digest::result_sha256(&walled),
        plimsoll_wire::digest::result_sha256(&fresh)
    );
    assert_eq!(
        plimsoll_wire::digest::outcome_sha256(&walled),
        plimsoll_wire::digest::outcome_sha256(&fresh)
    );
    let other = RunResult {
        stdout: plimsoll_wire::Bytes(b"2\n".to_vec()),
        ..fresh.clone()
    };
    assert_ne!(
        plimsoll_wire::digest::outcome_sha256(&other),
        plimsoll_wire::digest::outcome_sha256(&fresh)
    );
    let receipts: RunResult = serde_json::from_value(
        file.vectors
            .iter()
            .find(|v| v.name == "result/egress-receipts")
            .unwrap()
            .input
            .clone(),
    )
    .unwrap();
    let egress = |egress| {
        plimsoll_wire::digest::outcome_sha256(&RunResult {
            egress,
            ..fresh.clone()
        })
    };
    let mut later = receipts.egress.clone();
    later[0].start_ms += 1;
    let mut elsewhere = receipts.egress.clone();
    elsewhere[0].address = Some("93.184.215.15:443".to_owned());
    let outcomes = [
        egress(Vec::new()),
        egress(receipts.egress.clone()),
        egress(later),
        egress(elsewhere),
    ];
    for (i, a) in outcomes.iter().enumerate() {
        for b in &outcomes[i + 1..] {
            assert_ne!(a, b, "the outcome digest left an egress change out");
        }
    }
}
