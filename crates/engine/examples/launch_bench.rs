//! What reaching the providers through the launcher costs (docs/privileges.md, "The
//! launcher"): side by side, interleaved, the same cold run on an engine that hosts its
//! providers (`direct`, as plimsolld runs today) and on one that reaches them over the
//! launcher's socket (`launcher`), at the process tier and at crun; and one routing question
//! (`supports`) over the socket alone. Prints medians and p90s; asserts nothing about speed.
//!
//! `cargo build --release -p plimsoll-probe -p plimsoll-agent && cargo run --release -p
//! plimsoll-engine --example launch_bench [-- N]` (root; the sandbox image built: `make
//! images`; the tools are found beside the example's directory, in target/release)

use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use plimsoll_engine::{Engine, Settings};
use plimsoll_sandbox::Provider as _;
use plimsoll_wire::{Language, PROTOCOL, RunRequest, RunSpec, Snippet};

fn quantiles(v: &mut [Duration]) -> (f64, f64) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    (ms(v[v.len() / 2]), ms(v[v.len() * 9 / 10]))
}

fn settings(state: &std::path::Path, uid_base: u32, warm: bool) -> Settings {
    let image = plimsoll_engine::settings::default_image_dir();
    // Warm: one Python pool at each provider, at the default limits a request without
    // limits gets, so every run claims a member.
    let pools = if warm {
        "[pools.process.python]\nmin_idle = 1\nmax_members = 2\n[pools.crun.python]\nmin_idle = 1\nmax_members = 2\n"
    } else {
        "[pools]\n"
    };
    let toml = format!(
        "providers = [\"process\", \"crun\"]\ndefault_floor = \"process\"\nstate_dir = {state:?}\n\
         sandbox_uid_base = {uid_base}\nmax_concurrent = 2\n[oci]\nimage = {image:?}\n\
         state_root = {oci:?}\ncgroup_parent = \"/plimsoll-launch-bench-{uid_base}\"\n{pools}",
        state = state.display().to_string(),
        image = image.display().to_string(),
        oci = state.join("oci").display().to_string(),
    );
    Settings::parse(&toml).unwrap_or_else(|e| panic!("{e}"))
}

fn request(provider: &str, i: usize) -> RunRequest {
    RunRequest {
        image: None,
        protocol: PROTOCOL,
        request_id: format!("bench-{provider}-{i}"),
        minimum_isolation: None,
        provider: Some(provider.to_owned()),
        limits: None,
        run: RunSpec::Snippet(Snippet {
            language: Language::Python,
            code: "print(1)".into(),
        }),
        grant: None,
    }
}

fn ready(engine: &Engine) {
    engine.probe_all();
    for info in engine.providers() {
        assert!(
            info.available,
            "{} is not available: {}",
            info.name,
            info.unavailable_reason.unwrap_or_default()
        );
    }
}

/// An engine hosting its providers and one reaching the same settings' providers through a
/// launcher, each with a state directory and uids of its own; and the launcher's socket.
fn pair(dir: &std::path::Path, warm: bool, uid_base: u32) -> (Engine, Engine, std::path::PathBuf) {
    for sub in ["direct", "split"] {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o711)).unwrap();
    }
    let direct = settings(&dir.join("direct"), uid_base, warm)
        .build_engine(&[])
        .unwrap_or_else(|e| panic!("{e}"));
    let through = settings(&dir.join("split"), uid_base + 10_000, warm);
    let socket = dir.join("launch.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let launcher = Arc::new(
        through
            .build_launcher(&[], rustix::process::geteuid().as_raw())
            .unwrap_or_else(|e| panic!("{e}")),
    );
    std::thread::spawn(move || launcher.serve(listener));
    let split = through
        .build_engine_through(&socket)
        .unwrap_or_else(|e| panic!("{e}"));
    ready(&direct);
    ready(&split);
    if warm {
        direct.start_pools();
        split.start_pools();
    }
    (direct, split, socket)
}

