//! The client against a real in-process daemon over real HTTP, and against a real proxy on
//! loopback that swaps, alters or downgrades what passes through it.

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt as _;
use std::sync::{Arc, Condvar, Mutex};

use plimsoll_client::{Client, ClientError, DigestKind, RunOptions, Token};
use plimsoll_test_daemon::TestDaemon;
use plimsoll_wire::digest::request_sha256;
use plimsoll_wire::{Language, Reason, Tier, not_dispatched_reason};
use serde_json::Value;

/// True when the test may go on; prints `SKIP` (or fails under CI=true) otherwise.
fn need_root(test: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    let why = "running sandboxes needs root (the process tier switches to a sandbox uid)";
    if plimsoll_env::strict() {
        panic!("{test}: {why}");
    }
    eprintln!("SKIP {test}: {why}");
    false
}

/// A daemon offering the process provider, with a state directory sandbox uids can enter and
/// a sandbox uid range of its own (`slot` is unique per test: tests run in parallel, and the
/// end of a run kills every process of its uid).
struct Fixture {
    daemon: TestDaemon,
    _state: tempfile::TempDir,
}

impl Fixture {
    fn start(slot: u32) -> Fixture {
        let state = tempfile::Builder::new()
            .prefix("plimsoll-client-test-")
            .tempdir()
            .unwrap();
        std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let daemon = TestDaemon::start(&format!(
            "providers = [\"process\"]\nstate_dir = \"{}\"\nsandbox_uid_base = {}\n",
            state.path().display(),
            2_400_000 + 100 * slot
        ));
        Fixture {
            daemon,
            _state: state,
        }
    }

    fn client(&self) -> Client {
        Client::new(&self.daemon.url, Token::new(self.daemon.token.clone()))
    }
}

fn js(code: &str) -> RunOptions {
    RunOptions::snippet(Language::Javascript, code)
}

#[test]
fn a_run_works_and_its_digests_verify() {
    if !need_root("a_run_works_and_its_digests_verify") {
        return;
    }
    let f = Fixture::start(1);
    let options = js("console.log(6 * 7)").min_isolation(Tier::Process);
    let resp = f.client().run(options.clone()).unwrap();
    assert_eq!(resp.result.stdout.as_slice(), b"42\n");
    assert_eq!(resp.result.exit_code, Some(0));
    assert_eq!(resp.isolation, Tier::Process);
    assert_eq!(resp.provider, "process");
    assert_eq!(
        resp.request_id.len(),
        32,
        "128-bit hex id: {}",
        resp.request_id
    );
    // The id is not part of the request digest: any id gives the same digest.
    assert_eq!(
        resp.request_sha256,
        request_sha256(&options.into_request("any".into()))
    );
    assert_eq!(resp.record.record_sha256.len(), 64);

    // Each run gets a fresh id.
    let again = f
        .client()
        .run(js("console.log(6 * 7)").min_isolation(Tier::Process))
        .unwrap();
    assert_ne!(again.request_id, resp.request_id);
    assert_eq!(again.request_sha256, resp.request_sha256);
    // The same output; the results may still differ in how each sandbox started (warm or
    // cold, a member's age) and in its wall (its uid), all inside the result digest: the
    // digests agree exactly when the results do.
    assert_eq!(again.result.stdout, resp.result.stdout);
    assert_eq!(again.result.exit_code, resp.result.exit_code);
    assert_eq!(
        again.result_sha256 == resp.result_sha256,
        again.result == resp.result,
        "{:?}\n{:?}",
        again.result,
        resp.result
    );
}

