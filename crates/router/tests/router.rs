//! plimsoll-router in front of real plimsolld nodes (each its own process, on loopback):
//! placement by floor and image, answers passed on and verified by the client, session calls
//! routed by the session id, a node restarted under its sessions, MCP. Nodes killed,
//! partitioned, drained and restarted, each in a network namespace: tests/chaos.rs.

mod common;

use common::{PROCESS, Started, call, run_body};
use plimsoll_client::{Client, RunOptions};
use plimsoll_wire::{Language, Tier};

#[test]
fn runs_through_the_router_are_placed_verified_and_spread_over_the_nodes() {
    let test = "runs_through_the_router_are_placed_verified_and_spread_over_the_nodes";
    let Some(Started {
        router,
        nodes,
        cluster,
        ..
    }) = Started::on_loopback(test, 3, PROCESS, "process")
    else {
        return;
    };
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
    let Some(Started {
        router,
        nodes,
        cluster,
        ..
    }) = Started::on_loopback(test, 2, PROCESS, "process")
    else {
        return;
    };
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
        // A provider no node has configured is a bad request, as a node says it.
        ("provider-1", r#","provider":"runsc""#, 400, "request"),
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
        // The message names what each node offers (or, for a provider, what they have).
        if reason == "request" {
            assert!(
                v["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("configured: process"),
                "{v}"
            );
            continue;
        }
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
    // Its request id echoed, read from the body's first bytes as a node reads it, so that a
    // client can trust the not-dispatched mark.
    assert_eq!(a.json()["request_id"], "anon-1");
    assert_eq!(n.json()["request_id"], "anon-1");
    assert_eq!(a.json()["error"]["code"], n.json()["error"]["code"]);
    assert_eq!(
        a.json()["error"]["not_dispatched"],
        n.json()["error"]["not_dispatched"]
    );
    assert_eq!(a.headers["www-authenticate"], "Bearer");
    let a = call(&router.url, "GET", "/v1/nodes", Some("not-a-token"), None);
    assert_eq!(a.status, 401, "{}", a.body);
    // A body over the router's limit (8 MiB by default): refused, not dispatched, its request
    // id read from its first bytes, and no node sees it.
    let runs_requests = || -> Vec<f64> {
        nodes
            .iter()
            .map(|n| n.metric("plimsoll_http_requests_total{route=\"/v1/runs\""))
            .collect()
    };
    let before_big = runs_requests();
    let big = run_body("big-1", &"#".repeat(9 << 20), "");
    let a = call(
        &router.url,
        "POST",
        "/v1/runs",
        Some(&cluster.token),
        Some(&big),
    );
    assert_eq!(a.status, 413, "{}", a.body);
    let v = a.json();
    assert_eq!(v["request_id"], "big-1", "{v}");
    assert_eq!(v["error"]["not_dispatched"], "request", "{v}");
    assert_eq!(
        before_big,
        runs_requests(),
        "no node saw the oversized body"
    );
}

#[test]
fn a_session_s_calls_go_to_its_node_and_end_with_it() {
    let test = "a_session_s_calls_go_to_its_node_and_end_with_it";
    let Some(Started {
        router,
        mut nodes,
        cluster,
        ..
    }) = Started::on_loopback(test, 2, &common::runc_settings(""), "runc")
    else {
        return;
    };
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
            Some(&common::cell_body(rid, code)),
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
    nodes[i].restart(None);
    router.wait_learned(&cluster.token, &nodes[i]);
    let a = cell("c-4", "print(x)");
    assert_eq!(a.status, 404, "{}", a.body);
    let v = a.json();
    assert_eq!(v["error"]["code"], "session_not_found", "{v}");
    assert_eq!(v["error"]["end_reason"], "daemon_restarted", "{v}");
    assert_eq!(v["request_id"], "c-4");
}

/// Snapshots live on the node whose daemon took them: a snapshot, a fork and a session opened
/// from the snapshot through the router all reach that node; the router lists every node's.
/// A session its node's daemon saved on SIGTERM and the next one restored is still found.
#[test]
fn snapshots_and_forks_go_to_the_node_that_holds_them() {
    let test = "snapshots_and_forks_go_to_the_node_that_holds_them";
    let Some(Started {
        router,
        mut nodes,
        cluster,
        ..
    }) = Started::on_loopback(
        test,
        2,
        &format!(
            "{}[sessions]\nmax_total = 8\nmax_per_caller = 8\n",
            common::runc_settings(", \"runsc\"")
        ),
        "runsc",
    )
    else {
        return;
    };
    // Both nodes ready in the router's view (the runsc probe may finish after runc's).
    for n in &nodes {
        router.wait_learned(&cluster.token, n);
    }
    let post =
        |path: &str, body: &str| call(&router.url, "POST", path, Some(&cluster.token), Some(body));
    let open = post(
        "/v1/sessions",
        r#"{"protocol":1,"request_id":"open-1","language":"python","provider":"runsc"}"#,
    );
    assert_eq!(open.status, 200, "{}", open.body);
    let holder = open.node().to_owned();
    let id = open.json()["session_id"].as_str().unwrap().to_owned();
    let a = post(
        &format!("/v1/sessions/{id}/cells"),
        &common::cell_body("c-1", "x = 41"),
    );
    assert_eq!((a.status, a.node()), (200, holder.as_str()), "{}", a.body);
    let snap = post(
        &format!("/v1/sessions/{id}/snapshot"),
        r#"{"protocol":1,"request_id":"s-1"}"#,
    );
    assert_eq!(
        (snap.status, snap.node()),
        (200, holder.as_str()),
        "{}",
        snap.body
    );
    let snapshot_id = snap.json()["snapshot_id"].as_str().unwrap().to_owned();
    let fork = post(
        &format!("/v1/sessions/{id}/fork"),
        r#"{"protocol":1,"request_id":"f-1","count":2}"#,
    );
    assert_eq!(
        (fork.status, fork.node()),
        (200, holder.as_str()),
        "{}",
        fork.body
    );
    let copy = fork.json()["sessions"][1]["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let a = post(
        &format!("/v1/sessions/{copy}/cells"),
        &common::cell_body("c-2", "print(x + 1)"),
    );
    assert_eq!((a.status, a.node()), (200, holder.as_str()), "{}", a.body);
    assert_eq!(a.json()["result"]["stdout"], "42\n", "{}", a.body);
    let list = call(
        &router.url,
        "GET",
        "/v1/snapshots",
        Some(&cluster.token),
        None,
    );
    assert_eq!(list.status, 200, "{}", list.body);
    assert_eq!(
        list.json()["snapshots"].as_array().unwrap().len(),
        2,
        "{}",
        list.body
    );
    let restored = post(
        &format!("/v1/snapshots/{snapshot_id}/sessions"),
        r#"{"protocol":1,"request_id":"r-1"}"#,
    );
    assert_eq!(
        (restored.status, restored.node()),
        (200, holder.as_str()),
        "{}",
        restored.body
    );
    assert_eq!(restored.json()["origin"]["start"], "restored");
    let gone = call(
        &router.url,
        "DELETE",
        &format!("/v1/snapshots/{snapshot_id}"),
        Some(&cluster.token),
        None,
    );
    assert_eq!(
        (gone.status, gone.node()),
        (200, holder.as_str()),
        "{}",
        gone.body
    );
    // An id no node gave.
    let other = format!("snp_{}_{}", "0".repeat(16), "0".repeat(32));
    let a = post(
        &format!("/v1/snapshots/{other}/sessions"),
        r#"{"protocol":1,"request_id":"r-2"}"#,
    );
    assert_eq!(a.status, 404, "{}", a.body);
    assert_eq!(a.json()["error"]["code"], "snapshot_not_found");
    assert_eq!(a.json()["request_id"], "r-2");
    // Its node restarted by SIGTERM: the next daemon restores the session under its id and
    // says it adopted the old instance, so the router still finds it there.
    let i = nodes.iter().position(|n| n.addr == holder).unwrap();
    assert_eq!(nodes[i].terminate().code(), Some(0));
    nodes[i].restart(None);
    router.wait_learned(&cluster.token, &nodes[i]);
    let a = post(
        &format!("/v1/sessions/{id}/cells"),
        &common::cell_body("c-3", "print(x + 1)"),
    );
    assert_eq!((a.status, a.node()), (200, holder.as_str()), "{}", a.body);
    assert_eq!(a.json()["result"]["stdout"], "42\n", "{}", a.body);
    assert_eq!(a.json()["record"]["session"]["origin"]["start"], "restored");
}

/// MCP through the router: runs placed, a session's calls at its node, `list_sessions` of
/// every node; at runsc, a session's fork and snapshot taken at its node, a snapshot opened
/// and deleted there, `list_snapshots` of every node.
#[test]
fn mcp_through_the_router_places_runs_and_follows_sessions() {
    let test = "mcp_through_the_router_places_runs_and_follows_sessions";
    let Some(Started {
        router,
        nodes,
        cluster,
        ..
    }) = Started::on_loopback(
        test,
        2,
        &format!(
            "{}[sessions]\nmax_total = 8\nmax_per_caller = 8\n",
            common::runc_settings(", \"process\", \"runsc\"")
        ),
        "runc",
    )
    else {
        return;
    };
    let rpc = |id: u32, method: &str, params: serde_json::Value| {
        let a = common::mcp(
            &router.url,
            &cluster.token,
            &serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        );
        assert_eq!(a.status, 200, "{method}: {}", a.body);
        a
    };
    let tool = |id: u32, name: &str, args: serde_json::Value| {
        let a = rpc(
            id,
            "tools/call",
            serde_json::json!({"name": name, "arguments": args}),
        );
        let v = a.json();
        assert_eq!(v["id"], id, "{v}");
        (v["result"].clone(), a.node().to_owned())
    };
    let init = rpc(
        1,
        "initialize",
        serde_json::json!({"protocolVersion": "2025-06-18", "capabilities": {},
                           "clientInfo": {"name": "router-test", "version": "1"}}),
    );
    assert!(init.body.contains("plimsoll"), "{}", init.body);
    let listed = rpc(2, "tools/list", serde_json::json!({})).json();
    assert!(listed.to_string().contains("run_cell"), "{listed}");
    let (r, node) = tool(
        3,
        "run_code",
        serde_json::json!({"language": "python", "code": "print('via the router')", "min_isolation": "container"}),
    );
    assert_ne!(r["isError"], true, "{r}");
    assert!(r.to_string().contains("via the router"), "{r}");
    assert!(nodes.iter().any(|n| n.addr == node), "{node}");
    // A floor no node meets: the router's own refusal, worded as a node's MCP words it.
    let (r, node) = tool(
        4,
        "run_code",
        serde_json::json!({"language": "python", "code": "print(1)", "min_isolation": "vm"}),
    );
    assert_eq!(r["isError"], true, "{r}");
    assert_eq!(r["structuredContent"]["status"], "not_dispatched", "{r}");
    assert_eq!(r["structuredContent"]["reason"], "isolation", "{r}");
    assert!(node.is_empty(), "no node was asked");
    // A session: opened on a node, its cells follow it there.
    let (r, holder) = tool(5, "open_session", serde_json::json!({"language": "python"}));
    assert_ne!(r["isError"], true, "{r}");
    let id = r["structuredContent"]["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    for (n, code) in [(6, "x = 41"), (7, "print(x + 1)")] {
        let (r, node) = tool(
            n,
            "run_cell",
            serde_json::json!({"session_id": id, "code": code}),
        );
        assert_ne!(r["isError"], true, "{r}");
        assert_eq!(node, holder);
        if n == 7 {
            assert!(r.to_string().contains("42"), "{r}");
        }
    }
    let (r, _) = tool(8, "list_sessions", serde_json::json!({}));
    assert!(r.to_string().contains(&id), "{r}");
    // An id no node gave: refused, nothing ran.
    let other = format!("ses_{}_{}", "0".repeat(16), "0".repeat(32));
    let (r, _) = tool(
        9,
        "run_cell",
        serde_json::json!({"session_id": other, "code": "1"}),
    );
    assert_eq!(r["isError"], true, "{r}");
    assert_eq!(r["structuredContent"]["code"], "session_not_found", "{r}");

    // Snapshots, at runsc: both nodes known to the router with it (its probe may finish
    // after runc's).
    if !common::provider_available(test, &nodes[0], &cluster.token, "runsc") {
        return;
    }
    for n in &nodes {
        router.wait_learned(&cluster.token, n);
    }
    let (r, holder) = tool(
        10,
        "open_session",
        serde_json::json!({"language": "python", "provider": "runsc"}),
    );
    assert_ne!(r["isError"], true, "{r}");
    let parent = r["structuredContent"]["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (r, node) = tool(
        11,
        "run_cell",
        serde_json::json!({"session_id": parent, "code": "x = 41"}),
    );
    assert_ne!(r["isError"], true, "{r}");
    assert_eq!(node, holder);
    // A fork is taken at the session's node, and its copies live there.
    let (r, node) = tool(
        12,
        "fork_session",
        serde_json::json!({"session_id": parent, "count": 2}),
    );
    assert_ne!(r["isError"], true, "{r}");
    assert_eq!(node, holder);
    let copy = r["structuredContent"]["session_ids"][1]
        .as_str()
        .unwrap()
        .to_owned();
    let (r, node) = tool(
        13,
        "run_cell",
        serde_json::json!({"session_id": copy, "code": "print(x + 1)"}),
    );
    assert_eq!(
        (&r["structuredContent"]["stdout"]["text"], node.as_str()),
        (&serde_json::json!("42\n"), holder.as_str()),
        "{r}"
    );
    assert_eq!(
        r["structuredContent"]["session"]["origin"]["parent_session_id"],
        parent.as_str(),
        "{r}"
    );
    let (r, node) = tool(
        14,
        "snapshot_session",
        serde_json::json!({"session_id": parent}),
    );
    assert_ne!(r["isError"], true, "{r}");
    assert_eq!(node, holder);
    let snapshot_id = r["structuredContent"]["snapshot_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // A snapshot's calls go to the node that took it.
    let (r, node) = tool(
        15,
        "open_snapshot",
        serde_json::json!({"snapshot_id": snapshot_id}),
    );
    assert_ne!(r["isError"], true, "{r}");
    assert_eq!(node, holder);
    assert_eq!(r["structuredContent"]["origin"]["start"], "restored", "{r}");
    let (r, _) = tool(16, "list_snapshots", serde_json::json!({}));
    assert_eq!(
        r["structuredContent"]["snapshots"].as_array().map(Vec::len),
        Some(2),
        "{r}"
    );
    assert!(r.to_string().contains(&snapshot_id), "{r}");
    let (r, node) = tool(
        17,
        "delete_snapshot",
        serde_json::json!({"snapshot_id": snapshot_id}),
    );
    assert_ne!(r["isError"], true, "{r}");
    assert_eq!(node, holder);
    let (r, node) = tool(
        18,
        "open_snapshot",
        serde_json::json!({"snapshot_id": snapshot_id}),
    );
    assert_eq!(
        (
            &r["isError"],
            &r["structuredContent"]["code"],
            node.as_str()
        ),
        (
            &serde_json::json!(true),
            &serde_json::json!("snapshot_not_found"),
            holder.as_str()
        ),
        "{r}"
    );
    // An id no node gave: the router's own refusal, nothing ran.
    let other = format!("snp_{}_{}", "0".repeat(16), "0".repeat(32));
    let (r, node) = tool(
        19,
        "open_snapshot",
        serde_json::json!({"snapshot_id": other}),
    );
    assert_eq!(r["structuredContent"]["code"], "snapshot_not_found", "{r}");
    assert_eq!(r["structuredContent"]["nothing_ran"], true, "{r}");
    assert!(node.is_empty(), "no node was asked");
}

#[test]
fn the_kubernetes_settings_are_settings_plimsolld_takes() {
    for name in ["plimsoll.toml", "plimsoll-kvm.toml"] {
        let path = plimsoll_testing::workspace_root()
            .join("deploy/kubernetes")
            .join(name);
        let text = std::fs::read_to_string(&path).unwrap();
        let s = plimsoll_engine::settings::Settings::parse(&text)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(s.default_floor, Some(Tier::Container), "{name}");
    }
}