/// Every pool of `engine` has a member idle, and none is being made.
fn settled(engine: &Engine) -> bool {
    let idle = engine.pools_idle();
    idle.iter().all(|(_, _, n)| *n >= 1)
        && engine.pool_member_ids().len() == idle.iter().map(|(_, _, n)| n).sum::<usize>()
}

/// `n` runs at each provider on each engine, interleaved (the order flipped every round, so
/// drift hits both alike); a warm round waits for both engines' pools to settle, and a run
/// that found no member is not counted.
fn side_by_side(engines: [(&str, &Engine); 2], warm: bool, n: usize) {
    let kind = if warm { "warm" } else { "cold" };
    for provider in ["process", "crun"] {
        let mut times = [Vec::new(), Vec::new()];
        let mut missed = 0;
        for i in 0..n {
            let order: [usize; 2] = if i % 2 == 0 { [0, 1] } else { [1, 0] };
            for k in order {
                let (name, engine) = engines[k];
                if warm {
                    // Both engines quiet: every pool has its member idle and none is being
                    // made, so no run shares the machine with a member's making.
                    let t = Instant::now();
                    while !engines.iter().all(|(_, e)| settled(e))
                        && t.elapsed() < Duration::from_secs(20)
                    {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    std::thread::sleep(Duration::from_millis(30));
                }
                let claimed = engine
                    .pool_counts()
                    .claimed
                    .load(std::sync::atomic::Ordering::SeqCst);
                let t = Instant::now();
                let r = engine
                    .run("bench", &request(provider, i))
                    .unwrap_or_else(|e| panic!("{name} {provider}: {e}"));
                let took = t.elapsed();
                assert_eq!(r.result.stdout.as_slice(), b"1\n", "{name} {provider}");
                let now = engine
                    .pool_counts()
                    .claimed
                    .load(std::sync::atomic::Ordering::SeqCst);
                if warm && now == claimed {
                    missed += 1;
                    continue;
                }
                times[k].push(took);
            }
        }
        let (d50, d90) = quantiles(&mut times[0]);
        let (l50, l90) = quantiles(&mut times[1]);
        println!(
            "{provider:8} {kind} run, {}/{} runs: direct p50 {d50:.2} ms p90 {d90:.2}; launcher p50 {l50:.2} ms p90 {l90:.2}; launcher - direct p50 {:+.2} ms{}",
            times[0].len(),
            times[1].len(),
            l50 - d50,
            if missed > 0 {
                format!(" ({missed} found no member)")
            } else {
                String::new()
            }
        );
    }
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(40);
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o711),
    )
    .unwrap();
    let (cold_dir, warm_dir) = (dir.path().join("cold"), dir.path().join("warm"));
    for d in [&cold_dir, &warm_dir] {
        std::fs::create_dir_all(d).unwrap();
        std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o711)).unwrap();
    }
    let (direct, split, socket) = pair(&cold_dir, false, 3_900_000);
    side_by_side([("direct", &direct), ("launcher", &split)], false, n);
    drop((direct, split));
    let (direct, split, _) = pair(&warm_dir, true, 3_920_000);
    side_by_side([("direct", &direct), ("launcher", &split)], true, n);
    // One routing question over the socket alone (a run asks about ten: each provider's
    // supports, takes_image and memory_floor, environment_holds, and more).
    let remote = plimsoll_engine::launch::Remote::all(&socket).unwrap();
    let spec = request("crun", 0).run;
    let mut times = Vec::new();
    for _ in 0..(n * 25) {
        let t = Instant::now();
        remote[1].supports(&spec).unwrap();
        times.push(t.elapsed());
    }
    let (q50, q90) = quantiles(&mut times);
    println!(
        "one question over the socket, {} times: p50 {:.0} µs p90 {:.0} µs",
        n * 25,
        q50 * 1e3,
        q90 * 1e3
    );
}
