//! The digest encoding of requests, results, records and evidence (docs/protocol.md).
//!
//! An encoding is `frame(domain)` followed by the present fields in a fixed order, each as
//! `frame(name) ‖ frame(value)`, where `frame(x)` is the length of `x` as a big-endian u64
//! followed by `x`. Absent optional fields and empty lists are left out, so adding an optional
//! field later keeps every old digest. The digest is SHA-256 of the encoding, in lowercase hex.

use sha2::{Digest, Sha256};

use crate::{
    EgressReceipt, Evidence, Limits, Project, RunRecord, RunRequest, RunResult, RunSpec, Snippet,
    StepResult, Tier, TrialStepRecord, Wall,
};

/// Domain string of the request encoding.
pub const REQUEST_DOMAIN: &str = "plimsoll/run-request/v1";
/// Domain string of the result encoding.
pub const RESULT_DOMAIN: &str = "plimsoll/run-result/v1";
/// Domain string of the record encoding.
pub const RECORD_DOMAIN: &str = "plimsoll/run-record/v1";

/// Builds one encoding: a sequence of named, length-prefixed fields.
#[derive(Debug, Default)]
pub struct Encoder {
    buf: Vec<u8>,
}

fn frame(buf: &mut Vec<u8>, bytes: &[u8]) {
    buf.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
    buf.extend_from_slice(bytes);
}

impl Encoder {
    /// A top-level encoding, opened by its domain string.
    pub fn with_domain(domain: &str) -> Self {
        let mut e = Encoder::default();
        frame(&mut e.buf, domain.as_bytes());
        e
    }

    /// A nested value's encoding: fields only, no domain.
    pub fn nested() -> Self {
        Encoder::default()
    }

    /// A field with raw bytes as its value.
    pub fn bytes(&mut self, name: &str, value: &[u8]) -> &mut Self {
        frame(&mut self.buf, name.as_bytes());
        frame(&mut self.buf, value);
        self
    }

    /// A UTF-8 string field.
    pub fn str(&mut self, name: &str, value: &str) -> &mut Self {
        self.bytes(name, value.as_bytes())
    }

    /// An unsigned integer field: 8 bytes, big-endian.
    pub fn u64(&mut self, name: &str, value: u64) -> &mut Self {
        self.bytes(name, &value.to_be_bytes())
    }

    /// A signed integer field: 8 bytes, big-endian two's complement.
    pub fn i64(&mut self, name: &str, value: i64) -> &mut Self {
        self.bytes(name, &value.to_be_bytes())
    }

    /// A boolean field: one byte, 0 or 1.
    pub fn bool(&mut self, name: &str, value: bool) -> &mut Self {
        self.bytes(name, &[u8::from(value)])
    }

    /// A float field: its IEEE 754 binary64 bits, 8 bytes, big-endian.
    pub fn f64(&mut self, name: &str, value: f64) -> &mut Self {
        self.bytes(name, &value.to_bits().to_be_bytes())
    }

    /// A tier field: its lowercase name.
    pub fn tier(&mut self, name: &str, value: Tier) -> &mut Self {
        self.str(name, value.as_str())
    }

    /// A nested value: the nested encoding's bytes.
    pub fn nest(&mut self, name: &str, value: &Encoder) -> &mut Self {
        self.bytes(name, &value.buf)
    }

    /// A list: the count as a big-endian u64, then each item framed. Left out when empty.
    pub fn list<I: IntoIterator<Item = Vec<u8>>>(&mut self, name: &str, items: I) -> &mut Self {
        let items: Vec<Vec<u8>> = items.into_iter().collect();
        if items.is_empty() {
            return self;
        }
        let mut value = (items.len() as u64).to_be_bytes().to_vec();
        for item in &items {
            frame(&mut value, item);
        }
        self.bytes(name, &value)
    }

