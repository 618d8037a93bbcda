//! The snapshot tools against a real in-process daemon at runsc (the one provider here whose
//! sessions can be saved), through each backend, one scenario for all three: the daemon's own
//! `/mcp` (its engine, over streamable HTTP), `plimsoll mcp --daemon`'s (the Rust client,
//! which checks each answer against the session's chain and each copy's origin), and
//! `plimsoll mcp`'s embedded engine (the daemon's engine, served in this process). A python
//! session holding `x = 41` is forked into two copies that each print 42 and a random number
//! of their own, every record carrying its origin inside its digest; the session goes on, is
//! snapshotted, and a session opened from the snapshot prints 42 too; the snapshots are
//! listed and deleted; a deleted snapshot and a JavaScript session's snapshot are refused,
//! nothing ran.

use std::sync::Arc;
use std::time::Duration;

use plimsoll_client::{Client, Token};
use plimsoll_mcp::{Backend, ClientBackend, EngineBackend, PlimsollMcp};
use plimsoll_test_daemon::TestDaemon;
use plimsoll_testing::{skip_or_fail, workspace_root};
use plimsoll_wire::RunRecord;
use plimsoll_wire::digest::record_sha256;
use serde_json::{Value, json};

/// A daemon offering runsc, with room for a fork's copies; `None` (after a SKIP, or a
/// failure under CI=true) when runsc is unavailable here.
fn runsc_daemon(test: &str) -> Option<TestDaemon> {
    let image = workspace_root().join("build/images/sandbox");
    // The real path: the image refuses to be reached through a symlink (build/ may be one).
    let image = std::fs::canonicalize(&image).unwrap_or(image);
    let d = TestDaemon::start(&format!(
        "default_floor = \"container\"\nproviders = [\"runsc\"]\n[pools]\n[oci]\nimage = \"{}\"\n[sessions]\nmax_total = 8\nmax_per_caller = 8\n",
        image.display()
    ));
    let providers = d.engine().providers_response();
    let runsc = providers.providers.iter().find(|p| p.name == "runsc");
    if !runsc.is_some_and(|p| p.available) {
        let why = runsc
            .and_then(|p| p.unavailable_reason.clone())
            .unwrap_or_else(|| "not offered".into());
        skip_or_fail(test, &format!("the runsc provider is unavailable: {why}"));
        return None;
    }
    Some(d)
}

/// A tool's answer: whether it is a tool error, its structured content and its text.
struct Called {
    error: bool,
    v: Value,
    text: String,
}

/// Something that calls the MCP tools.
trait Tools {
    fn call(&mut self, name: &str, args: Value) -> Called;

    /// A call that must succeed.
    fn ok(&mut self, name: &str, args: Value) -> Called {
        let c = self.call(name, args.clone());
        assert!(!c.error, "{name} {args}: {}", c.text);
        c
    }

    /// A call that must be refused with nothing run, with this reason and code.
    fn refused(&mut self, name: &str, args: Value, reason: &str, code: &str) -> Called {
        let c = self.call(name, args.clone());
        assert!(c.error, "{name} {args} was not refused: {}", c.text);
        assert!(
            c.text
                .starts_with(&format!("not dispatched ({reason}): nothing ran")),
            "{name} {args}: {}",
            c.text
        );
        assert_eq!(
            (
                &c.v["status"],
                &c.v["reason"],
                &c.v["code"],
                &c.v["nothing_ran"]
            ),
            (
                &json!("not_dispatched"),
                &json!(reason),
                &json!(code),
                &json!(true)
            ),
            "{name} {args}: {}",
            c.v
        );
        c
    }
}

/// The daemon's `/mcp`: one JSON-RPC message per POST, as any MCP client over HTTP sends it.
struct OverHttp {
    url: String,
    token: String,
    agent: ureq::Agent,
    next_id: u64,
}

impl OverHttp {
    fn new(d: &TestDaemon) -> Self {
        OverHttp {
            url: format!("{}/mcp", d.url),
            token: d.token.clone(),
            agent: ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(Duration::from_secs(300)))
                .build()
                .into(),
            next_id: 0,
        }
    }
}

