//! Grants end to end, for real: the engine with the process provider (needs root), a real
//! HTTP API on loopback that demands the minted credential, and snippets that use the
//! in-sandbox clients, skip them, and attack the broker.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use plimsoll_broker::GrantProfiles;
use plimsoll_engine::{Engine, Reason, RunError, Settings, not_dispatched_reason};
use plimsoll_testing::api::{Expect, TestApi};
use plimsoll_testing::{TestDir, is_root, probe_binary, skip_or_fail};
use plimsoll_wire::{Language, Limits, PROTOCOL, RunRequest, RunResponse, RunSpec, Snippet, Tier};

const TOKEN: &str = "tok-3f9a1c7e5b2d4a6c8e0f";
/// A token with the characters JSON encoders escape by default (`/`, `&`, `<`, `>`) and
/// percent-encoding changes.
const ODD_TOKEN: &str = "tok/3f9a&1c7e+5b2d=4a6c<8e>0f";
const HMAC_KEY: &str = "k3y-for-the-orders-api-0123456789abcdef";

/// The grants file of these tests: `orders` (static token) and `orders-jwt` (HS256), both for
/// caller `alice`, against `api`.
fn grants_text(api: &str, budget: u32) -> String {
    format!(
        r#"
[profiles.orders]
base_url = "{api}"
routes = ["GET /orders/*", "POST /orders", "GET /status/*", "GET /redirect", "GET /echo-auth", "GET /echo-auth/*", "GET /big", "GET /search?", "GET /slow", "GET /gzip"]
callers = ["alice"]
call_budget = {budget}
max_request_bytes = 65536
max_response_bytes = 1048576
timeout_ms = 2000
[profiles.orders.credential]
kind = "static"
secret_env = "ORDERS_API_TOKEN"

[profiles.orders-odd]
base_url = "{api}"
routes = ["GET /echo-auth/*"]
callers = ["alice"]
call_budget = 20
[profiles.orders-odd.credential]
kind = "static"
secret_env = "ORDERS_ODD_TOKEN"

[profiles.orders-jwt]
base_url = "{api}"
routes = ["GET /orders/*", "GET /echo-auth/*"]
callers = ["alice"]
call_budget = 20
[profiles.orders-jwt.credential]
kind = "jwt"
key_env = "ORDERS_JWT_KEY"
audience = "orders-api"
issuer = "plimsoll-test"
"#
    )
}

fn test_env(name: &str) -> Option<String> {
    match name {
        "ORDERS_API_TOKEN" => Some(TOKEN.into()),
        "ORDERS_ODD_TOKEN" => Some(ODD_TOKEN.into()),
        "ORDERS_JWT_KEY" => Some(HMAC_KEY.into()),
        _ => None,
    }
}

/// A probed engine offering only the process provider, with the grants above.
fn engine(test: &str, uid_base: u32, grants: GrantProfiles) -> Option<(Engine, TestDir)> {
    if !is_root() {
        skip_or_fail(test, "needs root to run the process provider");
        return None;
    }
    let dir = TestDir::new("grants", test);
    let probe = probe_binary().unwrap_or_else(|e| panic!("{e}"));
    let toml = format!(
        "providers = [\"process\"]\nstate_dir = {state:?}\nsandbox_uid_base = {uid_base}\nmax_concurrent = 2\n[process]\nprobe = {probe:?}\n",
        state = dir.path().join("state").display().to_string(),
        probe = probe.display().to_string(),
    );
    let engine = Settings::parse(&toml)
        .unwrap()
        .build_engine(&[])
        .unwrap()
        .with_grants(grants);
    engine.probe_all();
    assert!(engine.ready(), "{:?}", engine.providers());
    Some((engine, dir))
}

fn request(language: Language, code: &str, grant: Option<&str>) -> RunRequest {
    RunRequest {
        image: None,
        protocol: PROTOCOL,
        request_id: "r-grant".into(),
        minimum_isolation: Some(Tier::Process),
        provider: None,
        limits: Some(Limits {
            timeout_ms: Some(20_000),
            ..Limits::default()
        }),
        run: RunSpec::Snippet(Snippet {
            language,
            code: code.into(),
        }),
        grant: grant.map(str::to_owned),
    }
}

fn stdout(r: &RunResponse) -> String {
    String::from_utf8_lossy(r.result.stdout.as_slice()).into_owned()
}

fn stderr(r: &RunResponse) -> String {
    String::from_utf8_lossy(r.result.stderr.as_slice()).into_owned()
}

fn static_api() -> TestApi {
    TestApi::start(Expect::Static {
        header: "authorization".into(),
        value: format!("Bearer {TOKEN}"),
    })
}

fn run_ok(engine: &Engine, language: Language, code: &str, grant: Option<&str>) -> RunResponse {
    let resp = engine
        .run("alice", &request(language, code, grant))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        resp.result.exit_code,
        Some(0),
        "stdout: {}\nstderr: {}",
        stdout(&resp),
        stderr(&resp)
    );
    resp
}