    /// The encoding's bytes.
    pub fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// Lowercase hex SHA-256 of some bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn encode_limits(l: &Limits) -> Encoder {
    let mut e = Encoder::nested();
    let fields = [
        ("timeout_ms", l.timeout_ms),
        ("memory_bytes", l.memory_bytes),
        ("output_bytes", l.output_bytes),
        ("pids", l.pids),
        ("disk_bytes", l.disk_bytes),
        ("artifact_bytes", l.artifact_bytes),
    ];
    for (name, value) in fields {
        if let Some(v) = value {
            e.u64(name, v);
        }
    }
    e
}

fn encode_run(run: &RunSpec) -> Encoder {
    let mut e = Encoder::nested();
    e.str("kind", run.kind());
    match run {
        RunSpec::Snippet(Snippet { language, code }) => {
            e.str("language", language.as_str()).str("code", code);
        }
        RunSpec::Project(Project {
            files,
            steps,
            artifacts,
        }) => {
            e.list(
                "files",
                files.iter().map(|f| {
                    let mut fe = Encoder::nested();
                    fe.str("path", &f.path)
                        .bytes("content", f.content.as_slice())
                        .bool("executable", f.executable);
                    fe.finish()
                }),
            );
            e.list(
                "steps",
                steps.iter().map(|s| {
                    let mut se = Encoder::nested();
                    if let Some(name) = &s.name {
                        se.str("name", name);
                    }
                    se.str("run", &s.run);
                    se.finish()
                }),
            );
            e.list("artifacts", artifacts.iter().map(|a| a.as_bytes().to_vec()));
        }
    }
    e
}

/// The request's digest encoding. The request id is not part of it.
pub fn encode_request(r: &RunRequest) -> Vec<u8> {
    let mut e = Encoder::with_domain(REQUEST_DOMAIN);
    e.u64("protocol", u64::from(r.protocol));
    if let Some(t) = r.minimum_isolation {
        e.tier("minimum_isolation", t);
    }
    if let Some(p) = &r.provider {
        e.str("provider", p);
    }
    if let Some(l) = &r.limits {
        e.nest("limits", &encode_limits(l));
    }
    e.nest("run", &encode_run(&r.run));
    if let Some(g) = &r.grant {
        e.str("grant", g);
    }
    if let Some(image) = &r.image {
        e.str("image", image);
    }
    e.finish()
}

/// SHA-256 of [`encode_request`].
pub fn request_sha256(r: &RunRequest) -> String {
    sha256_hex(&encode_request(r))
}

/// The fields a whole result and a step share, in encoding order.
struct Outcome<'a> {
    exit_code: Option<i32>,
    signal: Option<i32>,
    timed_out: bool,
    oom_killed: bool,
    stdout: &'a [u8],
    stdout_truncated: bool,
    stderr: &'a [u8],
    stderr_truncated: bool,
}

fn encode_outcome(e: &mut Encoder, o: &Outcome<'_>) {
    if let Some(c) = o.exit_code {
        e.i64("exit_code", i64::from(c));
    }
    if let Some(s) = o.signal {
        e.i64("signal", i64::from(s));
    }
    e.bool("timed_out", o.timed_out)
        .bool("oom_killed", o.oom_killed)
        .bytes("stdout", o.stdout)
        .bool("stdout_truncated", o.stdout_truncated)
        .bytes("stderr", o.stderr)
        .bool("stderr_truncated", o.stderr_truncated);
}

fn encode_step(s: &StepResult) -> Vec<u8> {
    let mut e = Encoder::nested();
    if let Some(name) = &s.name {
        e.str("name", name);
    }
    encode_outcome(
        &mut e,
        &Outcome {
            exit_code: s.exit_code,
            signal: s.signal,
            timed_out: s.timed_out,
            oom_killed: s.oom_killed,
            stdout: s.stdout.as_slice(),
            stdout_truncated: s.stdout_truncated,
            stderr: s.stderr.as_slice(),
            stderr_truncated: s.stderr_truncated,
        },
    );
    e.finish()
}

