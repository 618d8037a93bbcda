//! Tool results for a model: the run's response (or a session's) as structured content
//! (JSON) and as text, with each output stream capped for a model's context and bytes that
//! are not UTF-8 kept exactly (base64) rather than mangled.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use plimsoll_wire::{
    EgressReceipt, ProvidersResponse, Reason, RunResponse, SessionInfo, SessionList, SessionOrigin,
    SessionStart, SnapshotInfo, SnapshotList, StepResult, Tier,
};
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
    if !r.egress.is_empty() {
        obj.insert("egress".into(), json!(r.egress));
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
    if let Some(kept) = r.state_kept {
        obj.insert("state_kept".into(), json!(kept));
    }
    if let Some(end) = r.interpreter_end {
        obj.insert("interpreter_end".into(), json!(end));
    }
    if let Some(link) = &resp.record.session {
        let mut session = json!({
            "session_id": link.session_id,
            "sequence": link.sequence,
            "previous_record_sha256": link.previous_record_sha256,
        });
        if let Some(origin) = &link.origin {
            session
                .as_object_mut()
                .expect("an object")
                .insert("origin".into(), json!(origin));
        }
        obj.insert("session".into(), session);
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
    if let Some(image) = &resp.record.image {
        out.push_str(&format!("image: {} ({})\n", image.name, image.identity));
    }
    for t in &resp.record.trials {
        for line in t.describe() {
            out.push_str(&line);
            out.push('\n');
        }
    }
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
    out.push_str(&grant_lines(resp));
    out.push_str(&session_lines(v));
    out.push_str(&format!(
        "request_sha256 {}\nresult_sha256 {}\nrecord_sha256 {}\n",
        resp.request_sha256, resp.result_sha256, resp.record.record_sha256
    ));
    out
}

/// What the run's grant saw: how many calls went through the broker, and each connection
/// attempt through the egress proxy, one line each. In a session, those since the call before.
fn grant_lines(resp: &RunResponse) -> String {
    let r = &resp.result;
    let mut out = String::new();
    if !r.calls.is_empty() {
        out.push_str(&format!(
            "{} call(s) through the grant's broker\n",
            r.calls.len()
        ));
    }
    if !r.egress.is_empty() {
        out.push_str(&format!(
            "{} connection attempt(s) through the egress grant's proxy:\n",
            r.egress.len()
        ));
        for e in &r.egress {
            out.push_str("  ");
            out.push_str(&egress_line(e));
            out.push('\n');
        }
    }
    out
}

/// `s` with control characters escaped: a host or server name is whatever the sandboxed code
/// sent, and must not break a line.
fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// One egress receipt: what was decided, where the code asked to go, where the broker went,
/// what crossed, and how it ended.
fn egress_line(e: &EgressReceipt) -> String {
    let target = match &e.address {
        Some(a) => format!("connected to {}", printable(a)),
        None => "nothing connected".to_owned(),
    };
    let sni = e
        .sni
        .as_deref()
        .map(|n| format!(", TLS server name {}", printable(n)))
        .unwrap_or_default();
    let ended = e
        .ended
        .as_deref()
        .map(|x| format!(", ended {}", printable(x)))
        .unwrap_or_default();
    format!(
        "{} {} {}:{}: {target}{sni}, {} bytes up, {} bytes down, {}-{} ms, rule {}{ended}",
        printable(&e.verdict),
        printable(&e.kind),
        printable(&e.host),
        e.port,
        e.bytes_up,
        e.bytes_down,
        e.start_ms,
        e.end_ms,
        printable(&e.rule),
    )
}

/// A session call's place in its session and, for a cell, what became of the interpreter.
fn session_lines(v: &Value) -> String {
    let mut out = String::new();
    if let Some(link) = v.get("session") {
        out.push_str(&format!(
            "session {}, call {}\n",
            link["session_id"].as_str().unwrap_or(""),
            link["sequence"]
        ));
        if let Some(origin) = link
            .get("origin")
            .and_then(|o| serde_json::from_value::<SessionOrigin>(o.clone()).ok())
        {
            out.push_str(&origin_line(&origin));
        }
    }
    match (v["state_kept"].as_bool(), v["interpreter_end"].as_str()) {
        (_, Some(end)) => out.push_str(&format!(
            "the interpreter ended during this cell ({end}): its state is lost; the next run_cell must set restart=true\n"
        )),
        (Some(true), None) => out.push_str(
            "state kept: this cell ran in the session's interpreter, whose variables, imports and functions carry on to the next cell\n",
        ),
        (Some(false), None) => out.push_str(
            "state not kept: this cell ran in a fresh interpreter (restart); what earlier cells defined is gone\n",
        ),
        (None, None) => {}
    }
    out
}

/// What an open (or closed) session is, structured: its id, where it runs and how strong
/// that is, the evidence it was opened on, and when it ends.
pub fn session_structured(info: &SessionInfo) -> Value {
    let mut v = json!({
        "status": if info.end_reason.is_some() { "ended" } else { "open" },
        "session_id": info.session_id,
        "language": info.language,
        "provider": info.provider,
        "isolation": info.isolation,
        "minimum_isolation": info.minimum_isolation,
        "evidence_sha256": info.evidence_sha256,
        "environment": info.environment,
        "image": info.image,
        "opened_unix_ms": info.opened_unix_ms,
        "expires_unix_ms": info.expires_unix_ms,
        "idle_timeout_ms": info.idle_timeout_ms,
        "calls": info.calls,
        "interpreter_alive": info.interpreter_alive,
        "wall": info.wall,
    });
    let obj = v.as_object_mut().expect("an object");
    if let Some(last) = &info.last_record_sha256 {
        obj.insert("last_record_sha256".into(), json!(last));
    }
    if let Some(end) = info.end_reason {
        obj.insert("end_reason".into(), json!(end));
    }
    if let Some(origin) = &info.origin {
        obj.insert("origin".into(), json!(origin));
    }
    v
}

/// Where a restored or forked session came from, as one line of text.
fn origin_line(o: &SessionOrigin) -> String {
    let how = match o.start {
        SessionStart::Restored => "restored from a snapshot of",
        SessionStart::Forked => "forked from",
    };
    format!(
        "{how} session {parent} after its call {calls} (snapshot sha256 {sha}): it began with that session's state then, and its calls go on from sequence {next}\n",
        parent = o.parent_session_id,
        calls = o.parent_calls,
        sha = o.snapshot_sha256,
        next = o.parent_calls + 1,
    )
}

fn secs(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{ms} ms")
    }
}