#[test]
fn a_granted_route_works_from_javascript_and_python() {
    let api = static_api();
    let grants = GrantProfiles::parse(&grants_text(&api.url(), 10), test_env).unwrap();
    let Some((engine, _dir)) = engine("works", 2_450_000, grants) else {
        return;
    };
    let js = r#"
(async () => {
  const order = await host.get('/orders/42');
  console.log(JSON.stringify(order));
  const made = await host.post('/orders', { item: 'tea', n: 2 });
  console.log(JSON.stringify(made));
})();
"#;
    let resp = run_ok(&engine, Language::Javascript, js, Some("orders"));
    let out = stdout(&resp);
    let answers: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        answers,
        [
            serde_json::json!({"method": "GET", "path": "/orders/42", "body": null}),
            serde_json::json!({"method": "POST", "path": "/orders", "body": {"item": "tea", "n": 2}}),
        ]
    );
    let seen = api.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(
        seen.iter().all(|s| s.authorized),
        "the API got the token: {seen:?}"
    );
    assert_eq!(
        resp.result
            .calls
            .iter()
            .map(|c| (c.method.as_str(), c.route.as_deref(), c.status))
            .collect::<Vec<_>>(),
        [
            ("GET", Some("/orders/*"), Some(200)),
            ("POST", Some("/orders"), Some(200))
        ]
    );
    assert_eq!(
        resp.result.calls[1].request_bytes,
        br#"{"item":"tea","n":2}"#.len() as u64
    );
    assert!(
        resp.result
            .calls
            .iter()
            .all(|c| c.error.is_none() && c.response_bytes > 0)
    );
    // The calls are covered by the result digest the client recomputes.
    assert_eq!(
        resp.result_sha256,
        plimsoll_wire::digest::result_sha256(&resp.result)
    );

    let py = r#"
import plimsoll_host as host
print(host.get("/orders/7")["path"])
print(host.put("/orders", {"x": 1}) if False else "skip-put")
try:
    host.get("/status/404")
except host.HostError as e:
    print("rejected", e.status, e.code)
"#;
    let resp = run_ok(&engine, Language::Python, py, Some("orders"));
    assert_eq!(stdout(&resp), "/orders/7\nskip-put\nrejected 404 status\n");
    assert_eq!(resp.result.calls.len(), 2);
    assert_eq!(resp.result.calls[1].status, Some(404));
    assert_eq!(resp.result.calls[1].route.as_deref(), Some("/status/*"));
}