/// The result's digest encoding. Durations (steps' `duration_ms`, calls' `latency_ms`) are
/// not part of it, so a deterministic run replayed gives the same digest.
pub fn encode_result(r: &RunResult) -> Vec<u8> {
    let mut e = Encoder::with_domain(RESULT_DOMAIN);
    encode_outcome(
        &mut e,
        &Outcome {
            exit_code: r.exit_code,
            signal: r.signal,
            timed_out: r.timed_out,
            oom_killed: r.oom_killed,
            stdout: r.stdout.as_slice(),
            stdout_truncated: r.stdout_truncated,
            stderr: r.stderr.as_slice(),
            stderr_truncated: r.stderr_truncated,
        },
    );
    e.list("steps", r.steps.iter().map(encode_step));
    e.list(
        "artifacts",
        r.artifacts.iter().map(|a| {
            let mut ae = Encoder::nested();
            ae.str("path", &a.path)
                .bool("found", a.found)
                .u64("size", a.size)
                .bytes("content", a.content.as_slice())
                .bool("truncated", a.truncated);
            ae.finish()
        }),
    );
    e.list(
        "calls",
        r.calls.iter().map(|c| {
            let mut ce = Encoder::nested();
            ce.str("method", &c.method);
            if let Some(route) = &c.route {
                ce.str("route", route);
            }
            if let Some(status) = c.status {
                ce.u64("status", u64::from(status));
            }
            if let Some(error) = &c.error {
                ce.str("error", error);
            }
            ce.u64("request_bytes", c.request_bytes)
                .u64("response_bytes", c.response_bytes);
            // Left out when absent, so a call listed before the field existed keeps its digest.
            if let Some(kind) = c.credential {
                ce.str("credential", kind.as_str());
            }
            ce.finish()
        }),
    );
    // Left out when absent, so a result written before these fields existed keeps its digest.
    if let Some(start) = r.start {
        e.str("start", start.as_str());
    }
    if let Some(age) = r.member_age_ms {
        e.u64("member_age_ms", age);
    }
    if let Some(w) = &r.wall {
        e.nest("wall", &encode_wall(w));
    }
    if let Some(kept) = r.state_kept {
        e.bool("state_kept", kept);
    }
    if let Some(end) = r.interpreter_end {
        e.str("interpreter_end", end.as_str());
    }
    // Left out when empty (every run without an egress grant), so such a result keeps its
    // digest. Every member of a receipt is covered, its times included.
    e.list("egress", r.egress.iter().map(encode_egress_receipt));
    e.finish()
}

/// An egress receipt's nested encoding (docs/protocol.md, result field 17).
fn encode_egress_receipt(g: &EgressReceipt) -> Vec<u8> {
    let mut e = Encoder::nested();
    e.str("host", &g.host)
        .u64("port", u64::from(g.port))
        .str("kind", &g.kind);
    if let Some(address) = &g.address {
        e.str("address", address);
    }
    if let Some(sni) = &g.sni {
        e.str("sni", sni);
    }
    e.u64("bytes_up", g.bytes_up)
        .u64("bytes_down", g.bytes_down)
        .u64("start_ms", g.start_ms)
        .u64("end_ms", g.end_ms)
        .str("verdict", &g.verdict)
        .str("rule", &g.rule);
    if let Some(ended) = &g.ended {
        e.str("ended", ended);
    }
    e.finish()
}

