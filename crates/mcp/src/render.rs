//! Tool results for a model: the run's response as structured content (JSON) and as text,
//! with each output stream capped for a model's context and bytes that are not UTF-8 kept
//! exactly (base64) rather than mangled.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use plimsoll_wire::{ProvidersResponse, Reason, RunResponse, StepResult, Tier};
use serde_json::{Value, json};

use crate::backend::BackendError;

/// Bytes of each output stream (and each artifact) shown to the model unless configured
/// otherwise: 64 KiB.
pub const DEFAULT_OUTPUT_CAP: usize = 64 * 1024;

/// One stream or artifact, as shown: at most `cap` bytes, as text when they are UTF-8 and
/// as base64 otherwise.
fn shown(bytes: &[u8], cap: usize) -> (Value, usize, bool) {
    let mut take = bytes.len().min(cap);
    let capped = take < bytes.len();
    // A cut inside a multi-byte character would turn text into "not UTF-8": cut before it.
    if capped
        && let Err(e) = std::str::from_utf8(&bytes[..take])
        && e.error_len().is_none()
        && std::str::from_utf8(&bytes[e.valid_up_to()..]).is_ok()
    {
        take = e.valid_up_to();
    }
    let part = &bytes[..take];
    let value = match std::str::from_utf8(part) {
        Ok(text) => json!({"encoding": "utf-8", "text": text}),
        Err(_) => json!({"encoding": "base64", "base64": STANDARD.encode(part)}),
    };
    (value, take, capped)
}

/// A stream's structured form: what is shown, how many bytes the run produced, and both
/// truncation flags (the sandbox's output limit, and this cap).
fn stream(bytes: &[u8], sandbox_truncated: bool, cap: usize) -> Value {
    let (mut value, shown_bytes, capped) = shown(bytes, cap);
    let obj = value.as_object_mut().expect("an object");
    obj.insert("bytes".into(), json!(bytes.len()));
    obj.insert("shown_bytes".into(), json!(shown_bytes));
    obj.insert("truncated".into(), json!(sandbox_truncated || capped));
    obj.insert("truncated_by_sandbox".into(), json!(sandbox_truncated));
    obj.insert("truncated_for_context".into(), json!(capped));
    value
}

fn step(s: &StepResult, cap: usize) -> Value {
    json!({
        "name": s.name,
        "exit_code": s.exit_code,
        "signal": s.signal,
        "timed_out": s.timed_out,
        "oom_killed": s.oom_killed,
        "duration_ms": s.duration_ms,
        "stdout": stream(s.stdout.as_slice(), s.stdout_truncated, cap),
        "stderr": stream(s.stderr.as_slice(), s.stderr_truncated, cap),
    })
}

/// What a run that happened returns, structured.
pub fn run_structured(resp: &RunResponse, cap: usize) -> Value {
    let r = &resp.result;
    let mut v = json!({
        "status": "ran",
        "request_id": resp.request_id,
        "provider": resp.provider,
        "isolation": resp.isolation,
        "exit_code": r.exit_code,
        "signal": r.signal,
        "timed_out": r.timed_out,
        "oom_killed": r.oom_killed,
        "duration_ms": resp.duration_ms,
        "stdout": stream(r.stdout.as_slice(), r.stdout_truncated, cap),
        "stderr": stream(r.stderr.as_slice(), r.stderr_truncated, cap),
        "request_sha256": resp.request_sha256,
        "result_sha256": resp.result_sha256,
        "record_sha256": resp.record.record_sha256,
        "record": resp.record,
    });
    let obj = v.as_object_mut().expect("an object");
    if !r.steps.is_empty() {
        obj.insert(
            "steps".into(),
            r.steps.iter().map(|s| step(s, cap)).collect(),
        );
    }
    if !r.artifacts.is_empty() {
        let artifacts: Vec<Value> = r
            .artifacts
            .iter()
            .map(|a| {
                let mut v = stream(a.content.as_slice(), a.truncated, cap);
                let o = v.as_object_mut().expect("an object");
                o.insert("path".into(), json!(a.path));
                o.insert("found".into(), json!(a.found));
                o.insert("size".into(), json!(a.size));
                v
            })
            .collect();
        obj.insert("artifacts".into(), artifacts.into());
    }
    if !r.calls.is_empty() {
        obj.insert("calls".into(), json!(r.calls));
    }
    if let Some(start) = r.start {
        obj.insert("start".into(), json!(start));
    }
    if let Some(age) = r.member_age_ms {
        obj.insert("member_age_ms".into(), json!(age));
    }
    if let Some(wall) = &r.wall {
        obj.insert("wall".into(), json!(wall));
    }
    v
}

fn tier_note(t: Tier) -> &'static str {
    match t {
        Tier::Process => "a hardened process: no wall at the OS level",
        Tier::Container => "a container: the shared host kernel is the wall",
        Tier::Kernel => "a user-space kernel or emulator between the code and the host kernel",
        Tier::Vm => "hardware virtualisation",
    }
}

