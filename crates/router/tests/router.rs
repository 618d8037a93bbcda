//! plimsoll-router in front of real plimsolld nodes (each its own process, on loopback):
//! placement by floor and image, answers passed on and verified by the client, session calls
//! routed by the session id, a node killed before and after dispatch, a node restarted under
//! its sessions.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use plimsoll_client::{Client, RunOptions};
use plimsoll_testing::{self as testing, tool_binary, workspace_root};
use plimsoll_wire::{Language, Tier};

/// One HTTP answer.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: BTreeMap<String, String>,
    body: String,
}

impl Answer {
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", self.status, self.body))
    }

    fn node(&self) -> &str {
        self.headers.get("plimsoll-node").map_or("", String::as_str)
    }
}

fn call(url: &str, method: &str, path: &str, token: Option<&str>, body: Option<&str>) -> Answer {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(120)))
        .build()
        .into();
    let uri = format!("{url}{path}");
    let auth = token.map(|t| format!("Bearer {t}"));
    let resp = match (method, body) {
        ("GET", _) => {
            let mut r = agent.get(&uri);
            if let Some(a) = &auth {
                r = r.header("authorization", a);
            }
            r.call()
        }
        ("DELETE", _) => {
            let mut r = agent.delete(&uri);
            if let Some(a) = &auth {
                r = r.header("authorization", a);
            }
            r.call()
        }
        (_, b) => {
            let mut r = agent.post(&uri).header("content-type", "application/json");
            if let Some(a) = &auth {
                r = r.header("authorization", a);
            }
            r.send(b.unwrap_or("").as_bytes())
        }
    };
    let mut resp = resp.unwrap_or_else(|e| panic!("{method} {uri}: {e}"));
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_ascii_lowercase(),
                v.to_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    Answer {
        status: resp.status().as_u16(),
        headers,
        body: resp.body_mut().read_to_string().unwrap_or_default(),
    }
}

/// A child process's stderr, gathered; and the address it said it listens on.
fn gather(child: &mut Child, what: &str) -> (String, std::sync::Arc<std::sync::Mutex<String>>) {
    let logs = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().expect("piped stderr");
    let sink = std::sync::Arc::clone(&logs);
    std::thread::spawn(move || {
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
                "{what} never said it was listening: {}",
                logs.lock().unwrap()
            )
        });
    (addr, logs)
}