impl Tools for OverHttp {
    fn call(&mut self, name: &str, args: Value) -> Called {
        self.next_id += 1;
        let message = json!({"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call",
                             "params": {"name": name, "arguments": args}});
        let mut resp = self
            .agent
            .post(&self.url)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", "2025-06-18")
            .header("Authorization", format!("Bearer {}", self.token))
            .send(message.to_string().as_bytes())
            .expect("an HTTP answer");
        let status = resp.status().as_u16();
        let body = resp.body_mut().read_to_string().expect("a body");
        assert_eq!(status, 200, "{name}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        assert_eq!(v["id"], self.next_id, "{v}");
        let r = &v["result"];
        Called {
            error: r["isError"] == true,
            v: r["structuredContent"].clone(),
            text: r["content"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["text"].as_str())
                .collect(),
        }
    }
}

/// The server in this process over `backend`, reached by the official SDK's client over an
/// in-memory byte stream (as `plimsoll mcp` is over stdio).
struct InProcess {
    rt: tokio::runtime::Runtime,
    client: rmcp::service::RunningService<rmcp::RoleClient, ()>,
}

impl InProcess {
    fn new(backend: Arc<dyn Backend>) -> Self {
        use rmcp::ServiceExt as _;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let client = rt.block_on(async move {
            let (ours, theirs) = tokio::io::duplex(1 << 20);
            tokio::spawn(async move {
                let running = PlimsollMcp::new(backend)
                    .serve(theirs)
                    .await
                    .expect("the server's handshake");
                let _ = running.waiting().await;
            });
            ().serve(ours).await.expect("the client's handshake")
        });
        InProcess { rt, client }
    }
}

impl Tools for InProcess {
    fn call(&mut self, name: &str, args: Value) -> Called {
        let Value::Object(args) = args else {
            panic!("arguments are an object")
        };
        let params = rmcp::model::CallToolRequestParams::new(name.to_owned()).with_arguments(args);
        let r = self
            .rt
            .block_on(self.client.call_tool(params))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        Called {
            error: r.is_error == Some(true),
            v: r.structured_content.clone().unwrap_or_default(),
            text: r
                .content
                .iter()
                .filter_map(|c| c.as_text().map(|t| t.text.clone()))
                .collect(),
        }
    }
}

fn s(v: &Value) -> String {
    v.as_str()
        .unwrap_or_else(|| panic!("not a string: {v}"))
        .to_owned()
}

fn stdout(c: &Called) -> String {
    s(&c.v["stdout"]["text"])
}

/// A cell's record: its digest recomputes (the origin, when there is one, is inside it), and
/// its chain link is the one the result shows.
fn record_of(c: &Called) -> RunRecord {
    let record: RunRecord = serde_json::from_value(c.v["record"].clone())
        .unwrap_or_else(|e| panic!("{e}: {}", c.v["record"]));
    assert_eq!(record_sha256(&record), record.record_sha256);
    assert_eq!(c.v["record_sha256"], record.record_sha256.as_str());
    let link = record.session.as_ref().expect("a session call's link");
    assert_eq!(c.v["session"]["sequence"], link.sequence);
    assert_eq!(c.v["session"].get("origin").cloned(), {
        link.origin.as_ref().map(|o| json!(o))
    });
    record
}

/// The one scenario every backend runs.
fn snapshot_tools(tools: &mut dyn Tools) {
    let opened = tools.ok(
        "open_session",
        json!({"language": "python", "provider": "runsc"}),
    );
    assert_eq!(
        (&opened.v["provider"], &opened.v["isolation"]),
        (&json!("runsc"), &json!("kernel"))
    );
    assert!(opened.v.get("origin").is_none(), "{}", opened.v);
    let parent = s(&opened.v["session_id"]);
    let first = tools.ok(
        "run_cell",
        json!({"session_id": parent, "code": "import random\nx = 41"}),
    );
    let first_record = s(&first.v["record_sha256"]);
    assert!(record_of(&first).session.unwrap().origin.is_none());

    // A fork into two copies: each a new session, forked from the parent after its call 1.
    let fork = tools.ok("fork_session", json!({"session_id": parent, "count": 2}));
    let snap = &fork.v["snapshot"];
    assert_eq!(
        (
            &snap["session_id"],
            &snap["calls"],
            &snap["last_record_sha256"]
        ),
        (&json!(parent), &json!(1), &json!(first_record)),
        "{}",
        fork.v
    );
    let fork_snapshot = s(&snap["snapshot_id"]);
    let copies: Vec<String> = fork.v["session_ids"]
        .as_array()
        .expect("the copies' ids")
        .iter()
        .map(s)
        .collect();
    assert_eq!(copies.len(), 2, "{}", fork.v);
    assert!(
        copies[0] != copies[1] && !copies.contains(&parent),
        "{copies:?}"
    );
    let forked_origin = json!({"start": "forked", "snapshot_sha256": snap["sha256"],
                               "parent_session_id": parent, "parent_record_sha256": first_record,
                               "parent_calls": 1});
    for (i, copy) in copies.iter().enumerate() {
        assert_eq!(fork.v["sessions"][i]["session_id"], copy.as_str());
        assert_eq!(fork.v["sessions"][i]["origin"], forked_origin, "{}", fork.v);
    }
    assert!(
        fork.text.contains(&copies[0])
            && fork.text.contains(&copies[1])
            && fork
                .text
                .contains(&format!("forked from session {parent} after its call 1")),
        "{}",
        fork.text
    );

    // Each copy holds the parent's state, goes on from its chain, and has randomness of its own.
    let mut randoms = Vec::new();
    for copy in &copies {
        let c = tools.ok(
            "run_cell",
            json!({"session_id": copy, "code": "print(x + 1, random.random())"}),
        );
        let out = stdout(&c);
        let (answer, random) = out.trim().split_once(' ').expect("two words");
        assert_eq!(answer, "42", "{out}");
        randoms.push(random.to_owned());
        let record = record_of(&c);
        let link = record.session.unwrap();
        assert_eq!(
            (
                link.session_id.as_str(),
                link.sequence,
                link.previous_record_sha256.as_deref()
            ),
            (copy.as_str(), 2, Some(first_record.as_str()))
        );
        assert_eq!(c.v["session"]["origin"], forked_origin);
        assert!(
            c.text
                .contains(&format!("forked from session {parent} after its call 1")),
            "{}",
            c.text
        );
    }
    assert_ne!(randoms[0], randoms[1], "the copies share their randomness");

    // The parent goes on, as it was.
    let second = tools.ok(
        "run_cell",
        json!({"session_id": parent, "code": "print(x)"}),
    );
    assert_eq!(stdout(&second), "41\n");
    assert_eq!(second.v["session"]["sequence"], 2);
    assert!(second.v["session"].get("origin").is_none());
    let second_record = s(&second.v["record_sha256"]);

    // A snapshot of it after its call 2, and a session opened from that.
    let taken = tools.ok("snapshot_session", json!({"session_id": parent}));
    let t = &taken.v;
    let snapshot_id = s(&t["snapshot_id"]);
    assert!(snapshot_id.starts_with("snp_") && snapshot_id != fork_snapshot);
    assert_eq!(
        (
            &t["session_id"],
            &t["calls"],
            &t["last_record_sha256"],
            &t["provider"],
            &t["language"]
        ),
        (
            &json!(parent),
            &json!(2),
            &json!(second_record),
            &json!("runsc"),
            &json!("python")
        ),
        "{t}"
    );
    assert_eq!(s(&t["sha256"]).len(), 64, "{t}");
    assert!(t["bytes"].as_u64().unwrap() > 0, "{t}");
    assert!(
        taken.text.starts_with(&format!(
            "took snapshot {snapshot_id} of session {parent} after its call 2"
        )),
        "{}",
        taken.text
    );
    let restored = tools.ok("open_snapshot", json!({"snapshot_id": snapshot_id}));
    let r = &restored.v;
    let restored_id = s(&r["session_id"]);
    assert!(
        restored_id != parent && !copies.contains(&restored_id),
        "{r}"
    );
    let restored_origin = json!({"start": "restored", "snapshot_sha256": t["sha256"],
                                 "parent_session_id": parent,
                                 "parent_record_sha256": second_record, "parent_calls": 2});
    assert_eq!(r["origin"], restored_origin, "{r}");
    assert_eq!(
        (&r["status"], &r["calls"], &r["provider"]),
        (&json!("open"), &json!(2), &json!("runsc"))
    );
    assert!(
        restored.text.contains(&format!(
            "restored from a snapshot of session {parent} after its call 2"
        )),
        "{}",
        restored.text
    );
    let c = tools.ok(
        "run_cell",
        json!({"session_id": restored_id, "code": "print(x + 1)"}),
    );
    assert_eq!(stdout(&c), "42\n");
    let link = record_of(&c).session.unwrap();
    assert_eq!(
        (link.sequence, link.previous_record_sha256.as_deref()),
        (3, Some(second_record.as_str()))
    );
    assert_eq!(c.v["session"]["origin"], restored_origin);

    // The caller's snapshots, oldest first; one deleted, then refused.
    let listed = |tools: &mut dyn Tools| -> Vec<String> {
        let l = tools.ok("list_snapshots", json!({}));
        l.v["snapshots"]
            .as_array()
            .expect("a list")
            .iter()
            .map(|x| s(&x["snapshot_id"]))
            .collect()
    };
    assert_eq!(
        listed(&mut *tools),
        [fork_snapshot.clone(), snapshot_id.clone()]
    );
    let deleted = tools.ok("delete_snapshot", json!({"snapshot_id": snapshot_id}));
    assert_eq!(
        (&deleted.v["status"], &deleted.v["snapshot_id"]),
        (&json!("deleted"), &json!(snapshot_id))
    );
    assert_eq!(listed(&mut *tools), std::slice::from_ref(&fork_snapshot));
    for tool in ["open_snapshot", "delete_snapshot"] {
        tools.refused(
            tool,
            json!({"snapshot_id": snapshot_id}),
            "request",
            "snapshot_not_found",
        );
    }
    // A fork of no copy is refused before anything is taken.
    tools.refused(
        "fork_session",
        json!({"session_id": parent, "count": 0}),
        "request",
        "request",
    );
    assert_eq!(listed(&mut *tools), std::slice::from_ref(&fork_snapshot));

    // A JavaScript session cannot be saved: refused, and it goes on untouched.
    let js = tools.ok(
        "open_session",
        json!({"language": "javascript", "provider": "runsc"}),
    );
    let js = s(&js.v["session_id"]);
    let e = tools.refused(
        "snapshot_session",
        json!({"session_id": js}),
        "unsupported",
        "unsupported",
    );
    assert!(e.text.contains("crypto.randomBytes"), "{}", e.text);
    tools.refused(
        "fork_session",
        json!({"session_id": js, "count": 1}),
        "unsupported",
        "unsupported",
    );
    let c = tools.ok(
        "run_cell",
        json!({"session_id": js, "code": "console.log(6 * 7)"}),
    );
    assert_eq!(
        (stdout(&c).as_str(), &c.v["session"]["sequence"]),
        ("42\n", &json!(1))
    );

    // Everything given back.
    tools.ok("delete_snapshot", json!({"snapshot_id": fork_snapshot}));
    assert!(listed(&mut *tools).is_empty());
    for id in [&parent, &copies[0], &copies[1], &restored_id, &js] {
        tools.ok("close_session", json!({"session_id": id}));
    }
}

#[test]
fn snapshot_tools_through_the_daemon_s_mcp() {
    let test = "snapshot_tools_through_the_daemon_s_mcp";
    let Some(d) = runsc_daemon(test) else {
        return;
    };
    snapshot_tools(&mut OverHttp::new(&d));
}

#[test]
fn snapshot_tools_through_the_rust_client() {
    let test = "snapshot_tools_through_the_rust_client";
    let Some(d) = runsc_daemon(test) else {
        return;
    };
    let client = Client::new(&d.url, Token::new(d.token.clone()));
    snapshot_tools(&mut InProcess::new(Arc::new(ClientBackend::new(client))));
}

#[test]
fn snapshot_tools_on_the_embedded_engine() {
    let test = "snapshot_tools_on_the_embedded_engine";
    let Some(d) = runsc_daemon(test) else {
        return;
    };
    let engine = Arc::clone(d.engine());
    snapshot_tools(&mut InProcess::new(Arc::new(EngineBackend::lazy(
        engine, "local",
    ))));
}