#[test]
fn a_refusal_that_echoes_our_id_is_honoured() {
    if !need_root("a_refusal_that_echoes_our_id_is_honoured") {
        return;
    }
    let f = Fixture::start(2);
    let e = f
        .client()
        .run(js("console.log(1)").min_isolation(Tier::Vm))
        .unwrap_err();
    assert_eq!(not_dispatched_reason(&e), Some(Reason::Isolation), "{e}");
    assert!(
        matches!(
            &e,
            ClientError::Refused {
                reason: Reason::Isolation,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        e.to_string().starts_with("not dispatched (isolation): "),
        "{e}"
    );

    // The daemon's default floor (container) is above what it offers: refused the same way.
    let e = f.client().run(js("console.log(1)")).unwrap_err();
    assert_eq!(not_dispatched_reason(&e), Some(Reason::Isolation), "{e}");
}

#[test]
fn a_bad_token_is_refused_and_never_printed() {
    if !need_root("a_bad_token_is_refused_and_never_printed") {
        return;
    }
    let f = Fixture::start(3);
    let secret = "plm_not-a-valid-token-but-still-secret";
    let client = Client::new(&f.daemon.url, Token::new(secret));
    let e = client
        .run(js("console.log(1)").min_isolation(Tier::Process))
        .unwrap_err();
    assert_eq!(not_dispatched_reason(&e), Some(Reason::Permission), "{e}");
    for text in [
        e.to_string(),
        format!("{e:?}"),
        serde_json::to_string(&e.to_response()).unwrap(),
        format!("{client:?}"),
        format!("{:?}", f.client()),
    ] {
        assert!(!text.contains(secret), "{text}");
        assert!(!text.contains(&f.daemon.token), "{text}");
    }
}

#[test]
fn providers_lists_the_process_provider() {
    if !need_root("providers_lists_the_process_provider") {
        return;
    }
    let f = Fixture::start(4);
    let p = f.client().providers().unwrap();
    assert_eq!(p.default_floor, Tier::Container);
    let process = p.providers.iter().find(|p| p.name == "process").unwrap();
    assert_eq!(process.isolation, Tier::Process);
    assert!(process.available, "{:?}", process.unavailable_reason);
    assert!(f.client().is_ready());
}

#[test]
fn a_refused_connection_is_not_dispatched() {
    // A port that was just free: nothing listens, so the connect is refused.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = Client::new(format!("http://127.0.0.1:{port}"), Token::new("t"));
    let e = client.run(js("console.log(1)")).unwrap_err();
    assert!(matches!(e, ClientError::Unreachable { .. }), "{e:?}");
    assert_eq!(not_dispatched_reason(&e), Some(Reason::Environment));
    assert!(!client.is_ready());
}

#[test]
fn an_invalid_request_is_not_sent() {
    let client = Client::new("http://127.0.0.1:9", Token::new("t"));
    let e = client.run(js("   ")).unwrap_err();
    assert!(matches!(e, ClientError::InvalidRequest { .. }), "{e:?}");
    assert_eq!(not_dispatched_reason(&e), Some(Reason::Request));
}

#[test]
fn a_request_over_the_body_limit_is_refused_here_and_not_sent() {
    // A real listener that nothing should ever connect to.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());

    let client = Client::new(&url, Token::new("t"));
    assert_eq!(
        client.max_body_bytes(),
        plimsoll_client::DEFAULT_MAX_BODY_BYTES
    );
    let big = format!("console.log('{}')", "x".repeat(9 * 1024 * 1024));
    let small = format!("console.log('{}')", "x".repeat(5000));
    for (client, code) in [
        (client.clone(), big),
        (client.with_max_body_bytes(4096), small),
    ] {
        let e = client.run(js(&code)).unwrap_err();
        assert!(matches!(e, ClientError::InvalidRequest { .. }), "{e:?}");
        assert_eq!(not_dispatched_reason(&e), Some(Reason::Request));
        assert!(e.to_string().contains("limit"), "{e}");
    }
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the client connected although the request was over its limit"
    );
}

#[test]
fn the_daemons_413_echoes_our_id_so_it_reads_not_dispatched() {
    // A client that does not know the daemon's smaller limit: the daemon's refusal must still
    // be recognised as this request's, so it reads "nothing ran", not "may have run".
    let d = TestDaemon::start("providers = [\"process\"]\n[daemon]\nmax_body_bytes = 4096\n");
    let client = Client::new(&d.url, Token::new(d.token.clone()));
    let e = client
        .run(js(&format!("console.log('{}')", "x".repeat(5000))))
        .unwrap_err();
    assert!(
        matches!(
            &e,
            ClientError::Refused {
                reason: Reason::Request,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(not_dispatched_reason(&e), Some(Reason::Request));
}

// ---------------------------------------------------------------------------------------
// A real HTTP proxy on loopback.

/// What the proxy does to what passes through it.
#[derive(Clone, Copy)]
enum Mode {
    /// Rewrites request bodies (JSON) on the way in and answers on the way out.
    Rewrite {
        request: fn(&mut Value),
        response: fn(&mut Value),
    },
    /// Holds the answers of two requests until both are in, then gives each the other's.
    Swap,
    /// Forwards every request, but answers the `n`th (from 0) that goes to a session's cells
    /// with a `500` that says nothing of what ran: a call the daemon ran, hidden.
    HideCell(usize),
    /// Forwards every request, but before the `n`th (from 0) that goes to a session's cells
    /// sends a cell of its own to the same session: a call slipped into the chain.
    SlipCell(usize),
}

fn keep(_: &mut Value) {}

/// One answer from upstream: status and body.
type Answer = (u16, Vec<u8>);

/// Answers held by a swapping proxy, by connection number.
#[derive(Default)]
struct Held {
    answers: HashMap<usize, Answer>,
    taken: usize,
    /// Requests to a session's cells seen so far.
    cells: usize,
}

/// A proxy serving on loopback, forwarding to `upstream`. Its threads end with the test.
struct Proxy {
    url: String,
}

impl Proxy {
    fn start(upstream: &str, mode: Mode) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let upstream = upstream.to_owned();
        let held = Arc::new((Mutex::new(Held::default()), Condvar::new()));
        std::thread::spawn(move || {
            for (n, conn) in listener.incoming().enumerate() {
                let Ok(conn) = conn else { return };
                let upstream = upstream.clone();
                let held = Arc::clone(&held);
                std::thread::spawn(move || serve(n, conn, &upstream, mode, &held));
            }
        });
        Proxy { url }
    }
}

fn serve(n: usize, mut conn: TcpStream, upstream: &str, mode: Mode, held: &(Mutex<Held>, Condvar)) {
    let (method, path, headers, mut body) = read_request(&conn);
    // A GET (the providers listing a client reads for the default floor) has no body.
    if let Mode::Rewrite { request, .. } = mode
        && !body.is_empty()
    {
        body = rewrite(&body, request);
    }
    // Which request to a session's cells this is, from 0.
    let cell = path.contains("/cells").then(|| {
        let mut h = held.0.lock().unwrap();
        h.cells += 1;
        h.cells - 1
    });
    if let Mode::SlipCell(slipped) = mode
        && cell == Some(slipped)
    {
        let own = serde_json::json!({"protocol": 1, "request_id": "slipped-in", "run": {"kind": "snippet", "language": "javascript", "code": "1"}});
        let (status, _) = forward(
            upstream,
            &method,
            &path,
            &headers,
            own.to_string().as_bytes(),
        );
        assert_eq!(status, 200, "the slipped-in call");
    }
    let mut answer = forward(upstream, &method, &path, &headers, &body);
    match mode {
        Mode::Rewrite { response, .. } => answer.1 = rewrite(&answer.1, response),
        Mode::SlipCell(_) => {}
        Mode::HideCell(hidden) => {
            if cell == Some(hidden) {
                let id: Value = serde_json::from_slice(&body).unwrap();
                answer = (
                    500,
                    serde_json::to_vec(&serde_json::json!({"protocol": 1, "request_id": id["request_id"], "error": {"code": "internal", "message": "hidden", "not_dispatched": null}})).unwrap(),
                );
            }
        }
        Mode::Swap => {
            let (lock, cv) = held;
            let mut h = lock.lock().unwrap();
            h.answers.insert(n, answer);
            cv.notify_all();
            while h.answers.len() + h.taken < 2 {
                h = cv.wait(h).unwrap();
            }
            let other = *h
                .answers
                .keys()
                .find(|k| **k != n)
                .expect("the other answer");
            answer = h.answers.remove(&other).unwrap();
            h.taken += 1;
        }
    }
    let head = format!(
        "HTTP/1.1 {} Proxied\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        answer.0,
        answer.1.len()
    );
    conn.write_all(head.as_bytes()).unwrap();
    conn.write_all(&answer.1).unwrap();
    conn.flush().unwrap();
}

fn rewrite(body: &[u8], f: fn(&mut Value)) -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(body).unwrap();
    f(&mut v);
    serde_json::to_vec(&v).unwrap()
}

/// Reads one HTTP/1.1 request with a content-length body.
fn read_request(conn: &TcpStream) -> (String, String, Vec<(String, String)>, Vec<u8>) {
    let mut r = BufReader::new(conn);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap().to_owned();
    let path = parts.next().unwrap().to_owned();
    let mut headers = Vec::new();
    let mut length = 0usize;
    loop {
        let mut h = String::new();
        r.read_line(&mut h).unwrap();
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap();
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_owned());
        if k == "content-length" {
            length = v.parse().unwrap();
        }
        assert_ne!(k, "transfer-encoding", "the client sends a content-length");
        headers.push((k, v));
    }
    let mut body = vec![0; length];
    r.read_exact(&mut body).unwrap();
    (method, path, headers, body)
}

/// Sends the request on to the daemon, passing the caller's authorization through.
fn forward(
    upstream: &str,
    method: &str,
    path: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> Answer {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .proxy(None)
        .build()
        .into();
    let auth = headers
        .iter()
        .find(|(k, _)| k == "authorization")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let url = format!("{upstream}{path}");
    let rid = headers
        .iter()
        .find(|(k, _)| k == "plimsoll-request-id")
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| "none".into());
    let mut resp = match method {
        "POST" => agent
            .post(&url)
            .header("authorization", &auth)
            .header("content-type", "application/json")
            .send(body)
            .unwrap(),
        "DELETE" => agent
            .delete(&url)
            .header("authorization", &auth)
            .header("plimsoll-request-id", &rid)
            .call()
            .unwrap(),
        _ => agent
            .get(&url)
            .header("authorization", &auth)
            .call()
            .unwrap(),
    };
    let status = resp.status().as_u16();
    (status, resp.body_mut().read_to_vec().unwrap())
}

#[test]
fn a_proxy_that_swaps_answers_cannot_make_a_run_read_not_dispatched() {
    if !need_root("a_proxy_that_swaps_answers_cannot_make_a_run_read_not_dispatched") {
        return;
    }
    let f = Fixture::start(5);
    let proxy = Proxy::start(&f.daemon.url, Mode::Swap);
    let client = Client::new(&proxy.url, Token::new(f.daemon.token.clone()));
    let refused_client = client.clone();
    // One request is refused (floor vm: nothing offers it), the other runs.
    let refused = std::thread::spawn(move || {
        refused_client.run(js("console.log('refused')").min_isolation(Tier::Vm))
    });
    let ran = client.run(js("console.log('ran')").min_isolation(Tier::Process));
    let refused = refused.join().unwrap();

    // The run that ran got the other's refusal: it must not read "nothing ran".
    let ran = ran.unwrap_err();
    assert_eq!(not_dispatched_reason(&ran), None, "{ran}");
    assert!(
        matches!(
            &ran,
            ClientError::UnverifiedRefusal {
                reason: Reason::Isolation,
                ..
            }
        ),
        "{ran:?}"
    );
    assert!(ran.to_string().contains("may have run"), "{ran}");

    // The refused one got the other's result: it must not take it as its own.
    let refused = refused.unwrap_err();
    assert!(
        matches!(&refused, ClientError::RequestIdMismatch { .. }),
        "{refused:?}"
    );
    assert_eq!(not_dispatched_reason(&refused), None);
}

#[test]
fn a_proxy_that_alters_one_byte_of_stdout_is_caught() {
    if !need_root("a_proxy_that_alters_one_byte_of_stdout_is_caught") {
        return;
    }
    let f = Fixture::start(6);
    fn bump(v: &mut Value) {
        assert_eq!(v["result"]["stdout"], "42\n", "{v}");
        v["result"]["stdout"] = "43\n".into();
    }
    let proxy = Proxy::start(
        &f.daemon.url,
        Mode::Rewrite {
            request: keep,
            response: bump,
        },
    );
    let client = Client::new(&proxy.url, Token::new(f.daemon.token.clone()));
    let e = client
        .run(js("console.log(6 * 7)").min_isolation(Tier::Process))
        .unwrap_err();
    let ClientError::DigestMismatch {
        kind: DigestKind::Result,
        computed,
        claimed,
        ..
    } = &e
    else {
        panic!("{e:?}")
    };
    assert_ne!(computed, claimed);
    assert!(e.to_string().contains(computed.as_str()) && e.to_string().contains(claimed.as_str()));
    assert_eq!(not_dispatched_reason(&e), None);
}

#[test]
fn a_proxy_that_lowers_the_floor_on_the_way_in_is_an_evidence_mismatch() {
    if !need_root("a_proxy_that_lowers_the_floor_on_the_way_in_is_an_evidence_mismatch") {
        return;
    }
    let f = Fixture::start(7);
    fn lower(v: &mut Value) {
        assert_eq!(v["minimum_isolation"], "kernel", "{v}");
        v["minimum_isolation"] = "process".into();
    }
    let proxy = Proxy::start(
        &f.daemon.url,
        Mode::Rewrite {
            request: lower,
            response: keep,
        },
    );
    let client = Client::new(&proxy.url, Token::new(f.daemon.token.clone()));
    let e = client
        .run(js("console.log(1)").min_isolation(Tier::Kernel))
        .unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::EvidenceMismatch {
                isolation: Tier::Process,
                floor: Tier::Kernel,
                ..
            }
        ),
        "{e:?}"
    );
    // The code ran: this is not a refusal.
    assert_eq!(not_dispatched_reason(&e), None);
}

