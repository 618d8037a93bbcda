//! plimsolld over real HTTP on loopback: refusals, authentication, capacity, providers,
//! readiness, metrics, the OpenAPI document, logs, start-up refusal, graceful shutdown, and
//! connections that never finish their headers.
//! Runs use the real process provider; where it is unavailable on this host the tests that
//! need it print `SKIP` (and fail under CI=true).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier, Mutex, mpsc};
use std::time::{Duration, Instant};

use plimsoll_callers::add_caller;
use plimsoll_daemon::ROUTES;
use plimsoll_env as env;
use plimsoll_sandbox::reap::processes_of_uids;
use plimsoll_test_daemon::{TestDaemon, uid_base_for_port};
use plimsoll_testing::{cpu_seconds, workspace_root};
use plimsoll_wire::digest::{evidence_sha256, record_sha256, request_sha256, result_sha256};
use plimsoll_wire::{ErrorResponse, ProvidersResponse, Reason, RunRequest, RunResponse, Tier};

const PROCESS: &str = "default_floor = \"process\"\nproviders = [\"process\"]\n";

/// One HTTP answer.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: BTreeMap<String, String>,
    body: String,
}

impl Answer {
    fn error(&self) -> ErrorResponse {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not an ErrorResponse ({e}): {}", self.body))
    }
    fn run(&self) -> RunResponse {
        assert_eq!(self.status, 200, "{}", self.body);
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not a RunResponse ({e}): {}", self.body))
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(120)))
        .build()
        .into()
}

fn answer(resp: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Answer {
    let mut resp = resp.expect("an HTTP answer");
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    Answer {
        status: resp.status().as_u16(),
        headers,
        body: resp
            .body_mut()
            .with_config()
            .limit(64 * 1024 * 1024)
            .read_to_string()
            .expect("a readable body"),
    }
}

fn post(url: &str, token: Option<&str>, body: &[u8]) -> Answer {
    let mut req = agent()
        .post(format!("{url}/v1/runs"))
        .header("Content-Type", "application/json");
    if let Some(t) = token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    answer(req.send(body))
}

fn get(url: &str, path: &str, token: Option<&str>) -> Answer {
    let mut req = agent().get(format!("{url}{path}"));
    if let Some(t) = token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    answer(req.call())
}

fn snippet(id: &str, language: &str, code: &str) -> String {
    serde_json::json!({
        "protocol": 1,
        "request_id": id,
        "run": {"kind": "snippet", "language": language, "code": code},
    })
    .to_string()
}

/// True when the process provider is available on this daemon; otherwise prints SKIP (or
/// fails under CI=true).
fn process_available(test: &str, url: &str, token: &str) -> bool {
    available(test, url, token, "process")
}

/// True when `provider` is available on this daemon; otherwise prints SKIP (or fails under
/// CI=true).
fn available(test: &str, url: &str, token: &str, provider: &str) -> bool {
    let a = get(url, "/v1/providers", Some(token));
    assert_eq!(a.status, 200, "{}", a.body);
    let p: ProvidersResponse = serde_json::from_str(&a.body).expect("a ProvidersResponse");
    let why = match p.providers.iter().find(|p| p.name == provider) {
        Some(info) if info.available => return true,
        Some(info) => info
            .unavailable_reason
            .clone()
            .unwrap_or_else(|| "unavailable".into()),
        None => format!("the {provider} provider was never probed (see the daemon's log)"),
    };
    if env::strict() {
        panic!("{test}: the {provider} provider is unavailable under CI=true: {why}");
    }
    eprintln!("SKIP {test}: the {provider} provider is unavailable: {why}");
    false
}

/// `name{labels} value` lines of a Prometheus exposition.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').expect("a sample line");
            (k.to_owned(), v.parse().expect("a number"))
        })
        .collect()
}

/// A bad request and the refusal it must get.
struct Case<'a> {
    what: &'a str,
    body: String,
    token: Option<&'a str>,
    status: u16,
    reason: Reason,
    code: &'a str,
    id: Option<&'a str>,
    needle: &'a str,
}