/// A wall's nested encoding (docs/protocol.md, result field 14).
fn encode_wall(w: &Wall) -> Encoder {
    let mut e = Encoder::nested();
    e.u64("uid", u64::from(w.uid))
        .u64("euid", u64::from(w.euid))
        .u64("gid", u64::from(w.gid));
    e.list(
        "groups",
        w.groups
            .iter()
            .map(|g| u64::from(*g).to_be_bytes().to_vec()),
    );
    for (name, set) in [
        ("cap_inh", &w.cap_inh),
        ("cap_prm", &w.cap_prm),
        ("cap_eff", &w.cap_eff),
        ("cap_bnd", &w.cap_bnd),
        ("cap_amb", &w.cap_amb),
    ] {
        if let Some(v) = set {
            e.str(name, v);
        }
    }
    if let Some(n) = w.no_new_privs {
        e.bool("no_new_privs", n);
    }
    if let Some(m) = w.seccomp {
        e.u64("seccomp", u64::from(m));
    }
    e.list(
        "namespaces",
        w.namespaces.iter().map(|n| {
            let mut ne = Encoder::nested();
            ne.str("name", &n.name).str("id", &n.id);
            if let Some(same) = n.same_as_host {
                ne.bool("same_as_host", same);
            }
            ne.finish()
        }),
    );
    e.bool("root_read_only", w.root_read_only);
    e.list(
        "network_interfaces",
        w.network_interfaces.iter().map(|i| i.as_bytes().to_vec()),
    );
    if let Some(m) = w.memory_limit_bytes {
        e.u64("memory_limit_bytes", m);
    }
    if let Some(p) = w.pids_limit {
        e.u64("pids_limit", p);
    }
    e
}

/// SHA-256 of [`encode_result`].
pub fn result_sha256(r: &RunResult) -> String {
    sha256_hex(&encode_result(r))
}

/// SHA-256 of [`encode_result`] of what the code produced alone: the result without how its
/// sandbox started (`start`, `member_age_ms`) or what its wall was (`wall`), which every run
/// of the same request in a fresh sandbox changes. What a replay compares (plimsoll-attest).
/// The `egress` receipts stay in: they are what the code reached, not how its sandbox was
/// made, so two runs that reached different hosts (or the same at other times) differ.
pub fn outcome_sha256(r: &RunResult) -> String {
    result_sha256(&RunResult {
        start: None,
        member_age_ms: None,
        wall: None,
        ..r.clone()
    })
}

/// The record's digest encoding: every field but `record_sha256`.
pub fn encode_record(r: &RunRecord) -> Vec<u8> {
    let mut e = Encoder::with_domain(RECORD_DOMAIN);
    e.str("request_id", &r.request_id)
        .str("request_sha256", &r.request_sha256)
        .str("result_sha256", &r.result_sha256)
        .str("provider", &r.provider)
        .tier("isolation", r.isolation);
    if let Some(floor) = r.minimum_isolation {
        e.tier("minimum_isolation", floor);
    }
    e.str("evidence_sha256", &r.evidence_sha256)
        .str("environment", &r.environment)
        .u64("started_unix_ms", r.started_unix_ms)
        .u64("ended_unix_ms", r.ended_unix_ms);
    // Left out outside sessions, so every record written before sessions keeps its digest.
    if let Some(s) = &r.session {
        e.str("session_id", &s.session_id)
            .u64("sequence", s.sequence);
        if let Some(previous) = &s.previous_record_sha256 {
            e.str("previous_record_sha256", previous);
        }
    }
    // Left out at the process tier and in records written before images were named.
    if let Some(image) = &r.image {
        let mut ie = Encoder::nested();
        ie.str("name", &image.name).str("identity", &image.identity);
        e.nest("image", &ie);
    }
    // Left out when empty (every run without a trial step), so such a record keeps its digest.
    e.list("trials", r.trials.iter().map(encode_trial_step));
    // Left out for a session opened fresh (and outside sessions), so its records keep their
    // digests.
    if let Some(o) = r.session.as_ref().and_then(|s| s.origin.as_ref()) {
        let mut oe = Encoder::nested();
        oe.str("start", o.start.as_str())
            .str("snapshot_sha256", &o.snapshot_sha256)
            .str("parent_session_id", &o.parent_session_id);
        if let Some(parent) = &o.parent_record_sha256 {
            oe.str("parent_record_sha256", parent);
        }
        oe.u64("parent_calls", o.parent_calls);
        e.nest("origin", &oe);
    }
    e.finish()
}