#[test]
fn a_proxy_that_rewrites_the_tier_or_the_record_is_caught() {
    if !need_root("a_proxy_that_rewrites_the_tier_or_the_record_is_caught") {
        return;
    }
    let f = Fixture::start(8);
    let run_through = |response: fn(&mut Value)| {
        let proxy = Proxy::start(
            &f.daemon.url,
            Mode::Rewrite {
                request: keep,
                response,
            },
        );
        Client::new(&proxy.url, Token::new(f.daemon.token.clone()))
            .run(js("console.log(1)").min_isolation(Tier::Process))
            .unwrap_err()
    };

    // The record claims a stronger tier: its digest no longer matches.
    fn record_to_vm(v: &mut Value) {
        assert_eq!(v["record"]["isolation"], "process", "{v}");
        v["record"]["isolation"] = "vm".into();
    }
    let e = run_through(record_to_vm);
    assert!(
        matches!(
            e,
            ClientError::DigestMismatch {
                kind: DigestKind::Record,
                ..
            }
        ),
        "{e:?}"
    );

    // The response claims a stronger tier than its record.
    fn response_to_vm(v: &mut Value) {
        v["isolation"] = "vm".into();
    }
    let e = run_through(response_to_vm);
    assert!(
        matches!(
            e,
            ClientError::RecordMismatch {
                field: "isolation",
                ..
            }
        ),
        "{e:?}"
    );

    // The echoed id is rewritten: not ours.
    fn other_id(v: &mut Value) {
        v["request_id"] = "someone-else".into();
    }
    let e = run_through(other_id);
    assert!(matches!(e, ClientError::RequestIdMismatch { .. }), "{e:?}");
    assert_eq!(not_dispatched_reason(&e), None);
}

