//! What the process provider adds to a trivial snippet: median wall time of
//! `console.log(1)` through `ProcessProvider::run` against a bare
//! `env -i /usr/bin/node -e 'console.log(1)'`, interleaved in one loop. Needs root.
//!
//! `cargo run --release -p plimsoll-process --example overhead [-- N]`

use std::os::unix::fs::PermissionsExt as _;
use std::time::{Duration, Instant};

use plimsoll_process::{ProcessConfig, ProcessProvider};
use plimsoll_sandbox::{CaptureLimits, LaunchPlan, Provider as _, ResolvedLimits, Spawn, capture};
use plimsoll_wire::{Language, RunSpec, Snippet};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20);
    let state = std::env::temp_dir().join(format!("plimsoll-overhead-{}", std::process::id()));
    std::fs::create_dir_all(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o711)).unwrap();
    let provider = ProcessProvider::new(ProcessConfig {
        node: "/usr/bin/node".into(),
        python: "/usr/bin/python3".into(),
        probe: "/nonexistent".into(),
        state_dir: state.clone(),
        probe_uid: 2_390_001,
    });
    let limits = ResolvedLimits {
        timeout: Duration::from_secs(10),
        memory_bytes: 1 << 30,
        output_bytes: 1 << 20,
        pids: 64,
        disk_bytes: 64 << 20,
        artifact_bytes: 1 << 20,
    };
    let (mut sandboxed, mut bare) = (Vec::new(), Vec::new());
    for i in 0..n + 2 {
        let plan = LaunchPlan {
            image: None,
            run_id: format!("bench-{i}"),
            request_id: "bench".into(),
            privileges: plimsoll_sandbox::Privileges::Unprivileged,
            spec: RunSpec::Snippet(Snippet {
                language: Language::Javascript,
                code: "console.log(1)".into(),
            }),
            limits,
            uid: 2_390_000,
            gid: 2_390_000,
            controller_uid: 2_390_000 + 1,
            controller_gid: 2_390_000 + 1,
            run_dir: state.join("runs").join(format!("bench-{i}")),
            broker: None,
            tap: None,
        };
        let t = Instant::now();
        let out = provider.run(&plan).expect("sandboxed run");
        let d1 = t.elapsed();
        assert_eq!(out.result.stdout.as_slice(), b"1\n");

        let t = Instant::now();
        let running = Spawn::new("/usr/bin/env", "/")
            .args(["-i", "/usr/bin/node", "-e", "console.log(1)"])
            .spawn()
            .expect("bare node");
        let out = capture(
            running,
            &CaptureLimits::new(1 << 20, Duration::from_secs(10)),
        )
        .unwrap();
        let d2 = t.elapsed();
        assert_eq!(out.stdout, b"1\n");
        if i >= 2 {
            // The first two are warm-up.
            sandboxed.push(d1);
            bare.push(d2);
        }
    }
    let (s, b) = (median(sandboxed.clone()), median(bare.clone()));
    println!(
        "n={n}  process provider: median {:.1} ms (min {:.1}, max {:.1})",
        ms(s),
        ms(*sandboxed.iter().min().unwrap()),
        ms(*sandboxed.iter().max().unwrap())
    );
    println!(
        "n={n}  bare env -i node: median {:.1} ms (min {:.1}, max {:.1})",
        ms(b),
        ms(*bare.iter().min().unwrap()),
        ms(*bare.iter().max().unwrap())
    );
    println!(
        "added by the provider (difference of medians): {:.1} ms",
        ms(s) - ms(b)
    );
    let _ = std::fs::remove_dir_all(&state);
}
