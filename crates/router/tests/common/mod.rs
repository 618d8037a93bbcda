//! What the router's tests share: real plimsolld nodes and a real plimsoll-router, each its
//! own process, on loopback or each in its own network namespace joined by veth links to a
//! bridge ([`Fabric`]), and HTTP to them from the test.

#![allow(
    dead_code,
    reason = "each test binary uses its own part of the helpers"
)]

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use plimsoll_testing::{self as testing, tool_binary};

/// One HTTP answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", self.status, self.body))
    }

    /// The node that answered, from the router's `Plimsoll-Node` header ("" when none).
    pub fn node(&self) -> &str {
        self.headers.get("plimsoll-node").map_or("", String::as_str)
    }
}

/// One HTTP exchange from this thread's network namespace.
pub fn call(
    url: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> Answer {
    call_with(url, method, path, token, body, &[])
}

/// One JSON-RPC message to `/mcp`, as an MCP client over streamable HTTP sends it.
pub fn mcp(url: &str, token: &str, message: &serde_json::Value) -> Answer {
    call_with(
        url,
        "POST",
        "/mcp",
        Some(token),
        Some(&message.to_string()),
        &[
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", "2025-06-18"),
        ],
    )
}

/// [`call`] with more headers.
pub fn call_with(
    url: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
    more: &[(&str, &str)],
) -> Answer {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(120)))
        .build()
        .into();
    let uri = format!("{url}{path}");
    let auth = token.map(|t| format!("Bearer {t}"));
    let resp = match method {
        "GET" | "DELETE" => {
            let mut r = if method == "GET" {
                agent.get(&uri)
            } else {
                agent.delete(&uri)
            };
            if let Some(a) = &auth {
                r = r.header("authorization", a);
            }
            r.call()
        }
        _ => {
            let mut r = agent.post(&uri).header("content-type", "application/json");
            if let Some(a) = &auth {
                r = r.header("authorization", a);
            }
            for (k, v) in more {
                r = r.header(*k, *v);
            }
            r.send(body.unwrap_or("").as_bytes())
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

/// A bridge in a network namespace of its own, and members, each a network namespace with a
/// veth link to the bridge and the address `10.77.0.<i>` (i from 1). The test reaches them
/// from a thread that joined the bridge's namespace (`10.77.0.254`). Cutting a member's link
/// drops every packet to and from it, as a partition does.
#[derive(Debug)]
pub struct Fabric {
    /// The bridge's namespace.
    pub bridge: String,
    members: Vec<String>,
    tag: String,
}

fn ip(args: &[&str]) {
    let out = command(Path::new("/usr/bin/ip"))
        .args(args)
        .stderr(Stdio::piped())
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run ip {args:?}: {e} (install iproute2: scripts/install-deps)")
        });
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Fabric {
    /// A bridge and `members` members.
    pub fn new(members: usize) -> Arc<Fabric> {
        // Unique on the host while this test process lives.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = format!("{}{n}", std::process::id());
        let bridge = format!("plbr{tag}");
        let mut f = Fabric {
            bridge: bridge.clone(),
            members: Vec::new(),
            tag,
        };
        ip(&["netns", "add", &bridge]);
        ip(&["-n", &bridge, "link", "set", "lo", "up"]);
        ip(&["-n", &bridge, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &bridge, "addr", "add", "10.77.0.254/24", "dev", "br0"]);
        ip(&["-n", &bridge, "link", "set", "br0", "up"]);
        for i in 1..=members {
            let ns = format!("plm{}-{i}", f.tag);
            ip(&["netns", "add", &ns]);
            f.members.push(ns.clone());
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            let inner = "eth0";
            let outer = f.outer(i);
            ip(&[
                "link", "add", inner, "netns", &ns, "type", "veth", "peer", "name", &outer,
                "netns", &bridge,
            ]);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("10.77.0.{i}/24"),
                "dev",
                inner,
            ]);
            ip(&["-n", &ns, "link", "set", inner, "up"]);
            ip(&["-n", &bridge, "link", "set", &outer, "master", "br0"]);
            ip(&["-n", &bridge, "link", "set", &outer, "up"]);
        }
        Arc::new(f)
    }

    /// The bridge side of member `i`'s link.
    fn outer(&self, i: usize) -> String {
        format!("m{i}")
    }

    /// Member `i`'s namespace.
    pub fn member(&self, i: usize) -> &str {
        &self.members[i - 1]
    }

    /// Member `i`'s address.
    pub fn addr(i: usize) -> String {
        format!("10.77.0.{i}")
    }

    /// Drops member `i`'s link: nothing reaches it or leaves it.
    pub fn cut(&self, i: usize) {
        ip(&["-n", &self.bridge, "link", "set", &self.outer(i), "down"]);
    }

    /// Brings member `i`'s link back.
    pub fn mend(&self, i: usize) {
        ip(&["-n", &self.bridge, "link", "set", &self.outer(i), "up"]);
    }

    /// Moves the calling thread into the bridge's network namespace.
    pub fn enter(&self) {
        let f = std::fs::File::open(format!("/run/netns/{}", self.bridge))
            .expect("the bridge's namespace");
        rustix::thread::move_into_link_name_space(
            std::os::fd::AsFd::as_fd(&f),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .expect("join the bridge's network namespace");
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        for ns in self.members.iter().chain([&self.bridge]) {
            let _ = command(Path::new("/usr/bin/ip"))
                .args(["netns", "del", ns])
                .status();
        }
    }
}

