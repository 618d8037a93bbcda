//! What snapshots and forks cost: `cargo bench -p plimsoll-daemon --bench snapshots`
//! (release build). A real daemon (in-process, over loopback HTTP) at runsc, the one provider
//! here whose sessions can be saved, Python sessions (JavaScript ones are refused). Prints,
//! measured side by side in one run (medians of the samples, and each sample):
//! - a cold session open (the baseline a restore or a fork replaces);
//! - a snapshot: the request's round trip and the checkpoint alone, and its size on disk;
//! - a session opened from a snapshot;
//! - a fork into 1 and into 8 copies: the whole request, and per copy.
//!
//! The session holds a little state (`x = 41` and an imported module) before each snapshot.

use std::time::{Duration, Instant};

use plimsoll_test_daemon::TestDaemon;
use plimsoll_wire::{ForkAnswer, SessionInfo, SnapshotInfo};

const SAMPLES: usize = 7;
const FORK_SAMPLES: usize = 5;

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(300)))
        .build()
        .into()
}

struct Bench {
    daemon: TestDaemon,
    agent: ureq::Agent,
    n: u64,
}

impl Bench {
    /// POSTs `body` to `path`; the answer's body, timed. Panics unless it answers 200.
    fn post(&mut self, path: &str, body: serde_json::Value) -> (String, Duration) {
        self.n += 1;
        let mut body = body;
        body["protocol"] = 1.into();
        body["request_id"] = format!("bench-{}", self.n).into();
        let started = Instant::now();
        let mut resp = self
            .agent
            .post(format!("{}{path}", self.daemon.url))
            .header("Authorization", format!("Bearer {}", self.daemon.token))
            .header("Content-Type", "application/json")
            .send(body.to_string().as_bytes())
            .expect("an answer");
        let text = resp.body_mut().read_to_string().expect("a body");
        let took = started.elapsed();
        assert_eq!(resp.status().as_u16(), 200, "{path}: {text}");
        (text, took)
    }

    fn close(&mut self, id: &str) {
        let _ = self
            .agent
            .delete(format!("{}/v1/sessions/{id}", self.daemon.url))
            .header("Authorization", format!("Bearer {}", self.daemon.token))
            .call();
    }

    fn drop_snapshot(&mut self, id: &str) {
        let _ = self
            .agent
            .delete(format!("{}/v1/snapshots/{id}", self.daemon.url))
            .header("Authorization", format!("Bearer {}", self.daemon.token))
            .call();
    }

    /// A session at runsc holding a little state.
    fn open(&mut self) -> (SessionInfo, Duration) {
        let (text, took) = self.post(
            "/v1/sessions",
            serde_json::json!({"language": "python", "provider": "runsc"}),
        );
        let info: SessionInfo = serde_json::from_str(&text).unwrap();
        self.post(
            &format!("/v1/sessions/{}/cells", info.session_id),
            serde_json::json!({"run": {"kind": "snippet", "language": "python", "code": "import json, random\nx = 41"}}),
        );
        (info, took)
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn line(what: &str, v: &[f64]) {
    let each: Vec<String> = v.iter().map(|x| format!("{x:.0}")).collect();
    println!(
        "{what:<40} p50 {:>8.1} ms   [{}]",
        median(v.to_vec()),
        each.join(" ")
    );
}

fn main() {
    let image = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../build/images/sandbox");
    // The image is refused through anything but its real path.
    let image = std::fs::canonicalize(&image).unwrap_or(image);
    let daemon = TestDaemon::start(&format!(
        "providers = [\"runsc\"]\nmax_concurrent = 16\nmax_per_caller = 16\n[pools]\n[oci]\nimage = \"{}\"\n[sessions]\nmax_total = 12\nmax_per_caller = 12\nmax_fork = 8\n",
        image.display()
    ));
    let mut b = Bench {
        daemon,
        agent: agent(),
        n: 0,
    };
    let (mut opens, mut snaps, mut checkpoints, mut sizes, mut restores) =
        (vec![], vec![], vec![], vec![], vec![]);
    // One unmeasured round first.
    for i in 0..=SAMPLES {
        let (s, open) = b.open();
        let (text, took) = b.post(
            &format!("/v1/sessions/{}/snapshot", s.session_id),
            serde_json::json!({}),
        );
        let snap: SnapshotInfo = serde_json::from_str(&text).unwrap();
        let (text, restore) = b.post(
            &format!("/v1/snapshots/{}/sessions", snap.snapshot_id),
            serde_json::json!({}),
        );
        let restored: SessionInfo = serde_json::from_str(&text).unwrap();
        b.close(&restored.session_id);
        b.close(&s.session_id);
        b.drop_snapshot(&snap.snapshot_id);
        if i == 0 {
            continue;
        }
        opens.push(ms(open));
        snaps.push(ms(took));
        checkpoints.push(snap.checkpoint_ms as f64);
        sizes.push(snap.bytes as f64 / 1e6);
        restores.push(ms(restore));
    }
    println!("runsc, Python ({SAMPLES} samples each; fork {FORK_SAMPLES})");
    line("cold session open", &opens);
    line("snapshot (request)", &snaps);
    line("  of which checkpoint + restore in place", &checkpoints);
    println!(
        "{:<40} p50 {:>8.2} MB",
        "snapshot size",
        median(sizes.clone())
    );
    line("open from a snapshot (restore + re-seed)", &restores);
    for count in [1usize, 8] {
        let (mut whole, mut per) = (vec![], vec![]);
        for _ in 0..FORK_SAMPLES {
            let (s, _) = b.open();
            let (text, took) = b.post(
                &format!("/v1/sessions/{}/fork", s.session_id),
                serde_json::json!({"count": count}),
            );
            let fork: ForkAnswer = serde_json::from_str(&text).unwrap();
            assert_eq!(fork.sessions.len(), count);
            for c in &fork.sessions {
                b.close(&c.session_id);
            }
            b.close(&s.session_id);
            b.drop_snapshot(&fork.snapshot.snapshot_id);
            whole.push(ms(took));
            per.push(ms(took) / count as f64);
        }
        line(&format!("fork into {count} (request)"), &whole);
        line(&format!("fork into {count}, per copy"), &per);
    }
}
