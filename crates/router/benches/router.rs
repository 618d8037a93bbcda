//! What the router costs: `cargo bench -p plimsoll-router` (release build).
//!
//! Real plimsolld nodes (the process provider, each its own process on loopback) and a real
//! plimsoll-router. Prints, side by side in one run:
//! - per-run latency of a trivial Python snippet sent to a node directly and through the
//!   router (p50, p90), the two interleaved so that the machine's noise falls on both alike;
//! - the same for a request the node refuses at once, so that nothing runs and the figure is
//!   the HTTP path alone;
//! - runs per second from 4 concurrent clients: to one node directly, through the router to
//!   that one node, and through the router to three nodes.
//!
//! The nodes share the machine's cores with the router and the clients, so three nodes add
//! no CPU: the three-node figure shows what placement costs and spreads, not how a cluster of
//! separate machines scales.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Cluster, Router, run_body};

const WARMUP: usize = 20;
const SAMPLES: usize = 200;
const CLIENTS: usize = 4;
const THROUGHPUT_FOR: Duration = Duration::from_secs(10);

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
}

/// One run, timed; panics unless it answers 200.
fn one(agent: &ureq::Agent, url: &str, token: &str, id: &str) -> Duration {
    let body = run_body(id, "print(1)", r#","minimum_isolation":"process""#);
    exchange(agent, url, token, &body, 200)
}

/// A request the node refuses at once (another protocol number): nothing runs, so what is
/// timed is the HTTP path alone.
fn refused(agent: &ureq::Agent, url: &str, token: &str, id: &str) -> Duration {
    let body = run_body(id, "print(1)", "").replace(r#""protocol":1"#, r#""protocol":2"#);
    exchange(agent, url, token, &body, 400)
}

/// One POST /v1/runs, timed; panics unless it answers `want`.
fn exchange(agent: &ureq::Agent, url: &str, token: &str, body: &str, want: u16) -> Duration {
    let start = Instant::now();
    let mut resp = agent
        .post(format!("{url}/v1/runs"))
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .send(body.as_bytes())
        .expect("a run");
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().unwrap_or_default();
    let took = start.elapsed();
    assert_eq!(status, want, "{text}");
    took
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

/// Runs per second from [`CLIENTS`] clients for [`THROUGHPUT_FOR`].
fn throughput(url: &str, token: &str) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (url, token) = (url.to_owned(), token.to_owned());
            let (stop, done) = (Arc::clone(&stop), Arc::clone(&done));
            std::thread::spawn(move || {
                let agent = agent();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    one(&agent, &url, &token, &format!("t{c}-{i}"));
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let start = Instant::now();
    std::thread::sleep(THROUGHPUT_FOR);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("a client");
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    // `cargo bench` passes --bench; a filter that is not ours runs nothing.
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with('-') && !"router".contains(&a))
    {
        return;
    }
    let cluster = Cluster::new();
    let settings = format!("{}\nmax_concurrent = 8\n", common::PROCESS);
    let nodes = cluster.nodes(3, &settings);
    let one_node = Router::start(&[&nodes[0]], &cluster, None, "127.0.0.1:0");
    let three_nodes = Router::start(
        &nodes.iter().collect::<Vec<_>>(),
        &cluster,
        None,
        "127.0.0.1:0",
    );
    let token = cluster.token.clone();
    let direct = nodes[0].url();
    let agent = agent();
    for i in 0..WARMUP {
        one(&agent, &direct, &token, &format!("w-d{i}"));
        one(&agent, &one_node.url, &token, &format!("w-r{i}"));
    }
    let (mut d, mut r) = (Vec::new(), Vec::new());
    for i in 0..SAMPLES {
        d.push(one(&agent, &direct, &token, &format!("d{i}")));
        r.push(one(&agent, &one_node.url, &token, &format!("r{i}")));
    }
    d.sort();
    r.sort();
    let (d50, d90, r50, r90) = (
        percentile(&d, 0.5),
        percentile(&d, 0.9),
        percentile(&r, 0.5),
        percentile(&r, 0.9),
    );
    println!(
        "router overhead per run (process tier, python print(1), {SAMPLES} each, interleaved):"
    );
    println!("  direct to the node   p50 {d50:7.2} ms   p90 {d90:7.2} ms");
    println!("  through the router   p50 {r50:7.2} ms   p90 {r90:7.2} ms");
    println!(
        "  difference           p50 {:+7.2} ms   p90 {:+7.2} ms",
        r50 - d50,
        r90 - d90
    );
    let (mut d, mut r) = (Vec::new(), Vec::new());
    for i in 0..SAMPLES {
        d.push(refused(&agent, &direct, &token, &format!("pd{i}")));
        r.push(refused(&agent, &one_node.url, &token, &format!("pr{i}")));
    }
    d.sort();
    r.sort();
    println!("a request the node refuses at once (nothing runs: the HTTP path alone):");
    println!(
        "  direct to the node   p50 {:7.2} ms   p90 {:7.2} ms",
        percentile(&d, 0.5),
        percentile(&d, 0.9)
    );
    println!(
        "  through the router   p50 {:7.2} ms   p90 {:7.2} ms",
        percentile(&r, 0.5),
        percentile(&r, 0.9)
    );
    println!(
        "throughput, {CLIENTS} clients for {} s each:",
        THROUGHPUT_FOR.as_secs()
    );
    let t_direct = throughput(&direct, &token);
    let t_one = throughput(&one_node.url, &token);
    let t_three = throughput(&three_nodes.url, &token);
    println!("  direct to one node          {t_direct:7.1} runs/s");
    println!(
        "  router, one node            {t_one:7.1} runs/s ({:.2}x direct)",
        t_one / t_direct
    );
    println!(
        "  router, three nodes         {t_three:7.1} runs/s ({:.2}x direct)",
        t_three / t_direct
    );
    let spread: Vec<f64> = nodes
        .iter()
        .map(|n| n.metric("plimsoll_runs_total"))
        .collect();
    println!("  runs per node over the whole bench: {spread:?}");
}