/// The answer to `open_session`, structured and as text; `grant` is the grant profile the
/// open named (the daemon refuses an open whose grant it will not give, so an open session
/// holds it).
pub fn session_opened(info: &SessionInfo, grant: Option<&str>) -> (Value, String) {
    let held = grant
        .map(|g| {
            format!(
                "it holds grant {g} for its whole life: each call's result lists the grant's calls (calls) and connection attempts (egress) since the call before\n"
            )
        })
        .unwrap_or_default();
    let text = format!(
        "opened session {id} ({lang}) on provider {p} at isolation {t} ({note}), floor {floor}\n\
         it ends after {idle} without a call, or at unix ms {exp} ({life} after it opened), whichever comes first\n\
         {held}\
         evidence_sha256 {ev}\n\
         use this session_id with run_cell, run_session_steps, write_session_file and read_session_file; close_session when done\n",
        id = info.session_id,
        lang = info.language.as_str(),
        p = info.provider,
        t = info.isolation,
        note = tier_note(info.isolation),
        floor = info.minimum_isolation,
        idle = secs(info.idle_timeout_ms),
        exp = info.expires_unix_ms,
        life = secs(info.expires_unix_ms.saturating_sub(info.opened_unix_ms)),
        ev = info.evidence_sha256,
    );
    let mut v = session_structured(info);
    if let Some(g) = grant {
        v.as_object_mut()
            .expect("an object")
            .insert("grant".into(), json!(g));
    }
    (v, text)
}

/// The answer to `close_session`, structured and as text.
pub fn session_closed(info: &SessionInfo) -> (Value, String) {
    let last = info
        .last_record_sha256
        .as_deref()
        .map(|d| format!(", last record_sha256 {d}"))
        .unwrap_or_default();
    let text = format!(
        "closed session {} after {} call(s){last}: its sandbox and everything in it are gone\n",
        info.session_id, info.calls
    );
    (session_structured(info), text)
}

