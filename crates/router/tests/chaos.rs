//! The router and its nodes as a cluster behaves: the router and each plimsolld node in a
//! network namespace of its own, joined by veth links to a bridge (common::Fabric). A node is
//! killed mid-run, partitioned (its link dropped) mid-run, drained by SIGTERM with a session
//! open, restarted one after another under load, and given other providers; through all of it
//! every request gets a verified result or a correctly marked error, and a run whose node went
//! away after dispatch is never said not to have run.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Cluster, Fabric, Net, Node, PROCESS, Started, cell_body, run_body};
use plimsoll_client::{Client, ClientError, RunOptions};
use plimsoll_wire::{Language, Reason, Tier};

/// The index of the node with a run in flight.
fn holder_of_a_run(nodes: &[Node]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(i) =
            (0..nodes.len()).find(|i| nodes[*i].metric("plimsoll_runs_in_flight") > 0.0)
        {
            return i;
        }
        assert!(Instant::now() < deadline, "no node ever held the run");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_run_whose_node_is_killed_after_dispatch_is_never_said_not_dispatched() {
    let test = "a_run_whose_node_is_killed_after_dispatch_is_never_said_not_dispatched";
    let Some(Started {
        router,
        mut nodes,
        cluster,
        net,
        fabric: _fabric,
    }) = Started::in_fabric(test, 3, PROCESS, "process")
    else {
        return;
    };
    let (url, token) = (router.url.clone(), cluster.token.clone());
    let running = net.spawn(move || {
        common::call(
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
    let holder = holder_of_a_run(&nodes);
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
    // Before the router has learned that the node is gone, runs still find the others: a
    // connection that cannot be made sent nothing, so the next node takes the request.
    let before: f64 = (0..3)
        .filter(|i| *i != holder)
        .map(|i| nodes[i].metric("plimsoll_runs_total"))
        .sum();
    let client = Client::new(router.url.clone(), cluster.token.clone());
    let runs = net
        .spawn(move || {
            (0..4)
                .map(|i| {
                    client
                        .run(
                            RunOptions::snippet(Language::Python, format!("print({i})"))
                                .min_isolation(Tier::Process),
                        )
                        .map(|r| r.result.exit_code)
                })
                .collect::<Vec<_>>()
        })
        .join()
        .unwrap();
    for r in runs {
        assert_eq!(r.expect("a run after a node died"), Some(0));
    }
    let after: f64 = (0..3)
        .filter(|i| *i != holder)
        .map(|i| nodes[i].metric("plimsoll_runs_total"))
        .sum();
    assert_eq!(after - before, 4.0);
    let m = router.call("GET", "/metrics", None, None).body;
    assert!(m.contains("plimsoll_router_node_lost_total 1"), "{m}");
}

#[test]
fn a_partitioned_node_s_run_may_have_run_and_the_other_nodes_serve_on() {
    let test = "a_partitioned_node_s_run_may_have_run_and_the_other_nodes_serve_on";
    let Some(Started {
        router,
        nodes,
        cluster,
        net,
        fabric,
    }) = Started::in_fabric(test, 2, PROCESS, "process")
    else {
        return;
    };
    let fabric = fabric.expect("the nodes are in a fabric");
    let (url, token) = (router.url.clone(), cluster.token.clone());
    let running = net.spawn(move || {
        let started = Instant::now();
        let a = common::call(
            &url,
            "POST",
            "/v1/runs",
            Some(&token),
            Some(&run_body(
                "cut-1",
                "import time\ntime.sleep(3)\nprint('done')",
                r#","limits":{"timeout_ms":8000}"#,
            )),
        );
        (a, started.elapsed())
    });
    let holder = holder_of_a_run(&nodes);
    fabric.cut(holder + 2);
    let (a, took) = running.join().unwrap();
    // The router's keepalive gives the silent node up; the run's answer, if there was one,
    // never came back, so nothing can say whether it ran.
    assert_eq!(a.status, 502, "{}", a.body);
    let v = a.json();
    assert_eq!(v["error"]["code"], "node_lost", "{v}");
    assert_eq!(v["error"]["not_dispatched"], serde_json::Value::Null, "{v}");
    assert_eq!(v["request_id"], "cut-1");
    assert_eq!(a.node(), nodes[holder].addr);
    assert!(
        took < Duration::from_secs(40),
        "the partition was noticed only after {took:?}"
    );
    // Every run now goes to the other node, and verifies.
    let other = &nodes[1 - holder];
    let before = other.metric("plimsoll_runs_total");
    let client = Client::new(router.url.clone(), cluster.token.clone());
    let runs = net
        .spawn(move || {
            (0..4)
                .map(|i| {
                    client
                        .run(
                            RunOptions::snippet(Language::Python, format!("print({i})"))
                                .min_isolation(Tier::Process),
                        )
                        .map(|r| r.isolation)
                })
                .collect::<Vec<_>>()
        })
        .join()
        .unwrap();
    for r in runs {
        assert_eq!(r.expect("a run while a node is partitioned"), Tier::Process);
    }
    assert_eq!(other.metric("plimsoll_runs_total") - before, 4.0);
    router.wait_usable(&cluster.token, 1);
    // The link back: the node serves again.
    fabric.mend(holder + 2);
    router.wait_usable(&cluster.token, 2);
}

#[test]
fn a_node_drained_by_sigterm_answers_its_run_and_its_session_ends_with_it() {
    let test = "a_node_drained_by_sigterm_answers_its_run_and_its_session_ends_with_it";
    let Some(Started {
        router,
        mut nodes,
        cluster,
        net,
        fabric: _fabric,
    }) = Started::in_fabric(test, 2, &common::runc_settings(""), "runc")
    else {
        return;
    };
    let open = router.call(
        "POST",
        "/v1/sessions",
        Some(&cluster.token),
        Some(r#"{"protocol":1,"request_id":"open-1","language":"python"}"#),
    );
    assert_eq!(open.status, 200, "{}", open.body);
    let id = open.json()["session_id"].as_str().unwrap().to_owned();
    let holder = nodes.iter().position(|n| n.addr == open.node()).unwrap();
    let cells = format!("/v1/sessions/{id}/cells");
    let a = router.call(
        "POST",
        &cells,
        Some(&cluster.token),
        Some(&cell_body("c-1", "x = 41")),
    );
    assert_eq!(a.status, 200, "{}", a.body);
    // A cell in flight when the node is told to stop: it is answered, then the node exits.
    let (url, token, path) = (router.url.clone(), cluster.token.clone(), cells.clone());
    let in_flight = net.spawn(move || {
        common::call(
            &url,
            "POST",
            &path,
            Some(&token),
            Some(&cell_body(
                "c-2",
                "import time\ntime.sleep(3)\nprint(x + 1)",
            )),
        )
    });
    // A session's call is counted nowhere while in flight: give it a second to reach the
    // node (it sleeps three). Arriving late, it would be refused, and the test fail.
    std::thread::sleep(Duration::from_secs(1));
    let status = nodes[holder].terminate();
    assert!(status.success(), "the drained node exits 0: {status}");
    let a = in_flight.join().unwrap();
    assert_eq!(a.status, 200, "the cell in flight is answered: {}", a.body);
    assert_eq!(a.json()["result"]["stdout"], "42\n", "{}", a.body);
    // Its node gone: nothing can be sent there, and the answer says nothing ran.
    let a = router.call(
        "POST",
        &cells,
        Some(&cluster.token),
        Some(&cell_body("c-3", "print(x)")),
    );
    assert_eq!(a.status, 503, "{}", a.body);
    assert_eq!(a.json()["error"]["code"], "node_unreachable");
    assert_eq!(a.json()["error"]["not_dispatched"], "environment");
    // New sessions open on the node that is left.
    let again = router.call(
        "POST",
        "/v1/sessions",
        Some(&cluster.token),
        Some(r#"{"protocol":1,"request_id":"open-2","language":"python"}"#),
    );
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.node(), nodes[1 - holder].addr);
    // The node back: the old session is gone with its daemon, and says why.
    nodes[holder].restart(None);
    router.wait_learned(&cluster.token, &nodes[holder]);
    let a = router.call(
        "POST",
        &cells,
        Some(&cluster.token),
        Some(&cell_body("c-4", "print(x)")),
    );
    assert_eq!(a.status, 404, "{}", a.body);
    assert_eq!(
        a.json()["error"]["end_reason"],
        "daemon_restarted",
        "{}",
        a.body
    );
}

/// What one run through the router came to.
#[derive(Debug, Default)]
struct Tally {
    verified: u64,
    not_dispatched: u64,
    may_have_run: u64,
}

#[test]
fn a_rolling_restart_of_every_node_under_load_loses_nothing() {
    let test = "a_rolling_restart_of_every_node_under_load_loses_nothing";
    let Some(Started {
        router,
        mut nodes,
        cluster,
        net,
        fabric: _fabric,
    }) = Started::in_fabric(test, 3, PROCESS, "process")
    else {
        return;
    };
    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = (0..2)
        .map(|w| {
            let client = Client::new(router.url.clone(), cluster.token.clone());
            let stop = Arc::clone(&stop);
            net.spawn(move || {
                let mut t = Tally::default();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let want = format!("{w}-{i}\n");
                    match client.run(
                        RunOptions::snippet(Language::Python, format!("print('{w}-{i}')"))
                            .min_isolation(Tier::Process),
                    ) {
                        Ok(r) => {
                            assert_eq!(r.result.stdout.to_string_lossy(), want);
                            t.verified += 1;
                        }
                        // Refused with this request's id echoed: nothing ran.
                        Err(ClientError::Refused { .. }) => t.not_dispatched += 1,
                        // Said to have maybe run: allowed, never silently.
                        Err(ClientError::Failed { code, .. }) if code == "node_lost" => {
                            t.may_have_run += 1;
                        }
                        Err(e) => {
                            panic!("run {w}-{i}: neither a verified result nor a marked error: {e}")
                        }
                    }
                }
                t
            })
        })
        .collect();
    for (i, node) in nodes.iter_mut().enumerate() {
        std::thread::sleep(Duration::from_millis(500));
        let status = node.terminate();
        assert!(status.success(), "node {i} drained and exited 0: {status}");
        node.restart(None);
        // The router has learned the new daemon before the next one goes.
        router.wait_learned(&cluster.token, node);
    }
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let mut all = Tally::default();
    for h in load {
        let t = h.join().expect("a load thread");
        all.verified += t.verified;
        all.not_dispatched += t.not_dispatched;
        all.may_have_run += t.may_have_run;
    }
    eprintln!("rolling restart: {all:?}");
    assert!(all.verified >= 10, "{all:?}");
    // The router itself never lost a request: each answer came from a node or the router.
    let m = router.call("GET", "/metrics", None, None).body;
    assert!(m.contains("plimsoll_router_nodes_usable 3"), "{m}");
}

#[test]
fn a_node_whose_providers_change_keeps_floors_honest() {
    let test = "a_node_whose_providers_change_keeps_floors_honest";
    let fabric = Fabric::new(3);
    let net = Net::Fabric(Arc::clone(&fabric));
    let cluster = Cluster::new();
    let nodes = vec![
        Node::start(
            &common::runc_settings(", \"process\""),
            &cluster.callers,
            &net,
            Some(fabric.member(2)),
            &format!("{}:7878", Fabric::addr(2)),
        ),
        Node::start(
            PROCESS,
            &cluster.callers,
            &net,
            Some(fabric.member(3)),
            &format!("{}:7878", Fabric::addr(3)),
        ),
    ];
    let Some(Started {
        router,
        mut nodes,
        cluster,
        net,
        fabric: _fabric,
    }) = Started::with_router(test, "runc", cluster, nodes, Some(fabric))
    else {
        return;
    };
    let client = Client::new(router.url.clone(), cluster.token.clone());
    let floor = |client: &Client| {
        let client = client.clone();
        net.spawn(move || {
            client.run(
                RunOptions::snippet(Language::Python, "print(1)").min_isolation(Tier::Container),
            )
        })
        .join()
        .unwrap()
    };
    // Only the runc node meets `container`: every such run lands there, verified.
    for _ in 0..3 {
        let r = floor(&client).expect("a run at container");
        assert_eq!(
            (r.provider.as_str(), r.isolation),
            ("runc", Tier::Container)
        );
    }
    assert_eq!(nodes[1].metric("plimsoll_runs_total"), 0.0);
    // Its runc gone: a container floor is refused, not dispatched, and nothing runs below it.
    nodes[0].restart(Some(PROCESS));
    router.wait_learned(&cluster.token, &nodes[0]);
    match floor(&client) {
        Err(ClientError::Refused { reason, .. }) => assert_eq!(reason, Reason::Isolation),
        other => panic!("a container floor with no container node: {other:?}"),
    }
    assert_eq!(nodes[0].metric("plimsoll_runs_total"), 0.0);
    assert_eq!(nodes[1].metric("plimsoll_runs_total"), 0.0);
    // Back: served again.
    nodes[0].restart(Some(&common::runc_settings(", \"process\"")));
    router.wait_learned(&cluster.token, &nodes[0]);
    let r = floor(&client).expect("a run at container after the change");
    assert_eq!(r.isolation, Tier::Container);
}