#[test]
fn ungranted_routes_wrong_methods_and_path_tricks_are_refused() {
    let api = static_api();
    let grants = GrantProfiles::parse(&grants_text(&api.url(), 100), test_env).unwrap();
    let Some((engine, _dir)) = engine("refused", 2_450_016, grants) else {
        return;
    };
    // Each line: method, path, the code the sandbox must see.
    let cases: &[(&str, &str, &str)] = &[
        ("GET", "/admin", "route_not_allowed"),
        ("GET", "/orders", "route_not_allowed"),
        ("GET", "/orders/1/items", "route_not_allowed"),
        ("DELETE", "/orders/1", "route_not_allowed"),
        ("PUT", "/orders", "route_not_allowed"),
        ("GET", "/orders/1?admin=1", "route_not_allowed"),
        ("GET", "/orders/../admin", "path_not_canonical"),
        ("GET", "/orders/./1", "path_not_canonical"),
        ("GET", "/orders/..", "path_not_canonical"),
        ("GET", "/orders/%2e%2e", "path_not_canonical"),
        ("GET", "/orders/%2F..%2Fadmin", "path_not_canonical"),
        ("GET", "/orders/%5c..%5cadmin", "path_not_canonical"),
        ("GET", "/orders/%252e", "path_not_canonical"),
        ("GET", "/orders\\..\\admin", "path_not_canonical"),
        ("GET", "/orders/..;/admin", "path_not_canonical"),
        ("GET", "/orders/1;jsessionid=x", "path_not_canonical"),
        ("GET", "/orders/1\r\nX-Injected: 1", "path_not_canonical"),
        ("GET", "/orders/\u{0}", "path_not_canonical"),
        ("GET", "/orders/a b", "path_not_canonical"),
        ("GET", "/orders//1", "path_not_canonical"),
        ("GET", "/orders/1#frag", "path_not_canonical"),
        ("GET", "orders/1", "path_not_canonical"),
        ("GET", "//evil.example/orders/1", "path_not_canonical"),
        ("GET", "/orders/%zz", "path_not_canonical"),
    ];
    let table: Vec<String> = cases
        .iter()
        .map(|(m, p, _)| {
            format!(
                "[{}, {}]",
                serde_json::to_string(m).unwrap(),
                serde_json::to_string(p).unwrap()
            )
        })
        .collect();
    let js = format!(
        r#"
const cases = [{}];
(async () => {{
  for (const [m, p] of cases) {{
    try {{
      const call = {{GET: host.get, DELETE: host.delete, PUT: (x) => host.put(x, {{}})}}[m];
      await call(p);
      console.log('allowed');
    }} catch (e) {{
      console.log(e.code);
    }}
  }}
  // A query where the route allows one, and a redirect that is answered, not followed.
  console.log(JSON.stringify(await host.get('/search?q=tea')));
  try {{ await host.get('/redirect'); }} catch (e) {{ console.log('redirect', e.status); }}
}})();
"#,
        table.join(", ")
    );
    let resp = run_ok(&engine, Language::Javascript, &js, Some("orders"));
    let out = stdout(&resp);
    let lines: Vec<&str> = out.lines().collect();
    for (i, (m, p, code)) in cases.iter().enumerate() {
        assert_eq!(lines.get(i).copied(), Some(*code), "{m} {p:?}\n{out}");
    }
    assert!(out.contains(r#""path":"/search?q=tea""#), "{out}");
    assert!(out.contains("redirect 302"), "{out}");
    let seen: Vec<String> = api.seen().iter().map(|s| s.target.clone()).collect();
    assert_eq!(
        seen,
        ["/search?q=tea", "/redirect"],
        "only granted calls reached the API"
    );
    let calls = &resp.result.calls;
    assert_eq!(calls.len(), cases.len() + 2);
    for (c, (m, _, code)) in calls.iter().zip(cases) {
        assert_eq!(
            (c.method.as_str(), c.error.as_deref(), c.status),
            (*m, Some(*code), None)
        );
    }
}

#[test]
fn code_that_skips_the_client_reaches_nothing() {
    let api = static_api();
    let grants = GrantProfiles::parse(&grants_text(&api.url(), 10), test_env).unwrap();
    let Some((engine, _dir)) = engine("direct", 2_450_032, grants) else {
        return;
    };
    let url = api.url();
    let port = api.addr.port();
    // With a grant: only the broker channel; a direct connection to the API fails.
    let js = format!(
        r#"
const net = require('net');
const fs = require('fs');
const links = fs.readdirSync('/proc/self/fd').map((fd) => {{ try {{ return fd + '=' + fs.readlinkSync('/proc/self/fd/' + fd); }} catch (e) {{ return ''; }} }});
console.log('sockets:', links.filter((l) => l.includes('=socket:')).join(' ').replace(/socket:\[\d+\]/g, 'socket'));
(async () => {{
  // (Not fetch: its WebAssembly parser wants more address space than the run's limit.)
  await new Promise((resolve) => {{
    require('http').get('{url}/orders/1', () => {{ console.log('http reached the API'); resolve(); }})
      .on('error', (e) => {{ console.log('http failed:', e.code); resolve(); }});
  }});
  await new Promise((resolve) => {{
    const s = net.connect({port}, '127.0.0.1');
    s.on('connect', () => {{ console.log('connect reached the API'); s.destroy(); resolve(); }});
    s.on('error', (e) => {{ console.log('connect failed:', e.code); resolve(); }});
  }});
  console.log('host is', typeof host);
}})();
"#
    );
    let resp = run_ok(&engine, Language::Javascript, &js, Some("orders"));
    let out = stdout(&resp);
    assert!(
        out.contains("sockets: 3=socket\n"),
        "the channel, and nothing else: {out}"
    );
    assert!(out.contains("http failed: EPERM"), "{out}");
    assert!(out.contains("connect failed: EPERM"), "{out}");
    assert!(out.contains("host is object"), "{out}");
    let py = format!(
        r#"
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2)
    print("reached")
except OSError as e:
    print("failed", e.errno)
"#
    );
    let resp = run_ok(&engine, Language::Python, &py, Some("orders"));
    assert_eq!(stdout(&resp), "failed 1\n");
    assert!(
        api.seen().is_empty(),
        "nothing reached the API: {:?}",
        api.seen()
    );
    assert!(resp.result.calls.is_empty());

    // Without a grant: no channel at all (nothing at descriptor 3, no `host`), no network.
    let js = r#"
const fs = require('fs');
const links = fs.readdirSync('/proc/self/fd').map((fd) => { try { return fs.readlinkSync('/proc/self/fd/' + fd); } catch (e) { return ''; } });
console.log('sockets:', links.filter((l) => l.startsWith('socket:')).length);
console.log('host is', typeof host);
"#;
    let resp = run_ok(&engine, Language::Javascript, js, None);
    assert_eq!(stdout(&resp), "sockets: 0\nhost is undefined\n");
    let py = r#"
import os, socket
try:
    os.fstat(3); print("fd 3 open")
except OSError as e:
    print("fd 3", e.errno)
try:
    import plimsoll_host; print("client present")
except ImportError:
    print("no client")
try:
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); print("socket made")
except OSError as e:
    print("socket", e.errno)
"#;
    let resp = run_ok(&engine, Language::Python, py, None);
    assert_eq!(stdout(&resp), "fd 3 9\nno client\nsocket 1\n");
    assert!(resp.result.calls.is_empty());
}

#[test]
fn the_budget_runs_out_cleanly() {
    let api = static_api();
    let grants = GrantProfiles::parse(&grants_text(&api.url(), 2), test_env).unwrap();
    let Some((engine, _dir)) = engine("budget", 2_450_048, grants) else {
        return;
    };
    let js = r#"
(async () => {
  for (let i = 1; i <= 4; i++) {
    try { await host.get('/orders/' + i); console.log(i, 'ok'); }
    catch (e) { console.log(i, e.code, e.message); }
  }
})();
"#;
    let resp = run_ok(&engine, Language::Javascript, js, Some("orders"));
    let out = stdout(&resp);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "1 ok");
    assert_eq!(lines[1], "2 ok");
    assert!(
        lines[2].starts_with("3 budget_exhausted GET /orders/3: this run has used all 2 calls"),
        "{out}"
    );
    assert!(lines[3].starts_with("4 budget_exhausted"), "{out}");
    assert_eq!(api.seen().len(), 2);
    let errors: Vec<Option<&str>> = resp
        .result
        .calls
        .iter()
        .map(|c| c.error.as_deref())
        .collect();
    // The first call past the budget is listed; later ones are answered but not listed.
    assert_eq!(errors, [None, None, Some("budget_exhausted")]);
}