/// Where the cluster's processes live: on loopback, or each in a member of a [`Fabric`].
#[derive(Debug, Clone)]
pub enum Net {
    Loopback,
    Fabric(Arc<Fabric>),
}

impl Net {
    /// [`call`], from the namespace that reaches the cluster.
    pub fn call(
        &self,
        url: &str,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> Answer {
        match self {
            Net::Loopback => call(url, method, path, token, body),
            Net::Fabric(f) => std::thread::scope(|s| {
                s.spawn(|| {
                    f.enter();
                    call(url, method, path, token, body)
                })
                .join()
                .expect("the call's thread")
            }),
        }
    }

    /// Runs `f` on a thread of its own in the namespace that reaches the cluster.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let net = self.clone();
        std::thread::spawn(move || {
            if let Net::Fabric(fabric) = &net {
                fabric.enter();
            }
            f()
        })
    }
}

/// A child process's stderr, gathered; and the address it said it listens on.
fn gather(child: &mut Child, what: &str) -> (String, Arc<Mutex<String>>) {
    let logs = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().expect("piped stderr");
    let sink = Arc::clone(&logs);
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
    reason = "the test starts the project's own binaries and ip, each with the environment it sets"
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

/// `binary`, in network namespace `ns` when one is given. Only the network namespace: `ip
/// netns exec` would also give it a mount namespace with a fresh /sys, without the host's
/// cgroup mounts the providers need.
fn in_ns(ns: Option<&str>, binary: &Path) -> std::process::Command {
    match ns {
        Some(ns) => {
            let mut c = command(Path::new("/usr/bin/nsenter"));
            c.arg(format!("--net=/run/netns/{ns}"))
                .arg("--")
                .arg(binary);
            c
        }
        None => command(binary),
    }
}

/// One plimsolld node, its own process.
pub struct Node {
    child: Child,
    pub addr: String,
    config: PathBuf,
    net: Net,
    ns: Option<String>,
    pub logs: Arc<Mutex<String>>,
    /// Its own OCI state root and cgroup parent (what [`runc_settings`] leaves open): what a
    /// killed node leaves behind is reaped by its restart alone, never by another test's
    /// daemon, whose probe would take it for its own.
    oci_state: PathBuf,
    cgroup: String,
    _uid_port: std::net::TcpListener,
    _dir: tempfile::TempDir,
}

/// Where [`runc_settings`] puts a node's own OCI state root and cgroup parent.
const OCI_STATE: &str = "{OCI_STATE}";
const CGROUP: &str = "{CGROUP}";

impl Node {
    /// A node on `top` settings (floor, providers, sections), reading `callers`, listening on
    /// `listen`, in namespace `ns` when one is given.
    pub fn start(top: &str, callers: &Path, net: &Net, ns: Option<&str>, listen: &str) -> Node {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).unwrap();
        // A port held for the node's life picks a sandbox uid range no other test uses.
        let uid_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let uid_base =
            plimsoll_daemon::testing::uid_base_for_port(uid_port.local_addr().unwrap().port());
        let oci_state = dir.path().join("oci");
        let name = dir.path().file_name().unwrap().to_string_lossy();
        let cgroup = format!("/plimsoll-test-router-{}", name.trim_start_matches('.'));
        let config = dir.path().join("plimsoll.toml");
        let top = top
            .replace(OCI_STATE, &oci_state.display().to_string())
            .replace(CGROUP, &cgroup);
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
        let (child, addr, logs) = Node::launch(&config, net, ns, listen);
        Node {
            child,
            addr,
            config,
            net: net.clone(),
            ns: ns.map(str::to_owned),
            logs,
            oci_state,
            cgroup,
            _uid_port: uid_port,
            _dir: dir,
        }
    }

    fn launch(
        config: &Path,
        net: &Net,
        ns: Option<&str>,
        listen: &str,
    ) -> (Child, String, Arc<Mutex<String>>) {
        let plimsolld = tool_binary("plimsolld", "plimsoll-daemon").expect("plimsolld");
        let mut child = in_ns(ns, &plimsolld)
            .arg("--config")
            .arg(config)
            .args(["--listen", listen])
            .spawn()
            .expect("start plimsolld");
        let (addr, logs) = gather(&mut child, "plimsolld");
        // Its providers' start-up probes settle: ready, or every one withdrawn.
        let deadline = Instant::now() + Duration::from_secs(120);
        while net
            .call(&format!("http://{addr}"), "GET", "/readyz", None, None)
            .status
            != 200
            && !logs
                .lock()
                .unwrap()
                .contains("no provider passed its probe")
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        (child, addr, logs)
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> Answer {
        self.net.call(&self.url(), method, path, token, body)
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then waits for the daemon to exit (its runs in flight answered first).
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        self.child.wait().expect("wait for plimsolld")
    }

    /// A new daemon on the same state and address, in place of this one (ended first if it
    /// still runs), on settings `top` when given.
    pub fn restart(&mut self, top: Option<&str>) {
        self.kill();
        if let Some(top) = top {
            let text = std::fs::read_to_string(&self.config).unwrap();
            let (head, daemon) = text.split_once("[daemon]").unwrap();
            let keep: String = head
                .lines()
                .filter(|l| l.starts_with("state_dir") || l.starts_with("sandbox_uid_base"))
                .map(|l| format!("{l}\n"))
                .collect();
            let top = top
                .replace(OCI_STATE, &self.oci_state.display().to_string())
                .replace(CGROUP, &self.cgroup);
            std::fs::write(&self.config, format!("{keep}{top}\n[daemon]{daemon}")).unwrap();
        }
        let (child, addr, logs) = Node::launch(
            &self.config,
            &self.net,
            self.ns.as_deref(),
            &self.addr.clone(),
        );
        assert_eq!(addr, self.addr);
        self.child = child;
        self.logs = logs;
    }

    /// Its daemon's instance, from its `/readyz`.
    pub fn instance(&self) -> String {
        self.call("GET", "/readyz", None, None).headers["plimsoll-instance"].clone()
    }

    /// The sum of the samples of metric `name` (its labelled series included).
    pub fn metric(&self, name: &str) -> f64 {
        let a = self.call("GET", "/metrics", None, None);
        a.body
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Node {
    /// SIGTERM, so that the daemon removes its sandboxes (SIGKILL after 30 s), then its
    /// cgroup parent.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let pid = rustix::process::Pid::from_child(&self.child);
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            let deadline = Instant::now() + Duration::from_secs(30);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            self.kill();
        }
        if let Ok(layout) = plimsoll_sandbox::cgroup::CgroupLayout::detect() {
            let _ = layout.remove(self.cgroup.trim_start_matches('/'));
        }
    }
}

/// The router, its own process, in front of `nodes`.
pub struct Router {
    child: Child,
    pub url: String,
    net: Net,
    pub logs: Arc<Mutex<String>>,
}

impl Router {
    /// On loopback, or in namespace `ns` listening on `listen`; learning the nodes every
    /// 200 ms, so that tests need not wait.
    pub fn start(nodes: &[&Node], cluster: &Cluster, ns: Option<&str>, listen: &str) -> Router {
        Router::start_refreshing(nodes, cluster, ns, listen, 200)
    }

    /// [`Router::start`], learning the nodes every `refresh_ms`.
    pub fn start_refreshing(
        nodes: &[&Node],
        cluster: &Cluster,
        ns: Option<&str>,
        listen: &str,
        refresh_ms: u64,
    ) -> Router {
        let list: Vec<&str> = nodes.iter().map(|n| n.addr.as_str()).collect();
        let net = nodes.first().map_or(Net::Loopback, |n| n.net.clone());
        let mut child = in_ns(ns, Path::new(env!("CARGO_BIN_EXE_plimsoll-router")))
            .args([
                "--listen",
                listen,
                "--refresh-ms",
                &refresh_ms.to_string(),
                "--nodes",
            ])
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
            net,
            logs,
        };
        r.wait_usable(&cluster.token, nodes.len());
        r
    }

    pub fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> Answer {
        self.net.call(&self.url, method, path, token, body)
    }

    /// Waits until the router sees `n` nodes usable.
    pub fn wait_usable(&self, token: &str, n: usize) {
        self.wait_for_nodes(token, &format!("{n} nodes usable"), |l| {
            l.iter().filter(|x| x["usable"] == true).count() == n
        });
    }

    /// Waits until the router has learned `node`'s daemon as it is now (its instance), usable.
    pub fn wait_learned(&self, token: &str, node: &Node) {
        let instance = node.instance();
        let what = format!("{} as instance {instance}", node.addr);
        self.wait_for_nodes(token, &what, |l| {
            l.iter().any(|x| {
                x["node"] == node.addr.as_str()
                    && x["instance"] == instance.as_str()
                    && x["usable"] == true
            })
        });
    }

    /// Waits up to 60 s until the router's `GET /v1/nodes` list satisfies `done`.
    fn wait_for_nodes(&self, token: &str, what: &str, done: impl Fn(&[serde_json::Value]) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let a = self.call("GET", "/v1/nodes", Some(token), None);
            if a.json()["nodes"].as_array().is_some_and(|l| done(l)) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the router never saw {what}: {}\n{}",
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
pub struct Cluster {
    pub callers: PathBuf,
    pub router_token: PathBuf,
    pub token: String,
    _dir: tempfile::TempDir,
}

impl Cluster {
    pub fn new() -> Cluster {
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
        // What the nodes' providers start: built when missing.
        testing::probe_and_agent().expect("plimsoll-probe and plimsoll-agent");
        Cluster {
            callers,
            router_token,
            token,
            _dir: dir,
        }
    }

    /// `n` nodes on loopback.
    pub fn nodes(&self, n: usize, top: &str) -> Vec<Node> {
        (0..n)
            .map(|_| Node::start(top, &self.callers, &Net::Loopback, None, "127.0.0.1:0"))
            .collect()
    }

    /// `n` nodes, node i in fabric member i + 2 (member 1 is the router's), on port 7878.
    pub fn nodes_in(&self, fabric: &Arc<Fabric>, n: usize, top: &str) -> Vec<Node> {
        let net = Net::Fabric(Arc::clone(fabric));
        (0..n)
            .map(|i| {
                Node::start(
                    top,
                    &self.callers,
                    &net,
                    Some(fabric.member(i + 2)),
                    &format!("{}:7878", Fabric::addr(i + 2)),
                )
            })
            .collect()
    }
}

pub const PROCESS: &str = "default_floor = \"process\"\nproviders = [\"process\"]";

/// The settings of a node offering runc with the test image (and `more` providers), its OCI
/// state root and cgroup parent its own.
pub fn runc_settings(more: &str) -> String {
    let image = testing::workspace_root().join("build/images/sandbox");
    format!(
        "default_floor = \"process\"\nproviders = [\"runc\"{more}]\n[oci]\nimage = \"{}\"\n\
         state_root = \"{OCI_STATE}\"\ncgroup_parent = \"{CGROUP}\"\n",
        image.display()
    )
}

pub fn run_body(request_id: &str, code: &str, extra: &str) -> String {
    format!(
        r#"{{"protocol":1,"request_id":"{request_id}","run":{{"kind":"snippet","language":"python","code":{}}}{extra}}}"#,
        serde_json::to_string(code).unwrap()
    )
}

pub fn cell_body(request_id: &str, code: &str) -> String {
    serde_json::json!({
        "protocol": 1,
        "request_id": request_id,
        "run": {"kind": "snippet", "language": "python", "code": code},
    })
    .to_string()
}

/// Whether `node` offers `provider` (skipped, or failed under CI=true, when not).
pub fn provider_available(test: &str, node: &Node, token: &str, provider: &str) -> bool {
    let p = node.call("GET", "/v1/providers", Some(token), None).json();
    let ok = p["providers"].as_array().is_some_and(|l| {
        l.iter()
            .any(|x| x["name"] == provider && x["available"] == true)
    });
    if !ok {
        testing::skip_or_fail(
            test,
            &format!("the {provider} provider is unavailable: {}", p["providers"]),
        );
    }
    ok
}

/// Nodes on `settings` and the router in front of them, with what they share: on loopback, or
/// each in a member of a fabric of their own. The router goes first, then the nodes, then
/// the fabric (fields are dropped in order).
pub struct Started {
    pub router: Router,
    pub nodes: Vec<Node>,
    pub cluster: Cluster,
    pub net: Net,
    pub fabric: Option<Arc<Fabric>>,
}

impl Started {
    /// `n` nodes and the router on loopback. `None` (skipped, or failed under CI=true) when
    /// the nodes do not offer `provider`.
    pub fn on_loopback(test: &str, n: usize, settings: &str, provider: &str) -> Option<Started> {
        let cluster = Cluster::new();
        let nodes = cluster.nodes(n, settings);
        Started::with_router(test, provider, cluster, nodes, None)
    }

    /// `n` nodes, each in a member of a new fabric, and the router in member 1.
    pub fn in_fabric(test: &str, n: usize, settings: &str, provider: &str) -> Option<Started> {
        let fabric = Fabric::new(n + 1);
        let cluster = Cluster::new();
        let nodes = cluster.nodes_in(&fabric, n, settings);
        Started::with_router(test, provider, cluster, nodes, Some(fabric))
    }

    /// The router in front of `nodes` (in fabric member 1 when there is a fabric), once the
    /// nodes offer `provider`.
    pub fn with_router(
        test: &str,
        provider: &str,
        cluster: Cluster,
        nodes: Vec<Node>,
        fabric: Option<Arc<Fabric>>,
    ) -> Option<Started> {
        if !provider_available(test, &nodes[0], &cluster.token, provider) {
            return None;
        }
        let listed: Vec<&Node> = nodes.iter().collect();
        let router = match &fabric {
            Some(f) => Router::start(
                &listed,
                &cluster,
                Some(f.member(1)),
                &format!("{}:7879", Fabric::addr(1)),
            ),
            None => Router::start(&listed, &cluster, None, "127.0.0.1:0"),
        };
        let net = fabric.clone().map_or(Net::Loopback, Net::Fabric);
        Some(Started {
            router,
            nodes,
            cluster,
            net,
            fabric,
        })
    }
}