#[test]
fn a_refusal_whose_echo_is_rewritten_is_not_honoured() {
    if !need_root("a_refusal_whose_echo_is_rewritten_is_not_honoured") {
        return;
    }
    let f = Fixture::start(9);
    fn drop_id(v: &mut Value) {
        assert!(v["error"]["not_dispatched"].is_string(), "{v}");
        v["request_id"] = Value::Null;
    }
    let proxy = Proxy::start(
        &f.daemon.url,
        Mode::Rewrite {
            request: keep,
            response: drop_id,
        },
    );
    let e = Client::new(&proxy.url, Token::new(f.daemon.token.clone()))
        .run(js("console.log(1)").min_isolation(Tier::Vm))
        .unwrap_err();
    assert!(
        matches!(&e, ClientError::UnverifiedRefusal { echoed: None, .. }),
        "{e:?}"
    );
    assert_eq!(not_dispatched_reason(&e), None);
}

/// A session opened with a grant sends it: the body a listener on loopback receives names
/// it (the listener refuses the open as a daemon refuses a grant it will not give, echoing the
/// request id, so the refusal is believed: nothing opened).
#[test]
fn a_session_open_sends_the_grant_it_names() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = std::thread::spawn(move || {
        let (conn, _) = listener.accept().unwrap();
        let (method, path, _, body) = read_request(&conn);
        let sent: Value = serde_json::from_slice(&body).unwrap();
        let answer = serde_json::to_vec(&serde_json::json!({
            "protocol": 1,
            "request_id": sent["request_id"],
            "error": {
                "code": "permission",
                "message": "grant not allowed: this caller may not use that grant profile",
                "not_dispatched": "permission"
            }
        }))
        .unwrap();
        let mut w = &conn;
        write!(
            w,
            "HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            answer.len()
        )
        .unwrap();
        w.write_all(&answer).unwrap();
        (method, path, sent)
    });
    let options = plimsoll_client::SessionOptions::new(Language::Python)
        .min_isolation(Tier::Container)
        .grant("pkgs");
    let e = Client::new(&url, Token::new("plm_test"))
        .open_session(options)
        .unwrap_err();
    let (method, path, sent) = server.join().unwrap();
    assert_eq!((method.as_str(), path.as_str()), ("POST", "/v1/sessions"));
    assert_eq!(sent["grant"], "pkgs", "{sent}");
    assert_eq!(sent["language"], "python", "{sent}");
    assert_eq!(not_dispatched_reason(&e), Some(Reason::Permission));
    match e {
        ClientError::Refused { code, .. } => assert_eq!(code, "permission"),
        other => panic!("{other:?}"),
    }
}