#[test]
fn request_and_response_caps_hold_and_echoed_credentials_are_withheld() {
    let api = static_api();
    let grants = GrantProfiles::parse(&grants_text(&api.url(), 10), test_env).unwrap();
    let Some((engine, _dir)) = engine("caps", 2_450_064, grants) else {
        return;
    };
    let js = r#"
(async () => {
  for (const [what, f] of [
    ['big response', () => host.get('/big')],
    ['body over the cap', () => host.post('/orders', { s: 'x'.repeat(70000) })],
    ['frame over the cap', () => host.post('/orders', { s: 'x'.repeat(300000) })],
    ['echo', () => host.get('/echo-auth')],
    ['slow', () => host.get('/slow')],
    ['after', () => host.get('/orders/1')],
  ]) {
    try { const r = await f(); console.log(what, 'ok', JSON.stringify(r).slice(0, 80)); }
    catch (e) { console.log(what, e.code); }
  }
})();
"#;
    let resp = run_ok(&engine, Language::Javascript, js, Some("orders"));
    let out = stdout(&resp);
    assert_eq!(
        out,
        "big response response_too_large\nbody over the cap request_too_large\nframe over the cap request_too_large\necho response_rejected\nslow upstream_timeout\nafter ok {\"body\":null,\"method\":\"GET\",\"path\":\"/orders/1\"}\n",
        "{}",
        stderr(&resp)
    );
    assert!(!out.contains(TOKEN));
    let seen: Vec<String> = api.seen().iter().map(|s| s.target.clone()).collect();
    assert_eq!(seen, ["/big", "/echo-auth", "/slow", "/orders/1"]);
    let echo = &resp.result.calls[3];
    assert_eq!(
        (echo.status, echo.error.as_deref()),
        (Some(200), Some("response_rejected"))
    );
}

/// A buffer the tracing subscriber writes into, shared with the test.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The snippet that looks everywhere the sandbox can: its environment, every /proc/*/cmdline
/// and /proc/*/environ it can read, its own descriptors' targets, every file under its code
/// and work directories and /tmp, and what a call's answer gave it. It prints all of it; the
/// test (which knows the token) searches the output.
const LOOK_EVERYWHERE: &str = r#"
const fs = require('fs');
const path = require('path');
const dump = [];
dump.push('ENV ' + JSON.stringify(process.env));
dump.push('ARGV ' + JSON.stringify(process.argv));
for (const pid of fs.readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
  for (const f of ['cmdline', 'environ']) {
    try { dump.push(pid + ' ' + f + ' ' + fs.readFileSync('/proc/' + pid + '/' + f).toString('latin1')); } catch (e) {}
  }
}
for (const fd of fs.readdirSync('/proc/self/fd')) {
  try { dump.push('FD ' + fd + ' ' + fs.readlinkSync('/proc/self/fd/' + fd)); } catch (e) {}
}
let files = 0;
function walk(dir) {
  let entries = [];
  try { entries = fs.readdirSync(dir, { withFileTypes: true }); } catch (e) { return; }
  for (const e of entries) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) walk(p);
    else if (e.isFile()) { try { dump.push('FILE ' + p + ' ' + fs.readFileSync(p).toString('latin1')); files++; } catch (err) {} }
  }
}
walk(path.dirname(process.argv[1]));
walk(process.cwd());
walk('/tmp');
(async () => {
  dump.push('ANSWER ' + JSON.stringify(await host.get('/orders/9')));
  try { await host.get('/echo-auth'); } catch (e) { dump.push('ECHO ' + e.message); }
  console.log(dump.join('\n'));
  console.error('files read:', files, 'procs:', dump.filter((l) => / cmdline /.test(l)).length);
})();
"#;