/// The answer to `list_sessions`, structured and as text.
pub fn session_list(list: &SessionList) -> (Value, String) {
    let mut text = format!("{} open session(s)\n", list.sessions.len());
    for s in &list.sessions {
        text.push_str(&format!(
            "{}: {} on provider {} at isolation {}, {} call(s), interpreter {}, idle timeout {}, expires at unix ms {}\n",
            s.session_id,
            s.language.as_str(),
            s.provider,
            s.isolation,
            s.calls,
            if s.interpreter_alive {
                "alive"
            } else {
                "ended (the next run_cell must set restart=true)"
            },
            secs(s.idle_timeout_ms),
            s.expires_unix_ms
        ));
        if let Some(o) = &s.origin {
            text.push_str("  ");
            text.push_str(&origin_line(o));
        }
    }
    let sessions: Vec<Value> = list.sessions.iter().map(session_structured).collect();
    (json!({"sessions": sessions}), text)
}

/// A snapshot, structured: its id and digest, the session it was taken of and that
/// session's place in its chain then, where it runs, its size and when it expires.
pub fn snapshot_structured(snap: &SnapshotInfo) -> Value {
    json!({
        "snapshot_id": snap.snapshot_id,
        "session_id": snap.session_id,
        "sha256": snap.sha256,
        "bytes": snap.bytes,
        "provider": snap.provider,
        "isolation": snap.isolation,
        "language": snap.language,
        "calls": snap.calls,
        "last_record_sha256": snap.last_record_sha256,
        "checkpoint_ms": snap.checkpoint_ms,
        "created_unix_ms": snap.created_unix_ms,
        "expires_unix_ms": snap.expires_unix_ms,
    })
}

/// One snapshot as a line of text.
fn snapshot_line(snap: &SnapshotInfo) -> String {
    format!(
        "snapshot {id} of session {sid} after its call {calls}: {lang} on provider {p} at isolation {t}, {bytes} bytes, sha256 {sha}, expires at unix ms {exp}\n",
        id = snap.snapshot_id,
        sid = snap.session_id,
        calls = snap.calls,
        lang = snap.language.as_str(),
        p = snap.provider,
        t = snap.isolation,
        bytes = snap.bytes,
        sha = snap.sha256,
        exp = snap.expires_unix_ms,
    )
}

/// The answer to `snapshot_session`, structured and as text.
pub fn snapshot_taken(snap: &SnapshotInfo) -> (Value, String) {
    let mut v = snapshot_structured(snap);
    v.as_object_mut()
        .expect("an object")
        .insert("status".into(), json!("taken"));
    let text = format!(
        "took {line}the session was paused {ms} ms while it was saved and goes on; open_snapshot with this snapshot_id opens a new session restored from it (its state as it is now); delete_snapshot when done\n",
        line = snapshot_line(snap),
        ms = snap.checkpoint_ms,
    );
    (v, text)
}

/// The answer to `fork_session`: the snapshot the copies were restored from and the copies
/// (structured and as text), each saying it was forked from the session.
pub fn forked(snap: &SnapshotInfo, copies: &[SessionInfo]) -> (Value, String) {
    let ids: Vec<&str> = copies.iter().map(|c| c.session_id.as_str()).collect();
    let v = json!({
        "status": "forked",
        "session_id": snap.session_id,
        "session_ids": ids,
        "sessions": copies.iter().map(session_structured).collect::<Vec<Value>>(),
        "snapshot": snapshot_structured(snap),
    });
    let mut text = format!(
        "forked session {} into {} new session(s), each restored from one snapshot of it and given fresh randomness:\n",
        snap.session_id,
        copies.len()
    );
    for c in copies {
        text.push_str(&format!(
            "{} on provider {} at isolation {}\n",
            c.session_id, c.provider, c.isolation
        ));
        if let Some(o) = &c.origin {
            text.push_str("  ");
            text.push_str(&origin_line(o));
        }
    }
    text.push_str(&format!(
        "use each session_id as any session's, and close_session each when done; session {} goes on. The snapshot stays until it expires or delete_snapshot removes it: {}",
        snap.session_id,
        snapshot_line(snap)
    ));
    (v, text)
}