/// A daemon offering crun, for sessions (`slot` as in [`Fixture::start`]).
fn session_fixture(test: &str, slot: u32) -> Option<Fixture> {
    if !need_root(test) {
        return None;
    }
    let state = tempfile::Builder::new()
        .prefix("plimsoll-client-test-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let image = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../build/images/sandbox");
    // The image is refused through anything but its real path.
    let image = std::fs::canonicalize(&image).unwrap_or(image);
    let daemon = TestDaemon::start(&format!(
        "providers = [\"crun\"]\nstate_dir = \"{}\"\nsandbox_uid_base = {}\n[pools]\n[oci]\nimage = \"{}\"\n",
        state.path().display(),
        2_400_000 + 100 * slot,
        image.display()
    ));
    let f = Fixture {
        daemon,
        _state: state,
    };
    let crun = f
        .client()
        .providers()
        .unwrap()
        .providers
        .into_iter()
        .find(|p| p.name == "crun")
        .map(|p| p.unavailable_reason.filter(|_| !p.available));
    if crun != Some(None) {
        let why = format!("the crun provider is unavailable: {crun:?}");
        if plimsoll_env::strict() {
            panic!("{test}: {why}");
        }
        eprintln!("SKIP {test}: {why}");
        return None;
    }
    Some(f)
}