#[test]
fn bad_input_is_refused_with_a_clear_reason_and_the_daemon_keeps_serving() {
    let d = TestDaemon::start(&format!("{PROCESS}[daemon]\nmax_body_bytes = 4096\n"));
    let tok = Some(d.token.as_str());
    let good = snippet("good-1", "python", "print(1)");
    let case = |what, body: String, token, (status, reason, code), id, needle| Case {
        what,
        body,
        token,
        status,
        reason,
        code,
        id,
        needle,
    };
    let bad_request = (400, Reason::Request, "request");
    let bad_protocol = (400, Reason::Protocol, "protocol");
    let unauthenticated = (401, Reason::Permission, "unauthenticated");
    let wrong = Some("plm_not-a-token");
    let cases = vec![
        case(
            "malformed JSON",
            "{nope".into(),
            tok,
            bad_request,
            None,
            "not valid JSON",
        ),
        case(
            "unknown field",
            good.replace("\"protocol\"", "\"colour\":\"red\",\"protocol\""),
            tok,
            bad_request,
            Some("good-1"),
            "colour",
        ),
        case(
            "wrong protocol",
            good.replace("\"protocol\":1", "\"protocol\":2"),
            tok,
            bad_protocol,
            Some("good-1"),
            "protocol 2",
        ),
        case(
            "missing protocol",
            good.replace("\"protocol\":1,", ""),
            tok,
            bad_protocol,
            Some("good-1"),
            "protocol",
        ),
        case(
            "oversized body",
            snippet("big-1", "python", &format!("print('{}')", "x".repeat(5000))),
            tok,
            (413, Reason::Request, "request"),
            Some("big-1"),
            "4096",
        ),
        case(
            "unknown tier",
            good.replace(
                "\"protocol\"",
                "\"minimum_isolation\":\"fortress\",\"protocol\"",
            ),
            tok,
            bad_request,
            Some("good-1"),
            "fortress",
        ),
        case(
            "empty code",
            snippet("empty-1", "python", "  "),
            tok,
            bad_request,
            Some("empty-1"),
            "empty",
        ),
        case(
            "missing token",
            good.clone(),
            None,
            unauthenticated,
            Some("good-1"),
            "Authorization: Bearer",
        ),
        case(
            "wrong token",
            good.clone(),
            wrong,
            unauthenticated,
            Some("good-1"),
            "not valid",
        ),
        case(
            "wrong token, malformed body",
            "{nope".into(),
            wrong,
            unauthenticated,
            None,
            "not valid",
        ),
    ];
    let n = cases.len();
    for Case {
        what,
        body,
        token,
        status,
        reason,
        code,
        id,
        needle,
    } in cases
    {
        let a = post(&d.url, token, body.as_bytes());
        assert_eq!(a.status, status, "{what}: {}", a.body);
        let e = a.error();
        assert_eq!(e.error.not_dispatched, Some(reason), "{what}: {}", a.body);
        assert_eq!(e.error.code, code, "{what}");
        assert_eq!(e.request_id.as_deref(), id, "{what}");
        assert!(
            e.error.message.contains(needle),
            "{what}: {}",
            e.error.message
        );
        if status == 401 {
            assert_eq!(
                a.headers.get("www-authenticate").map(String::as_str),
                Some("Bearer")
            );
        }
        let h = get(&d.url, "/healthz", None);
        assert_eq!(h.status, 200, "{what}: the daemon stopped serving");
    }

    // A chunked body (no Content-Length) over the limit is cut off as it streams.
    let big = snippet("big-2", "python", &format!("print('{}')", "y".repeat(5000)));
    let a = answer(
        agent()
            .post(format!("{}/v1/runs", d.url))
            .header("Authorization", format!("Bearer {}", d.token))
            .send(ureq::SendBody::from_owned_reader(std::io::Cursor::new(big))),
    );
    assert_eq!(a.status, 413, "{}", a.body);
    assert_eq!(a.error().error.not_dispatched, Some(Reason::Request));
    assert_eq!(a.error().request_id.as_deref(), Some("big-2"));

    // A `Basic` credential is not a bearer token.
    let mut req = agent()
        .post(format!("{}/v1/runs", d.url))
        .header("Authorization", format!("Basic {}", d.token));
    req = req.header("Content-Type", "application/json");
    assert_eq!(answer(req.send(good.as_bytes())).status, 401);

    // Unknown routes and methods answer JSON too.
    let a = get(&d.url, "/v2/nothing", Some(&d.token));
    assert_eq!(a.status, 404);
    assert_eq!(a.error().error.code, "not_found");
    let a = get(&d.url, "/v1/runs", Some(&d.token));
    assert_eq!(a.status, 405);
    assert_eq!(a.error().error.code, "method_not_allowed");

    // Nothing ran: no run was counted, and every refusal was.
    let m = samples(&get(&d.url, "/metrics", None).body);
    assert!(
        !m.keys().any(|k| k.starts_with("plimsoll_runs_total")),
        "a refused request ran: {m:?}"
    );
    let refused: f64 = m
        .iter()
        .filter(|(k, _)| k.starts_with("plimsoll_refusals_total"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(refused as usize, n + 2);
}

/// Sends headers announcing a 7 MiB body and its first `sent` bytes, keeps the connection
/// open without sending the rest, and returns the status and body of the answer.
fn post_partial(url: &str, auth: Option<&str>, id: &str, sent: usize) -> (u16, String) {
    use std::io::{Read, Write};
    let addr = url.trim_start_matches("http://");
    let mut conn = std::net::TcpStream::connect(addr).expect("connect to the daemon");
    // Generous: only a daemon waiting for the whole body takes this long.
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("set a read timeout");
    let declared = 7 * 1024 * 1024;
    let auth = auth.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let head = format!(
        "POST /v1/runs HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n{auth}Content-Length: {declared}\r\n\r\n"
    );
    let mut body = format!(
        r#"{{"protocol":1,"request_id":"{id}","run":{{"kind":"snippet","language":"python","code":"print('"#
    );
    body.push_str(&"z".repeat(sent - body.len()));
    conn.write_all(head.as_bytes()).expect("send the headers");
    conn.write_all(body.as_bytes())
        .expect("send the first bytes");
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    // The answer ends when the daemon closes the connection.
    loop {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) => panic!(
                "no complete answer while the body was unfinished ({e}); got {:?}",
                String::from_utf8_lossy(&answer)
            ),
        }
    }
    let text = String::from_utf8(answer).expect("a UTF-8 answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    (status, body.to_owned())
}

#[test]
fn an_unauthenticated_body_is_not_read_before_the_401() {
    // The limit is the default 8 MiB: the body announced (7 MiB) is under it, so only the
    // missing token can end the exchange before the body does.
    let d = TestDaemon::start(PROCESS);
    for (auth, id) in [(None, "unauth-1"), (Some("plm_wrong"), "unauth-2")] {
        let (status, body) = post_partial(&d.url, auth, id, 3000);
        assert_eq!(status, 401, "{body}");
        let e: ErrorResponse = serde_json::from_str(&body).expect("an ErrorResponse");
        assert_eq!(e.error.code, "unauthenticated");
        assert_eq!(e.error.not_dispatched, Some(Reason::Permission));
        assert_eq!(
            e.request_id.as_deref(),
            Some(id),
            "the id in the first bytes is echoed"
        );
    }
    // More than the prefix arrived: still answered, and the id is still found.
    let (status, body) = post_partial(&d.url, None, "unauth-3", 6000);
    assert_eq!(status, 401, "{body}");
    let e: ErrorResponse = serde_json::from_str(&body).expect("an ErrorResponse");
    assert_eq!(e.request_id.as_deref(), Some("unauth-3"));
    assert_eq!(get(&d.url, "/healthz", None).status, 200);
}

#[test]
fn an_oversized_announced_body_is_refused_with_its_request_id() {
    let d = TestDaemon::start(&format!("{PROCESS}[daemon]\nmax_body_bytes = 4096\n"));
    let (status, body) = post_partial(&d.url, Some(&d.token), "huge-1", 3000);
    assert_eq!(status, 413, "{body}");
    let e: ErrorResponse = serde_json::from_str(&body).expect("an ErrorResponse");
    assert_eq!(e.error.not_dispatched, Some(Reason::Request));
    assert_eq!(e.request_id.as_deref(), Some("huge-1"));
}

#[test]
fn runs_answer_with_their_tier_digests_and_the_request_id() {
    let d = TestDaemon::start(PROCESS);
    if !process_available(
        "runs_answer_with_their_tier_digests_and_the_request_id",
        &d.url,
        &d.token,
    ) {
        return;
    }
    for (lang, code) in [
        ("python", "print('hi from python')"),
        ("javascript", "console.log('hi from javascript')"),
    ] {
        let body = snippet(&format!("ok-{lang}"), lang, code);
        let r = post(&d.url, Some(&d.token), body.as_bytes()).run();
        assert_eq!(r.request_id, format!("ok-{lang}"));
        assert_eq!(r.provider, "process");
        assert_eq!(r.isolation, Tier::Process);
        assert_eq!(r.result.exit_code, Some(0), "{r:?}");
        assert_eq!(
            r.result.stdout.to_string_lossy(),
            format!("hi from {lang}\n")
        );
        let sent: RunRequest = serde_json::from_str(&body).unwrap();
        assert_eq!(r.request_sha256, request_sha256(&sent));
        assert_eq!(r.result_sha256, result_sha256(&r.result));
        assert_eq!(r.record.record_sha256, record_sha256(&r.record));
        assert_eq!(r.record.request_id, r.request_id);
    }

    // Refusals the engine decides, with their statuses.
    let floor = snippet("floor-1", "python", "print(1)")
        .replace("\"protocol\"", "\"minimum_isolation\":\"vm\",\"protocol\"");
    let a = post(&d.url, Some(&d.token), floor.as_bytes());
    assert_eq!(a.status, 422, "{}", a.body);
    let e = a.error();
    assert_eq!(e.error.not_dispatched, Some(Reason::Isolation));
    assert_eq!(e.request_id.as_deref(), Some("floor-1"));

    let project = serde_json::json!({
        "protocol": 1, "request_id": "proj-1",
        "run": {"kind": "project", "steps": [{"run": "true"}]},
    })
    .to_string();
    let a = post(&d.url, Some(&d.token), project.as_bytes());
    assert_eq!(a.status, 422, "{}", a.body);
    assert_eq!(a.error().error.not_dispatched, Some(Reason::Unsupported));

    let too_long = snippet("limit-1", "python", "print(1)").replace(
        "\"protocol\"",
        "\"limits\":{\"timeout_ms\":999999999},\"protocol\"",
    );
    let a = post(&d.url, Some(&d.token), too_long.as_bytes());
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(a.error().error.not_dispatched, Some(Reason::Request));
    assert_eq!(a.error().request_id.as_deref(), Some("limit-1"));
}

#[test]
fn authentication_needs_a_current_token_and_follows_the_callers_file() {
    let d = TestDaemon::start(PROCESS);
    let text = std::fs::read_to_string(d.callers_file()).unwrap();
    assert!(!text.contains(&d.token), "the callers file holds a token");

    assert_eq!(get(&d.url, "/v1/providers", Some(&d.token)).status, 200);
    for bad in [None, Some("plm_wrong"), Some(&format!("{}x", d.token)[..])] {
        let a = get(&d.url, "/v1/providers", bad);
        assert_eq!(a.status, 401, "{bad:?}");
        assert_eq!(a.error().error.code, "unauthenticated");
    }
    // The routes that need no token.
    for path in ["/healthz", "/readyz", "/metrics", "/v1/openapi.json"] {
        let a = get(&d.url, path, None);
        assert!(
            a.status == 200 || (path == "/readyz" && a.status == 503),
            "{path}: {}",
            a.status
        );
    }

    // A caller added while the daemon runs is seen on the next request.
    let other = d.add_caller("other");
    assert_eq!(get(&d.url, "/v1/providers", Some(&other)).status, 200);

    // A broken callers file refuses everyone (environment) until it is fixed.
    let good = std::fs::read_to_string(d.callers_file()).unwrap();
    std::fs::write(d.callers_file(), "[[caller]]\nname = 1\n").unwrap();
    let a = post(
        &d.url,
        Some(&d.token),
        snippet("cf-1", "python", "print(1)").as_bytes(),
    );
    assert_eq!(a.status, 503, "{}", a.body);
    let e = a.error();
    assert_eq!(e.error.code, "callers_unavailable");
    assert_eq!(e.error.not_dispatched, Some(Reason::Environment));
    assert_eq!(e.request_id.as_deref(), Some("cf-1"));
    std::fs::write(d.callers_file(), good).unwrap();
    assert_eq!(get(&d.url, "/v1/providers", Some(&d.token)).status, 200);

    // Removing a caller revokes its token.
    let only_other: String = {
        let text = std::fs::read_to_string(d.callers_file()).unwrap();
        let start = text.find("[[caller]]\nname = \"other\"").unwrap();
        text[start..].to_owned()
    };
    std::fs::write(d.callers_file(), only_other).unwrap();
    assert_eq!(get(&d.url, "/v1/providers", Some(&d.token)).status, 401);
    assert_eq!(get(&d.url, "/v1/providers", Some(&other)).status, 200);
}

#[test]
fn capacity_refuses_over_the_limit_and_loses_no_request() {
    let d = TestDaemon::start(&format!(
        "{PROCESS}max_per_caller = 1\nmax_concurrent = 4\n"
    ));
    if !process_available(
        "capacity_refuses_over_the_limit_and_loses_no_request",
        &d.url,
        &d.token,
    ) {
        return;
    }
    let sleeper = |id: &str| snippet(id, "python", "import time\ntime.sleep(3)\nprint('done')");

    // A burst from one caller: some run, the rest are refused with capacity; none is lost.
    let n = 4;
    let barrier = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (url, token, barrier) = (d.url.clone(), d.token.clone(), Arc::clone(&barrier));
            let body = sleeper(&format!("burst-{i}"));
            std::thread::spawn(move || {
                barrier.wait();
                (i, post(&url, Some(&token), body.as_bytes()))
            })
        })
        .collect();
    let (mut ran, mut refused) = (0, 0);
    for h in handles {
        let (i, a) = h.join().expect("a client thread");
        match a.status {
            200 => {
                let r = a.run();
                assert_eq!(r.request_id, format!("burst-{i}"));
                assert_eq!(r.result.stdout.to_string_lossy(), "done\n", "{r:?}");
                ran += 1;
            }
            429 => {
                let e = a.error();
                assert_eq!(e.error.not_dispatched, Some(Reason::Capacity), "{}", a.body);
                assert_eq!(e.error.code, "capacity");
                assert_eq!(e.request_id.as_deref(), Some(&format!("burst-{i}")[..]));
                assert_eq!(a.headers.get("retry-after").map(String::as_str), Some("1"));
                refused += 1;
            }
            other => panic!("burst-{i}: unexpected status {other}: {}", a.body),
        }
    }
    assert_eq!(ran + refused, n);
    assert!(ran >= 1 && refused >= 1, "ran {ran}, refused {refused}");

    // While `test` holds its one place, `test` is refused and `other` is not.
    let other = d.add_caller("other");
    let long = {
        let (url, token) = (d.url.clone(), d.token.clone());
        let body = snippet(
            "hold-1",
            "python",
            "import time\ntime.sleep(4)\nprint('held')",
        );
        std::thread::spawn(move || post(&url, Some(&token), body.as_bytes()))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while d.engine().in_flight() == 0 {
        assert!(Instant::now() < deadline, "the long run never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let a = post(
        &d.url,
        Some(&d.token),
        snippet("second-1", "python", "print(2)").as_bytes(),
    );
    assert_eq!(a.status, 429, "{}", a.body);
    let r = post(
        &d.url,
        Some(&other),
        snippet("other-1", "python", "print(3)").as_bytes(),
    )
    .run();
    assert_eq!(r.result.stdout.to_string_lossy(), "3\n");
    let held = long.join().unwrap().run();
    assert_eq!(held.result.stdout.to_string_lossy(), "held\n");
}

#[test]
fn providers_show_the_process_provider_with_its_evidence() {
    let d = TestDaemon::start(PROCESS);
    if !process_available(
        "providers_show_the_process_provider_with_its_evidence",
        &d.url,
        &d.token,
    ) {
        return;
    }
    let a = get(&d.url, "/v1/providers", Some(&d.token));
    let p: ProvidersResponse = serde_json::from_str(&a.body).unwrap();
    assert_eq!(p.protocol, 1);
    assert_eq!(p.default_floor, Tier::Process);
    assert_eq!(p.providers.len(), 1);
    let info = &p.providers[0];
    assert_eq!(info.name, "process");
    assert_eq!(info.isolation, Tier::Process);
    assert!(info.available);
    assert_eq!(info.evidence.provider, "process");
    assert_eq!(info.evidence.isolation, Tier::Process);
    assert!(
        info.evidence.probe.is_some(),
        "no probe report in the evidence"
    );
    assert!(!info.evidence.checks.is_empty());
    assert_eq!(info.evidence_sha256, evidence_sha256(&info.evidence));
}

#[test]
fn evidence_is_rechecked_every_recheck_secs() {
    let d = TestDaemon::start(&format!("{PROCESS}[daemon]\nrecheck_secs = 1\n"));
    if !process_available("evidence_is_rechecked_every_recheck_secs", &d.url, &d.token) {
        return;
    }
    let checked = || {
        let a = get(&d.url, "/v1/providers", Some(&d.token));
        let p: ProvidersResponse = serde_json::from_str(&a.body).unwrap();
        p.providers[0].evidence.checked_unix_ms
    };
    let first = checked();
    let deadline = Instant::now() + Duration::from_secs(120);
    while checked() == first {
        assert!(
            Instant::now() < deadline,
            "the evidence was never re-checked"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn readyz_follows_the_providers() {
    let d = TestDaemon::start(PROCESS);
    assert_eq!(get(&d.url, "/healthz", None).status, 200);
    if process_available("readyz_follows_the_providers", &d.url, &d.token) {
        let a = get(&d.url, "/readyz", None);
        assert_eq!(a.status, 200, "{}", a.body);
    }
    // A provider whose probe cannot run is not offered, and the daemon is not ready.
    let broken = TestDaemon::start(&format!(
        "{PROCESS}[process]\nprobe = \"/nonexistent/plimsoll-probe\"\n"
    ));
    assert_eq!(get(&broken.url, "/healthz", None).status, 200);
    let a = get(&broken.url, "/readyz", None);
    assert_eq!(a.status, 503, "{}", a.body);
    let v: serde_json::Value = serde_json::from_str(&a.body).unwrap();
    assert_eq!(v["ready"], false);
    // Ready or not, the answer names the daemon's instance, the middle of its session ids.
    for daemon in [&d, &broken] {
        let a = get(&daemon.url, "/readyz", None);
        let instance = &a.headers["plimsoll-instance"];
        assert_eq!(instance, daemon.engine().instance());
        assert!(
            instance.len() == 16 && instance.bytes().all(|b| b.is_ascii_hexdigit()),
            "{instance}"
        );
    }
    assert_ne!(d.engine().instance(), broken.engine().instance());
}

#[test]
fn metrics_count_runs_refusals_and_requests() {
    let d = TestDaemon::start(PROCESS);
    if !process_available("metrics_count_runs_refusals_and_requests", &d.url, &d.token) {
        return;
    }
    for i in 0..2 {
        post(
            &d.url,
            Some(&d.token),
            snippet(&format!("m-{i}"), "python", "print(1)").as_bytes(),
        )
        .run();
    }
    let r = post(
        &d.url,
        Some(&d.token),
        snippet("m-err", "python", "import sys\nsys.exit(3)").as_bytes(),
    )
    .run();
    assert_eq!(r.result.exit_code, Some(3));
    assert_eq!(post(&d.url, Some(&d.token), b"{nope").status, 400);
    assert_eq!(
        post(
            &d.url,
            None,
            snippet("m-anon", "python", "print(1)").as_bytes()
        )
        .status,
        401
    );

    let a = get(&d.url, "/metrics", None);
    assert_eq!(a.status, 200);
    assert!(a.headers["content-type"].starts_with("text/plain"));
    assert!(!a.body.contains(&d.token));
    let m = samples(&a.body);
    let at = |k: &str| {
        m.get(k)
            .copied()
            .unwrap_or_else(|| panic!("no sample {k} in\n{}", a.body))
    };
    assert_eq!(
        at(r#"plimsoll_runs_total{provider="process",outcome="ok"}"#),
        2.0
    );
    assert_eq!(
        at(r#"plimsoll_runs_total{provider="process",outcome="error"}"#),
        1.0
    );
    assert_eq!(at(r#"plimsoll_refusals_total{reason="request"}"#), 1.0);
    assert_eq!(at(r#"plimsoll_refusals_total{reason="permission"}"#), 1.0);
    assert_eq!(at(r#"plimsoll_refusals_total{reason="capacity"}"#), 0.0);
    assert_eq!(
        at(r#"plimsoll_run_duration_seconds_count{provider="process"}"#),
        3.0
    );
    assert!(at(r#"plimsoll_run_duration_seconds_sum{provider="process"}"#) >= 0.0);
    assert_eq!(at("plimsoll_runs_in_flight"), 0.0);
    assert_eq!(
        at(r#"plimsoll_provider_available{provider="process",isolation="process"}"#),
        1.0
    );
    assert_eq!(at("plimsoll_ready"), 1.0);
    assert_eq!(
        at(r#"plimsoll_http_requests_total{route="/v1/runs",status="200"}"#),
        3.0
    );
    assert_eq!(
        at(r#"plimsoll_http_requests_total{route="/v1/runs",status="400"}"#),
        1.0
    );
    assert_eq!(
        at(r#"plimsoll_http_requests_total{route="/v1/runs",status="401"}"#),
        1.0
    );
    // The probe in process_available() counted too.
    assert_eq!(
        at(r#"plimsoll_http_requests_total{route="/v1/providers",status="200"}"#),
        1.0
    );
}

#[test]
fn the_served_openapi_document_is_the_file_byte_for_byte() {
    let d = TestDaemon::start(PROCESS);
    let file = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/openapi.json"
    ))
    .expect("docs/openapi.json");
    let a = get(&d.url, "/v1/openapi.json", None);
    assert_eq!(a.status, 200);
    assert_eq!(a.headers["content-type"], "application/json");
    assert!(
        a.body == file,
        "GET /v1/openapi.json differs from docs/openapi.json"
    );
    let doc: serde_json::Value = serde_json::from_str(&file).expect("docs/openapi.json is JSON");
    assert_eq!(doc["openapi"], "3.1.0");
}

#[test]
fn every_route_served_is_in_the_openapi_document_and_nothing_else() {
    let d = TestDaemon::start(PROCESS);
    let doc: serde_json::Value = serde_json::from_str(plimsoll_daemon::OPENAPI_JSON).unwrap();
    let paths = doc["paths"].as_object().unwrap();
    let mut documented: Vec<(String, String)> = paths
        .iter()
        .flat_map(|(p, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .map(move |m| (m.to_uppercase(), p.clone()))
        })
        .collect();
    let mut served: Vec<(String, String)> = ROUTES
        .iter()
        // A catch-all segment (`{*path}`) is a plain parameter in the document.
        .map(|r| (r.method.to_owned(), r.path.replace("{*", "{")))
        .collect();
    // `/mcp` is mounted beside the table (it is a service, not a handler): documented,
    // secured, and served behind the token too.
    served.push(("POST".to_owned(), plimsoll_daemon::MCP_PATH.to_owned()));
    documented.sort();
    served.sort();
    assert_eq!(served, documented);
    let mcp = &paths[plimsoll_daemon::MCP_PATH]["post"];
    assert!(mcp["security"].as_array().is_some_and(|s| !s.is_empty()));
    assert_eq!(mcp_post(&d.url, None, &serde_json::json!({})).status, 401);

    for r in ROUTES {
        let op = &paths[&r.path.replace("{*", "{")][r.method.to_lowercase()];
        let secured = op["security"].as_array().is_some_and(|s| !s.is_empty());
        assert_eq!(
            secured, r.auth,
            "{} {}: security in the document",
            r.method, r.path
        );
        // The route is really served: not 404 or 405, and 401 exactly when it needs a token.
        let a = match r.method {
            "GET" => get(&d.url, r.path, None),
            "POST" => post(&d.url, None, b"{}"),
            "PUT" => answer(agent().put(format!("{}{}", d.url, r.path)).send(&b"x"[..])),
            "DELETE" => answer(agent().delete(format!("{}{}", d.url, r.path)).call()),
            other => panic!("untested method {other}"),
        };
        assert!(
            a.status != 404 && a.status != 405,
            "{} {}: {}",
            r.method,
            r.path,
            a.status
        );
        assert_eq!(
            a.status == 401,
            r.auth,
            "{} {}: {}",
            r.method,
            r.path,
            a.status
        );
        for (status, _) in op["responses"].as_object().unwrap() {
            assert!(
                status.parse::<u16>().is_ok(),
                "{} {}: {status}",
                r.method,
                r.path
            );
        }
    }
}

/// The daemon binary under test, run with the test's environment.
#[expect(
    clippy::disallowed_methods,
    reason = "the test runs the plimsolld binary itself, as an operator would, not a sandboxed child"
)]
fn plimsolld() -> Command {
    Command::new(env!("CARGO_BIN_EXE_plimsolld"))
}

/// `plimsolld` as a child process with its log lines collected.
struct Spawned {
    child: Child,
    url: String,
    token: String,
    logs: Arc<Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
    _uid_port: std::net::TcpListener,
    _dir: tempfile::TempDir,
}

impl Spawned {
    /// Starts `plimsolld`; `daemon_extra` is more keys of its `[daemon]` section.
    fn start(daemon_extra: &str) -> Spawned {
        Spawned::start_with(daemon_extra, &[], &[])
    }

    /// [`Spawned::start`] with more arguments and environment variables.
    fn start_with(daemon_extra: &str, args: &[&std::ffi::OsStr], envs: &[(&str, &str)]) -> Spawned {
        Spawned::start_settings(PROCESS, daemon_extra, args, envs)
    }

    /// [`Spawned::start_with`], with `top` as the settings' top-level keys (floor and
    /// providers) instead of [`PROCESS`].
    fn start_settings(
        top: &str,
        daemon_extra: &str,
        args: &[&std::ffi::OsStr],
        envs: &[(&str, &str)],
    ) -> Spawned {
        Spawned::start_settings_until(top, daemon_extra, args, envs, &|url, _| {
            get(url, "/readyz", None).status == 200
        })
    }

    /// [`Spawned::start_settings`], returning once `settled(url, token)` holds (instead of
    /// once `/readyz` answers 200), or the start-up probe withdrew every provider.
    fn start_settings_until(
        top: &str,
        daemon_extra: &str,
        args: &[&std::ffi::OsStr],
        envs: &[(&str, &str)],
        settled: &dyn Fn(&str, &str) -> bool,
    ) -> Spawned {
        let dir = tempfile::tempdir().unwrap();
        // Sandbox uids must traverse it to reach their run directories under `state`.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let callers = dir.path().join("callers.toml");
        let token = add_caller(&callers, "test").unwrap().expose().clone();
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).unwrap();
        // A port held for the daemon's life picks a sandbox uid range no other test uses.
        let uid_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let uid_base = uid_base_for_port(uid_port.local_addr().unwrap().port());
        let config = dir.path().join("plimsoll.toml");
        std::fs::write(
            &config,
            format!(
                "{top}state_dir = \"{}\"\nsandbox_uid_base = {uid_base}\n\
                 [daemon]\ncallers_file = \"{}\"\n{daemon_extra}\n",
                state.display(),
                callers.display()
            ),
        )
        .unwrap();
        let (child, url, logs, reader) = Spawned::launch(&config, &token, args, envs, settled);
        Spawned {
            child,
            url,
            token,
            logs,
            reader: Some(reader),
            _uid_port: uid_port,
            _dir: dir,
        }
    }

    /// Starts `plimsolld` on the settings in `config`: the child, its URL, its log lines and
    /// their reader, once `settled(url, token)` holds or the start-up probe withdrew every
    /// provider.
    fn launch(
        config: &std::path::Path,
        token: &str,
        args: &[&std::ffi::OsStr],
        envs: &[(&str, &str)],
        settled: &dyn Fn(&str, &str) -> bool,
    ) -> (
        Child,
        String,
        Arc<Mutex<String>>,
        std::thread::JoinHandle<()>,
    ) {
        let mut child = plimsolld()
            .arg("--config")
            .arg(config)
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env("PLIMSOLL_LOG", "trace")
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start plimsolld");
        let logs = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let sink = Arc::clone(&logs);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
                    && v["message"] == "listening"
                {
                    let _ = tx.send(v["addr"].as_str().unwrap_or_default().to_owned());
                }
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| {
                panic!(
                    "plimsolld never said it was listening: {}",
                    logs.lock().unwrap()
                )
            });
        let url = format!("http://{addr}");
        // Wait for the start-up probe to settle (ready, or withdrawn).
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if settled(&url, token) {
                break;
            }
            let l = logs.lock().unwrap().clone();
            if l.contains("no provider passed its probe") || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        (child, url, logs, reader)
    }

    /// Starts a new `plimsolld` on the same settings and state (its start-up reap runs) in
    /// place of this one, which is ended first if it still runs; returns once it is ready.
    fn restart(&mut self) {
        let _ = self.child.kill();
        self.start_again();
    }

    /// Ends the daemon with SIGTERM, as an operator's restart does, and starts it again on
    /// the same settings and state; returns how the first one exited.
    fn terminate_and_start_again(&mut self) -> std::process::ExitStatus {
        self.signal(rustix::process::Signal::TERM);
        self.start_again()
    }

    fn start_again(&mut self) -> std::process::ExitStatus {
        let status = self.wait_exit();
        let config = self._dir.path().join("plimsoll.toml");
        let (child, url, logs, reader) =
            Spawned::launch(&config, &self.token, &[], &[], &|url, _| {
                get(url, "/readyz", None).status == 200
            });
        (self.child, self.url, self.logs) = (child, url, logs);
        self.reader = Some(reader);
        status
    }

    /// The first sandbox uid of its range (its settings' `sandbox_uid_base`).
    fn uid_base(&self) -> u32 {
        uid_base_for_port(self._uid_port.local_addr().unwrap().port())
    }

    fn signal(&self, sig: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).expect("a child pid");
        rustix::process::kill_process(pid, sig).expect("signal plimsolld");
    }

    fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for plimsolld") {
                // The log pipe closes when the daemon is gone (nothing it started keeps it).
                if let Some(reader) = self.reader.take() {
                    reader.join().expect("the log reader");
                }
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "plimsolld did not exit after the signal"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn logs(&self) -> String {
        self.logs.lock().unwrap().clone()
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The killed daemon's process-tier runs and warm members keep their work tmpfs
        // mounted under its state directory, which `_dir` is about to remove: the removal
        // stops at each mount and leaves it for good, where no later daemon's reap looks.
        // Reap as the next daemon on this state directory would, until nothing is left: a
        // child the daemon had just forked (and that has not exec'd or exited yet) may hold
        // a run's lock for a moment more.
        let state = self._dir.path().join("state");
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            reap_process_state(&state);
            let left = std::fs::read_dir(state.join("runs"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| e.path().join("process.lock").exists());
            if !left || Instant::now() >= until {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The process provider's reap of what a killed daemon left under `state` (its runs' and
/// members' processes, work tmpfs, memory cgroups, directories).
fn reap_process_state(state: &std::path::Path) -> plimsoll_process::ReapReport {
    plimsoll_process::ProcessProvider::new(plimsoll_process::ProcessConfig {
        node: "/usr/bin/node".into(),
        python: "/usr/bin/python3".into(),
        probe: "/nonexistent/plimsoll-probe".into(),
        state_dir: state.to_owned(),
        probe_uid: 0,
    })
    .reap()
}

/// #28 (12): the work tmpfs mounts of a killed daemon's warm members were found left behind
/// (`state/runs/warm-*/work`): these tests kill their daemon (`Spawned`'s drop) and then
/// remove its state directory, which stopped at each mount. A daemon with a process pool is
/// killed and its test ends: no mount of its state directory is left.
#[test]
fn a_killed_daemons_members_leave_no_mount_when_its_test_ends() {
    let test = "a_killed_daemons_members_leave_no_mount_when_its_test_ends";
    let d = Spawned::start("\n[pools.process.python]\nmin_idle = 1\nmax_members = 1\n");
    if !process_available(test, &d.url, &d.token) {
        return;
    }
    let state = d._dir.path().join("state");
    let prefix = format!("{}/", state.display());
    let mounted = || -> Vec<String> {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
            .filter(|m| m.starts_with(&prefix))
            .collect()
    };
    let start = Instant::now();
    while mounted().is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no warm member was made: {}",
            d.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(d);
    assert_eq!(mounted(), Vec::<String>::new(), "left mounted");
}

#[test]
fn the_token_never_reaches_the_logs() {
    let mut d = Spawned::start("");
    if !process_available("the_token_never_reaches_the_logs", &d.url, &d.token) {
        return;
    }
    let r = post(
        &d.url,
        Some(&d.token),
        snippet("log-1", "python", "print('logged')").as_bytes(),
    )
    .run();
    assert_eq!(r.result.stdout.to_string_lossy(), "logged\n");
    let wrong = format!("{}Q", d.token);
    assert_eq!(
        post(
            &d.url,
            Some(&wrong),
            snippet("log-2", "python", "print(2)").as_bytes()
        )
        .status,
        401
    );
    d.signal(rustix::process::Signal::TERM);
    d.wait_exit();
    let logs = d.logs();
    // The capture works: the run and its caller are there...
    assert!(logs.contains("\"request_id\":\"log-1\""), "{logs}");
    assert!(logs.contains("\"caller\":\"test\""), "{logs}");
    assert!(logs.contains("\"request_id\":\"log-2\""), "{logs}");
    // ...and no token, valid or not, nor its secret part.
    let secret = d.token.trim_start_matches("plm_");
    assert!(!logs.contains(secret), "the token reached the logs");
    assert!(!logs.contains(&wrong), "a presented token reached the logs");
    assert!(
        !logs.to_lowercase().contains("bearer"),
        "an Authorization header reached the logs"
    );
}

#[test]
fn sigterm_lets_the_run_in_flight_finish_then_exits_zero() {
    let mut d = Spawned::start("");
    if !process_available(
        "sigterm_lets_the_run_in_flight_finish_then_exits_zero",
        &d.url,
        &d.token,
    ) {
        return;
    }
    let run = {
        let (url, token) = (d.url.clone(), d.token.clone());
        let body = snippet(
            "term-1",
            "python",
            "import time\ntime.sleep(2)\nprint('finished')",
        );
        std::thread::spawn(move || post(&url, Some(&token), body.as_bytes()))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let m = samples(&get(&d.url, "/metrics", None).body);
        if m.get("plimsoll_runs_in_flight") == Some(&1.0) {
            break;
        }
        assert!(Instant::now() < deadline, "the run never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    d.signal(rustix::process::Signal::TERM);
    let r = run.join().unwrap().run();
    assert_eq!(r.request_id, "term-1");
    assert_eq!(r.result.stdout.to_string_lossy(), "finished\n", "{r:?}");
    let status = d.wait_exit();
    assert_eq!(status.code(), Some(0), "logs:\n{}", d.logs());
    assert!(d.logs().contains("\"message\":\"stopped\""), "{}", d.logs());
}

#[test]
fn the_daemon_refuses_to_start_with_no_provider() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("plimsoll.toml");
    std::fs::write(
        &config,
        "default_floor = \"process\"\n[daemon]\nlisten = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    let out = plimsolld()
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .output()
        .expect("run plimsolld");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("providers = [\\\"process\\\"]")
            || stderr.contains("providers = [\"process\"]"),
        "{stderr}"
    );
    // PLIMSOLL_CONFIG is read when --config is absent.
    let out = plimsolld()
        .env("PLIMSOLL_CONFIG", &config)
        .stdin(Stdio::null())
        .output()
        .expect("run plimsolld");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no provider is configured"));
}

#[test]
fn help_lists_every_environment_variable() {
    let out = plimsolld()
        .arg("--help")
        .output()
        .expect("run plimsolld --help");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for v in env::ALL {
        assert!(text.contains(v.name), "--help does not list {}", v.name);
    }
    assert!(text.contains("--config") && text.contains("--listen"));
}

/// Reads `conn` until the daemon closes it, for at most `bound`: what it sent, or why the
/// connection was still open.
fn read_until_closed(conn: &mut std::net::TcpStream, bound: Duration) -> Result<Vec<u8>, String> {
    use std::io::Read;
    conn.set_read_timeout(Some(bound))
        .expect("set a read timeout");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => return Ok(got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(got),
            Err(e) => {
                return Err(format!(
                    "still open after {bound:?} ({e}); got {:?}",
                    String::from_utf8_lossy(&got)
                ));
            }
        }
    }
}

/// A raw connection to the daemon at `url`.
fn connect(url: &str) -> std::net::TcpStream {
    std::net::TcpStream::connect(url.trim_start_matches("http://")).expect("connect to the daemon")
}

/// Far longer than the 1 s header timeout the tests set: only a daemon without one is slower.
const CLOSED_WITHIN: Duration = Duration::from_secs(15);

#[test]
fn a_connection_that_never_finishes_its_request_head_is_closed_while_others_are_served() {
    use std::io::Write;
    let d = TestDaemon::start(&format!("{PROCESS}[daemon]\nheader_timeout_secs = 1\n"));
    // Half a request line, and then nothing.
    let mut half = connect(&d.url);
    half.write_all(b"GET /heal")
        .expect("send half a request line");
    // A connection that sends nothing at all.
    let mut silent = connect(&d.url);
    // Headers without their blank line, before the token would be looked at.
    let mut unfinished = connect(&d.url);
    unfinished
        .write_all(b"POST /v1/runs HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n")
        .expect("send unfinished headers");

    // Meanwhile, other connections are served.
    assert_eq!(get(&d.url, "/healthz", None).status, 200);
    assert_eq!(get(&d.url, "/v1/providers", Some(&d.token)).status, 200);

    for (what, conn) in [
        ("half a request line", &mut half),
        ("nothing", &mut silent),
        ("unfinished headers", &mut unfinished),
    ] {
        let got = read_until_closed(conn, CLOSED_WITHIN)
            .unwrap_or_else(|e| panic!("a connection that sent {what}: {e}"));
        // Closed without an answer (docs/daemon.md).
        assert!(
            got.is_empty(),
            "a connection that sent {what} got {:?}",
            String::from_utf8_lossy(&got)
        );
    }
    assert_eq!(get(&d.url, "/healthz", None).status, 200);
}

#[test]
fn an_idle_kept_alive_connection_is_closed_after_the_header_timeout() {
    use std::io::{Read, Write};
    let d = TestDaemon::start(&format!("{PROCESS}[daemon]\nheader_timeout_secs = 1\n"));
    let mut conn = connect(&d.url);
    conn.set_read_timeout(Some(CLOSED_WITHIN))
        .expect("set a read timeout");
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("send a request");
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&answer).contains(r#"{"status":"ok"}"#) {
        let n = conn.read(&mut buf).expect("read the answer");
        assert!(
            n > 0,
            "closed before answering: {:?}",
            String::from_utf8_lossy(&answer)
        );
        answer.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        !text.to_ascii_lowercase().contains("connection: close"),
        "{text}"
    );
    // Kept alive, then idle: closed, with nothing more sent.
    let more = read_until_closed(&mut conn, CLOSED_WITHIN)
        .unwrap_or_else(|e| panic!("an idle kept-alive connection: {e}"));
    assert!(more.is_empty(), "{:?}", String::from_utf8_lossy(&more));
}

#[test]
fn the_daemon_serves_while_many_idle_connections_are_open_and_after_they_are_dropped() {
    use std::io::Write;
    // All 200 come from one peer: its own cap is raised above them.
    let d = TestDaemon::start(&format!(
        "{PROCESS}[daemon]\nmax_connections_per_peer = 512\n"
    ));
    let mut idle: Vec<std::net::TcpStream> = (0..200).map(|_| connect(&d.url)).collect();
    for (i, conn) in idle.iter_mut().enumerate() {
        if i % 2 == 0 {
            conn.write_all(b"GET / HTTP/1.1\r\nHo")
                .expect("send the start of a request");
        }
    }
    assert_eq!(get(&d.url, "/healthz", None).status, 200);
    assert_eq!(get(&d.url, "/v1/providers", Some(&d.token)).status, 200);
    drop(idle);
    for _ in 0..20 {
        assert_eq!(get(&d.url, "/healthz", None).status, 200);
    }
    assert_eq!(get(&d.url, "/v1/providers", Some(&d.token)).status, 200);
}

/// True while the daemon holds `conn` open: no data and no close within a short wait.
fn still_open(conn: &mut std::net::TcpStream) -> bool {
    use std::io::Read;
    conn.set_read_timeout(Some(Duration::from_millis(300)))
        .expect("set a read timeout");
    let mut buf = [0u8; 64];
    matches!(
        conn.read(&mut buf),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
    )
}

#[test]
fn connections_beyond_max_connections_are_closed_unanswered_until_others_end() {
    use std::io::Write;
    // A long header timeout, so the idle connections hold their places for the whole test.
    let d = Spawned::start("max_connections = 4\nheader_timeout_secs = 120");
    // Four idle connections, sending nothing. One the daemon closed (a permit still held by
    // a start-up request not yet seen to end) is replaced.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut idle: Vec<std::net::TcpStream> = Vec::new();
    loop {
        while idle.len() < 4 {
            idle.push(connect(&d.url));
        }
        idle.retain_mut(still_open);
        if idle.len() == 4 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "could not hold 4 idle connections; logs:\n{}",
            d.logs()
        );
    }
    // A fifth connection's request gets no answer: it is closed at once.
    let mut fifth = connect(&d.url);
    // The daemon may close it before the request is written: then the write fails, fine.
    let _ = fifth.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    let got = read_until_closed(&mut fifth, CLOSED_WITHIN)
        .unwrap_or_else(|e| panic!("a connection beyond the cap: {e}"));
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
    // The idle ones were not touched.
    for conn in &mut idle {
        assert!(
            still_open(conn),
            "an idle connection within the cap was closed"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.logs().contains("connection cap reached") {
        assert!(
            Instant::now() < deadline,
            "no `connection cap reached` line; logs:\n{}",
            d.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        d.logs()
            .lines()
            .any(|l| l.contains("connection cap reached") && l.contains("\"max_connections\":4")),
        "logs:\n{}",
        d.logs()
    );

    // Once they are gone, requests are served again (their ends are seen shortly after).
    drop(idle);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let served = agent()
            .get(format!("{}/healthz", d.url))
            .call()
            .map(|r| r.status().as_u16());
        if matches!(served, Ok(200)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not served 10 s after the idle connections were dropped: {served:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(get(&d.url, "/v1/providers", Some(&d.token)).status, 200);
}

#[test]
fn the_daemon_keeps_serving_after_running_out_of_file_descriptors() {
    let mut d = Spawned::start("header_timeout_secs = 1");
    let pid = rustix::process::Pid::from_child(&d.child);
    // Room for only a few more descriptors than it holds now.
    let open = std::fs::read_dir(format!("/proc/{}/fd", d.child.id()))
        .expect("list the daemon's descriptors")
        .count() as u64;
    let limit = open + 16;
    rustix::process::prlimit(
        Some(pid),
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(limit),
            maximum: Some(limit),
        },
    )
    .expect("lower the daemon's descriptor limit");
    // More connections than descriptors left, fewer than the listen backlog (128), so every
    // connect succeeds whether or not the daemon accepts it.
    let conns: Vec<std::net::TcpStream> = (0..64).map(|_| connect(&d.url)).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !d.logs().contains("cannot accept a connection") {
        assert!(
            Instant::now() < deadline,
            "the daemon never ran out of descriptors (limit {limit}); logs:\n{}",
            d.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(conns);
    // Still serving, now that descriptors are free again.
    assert_eq!(get(&d.url, "/healthz", None).status, 200);
    assert_eq!(get(&d.url, "/v1/providers", Some(&d.token)).status, 200);
    d.signal(rustix::process::Signal::TERM);
    let status = d.wait_exit();
    assert_eq!(status.code(), Some(0), "logs:\n{}", d.logs());
}

const GRANT_TOKEN: &str = "tok-7d2e9b41c0a85f36e1d4";
const SHORT_KEY: &str = "short-key-5c1e0a";

/// A grants file: each named profile grants caller `test` `GET /orders/*` on `api` with the
/// static token in `ORDERS_API_TOKEN`.
fn grants_file_text(api: &str, profiles: &[&str]) -> String {
    profiles
        .iter()
        .map(|p| {
            format!(
                "[profiles.{p}]\nbase_url = \"{api}\"\nroutes = [\"GET /orders/*\"]\ncallers = [\"test\"]\n\
                 call_budget = 5\n[profiles.{p}.credential]\nkind = \"static\"\nsecret_env = \"ORDERS_API_TOKEN\"\n\n"
            )
        })
        .collect()
}

fn grant_run(id: &str, grant: &str, code: &str) -> String {
    serde_json::json!({
        "protocol": 1,
        "request_id": id,
        "grant": grant,
        "run": {"kind": "snippet", "language": "python", "code": code},
    })
    .to_string()
}

const GET_ORDER: &str = "import plimsoll_host as host\nprint(host.get('/orders/7')['path'])";

/// Sends SIGHUP and waits for the `n`th log line carrying `message`.
fn hup_and_wait(d: &Spawned, message: &str, n: usize) {
    d.signal(rustix::process::Signal::HUP);
    let needle = format!("\"message\":\"{message}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while d.logs().matches(&needle).count() < n {
        assert!(
            Instant::now() < deadline,
            "no {n}th `{message}` line after SIGHUP; logs:\n{}",
            d.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sighup_reloads_the_grants_file_and_keeps_the_old_profiles_when_it_is_broken() {
    let test = "sighup_reloads_the_grants_file_and_keeps_the_old_profiles_when_it_is_broken";
    let api = plimsoll_testing::api::TestApi::start(plimsoll_testing::api::Expect::Static {
        header: "authorization".into(),
        value: format!("Bearer {GRANT_TOKEN}"),
    });
    let dir = tempfile::tempdir().unwrap();
    let grants = dir.path().join("grants.toml");
    std::fs::write(&grants, grants_file_text(&api.url(), &["orders"])).unwrap();
    let mut d = Spawned::start_with(
        "",
        &["--grants".as_ref(), grants.as_os_str()],
        &[("ORDERS_API_TOKEN", GRANT_TOKEN), ("SHORT_KEY", SHORT_KEY)],
    );
    if !process_available(test, &d.url, &d.token) {
        return;
    }
    let run = |id: &str, grant: &str| {
        post(
            &d.url,
            Some(&d.token),
            grant_run(id, grant, GET_ORDER).as_bytes(),
        )
    };
    let passes = |id: &str, grant: &str| {
        let r = run(id, grant).run();
        assert_eq!(r.result.stdout.to_string_lossy(), "/orders/7\n", "{r:?}");
    };
    let refused = |id: &str, grant: &str| {
        let a = run(id, grant);
        assert_eq!(a.status, 403, "{}", a.body);
        assert_eq!(a.error().error.not_dispatched, Some(Reason::Permission));
    };

    // A profile the file does not hold yet is refused; the one it holds works.
    refused("g-1", "orders-new");
    passes("g-2", "orders");

    // Added to the file, it works after SIGHUP, through the broker, with the credential.
    std::fs::write(
        &grants,
        grants_file_text(&api.url(), &["orders", "orders-new"]),
    )
    .unwrap();
    hup_and_wait(&d, "grants file reloaded", 1);
    assert!(d.logs().contains("\"profiles\":2"), "{}", d.logs());
    passes("g-3", "orders-new");
    passes("g-4", "orders");
    let seen = api.seen();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(seen.iter().all(|s| s.authorized), "{seen:?}");

    // A broken file (a JWT key too short: the error names the variable, not its value)
    // keeps every profile in force.
    let broken = format!(
        "{}[profiles.bad]\nbase_url = \"{}\"\nroutes = [\"GET /orders/*\"]\ncallers = [\"test\"]\ncall_budget = 1\n\
         [profiles.bad.credential]\nkind = \"jwt\"\nkey_env = \"SHORT_KEY\"\naudience = \"orders-api\"\n",
        grants_file_text(&api.url(), &["orders"]),
        api.url()
    );
    std::fs::write(&grants, broken).unwrap();
    hup_and_wait(&d, "cannot reload the grants file", 1);
    let logs = d.logs();
    let line = logs
        .lines()
        .find(|l| l.contains("cannot reload the grants file"))
        .unwrap();
    assert!(line.contains("\"level\":\"ERROR\""), "{line}");
    assert!(line.contains(&grants.display().to_string()), "{line}");
    assert!(line.contains("SHORT_KEY"), "{line}");
    passes("g-5", "orders-new");
    passes("g-6", "orders");
    refused("g-7", "bad");

    // Revoking a profile takes effect for later runs; a run in flight keeps its profile.
    let in_flight = {
        let (url, token) = (d.url.clone(), d.token.clone());
        let body = grant_run(
            "g-8",
            "orders",
            &format!("import time\ntime.sleep(2)\n{GET_ORDER}"),
        );
        std::thread::spawn(move || post(&url, Some(&token), body.as_bytes()))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while samples(&get(&d.url, "/metrics", None).body).get("plimsoll_runs_in_flight") != Some(&1.0)
    {
        assert!(Instant::now() < deadline, "the run never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::write(&grants, grants_file_text(&api.url(), &["orders-new"])).unwrap();
    hup_and_wait(&d, "grants file reloaded", 2);
    let r = in_flight.join().unwrap().run();
    assert_eq!(r.result.stdout.to_string_lossy(), "/orders/7\n", "{r:?}");
    refused("g-9", "orders");
    passes("g-10", "orders-new");

    d.signal(rustix::process::Signal::TERM);
    assert_eq!(d.wait_exit().code(), Some(0), "logs:\n{}", d.logs());
    let logs = d.logs();
    assert!(
        !logs.contains(GRANT_TOKEN),
        "the grant's token reached the logs"
    );
    assert!(
        !logs.contains(SHORT_KEY),
        "a secret's value reached the logs"
    );
}

/// The pids of `parent`'s children, read from /proc (each with its command line's arguments,
/// the program's name left out).
fn children_of(parent: u32) -> Vec<(u32, Vec<String>)> {
    let mut children = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // pid (comm) state ppid ...: the comm may hold spaces, so split after its ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid != Some(parent) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .skip(1)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        children.push((pid, args));
    }
    children
}

/// The broker process plimsolld `daemon` runs (its child started as `plimsolld
/// broker-process`), waiting up to 30 s for one other than `not`.
fn broker_process(daemon: u32, not: Option<u32>) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let found = children_of(daemon).into_iter().find(|(pid, args)| {
            args.first().map(String::as_str) == Some("broker-process") && Some(*pid) != not
        });
        if let Some((pid, _)) = found {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "no broker process under plimsolld {daemon}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits up to 10 s for process `pid` (a broker process just started, which installs its
/// filter first thing) to be under a seccomp filter.
fn filtered_soon(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while status_field(pid, "Seccomp") != "2" {
        assert!(
            Instant::now() < deadline,
            "broker process {pid} is under no seccomp filter"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The value of `key` in /proc/PID/status.
fn status_field(pid: u32, key: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status:\n{status}"))
        .trim()
        .to_owned()
}

/// Which daemon's rows of docs/privileges.md's "Checked on a running daemon" table apply,
/// and who its unprivileged users are.
#[derive(Clone, Copy)]
enum Daemon {
    /// The default daemon, its broker process running as this user.
    Default {
        broker: plimsoll_broker::apart::ProcessUser,
    },
    /// The split daemon, serving as one user, its launcher's broker process running as the
    /// other.
    Split {
        serving: plimsoll_broker::apart::ProcessUser,
        broker: plimsoll_broker::apart::ProcessUser,
    },
}

/// Compares the processes of plimsolld `daemon` (it and its children that are plimsolld
/// too) with docs/privileges.md's "Checked on a running daemon" table: the rows of `kind`,
/// every one of them, and no process they do not list.
fn check_privileges_table(daemon: u32, kind: Daemon) {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/privileges.md"),
    )
    .unwrap();
    let section = doc
        .split("## Checked on a running daemon")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("docs/privileges.md has its table of the daemon's processes");
    let which = match kind {
        Daemon::Default { .. } => "default",
        Daemon::Split { .. } => "split",
    };
    let rows: Vec<Vec<&str>> = section
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| daemon"))
        .map(|l| l.trim_matches('|').split('|').map(str::trim).collect())
        .collect();
    assert_eq!(rows.len(), 5, "{section}");
    let rows: Vec<&[&str]> = rows
        .iter()
        .filter(|r| r[0] == which)
        .map(|r| &r[1..])
        .collect();
    let me = std::fs::read_to_string("/proc/self/status").unwrap();
    let mine = |key: &str| {
        me.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}:")))
            .unwrap()
            .trim()
            .to_owned()
    };
    // The daemon's processes: it, and each descendant through plimsolld processes that runs
    // plimsolld itself (the launcher's broker process too), named by its first argument.
    let exe = std::fs::read_link(format!("/proc/{daemon}/exe")).unwrap();
    let mut processes = vec![(daemon, "plimsolld".to_owned())];
    let mut next = 0;
    while let Some(&(parent, _)) = processes.get(next) {
        next += 1;
        let parent_args = std::fs::read(format!("/proc/{parent}/cmdline")).unwrap_or_default();
        for (pid, args) in children_of(parent) {
            // A child between fork and exec (a helper or a sandbox being started) is still a
            // copy of its parent, its command line the parent's: not a process of its own.
            let copy =
                std::fs::read(format!("/proc/{pid}/cmdline")).ok() == Some(parent_args.clone());
            if !copy && std::fs::read_link(format!("/proc/{pid}/exe")).ok() == Some(exe.clone()) {
                let first = args.first().cloned().unwrap_or_default();
                processes.push((pid, format!("plimsolld {first}")));
            }
        }
    }
    for (pid, name) in &processes {
        let row = rows.iter().find(|r| r[0] == name).unwrap_or_else(|| {
            panic!("docs/privileges.md does not list the {which} daemon's process `{name}`")
        });
        let id = |cell: &str, uid: bool| -> String {
            let user = match (cell, kind) {
                ("root", _) => return "0".into(),
                ("broker_user", Daemon::Default { broker } | Daemon::Split { broker, .. }) => {
                    broker
                }
                ("serving_user", Daemon::Split { serving, .. }) => serving,
                (other, _) => panic!("unknown id `{other}` in docs/privileges.md ({which})"),
            };
            if uid { user.uid } else { user.gid }.to_string()
        };
        let caps = |cell: &str| -> String {
            match cell {
                "full" => mine("CapBnd"),
                "0" => "0000000000000000".into(),
                other => panic!("unknown capabilities `{other}` in docs/privileges.md"),
            }
        };
        let first = |key: &str| {
            status_field(*pid, key)
                .split_whitespace()
                .next()
                .unwrap()
                .to_owned()
        };
        assert_eq!(first("Uid"), id(row[1], true), "{name}: uid");
        assert_eq!(first("Gid"), id(row[2], false), "{name}: gid");
        assert_eq!(status_field(*pid, "CapEff"), caps(row[3]), "{name}: CapEff");
        assert_eq!(status_field(*pid, "CapBnd"), caps(row[4]), "{name}: CapBnd");
        let nnp = if row[5] == "as started" {
            mine("NoNewPrivs")
        } else {
            row[5].to_owned()
        };
        assert_eq!(status_field(*pid, "NoNewPrivs"), nnp, "{name}: NoNewPrivs");
        assert_eq!(status_field(*pid, "Seccomp"), row[6], "{name}: Seccomp");
    }
    assert_eq!(
        processes.len(),
        rows.len(),
        "the {which} daemon's processes: {processes:?}"
    );
}

/// The broker process's user (`None`, after `skip_or_fail`, when this host lacks it) and an
/// API that answers a call bearing [`GRANT_TOKEN`].
fn broker_user_and_api(
    test: &str,
) -> Option<(
    plimsoll_broker::apart::ProcessUser,
    plimsoll_testing::api::TestApi,
)> {
    let user =
        match plimsoll_broker::apart::ProcessUser::lookup(plimsoll_broker::apart::DEFAULT_USER) {
            Ok(u) => u,
            Err(why) => {
                skip_or_fail(
                    test,
                    &format!("user plimsoll-broker, {why}: run scripts/install-deps"),
                );
                return None;
            }
        };
    let api = plimsoll_testing::api::TestApi::start(plimsoll_testing::api::Expect::Static {
        header: "authorization".into(),
        value: format!("Bearer {GRANT_TOKEN}"),
    });
    Some((user, api))
}

/// docs/privileges.md: with a grants file, the brokers run in a process of their own, as
/// plimsoll-broker, with no capability, no_new_privs, its seccomp filter, not dumpable, and
/// holding no descriptor but its control socket; killed, it is started again and grants
/// work on.
#[test]
fn the_broker_process_runs_unprivileged_under_its_filter_and_comes_back() {
    use std::os::unix::fs::MetadataExt as _;
    let test = "the_broker_process_runs_unprivileged_under_its_filter_and_comes_back";
    let Some((user, api)) = broker_user_and_api(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let grants = dir.path().join("grants.toml");
    std::fs::write(&grants, grants_file_text(&api.url(), &["orders"])).unwrap();
    let mut d = Spawned::start_with(
        "",
        &["--grants".as_ref(), grants.as_os_str()],
        &[("ORDERS_API_TOKEN", GRANT_TOKEN)],
    );
    if !process_available(test, &d.url, &d.token) {
        return;
    }
    let passes = |id: &str| {
        let r = post(
            &d.url,
            Some(&d.token),
            grant_run(id, "orders", GET_ORDER).as_bytes(),
        )
        .run();
        assert_eq!(r.result.stdout.to_string_lossy(), "/orders/7\n", "{r:?}");
        assert_eq!(r.result.calls.len(), 1, "{r:?}");
    };
    passes("b-1");
    let pid = broker_process(d.child.id(), None);
    let ids = |key: &str| {
        status_field(pid, key)
            .split_whitespace()
            .map(|v| v.parse::<u32>().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        ids("Uid"),
        vec![user.uid; 4],
        "real, effective, saved and fs uid"
    );
    assert_eq!(
        ids("Gid"),
        vec![user.gid; 4],
        "real, effective, saved and fs gid"
    );
    assert_eq!(status_field(pid, "Groups"), "", "no supplementary group");
    for caps in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(status_field(pid, caps), "0000000000000000", "{caps}");
    }
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");
    assert_eq!(status_field(pid, "Seccomp"), "2", "a seccomp filter");
    // Not dumpable: its /proc files belong to root, not to its uid, so another process of
    // that uid could not read its memory or environment.
    let meta = std::fs::metadata(format!("/proc/{pid}/mem")).unwrap();
    assert_eq!(
        meta.uid(),
        0,
        "its /proc/PID/mem belongs to its uid: it is dumpable"
    );
    // Idle, it holds standard input, output and error, the control socket, and at most the
    // kept-alive TCP connections of the grants' HTTP client: nothing of the daemon's (no
    // listener, file or directory, no launcher).
    let tcp: String = ["tcp", "tcp6"]
        .iter()
        .map(|f| std::fs::read_to_string(format!("/proc/{pid}/net/{f}")).unwrap_or_default())
        .collect();
    let tcp_inodes: Vec<&str> = tcp
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(9))
        .collect();
    let mut fds: Vec<(u32, String)> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let fd = e.file_name().to_str()?.parse().ok()?;
            Some((fd, std::fs::read_link(e.path()).ok()?.display().to_string()))
        })
        .collect();
    fds.sort_unstable();
    assert_eq!(fds[0].1, "/dev/null", "{fds:?}");
    assert!(
        fds[1].1.starts_with("pipe:") && fds[2].1.starts_with("pipe:"),
        "{fds:?}"
    );
    assert!(fds[3].0 == 3 && fds[3].1.starts_with("socket:"), "{fds:?}");
    for (fd, target) in &fds[4..] {
        let inode = target
            .strip_prefix("socket:[")
            .and_then(|t| t.strip_suffix(']'));
        assert!(
            inode.is_some_and(|i| tcp_inodes.contains(&i)),
            "descriptor {fd} of the idle broker process is {target}, not an upstream TCP connection: {fds:?}"
        );
    }

    // docs/privileges.md's table of the daemon's processes holds for each of them.
    check_privileges_table(d.child.id(), Daemon::Default { broker: user });

    // Killed, it is started again, and a grant works on.
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let again = broker_process(d.child.id(), Some(pid));
    filtered_soon(again);
    passes("b-2");
    assert!(
        d.logs().contains("the broker process ended"),
        "{}",
        d.logs()
    );

    d.signal(rustix::process::Signal::TERM);
    assert_eq!(d.wait_exit().code(), Some(0), "logs:\n{}", d.logs());
    assert!(
        !d.logs().contains(GRANT_TOKEN),
        "the grant's token reached the logs"
    );
}

#[test]
fn a_provider_serves_while_a_slower_probe_still_runs() {
    let test = "a_provider_serves_while_a_slower_probe_still_runs";
    if !rustix::process::geteuid().is_root() {
        skip_or_fail(test, "running sandboxes needs root");
        return;
    }
    let assets = plimsoll_engine::settings::default_vm_assets_dir();
    if !std::path::Path::new("/usr/bin/qemu-system-x86_64").exists()
        || !assets.join("vmlinux").is_file()
    {
        skip_or_fail(
            test,
            "needs QEMU and the VM assets (scripts/install-deps, scripts/build-vm-assets)",
        );
        return;
    }
    // qemu is listed first: probed one after another, process would wait for a VM to boot
    // (seconds under TCG) before serving. Probed at once, process serves when its own probe
    // passed. The run below is real, and qemu's probe is a real boot.
    let started = Instant::now();
    let listed_at = |url: &str, token: &str| -> Vec<String> {
        let a = get(url, "/v1/providers", Some(token));
        assert_eq!(a.status, 200, "{}", a.body);
        let p: ProvidersResponse = serde_json::from_str(&a.body).unwrap();
        p.providers.into_iter().map(|p| p.name).collect()
    };
    let d = Spawned::start_settings_until(
        "default_floor = \"process\"\nproviders = [\"qemu\", \"process\"]\n",
        "",
        &[],
        &[],
        &|url, token| listed_at(url, token).iter().any(|n| n == "process"),
    );
    let serving_ms = started.elapsed().as_millis();
    let listed = |d: &Spawned| listed_at(&d.url, &d.token);
    // Ready means every start-up probe ended: not yet, while qemu boots.
    let before = listed(&d);
    if before == ["process"] {
        assert_eq!(get(&d.url, "/readyz", None).status, 503, "{}", d.logs());
    }
    let r = post(
        &d.url,
        Some(&d.token),
        snippet("first-run", "python", "print('served')").as_bytes(),
    )
    .run();
    let served_ms = started.elapsed().as_millis();
    assert_eq!(r.provider, "process");
    assert_eq!(r.result.stdout.to_string_lossy(), "served\n");
    let after = listed(&d);
    assert_eq!(
        before,
        ["process"],
        "qemu's probe had ended before process served"
    );
    assert_eq!(
        after,
        ["process"],
        "qemu's probe had ended before process's run ended"
    );
    // A run only qemu could take is refused, nothing dispatched, while its probe runs.
    let a = post(
        &d.url,
        Some(&d.token),
        serde_json::json!({
            "protocol": 1, "request_id": "floor-kernel", "minimum_isolation": "kernel",
            "run": {"kind": "snippet", "language": "python", "code": "print(1)"}
        })
        .to_string()
        .as_bytes(),
    );
    if listed(&d) == ["process"] {
        let v: serde_json::Value = serde_json::from_str(&a.body).unwrap();
        assert_eq!(v["error"]["not_dispatched"], "isolation", "{}", a.body);
        assert!(a.body.contains("not probed yet"), "{}", a.body);
    }
    // Let qemu's probe end before the daemon is stopped, so no VM is left booting; then
    // the daemon is ready.
    let deadline = Instant::now() + Duration::from_secs(300);
    while get(&d.url, "/readyz", None).status != 200 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(get(&d.url, "/readyz", None).status, 200, "{}", d.logs());
    eprintln!(
        "{test}: process served after {serving_ms} ms, first run served after {served_ms} ms, every probe ended (ready) after {} ms",
        started.elapsed().as_millis()
    );
}

/// Prints `SKIP`, or fails under CI=true.
fn skip_or_fail(test: &str, why: &str) {
    if env::strict() {
        panic!("SKIP not allowed under CI=true: {test}: {why}");
    }
    eprintln!("SKIP {test}: {why}");
}

/// A raw connection to the daemon at `url` from the loopback address `from` (e.g.
/// `127.0.0.2`: another peer on the same host).
fn connect_from(url: &str, from: &str) -> std::net::TcpStream {
    let to: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let from: std::net::SocketAddr = format!("{from}:0").parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(from).expect("bind the client's source address");
        let stream = socket.connect(to).await.expect("connect to the daemon");
        let std = stream.into_std().unwrap();
        std.set_nonblocking(false).unwrap();
        std
    })
}

/// Sends `request` on a fresh connection (from `from`) and reads the answer until the daemon
/// closes it or `bound` passes: status and body.
fn exchange_from(url: &str, from: &str, request: &[u8], bound: Duration) -> (u16, String) {
    use std::io::Write;
    let mut conn = connect_from(url, from);
    conn.write_all(request).expect("send the request");
    let got = read_until_closed(&mut conn, bound).unwrap_or_else(|e| panic!("{e}"));
    let text = String::from_utf8_lossy(&got).into_owned();
    let (status, head, body) = http_answer(&text, "");
    let status = status.unwrap_or_else(|| panic!("no status line: {head:?}"));
    (status, body.to_owned())
}

/// A raw HTTP answer's status (if its status line has one), head and body; a text with no
/// head at all fails the test, naming `request`.
fn http_answer<'a>(text: &'a str, request: &str) -> (Option<u16>, &'a str, &'a str) {
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP answer to {request:?}: {text:?}"));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok());
    (status, head, body)
}

#[test]
fn one_peer_cannot_hold_every_connection_place() {
    use std::io::Write;
    // Room for 16 at once, 2 per peer; a long header timeout so idle ones keep their places.
    let d = Spawned::start(
        "max_connections = 16\nmax_connections_per_peer = 2\nheader_timeout_secs = 120",
    );
    // Peer 127.0.0.1 holds its two places with idle connections (one the daemon has not yet
    // seen end, e.g. the start-up readiness check's, is replaced).
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut idle: Vec<std::net::TcpStream> = Vec::new();
    loop {
        while idle.len() < 2 {
            idle.push(connect_from(&d.url, "127.0.0.1"));
        }
        idle.retain_mut(still_open);
        if idle.len() == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "could not hold 2 idle connections; logs:\n{}",
            d.logs()
        );
    }
    // Its third is closed at once, unanswered, though the global cap has room.
    let mut third = connect_from(&d.url, "127.0.0.1");
    let _ = third.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    let got = read_until_closed(&mut third, CLOSED_WITHIN)
        .unwrap_or_else(|e| panic!("a third connection from one peer: {e}"));
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
    // Another peer is served meanwhile.
    let (status, body) = exchange_from(
        &d.url,
        "127.0.0.2",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        CLOSED_WITHIN,
    );
    assert_eq!(status, 200, "{body}");
    for conn in &mut idle {
        assert!(
            still_open(conn),
            "an idle connection within the cap was closed"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.logs().contains("per-peer connection cap reached") {
        assert!(
            Instant::now() < deadline,
            "no `per-peer connection cap reached` line; logs:\n{}",
            d.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Once one of its connections ends, the peer is served again.
    idle.pop();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut conn = connect_from(&d.url, "127.0.0.1");
        let _ = conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let got = read_until_closed(&mut conn, CLOSED_WITHIN).unwrap_or_default();
        if String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not served 10 s after one of its connections ended"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One exchange on a fresh connection the client closes itself once the answer is read
/// whole, as a client that uses a connection per exchange does: the answer's status, or 0
/// when the daemon closed the connection unanswered.
fn exchange_and_close(url: &str, request: &[u8]) -> u16 {
    use std::io::{Read, Write};
    let mut conn = connect(url);
    conn.set_read_timeout(Some(CLOSED_WITHIN)).unwrap();
    if conn.write_all(request).is_err() {
        return 0;
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&got);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap())
                })
                .expect("a content-length");
            if body.len() >= length {
                return head
                    .split(' ')
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
            }
        }
        match conn.read(&mut buf) {
            Ok(0) | Err(_) if got.is_empty() => return 0,
            Ok(0) => panic!("closed mid-answer: {text:?}"),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!("{e}: {text:?}"),
        }
    }
}

/// A peer whose clients each hold one connection at a time, closing each before opening
/// the next, is never refused at a per-peer cap equal to their number: a closed connection
/// gives its place back (it was counted until the daemon's task for it next ran, so a
/// client's next connection could find its own last one still counted; issue 28, finding
/// 17: 8 refusals at ~1,100 requests/s from 32 threads).
#[test]
fn a_peer_s_closed_connections_give_their_places_back() {
    const CLIENTS: usize = 4;
    const EACH: usize = 300;
    let d = Spawned::start(&format!("max_connections_per_peer = {CLIENTS}"));
    let refused = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..CLIENTS {
            scope.spawn(|| {
                for _ in 0..EACH {
                    match exchange_and_close(&d.url, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n") {
                        200 => {}
                        0 => {
                            refused.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                        other => panic!("healthz answered {other}"),
                    }
                }
            });
        }
    });
    let refused = refused.into_inner();
    assert_eq!(
        refused,
        0,
        "{refused} of {} connections refused at a cap of {CLIENTS} with {CLIENTS} open at most; logs:\n{}",
        CLIENTS * EACH,
        d.logs()
    );
}

/// A `POST /v1/runs` with `body` as it is, and the ErrorResponse it must get: 400, nothing
/// ran, and `id` echoed.
fn assert_refused_with_id(d: &TestDaemon, what: &str, body: &[u8], id: &str) {
    let a = post(&d.url, Some(&d.token), body);
    assert_eq!(a.status, 400, "{what}: {}", a.body);
    let e = a.error();
    assert_eq!(e.error.not_dispatched, Some(Reason::Request), "{what}");
    assert_eq!(e.request_id.as_deref(), Some(id), "{what}: {}", a.body);
}

#[test]
fn a_body_that_arrives_whole_but_does_not_parse_has_its_request_id_echoed() {
    let d = TestDaemon::start(PROCESS);
    let valid = |id: &str| snippet(id, "python", "print(1)");
    assert_refused_with_id(
        &d,
        "truncated JSON",
        br#"{"protocol":1,"request_id":"bad-1","run":{"kind":"snippet","language":"py"#,
        "bad-1",
    );
    let mut invalid_utf8 = valid("bad-2").into_bytes();
    let at = invalid_utf8.len() - 6;
    invalid_utf8.insert(at, 0xff);
    assert_refused_with_id(&d, "invalid UTF-8", &invalid_utf8, "bad-2");
    let bom = [&b"\xef\xbb\xbf"[..], valid("bad-3").as_bytes()].concat();
    assert_refused_with_id(&d, "a byte order mark", &bom, "bad-3");
    let deep = format!(
        r#"{{"protocol":1,"request_id":"bad-4","run":{}{}}}"#,
        "[".repeat(1000),
        "]".repeat(1000)
    );
    assert_refused_with_id(&d, "deep nesting", deep.as_bytes(), "bad-4");
    // Content-Length and chunked together (the shape of request smuggling). hyper reads the
    // body by its chunks alone, drops the Content-Length and closes the connection after the
    // answer (RFC 9112, 6.3), so nothing can follow on the connection: well-formed chunks
    // are one ordinary request, and a body framed by its length instead is refused as
    // unreadable, nothing having run.
    let chunked_with_length = |body: &str, framed: &str| {
        format!(
            "POST /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\
             Transfer-Encoding: chunked\r\n\r\n{framed}",
            d.token,
            body.len(),
        )
    };
    let body = valid("bad-5");
    let chunks = format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len());
    let request = chunked_with_length(&body, &chunks);
    let (status, answer) = exchange_from(&d.url, "127.0.0.1", request.as_bytes(), CLOSED_WITHIN);
    assert_eq!(
        status, 200,
        "well-formed chunks beside a Content-Length: {answer}"
    );
    assert!(answer.contains(r#""request_id":"bad-5""#), "{answer}");
    let ran_before = runs_total(&d.url);
    let body = valid("bad-6");
    let request = chunked_with_length(&body, &body);
    let (status, answer) = exchange_from(&d.url, "127.0.0.1", request.as_bytes(), CLOSED_WITHIN);
    assert_eq!(
        status, 400,
        "a length-framed body declared chunked: {answer}"
    );
    let e: ErrorResponse = serde_json::from_str(&answer)
        .unwrap_or_else(|err| panic!("not an ErrorResponse ({err}): {answer:?}"));
    assert_eq!(e.error.not_dispatched, Some(Reason::Request), "{answer}");
    assert_eq!(runs_total(&d.url), ran_before, "nothing ran: {answer}");
    // An id that is itself invalid is never echoed.
    let a = post(&d.url, Some(&d.token), br#"{"request_id":"a b","run":"#);
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(a.error().request_id, None);

    assert_eq!(get(&d.url, "/healthz", None).status, 200);
}

#[test]
fn hyper_s_own_answers_to_a_broken_head_are_error_responses() {
    let d = TestDaemon::start(PROCESS);
    let many_headers: String = (0..200).map(|i| format!("X-{i}: a\r\n")).collect();
    for (what, request, status) in [
        (
            "a malformed header",
            "GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n".to_owned(),
            400,
        ),
        (
            "too many headers",
            format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{many_headers}\r\n"),
            431,
        ),
        (
            "a request target too long",
            format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(70_000)),
            414,
        ),
    ] {
        let (got, body) = exchange_from(&d.url, "127.0.0.1", request.as_bytes(), CLOSED_WITHIN);
        assert_eq!(got, status, "{what}: {body}");
        let e: ErrorResponse = serde_json::from_str(&body)
            .unwrap_or_else(|err| panic!("{what}: not an ErrorResponse ({err}): {body:?}"));
        assert_eq!(e.request_id, None, "{what}");
        assert_eq!(e.error.code, "request", "{what}");
        assert_eq!(e.error.not_dispatched, Some(Reason::Request), "{what}");
        assert!(!e.error.message.is_empty(), "{what}");
    }
    assert_eq!(get(&d.url, "/healthz", None).status, 200);
}

/// Sends `request` as it is on a fresh connection and reads until the daemon closes it:
/// status, head and body.
fn raw_exchange(url: &str, request: &str) -> (u16, String, String) {
    use std::io::Write;
    let mut conn = connect(url);
    conn.write_all(request.as_bytes())
        .expect("send the request");
    let got = read_until_closed(&mut conn, CLOSED_WITHIN).unwrap_or_else(|e| panic!("{e}"));
    let text = String::from_utf8_lossy(&got).into_owned();
    let (status, head, body) = http_answer(&text, request);
    (
        status.unwrap_or(0),
        head.to_ascii_lowercase(),
        body.to_owned(),
    )
}

/// A session route whose path or query cannot be read (axum's extractors refused them with a
/// plain-text 400, before the token check) answers as every route does: 401 without a
/// token, else a 400 `ErrorResponse` marked not dispatched (issue 28, finding 17).
#[test]
fn a_session_route_with_an_unreadable_path_or_query_is_refused_after_the_token() {
    let d = TestDaemon::start(PROCESS);
    let sid = format!("ses_{}_{}", "0".repeat(16), "0".repeat(32));
    let body = snippet("c-1", "python", "print(1)");
    for (method, target, body) in [
        (
            "POST",
            format!("/v1/sessions/{sid}/cells?restart=1"),
            body.as_str(),
        ),
        (
            "POST",
            format!("/v1/sessions/{sid}/cells?restart=maybe"),
            body.as_str(),
        ),
        ("POST", "/v1/sessions/%ff/cells".to_owned(), body.as_str()),
        ("POST", "/v1/sessions/%ff/steps".to_owned(), body.as_str()),
        ("GET", "/v1/sessions/%ff".to_owned(), ""),
        ("DELETE", "/v1/sessions/%ff".to_owned(), ""),
        ("PUT", format!("/v1/sessions/{sid}/files/a%ffb"), "bytes"),
        ("GET", format!("/v1/sessions/{sid}/files/%ff"), ""),
    ] {
        let what = format!("{method} {target}");
        for token in [None, Some(d.token.as_str())] {
            let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
            let request = format!(
                "{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}plimsoll-request-id: h-1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            let (status, head, text) = raw_exchange(&d.url, &request);
            assert!(
                head.contains("content-type: application/json"),
                "{what}: {head}"
            );
            let e: ErrorResponse = serde_json::from_str(&text)
                .unwrap_or_else(|err| panic!("{what}: not an ErrorResponse ({err}): {text:?}"));
            assert_eq!(e.request_id.as_deref(), Some("h-1"), "{what}: {text}");
            if token.is_none() {
                assert_eq!(status, 401, "{what} without a token: {text}");
                assert_eq!(e.error.not_dispatched, Some(Reason::Permission), "{what}");
            } else {
                assert_eq!(status, 400, "{what}: {text}");
                assert_eq!(e.error.code, "request", "{what}");
                assert_eq!(e.error.not_dispatched, Some(Reason::Request), "{what}");
            }
        }
    }
}

/// A session open or call whose body arrives whole but does not parse echoes the request id
/// it holds, as `/v1/runs` does; an array where the schema says object is refused, not read
/// positionally (issue 28, finding 17).
#[test]
fn a_session_body_that_does_not_parse_has_its_request_id_echoed_and_arrays_are_refused() {
    let d = TestDaemon::start(PROCESS);
    let sid = format!("ses_{}_{}", "0".repeat(16), "0".repeat(32));
    let cells = format!("/v1/sessions/{sid}/cells");
    let steps = format!("/v1/sessions/{sid}/steps");
    for (path, body, id) in [
        (
            "/v1/sessions",
            r#"{"request_id":"o-1","protocol":1,"language":"#,
            "o-1",
        ),
        (
            "/v1/sessions",
            "{\"request_id\":\"o-2\",\"protocol\":1,\"language\":\"python\"}\u{feff}",
            "o-2",
        ),
        (
            "/v1/sessions",
            r#"{"request_id":"o-3","protocol":1,"language":"python","limits":[100]}"#,
            "o-3",
        ),
        (
            cells.as_str(),
            r#"{"request_id":"c-1","protocol":1,"run":{"kind":"snip"#,
            "c-1",
        ),
        (
            cells.as_str(),
            r#"{"request_id":"c-2","protocol":1,"limits":[100],"run":{"kind":"snippet","language":"python","code":"1"}}"#,
            "c-2",
        ),
        (
            steps.as_str(),
            r#"{"request_id":"s-1","protocol":1,"run":{"#,
            "s-1",
        ),
    ] {
        let a = call(&d.url, "POST", path, &d.token, Some(body.as_bytes()), &[]);
        assert_eq!(a.status, 400, "{path} {body}: {}", a.body);
        let e = a.error();
        assert_eq!(e.error.not_dispatched, Some(Reason::Request), "{body}");
        assert_eq!(
            e.request_id.as_deref(),
            Some(id),
            "{path} {body}: {}",
            a.body
        );
    }
    // `/v1/runs` too: `"limits": [100]` is not `{"timeout_ms": 100}`.
    let a = post(
        &d.url,
        Some(&d.token),
        br#"{"protocol":1,"request_id":"r-1","limits":[100],"run":{"kind":"snippet","language":"python","code":"1"}}"#,
    );
    assert_eq!(a.status, 400, "{}", a.body);
    assert!(a.error().error.message.contains("`limits`"), "{}", a.body);
}

/// `/mcp` takes POST only, and its 405 says so (issue 28, finding 17).
#[test]
fn mcp_s_405_names_the_method_it_takes() {
    let d = TestDaemon::start(PROCESS);
    for method in ["GET", "DELETE", "PUT"] {
        let (status, head, body) = raw_exchange(
            &d.url,
            &format!(
                "{method} /mcp HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {}\r\nContent-Length: 0\r\n\r\n",
                d.token
            ),
        );
        assert_eq!(status, 405, "{method}: {body}");
        assert!(head.contains("\r\nallow: post"), "{method}: {head}");
        let e: ErrorResponse = serde_json::from_str(&body).expect("an ErrorResponse");
        assert_eq!(e.error.not_dispatched, Some(Reason::Request));
    }
}

/// One JSON-RPC message to `/mcp`.
fn mcp_post(url: &str, token: Option<&str>, body: &serde_json::Value) -> Answer {
    let mut req = agent()
        .post(format!("{url}/mcp"))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2025-06-18");
    if let Some(t) = token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    answer(req.send(body.to_string().as_bytes()))
}

fn runs_total(url: &str) -> f64 {
    samples(&get(url, "/metrics", None).body)
        .iter()
        .filter(|(k, _)| k.starts_with("plimsoll_runs_total{"))
        .map(|(_, v)| v)
        .sum()
}

#[test]
fn mcp_runs_as_the_token_s_caller_through_the_engine_and_refuses_without_one() {
    let d = TestDaemon::start(&format!("{PROCESS}[daemon]\nmax_body_bytes = 65536\n"));
    if !process_available(
        "mcp_runs_as_the_token_s_caller_through_the_engine_and_refuses_without_one",
        &d.url,
        &d.token,
    ) {
        return;
    }
    let call = serde_json::json!({
        "jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "run_code", "arguments": {
            "language": "python", "code": "print('via mcp')", "min_isolation": "process"}},
    });
    // The attack: a call with no token, or a wrong one, must run nothing.
    for token in [None, Some("plm_wrong")] {
        let a = mcp_post(&d.url, token, &call);
        assert_eq!(a.status, 401, "{}", a.body);
        assert_eq!(
            a.headers.get("www-authenticate").map(String::as_str),
            Some("Bearer")
        );
        assert_eq!(a.error().error.not_dispatched, Some(Reason::Permission));
    }
    assert_eq!(runs_total(&d.url), 0.0, "a refused call ran");

    let init = serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "daemon-test", "version": "1"}},
    });
    let a = mcp_post(&d.url, Some(&d.token), &init);
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(
        a.body.contains("run_code") || a.body.contains("plimsoll"),
        "{}",
        a.body
    );

    let a = mcp_post(&d.url, Some(&d.token), &call);
    assert_eq!(a.status, 200, "{}", a.body);
    let v: serde_json::Value = serde_json::from_str(&a.body).expect("a JSON-RPC answer");
    let s = &v["result"]["structuredContent"];
    assert_eq!(v["result"]["isError"], false, "{v}");
    assert_eq!(s["isolation"], "process", "{v}");
    assert_eq!(s["stdout"]["text"], "via mcp\n", "{v}");
    // The record is the engine's: its digest recomputes, and it names the request's digests.
    let record: plimsoll_wire::RunRecord =
        serde_json::from_value(s["record"].clone()).expect("a RunRecord");
    assert_eq!(record_sha256(&record), record.record_sha256);
    assert_eq!(s["record_sha256"], record.record_sha256.as_str());
    assert_eq!(s["request_sha256"], record.request_sha256.as_str());
    assert_eq!(
        runs_total(&d.url),
        1.0,
        "the run is counted as the daemon's"
    );

    // The daemon's body limit holds for /mcp too.
    let big = serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "run_code", "arguments": {"language": "python", "code": "#".repeat(70_000)}}});
    let a = mcp_post(&d.url, Some(&d.token), &big);
    assert_eq!(a.status, 413, "{}", a.body);
    assert_eq!(a.error().error.code, "request");
    assert_eq!(a.error().error.not_dispatched, Some(Reason::Request));
    assert_eq!(runs_total(&d.url), 1.0);

    // Every other refusal on /mcp is an ErrorResponse marked not dispatched too: another
    // method, and the transport's own refusals of a wrong Accept or Content-Type.
    let a = answer(
        agent()
            .get(format!("{}/mcp", d.url))
            .header("Authorization", format!("Bearer {}", d.token))
            .call(),
    );
    assert_eq!(a.status, 405, "{}", a.body);
    assert_eq!(a.error().error.not_dispatched, Some(Reason::Request));
    for (accept, content_type, status) in [
        ("text/plain", "application/json", 406),
        ("application/json, text/event-stream", "text/plain", 415),
    ] {
        let a = answer(
            agent()
                .post(format!("{}/mcp", d.url))
                .header("Content-Type", content_type)
                .header("Accept", accept)
                .header("MCP-Protocol-Version", "2025-06-18")
                .header("Authorization", format!("Bearer {}", d.token))
                .send(call.to_string().as_bytes()),
        );
        assert_eq!(a.status, status, "{}", a.body);
        assert_eq!(a.error().error.code, "request", "{}", a.body);
        assert_eq!(a.error().error.not_dispatched, Some(Reason::Request));
    }
    assert_eq!(runs_total(&d.url), 1.0, "a refused call ran");
    // /mcp has a route label of its own in the HTTP metrics.
    let metrics = get(&d.url, "/metrics", None).body;
    assert!(
        metrics.contains(r#"plimsoll_http_requests_total{route="/mcp",status="401"}"#),
        "{metrics}"
    );
}

/// #16.2: a run's deadline does not live in the daemon alone. plimsolld is SIGKILLed one
/// second into a busy loop with a 3 s timeout and not started again: the run's processes
/// (found by the daemon's sandbox uid range) are gone by the deadline plus the provider's
/// watchdog grace, at every provider (QEMU gets its parent's death as SIGKILL: no grace). A
/// new daemon on the same state then reaps what the dead one left: no run directory stays.
#[test]
fn a_run_ends_at_its_deadline_after_the_daemon_is_killed() {
    let test = "a_run_ends_at_its_deadline_after_the_daemon_is_killed";
    let image = workspace_root().join("build/images/sandbox");
    for (provider, grace) in [
        ("process", plimsoll_process::WATCHDOG_GRACE),
        ("crun", plimsoll_oci::WATCHDOG_GRACE),
        ("runc", plimsoll_oci::WATCHDOG_GRACE),
        ("runsc", plimsoll_oci::WATCHDOG_GRACE),
        ("qemu", Duration::ZERO),
    ] {
        // The container state and cgroups of this daemon alone, so its runtime processes are
        // known by it, and its restart's reap touches no other test's containers.
        let oci_state = tempfile::tempdir().unwrap();
        let cgroups = PrivateCgroup::new(&oci_state);
        let mut d = Spawned::start_settings(
            &format!("default_floor = \"process\"\nproviders = [\"{provider}\"]\n"),
            &format!(
                "[oci]\nimage = \"{}\"\nstate_root = \"{}\"\ncgroup_parent = \"{}\"\n",
                image.display(),
                oci_state.path().display(),
                cgroups
            ),
            &[],
            &[],
        );
        if !available(test, &d.url, &d.token, provider) {
            return;
        }
        let timeout = Duration::from_secs(3);
        let body = serde_json::json!({
            "protocol": 1, "request_id": format!("dead-{provider}"), "provider": provider,
            "limits": {"timeout_ms": timeout.as_millis() as u64},
            "run": {"kind": "snippet", "language": "python", "code": "while True:\n    pass"},
        })
        .to_string();
        let (url, token) = (d.url.clone(), d.token.clone());
        let start = Instant::now();
        // The answer never comes: the daemon dies first.
        let client = std::thread::spawn(move || {
            let sent = agent()
                .post(format!("{url}/v1/runs"))
                .header("Authorization", format!("Bearer {token}"))
                .header("Content-Type", "application/json")
                .send(body.as_bytes());
            assert!(sent.is_err(), "answered by a daemon that was killed");
        });
        let base = d.uid_base();
        let uids = base..base + plimsoll_test_daemon::UIDS_PER_PORT;
        // The run's processes: those of the sandbox uids, and (gVisor's Sentry and gofer run
        // as other users) any naming this daemon's container state.
        let dir = oci_state.path().display().to_string();
        let daemon_pid = d.child.id() as i32;
        let run_processes = || -> Vec<i32> {
            let mut pids = processes_of_uids(uids.clone());
            pids.extend(
                std::fs::read_dir("/proc")
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                    .filter(|p| {
                        *p != daemon_pid
                            && std::fs::read(format!("/proc/{p}/cmdline"))
                                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&dir))
                    }),
            );
            pids.sort_unstable();
            pids.dedup();
            pids
        };
        while run_processes().is_empty() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{provider}: the run never started: {}",
                d.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_secs(1));
        // What the daemon had made when it died: the run's directory and its warm members'.
        let state = d._dir.path().join("state");
        let dirs = || {
            let mut dirs = plimsoll_testing::run_dirs_under(&state);
            dirs.extend(plimsoll_testing::run_dirs_under(oci_state.path()));
            dirs
        };
        let dead: Vec<std::path::PathBuf> = dirs();
        assert!(
            dead.iter().any(|p| is_member(p)),
            "{provider}: the default floor's pools had no member to leave: {dead:?}"
        );
        d.signal(rustix::process::Signal::KILL);
        let _ = d.wait_exit();
        client.join().expect("the client");
        let killed = start.elapsed();
        let bound = timeout + grace;
        // CPU seconds of each of the run's processes, as last seen alive.
        let mut cpu = BTreeMap::new();
        loop {
            let left: Vec<(i32, f64)> = run_processes()
                .into_iter()
                .filter_map(|p| Some((p, cpu_seconds(p)?)))
                .collect();
            if left.is_empty() {
                break;
            }
            cpu.extend(left.iter().copied());
            assert!(
                start.elapsed() < bound + Duration::from_secs(10),
                "{provider}: the run's processes {left:?} outlived its deadline ({timeout:?}) and grace ({grace:?}) by far: {:?} after it was sent",
                start.elapsed()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let ended = start.elapsed();
        let cpu: f64 = cpu.values().sum();
        eprintln!(
            "{provider}: daemon killed {killed:?} after the request, the run's processes gone {ended:?} after it (deadline {timeout:?} + grace {grace:?}); their CPU time at the last look {cpu:.2} s"
        );
        assert!(
            ended <= bound + Duration::from_secs(3),
            "{provider}: gone only {ended:?} after the request (deadline {timeout:?} + grace {grace:?})"
        );
        assert!(
            cpu <= (bound + Duration::from_secs(1)).as_secs_f64(),
            "{provider}: {cpu:.2} s of CPU"
        );
        // The dead daemon's leftovers go with the next one's start-up reap.
        d.restart();
        assert_eq!(get(&d.url, "/readyz", None).status, 200, "{}", d.logs());
        // Nothing of the dead daemon's is left; the new daemon's own warm members may be.
        let left: Vec<std::path::PathBuf> = dirs()
            .into_iter()
            .filter(|p| dead.contains(p) || !is_member(p))
            .collect();
        assert!(left.is_empty(), "{provider}: the reap left {left:?}");
    }
}

/// A warm member's directory (docs/warm-pools.md: `warm-<id>`, `plimsoll-warm-<id>` at the
/// OCI providers), not a run's.
fn is_member(dir: &std::path::Path) -> bool {
    dir.file_name().is_some_and(|n| {
        let n = n.to_string_lossy();
        n.starts_with("warm-") || n.starts_with("plimsoll-warm-")
    })
}

/// SIGHUP re-reads the settings file's `[pools]`: a section that does not load keeps the
/// pools in force; one without pools drains them (no member left, every run cold); an
/// unchanged one touches nothing; pools put back are kept again (runs start warm).
#[test]
fn sighup_replaces_the_warm_pools_and_keeps_them_when_the_section_is_broken() {
    let test = "sighup_replaces_the_warm_pools_and_keeps_them_when_the_section_is_broken";
    let pools_on = "[pools.process.python]\nmin_idle = 1\nmax_members = 1\n";
    let d = Spawned::start(&format!("\n{pools_on}"));
    if !process_available(test, &d.url, &d.token) {
        return;
    }
    let config = d._dir.path().join("plimsoll.toml");
    let with_pools = |pools: &str| {
        let text = std::fs::read_to_string(&config).unwrap();
        let base = text.split("\n[pools").next().unwrap().to_owned();
        std::fs::write(&config, format!("{base}\n{pools}")).unwrap();
    };
    let state = d._dir.path().join("state");
    let members = || -> Vec<std::path::PathBuf> {
        plimsoll_testing::run_dirs_under(&state)
            .into_iter()
            .filter(|p| is_member(p))
            .collect()
    };
    let mut n = 0;
    let mut start_of_a_run = || {
        n += 1;
        let r = post(
            &d.url,
            Some(&d.token),
            snippet(&format!("p-{n}"), "python", "print(6 * 7)").as_bytes(),
        )
        .run();
        assert_eq!(r.result.stdout.to_string_lossy(), "42\n", "{r:?}");
        r.result.start
    };
    let warm_within = |start_of_a_run: &mut dyn FnMut() -> Option<plimsoll_wire::Start>| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while start_of_a_run() != Some(plimsoll_wire::Start::Warm) {
            assert!(
                Instant::now() < deadline,
                "no warm start within 60 s: {}",
                d.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    warm_within(&mut start_of_a_run);
    let metrics = || samples(&get(&d.url, "/metrics", None).body);
    let m = metrics();
    let event = |m: &BTreeMap<String, f64>, e: &str| {
        m[&format!("plimsoll_pool_members_total{{event=\"{e}\"}}")]
    };
    assert!(event(&m, "claimed") >= 1.0, "{m:?}");
    assert!(event(&m, "made") >= event(&m, "claimed"), "{m:?}");
    assert!(
        m.contains_key(r#"plimsoll_pool_idle{provider="process",language="python"}"#),
        "{m:?}"
    );

    // A pool of a provider that is not configured: refused, the pool in force is kept.
    with_pools("[pools.crun.python]\nmin_idle = 1\n");
    hup_and_wait(&d, "cannot reload the warm pools", 1);
    assert!(d.logs().contains("names a provider that is not configured"));
    warm_within(&mut start_of_a_run);

    // No pool: the pool is drained and every run starts cold. Its refilled member (made
    // once the last claim's teardown freed its one uid) is what the drain must destroy.
    // Refilled: as many idle as the pool keeps (max_members 1 holds it at 1), none being
    // made.
    let deadline = Instant::now() + Duration::from_secs(30);
    let idle = r#"plimsoll_pool_idle{provider="process",language="python"}"#;
    let wanted = r#"plimsoll_pool_wanted{provider="process",language="python"}"#;
    loop {
        let m = metrics();
        assert_eq!(m.get(wanted).copied(), Some(1.0), "{m:?}");
        if m.get(idle).copied() == Some(1.0) && m.get("plimsoll_pool_making") == Some(&0.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the pool did not refill: {m:?} {}",
            d.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    with_pools("[pools]\n");
    hup_and_wait(&d, "warm pools replaced", 1);
    assert_eq!(members(), Vec::<std::path::PathBuf>::new());
    for _ in 0..3 {
        assert_eq!(start_of_a_run(), Some(plimsoll_wire::Start::Cold));
    }
    assert_eq!(members(), Vec::<std::path::PathBuf>::new());
    let m = metrics();
    assert!(
        !m.keys()
            .any(|k| k.starts_with("plimsoll_pool_")
                && !k.starts_with("plimsoll_pool_members_total")),
        "no pool's gauge: {m:?}"
    );
    // The drained member was destroyed unused; the counts carried on.
    assert!(event(&m, "discarded") >= 1.0, "{m:?}");
    assert!(event(&m, "claimed") >= 2.0, "{m:?}");

    // The same section again changes nothing.
    hup_and_wait(&d, "warm pools unchanged", 1);

    // Put back, the pool is kept again.
    with_pools(pools_on);
    hup_and_wait(&d, "warm pools replaced", 2);
    assert!(
        d.logs().contains("\"pools\":\"process.python:1/1/300s\""),
        "{}",
        d.logs()
    );
    warm_within(&mut start_of_a_run);
}

// Sessions (docs/sessions.md), at crun: one sandbox kept across calls.

/// A daemon offering crun alone, with these extra settings.
fn session_daemon(extra: &str) -> TestDaemon {
    let image = workspace_root().join("build/images/sandbox");
    TestDaemon::start(&format!(
        "default_floor = \"container\"\nproviders = [\"crun\"]\n[pools]\n[oci]\nimage = \"{}\"\n{extra}",
        image.display()
    ))
}

/// One request to the sessions API.
fn call(
    url: &str,
    method: &str,
    path: &str,
    token: &str,
    body: Option<&[u8]>,
    headers: &[(&str, &str)],
) -> Answer {
    let url = format!("{url}{path}");
    let auth = format!("Bearer {token}");
    macro_rules! with_headers {
        ($req:expr) => {{
            let mut req = $req.header("Authorization", &auth);
            for (k, v) in headers {
                req = req.header(*k, *v);
            }
            req
        }};
    }
    let a = agent();
    answer(match (method, body) {
        ("GET", _) => with_headers!(a.get(&url)).call(),
        ("DELETE", _) => with_headers!(a.delete(&url)).call(),
        ("POST", Some(b)) => {
            with_headers!(a.post(&url).header("Content-Type", "application/json")).send(b)
        }
        ("PUT", Some(b)) => with_headers!(a.put(&url)).send(b),
        other => panic!("untested {other:?}"),
    })
}

fn open_session(
    url: &str,
    token: &str,
    language: &str,
    extra: serde_json::Value,
) -> plimsoll_wire::SessionInfo {
    let mut body = serde_json::json!({"protocol": 1, "request_id": "open-1", "language": language});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    let a = call(
        url,
        "POST",
        "/v1/sessions",
        token,
        Some(body.to_string().as_bytes()),
        &[],
    );
    assert_eq!(a.status, 200, "{}", a.body);
    serde_json::from_str(&a.body).expect("a SessionInfo")
}

fn cell_body(id: &str, language: &str, code: &str) -> String {
    snippet(id, language, code)
}

fn step_body(id: &str, run: &str) -> String {
    serde_json::json!({"protocol": 1, "request_id": id, "run": {"kind": "project", "steps": [{"run": run}]}}).to_string()
}

/// Checks a session call's answer the way a client does: every digest recomputed, the
/// record linked to `previous` at `sequence`.
fn checked_call(
    a: &Answer,
    sent: &str,
    session: &str,
    sequence: u64,
    previous: Option<&str>,
) -> RunResponse {
    let resp = a.run();
    let req: RunRequest = serde_json::from_str(sent).unwrap();
    assert_eq!(resp.request_sha256, request_sha256(&req));
    assert_eq!(resp.result_sha256, result_sha256(&resp.result));
    assert_eq!(resp.record.record_sha256, record_sha256(&resp.record));
    let link = resp
        .record
        .session
        .as_ref()
        .expect("a session call's record names its session");
    assert_eq!(link.session_id, session);
    assert_eq!(link.sequence, sequence);
    assert_eq!(link.previous_record_sha256.as_deref(), previous);
    assert!(
        resp.result.wall.is_some(),
        "every call carries the wall read before it"
    );
    resp
}

/// #13: state kept across 100 cells in both languages; a file a step wrote read by a cell;
/// bytes uploaded and downloaded exactly; every record chained to the one before; a cell's
/// output streamed before its end, the final digest verifying.
#[test]
fn a_session_keeps_its_state_across_cells_and_shares_work_with_steps_and_files() {
    let test = "a_session_keeps_its_state_across_cells_and_shares_work_with_steps_and_files";
    let d = session_daemon("");
    if !available(test, &d.url, &d.token, "crun") {
        return;
    }
    for (language, define, bump, read) in [
        (
            "python",
            "import json\nn = 0\nf = open('/work/log', 'w')\ndef twice(x):\n    return 2 * x",
            "n += 1\nf.write(str(n))",
            "f.flush(); print(twice(n), json.dumps(open('/work/from-step').read()))",
        ),
        (
            "javascript",
            "var n = 0; const fs = require('fs'); function twice(x) { return 2 * x }",
            "n += 1",
            "console.log(twice(n), JSON.stringify(fs.readFileSync('/work/from-step', 'utf8')))",
        ),
    ] {
        let info = open_session(&d.url, &d.token, language, serde_json::json!({}));
        assert_eq!(
            (info.provider.as_str(), info.isolation),
            ("crun", Tier::Container)
        );
        assert!(info.interpreter_alive && info.calls == 0);
        let sid = info.session_id.clone();
        let cells = format!("/v1/sessions/{sid}/cells");
        let mut previous: Option<String> = None;
        let mut seq = 0;
        let mut send = |path: &str, body: String| {
            seq += 1;
            let a = call(&d.url, "POST", path, &d.token, Some(body.as_bytes()), &[]);
            let resp = checked_call(&a, &body, &sid, seq, previous.as_deref());
            previous = Some(resp.record.record_sha256.clone());
            resp
        };
        let r = send(&cells, cell_body("c0", language, define));
        assert_eq!(
            (r.result.exit_code, r.result.state_kept),
            (Some(0), Some(true)),
            "{:?}",
            r.result
        );
        for i in 1..=100 {
            let r = send(&cells, cell_body(&format!("c{i}"), language, bump));
            assert_eq!(r.result.exit_code, Some(0), "{:?}", r.result);
            assert_eq!(r.result.state_kept, Some(true));
        }
        let r = send(
            &format!("/v1/sessions/{sid}/steps"),
            step_body(
                "s1",
                "printf 'step wrote this' > /work/from-step && ls /work",
            ),
        );
        assert_eq!(r.result.exit_code, Some(0), "{:?}", r.result);
        assert_eq!(
            r.result.state_kept, None,
            "a step says nothing of the interpreter"
        );
        let r = send(&cells, cell_body("c-read", language, read));
        assert_eq!(
            r.result.stdout.as_slice(),
            b"200 \"step wrote this\"\n",
            "{:?}",
            r.result
        );
        // Bytes exact, both ways, through the files API.
        let bytes: Vec<u8> = (0u8..=255).chain([0xff, 0xfe, 0, b'\n']).collect();
        let put = call(
            &d.url,
            "PUT",
            &format!("/v1/sessions/{sid}/files/data/blob.bin"),
            &d.token,
            Some(&bytes),
            &[("plimsoll-request-id", "put-1")],
        );
        seq += 1;
        let put_req = serde_json::json!({"protocol": 1, "request_id": "put-1", "run": {"kind": "project", "files": [{"path": "data/blob.bin", "content": plimsoll_wire::Bytes::from(bytes.clone())}], "steps": []}}).to_string();
        let r = checked_call(&put, &put_req, &sid, seq, previous.as_deref());
        previous = Some(r.record.record_sha256.clone());
        let got = call(
            &d.url,
            "GET",
            &format!("/v1/sessions/{sid}/files/data/blob.bin"),
            &d.token,
            None,
            &[("plimsoll-request-id", "get-1")],
        );
        seq += 1;
        let get_req = serde_json::json!({"protocol": 1, "request_id": "get-1", "run": {"kind": "project", "artifacts": ["data/blob.bin"], "steps": []}}).to_string();
        let r = checked_call(&got, &get_req, &sid, seq, previous.as_deref());
        previous = Some(r.record.record_sha256.clone());
        assert_eq!(r.result.artifacts[0].content.as_slice(), &bytes[..]);
        // A path out of /work is refused, nothing ran (the chain does not move).
        let bad = call(
            &d.url,
            "PUT",
            &format!("/v1/sessions/{sid}/files/a/../../etc/x"),
            &d.token,
            Some(b"x"),
            &[("plimsoll-request-id", "put-2")],
        );
        assert_eq!(bad.status, 400, "{}", bad.body);
        assert_eq!(bad.error().error.not_dispatched, Some(Reason::Request));

        // Streamed: the first chunk comes while the cell still sleeps.
        let code = match language {
            "python" => "import time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('second')",
            _ => {
                "console.log('first'); const t = Date.now(); while (Date.now() - t < 1500) {} console.log('second')"
            }
        };
        let body = cell_body("stream-1", language, code);
        let mut resp = agent()
            .post(format!("{}{cells}", d.url))
            .header("Authorization", format!("Bearer {}", d.token))
            .header("Accept", "application/x-ndjson")
            .send(body.as_bytes())
            .expect("a streamed answer");
        assert_eq!(resp.status(), 200);
        let mut lines = BufReader::new(resp.body_mut().as_reader()).lines();
        let first = lines.next().expect("a line").expect("readable");
        let first_at = Instant::now();
        let first: plimsoll_wire::StreamLine = serde_json::from_str(&first).unwrap();
        let plimsoll_wire::StreamLine::Chunk(chunk) = first else {
            panic!("{first:?}")
        };
        assert!(chunk.preview);
        assert_eq!(
            (chunk.chunk.offset, chunk.chunk.bytes.as_slice()),
            (0, &b"first\n"[..])
        );
        let mut last = None;
        for line in lines {
            // The daemon's keep-alives (a blank line each second the cell runs) are skipped,
            // as every client skips them.
            let line = line.unwrap();
            if line.is_empty() {
                continue;
            }
            last = Some(serde_json::from_str::<plimsoll_wire::StreamLine>(&line).unwrap());
        }
        assert!(
            first_at.elapsed() >= Duration::from_secs(1),
            "the first chunk came only with the end"
        );
        let Some(plimsoll_wire::StreamLine::Response(resp)) = last else {
            panic!("{last:?}")
        };
        assert_eq!(resp.result.stdout.as_slice(), b"first\nsecond\n");
        assert_eq!(resp.result_sha256, result_sha256(&resp.result));
        assert_eq!(resp.record.session.as_ref().unwrap().sequence, seq + 1);
        assert_eq!(
            resp.record.session.as_ref().unwrap().previous_record_sha256,
            previous
        );

        let closed = call(
            &d.url,
            "DELETE",
            &format!("/v1/sessions/{sid}"),
            &d.token,
            None,
            &[("plimsoll-request-id", "close-1")],
        );
        assert_eq!(closed.status, 200, "{}", closed.body);
        let closed: plimsoll_wire::SessionInfo = serde_json::from_str(&closed.body).unwrap();
        assert_eq!(closed.end_reason, Some(plimsoll_wire::EndReason::Closed));
        assert_eq!(closed.request_id.as_deref(), Some("close-1"));
        let after = call(
            &d.url,
            "POST",
            &cells,
            &d.token,
            Some(cell_body("late", language, bump).as_bytes()),
            &[],
        );
        assert_eq!(after.status, 410, "{}", after.body);
        let e = after.error();
        assert_eq!(
            (e.error.code.as_str(), e.error.end_reason),
            ("session_ended", Some(plimsoll_wire::EndReason::Closed))
        );
        assert_eq!(e.error.not_dispatched, Some(Reason::Request));
    }
    assert_eq!(d.engine().sessions_open(), 0);
}

/// #13: another caller's session id gets the answer an unknown id gets; callers see only
/// their own sessions; two sessions share no files or processes.
#[test]
fn two_callers_sessions_are_isolated() {
    let test = "two_callers_sessions_are_isolated";
    let d = session_daemon("");
    if !available(test, &d.url, &d.token, "crun") {
        return;
    }
    let other = d.add_caller("other");
    let mine = open_session(&d.url, &d.token, "python", serde_json::json!({}));
    let theirs = open_session(&d.url, &other, "python", serde_json::json!({}));
    let write = step_body("w", "echo secret > /work/mine.txt && sleep 0");
    let a = call(
        &d.url,
        "POST",
        &format!("/v1/sessions/{}/steps", mine.session_id),
        &d.token,
        Some(write.as_bytes()),
        &[],
    );
    assert_eq!(a.run().result.exit_code, Some(0));
    // Their sandbox has no such file, and sees no process of mine.
    let look = cell_body(
        "l",
        "python",
        "import os\nprint(os.path.exists('/work/mine.txt'), sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))",
    );
    let a = call(
        &d.url,
        "POST",
        &format!("/v1/sessions/{}/cells", theirs.session_id),
        &other,
        Some(look.as_bytes()),
        &[],
    );
    let out = String::from_utf8(a.run().result.stdout.as_slice().to_vec()).unwrap();
    assert!(out.starts_with("False "), "{out}");
    let pids: Vec<u32> = serde_json::from_str(out.trim_start_matches("False ").trim()).unwrap();
    assert!(
        pids.len() < 6,
        "a session sees only its own processes: {pids:?}"
    );
    // My id, asked by them, reads exactly as an unknown id does.
    let unknown = format!("ses_{}_{}", &mine.session_id[4..20], "0".repeat(32));
    for (method, suffix, body) in [
        ("GET", "", None),
        ("DELETE", "", None),
        ("POST", "/cells", Some(look.as_bytes())),
        ("GET", "/files/mine.txt", None),
    ] {
        let headers = [("plimsoll-request-id", "x-1")];
        let theirs_view = call(
            &d.url,
            method,
            &format!("/v1/sessions/{}{suffix}", mine.session_id),
            &other,
            body,
            &headers,
        );
        let unknown_view = call(
            &d.url,
            method,
            &format!("/v1/sessions/{unknown}{suffix}"),
            &other,
            body,
            &headers,
        );
        assert_eq!(
            theirs_view.status, 404,
            "{method} {suffix}: {}",
            theirs_view.body
        );
        assert_eq!(
            theirs_view.body.replace(&mine.session_id, "ID"),
            unknown_view.body.replace(&unknown, "ID")
        );
    }
    let list: plimsoll_wire::SessionList =
        serde_json::from_str(&call(&d.url, "GET", "/v1/sessions", &other, None, &[]).body).unwrap();
    assert_eq!(
        list.sessions
            .iter()
            .map(|s| s.session_id.clone())
            .collect::<Vec<_>>(),
        vec![theirs.session_id.clone()]
    );
    // Mine is still open and mine.
    let a = call(
        &d.url,
        "GET",
        &format!("/v1/sessions/{}", mine.session_id),
        &d.token,
        None,
        &[],
    );
    assert_eq!(a.status, 200, "{}", a.body);
    // A steps call with no step: files written and artifacts read, as the docs allow.
    let files_only = serde_json::json!({"protocol": 1, "request_id": "fo", "run": {"kind": "project", "files": [{"path": "a.txt", "content": "A"}], "steps": [], "artifacts": ["a.txt", "mine.txt"]}}).to_string();
    let a = call(
        &d.url,
        "POST",
        &format!("/v1/sessions/{}/steps", mine.session_id),
        &d.token,
        Some(files_only.as_bytes()),
        &[],
    );
    let r = a.run();
    assert_eq!(
        r.result
            .artifacts
            .iter()
            .map(|a| a.content.as_slice().to_vec())
            .collect::<Vec<_>>(),
        vec![b"A".to_vec(), b"secret\n".to_vec()]
    );
    // An id from an earlier run of the daemon says so.
    let restarted = format!("ses_{}_{}", "f".repeat(16), "0".repeat(32));
    let e = call(
        &d.url,
        "GET",
        &format!("/v1/sessions/{restarted}"),
        &d.token,
        None,
        &[],
    )
    .error();
    assert_eq!(
        (e.error.code.as_str(), e.error.end_reason),
        (
            "session_not_found",
            Some(plimsoll_wire::EndReason::DaemonRestarted)
        )
    );
}

/// #13: the ends: an idle timeout ends a session and frees its slot; an interpreter killed
/// from inside is reported and restarted only when asked; a changed sandbox ends the session
/// and refuses the call; the process tier keeps no session; the limits refuse `capacity`.
#[test]
fn every_end_of_a_session_is_explicit() {
    let test = "every_end_of_a_session_is_explicit";
    let d = session_daemon("[sessions]\nmax_per_caller = 1\n");
    if !available(test, &d.url, &d.token, "crun") {
        return;
    }
    // Idle timeout: ended by the daemon, its slot free again.
    let s = open_session(
        &d.url,
        &d.token,
        "python",
        serde_json::json!({"idle_timeout_ms": 800}),
    );
    let full = call(
        &d.url,
        "POST",
        "/v1/sessions",
        &d.token,
        Some(br#"{"protocol":1,"request_id":"o2","language":"python"}"#),
        &[],
    );
    assert_eq!(full.status, 429, "{}", full.body);
    assert_eq!(full.error().error.not_dispatched, Some(Reason::Capacity));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let a = call(
            &d.url,
            "GET",
            &format!("/v1/sessions/{}", s.session_id),
            &d.token,
            None,
            &[],
        );
        if a.status == 410 {
            assert_eq!(
                a.error().error.end_reason,
                Some(plimsoll_wire::EndReason::IdleTimeout)
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the idle session was not ended: {}",
            a.body
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let metrics = get(&d.url, "/metrics", None).body;
    assert!(
        metrics.contains(r#"plimsoll_session_ends_total{reason="idle_timeout"} 1"#),
        "{metrics}"
    );

    // An interpreter killed from inside: reported, state lost, restarted only when asked.
    let s = open_session(&d.url, &d.token, "python", serde_json::json!({}));
    let cells = format!("/v1/sessions/{}/cells", s.session_id);
    let post =
        |path: &str, body: String| call(&d.url, "POST", path, &d.token, Some(body.as_bytes()), &[]);
    assert_eq!(
        post(&cells, cell_body("a", "python", "x = 42"))
            .run()
            .result
            .state_kept,
        Some(true)
    );
    let killed = post(
        &cells,
        cell_body(
            "b",
            "python",
            "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
        ),
    )
    .run();
    assert_eq!(killed.result.state_kept, Some(false));
    assert_eq!(
        killed.result.interpreter_end,
        Some(plimsoll_wire::EndReason::InterpreterCrash)
    );
    let refused = post(&cells, cell_body("c", "python", "print(x)"));
    assert_eq!(refused.status, 409, "{}", refused.body);
    assert_eq!(refused.error().error.code, "interpreter_ended");
    let fresh = post(
        &format!("{cells}?restart=true"),
        cell_body("d", "python", "print('x' in globals())"),
    )
    .run();
    assert_eq!(
        (fresh.result.stdout.as_slice(), fresh.result.state_kept),
        (&b"False\n"[..], Some(false))
    );
    let info: plimsoll_wire::SessionInfo = serde_json::from_str(
        &call(
            &d.url,
            "GET",
            &format!("/v1/sessions/{}", s.session_id),
            &d.token,
            None,
            &[],
        )
        .body,
    )
    .unwrap();
    assert!(info.interpreter_alive);
    assert_eq!(info.calls, 3, "a refused call is not in the chain");
    // An interpreter that dies between calls (a thread of an earlier cell ends it): the next
    // cell is refused, nothing ran, and the session goes on.
    let later = "import os, threading, time\nthreading.Thread(target=lambda: (time.sleep(0.3), os._exit(7))).start()";
    assert_eq!(
        post(&cells, cell_body("f", "python", later))
            .run()
            .result
            .state_kept,
        Some(true)
    );
    std::thread::sleep(Duration::from_millis(1500));
    let refused = post(&cells, cell_body("g", "python", "print(1)"));
    assert_eq!(refused.status, 409, "{}", refused.body);
    let e = refused.error();
    assert_eq!(
        (e.error.code.as_str(), e.error.not_dispatched),
        ("interpreter_ended", Some(Reason::Request))
    );
    let fresh = post(
        &format!("{cells}?restart=true"),
        cell_body("h", "python", "print(2)"),
    )
    .run();
    assert_eq!(
        (fresh.result.stdout.as_slice(), fresh.result.state_kept),
        (&b"2\n"[..], Some(false))
    );
    assert_eq!(fresh.record.session.as_ref().unwrap().sequence, 5);

    // The sandbox changed under the session: its memory limit lowered from the host.
    let uid = s.wall.uid;
    let pid = processes_of_uids(uid..uid + 1)
        .into_iter()
        .next()
        .expect("the session's processes");
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let memory = cgroup
        .lines()
        .find_map(|l| {
            l.split(':')
                .nth(1)
                .filter(|c| c.split(',').any(|c| c == "memory"))
                .map(|_| l.rsplit(':').next().unwrap().to_owned())
        })
        .expect("a memory cgroup");
    let limit = std::path::Path::new("/sys/fs/cgroup/memory")
        .join(memory.trim_start_matches('/'))
        .join("memory.limit_in_bytes");
    let now: u64 = std::fs::read_to_string(&limit)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    std::fs::write(&limit, (now - 1024 * 1024).to_string()).unwrap();
    let changed = post(&cells, cell_body("e", "python", "print(1)"));
    assert_eq!(changed.status, 409, "{}", changed.body);
    let e = changed.error();
    assert_eq!(
        (e.error.code.as_str(), e.error.end_reason),
        (
            "sandbox_changed",
            Some(plimsoll_wire::EndReason::SandboxChanged)
        )
    );
    assert_eq!(e.error.not_dispatched, Some(Reason::Environment));
    assert_eq!(d.engine().sessions_open(), 0);
    assert!(
        processes_of_uids(uid..uid + 1).is_empty(),
        "the ended session left processes"
    );

    // A floor the session's tier does not meet is refused per call.
    let s = open_session(&d.url, &d.token, "javascript", serde_json::json!({}));
    let high = serde_json::json!({"protocol": 1, "request_id": "v", "minimum_isolation": "vm", "run": {"kind": "snippet", "language": "javascript", "code": "1"}}).to_string();
    let a = call(
        &d.url,
        "POST",
        &format!("/v1/sessions/{}/cells", s.session_id),
        &d.token,
        Some(high.as_bytes()),
        &[],
    );
    assert_eq!(a.status, 422, "{}", a.body);
    assert_eq!(a.error().error.not_dispatched, Some(Reason::Isolation));
    assert_eq!(
        call(
            &d.url,
            "DELETE",
            &format!("/v1/sessions/{}", s.session_id),
            &d.token,
            None,
            &[]
        )
        .status,
        200
    );

    // The process tier keeps no session.
    let p = TestDaemon::start(PROCESS);
    let a = call(&p.url, "POST", "/v1/sessions", &p.token, Some(br#"{"protocol":1,"request_id":"o3","language":"python","minimum_isolation":"process"}"#), &[]);
    assert_eq!(a.status, 422, "{}", a.body);
    assert_eq!(a.error().error.not_dispatched, Some(Reason::Unsupported));
}

/// #13: `POST /v1/runs` streamed: the output comes while the run goes on, the final answer's
/// digests verify; a client that goes away ends its run long before its timeout and leaves
/// no process behind, at the process tier and at crun.
#[test]
fn a_streamed_run_sends_output_as_it_comes_and_ends_when_its_client_goes_away() {
    streamed_run_ends_when_its_client_goes_away(
        "a_streamed_run_sends_output_as_it_comes_and_ends_when_its_client_goes_away",
        false,
    );
}

/// #28 (4): the same with warm pools on, where the run lives in its member's sandbox (at
/// crun the member's `warm-<id>` cgroups, not the run id's): the cancel kills that one, and
/// the run is counted `cancelled`, never `sandbox_failed`, its provider not checked again.
#[test]
fn a_streamed_warm_run_ends_when_its_client_goes_away() {
    streamed_run_ends_when_its_client_goes_away(
        "a_streamed_warm_run_ends_when_its_client_goes_away",
        true,
    );
}

fn streamed_run_ends_when_its_client_goes_away(test: &str, warm: bool) {
    let image = workspace_root().join("build/images/sandbox");
    let pools = if warm {
        "[pools.process.python]\nmin_idle = 1\nmax_members = 2\n[pools.crun.python]\nmin_idle = 1\nmax_members = 2\n"
    } else {
        "[pools]\n"
    };
    let d = TestDaemon::start(&format!(
        "default_floor = \"process\"\nproviders = [\"process\", \"crun\"]\n{pools}[oci]\nimage = \"{}\"\n",
        image.display()
    ));
    for provider in ["process", "crun"] {
        if !available(test, &d.url, &d.token, provider) {
            return;
        }
        let body = serde_json::json!({
            "protocol": 1, "request_id": format!("s-{provider}"), "provider": provider,
            "run": {"kind": "snippet", "language": "python", "code": "import time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('second')"},
        })
        .to_string();
        let mut resp = agent()
            .post(format!("{}/v1/runs", d.url))
            .header("Authorization", format!("Bearer {}", d.token))
            .header("Accept", "application/x-ndjson")
            .send(body.as_bytes())
            .expect("a streamed answer");
        assert_eq!(resp.status(), 200);
        let lines: Vec<(Instant, String)> = BufReader::new(resp.body_mut().as_reader())
            .lines()
            .map(|l| (Instant::now(), l.expect("a line")))
            .filter(|(_, l)| !l.is_empty())
            .collect();
        let (first_at, first) = &lines[0];
        let first: plimsoll_wire::StreamLine = serde_json::from_str(first).unwrap();
        let plimsoll_wire::StreamLine::Chunk(chunk) = first else {
            panic!("{first:?}")
        };
        assert!(chunk.preview);
        assert_eq!(
            (chunk.chunk.offset, chunk.chunk.bytes.as_slice()),
            (0, &b"first\n"[..])
        );
        let (last_at, last) = lines.last().unwrap();
        assert!(
            last_at.duration_since(*first_at) >= Duration::from_secs(1),
            "{provider}: the first chunk came only with the end"
        );
        let last: plimsoll_wire::StreamLine = serde_json::from_str(last).unwrap();
        let plimsoll_wire::StreamLine::Response(resp) = last else {
            panic!("{last:?}")
        };
        let sent: RunRequest = serde_json::from_str(&body).unwrap();
        assert_eq!(resp.request_sha256, request_sha256(&sent));
        assert_eq!(resp.result_sha256, result_sha256(&resp.result));
        assert_eq!(resp.record.record_sha256, record_sha256(&resp.record));
        assert_eq!(resp.result.stdout.as_slice(), b"first\nsecond\n");
        assert_eq!(resp.provider, provider);

        // A client that goes away: the run (60 s timeout) ends within seconds, nothing left.
        // With pools on, it takes a warm member.
        let claimed = d
            .engine()
            .pool_counts()
            .claimed
            .load(std::sync::atomic::Ordering::SeqCst);
        if warm {
            // A test daemon keeps no pool until asked (plimsolld does once its probes end).
            d.engine().start_pools();
            let start = Instant::now();
            while !d
                .engine()
                .pools_idle()
                .iter()
                .any(|(p, _, idle)| p == provider && *idle > 0)
            {
                assert!(
                    start.elapsed() < Duration::from_secs(120),
                    "{provider}: no warm member came"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let body = serde_json::json!({
            "protocol": 1, "request_id": format!("gone-{provider}"), "provider": provider,
            "limits": {"timeout_ms": 60_000},
            "run": {"kind": "snippet", "language": "python", "code": "import time\nprint('started', flush=True)\nwhile True:\n    time.sleep(0.05)"},
        })
        .to_string();
        let conn = streamed_post(&d, "/v1/runs", &body, false);
        first_chunk(&conn, provider);
        let gone_at = Instant::now();
        drop(conn);
        let base = uid_base_for_port(d.url.rsplit(':').next().unwrap().parse().unwrap());
        // With pools on, the idle members the keeper makes meanwhile live on: their uids
        // (past every run's) are not watched; the run's end is, through `in_flight`.
        let uids = if warm {
            base..d.engine().pool_uid_range().start
        } else {
            base..base + plimsoll_test_daemon::UIDS_PER_PORT
        };
        loop {
            let left = processes_of_uids(uids.clone());
            if left.is_empty() && d.engine().in_flight() == 0 && d.engine().teardowns_running() == 0
            {
                break;
            }
            assert!(
                gone_at.elapsed() < Duration::from_secs(30),
                "{provider}: the run of a client that went away still runs: {left:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // Ended by the cancellation, not its timeout: counted `cancelled` whichever way its
        // sandbox ended, never as the provider's failure, and the provider not re-checked.
        let metrics = get(&d.url, "/metrics", None).body;
        assert!(
            metrics.contains(&format!(
                "plimsoll_runs_total{{provider=\"{provider}\",outcome=\"cancelled\"}} 1"
            )),
            "{metrics}"
        );
        assert!(!metrics.contains("outcome=\"sandbox_failed\""), "{metrics}");
        assert!(
            !d.engine().rechecking(provider),
            "{provider} is being checked again"
        );
        let now = d
            .engine()
            .pool_counts()
            .claimed
            .load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            now > claimed,
            warm,
            "{provider}: the run took a warm member ({claimed} -> {now})"
        );
    }
}

/// #28 (13): one caller's requests that cannot run (a step with a NUL byte, `memory_bytes: 1`,
/// `pids: 1`) are refused before they are dispatched (`request`, saying why) and take crun
/// from no one: another caller's run after each is served. Before, the NUL step failed
/// inside (500 `sandbox_failed`), the limits with 503 `environment`, and crun was checked
/// again and refused every run until that ended.
#[test]
fn one_caller_s_request_that_cannot_run_takes_the_provider_from_no_one() {
    let test = "one_caller_s_request_that_cannot_run_takes_the_provider_from_no_one";
    let image = workspace_root().join("build/images/sandbox");
    let d = TestDaemon::start(&format!(
        "default_floor = \"container\"\nproviders = [\"crun\"]\n[pools]\n[oci]\nimage = \"{}\"\n",
        image.display()
    ));
    if !available(test, &d.url, &d.token, "crun") {
        return;
    }
    let other = d.add_caller("bob");
    let python =
        serde_json::json!({"kind": "snippet", "language": "python", "code": "print(6 * 7)"});
    let bad = [
        (
            serde_json::json!({"protocol": 1, "request_id": "bad-nul", "run": {"kind": "project", "steps": [{"run": "echo a\u{0}b"}]}}),
            "NUL",
        ),
        (
            serde_json::json!({"protocol": 1, "request_id": "bad-mem", "limits": {"memory_bytes": 1}, "run": python}),
            "below the minimum",
        ),
        (
            serde_json::json!({"protocol": 1, "request_id": "bad-pids", "limits": {"pids": 1}, "run": python}),
            "below the minimum",
        ),
    ];
    let mut served = 0;
    for round in 0..2 {
        for (body, why) in &bad {
            let a = post(&d.url, Some(&d.token), body.to_string().as_bytes());
            let e = a.error();
            assert_eq!(
                (a.status, e.error.not_dispatched),
                (400, Some(Reason::Request)),
                "{}",
                a.body
            );
            assert!(e.error.message.contains(why), "{}", a.body);
            let a = post(
                &d.url,
                Some(&other),
                snippet(&format!("good-{round}-{served}"), "python", "print(6 * 7)").as_bytes(),
            );
            assert_eq!(
                a.status, 200,
                "another caller's run after {}: {}",
                body["request_id"], a.body
            );
            assert_eq!(a.run().result.stdout.as_slice(), b"42\n");
            served += 1;
        }
    }
    assert_eq!(served, 6);
    assert!(!d.engine().rechecking("crun"));
}

/// #28 (13): in a session, a step with a NUL byte is refused (`request`, nothing ran) and the
/// session goes on, its interpreter's state there for the next cell. Before, the call failed
/// inside and ended the session (`sandbox_failed`).
#[test]
fn a_session_s_nul_step_is_refused_and_the_session_goes_on() {
    let test = "a_session_s_nul_step_is_refused_and_the_session_goes_on";
    let d = session_daemon("");
    if !available(test, &d.url, &d.token, "crun") {
        return;
    }
    let s = open_session(&d.url, &d.token, "python", serde_json::json!({}));
    let cells = format!("/v1/sessions/{}/cells", s.session_id);
    let steps = format!("/v1/sessions/{}/steps", s.session_id);
    let body = cell_body("c-1", "python", "n = 41");
    let a = call(&d.url, "POST", &cells, &d.token, Some(body.as_bytes()), &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    let body = step_body("s-nul", "echo a\u{0}b");
    let a = call(&d.url, "POST", &steps, &d.token, Some(body.as_bytes()), &[]);
    let e = a.error();
    assert_eq!(
        (a.status, e.error.not_dispatched),
        (400, Some(Reason::Request)),
        "{}",
        a.body
    );
    let body = cell_body("c-2", "python", "print(n + 1)");
    let a = call(&d.url, "POST", &cells, &d.token, Some(body.as_bytes()), &[]);
    assert_eq!(a.status, 200, "the session ended: {}", a.body);
    assert_eq!(a.run().result.stdout.as_slice(), b"42\n");
}

/// #13: sessions at runc, at runsc and at qemu (whose walls the agent says from inside,
/// before every call): state kept, a step's file read by a cell, each call's wall the one at
/// open, and nothing left once closed.
#[test]
fn sessions_keep_state_at_runc_runsc_and_qemu() {
    let test = "sessions_keep_state_at_runc_runsc_and_qemu";
    let image = workspace_root().join("build/images/sandbox");
    let d = TestDaemon::start(&format!(
        "default_floor = \"container\"\nproviders = [\"runc\", \"runsc\", \"qemu\"]\n[pools]\n[oci]\nimage = \"{}\"\n",
        image.display()
    ));
    for (provider, tier) in [
        ("runc", Tier::Container),
        ("runsc", Tier::Kernel),
        // Under TCG (no usable KVM on these hosts) the VM's tier is `kernel`.
        ("qemu", Tier::Kernel),
    ] {
        if !available(test, &d.url, &d.token, provider) {
            return;
        }
        let s = open_session(
            &d.url,
            &d.token,
            "javascript",
            serde_json::json!({"provider": provider}),
        );
        assert_eq!((s.provider.as_str(), s.isolation), (provider, tier));
        let cells = format!("/v1/sessions/{}/cells", s.session_id);
        let post = |path: &str, body: String| {
            call(&d.url, "POST", path, &d.token, Some(body.as_bytes()), &[])
        };
        let r = post(
            &cells,
            cell_body("a", "javascript", "let seen = []; seen.push(1)"),
        )
        .run();
        assert_eq!(r.result.exit_code, Some(0), "{:?}", r.result);
        assert_eq!(r.result.wall.as_ref(), Some(&s.wall));
        let r = post(
            &format!("/v1/sessions/{}/steps", s.session_id),
            step_body("b", "echo from-step > /work/f"),
        )
        .run();
        assert_eq!(r.result.exit_code, Some(0), "{:?}", r.result);
        let r = post(
            &cells,
            cell_body(
                "c",
                "javascript",
                "seen.push(require('fs').readFileSync('/work/f', 'utf8').trim()); console.log(JSON.stringify(seen))",
            ),
        )
        .run();
        assert_eq!(
            r.result.stdout.as_slice(),
            b"[1,\"from-step\"]\n",
            "{:?}",
            r.result
        );
        assert_eq!(r.result.state_kept, Some(true));
        assert_eq!(r.result.wall.as_ref(), Some(&s.wall));
        assert_eq!(r.record.session.as_ref().unwrap().sequence, 3);
        let closed = call(
            &d.url,
            "DELETE",
            &format!("/v1/sessions/{}", s.session_id),
            &d.token,
            None,
            &[],
        );
        assert_eq!(closed.status, 200, "{}", closed.body);
        assert_eq!(d.engine().sessions_open(), 0);
        // A container's processes run as the session's host uid; a VM's wall is the guest's.
        if provider != "qemu" {
            assert!(
                processes_of_uids(s.wall.uid..s.wall.uid + 1).is_empty(),
                "{provider}: a closed session left processes"
            );
        }
    }
}

/// A cell that tries to reach its session agent's channel: the agent's stdin (the host's
/// calls), its stdout (the answers the host records and chains), its memory and its
/// descriptor table, through /proc/<agent>. Each attempt's outcome is printed as JSON.
const AGENT_ATTACK: &str = r#"
import json, os
agent = os.getppid()
forged = b'{"answer":{"result":{"exit_code":0,"timed_out":false,"stdout":"' + b'F' * 40000 + b'","stdout_truncated":false,"stderr":"","stderr_truncated":false}}}\n'
seen = {}
for what, how in [("fd/1", "wb"), ("fd/0", "rb"), ("mem", "r+b"), ("fd", "list")]:
    path = "/proc/%d/%s" % (agent, what)
    try:
        if how == "list":
            os.listdir(path)
        else:
            with open(path, how, buffering=0) as f:
                if "w" in how:
                    f.write(forged)
        seen[what] = "opened"
    except OSError as e:
        seen[what] = type(e).__name__
print(json.dumps(seen))
"#;

/// A streamed POST of `body` to `path` on a connection of its own, whose answer the test
/// reads (or not) as it likes; with `close`, the daemon closes the connection after it.
fn streamed_post(d: &TestDaemon, path: &str, body: &str, close: bool) -> std::net::TcpStream {
    use std::io::Write;
    let addr = d.url.trim_start_matches("http://");
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let connection = if close { "Connection: close\r\n" } else { "" };
    write!(
        conn,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\n{connection}Authorization: Bearer {}\r\nAccept: application/x-ndjson\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        d.token,
        body.len()
    )
    .unwrap();
    conn
}

/// Reads `conn` until a chunk line has come.
fn first_chunk(mut conn: &std::net::TcpStream, what: &str) {
    use std::io::Read;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("\"chunk\"") {
        let n = conn.read(&mut buf).unwrap();
        assert!(n > 0, "{what}: the stream ended before a chunk");
        seen.extend_from_slice(&buf[..n]);
    }
}

/// A streamed cell that would run for a minute, whose client reads its first chunk and goes
/// away: the cell's interpreter is ended within seconds (`interpreter_alive` false, the call
/// recorded as the session's third), and the session goes on (a restarted cell is its
/// fourth, chained to the third).
fn streamed_cell_whose_client_goes_away(d: &TestDaemon, provider: &str, session: &str) {
    let body = serde_json::json!({
        "protocol": 1, "request_id": "left",
        "limits": {"timeout_ms": 60_000},
        "run": {"kind": "snippet", "language": "python",
                "code": "import time\nprint('started', flush=True)\nwhile True:\n    time.sleep(0.05)"},
    })
    .to_string();
    let ends = |reason: &str| {
        d.engine()
            .session_ends()
            .iter()
            .find(|(r, _)| *r == reason)
            .map_or(0, |(_, n)| *n)
    };
    let (crashes, timeouts) = (ends("interpreter_crash"), ends("cell_timeout"));
    let conn = streamed_post(d, &format!("/v1/sessions/{session}/cells"), &body, false);
    first_chunk(&conn, provider);
    drop(conn);
    let until = Instant::now() + Duration::from_secs(30);
    let info = loop {
        let a = call(
            &d.url,
            "GET",
            &format!("/v1/sessions/{session}"),
            &d.token,
            None,
            &[],
        );
        assert_eq!(a.status, 200, "{provider}: {}", a.body);
        let info: serde_json::Value = serde_json::from_str(&a.body).unwrap();
        if info["calls"] == 3 {
            break info;
        }
        assert!(
            Instant::now() < until,
            "{provider}: the cancelled cell still runs: {info}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // Within the bound, not at the cell's 60 s deadline: killed, not timed out.
    assert!(
        Instant::now() < until,
        "{provider}: the cancelled cell ran on"
    );
    assert_eq!(
        (
            ends("interpreter_crash") - crashes,
            ends("cell_timeout") - timeouts
        ),
        (1, 0),
        "{provider}: the cancelled cell's interpreter was killed"
    );
    assert_eq!(info["interpreter_alive"], false, "{provider}: {info}");
    assert!(
        info["end_reason"].is_null(),
        "{provider}: the session goes on: {info}"
    );
    let again = cell_body("again", "python", "print('again')");
    let a = call(
        &d.url,
        "POST",
        &format!("/v1/sessions/{session}/cells?restart=true"),
        &d.token,
        Some(again.as_bytes()),
        &[],
    );
    let r = checked_call(&a, &again, session, 4, info["last_record_sha256"].as_str());
    assert_eq!(
        r.result.stdout.as_slice(),
        b"again\n",
        "{provider}: {:?}",
        r.result
    );
}

/// #28.1: a cell cannot write its session agent's answers or read its calls. The agent
/// runs as the cells' uid and is not dumpable: its /proc/<pid>/fd and mem are out of a
/// cell's reach (at runsc, whose /proc does not honour that flag, its standard input and
/// output are uid 0's: it started as uid 0 and dropped to the cells' uid); the forged
/// answer never reaches the host, the next call is answered as itself, not one behind, and
/// `output_bytes` holds. At crun, runc, runsc and qemu.
#[test]
fn a_cell_cannot_reach_its_session_agents_channel() {
    let test = "a_cell_cannot_reach_its_session_agents_channel";
    let image = workspace_root().join("build/images/sandbox");
    let d = TestDaemon::start(&format!(
        "default_floor = \"container\"\nproviders = [\"crun\", \"runc\", \"runsc\", \"qemu\"]\n[pools]\n[oci]\nimage = \"{}\"\n",
        image.display()
    ));
    for provider in ["crun", "runc", "runsc", "qemu"] {
        if !available(test, &d.url, &d.token, provider) {
            return;
        }
        let s = open_session(
            &d.url,
            &d.token,
            "python",
            serde_json::json!({"provider": provider}),
        );
        let cells = format!("/v1/sessions/{}/cells", s.session_id);
        let post =
            |body: String| call(&d.url, "POST", &cells, &d.token, Some(body.as_bytes()), &[]);
        let mut body: serde_json::Value =
            serde_json::from_str(&cell_body("attack", "python", AGENT_ATTACK)).unwrap();
        body["limits"] = serde_json::json!({"output_bytes": 4096});
        let sent = body.to_string();
        let a = post(sent.clone());
        let r = checked_call(&a, &sent, &s.session_id, 1, None);
        assert_eq!(r.result.exit_code, Some(0), "{provider}: {:?}", r.result);
        let out = String::from_utf8_lossy(r.result.stdout.as_slice()).into_owned();
        let seen: BTreeMap<String, String> = serde_json::from_str(out.trim())
            .unwrap_or_else(|e| panic!("{provider}: the attack's report ({e}): {out:?}"));
        assert_eq!(seen.len(), 4, "{provider}: {seen:?}");
        for (what, outcome) in &seen {
            // gVisor lists any process's descriptor numbers; it opens none of them here.
            if provider == "runsc" && what == "fd" {
                continue;
            }
            assert_ne!(
                outcome, "opened",
                "{provider}: a cell opened /proc/<agent>/{what}: {seen:?}"
            );
        }
        assert!(r.result.stdout.as_slice().len() <= 4096);
        // The next call is answered as itself.
        let next = cell_body("next", "python", "print('next')");
        let a = post(next.clone());
        let r2 = checked_call(
            &a,
            &next,
            &s.session_id,
            2,
            Some(r.record.record_sha256.as_str()),
        );
        assert_eq!(
            r2.result.stdout.as_slice(),
            b"next\n",
            "{provider}: {:?}",
            r2.result
        );
        // #28.4: a streamed cell whose client goes away is cancelled, the session goes on.
        streamed_cell_whose_client_goes_away(&d, provider, &s.session_id);
        let closed = call(
            &d.url,
            "DELETE",
            &format!("/v1/sessions/{}", s.session_id),
            &d.token,
            None,
            &[],
        );
        assert_eq!(closed.status, 200, "{}", closed.body);
    }
}

/// #28.3, #28.14: a streamed answer whose client reads nothing holds a bounded preview in
/// the daemon: the run prints 16 MiB of `\x01` (96 MiB as JSON chunk lines) to a client that
/// reads nothing until the run is answered; the chunks it then finds are at most the
/// daemon's preview bound plus what the sockets buffer, with a gap where chunks were
/// dropped, and the final answer is whole and verifies. Until that client has taken its
/// answer (or gone), the stream holds its caller's place: with `max_per_caller = 1` the
/// same caller's next streamed request is refused `capacity`, nothing ran.
#[test]
fn a_streamed_answer_to_a_slow_reader_holds_a_bounded_preview_and_its_callers_place() {
    use std::io::Read;
    let d = TestDaemon::start(
        "default_floor = \"process\"\nproviders = [\"process\"]\nmax_per_caller = 1\n[pools]\n",
    );
    if !available(
        "a_streamed_answer_to_a_slow_reader_holds_a_bounded_preview_and_its_callers_place",
        &d.url,
        &d.token,
        "process",
    ) {
        return;
    }
    let output: usize = 16 << 20;
    let body = serde_json::json!({
        "protocol": 1, "request_id": "slow-reader", "provider": "process",
        "limits": {"output_bytes": output, "timeout_ms": 60_000},
        "run": {"kind": "snippet", "language": "python",
                "code": format!("import sys\nfor _ in range(256):\n    sys.stdout.buffer.write(b'\\x01' * {})\n    sys.stdout.flush()", output / 256)},
    })
    .to_string();
    let mut conn = streamed_post(&d, "/v1/runs", &body, true);
    // Read nothing until the run has been admitted and answered.
    let until = Instant::now() + Duration::from_secs(120);
    while d.engine().in_flight() == 0 {
        assert!(Instant::now() < until, "the run was admitted");
        std::thread::sleep(Duration::from_millis(5));
    }
    while d.engine().in_flight() != 0 {
        assert!(Instant::now() < until, "the run was answered");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Its answer is not taken yet: the caller's one place is still held.
    let second = snippet("second", "python", "print(1)");
    let a = answer(
        agent()
            .post(format!("{}/v1/runs", d.url))
            .header("Authorization", format!("Bearer {}", d.token))
            .header("Accept", "application/x-ndjson")
            .send(second.as_bytes()),
    );
    assert_eq!(a.status, 429, "{}", a.body);
    assert!(
        a.body.contains("\"not_dispatched\":\"capacity\""),
        "{}",
        a.body
    );
    // Now take everything.
    let mut all = Vec::new();
    conn.read_to_end(&mut all).unwrap();
    let text = String::from_utf8_lossy(&all);
    let (_, payload) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let mut chunk_bytes = 0usize;
    let mut offsets = Vec::new();
    let mut last = None;
    // Chunked transfer encoding: the lines are whole JSON objects between the size lines.
    for l in payload.split('\n') {
        let l = l.trim_matches(|c: char| c == '\r');
        if let Ok(line) = serde_json::from_str::<plimsoll_wire::StreamLine>(l) {
            match line {
                plimsoll_wire::StreamLine::Chunk(c) => {
                    chunk_bytes += l.len();
                    offsets.push((c.chunk.offset, c.chunk.bytes.as_slice().len() as u64));
                }
                other => last = Some(other),
            }
        }
    }
    assert!(
        chunk_bytes < 32 << 20,
        "{chunk_bytes} bytes of chunk lines were held for a client that read nothing"
    );
    let previewed: u64 = offsets.iter().map(|(_, len)| len).sum();
    assert!(
        previewed < output as u64,
        "chunks past the preview's bound were dropped: {previewed} of {output} bytes previewed"
    );
    let Some(plimsoll_wire::StreamLine::Response(resp)) = last else {
        panic!("the stream ends with the response: {last:?}")
    };
    let sent: RunRequest = serde_json::from_str(&body).unwrap();
    assert_eq!(resp.request_sha256, request_sha256(&sent));
    assert_eq!(resp.result_sha256, result_sha256(&resp.result));
    assert_eq!(resp.result.stdout.as_slice().len(), output);
    drop(conn);
    // The place is given back once the answer is taken.
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let a = answer(
            agent()
                .post(format!("{}/v1/runs", d.url))
                .header("Authorization", format!("Bearer {}", d.token))
                .header("Accept", "application/x-ndjson")
                .send(second.as_bytes()),
        );
        if a.status == 200 {
            break;
        }
        assert!(Instant::now() < until, "the place came back: {}", a.body);
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// #13: a session does not survive its daemon. Killed (SIGKILL), it leaves the session's
/// container behind, which the next daemon's start-up reap removes; the old id is then
/// refused `session_not_found`, not dispatched, saying the daemon restarted.
#[test]
fn a_session_does_not_survive_a_killed_daemon() {
    let test = "a_session_does_not_survive_a_killed_daemon";
    let image = workspace_root().join("build/images/sandbox");
    // Its own container state and cgroups: the restart's reap must touch nothing of another
    // test's daemon.
    let oci_state = tempfile::tempdir().unwrap();
    let cgroups = PrivateCgroup::new(&oci_state);
    let mut d = Spawned::start_settings(
        "default_floor = \"container\"\nproviders = [\"crun\"]\n",
        &format!(
            "[pools]\n[oci]\nimage = \"{}\"\nstate_root = \"{}\"\ncgroup_parent = \"{}\"\n",
            image.display(),
            oci_state.path().display(),
            cgroups
        ),
        &[],
        &[],
    );
    if !available(test, &d.url, &d.token, "crun") {
        return;
    }
    let s = open_session(&d.url, &d.token, "python", serde_json::json!({}));
    let a = call(
        &d.url,
        "POST",
        &format!("/v1/sessions/{}/cells", s.session_id),
        &d.token,
        Some(cell_body("a", "python", "x = 1").as_bytes()),
        &[],
    );
    assert_eq!(a.run().result.exit_code, Some(0));
    let uid = s.wall.uid;
    assert!(!processes_of_uids(uid..uid + 1).is_empty());
    assert!(!plimsoll_testing::run_dirs_under(oci_state.path()).is_empty());
    d.signal(rustix::process::Signal::KILL);
    let _ = d.wait_exit();
    // Its sandbox outlives the daemon until the next one's reap (or its lifetime's watchdog).
    assert!(!processes_of_uids(uid..uid + 1).is_empty());
    d.restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !processes_of_uids(uid..uid + 1).is_empty()
        || !plimsoll_testing::run_dirs_under(oci_state.path()).is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "the reap left the dead daemon's session: {:?}, {}",
            plimsoll_testing::run_dirs_under(oci_state.path()),
            d.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for (method, suffix, body) in [
        ("GET", "", None),
        ("POST", "/cells", Some(cell_body("b", "python", "print(x)"))),
    ] {
        let a = call(
            &d.url,
            method,
            &format!("/v1/sessions/{}{suffix}", s.session_id),
            &d.token,
            body.as_deref().map(str::as_bytes),
            &[("plimsoll-request-id", "after-restart")],
        );
        assert_eq!(a.status, 404, "{}", a.body);
        let e = a.error();
        assert_eq!(
            (
                e.error.code.as_str(),
                e.error.end_reason,
                e.error.not_dispatched
            ),
            (
                "session_not_found",
                Some(plimsoll_wire::EndReason::DaemonRestarted),
                Some(Reason::Request)
            )
        );
    }
}

/// #13: a session's sandbox holds its limits for its whole life: a step that fills the disk
/// stops at `disk_bytes`, a fork bomb at `pids`, a cell that fills memory is killed by the
/// memory limit (`out_of_memory`, its interpreter only); the session goes on after each.
#[test]
fn a_session_holds_its_limits_against_disk_forks_and_memory() {
    let test = "a_session_holds_its_limits_against_disk_forks_and_memory";
    let d = session_daemon("");
    if !available(test, &d.url, &d.token, "crun") {
        return;
    }
    let s = open_session(
        &d.url,
        &d.token,
        "python",
        serde_json::json!({"limits": {"disk_bytes": 8 << 20, "memory_bytes": 128 << 20, "pids": 32, "timeout_ms": 20_000}}),
    );
    let steps = format!("/v1/sessions/{}/steps", s.session_id);
    let cells = format!("/v1/sessions/{}/cells", s.session_id);
    let post =
        |path: &str, body: String| call(&d.url, "POST", path, &d.token, Some(body.as_bytes()), &[]);
    let r = post(
        &steps,
        step_body(
            "disk",
            "dd if=/dev/zero of=/work/big bs=1M count=64; du -k /work/big",
        ),
    )
    .run();
    let out = String::from_utf8_lossy(r.result.stdout.as_slice()).into_owned();
    let kib: u64 = out.split_whitespace().next().unwrap().parse().unwrap();
    assert!(
        kib <= 8 * 1024,
        "the disk limit did not hold: {kib} KiB written"
    );
    assert!(String::from_utf8_lossy(r.result.stderr.as_slice()).contains("No space left"));
    // A fork bomb from a cell: the pids limit stops it; the children are ended by the cell.
    let bomb = "import os, time\npids = []\ntry:\n    for _ in range(200):\n        pid = os.fork()\n        if pid == 0:\n            time.sleep(30)\n            os._exit(0)\n        pids.append(pid)\nexcept OSError as e:\n    print(len(pids), e.errno)\nfor p in pids:\n    os.kill(p, 9)\n    os.waitpid(p, 0)";
    let r = post(&cells, cell_body("forks", "python", bomb)).run();
    let out = String::from_utf8_lossy(r.result.stdout.as_slice()).into_owned();
    let forked: Vec<u64> = out
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(
        forked.len() == 2 && forked[0] < 32 && forked[1] == 11,
        "the pids limit did not hold: {:?}",
        r.result
    );
    assert_eq!(r.result.state_kept, Some(true));
    // Memory: the cell's interpreter is killed for it, the session stays.
    let r = post(
        &cells,
        cell_body(
            "mem",
            "python",
            "x = 1\nblobs = [bytearray(16 << 20) for _ in range(64)]",
        ),
    )
    .run();
    assert_eq!(
        (
            r.result.oom_killed,
            r.result.state_kept,
            r.result.interpreter_end
        ),
        (
            true,
            Some(false),
            Some(plimsoll_wire::EndReason::OutOfMemory)
        ),
        "{:?}",
        r.result
    );
    let r = post(
        &format!("{cells}?restart=true"),
        cell_body(
            "after",
            "python",
            "print(open('/work/big', 'rb').read(1) == b'\\0')",
        ),
    )
    .run();
    assert_eq!(r.result.stdout.as_slice(), b"True\n");
    let metrics = get(&d.url, "/metrics", None).body;
    assert!(
        metrics.contains(r#"plimsoll_session_ends_total{reason="out_of_memory"} 1"#),
        "{metrics}"
    );
}

/// A cgroup parent no other daemon uses (named after `dir`, a test's own temporary directory):
/// a daemon's start-up reap removes every cgroup under its parent that its own state does not
/// name, so a test that restarts a daemon gives it a parent of its own. Removed (in every
/// hierarchy) when dropped, after the daemon.
struct PrivateCgroup(String);

impl PrivateCgroup {
    fn new(dir: &tempfile::TempDir) -> Self {
        let name = dir.path().file_name().unwrap().to_string_lossy();
        PrivateCgroup(format!("/plimsoll-test-{}", name.trim_start_matches('.')))
    }
}

impl std::fmt::Display for PrivateCgroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Drop for PrivateCgroup {
    fn drop(&mut self) {
        if let Ok(layout) = plimsoll_sandbox::cgroup::CgroupLayout::detect() {
            let _ = layout.remove(self.0.trim_start_matches('/'));
        }
    }
}

/// Waits up to 10 s for launcher `pid` to be gone (its daemon is).
fn launcher_gone_soon(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            Instant::now() < deadline,
            "the launcher outlived its daemon"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A split daemon's settings in `dir` (made passable, mode 0711): `head`, then its state
/// directory and a uid base of its own, then `sections`, then `[daemon]` with a callers file
/// the serving user (nobody) can read and `serving_user = "nobody"`. Returns the caller's
/// token, the settings file, the port that keeps the uid base this test's, and the base.
fn split_settings(
    dir: &std::path::Path,
    head: &str,
    sections: &str,
) -> (String, std::path::PathBuf, std::net::TcpListener, u32) {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    // The serving process reads the callers file as nobody.
    let callers = dir.join("callers.toml");
    let token = add_caller(&callers, "test").unwrap().expose().clone();
    std::fs::set_permissions(&callers, std::fs::Permissions::from_mode(0o644)).unwrap();
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let uid_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let uid_base = uid_base_for_port(uid_port.local_addr().unwrap().port());
    let config = dir.join("plimsoll.toml");
    std::fs::write(
        &config,
        format!(
            "{head}state_dir = \"{}\"\nsandbox_uid_base = {uid_base}\n{sections}\
             [daemon]\ncallers_file = \"{}\"\nserving_user = \"nobody\"\n",
            state.display(),
            callers.display()
        ),
    )
    .unwrap();
    (token, config, uid_port, uid_base)
}

/// The split daemon (docs/privileges.md, "The split daemon"): with `serving_user`, plimsolld
/// serves as that user with no capability, no_new_privs, an empty bounding set and its own
/// seccomp filter; its launcher child stays root and keeps the broker process; runs at the
/// process tier and at crun, granted runs (an API grant, and an egress grant whose
/// connection and receipt go through the launcher's broker process), a session, a streamed
/// run and a SIGHUP reload (of the grants too) all work through the launcher and under the
/// filter; the grant's secret is
/// not in the serving process's environment; a broker process killed is started again by
/// the launcher and grants work on; and the launcher goes when the daemon is killed.
#[test]
fn the_split_daemon_serves_unprivileged_and_runs_through_its_launcher() {
    let test = "the_split_daemon_serves_unprivileged_and_runs_through_its_launcher";
    let nobody = plimsoll_broker::apart::ProcessUser::lookup("nobody")
        .unwrap_or_else(|why| panic!("user nobody, {why}"));
    let Some((broker, api)) = broker_user_and_api(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // The egress servers, outside the sandbox: a listed host and one the grant does not list.
    let fixture = plimsoll_testing::egress::EgressFixture::start(&dir.path().join("fixture"))
        .unwrap_or_else(|e| panic!("{e}"));
    let files = fixture.port("files");
    let egress_profile = format!(
        "[egress.web]\ncallers = [\"test\"]\nhosts = [\"files.plimsoll.test\"]\nports = [{files}]\n\
         addresses = [\"127.0.0.0/8\"]\n\
         resolve = {{ \"files.plimsoll.test\" = [\"127.0.0.1\"], \"other.plimsoll.test\" = [\"127.0.0.1\"] }}\n"
    );
    // Root's alone: the launcher reads it, not the serving process.
    let grants = dir.path().join("grants.toml");
    std::fs::write(
        &grants,
        grants_file_text(&api.url(), &["orders"]) + &egress_profile,
    )
    .unwrap();
    std::fs::set_permissions(&grants, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (token, config, uid_port, uid_base) = split_settings(
        dir.path(),
        "default_floor = \"process\"\nproviders = [\"process\", \"crun\"]\nmax_concurrent = 2\n",
        &format!(
            "[pools]\n[oci]\nimage = \"{}\"\n",
            workspace_root().join("build/images/sandbox").display()
        ),
    );
    let (mut child, url, logs, reader) = Spawned::launch(
        &config,
        &token,
        &["--grants".as_ref(), grants.as_os_str()],
        &[("ORDERS_API_TOKEN", GRANT_TOKEN)],
        &|url, _| get(url, "/readyz", None).status == 200,
    );
    if !available(test, &url, &token, "crun") || !available(test, &url, &token, "process") {
        let _ = child.kill();
        return;
    }
    let granted = |id: &str, provider: &str, grant: &str| {
        let body = serde_json::json!({
            "protocol": 1,
            "request_id": id,
            "provider": provider,
            "grant": grant,
            "run": {"kind": "snippet", "language": "python", "code": GET_ORDER},
        });
        let r = post(&url, Some(&token), body.to_string().as_bytes()).run();
        assert_eq!(
            r.result.stdout.to_string_lossy(),
            "/orders/7\n",
            "{id}: {r:?}"
        );
        assert_eq!(r.result.calls.len(), 1, "{id}: {r:?}");
    };
    granted("split-grant-process", "process", "orders");
    granted("split-grant-crun", "crun", "orders");
    // An egress grant: the project's connection to the listed host goes through the broker
    // process the launcher keeps, and its receipt comes back on the result; an unlisted host
    // is refused and reaches no server.
    let fetch = |url: &str| {
        format!(
            "try:\n    print(u.urlopen('{url}', timeout=20).read().decode().strip())\n\
             except Exception as e:\n    print('refused', type(e).__name__)\n"
        )
    };
    let body = serde_json::json!({
        "protocol": 1,
        "request_id": "split-egress",
        "provider": "crun",
        "grant": "web",
        "run": {"kind": "project", "files": [
            {"path": "ca.pem", "content": fixture.ca_pem()},
            {"path": "fetch.py", "content": format!(
                "import urllib.request as u\n{}{}",
                fetch(&format!("https://files.plimsoll.test:{files}/hello.txt")),
                fetch(&format!("https://other.plimsoll.test:{files}/hello.txt")),
            )},
        ], "steps": [{"run": "SSL_CERT_FILE=/work/ca.pem python3 fetch.py"}]},
    });
    let r = post(&url, Some(&token), body.to_string().as_bytes()).run();
    assert_eq!(
        r.result.steps[0].stdout.to_string_lossy(),
        "egress-ok\nrefused URLError\n",
        "{r:?}"
    );
    let receipts: Vec<(&str, &str)> = r
        .result
        .egress
        .iter()
        .map(|x| (x.host.as_str(), x.verdict.as_str()))
        .collect();
    assert_eq!(
        receipts,
        [
            ("files.plimsoll.test", "allowed"),
            ("other.plimsoll.test", "refused")
        ],
        "{r:?}"
    );
    assert_eq!(
        fixture.connections("files"),
        1,
        "one connection reached the server"
    );
    let daemon = child.id();
    // The secret was given to the daemon; the launcher has it, the serving process does not.
    let environ = std::fs::read(format!("/proc/{daemon}/environ")).unwrap();
    assert!(
        !String::from_utf8_lossy(&environ).contains(GRANT_TOKEN)
            && !String::from_utf8_lossy(&environ).contains("ORDERS_API_TOKEN"),
        "the grant's secret is in the serving process's environment"
    );
    for provider in ["process", "crun"] {
        let body = serde_json::json!({
            "protocol": 1,
            "request_id": format!("split-{provider}"),
            "provider": provider,
            "run": {"kind": "snippet", "language": "python", "code": "import os; print('ran as', os.getuid())"},
        });
        let r = post(&url, Some(&token), body.to_string().as_bytes()).run();
        // A run uid of the settings' range: the first slot, or another while an earlier
        // run's removal still holds it (max_concurrent is 2 here).
        let out = r.result.stdout.to_string_lossy();
        assert!(
            [uid_base, uid_base + 1]
                .iter()
                .any(|uid| out == format!("ran as {uid}\n")),
            "{provider}: {r:?}"
        );
    }
    // A session at crun through the launcher: state kept across cells, then closed.
    let info = open_session(
        &url,
        &token,
        "python",
        serde_json::json!({"provider": "crun"}),
    );
    let cells = format!("/v1/sessions/{}/cells", info.session_id);
    for (id, code, want) in [("c1", "x = 41", ""), ("c2", "print(x + 1)", "42\n")] {
        let a = call(
            &url,
            "POST",
            &cells,
            &token,
            Some(cell_body(id, "python", code).as_bytes()),
            &[],
        );
        assert_eq!(a.run().result.stdout.to_string_lossy(), want, "{}", a.body);
    }
    let a = call(
        &url,
        "DELETE",
        &format!("/v1/sessions/{}", info.session_id),
        &token,
        None,
        &[],
    );
    assert_eq!(a.status, 200, "{}", a.body);
    // A streamed run, the providers, and a SIGHUP's reload, all under the filter.
    let a = call(
        &url,
        "POST",
        "/v1/runs",
        &token,
        Some(snippet("split-stream", "python", "print('streamed')").as_bytes()),
        &[("Accept", "application/x-ndjson")],
    );
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(
        a.body.lines().any(|l| l.contains("\"chunk\"")),
        "no chunk streamed: {}",
        a.body
    );
    assert_eq!(get(&url, "/v1/providers", Some(&token)).status, 200);
    // The grants file changed: SIGHUP has the launcher read it again, and the new profile
    // works.
    std::fs::write(&grants, grants_file_text(&api.url(), &["orders", "more"])).unwrap();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
        rustix::process::Signal::HUP,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !logs.lock().unwrap().contains("grants file reloaded") {
        assert!(
            Instant::now() < deadline,
            "no reload of the grants: {}",
            logs.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(get(&url, "/v1/providers", Some(&token)).status, 200);
    granted("split-grant-reloaded", "process", "more");
    // A file naming a variable the launcher was not given at start: the reload is refused
    // and the profiles in force are kept (the serving process has no environment to look in,
    // and the launcher only the variables it was handed).
    std::fs::write(
        &grants,
        grants_file_text(&api.url(), &["orders", "more"])
            + "[profiles.fresh]\nbase_url = \"http://127.0.0.1:9\"\nroutes = [\"GET /x\"]\n\
               callers = [\"test\"]\ncall_budget = 5\n[profiles.fresh.credential]\nkind = \"static\"\n\
               secret_env = \"FRESH_API_TOKEN\"\n",
    )
    .unwrap();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
        rustix::process::Signal::HUP,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !logs
        .lock()
        .unwrap()
        .contains("cannot reload the grants file")
    {
        assert!(
            Instant::now() < deadline,
            "the reload naming a new variable was not refused: {}",
            logs.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let refusal = logs
        .lock()
        .unwrap()
        .lines()
        .find(|l| l.contains("cannot reload the grants file"))
        .unwrap_or_default()
        .to_owned();
    assert!(
        refusal.contains("FRESH_API_TOKEN") && !refusal.contains("parse error"),
        "the refusal names the variable: {refusal}"
    );
    granted("split-grant-kept", "process", "more");
    assert_eq!(
        status_field(daemon, "Seccomp"),
        "2",
        "the serving process's filter"
    );
    let ids = |pid: u32, key: &str| {
        status_field(pid, key)
            .split_whitespace()
            .map(|v| v.parse::<u32>().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        ids(daemon, "Uid"),
        vec![nobody.uid; 4],
        "the serving process's uids"
    );
    assert_eq!(
        ids(daemon, "Gid"),
        vec![nobody.gid; 4],
        "the serving process's gids"
    );
    assert_eq!(status_field(daemon, "Groups"), "", "no supplementary group");
    for caps in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(
            status_field(daemon, caps),
            "0000000000000000",
            "serving process {caps}"
        );
    }
    assert_eq!(status_field(daemon, "NoNewPrivs"), "1");
    let launcher = children_of(daemon)
        .into_iter()
        .find(|(_, args)| args.first().map(String::as_str) == Some("launcher"))
        .map(|(pid, _)| pid)
        .expect("the launcher, a child of the daemon");
    assert_eq!(ids(launcher, "Uid"), vec![0; 4], "the launcher keeps root");
    // The launcher got the secret over a pipe, not in its environment.
    let environ = std::fs::read(format!("/proc/{launcher}/environ")).unwrap();
    assert!(
        !String::from_utf8_lossy(&environ).contains(GRANT_TOKEN),
        "the grant's secret is in the launcher's environment"
    );
    // docs/privileges.md's table of the split daemon's processes holds for each of them.
    check_privileges_table(
        daemon,
        Daemon::Split {
            serving: nobody,
            broker,
        },
    );
    // The broker process killed: the launcher starts it again, and the serving process
    // reaches the new one (and has the load it lost sent again).
    let first = broker_process(launcher, None);
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(first as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let again = broker_process(launcher, Some(first));
    filtered_soon(again);
    granted("split-grant-again", "process", "more");
    assert!(
        !logs.lock().unwrap().contains(GRANT_TOKEN),
        "the grant's secret reached the logs"
    );
    // The daemon killed outright: its launcher goes with it (its parent-death signal).
    child.kill().unwrap();
    child.wait().unwrap();
    launcher_gone_soon(launcher);
    drop(reader);
    let logs = logs.lock().unwrap().clone();
    assert!(
        logs.contains("serving unprivileged"),
        "the daemon's log: {logs}"
    );
    drop(uid_port);
}

/// The split daemon refuses to start, and says why, when its serving user is not on this
/// host, and when its grants file names a secret its environment does not hold (checked
/// before the launcher starts, as the default daemon checks it).
#[test]
fn the_split_daemon_refuses_what_it_cannot_do_and_starts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let grants = dir.path().join("grants.toml");
    std::fs::write(&grants, grants_file_text("http://127.0.0.1:9", &["orders"])).unwrap();
    for (user, args, says) in [
        (
            "no-such-user-plimsoll",
            vec![],
            "the serving process runs as user `no-such-user-plimsoll`",
        ),
        (
            "nobody",
            vec!["--grants".as_ref(), grants.as_os_str()],
            "the variable ORDERS_API_TOKEN it names is not set",
        ),
    ] {
        let config = dir.path().join("plimsoll.toml");
        std::fs::write(
            &config,
            format!(
                "{PROCESS}state_dir = \"{}\"\n[daemon]\ncallers_file = \"{}\"\nserving_user = \"{user}\"\n",
                dir.path().join("state").display(),
                dir.path().join("callers.toml").display()
            ),
        )
        .unwrap();
        let out = plimsolld()
            .arg("--config")
            .arg(&config)
            .args(["--listen", "127.0.0.1:0"])
            .args(&args)
            .env_remove("ORDERS_API_TOKEN")
            .stdin(Stdio::null())
            .output()
            .expect("run plimsolld");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{user}: it started: {stderr}");
        assert!(stderr.contains(says), "{user}: {stderr}");
    }
}

/// The split daemon stops cleanly on SIGTERM, under its filter: exit code 0 (not killed by a
/// system call its allowlist lacks on the way out, such as reaping its launcher), and its
/// launcher gone with it.
#[test]
fn the_split_daemon_stops_cleanly_on_sigterm() {
    let test = "the_split_daemon_stops_cleanly_on_sigterm";
    let dir = tempfile::tempdir().unwrap();
    let (token, config, uid_port, _) = split_settings(dir.path(), PROCESS, "");
    let (mut child, url, logs, reader) = Spawned::launch(&config, &token, &[], &[], &|url, _| {
        get(url, "/readyz", None).status == 200
    });
    if !available(test, &url, &token, "process") {
        let _ = child.kill();
        return;
    }
    let launcher = children_of(child.id())
        .into_iter()
        .find(|(_, args)| args.first().map(String::as_str) == Some("launcher"))
        .map(|(pid, _)| pid)
        .expect("the launcher, a child of the daemon");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    drop(reader);
    assert_eq!(
        status.code(),
        Some(0),
        "{status:?}; logs: {}",
        logs.lock().unwrap()
    );
    launcher_gone_soon(launcher);
    drop(uid_port);
}

/// #29: a runsc session outlives a daemon restarted by SIGTERM (saved, then restored under its
/// own id by the next daemon, its chain going on, its records saying `restored`), and a router
/// would find it (`/readyz` names the adopted instance). A runc session, which cannot be saved,
/// ends `daemon_restarted`, as every session does after a SIGKILL.
#[test]
fn a_runsc_session_outlives_a_sigterm_restart_but_not_a_sigkill() {
    let test = "a_runsc_session_outlives_a_sigterm_restart_but_not_a_sigkill";
    let image = workspace_root().join("build/images/sandbox");
    let mut d = Spawned::start_settings(
        "default_floor = \"container\"\nproviders = [\"runsc\", \"runc\"]\n",
        &format!(
            "[pools]\n[oci]\nimage = \"{}\"\n[sessions]\nmax_total = 8\nmax_per_caller = 8\n",
            image.display()
        ),
        &[],
        &[],
    );
    if !available(test, &d.url, &d.token, "runsc") || !available(test, &d.url, &d.token, "runc") {
        return;
    }
    let kept = open_session(
        &d.url,
        &d.token,
        "python",
        serde_json::json!({"provider": "runsc"}),
    );
    let lost = open_session(
        &d.url,
        &d.token,
        "python",
        serde_json::json!({"provider": "runc"}),
    );
    let before = get(&d.url, "/readyz", None).headers["plimsoll-instance"].clone();
    let token = d.token.clone();
    let cell = |url: &str, id: &str, rid: &str, code: &str| {
        call(
            url,
            "POST",
            &format!("/v1/sessions/{id}/cells"),
            &token,
            Some(cell_body(rid, "python", code).as_bytes()),
            &[],
        )
    };
    let sent = cell_body("k-1", "python", "x = 41\nprint(x)");
    let r1 = checked_call(
        &cell(&d.url, &kept.session_id, "k-1", "x = 41\nprint(x)"),
        &sent,
        &kept.session_id,
        1,
        None,
    );
    assert_eq!(cell(&d.url, &lost.session_id, "l-1", "y = 1").status, 200);

    let status = d.terminate_and_start_again();
    assert_eq!(status.code(), Some(0));
    let ready = get(&d.url, "/readyz", None);
    assert_ne!(ready.headers["plimsoll-instance"], before, "a new daemon");
    assert_eq!(
        ready.headers.get("plimsoll-adopted-instances"),
        Some(&before),
        "{:?}\n{}",
        ready.headers,
        d.logs()
    );
    let sent = cell_body("k-2", "python", "print(x + 1)");
    let a = cell(&d.url, &kept.session_id, "k-2", "print(x + 1)");
    let r2 = checked_call(
        &a,
        &sent,
        &kept.session_id,
        2,
        Some(&r1.record.record_sha256),
    );
    assert_eq!(r2.result.stdout.to_string_lossy(), "42\n");
    let origin = r2
        .record
        .session
        .as_ref()
        .unwrap()
        .origin
        .clone()
        .expect("a restored session's records say so");
    assert_eq!(origin.start, plimsoll_wire::SessionStart::Restored);
    assert_eq!(origin.parent_session_id, kept.session_id);
    assert_eq!(
        (origin.parent_calls, origin.parent_record_sha256.as_ref()),
        (1, Some(&r1.record.record_sha256))
    );
    plimsoll_attest::check_session_chains(&[&r1.record, &r2.record]).expect("the chain goes on");
    let info: plimsoll_wire::SessionInfo = serde_json::from_str(
        &call(
            &d.url,
            "GET",
            &format!("/v1/sessions/{}", kept.session_id),
            &d.token,
            None,
            &[],
        )
        .body,
    )
    .unwrap();
    assert_eq!((info.calls, info.origin.as_ref()), (2, Some(&origin)));
    assert_eq!(
        (info.opened_unix_ms, info.expires_unix_ms),
        (kept.opened_unix_ms, kept.expires_unix_ms),
        "its lifetime counts from its first open"
    );
    // The runc session could not be saved: it ended with the daemon.
    let a = cell(&d.url, &lost.session_id, "l-2", "print(y)");
    assert_eq!(a.status, 404, "{}", a.body);
    assert_eq!(
        a.error().error.end_reason,
        Some(plimsoll_wire::EndReason::DaemonRestarted)
    );
    assert!(
        d.logs()
            .contains("sessions saved by the previous daemon restored"),
        "{}",
        d.logs()
    );

    // A SIGKILL saves nothing: the session ends with that daemon.
    d.restart();
    let a = cell(&d.url, &kept.session_id, "k-3", "print(x)");
    assert_eq!(a.status, 404, "{}", a.body);
    assert_eq!(
        a.error().error.end_reason,
        Some(plimsoll_wire::EndReason::DaemonRestarted)
    );
}