/// The answer to `open_snapshot`: the new session (structured as `open_session`'s, with its
/// `origin`) and, as text, where it came from.
pub fn snapshot_opened(info: &SessionInfo, snapshot_id: &str) -> (Value, String) {
    let mut v = session_structured(info);
    v.as_object_mut()
        .expect("an object")
        .insert("snapshot_id".into(), json!(snapshot_id));
    let origin = info
        .origin
        .as_ref()
        .map(origin_line)
        .unwrap_or_else(|| "no origin came with it: treat it as a fresh session\n".to_owned());
    let text = format!(
        "opened session {id} ({lang}) from snapshot {snapshot_id} on provider {p} at isolation {t} ({note})\n\
         {origin}\
         it ends after {idle} without a call, or at unix ms {exp}, whichever comes first\n\
         evidence_sha256 {ev}\n\
         use this session_id with run_cell, run_session_steps, write_session_file and read_session_file; close_session when done\n",
        id = info.session_id,
        lang = info.language.as_str(),
        p = info.provider,
        t = info.isolation,
        note = tier_note(info.isolation),
        idle = secs(info.idle_timeout_ms),
        exp = info.expires_unix_ms,
        ev = info.evidence_sha256,
    );
    (v, text)
}

/// The answer to `list_snapshots`, structured and as text.
pub fn snapshot_list(list: &SnapshotList) -> (Value, String) {
    let mut text = format!("{} snapshot(s)\n", list.snapshots.len());
    for snap in &list.snapshots {
        text.push_str(&snapshot_line(snap));
    }
    let snapshots: Vec<Value> = list.snapshots.iter().map(snapshot_structured).collect();
    (json!({"snapshots": snapshots}), text)
}

/// The answer to `delete_snapshot`, structured and as text.
pub fn snapshot_deleted(snap: &SnapshotInfo) -> (Value, String) {
    let mut v = snapshot_structured(snap);
    v.as_object_mut()
        .expect("an object")
        .insert("status".into(), json!("deleted"));
    let text = format!(
        "deleted snapshot {} of session {}: its files are gone and it cannot be opened again; sessions opened or forked from it go on\n",
        snap.snapshot_id, snap.session_id
    );
    (v, text)
}

/// The answer to `write_session_file`: the call's run facts, the path and the bytes written.
pub fn file_written(resp: &RunResponse, path: &str, bytes: usize, cap: usize) -> (Value, String) {
    let mut v = run_structured(resp, cap);
    let obj = v.as_object_mut().expect("an object");
    obj.insert("path".into(), json!(path));
    obj.insert("bytes_written".into(), json!(bytes));
    let text = format!(
        "wrote {bytes} bytes to /work/{path} on provider {} at isolation {} ({})\n{}{}request_sha256 {}\nresult_sha256 {}\nrecord_sha256 {}\n",
        resp.provider,
        resp.isolation,
        tier_note(resp.isolation),
        grant_lines(resp),
        session_lines(&v),
        resp.request_sha256,
        resp.result_sha256,
        resp.record.record_sha256
    );
    (v, text)
}

/// The answer to `read_session_file`: the call's run facts and the file (`found`, `size`,
/// its content capped and shown as a stream is).
pub fn file_read(resp: &RunResponse, path: &str, cap: usize) -> (Value, String) {
    let mut v = run_structured(resp, cap);
    let file = resp.result.artifacts.first();
    let content = file
        .filter(|a| a.found)
        .map(|a| stream(a.content.as_slice(), a.truncated, cap));
    let obj = v.as_object_mut().expect("an object");
    obj.remove("artifacts");
    obj.insert("path".into(), json!(path));
    obj.insert("found".into(), json!(content.is_some()));
    obj.insert(
        "size".into(),
        json!(file.filter(|a| a.found).map(|a| a.size)),
    );
    let head = format!(
        "read on provider {} at isolation {} ({})\n",
        resp.provider,
        resp.isolation,
        tier_note(resp.isolation)
    );
    let body = match &content {
        Some(c) => text_of(&format!("/work/{path}"), c),
        None => format!("/work/{path}: not found (no such file)\n"),
    };
    if let Some(c) = content {
        obj.insert("content".into(), c);
    }
    let text = format!(
        "{head}{body}{}{}request_sha256 {}\nresult_sha256 {}\nrecord_sha256 {}\n",
        grant_lines(resp),
        session_lines(&v),
        resp.request_sha256,
        resp.result_sha256,
        resp.record.record_sha256
    );
    (v, text)
}