#[test]
fn a_session_keeps_state_streams_resumes_and_ends_explicitly() {
    let Some(f) = session_fixture(
        "a_session_keeps_state_streams_resumes_and_ends_explicitly",
        12,
    ) else {
        return;
    };
    let client = f.client();
    let options =
        plimsoll_client::SessionOptions::new(Language::Python).min_isolation(Tier::Container);
    let mut s = client.open_session(options).unwrap();
    assert_eq!(
        (s.info().provider.as_str(), s.info().isolation),
        ("crun", Tier::Container)
    );
    let r = s.cell("n = 41").unwrap();
    assert_eq!(r.result.state_kept, Some(true));
    // Streamed: chunks as they come, exactly the result's bytes.
    let mut chunks = Vec::new();
    let r = s
        .cell_with(
            "n += 1\nprint('a', flush=True)\nprint(n)",
            false,
            None,
            Some(&mut |c: &plimsoll_wire::OutputChunk| {
                chunks.extend_from_slice(c.bytes.as_slice())
            }),
        )
        .unwrap();
    assert_eq!(r.result.stdout.as_slice(), b"a\n42\n");
    assert_eq!(chunks, b"a\n42\n");
    assert_eq!(
        s.last_request().map(|q| q.request_id.as_str()),
        Some(r.request_id.as_str())
    );
    // Resumed by id (as another process would): the chain goes on at call 3.
    let id = s.id().to_owned();
    let mut again = client.session(&id).unwrap();
    let r = again.cell("print(n)").unwrap();
    assert_eq!(r.result.stdout.as_slice(), b"42\n");
    assert_eq!(r.record.session.as_ref().unwrap().sequence, 3);
    let bytes = [0u8, 255, 10, 200];
    again.put("d/x.bin", &bytes).unwrap();
    let (got, _) = again.get("d/x.bin").unwrap();
    assert_eq!(got.as_deref(), Some(&bytes[..]));
    let (missing, _) = again.get("nope").unwrap();
    assert_eq!(missing, None);
    let info = again.close().unwrap();
    assert_eq!(info.end_reason, Some(plimsoll_wire::EndReason::Closed));
    // The first handle's next call: refused, nothing ran, with the reason it ended.
    let e = s.cell("print(n)").unwrap_err();
    assert_eq!(not_dispatched_reason(&e), Some(Reason::Request));
    match e {
        ClientError::Refused {
            code, end_reason, ..
        } => assert_eq!(
            (code.as_str(), end_reason),
            ("session_ended", Some(plimsoll_wire::EndReason::Closed))
        ),
        other => panic!("{other:?}"),
    }
}

/// #28.8: a call that may have run with no answer this client could verify leaves where the
/// chain stands unknown: the session sends nothing more (refused here, not dispatched) until
/// `resync` takes the daemon's word for it, and then goes on from there.
#[test]
fn a_session_call_hidden_by_a_proxy_puts_the_chain_in_doubt_until_resync() {
    let Some(f) = session_fixture(
        "a_session_call_hidden_by_a_proxy_puts_the_chain_in_doubt_until_resync",
        13,
    ) else {
        return;
    };
    let proxy = Proxy::start(&f.daemon.url, Mode::HideCell(1));
    let client = Client::new(&proxy.url, Token::new(f.daemon.token.clone()));
    let mut s = client
        .open_session(plimsoll_client::SessionOptions::new(Language::Javascript))
        .unwrap();
    s.cell("var n = 1").unwrap();
    assert_eq!(s.doubt(), None);
    // The daemon runs this one; the proxy says it failed.
    let hidden = s.cell("n += 1").unwrap_err();
    assert_eq!(not_dispatched_reason(&hidden), None, "{hidden}");
    let hidden_id = hidden.request_id().unwrap().to_owned();
    assert!(
        s.doubt().is_some_and(|d| d.contains(&hidden_id)),
        "{:?}",
        s.doubt()
    );
    // The next call is refused here, unsent: nothing ran, and the daemon saw no call.
    for _ in 0..2 {
        let e = s.cell("n += 10").unwrap_err();
        assert!(matches!(e, ClientError::ChainInDoubt { .. }), "{e:?}");
        assert_eq!(not_dispatched_reason(&e), Some(Reason::Request), "{e}");
        assert_eq!(e.code(), "chain_in_doubt");
        assert!(e.to_string().contains("resync"), "{e}");
    }
    assert!(matches!(
        s.put("f", b"x"),
        Err(ClientError::ChainInDoubt { .. })
    ));
    assert!(matches!(s.get("f"), Err(ClientError::ChainInDoubt { .. })));
    assert!(matches!(
        s.steps(&["true"]),
        Err(ClientError::ChainInDoubt { .. })
    ));
    let shown = f.client().session(s.id()).unwrap();
    assert_eq!(shown.info().calls, 2, "a call in doubt sent something");
    // Resynced, it goes on where the daemon says the chain stands: the hidden call ran.
    let info = s.resync().unwrap();
    assert_eq!(info.calls, 2);
    assert_eq!(s.doubt(), None);
    let r = s.cell("console.log(n)").unwrap();
    assert_eq!(r.result.stdout.as_slice(), b"2\n");
    assert_eq!(r.record.session.as_ref().unwrap().sequence, 3);
}

