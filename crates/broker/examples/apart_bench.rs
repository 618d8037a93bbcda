//! What running the brokers in the broker process costs (docs/privileges.md): side by side,
//! interleaved, a run's whole broker life (start, its channel handed over, one API call,
//! the end with the call listed) and one call on an open channel, with the broker in this
//! process (`here`, as the CLI runs it) and in the broker process (`apart`, as plimsolld
//! runs it: the real `plimsolld broker-process`, as user plimsoll-broker, under its filter).
//! Prints medians and p90s; asserts nothing about speed.
//!
//! `cargo run --release -p plimsoll-broker --example apart_bench [-- N]` (root; the user
//! plimsoll-broker must exist: scripts/install-deps)

mod common;

use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::brokered_call;
use plimsoll_broker::GrantProfiles;
use plimsoll_broker::apart::{Apart, Brokers, DEFAULT_USER, ProcessUser};
use plimsoll_testing::api::{Expect, TestApi};

const TOKEN: &str = "bench-token-0123456789";

fn quantiles(v: &mut [Duration]) -> (f64, f64) {
    v.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    (us(v[v.len() / 2]), us(v[v.len() * 9 / 10]))
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(300);
    let api = TestApi::start(Expect::Static {
        header: "authorization".into(),
        value: format!("Bearer {TOKEN}"),
    });
    let grants = GrantProfiles::parse(
        &format!(
            "[profiles.bench]\nbase_url = \"{}\"\nroutes = [\"GET /orders/*\"]\ncallers = [\"bench\"]\ncall_budget = 10000\n[profiles.bench.credential]\nkind = \"static\"\nsecret_env = \"BENCH_TOKEN\"\n",
            api.url()
        ),
        |_| Some(TOKEN.to_owned()),
    )
    .unwrap();
    let grant = grants.authorize("bench", "bench").unwrap();
    let user = ProcessUser::lookup(DEFAULT_USER)
        .unwrap_or_else(|why| panic!("user {DEFAULT_USER}, {why}: run scripts/install-deps"));
    let plimsolld = plimsoll_testing::tool_binary("plimsolld", "plimsoll-daemon").unwrap();
    let routes = [
        ("here", Brokers::Here),
        (
            "apart",
            Brokers::Apart(Apart::start(&plimsolld, user).expect("the broker process")),
        ),
    ];
    let life = |brokers: &Brokers, i: usize| {
        let t = Instant::now();
        let b = brokers
            .start(
                grant.clone(),
                "bench",
                &format!("run-{i}"),
                Duration::from_secs(60),
            )
            .unwrap();
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        b.channel().serve_stream(ours).unwrap();
        brokered_call(&mut theirs, i as u64);
        drop(theirs);
        let finished = b.finish();
        let took = t.elapsed();
        assert_eq!(finished.calls.len(), 1);
        took
    };
    // Warm up: the process's first grants load, the HTTP client's connections.
    for (_, b) in &routes {
        for i in 0..10 {
            life(b, i);
        }
    }
    let mut lives = [Vec::new(), Vec::new()];
    // Each round in the other order, so drift on a shared host hits both alike.
    for i in 0..n {
        for j in 0..2 {
            let k = (i + j) % 2;
            lives[k].push(life(&routes[k].1, i));
        }
    }
    // One open channel each, calls interleaved.
    let open: Vec<_> = routes
        .iter()
        .map(|(_, b)| {
            let run = b
                .start(grant.clone(), "bench", "calls", Duration::from_secs(600))
                .unwrap();
            let (ours, theirs) = UnixStream::pair().unwrap();
            run.channel().serve_stream(ours).unwrap();
            (run, theirs)
        })
        .collect();
    let mut calls = [Vec::new(), Vec::new()];
    let mut open = open;
    for i in 0..n {
        for j in 0..2 {
            let k = (i + j) % 2;
            let t = Instant::now();
            brokered_call(&mut open[k].1, i as u64);
            calls[k].push(t.elapsed());
        }
    }
    println!("n = {n} each, interleaved; microseconds");
    println!("| what | where | p50 | p90 |");
    println!("|---|---|---|---|");
    let mut p50 = [[0.0; 2]; 2];
    for (w, what) in [
        "a run's broker life (start, channel, 1 call, finish)",
        "one call on an open channel",
    ]
    .iter()
    .enumerate()
    {
        let v = if w == 0 { &mut lives } else { &mut calls };
        for (k, (name, _)) in routes.iter().enumerate() {
            let (m, p) = quantiles(&mut v[k]);
            p50[w][k] = m;
            println!("| {what} | {name} | {m:.0} | {p:.0} |");
        }
    }
    println!(
        "apart adds {:.0} us to a run's broker life and {:.0} us to a call (p50)",
        p50[0][1] - p50[0][0],
        p50[1][1] - p50[1][0]
    );
    for (run, s) in open {
        drop(s);
        run.finish();
    }
}