#[expect(
    clippy::disallowed_methods,
    reason = "the test starts the project's own binaries, each with the environment it sets"
)]
fn command(binary: &Path) -> std::process::Command {
    let mut c = std::process::Command::new(binary);
    c.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("PLIMSOLL_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

/// One plimsolld node, its own process.
struct Node {
    child: Child,
    addr: String,
    config: PathBuf,
    _uid_port: std::net::TcpListener,
    _dir: tempfile::TempDir,
}

impl Node {
    /// A node on `top` settings (floor, providers, sections), reading `callers`.
    fn start(top: &str, callers: &Path) -> Node {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).unwrap();
        // A port held for the node's life picks a sandbox uid range no other test uses.
        let uid_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let uid_base =
            plimsoll_daemon::testing::uid_base_for_port(uid_port.local_addr().unwrap().port());
        let config = dir.path().join("plimsoll.toml");
        std::fs::write(
            &config,
            format!(
                "state_dir = \"{}\"\nsandbox_uid_base = {uid_base}\n{top}\n\
                 [daemon]\ncallers_file = \"{}\"\n",
                state.display(),
                callers.display()
            ),
        )
        .unwrap();
        let (child, addr) = Node::launch(&config, "127.0.0.1:0");
        Node {
            child,
            addr,
            config,
            _uid_port: uid_port,
            _dir: dir,
        }
    }

    fn launch(config: &Path, listen: &str) -> (Child, String) {
        let plimsolld = tool_binary("plimsolld", "plimsoll-daemon").expect("plimsolld");
        let mut child = command(&plimsolld)
            .arg("--config")
            .arg(config)
            .args(["--listen", listen])
            .spawn()
            .expect("start plimsolld");
        let (addr, logs) = gather(&mut child, "plimsolld");
        // Its providers' start-up probes settle: ready, or every one withdrawn.
        let deadline = Instant::now() + Duration::from_secs(120);
        while call(&format!("http://{addr}"), "GET", "/readyz", None, None).status != 200
            && !logs
                .lock()
                .unwrap()
                .contains("no provider passed its probe")
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        (child, addr)
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// A new daemon on the same settings, state and port, in place of this (killed) one.
    fn restart(&mut self) {
        self.kill();
        let (child, addr) = Node::launch(&self.config, &self.addr.clone());
        assert_eq!(addr, self.addr);
        self.child = child;
    }

    fn metric(&self, name: &str) -> f64 {
        let a = call(&self.url(), "GET", "/metrics", None, None);
        a.body
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The router, its own process, in front of `nodes`.
struct Router {
    child: Child,
    url: String,
    logs: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Router {
    fn start(nodes: &[&Node], cluster: &Cluster) -> Router {
        let list: Vec<&str> = nodes.iter().map(|n| n.addr.as_str()).collect();
        let mut child = command(Path::new(env!("CARGO_BIN_EXE_plimsoll-router")))
            .args(["--listen", "127.0.0.1:0", "--refresh-ms", "200", "--nodes"])
            .arg(list.join(","))
            .arg("--callers")
            .arg(&cluster.callers)
            .arg("--token-file")
            .arg(&cluster.router_token)
            .spawn()
            .expect("start plimsoll-router");
        let (addr, logs) = gather(&mut child, "plimsoll-router");
        let r = Router {
            child,
            url: format!("http://{addr}"),
            logs,
        };
        r.wait_usable(&cluster.token, nodes.len());
        r
    }

    /// Waits until the router sees `n` nodes usable.
    fn wait_usable(&self, token: &str, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let a = call(&self.url, "GET", "/v1/nodes", Some(token), None);
            let usable = a.json()["nodes"]
                .as_array()
                .map_or(0, |l| l.iter().filter(|x| x["usable"] == true).count());
            if usable == n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the router never saw {n} nodes usable: {}\n{}",
                a.body,
                self.logs.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The callers file every node and the router read: a caller `test` and the router's own.
struct Cluster {
    callers: PathBuf,
    router_token: PathBuf,
    token: String,
    _dir: tempfile::TempDir,
}

impl Cluster {
    fn new() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let callers = dir.path().join("callers.toml");
        let token = plimsoll_callers::add_caller(&callers, "test")
            .unwrap()
            .expose()
            .clone();
        let router = plimsoll_callers::add_caller(&callers, "router").unwrap();
        let router_token = dir.path().join("router.token");
        std::fs::write(&router_token, router.expose()).unwrap();
        Cluster {
            callers,
            router_token,
            token,
            _dir: dir,
        }
    }

    fn nodes(&self, n: usize, top: &str) -> Vec<Node> {
        // What the nodes' providers start: built when missing.
        testing::probe_and_agent().expect("plimsoll-probe and plimsoll-agent");
        (0..n).map(|_| Node::start(top, &self.callers)).collect()
    }
}

const PROCESS: &str = "default_floor = \"process\"\nproviders = [\"process\"]";

fn run_body(request_id: &str, code: &str, extra: &str) -> String {
    format!(
        r#"{{"protocol":1,"request_id":"{request_id}","run":{{"kind":"snippet","language":"python","code":{}}}{extra}}}"#,
        serde_json::to_string(code).unwrap()
    )
}

/// Whether the process provider is there on every node (skipped, or failed under CI=true).
fn process_available(test: &str, node: &Node, token: &str) -> bool {
    let p = call(&node.url(), "GET", "/v1/providers", Some(token), None).json();
    let ok = p["providers"].as_array().is_some_and(|l| {
        l.iter()
            .any(|x| x["name"] == "process" && x["available"] == true)
    });
    if !ok {
        testing::skip_or_fail(test, &format!("the process provider is unavailable: {p}"));
    }
    ok
}

#[test]
fn runs_through_the_router_are_placed_verified_and_spread_over_the_nodes() {
    let test = "runs_through_the_router_are_placed_verified_and_spread_over_the_nodes";
    let cluster = Cluster::new();
    let nodes = cluster.nodes(3, PROCESS);
    if !process_available(test, &nodes[0], &cluster.token) {
        return;
    }
    let router = Router::start(&nodes.iter().collect::<Vec<_>>(), &cluster);
    // The Rust client checks the tier against the floor and recomputes every digest: the
    // router passed each answer on untouched.
    let client = Client::new(router.url.clone(), cluster.token.clone());
    for i in 0..12 {
        let r = client
            .run(RunOptions::snippet(
                Language::Python,
                format!("print({i} * 7)"),
            ))
            .unwrap_or_else(|e| panic!("run {i}: {e}"));
        assert_eq!(r.result.stdout.to_string_lossy(), format!("{}\n", i * 7));
        assert_eq!(r.isolation, Tier::Process);
    }
    let a = call(
        &router.url,
        "POST",
        "/v1/runs",
        Some(&cluster.token),
        Some(&run_body("named-1", "print(1)", "")),
    );
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(
        nodes.iter().any(|n| n.addr == a.node()),
        "the answer names its node: {:?}",
        a.headers
    );
    // Spread: placements by load go to more than one node.
    let ran: Vec<f64> = nodes
        .iter()
        .map(|n| n.metric("plimsoll_runs_total"))
        .collect();
    assert_eq!(ran.iter().sum::<f64>(), 13.0, "{ran:?}");
    assert!(
        ran.iter().filter(|r| **r > 0.0).count() >= 2,
        "13 runs all went to one node: {ran:?}"
    );
}

#[test]
fn what_no_node_can_take_is_refused_before_it_reaches_any_node() {
    let test = "what_no_node_can_take_is_refused_before_it_reaches_any_node";
    let cluster = Cluster::new();
    let nodes = cluster.nodes(2, PROCESS);
    if !process_available(test, &nodes[0], &cluster.token) {
        return;
    }
    let router = Router::start(&nodes.iter().collect::<Vec<_>>(), &cluster);
    let requests_before: Vec<f64> = nodes
        .iter()
        .map(|n| n.metric("plimsoll_http_requests_total{route=\"/v1/runs\""))
        .collect();
    for (id, extra, status, reason) in [
        (
            "floor-1",
            r#","minimum_isolation":"container""#,
            422,
            "isolation",
        ),
        ("provider-1", r#","provider":"runsc""#, 422, "isolation"),
        ("image-1", r#","image":"no-such-image""#, 503, "environment"),
    ] {
        let a = call(
            &router.url,
            "POST",
            "/v1/runs",
            Some(&cluster.token),
            Some(&run_body(id, "print(1)", extra)),
        );
        assert_eq!(a.status, status, "{}", a.body);
        let v = a.json();
        assert_eq!(v["request_id"], id, "{v}");
        assert_eq!(v["error"]["code"], reason, "{v}");
        assert_eq!(v["error"]["not_dispatched"], reason, "{v}");
        assert!(a.node().is_empty(), "no node answered: {:?}", a.headers);
        // The message names what each node offers.
        for n in &nodes {
            assert!(
                v["error"]["message"].as_str().unwrap().contains(&n.addr),
                "{v}"
            );
        }
    }
    let requests_after: Vec<f64> = nodes
        .iter()
        .map(|n| n.metric("plimsoll_http_requests_total{route=\"/v1/runs\""))
        .collect();
    assert_eq!(requests_before, requests_after, "no node saw a request");
    // Unauthenticated: refused by the router as a node refuses it.
    let a = call(
        &router.url,
        "POST",
        "/v1/runs",
        None,
        Some(&run_body("anon-1", "print(1)", "")),
    );
    let n = call(
        &nodes[0].url(),
        "POST",
        "/v1/runs",
        None,
        Some(&run_body("anon-1", "print(1)", "")),
    );
    assert_eq!((a.status, n.status), (401, 401));
    assert_eq!(a.json()["error"]["code"], n.json()["error"]["code"]);
    assert_eq!(
        a.json()["error"]["not_dispatched"],
        n.json()["error"]["not_dispatched"]
    );
    assert_eq!(a.headers["www-authenticate"], "Bearer");
    let a = call(&router.url, "GET", "/v1/nodes", Some("not-a-token"), None);
    assert_eq!(a.status, 401, "{}", a.body);
}

#[test]
fn a_run_whose_node_dies_after_dispatch_is_never_said_not_dispatched() {
    let test = "a_run_whose_node_dies_after_dispatch_is_never_said_not_dispatched";
    let cluster = Cluster::new();
    let mut nodes = cluster.nodes(2, PROCESS);
    if !process_available(test, &nodes[0], &cluster.token) {
        return;
    }
    let router = Router::start(&nodes.iter().collect::<Vec<_>>(), &cluster);
    let url = router.url.clone();
    let token = cluster.token.clone();
    let running = std::thread::spawn(move || {
        call(
            &url,
            "POST",
            "/v1/runs",
            Some(&token),
            Some(&run_body(
                "dies-1",
                "import time\nprint('started', flush=True)\ntime.sleep(4)",
                r#","limits":{"timeout_ms":6000}"#,
            )),
        )
    });
    // The node that took it: the one with a run in flight.
    let deadline = Instant::now() + Duration::from_secs(30);
    let holder = loop {
        if let Some(i) =
            (0..nodes.len()).find(|i| nodes[*i].metric("plimsoll_runs_in_flight") > 0.0)
        {
            break i;
        }
        assert!(Instant::now() < deadline, "no node ever held the run");
        std::thread::sleep(Duration::from_millis(20));
    };
    let killed = nodes[holder].addr.clone();
    nodes[holder].kill();
    let a = running.join().unwrap();
    assert_eq!(a.status, 502, "{}", a.body);
    let v = a.json();
    assert_eq!(v["error"]["code"], "node_lost", "{v}");
    assert_eq!(
        v["error"]["not_dispatched"],
        serde_json::Value::Null,
        "a run whose node died after dispatch may have run: {v}"
    );
    assert_eq!(v["request_id"], "dies-1");
    assert_eq!(a.node(), killed);
    // Before the router has learned that the node is gone, runs still find the other one:
    // a connection that cannot be made sent nothing, so the next node takes the request.
    let client = Client::new(router.url.clone(), cluster.token.clone());
    for i in 0..4 {
        let r = client
            .run(RunOptions::snippet(Language::Python, format!("print({i})")))
            .unwrap_or_else(|e| panic!("run {i} after the node died: {e}"));
        assert_eq!(r.result.exit_code, Some(0));
    }
    let survivor = &nodes[1 - holder];
    assert_eq!(survivor.metric("plimsoll_runs_total"), 4.0);
    // The router counts what happened.
    let m = call(&router.url, "GET", "/metrics", None, None).body;
    assert!(m.contains("plimsoll_router_node_lost_total 1"), "{m}");
}

#[test]
fn a_session_s_calls_go_to_its_node_and_end_with_it() {
    let test = "a_session_s_calls_go_to_its_node_and_end_with_it";
    let cluster = Cluster::new();
    let image = workspace_root().join("build/images/sandbox");
    let top = format!(
        "default_floor = \"container\"\nproviders = [\"runc\"]\n[oci]\nimage = \"{}\"\n",
        image.display()
    );
    let mut nodes = cluster.nodes(2, &top);
    let p = call(
        &nodes[0].url(),
        "GET",
        "/v1/providers",
        Some(&cluster.token),
        None,
    )
    .json();
    if !p["providers"].as_array().is_some_and(|l| {
        l.iter()
            .any(|x| x["name"] == "runc" && x["available"] == true)
    }) {
        testing::skip_or_fail(test, &format!("the runc provider is unavailable: {p}"));
        return;
    }
    let router = Router::start(&nodes.iter().collect::<Vec<_>>(), &cluster);
    let open = call(
        &router.url,
        "POST",
        "/v1/sessions",
        Some(&cluster.token),
        Some(r#"{"protocol":1,"request_id":"open-1","language":"python"}"#),
    );
    assert_eq!(open.status, 200, "{}", open.body);
    let holder = open.node().to_owned();
    let id = open.json()["session_id"].as_str().unwrap().to_owned();
    let cells = format!("/v1/sessions/{id}/cells");
    let cell = |rid: &str, code: &str| {
        call(
            &router.url,
            "POST",
            &cells,
            Some(&cluster.token),
            Some(
                &serde_json::json!({
                    "protocol": 1,
                    "request_id": rid,
                    "run": {"kind": "snippet", "language": "python", "code": code},
                })
                .to_string(),
            ),
        )
    };
    let a = cell("c-1", "x = 41");
    assert_eq!((a.status, a.node()), (200, holder.as_str()), "{}", a.body);
    let a = cell("c-2", "print(x + 1)");
    assert_eq!((a.status, a.node()), (200, holder.as_str()), "{}", a.body);
    assert_eq!(a.json()["result"]["stdout"], "42\n", "{}", a.body);
    let list = call(
        &router.url,
        "GET",
        "/v1/sessions",
        Some(&cluster.token),
        None,
    );
    assert_eq!(list.status, 200, "{}", list.body);
    let ids: Vec<String> = list.json()["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, std::slice::from_ref(&id));
    // An id no node gave.
    let other = format!("ses_{}_{}", "0".repeat(16), "0".repeat(32));
    let a = call(
        &router.url,
        "GET",
        &format!("/v1/sessions/{other}"),
        Some(&cluster.token),
        None,
    );
    assert_eq!(a.status, 404, "{}", a.body);
    assert_eq!(a.json()["error"]["code"], "session_not_found");
    // Its node killed: nothing can be sent there, and the router says so (nothing ran).
    let i = nodes.iter().position(|n| n.addr == holder).unwrap();
    nodes[i].kill();
    let a = cell("c-3", "print(x)");
    assert_eq!(a.status, 503, "{}", a.body);
    let v = a.json();
    assert_eq!(v["error"]["code"], "node_unreachable", "{v}");
    assert_eq!(v["error"]["not_dispatched"], "environment", "{v}");
    assert_eq!(v["request_id"], "c-3");
    // Its node back with a new daemon: the session is gone with the old one.
    nodes[i].restart();
    router.wait_usable(&cluster.token, 2);
    let a = cell("c-4", "print(x)");
    assert_eq!(a.status, 404, "{}", a.body);
    let v = a.json();
    assert_eq!(v["error"]["code"], "session_not_found", "{v}");
    assert_eq!(v["error"]["end_reason"], "daemon_restarted", "{v}");
    assert_eq!(v["request_id"], "c-4");
}