/// #28.8: an answer that verifies as a run but is not the next link of the session's chain
/// (here a proxy slipped a call of its own in before it) is a chain mismatch, with its own
/// kind and the field that breaks, may have run; and the chain is then in doubt.
#[test]
fn a_call_slipped_into_a_session_is_a_chain_mismatch() {
    let Some(f) = session_fixture("a_call_slipped_into_a_session_is_a_chain_mismatch", 11) else {
        return;
    };
    let proxy = Proxy::start(&f.daemon.url, Mode::SlipCell(1));
    let client = Client::new(&proxy.url, Token::new(f.daemon.token.clone()));
    let mut s = client
        .open_session(plimsoll_client::SessionOptions::new(Language::Javascript))
        .unwrap();
    s.cell("var n = 1").unwrap();
    let e = s.cell("console.log(n)").unwrap_err();
    match &e {
        ClientError::ChainMismatch {
            session_id,
            field,
            expected,
            got,
            ..
        } => {
            assert_eq!(session_id, s.id());
            assert_eq!(
                (*field, expected.as_deref(), got.as_deref()),
                ("sequence", Some("2"), Some("3"))
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(e.code(), "chain_mismatch");
    assert_eq!(not_dispatched_reason(&e), None, "{e}");
    assert!(e.to_string().contains("may have run"), "{e}");
    assert!(s.doubt().is_some());
    assert!(matches!(
        s.cell("console.log(n)"),
        Err(ClientError::ChainInDoubt { .. })
    ));
}

/// #28.7: no floor sent, so the daemon's default floor (container) holds; a proxy lowers the
/// tier and the applied floor the answer states to `process` and recomputes the record
/// digest. Every digest then checks, and only the floor this client learnt from the daemon
/// (`GET /v1/providers`) tells the run fell below it: the code ran, so it is an evidence
/// mismatch, never a refusal. Lowered in the record alone, it is a record mismatch.
#[test]
fn a_run_lowered_below_the_daemons_default_floor_is_caught_though_no_floor_was_sent() {
    let test = "a_run_lowered_below_the_daemons_default_floor_is_caught_though_no_floor_was_sent";
    let Some(f) = session_fixture(test, 10) else {
        return;
    };
    assert_eq!(
        f.client().providers().unwrap().default_floor,
        Tier::Container
    );
    let run_through = |response: fn(&mut Value)| {
        let proxy = Proxy::start(
            &f.daemon.url,
            Mode::Rewrite {
                request: keep,
                response,
            },
        );
        Client::new(&proxy.url, Token::new(f.daemon.token.clone())).run(js("console.log(1)"))
    };
    // Unaltered, the run meets the default floor.
    let honest = run_through(keep).unwrap();
    assert_eq!(honest.isolation, Tier::Container);
    assert_eq!(honest.record.minimum_isolation, Some(Tier::Container));

    fn downgrade(v: &mut Value) {
        if v.get("record").is_none() {
            return; // the listing, or a refusal
        }
        assert_eq!(v["isolation"], "container", "{v}");
        v["isolation"] = "process".into();
        v["record"]["isolation"] = "process".into();
        v["record"]["minimum_isolation"] = "process".into();
        recompute_record_digest(v);
    }
    let e = run_through(downgrade).unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::EvidenceMismatch {
                isolation: Tier::Process,
                floor: Tier::Container,
                ..
            }
        ),
        "{e:?}"
    );
    // The code ran (may have run): not a refusal.
    assert_eq!(not_dispatched_reason(&e), None, "{e}");
    assert_eq!(e.to_response().error.not_dispatched, None);

    fn lower_record_floor(v: &mut Value) {
        if v.get("record").is_none() {
            return;
        }
        v["record"]["minimum_isolation"] = "process".into();
        recompute_record_digest(v);
    }
    let e = run_through(lower_record_floor).unwrap_err();
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
        "{e:?}"
    );
    assert_eq!(not_dispatched_reason(&e), None, "{e}");
}

/// Recomputes `record.record_sha256` of a run response after a proxy's change to its record.
fn recompute_record_digest(v: &mut Value) {
    let record: plimsoll_wire::RunRecord = serde_json::from_value(v["record"].clone()).unwrap();
    v["record"]["record_sha256"] = plimsoll_wire::digest::record_sha256(&record).into();
}

/// #28.7, for a session: opened with no floor, it is held to the daemon's default floor; an
/// open answer rewritten to say `process` (tier and floor alike: an open answer carries no
/// digest) is an evidence mismatch, and the session is closed again.
#[test]
fn a_session_opened_below_the_daemons_default_floor_is_caught_and_closed() {
    let test = "a_session_opened_below_the_daemons_default_floor_is_caught_and_closed";
    let Some(f) = session_fixture(test, 14) else {
        return;
    };
    fn downgrade(v: &mut Value) {
        if v.get("session_id").is_none() || v.get("end_reason").is_some() {
            return; // the listing, or the close
        }
        v["isolation"] = "process".into();
        v["minimum_isolation"] = "process".into();
    }
    let proxy = Proxy::start(
        &f.daemon.url,
        Mode::Rewrite {
            request: keep,
            response: downgrade,
        },
    );
    let client = Client::new(&proxy.url, Token::new(f.daemon.token.clone()));
    let e = client
        .open_session(plimsoll_client::SessionOptions::new(Language::Python))
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
        "{e:?}"
    );
    assert_eq!(not_dispatched_reason(&e), None);
    assert_eq!(
        f.client().list_sessions().unwrap().sessions.len(),
        0,
        "the session was left open"
    );
}