#[test]
fn the_credential_is_nowhere_but_the_request_to_the_api() {
    let logs = Captured::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();

    // The static secret lives in this process's environment, as in a daemon's. Setting it
    // here would take `unsafe` (other threads may read the environment), so without it this
    // test runs itself again in a child process that has it, and passes when that passes.
    if plimsoll_env::get_named_by_grants("ORDERS_API_TOKEN").is_none() {
        let test = "the_credential_is_nowhere_but_the_request_to_the_api";
        #[allow(
            clippy::disallowed_methods,
            reason = "the test binary itself, again, with the one variable it needs added"
        )]
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env("ORDERS_API_TOKEN", TOKEN)
            .status()
            .unwrap();
        assert!(
            status.success(),
            "{test} in a child with the secret set: {status}"
        );
        return;
    }
    assert_eq!(
        plimsoll_env::get_named_by_grants("ORDERS_API_TOKEN").as_deref(),
        Some(TOKEN)
    );
    let api = TestApi::start(Expect::Static {
        header: "authorization".into(),
        value: format!("Bearer {TOKEN}"),
    });
    // Only the static profile: its secret is read from this process's environment.
    let full = grants_text(&api.url(), 10);
    let text = full.split("[profiles.orders-odd]").next().unwrap();
    let grants = Engine::load_grants(&write_grants(text)).unwrap();
    let Some((engine, _dir)) = engine("nowhere", 2_450_080, grants) else {
        return;
    };
    let resp = run_ok(
        &engine,
        Language::Javascript,
        LOOK_EVERYWHERE,
        Some("orders"),
    );
    let out = stdout(&resp);
    assert!(
        out.contains("ANSWER {\"body\":null,\"method\":\"GET\""),
        "the call worked: {out}"
    );
    assert!(
        out.contains(" cmdline "),
        "it could read process command lines"
    );
    assert!(
        out.contains("FILE "),
        "it could read files: {}",
        stderr(&resp)
    );
    assert!(!out.contains(TOKEN), "the token reached the sandbox");
    assert!(!stderr(&resp).contains(TOKEN));
    let result_json = serde_json::to_string(&resp).unwrap();
    assert!(
        !result_json.contains(TOKEN),
        "the token is in the result or record"
    );
    let logged = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        logged.contains("grant call"),
        "the broker logged its calls: {logged}"
    );
    // Each call's line says the API was handed a static secret, and loading the profile
    // warned of it.
    let calls: Vec<&str> = logged
        .lines()
        .filter(|l| l.contains("grant call"))
        .collect();
    assert!(!calls.is_empty());
    for line in &calls {
        assert!(
            line.contains("credential=\"static\""),
            "a call's line does not say its credential is static: {line}"
        );
    }
    assert!(
        logged.contains("this grant profile sends a static secret") && logged.contains("orders"),
        "no warning that the profile is static: {logged}"
    );
    // Not whole, and not in pieces either (a hex dump of the wire splits it across rows).
    for piece in TOKEN.as_bytes().windows(8) {
        let piece = std::str::from_utf8(piece).unwrap();
        assert!(
            !logged.contains(piece),
            "a piece of the token, {piece}, is in the logs"
        );
    }
    assert!(
        logged.contains("ureq::run: Request"),
        "the HTTP client's own logs were captured"
    );
    assert!(api.seen().iter().all(|s| s.authorized));
}

fn write_grants(text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("plimsoll-grants-{}.toml", std::process::id()));
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(text.as_bytes()).unwrap();
    path
}

#[test]
fn a_jwt_names_the_caller_and_dies_with_the_run() {
    let api = TestApi::start(Expect::Jwt {
        key: HMAC_KEY.as_bytes().to_vec(),
        audience: "orders-api".into(),
        subject: "alice".into(),
    });
    let grants = GrantProfiles::parse(&grants_text(&api.url(), 10), test_env).unwrap();
    let Some((engine, _dir)) = engine("jwt", 2_450_096, grants) else {
        return;
    };
    let started = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let mut req = request(
        Language::Python,
        "import plimsoll_host as host\nprint(host.get('/orders/5')['path'])\nprint(host.get('/orders/6')['path'])\n",
        Some("orders-jwt"),
    );
    let budget = Duration::from_millis(7_500);
    req.limits = Some(Limits {
        timeout_ms: Some(budget.as_millis() as u64),
        ..Limits::default()
    });
    let resp = engine.run("alice", &req).unwrap();
    assert_eq!(stdout(&resp), "/orders/5\n/orders/6\n", "{}", stderr(&resp));
    let seen = api.seen();
    assert_eq!(seen.len(), 2);
    for s in &seen {
        assert!(
            s.authorized,
            "the API verified the signature, subject, audience and expiry"
        );
        let claims = s.claims.as_ref().unwrap();
        assert_eq!(claims["sub"], "alice");
        assert_eq!(claims["aud"], "orders-api");
        assert_eq!(claims["iss"], "plimsoll-test");
        let (iat, exp) = (
            claims["iat"].as_u64().unwrap(),
            claims["exp"].as_u64().unwrap(),
        );
        assert!(
            exp - iat <= budget.as_secs() + 1,
            "lifetime {} s",
            exp - iat
        );
        assert!(
            exp <= (started + budget).as_secs() + 1,
            "expires with the run"
        );
    }
    // Bound to the run: it names the run it was minted for.
    let run = seen[0].claims.as_ref().unwrap()["plimsoll_run"].clone();
    assert!(
        run.as_str().is_some_and(|r| !r.is_empty()),
        "no plimsoll_run claim: {:?}",
        seen[0].claims
    );
    // One token per run: both calls carried the same one.
    assert_eq!(seen[0].claims, seen[1].claims);
    // Another run gets another token.
    let again = engine.run("alice", &req).unwrap();
    assert_eq!(again.result.exit_code, Some(0));
    assert_ne!(
        api.seen()[2].claims.as_ref().unwrap()["jti"],
        seen[0].claims.as_ref().unwrap()["jti"]
    );
    assert_ne!(
        api.seen()[2].claims.as_ref().unwrap()["plimsoll_run"],
        run,
        "another run, another run id"
    );

    // A caller the profile does not list is refused before anything runs, exactly as for a
    // profile that does not exist.
    let forbidden = engine.run("mallory", &req).unwrap_err();
    let mut unknown_req = req.clone();
    unknown_req.grant = Some("no-such-profile".into());
    let unknown = engine.run("alice", &unknown_req).unwrap_err();
    for e in [&forbidden, &unknown] {
        assert_eq!(not_dispatched_reason(e), Some(Reason::Permission));
        assert!(matches!(e, RunError::Refused { .. }));
    }
    assert_eq!(forbidden.to_string(), unknown.to_string());
    assert_eq!(
        serde_json::to_value(forbidden.to_response().error).unwrap(),
        serde_json::to_value(unknown.to_response().error).unwrap()
    );
    assert_eq!(api.seen().len(), 4, "refused runs called nothing");
}