fn text_of(label: &str, v: &Value) -> String {
    let bytes = v["bytes"].as_u64().unwrap_or(0);
    let shown = v["shown_bytes"].as_u64().unwrap_or(0);
    let mut head = format!("{label} ({bytes} bytes");
    if v["truncated_by_sandbox"].as_bool() == Some(true) {
        head.push_str(", cut at the sandbox's output limit");
    }
    if v["truncated_for_context"].as_bool() == Some(true) {
        head.push_str(&format!(", first {shown} shown"));
    }
    match v["encoding"].as_str() {
        Some("base64") => format!(
            "{head}, not UTF-8, base64):\n{}\n",
            v["base64"].as_str().unwrap_or("")
        ),
        _ => {
            let text = v["text"].as_str().unwrap_or("");
            if text.is_empty() {
                format!("{head}): (empty)\n")
            } else {
                let nl = if text.ends_with('\n') { "" } else { "\n" };
                format!("{head}):\n{text}{nl}")
            }
        }
    }
}

fn ending(v: &Value) -> String {
    let mut s = match (v["exit_code"].as_i64(), v["signal"].as_i64()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        (None, None) => "no exit code".to_owned(),
    };
    if v["timed_out"].as_bool() == Some(true) {
        s.push_str(", timed out (the sandbox was killed at the time limit)");
    }
    if v["oom_killed"].as_bool() == Some(true) {
        s.push_str(", killed at the memory limit");
    }
    s
}

/// The text rendering of [`run_structured`]'s value.
pub fn run_text(resp: &RunResponse, v: &Value) -> String {
    let mut out = format!(
        "ran on provider {} at isolation {} ({}): {}, {} ms\n",
        resp.provider,
        resp.isolation,
        tier_note(resp.isolation),
        ending(v),
        resp.duration_ms
    );
    if let Some(steps) = v["steps"].as_array() {
        for (i, s) in steps.iter().enumerate() {
            let name = s["name"]
                .as_str()
                .map(|n| format!(" `{n}`"))
                .unwrap_or_default();
            out.push_str(&format!("step {}{name}: {}\n", i + 1, ending(s)));
        }
    }
    out.push_str(&text_of("stdout", &v["stdout"]));
    out.push_str(&text_of("stderr", &v["stderr"]));
    if let Some(artifacts) = v["artifacts"].as_array() {
        for a in artifacts {
            let path = a["path"].as_str().unwrap_or("");
            if a["found"].as_bool() == Some(true) {
                out.push_str(&text_of(&format!("artifact {path}"), a));
            } else {
                out.push_str(&format!("artifact {path}: not found\n"));
            }
        }
    }
    if let Some(calls) = v["calls"].as_array() {
        out.push_str(&format!(
            "{} call(s) through the grant's broker\n",
            calls.len()
        ));
    }
    out.push_str(&format!(
        "request_sha256 {}\nresult_sha256 {}\nrecord_sha256 {}\n",
        resp.request_sha256, resp.result_sha256, resp.record.record_sha256
    ));
    out
}

/// What to do about a refusal, by reason: every one of them is safe to retry, since
/// nothing ran, but most need something changed first.
fn retry_hint(reason: Reason) -> &'static str {
    match reason {
        Reason::Isolation => {
            "no available provider meets the floor: retry with a lower min_isolation only if the code is safe at that tier, or call list_providers"
        }
        Reason::Capacity => "the sandbox is busy: wait a moment and retry unchanged",
        Reason::Request => "fix the arguments and retry",
        Reason::Permission => {
            "this caller may not do that (token or grant): retry only after that changes"
        }
        Reason::Unsupported => "no provider can run this kind of request: change the request",
        Reason::Environment => {
            "a provider's environment is not ready: retry later, or name another provider"
        }
        Reason::Protocol => "the protocol version is not served: update the client",
    }
}

/// A tool error, structured and as text: a refusal says nothing ran and that a retry is
/// safe; any other failure says the code may have run.
pub fn error(e: &BackendError) -> (Value, String) {
    match e {
        BackendError::NotDispatched { reason, message } => {
            let hint = retry_hint(*reason);
            (
                json!({
                    "status": "not_dispatched",
                    "reason": reason,
                    "message": message,
                    "nothing_ran": true,
                    "retry_safe": true,
                    "what_to_do": hint,
                }),
                format!(
                    "not dispatched ({reason}): nothing ran, so a retry is safe. {message}. What to do: {hint}."
                ),
            )
        }
        BackendError::MayHaveRun { message } => (
            json!({
                "status": "may_have_run",
                "message": message,
                "nothing_ran": false,
                "retry_safe": false,
            }),
            format!(
                "the code may have run, but no verified result came back: {message}. Do not retry blindly: a retry may run it twice."
            ),
        ),
    }
}