/// What to do about a session refusal, by its wire code; `None` for codes a reason covers.
fn session_hint(code: &str) -> Option<&'static str> {
    Some(match code {
        "session_not_found" => {
            "this caller has no session with this id (a typo, another caller's, forgotten long ago, or opened before the server restarted): call list_sessions, or open a new one with open_session"
        }
        "session_ended" => {
            "the session has ended and its state is gone (a session is never re-created): open a new one with open_session and rebuild what you need"
        }
        "interpreter_ended" => {
            "the session's interpreter ended (see its last cell's interpreter_end) and its state is lost: send the cell again with restart=true, which starts a fresh interpreter, after re-running what it needs"
        }
        "snapshot_not_found" => {
            "this caller has no snapshot with this id (a typo, another caller's, expired, deleted, or taken before the daemon restarted): call list_snapshots, or take one with snapshot_session"
        }
        "sandbox_changed" => {
            "the session's sandbox no longer matched what it was at open, so the session ended: open a new one with open_session"
        }
        _ => return None,
    })
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
        BackendError::NotDispatched {
            reason,
            code,
            end_reason,
            message,
        } => {
            let hint = code
                .as_deref()
                .and_then(session_hint)
                .unwrap_or_else(|| retry_hint(*reason));
            let mut v = json!({
                "status": "not_dispatched",
                "reason": reason,
                "message": message,
                "nothing_ran": true,
                "retry_safe": true,
                "what_to_do": hint,
            });
            let obj = v.as_object_mut().expect("an object");
            let mut coded = String::new();
            if let Some(code) = code {
                obj.insert("code".into(), json!(code));
                coded = format!(" Code {code}");
                if let Some(end) = end_reason {
                    obj.insert("end_reason".into(), json!(end));
                    coded.push_str(&format!(" (the session ended: {end})"));
                }
                coded.push('.');
            }
            (
                v,
                format!(
                    "not dispatched ({reason}): nothing ran, so a retry is safe.{coded} {message}. What to do: {hint}."
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
    for i in &resp.images {
        let languages: Vec<&str> = i.languages.iter().map(|l| l.as_str()).collect();
        text.push_str(&format!(
            "image {}{}: {}, starts {}{}\n",
            i.name,
            if i.default { " (default)" } else { "" },
            i.identity,
            if languages.is_empty() {
                "no interpreter".to_owned()
            } else {
                languages.join(", ")
            },
            if i.vm_disk {
                ""
            } else {
                "; not at qemu (no VM disk)"
            }
        ));
    }
    (
        json!({"default_floor": resp.default_floor, "providers": list, "images": resp.images}),
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
                image: None,
                trials: Vec::new(),
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
        // A trial's verdict, as the record carries it, is in the structured answer (the
        // record) and in the text.
        let mut trial = resp(Some(Start::Cold), None);
        trial.record.trials = vec![
            plimsoll_wire::TrialStepRecord::from_verdict(
                0,
                br#"{"format":"plimsoll-trial-verdict/2","simulator":{"name":"tank","version":"1.0.0","sha256":"13c2223554b98ae11287cb35162fe29ff453cd14372bf1d41080fa784d3410c8"},"pass":false,"trials":[{"name":"hidden-1","end_reason":"failed","detail":"the tank overflowed (level above 2 m)","pass":false,"ticks":92,"score":0,"fingerprint":"3c73854a54403c73854a54403c73854a54403c73854a54403c73854a54403c73"}]}"#,
            )
            .unwrap(),
        ];
        let v = run_structured(&trial, 64);
        assert_eq!(v["record"]["trials"][0]["simulator"]["name"], "tank");
        let text = run_text(&trial, &v);
        assert!(
            text.contains("trial step 1: simulator tank 1.0.0 (sha256 13c2223554b9): FAILED\n")
                && text.contains("hidden-1: failed after 92 ticks (the tank overflowed"),
            "{text}"
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
        let (v, text) = error(&BackendError::refused(
            Reason::Isolation,
            "no provider at vm",
        ));
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

    fn session_response(result: plimsoll_wire::RunResult, sequence: u64) -> RunResponse {
        use plimsoll_wire::{PROTOCOL, RunRecord, SessionLink};
        RunResponse {
            protocol: PROTOCOL,
            request_id: "r-2".into(),
            provider: "crun".into(),
            isolation: Tier::Container,
            duration_ms: 3,
            request_sha256: "a".repeat(64),
            result_sha256: "b".repeat(64),
            result,
            record: RunRecord {
                image: None,
                trials: Vec::new(),
                request_id: "r-2".into(),
                request_sha256: "a".repeat(64),
                result_sha256: "b".repeat(64),
                provider: "crun".into(),
                isolation: Tier::Container,
                minimum_isolation: Some(Tier::Container),
                evidence_sha256: "e".repeat(64),
                environment: "image".into(),
                started_unix_ms: 0,
                ended_unix_ms: 3,
                record_sha256: "c".repeat(64),
                session: Some(SessionLink {
                    session_id: "ses_1".into(),
                    sequence,
                    previous_record_sha256: (sequence > 1).then(|| "d".repeat(64)),
                    origin: None,
                }),
            },
        }
    }

    #[test]
    fn a_cell_says_its_place_in_the_session_and_what_became_of_the_interpreter() {
        use plimsoll_wire::{EndReason, RunResult};
        let kept = session_response(
            RunResult {
                exit_code: Some(0),
                stdout: b"2\n".to_vec().into(),
                state_kept: Some(true),
                ..RunResult::default()
            },
            2,
        );
        let v = run_structured(&kept, 64);
        assert_eq!(v["state_kept"], true);
        assert!(v.get("interpreter_end").is_none());
        assert_eq!(
            v["session"],
            json!({"session_id": "ses_1", "sequence": 2, "previous_record_sha256": "d".repeat(64)})
        );
        let text = run_text(&kept, &v);
        assert!(text.contains("session ses_1, call 2"), "{text}");
        assert!(text.contains("state kept"), "{text}");

        let crashed = session_response(
            RunResult {
                exit_code: Some(3),
                state_kept: Some(false),
                interpreter_end: Some(EndReason::InterpreterCrash),
                ..RunResult::default()
            },
            3,
        );
        let v = run_structured(&crashed, 64);
        assert_eq!(
            (&v["state_kept"], &v["interpreter_end"]),
            (&json!(false), &json!("interpreter_crash"))
        );
        let text = run_text(&crashed, &v);
        assert!(
            text.contains("interpreter_crash") && text.contains("restart=true"),
            "{text}"
        );
        // A run outside a session says nothing of one.
        let mut single = session_response(RunResult::default(), 1);
        single.record.session = None;
        let v = run_structured(&single, 64);
        assert!(v.get("session").is_none() && v.get("state_kept").is_none());
        assert!(!run_text(&single, &v).contains("session"));
    }

    fn receipt(verdict: &str, host: &str, rule: &str) -> EgressReceipt {
        let allowed = verdict == "allowed";
        EgressReceipt {
            host: host.into(),
            port: 443,
            kind: "connect".into(),
            address: allowed.then(|| "151.101.0.223:443".into()),
            sni: allowed.then(|| host.into()),
            bytes_up: if allowed { 517 } else { 0 },
            bytes_down: if allowed { 48_213 } else { 0 },
            start_ms: 12,
            end_ms: if allowed { 340 } else { 13 },
            verdict: verdict.into(),
            rule: rule.into(),
            ended: allowed.then(|| "closed".into()),
        }
    }

    #[test]
    fn egress_receipts_are_shown_as_calls_are_one_line_each() {
        use plimsoll_wire::{GrantCall, RunResult};
        let resp = session_response(
            RunResult {
                exit_code: Some(0),
                state_kept: Some(true),
                calls: vec![GrantCall {
                    method: "GET".into(),
                    route: Some("/orders/*".into()),
                    status: Some(200),
                    error: None,
                    request_bytes: 0,
                    response_bytes: 27,
                    latency_ms: 3,
                    credential: Some(plimsoll_wire::CredentialKind::Minted),
                }],
                egress: vec![
                    receipt("allowed", "pypi.org", "host pypi.org port 443"),
                    receipt("refused", "evil.example\n\u{1b}[31m", "host_not_allowed"),
                ],
                ..RunResult::default()
            },
            2,
        );
        let v = run_structured(&resp, 64);
        assert_eq!(v["calls"][0]["route"], "/orders/*");
        assert_eq!(v["egress"].as_array().map(Vec::len), Some(2));
        assert_eq!(
            (&v["egress"][0]["address"], &v["egress"][0]["ended"]),
            (&json!("151.101.0.223:443"), &json!("closed"))
        );
        assert_eq!(v["egress"][1]["rule"], "host_not_allowed");
        assert!(v["egress"][1].get("address").is_none());
        let text = run_text(&resp, &v);
        assert!(
            text.contains("1 call(s) through the grant's broker\n"),
            "{text}"
        );
        assert!(
            text.contains("2 connection attempt(s) through the egress grant's proxy:\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "  allowed connect pypi.org:443: connected to 151.101.0.223:443, TLS server name pypi.org, 517 bytes up, 48213 bytes down, 12-340 ms, rule host pypi.org port 443, ended closed\n"
            ),
            "{text}"
        );
        // What the code named cannot break the line (or reach a terminal as an escape).
        assert!(
            text.contains(
                "  refused connect evil.example\\n\\u{1b}[31m:443: nothing connected, 0 bytes up, 0 bytes down, 12-13 ms, rule host_not_allowed\n"
            ),
            "{text}"
        );
        assert!(!text.contains('\u{1b}'));
        // A session file call shows them too (they ended since the call before).
        let (_, text) = file_written(&resp, "a", 1, 64);
        assert!(text.contains("rule host_not_allowed"), "{text}");
        let (_, text) = file_read(&resp, "a", 64);
        assert!(text.contains("2 connection attempt(s)"), "{text}");
        // None: no line.
        let plain = session_response(RunResult::default(), 1);
        let v = run_structured(&plain, 64);
        assert!(v.get("egress").is_none() && v.get("calls").is_none());
        assert!(!run_text(&plain, &v).contains("egress"));
    }

    #[test]
    fn a_file_read_back_is_shown_as_a_stream_is() {
        use plimsoll_wire::{Artifact, RunResult};
        let read = |content: &[u8], found: bool| {
            session_response(
                RunResult {
                    exit_code: Some(0),
                    artifacts: vec![Artifact {
                        path: "f".into(),
                        found,
                        size: content.len() as u64,
                        content: content.to_vec().into(),
                        truncated: false,
                    }],
                    ..RunResult::default()
                },
                4,
            )
        };
        let (v, text) = file_read(&read(b"hello", true), "f", 64);
        assert_eq!((&v["found"], &v["size"]), (&json!(true), &json!(5)));
        assert_eq!(v["content"]["text"], "hello");
        assert!(v.get("artifacts").is_none());
        assert!(
            text.contains("/work/f (5 bytes)") && text.contains("hello"),
            "{text}"
        );
        assert!(text.contains(&"c".repeat(64)), "{text}");
        let (v, _) = file_read(&read(&[0xff, 0xfe], true), "f", 64);
        assert_eq!(v["content"]["encoding"], "base64");
        let (v, _) = file_read(&read(b"0123456789", true), "f", 4);
        assert_eq!(v["content"]["truncated_for_context"], true);
        let (v, text) = file_read(&read(b"", false), "f", 64);
        assert_eq!((&v["found"], &v["size"]), (&json!(false), &json!(null)));
        assert!(v.get("content").is_none());
        assert!(text.contains("not found"), "{text}");
        let (v, text) = file_written(&read(b"", false), "a/b.txt", 12, 64);
        assert_eq!(
            (&v["path"], &v["bytes_written"]),
            (&json!("a/b.txt"), &json!(12))
        );
        assert!(
            text.starts_with("wrote 12 bytes to /work/a/b.txt"),
            "{text}"
        );
    }

    #[test]
    fn a_session_refusal_says_nothing_ran_with_its_code_and_what_to_do() {
        use plimsoll_wire::EndReason;
        let (v, text) = error(&BackendError::NotDispatched {
            reason: Reason::Request,
            code: Some("session_ended".into()),
            end_reason: Some(EndReason::Closed),
            message: "session ses_1 has ended (closed)".into(),
        });
        assert!(
            text.starts_with("not dispatched (request): nothing ran"),
            "{text}"
        );
        assert!(
            text.contains("Code session_ended (the session ended: closed)"),
            "{text}"
        );
        assert!(text.contains("open_session"), "{text}");
        assert_eq!(
            (&v["code"], &v["end_reason"], &v["nothing_ran"]),
            (&json!("session_ended"), &json!("closed"), &json!(true))
        );
        let (v, text) = error(&BackendError::NotDispatched {
            reason: Reason::Request,
            code: Some("interpreter_ended".into()),
            end_reason: None,
            message: "the interpreter has ended".into(),
        });
        assert!(text.contains("restart=true"), "{text}");
        assert!(v.get("end_reason").is_none());
        // A plain refusal keeps its reason's advice.
        let (v, text) = error(&BackendError::refused(Reason::Capacity, "busy"));
        assert!(v.get("code").is_none());
        assert!(text.contains("retry unchanged"), "{text}");
    }

    fn snapshot() -> SnapshotInfo {
        SnapshotInfo {
            protocol: plimsoll_wire::PROTOCOL,
            request_id: Some("s-1".into()),
            snapshot_id: "snp_1".into(),
            session_id: "ses_1".into(),
            sha256: "5".repeat(64),
            bytes: 1_048_576,
            provider: "runsc".into(),
            isolation: Tier::Kernel,
            language: plimsoll_wire::Language::Python,
            calls: 0,
            last_record_sha256: None,
            checkpoint_ms: 80,
            created_unix_ms: 5_000,
            expires_unix_ms: 3_605_000,
        }
    }

    #[test]
    fn a_snapshot_of_a_session_with_no_call_yet_says_so() {
        let snap = snapshot();
        let (v, text) = snapshot_taken(&snap);
        assert_eq!(
            (&v["calls"], &v["last_record_sha256"], &v["status"]),
            (&json!(0), &json!(null), &json!("taken"))
        );
        assert_eq!(v["isolation"], "kernel");
        assert!(
            text.starts_with("took snapshot snp_1 of session ses_1 after its call 0: python on provider runsc at isolation kernel, 1048576 bytes, sha256 5555")
                && text.contains("paused 80 ms"),
            "{text}"
        );
        // A copy of it: no parent record to hang from, its first call is sequence 1.
        let origin = SessionOrigin {
            start: SessionStart::Forked,
            snapshot_sha256: snap.sha256.clone(),
            parent_session_id: "ses_1".into(),
            parent_record_sha256: None,
            parent_calls: 0,
        };
        let line = origin_line(&origin);
        assert!(
            line.starts_with("forked from session ses_1 after its call 0")
                && line.contains("from sequence 1"),
            "{line}"
        );
        let (v, text) = snapshot_list(&SnapshotList {
            protocol: plimsoll_wire::PROTOCOL,
            snapshots: Vec::new(),
        });
        assert_eq!(
            (v, text.as_str()),
            (json!({"snapshots": []}), "0 snapshot(s)\n")
        );
        let (v, text) = snapshot_deleted(&snap);
        assert_eq!(
            (&v["status"], &v["snapshot_id"]),
            (&json!("deleted"), &json!("snp_1"))
        );
        assert!(
            text.starts_with("deleted snapshot snp_1 of session ses_1"),
            "{text}"
        );
    }

    #[test]
    fn a_session_opened_closed_and_listed_says_where_it_runs_and_when_it_ends() {
        use plimsoll_wire::{EndReason, Language, PROTOCOL, SessionInfo, SessionList, Wall};
        let mut info = SessionInfo {
            image: None,
            protocol: PROTOCOL,
            request_id: Some("r".into()),
            session_id: "ses_1".into(),
            language: Language::Python,
            provider: "crun".into(),
            isolation: Tier::Container,
            minimum_isolation: Tier::Container,
            evidence_sha256: "e".repeat(64),
            environment: "image".into(),
            wall: Wall::default(),
            opened_unix_ms: 1_000,
            expires_unix_ms: 3_601_000,
            idle_timeout_ms: 300_000,
            calls: 0,
            last_record_sha256: None,
            interpreter_alive: true,
            end_reason: None,
            origin: None,
        };
        let (v, text) = session_opened(&info, None);
        assert!(
            v.get("grant").is_none() && !text.contains("grant"),
            "{text}"
        );
        // A session opened fresh has no origin.
        assert!(v.get("origin").is_none(), "{v}");
        assert_eq!(v["status"], "open");
        assert_eq!(v["session_id"], "ses_1");
        assert_eq!(v["isolation"], "container");
        assert_eq!(v["evidence_sha256"], "e".repeat(64));
        assert_eq!(v["expires_unix_ms"], 3_601_000);
        assert!(text.contains("isolation container"), "{text}");
        assert!(
            text.contains("300 s without a call") && text.contains("3600 s after"),
            "{text}"
        );
        let (_, text) = session_list(&SessionList {
            protocol: PROTOCOL,
            sessions: vec![info.clone()],
        });
        assert!(
            text.starts_with("1 open session(s)\nses_1: python"),
            "{text}"
        );
        info.calls = 4;
        info.end_reason = Some(EndReason::Closed);
        info.last_record_sha256 = Some("c".repeat(64));
        let (v, text) = session_closed(&info);
        assert_eq!(
            (&v["status"], &v["end_reason"]),
            (&json!("ended"), &json!("closed"))
        );
        assert!(text.contains("after 4 call(s)"), "{text}");
    }
}