/// A trial step's nested encoding (docs/protocol.md, record field 13).
fn encode_trial_step(s: &TrialStepRecord) -> Vec<u8> {
    let mut e = Encoder::nested();
    let mut sim = Encoder::nested();
    sim.str("name", &s.simulator.name)
        .str("version", &s.simulator.version)
        .str("sha256", &s.simulator.sha256);
    e.u64("step", u64::from(s.step))
        .nest("simulator", &sim)
        .bool("pass", s.pass);
    e.list(
        "trials",
        s.trials.iter().map(|t| {
            let mut te = Encoder::nested();
            if let Some(scenario) = &t.scenario {
                te.str("scenario", scenario);
            }
            te.str("end", t.end.as_str());
            if let Some(reason) = &t.reason {
                te.str("reason", reason);
            }
            te.u64("ticks", t.ticks);
            if let Some(score) = t.score {
                te.f64("score", score.get());
            }
            te.bool("pass", t.pass).str("fingerprint", &t.fingerprint);
            te.finish()
        }),
    );
    e.finish()
}

/// SHA-256 of [`encode_record`].
pub fn record_sha256(r: &RunRecord) -> String {
    sha256_hex(&encode_record(r))
}

/// The canonical JSON of evidence: object keys sorted by their UTF-8 bytes, no whitespace,
/// absent optional fields left out.
pub fn canonical_evidence_json(e: &Evidence) -> Vec<u8> {
    let value = serde_json::to_value(e).expect("evidence serialises");
    let mut out = Vec::new();
    write_canonical(&value, &mut out);
    out
}

/// Writes a JSON value compactly with every object's keys sorted. The sort is explicit: a
/// `Value`'s map is sorted only while no crate in the build turns on serde_json's
/// `preserve_order`, and the digest must not depend on which crates are linked.
fn write_canonical(value: &serde_json::Value, out: &mut Vec<u8>) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut members: Vec<_> = map.iter().collect();
            members.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (key, member)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, key).expect("a string serialises");
                out.push(b':');
                write_canonical(member, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        scalar => serde_json::to_writer(&mut *out, scalar).expect("a JSON scalar serialises"),
    }
}

/// SHA-256 of [`canonical_evidence_json`].
pub fn evidence_sha256(e: &Evidence) -> String {
    sha256_hex(&canonical_evidence_json(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_length_prefixed() {
        let mut e = Encoder::with_domain("d");
        e.str("a", "bc");
        assert_eq!(
            e.finish(),
            [
                &[0, 0, 0, 0, 0, 0, 0, 1][..],
                b"d",
                &[0, 0, 0, 0, 0, 0, 0, 1],
                b"a",
                &[0, 0, 0, 0, 0, 0, 0, 2],
                b"bc"
            ]
            .concat()
        );
    }

    #[test]
    fn empty_lists_are_left_out() {
        let mut e = Encoder::nested();
        e.list("xs", Vec::<Vec<u8>>::new());
        assert!(e.finish().is_empty());
    }

    #[test]
    fn evidence_json_is_canonical() {
        let ev = Evidence {
            provider: "p".into(),
            isolation: Tier::Process,
            config: [
                ("z".to_string(), "1".to_string()),
                ("a".to_string(), "2".to_string()),
            ]
            .into(),
            binaries: vec![],
            probe: None,
            checks: Default::default(),
            environment: "e".into(),
            checked_unix_ms: 5,
        };
        let json = String::from_utf8(canonical_evidence_json(&ev)).unwrap();
        assert_eq!(
            json,
            r#"{"binaries":[],"checked_unix_ms":5,"checks":{},"config":{"a":"2","z":"1"},"environment":"e","isolation":"process","provider":"p"}"#
        );
    }
}