/// The providers listing, structured (evidence summarised: the full evidence is large) and
/// as text.
pub fn providers(resp: &ProvidersResponse) -> (Value, String) {
    let list: Vec<Value> = resp
        .providers
        .iter()
        .map(|p| {
            json!({
                "name": p.name,
                "isolation": p.isolation,
                "available": p.available,
                "unavailable_reason": p.unavailable_reason,
                "evidence_sha256": p.evidence_sha256,
                "environment": p.evidence.environment,
            })
        })
        .collect();
    let mut text = format!(
        "default floor: {} (runs that set no min_isolation need at least this tier)\n",
        resp.default_floor
    );
    for p in &resp.providers {
        let state = match (&p.available, &p.unavailable_reason) {
            (true, _) => "available".to_owned(),
            (false, Some(why)) => format!("unavailable: {why}"),
            (false, None) => "unavailable".to_owned(),
        };
        text.push_str(&format!(
            "{}: isolation {} ({}), {state}\n",
            p.name,
            p.isolation,
            tier_note(p.isolation)
        ));
    }
    (
        json!({"default_floor": resp.default_floor, "providers": list}),
        text,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_says_how_its_sandbox_started() {
        use plimsoll_wire::{PROTOCOL, RunRecord, RunResult, Start};
        let resp = |start, member_age_ms| RunResponse {
            protocol: PROTOCOL,
            request_id: "r-1".into(),
            provider: "process".into(),
            isolation: Tier::Process,
            duration_ms: 1,
            request_sha256: String::new(),
            result_sha256: String::new(),
            result: RunResult {
                start,
                member_age_ms,
                ..RunResult::default()
            },
            record: RunRecord {
                request_id: "r-1".into(),
                request_sha256: String::new(),
                result_sha256: String::new(),
                provider: "process".into(),
                isolation: Tier::Process,
                minimum_isolation: Some(Tier::Process),
                evidence_sha256: String::new(),
                environment: String::new(),
                started_unix_ms: 0,
                ended_unix_ms: 1,
                record_sha256: String::new(),
                session: None,
            },
        };
        let warm = run_structured(&resp(Some(Start::Warm), Some(1500)), 64);
        assert_eq!(
            (&warm["start"], &warm["member_age_ms"]),
            (&json!("warm"), &json!(1500))
        );
        let cold = run_structured(&resp(Some(Start::Cold), None), 64);
        assert_eq!(cold["start"], "cold");
        assert!(cold.get("member_age_ms").is_none());
        let older = run_structured(&resp(None, None), 64);
        assert!(older.get("start").is_none() && older.get("member_age_ms").is_none());
        assert!(older.get("wall").is_none());
        let mut walled = resp(Some(Start::Cold), None);
        walled.result.wall = Some(plimsoll_wire::Wall {
            uid: 2000,
            euid: 2000,
            gid: 2000,
            seccomp: Some(2),
            ..plimsoll_wire::Wall::default()
        });
        let walled = run_structured(&walled, 64);
        assert_eq!(
            (&walled["wall"]["uid"], &walled["wall"]["seccomp"]),
            (&json!(2000), &json!(2))
        );
    }

    #[test]
    fn streams_over_the_cap_are_cut_and_flagged() {
        let v = stream(b"abcdef", false, 4);
        assert_eq!(v["text"], "abcd");
        assert_eq!(v["bytes"], 6);
        assert_eq!(v["shown_bytes"], 4);
        assert_eq!(v["truncated"], true);
        assert_eq!(v["truncated_for_context"], true);
        assert_eq!(v["truncated_by_sandbox"], false);
        let v = stream(b"ab", true, 4);
        assert_eq!(v["truncated"], true);
        assert_eq!(v["truncated_for_context"], false);
    }

    #[test]
    fn a_cut_never_splits_a_character() {
        // "é" is two bytes; a cap of 2 falls inside it.
        let v = stream("aé".as_bytes(), false, 2);
        assert_eq!(v["encoding"], "utf-8");
        assert_eq!(v["text"], "a");
        assert_eq!(v["shown_bytes"], 1);
    }

    #[test]
    fn bytes_that_are_not_utf8_come_back_exactly() {
        let raw = [0x66, 0xff, 0x00, 0xc3];
        let v = stream(&raw, false, 64);
        assert_eq!(v["encoding"], "base64");
        assert_eq!(STANDARD.decode(v["base64"].as_str().unwrap()).unwrap(), raw);
        assert!(text_of("stdout", &v).contains("not UTF-8, base64"));
    }

    #[test]
    fn a_refusal_says_nothing_ran_and_a_failure_says_it_may_have() {
        let (v, text) = error(&BackendError::NotDispatched {
            reason: Reason::Isolation,
            message: "no provider at vm".into(),
        });
        assert!(
            text.starts_with("not dispatched (isolation): nothing ran"),
            "{text}"
        );
        assert!(text.contains("retry is safe"));
        assert_eq!(v["retry_safe"], true);
        let (v, text) = error(&BackendError::MayHaveRun {
            message: "connection reset".into(),
        });
        assert!(text.contains("may have run"), "{text}");
        assert_eq!(v["retry_safe"], false);
    }
}