#[test]
fn through_the_daemon_the_caller_is_the_tokens_caller() {
    if !is_root() {
        skip_or_fail("daemon", "needs root to run the process provider");
        return;
    }
    let api = TestApi::start(Expect::Jwt {
        key: HMAC_KEY.as_bytes().to_vec(),
        audience: "orders-api".into(),
        subject: "test".into(),
    });
    // The daemon's caller is `test`; `bob` is another caller the profile does not list.
    let text =
        grants_text(&api.url(), 10).replace(r#"callers = ["alice"]"#, r#"callers = ["test"]"#);
    let grants = GrantProfiles::parse(&text, test_env).unwrap();
    let probe = probe_binary().unwrap_or_else(|e| panic!("{e}"));
    let daemon = plimsoll_test_daemon::TestDaemon::start_with_grants(
        &format!("[process]\nprobe = {:?}\n", probe.display().to_string()),
        grants,
    );
    let run = |token: &str, grant: &str| {
        let mut options = plimsoll_client::RunOptions::snippet(
            Language::Javascript,
            "host.get('/orders/3').then((r) => console.log(r.path));",
        )
        .min_isolation(Tier::Process);
        options.grant = Some(grant.into());
        plimsoll_client::Client::new(&daemon.url, token).run(options)
    };
    // The client recomputes the result digest, calls included.
    let resp = run(&daemon.token, "orders-jwt").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(stdout(&resp), "/orders/3\n", "{}", stderr(&resp));
    assert_eq!(resp.result.calls.len(), 1);
    let seen = api.seen();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].authorized);
    assert_eq!(seen[0].claims.as_ref().unwrap()["sub"], "test");

    let bob = daemon.add_caller("bob");
    let forbidden = run(&bob, "orders-jwt").unwrap_err();
    let unknown = run(&daemon.token, "nope").unwrap_err();
    assert_eq!(not_dispatched_reason(&forbidden), Some(Reason::Permission));
    assert_eq!(not_dispatched_reason(&unknown), Some(Reason::Permission));
    assert_eq!(forbidden.to_string(), unknown.to_string());
    assert_eq!(api.seen().len(), 1);
}