/// The SHA-256 of the accepted tank controller's trajectory on hidden-1: the same on every
/// host and tier, whichever language the controller is written in.
const ACCEPTED_FINGERPRINT: &str =
    "f0fe0f868cdd7b2fd62fee9132f4ec5f62ec04980aac34d0ec552f134d1e0e47";

/// A trial of the tank controller `name` on hidden-1, with generous deadlines (the tests
/// share two cores with everything else).
fn tank_trial(name: &str) -> plimsoll_client::TrialOptions {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let read = |p: &str| std::fs::read(repo.join(p)).unwrap();
    plimsoll_client::TrialOptions::new(
        "tank",
        name,
        read(&format!("examples/controllers/tank/{name}")),
    )
    .scenario("hidden-1.json", read("sims/tank/scenarios/hidden-1.json"))
    .first_deadline_ms(20_000)
    .tick_deadline_ms(5_000)
    .min_isolation(Tier::Container)
}

#[test]
fn trials_of_the_default_images_tank_pass_fail_and_name_only_its_simulators() {
    let test = "trials_of_the_default_images_tank_pass_fail_and_name_only_its_simulators";
    let Some(f) = session_fixture(test, 15) else {
        return;
    };
    let client = f.client();
    let providers = client.providers().unwrap();
    let image = providers.images.iter().find(|i| i.default).unwrap();
    let names: Vec<&str> = image.simulators.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["cartpole", "tank", "motor"]);

    // The accepted controllers pass, and the fingerprint is the trajectory's SHA-256.
    for name in ["accepted.py", "accepted.js"] {
        let resp = client.trial(tank_trial(name).reproducible()).unwrap();
        assert_eq!(
            resp.result.exit_code,
            Some(0),
            "{name}: {:?}",
            resp.result.steps
        );
        let [step] = &resp.record.trials[..] else {
            panic!("{name}: {:?}", resp.record.trials);
        };
        assert!(
            step.pass && step.step == 0 && step.simulator.name == "tank",
            "{step:?}"
        );
        // The simulator the record names is the module the image it ran in declares.
        let ran_in = resp.record.image.as_ref().unwrap();
        let declared = providers
            .images
            .iter()
            .find(|i| i.identity == ran_in.identity)
            .and_then(|i| i.simulators.iter().find(|s| s.name == "tank"))
            .unwrap();
        assert_eq!(step.simulator.sha256, declared.sha256);
        let [trial] = &step.trials[..] else {
            panic!("{step:?}")
        };
        assert_eq!(trial.scenario.as_deref(), Some("hidden-1"));
        assert_eq!(trial.end, plimsoll_wire::TrialEnd::Completed, "{trial:?}");
        assert!(trial.pass && trial.ticks == 1800, "{trial:?}");
        assert!(trial.score.is_some_and(|s| s.get() >= 0.75), "{trial:?}");
        let [trajectory] = &resp.result.artifacts[..] else {
            panic!("{:?}", resp.result.artifacts)
        };
        assert_eq!(trajectory.path, "hidden-1.bin");
        assert!(trajectory.found && !trajectory.truncated);
        assert_eq!(
            plimsoll_wire::digest::sha256_hex(trajectory.content.as_slice()),
            trial.fingerprint
        );
        assert_eq!(trial.fingerprint, ACCEPTED_FINGERPRINT);
    }

    // The failing ones overflow: a failed exam is a result, the record says why.
    for name in ["failing.py", "failing.js"] {
        let resp = client.trial(tank_trial(name)).unwrap();
        assert_eq!(
            resp.result.exit_code,
            Some(1),
            "{name}: {:?}",
            resp.result.steps
        );
        let step = &resp.record.trials[0];
        let trial = &step.trials[0];
        assert!(!step.pass && !trial.pass, "{step:?}");
        assert_eq!(trial.end, plimsoll_wire::TrialEnd::Failed);
        assert!(
            trial
                .reason
                .as_deref()
                .is_some_and(|r| r.contains("overflowed")),
            "{trial:?}"
        );
        assert_eq!(
            plimsoll_wire::digest::sha256_hex(resp.result.artifacts[0].content.as_slice()),
            trial.fingerprint
        );
    }

    // A simulator the image lacks is refused, and nothing ran.
    let mut boat = tank_trial("accepted.py");
    boat.simulator = "boat".into();
    let e = client.trial(boat).unwrap_err();
    assert!(
        matches!(&e, ClientError::Refused { reason: Reason::Environment, message, .. } if message.contains("boat")),
        "{e:?}"
    );
    assert_eq!(not_dispatched_reason(&e), Some(Reason::Environment));

    // What the runner could not take is refused here: nothing is sent.
    let e = client
        .trial(tank_trial("accepted.py").scenario("a b.json", "{}"))
        .unwrap_err();
    assert!(
        matches!(&e, ClientError::InvalidRequest { message, .. } if message.contains("may hold only")),
        "{e:?}"
    );
    assert_eq!(not_dispatched_reason(&e), Some(Reason::Request));
}
