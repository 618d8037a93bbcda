//! What the broker adds to a call: the median latency of one call through the broker (a
//! client on a socketpair, as a sandbox speaks to it) against a direct call to the same API
//! (the same HTTP client, the same token), interleaved, n calls each; then calls per second
//! through the broker, one channel, calls back to back.
//!
//! `cargo run --release -p plimsoll-broker --example broker_latency [-- N]`

mod common;

use std::os::unix::net::UnixStream;

use std::time::{Duration, Instant};

use common::brokered_call;
use plimsoll_broker::{Broker, GrantProfiles};
use plimsoll_sandbox::BrokerPort as _;
use plimsoll_testing::api::{Expect, TestApi};

const TOKEN: &str = "bench-token-0123456789";

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(50);
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
    let profile = grants.authorize("bench", "bench").unwrap();
    let broker = Broker::start(
        profile.clone(),
        "bench",
        "bench-run",
        Duration::from_secs(3600),
    );
    let (ours, theirs) = UnixStream::pair().unwrap();
    broker.serve_stream(ours).unwrap();
    let mut channel = theirs;
    let direct = ureq::Agent::config_builder()
        .max_redirects(0)
        .proxy(None)
        .build()
        .new_agent();
    let direct_call = |id: u64| {
        let r = direct
            .get(format!("{}/orders/{id}", api.url()))
            .header("authorization", format!("Bearer {TOKEN}"))
            .call()
            .unwrap();
        assert_eq!(r.status(), 200);
        r.into_body().read_to_vec().unwrap();
    };
    // Warm both connections up.
    for i in 0..5 {
        brokered_call(&mut channel, i);
        direct_call(i);
    }
    let (mut via, mut bare) = (Vec::new(), Vec::new());
    for i in 0..n {
        let t = Instant::now();
        brokered_call(&mut channel, i);
        via.push(t.elapsed());
        let t = Instant::now();
        direct_call(i);
        bare.push(t.elapsed());
    }
    let (mv, mb) = (median(&mut via), median(&mut bare));
    println!("n = {n} interleaved calls each");
    println!("direct call:   median {:>8.1} us", mb.as_secs_f64() * 1e6);
    println!("through broker: median {:>8.1} us", mv.as_secs_f64() * 1e6);
    println!(
        "added by the broker: {:>8.1} us (median of brokered minus median of direct)",
        (mv.as_secs_f64() - mb.as_secs_f64()) * 1e6
    );
    let calls = 2000;
    let mut each = Vec::with_capacity(calls as usize);
    let t = Instant::now();
    for i in 0..calls {
        let c = Instant::now();
        brokered_call(&mut channel, i);
        each.push(c.elapsed());
    }
    let secs = t.elapsed().as_secs_f64();
    each.sort();
    println!(
        "back to back: median {:.1} us, p99 {:.1} us, max {:.1} us",
        each[each.len() / 2].as_secs_f64() * 1e6,
        each[each.len() * 99 / 100].as_secs_f64() * 1e6,
        each[each.len() - 1].as_secs_f64() * 1e6
    );
    println!(
        "throughput: {:.0} calls/s through the broker ({calls} calls back to back on one channel)",
        calls as f64 / secs
    );
    drop(channel);
    let listed = broker.finish();
    println!("calls listed: {}", listed.calls.len());
}