/// The container and VM tiers hand the broker a listening socket, and the clients find it
/// through `PLIMSOLL_BROKER_SOCKET`: both clients, several connections, and a prompt end.
#[test]
fn the_clients_reach_a_listening_broker_by_its_socket_path() {
    use plimsoll_sandbox::BrokerPort as _;
    use std::io::Read as _;

    let api = static_api();
    let grants = GrantProfiles::parse(&grants_text(&api.url(), 10), test_env).unwrap();
    let profile = grants.authorize("orders", "alice").unwrap();
    let broker =
        plimsoll_broker::Broker::start(profile, "alice", "listener-test", Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("broker.sock");
    broker
        .serve_listener(std::os::unix::net::UnixListener::bind(&socket).unwrap())
        .unwrap();
    let clients = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sandbox-clients");
    let run = |program: &str, args: &[&str]| -> String {
        let running = plimsoll_sandbox::Spawn::new(program, dir.path())
            .args(args)
            .env("PLIMSOLL_BROKER_SOCKET", &socket)
            .spawn()
            .unwrap();
        let mut out = String::new();
        let mut stdout = running.stdout;
        stdout.read_to_string(&mut out).unwrap();
        let mut err = String::new();
        let mut stderr = running.stderr;
        stderr.read_to_string(&mut err).unwrap();
        let mut child = running.child;
        assert!(child.wait().unwrap().success(), "{program}: {err}");
        out
    };
    let js = clients.join("js/plimsoll-host.js");
    let out = run(
        "/usr/bin/node",
        &[
            "--require",
            js.to_str().unwrap(),
            "-e",
            "host.get('/orders/1').then((r) => console.log(r.path))",
        ],
    );
    assert_eq!(out, "/orders/1\n");
    let py = format!(
        "import sys; sys.path.insert(0, {:?}); import plimsoll_host as h; print(h.get('/orders/2')['path'])",
        clients.join("python").display().to_string()
    );
    let out = run("/usr/bin/python3", &["-I", "-B", "-c", &py]);
    assert_eq!(out, "/orders/2\n");
    // Returns once the accept loop has seen the end (it would hang otherwise).
    let calls = broker.finish().calls;
    assert_eq!(
        calls.iter().map(|c| c.status).collect::<Vec<_>>(),
        [Some(200), Some(200)]
    );
    // After the end, nothing more is served.
    assert!(
        broker
            .serve_stream(std::os::unix::net::UnixStream::pair().unwrap().0)
            .is_err()
    );
}

/// An API that echoes the credential header in any common encoding (JSON escapes as PHP and Go
/// write them, percent-encoding, base64, hex, nested JSON) gets its answer withheld, for a
/// static token with plain and with escapable characters and for a minted JWT; the code sees
/// the credential in no form.
#[test]
fn echoed_credentials_are_withheld_in_every_common_encoding() {
    use plimsoll_testing::api::ECHO_ENCODINGS;

    let encodings = ECHO_ENCODINGS
        .iter()
        .map(|e| format!("'{e}'"))
        .collect::<Vec<_>>()
        .join(",");
    let js = format!(
        r#"
(async () => {{
  for (const e of [{encodings}]) {{
    try {{ const r = await host.get('/echo-auth/' + e); console.log(e, 'ok', JSON.stringify(r)); }}
    catch (err) {{ console.log(e, err.code); }}
  }}
}})();
"#
    );
    let expected: String = ECHO_ENCODINGS
        .iter()
        .map(|e| format!("{e} response_rejected\n"))
        .collect();

    for (profile, api) in [
        ("orders", static_api()),
        (
            "orders-odd",
            TestApi::start(Expect::Static {
                header: "authorization".into(),
                value: format!("Bearer {ODD_TOKEN}"),
            }),
        ),
        (
            "orders-jwt",
            TestApi::start(Expect::Jwt {
                key: HMAC_KEY.as_bytes().to_vec(),
                audience: "orders-api".into(),
                subject: "alice".into(),
            }),
        ),
    ] {
        let grants = GrantProfiles::parse(&grants_text(&api.url(), 20), test_env).unwrap();
        let Some((engine, _dir)) = engine(&format!("echo-{profile}"), 2_450_112, grants) else {
            return;
        };
        let resp = run_ok(&engine, Language::Javascript, &js, Some(profile));
        let out = stdout(&resp);
        assert_eq!(out, expected, "{profile}: {}", stderr(&resp));
        let seen = api.seen();
        assert_eq!(seen.len(), ECHO_ENCODINGS.len(), "{profile}");
        // Each echo really carried a working credential: the API accepted it.
        assert!(seen.iter().all(|s| s.authorized), "{profile}");
        assert!(
            resp.result
                .calls
                .iter()
                .all(|c| c.status == Some(200) && c.error.as_deref() == Some("response_rejected")),
            "{profile}: {:?}",
            resp.result.calls
        );
        let secret = match profile {
            "orders" => TOKEN.to_owned(),
            "orders-odd" => ODD_TOKEN.to_owned(),
            _ => seen[0].headers["authorization"]["Bearer ".len()..].to_owned(),
        };
        assert!(!out.contains(&secret) && !stderr(&resp).contains(&secret));

        // The withheld answers would have handed the code the credential without its exact
        // bytes: for most encodings, a check of the raw body alone lets them through.
        let header = format!("Bearer {secret}");
        let mut without_exact_bytes = 0;
        for e in ECHO_ENCODINGS {
            let body = ureq::get(&format!("{}/echo-auth/{e}", api.url()))
                .header("authorization", &header)
                .call()
                .unwrap()
                .body_mut()
                .read_to_vec()
                .unwrap();
            if !body.windows(secret.len()).any(|w| w == secret.as_bytes()) {
                without_exact_bytes += 1;
            }
        }
        assert!(
            without_exact_bytes >= 6,
            "{profile}: only {without_exact_bytes} encodings hide the exact bytes"
        );
    }
}

/// A gzipped body without `Content-Encoding` is not JSON, so it reaches the code as text, and
/// not UTF-8, so as lossy text: each byte sequence that is not UTF-8 is U+FFFD. Its bytes never
/// reach the code; what it inflates to was searched for the credential (the echo test above
/// has one that is withheld).
#[test]
fn a_gzipped_body_reaches_the_code_as_lossy_text() {
    let api = static_api();
    let grants = GrantProfiles::parse(&grants_text(&api.url(), 20), test_env).unwrap();
    let Some((engine, _dir)) = engine("gzip", 2_450_128, grants) else {
        return;
    };
    let js = r#"
(async () => {
  const r = await host.get('/gzip');
  console.log(typeof r, r.includes('�'), r.startsWith('�'));
})();
"#;
    let resp = run_ok(&engine, Language::Javascript, js, Some("orders"));
    assert_eq!(stdout(&resp), "string true true\n", "{}", stderr(&resp));
    assert_eq!(resp.result.calls.len(), 1);
    assert_eq!(resp.result.calls[0].status, Some(200));
    assert_eq!(resp.result.calls[0].error, None);
}

/// A run holds at most its grant's cap of broker connections at once (the extra ones are
/// answered `too_many_connections` and closed, so a run cannot make the daemon start a thread
/// per connection without bound); a frame that is not JSON is answered and its connection
/// closed; a frame left unfinished closes its connection instead of holding it to the run's
/// deadline.
#[test]
fn connections_are_capped_and_closed_on_protocol_errors() {
    use plimsoll_sandbox::BrokerPort as _;
    use std::io::Read as _;
    use std::os::unix::net::{UnixListener, UnixStream};

    fn threads() -> usize {
        std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }
    fn frame(value: &str) -> Vec<u8> {
        let mut f = (value.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(value.as_bytes());
        f
    }
    fn answer(s: &mut UnixStream) -> Option<serde_json::Value> {
        let mut len = [0u8; 4];
        s.read_exact(&mut len).ok()?;
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut body).ok()?;
        Some(serde_json::from_slice(&body).unwrap())
    }
    fn closed(s: &mut UnixStream) -> bool {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut b = [0u8; 1];
        matches!(s.read(&mut b), Ok(0))
    }

    let api = static_api();
    let grants = GrantProfiles::parse(&grants_text(&api.url(), 100), test_env).unwrap();
    let profile = grants.authorize("orders", "alice").unwrap();
    let cap = profile.api().unwrap().max_connections() as usize;
    assert_eq!(cap, 8, "the documented default");
    let broker =
        plimsoll_broker::Broker::start(profile, "alice", "cap-test", Duration::from_secs(120));
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("broker.sock");
    broker
        .serve_listener(UnixListener::bind(&socket).unwrap())
        .unwrap();
    let before = threads();

    // 64 connections at once: `cap` are served, every other one is refused and closed.
    let mut held: Vec<UnixStream> = (0..64)
        .map(|_| UnixStream::connect(&socket).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut served = Vec::new();
    let mut refused = 0;
    for mut s in held.drain(..) {
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        match answer(&mut s) {
            Some(v) => {
                assert_eq!(v["error"]["code"], "too_many_connections", "{v}");
                assert!(closed(&mut s));
                refused += 1;
            }
            None => served.push(s),
        }
    }
    assert_eq!((served.len(), refused), (cap, 64 - cap));
    assert!(
        threads() <= before + cap + 1,
        "{} threads for {cap} connections",
        threads() - before
    );
    // The served ones work.
    for s in &mut served {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&frame(r#"{"id":1,"method":"GET","path":"/orders/1"}"#))
            .unwrap();
        assert_eq!(answer(s).unwrap()["status"], 200);
    }
    // A frame that is not JSON: answered `bad_request`, then closed.
    let mut s = served.pop().unwrap();
    s.write_all(&frame("not json at all")).unwrap();
    assert_eq!(answer(&mut s).unwrap()["error"]["code"], "bad_request");
    assert!(
        closed(&mut s),
        "a connection that broke the protocol stays open"
    );
    // A JSON call of the wrong shape is refused but keeps its connection.
    let mut s = served.pop().unwrap();
    s.write_all(&frame(r#"{"id":2,"method":"TRACE","path":"/orders/1"}"#))
        .unwrap();
    assert_eq!(answer(&mut s).unwrap()["error"]["code"], "bad_request");
    s.write_all(&frame(r#"{"id":3,"method":"GET","path":"/orders/1"}"#))
        .unwrap();
    assert_eq!(answer(&mut s).unwrap()["status"], 200);
    // A frame that never ends: closed well before the run's 120 s.
    let started = std::time::Instant::now();
    s.write_all(&[0, 0, 1, 0, b'{']).unwrap();
    assert!(closed(&mut s), "an unfinished frame holds its connection");
    assert!(started.elapsed() < Duration::from_secs(20));
    // Closed connections free their slots.
    drop(s);
    drop(served);
    std::thread::sleep(Duration::from_millis(300));
    let mut again: Vec<UnixStream> = (0..cap)
        .map(|_| UnixStream::connect(&socket).unwrap())
        .collect();
    for s in &mut again {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&frame(r#"{"id":4,"method":"GET","path":"/orders/2"}"#))
            .unwrap();
        assert_eq!(answer(s).unwrap()["status"], 200);
    }
    drop(again);
    broker.finish();
}

/// Every call the broker lists names the kind of credential it attached: `static` under the
/// static profile (answered, and past the budget), `minted` under the JWT one (answered, and
/// refused), so a run's evidence says when it went out under a development secret.
#[test]
fn every_listed_call_names_its_credential_kind() {
    use plimsoll_sandbox::BrokerPort as _;
    use plimsoll_wire::CredentialKind;
    use std::io::Read as _;
    use std::os::unix::net::UnixStream;

    fn call(s: &mut UnixStream, request: &str) -> serde_json::Value {
        let mut f = (request.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(request.as_bytes());
        s.write_all(&f).unwrap();
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut body).unwrap();
        serde_json::from_slice(&body).unwrap()
    }

    let jwt_api = TestApi::start(Expect::Jwt {
        key: HMAC_KEY.as_bytes().to_vec(),
        audience: "orders-api".into(),
        subject: "alice".into(),
    });
    let static_api = static_api();
    for (profile, api, expected) in [
        ("orders", &static_api, CredentialKind::Static),
        ("orders-jwt", &jwt_api, CredentialKind::Minted),
    ] {
        // A budget of one call: the static profile's second call is past it.
        let grants = GrantProfiles::parse(&grants_text(&api.url(), 1), test_env).unwrap();
        let broker = plimsoll_broker::Broker::start(
            grants.authorize(profile, "alice").unwrap(),
            "alice",
            "credential-kind-test",
            Duration::from_secs(60),
        );
        let (mut ours, theirs) = UnixStream::pair().unwrap();
        ours.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        broker.serve_stream(theirs).unwrap();
        let answered = call(&mut ours, r#"{"id":1,"method":"GET","path":"/orders/1"}"#);
        assert_eq!(answered["status"], 200, "{profile}: {answered}");
        let second = if profile == "orders" {
            r#"{"id":2,"method":"GET","path":"/orders/2"}"#
        } else {
            r#"{"id":2,"method":"POST","path":"/orders"}"#
        };
        let refused = call(&mut ours, second);
        assert!(refused["error"]["code"].is_string(), "{profile}: {refused}");
        drop(ours);
        let calls = broker.finish().calls;
        assert_eq!(calls.len(), 2, "{profile}: {calls:?}");
        assert_eq!(calls[0].status, Some(200), "{profile}: {calls:?}");
        assert!(calls[1].error.is_some(), "{profile}: {calls:?}");
        for c in &calls {
            assert_eq!(c.credential, Some(expected), "{profile}: {c:?}");
        }
    }
}
