//! The oracle end to end, as root, with a real plimsolld and real sandboxes: its last JSON
//! line, the report it writes, the bundle it signs (verified and replayed with the real
//! `plimsoll-attest`), and the accepted fingerprint at every provider of tier container or
//! above. A provider this host lacks is a SKIP (a failure under CI=true).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use plimsoll_testing::{is_root, skip_or_fail, tool_binary};
use plimsoll_wire::Tier;
use serde_json::Value;

const ORACLE: &str = env!("CARGO_BIN_EXE_plimsoll-example-oracle");
/// docs/trials.md: the accepted controller's fingerprint on the standard scenario.
const ACCEPTED: &str = "93585277088f4cfbd7683a2db52ab4a44906d74c74468ab9a49d4ddc8e959d41";
/// docs/trials.md: the draft's; it falls at tick 188.
const DRAFT: &str = "d64835dcd6da2f8ee31dfeefcb1a07e2ded5b3e8c54b1b997402c250e463a587";
/// The oracle's exit status when no provider can run the trials.
const EXIT_UNAVAILABLE: i32 = 3;

/// The binaries the oracle and its daemon need, built first when missing; None (after a SKIP)
/// when this host cannot run the test.
fn prerequisites(test: &str) -> Option<Tools> {
    if !is_root() {
        skip_or_fail(test, "needs root (the sandbox switches uids)");
        return None;
    }
    let mut found = Vec::new();
    for (name, package) in [
        ("plimsolld", "plimsoll-daemon"),
        ("plimsoll-agent", "plimsoll-agent"),
        ("plimsoll-probe", "plimsoll-probe"),
        ("plimsoll-trial-runner", "plimsoll-trial"),
        ("plimsoll-attest", "plimsoll-attest"),
    ] {
        match tool_binary(name, package) {
            Ok(p) => found.push(p),
            Err(e) => {
                skip_or_fail(test, &e);
                return None;
            }
        }
    }
    Some(Tools {
        plimsolld: found[0].clone(),
        attest: found[4].clone(),
    })
}

struct Tools {
    plimsolld: PathBuf,
    attest: PathBuf,
}

#[expect(
    clippy::disallowed_methods,
    reason = "the test runs the oracle and plimsoll-attest binaries as a user would"
)]
fn command(program: &Path) -> Command {
    Command::new(program)
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs the oracle with `args` (and its daemon from `tools`, its output under `out`). None
/// (after a SKIP) when no provider could run the trials.
fn oracle(test: &str, tools: &Tools, out: &Path, args: &[&str]) -> Option<(Output, Value)> {
    let mut c = command(Path::new(ORACLE));
    c.arg("--plimsolld").arg(&tools.plimsolld);
    oracle_with(test, c, out, args)
}

/// Runs the oracle `c` (its daemon already chosen) with `args`, its output under `out`.
fn oracle_with(test: &str, mut c: Command, out: &Path, args: &[&str]) -> Option<(Output, Value)> {
    let o = c
        .arg("--out")
        .arg(out)
        .args(args)
        .output()
        .expect("run the oracle");
    if o.status.code() == Some(EXIT_UNAVAILABLE) {
        skip_or_fail(
            test,
            &format!(
                "no provider could run the trials: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ),
        );
        return None;
    }
    assert!(o.status.success(), "the oracle failed: {}", text(&o));
    let stdout = String::from_utf8(o.stdout.clone()).unwrap();
    let last = stdout.lines().last().expect("a last line");
    let json: Value = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("the last line is not JSON ({e}): {}", text(&o)));
    Some((o, json))
}

/// The invariants of every successful oracle run.
fn check_summary(o: &Output, json: &Value) -> Tier {
    let fp = &json["fingerprints"];
    assert_eq!(fp["accepted_1"], ACCEPTED, "{}", text(o));
    assert_eq!(fp["accepted_2"], ACCEPTED, "{}", text(o));
    assert_eq!(fp["draft"], DRAFT, "{}", text(o));
    assert_eq!(json["draft_fell_at_tick"], 188);
    assert_eq!(json["draft_fell_at_seconds"], 1.88);
    let tier: Tier = json["tier"].as_str().unwrap().parse().unwrap();
    assert!(tier >= Tier::Container, "ran below the floor: {json}");
    assert!(json["provider"].as_str().is_some_and(|p| !p.is_empty()));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("draft fell at tick 188 (1.88 s)"),
        "{}",
        text(o)
    );
    let report = Path::new(json["report"].as_str().unwrap());
    let page = std::fs::read_to_string(report).unwrap();
    assert!(page.contains(ACCEPTED) && page.contains(DRAFT));
    assert!(page.contains(json["provider"].as_str().unwrap()));
    tier
}

#[test]
fn the_oracle_runs_at_the_strongest_provider_and_writes_the_report() {
    let test = "the_oracle_runs_at_the_strongest_provider_and_writes_the_report";
    let Some(tools) = prerequisites(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let Some((o, json)) = oracle(test, &tools, dir.path(), &[]) else {
        return;
    };
    let tier = check_summary(&o, &json);
    assert_eq!(json["bundle"], Value::Null);
    assert_eq!(
        json["report"].as_str().map(PathBuf::from),
        Some(dir.path().join("report.html").canonicalize().unwrap())
    );
    // The providers the oracle listed (stderr, `  name tier available`): it ran at the
    // strongest tier among the available ones, and at the first listed of that tier.
    let stderr = String::from_utf8_lossy(&o.stderr);
    let available: Vec<(String, Tier)> = stderr
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            match w.as_slice() {
                [name, tier, "available"] => Some((name.to_string(), tier.parse().ok()?)),
                _ => None,
            }
        })
        .collect();
    let strongest = available.iter().map(|(_, t)| *t).max().unwrap();
    assert_eq!(tier, strongest, "{}", text(&o));
    let first = available.iter().find(|(_, t)| *t == strongest).unwrap();
    assert_eq!(json["provider"], first.0.as_str(), "{}", text(&o));
    // Every provider of the oracle's own daemon was probed, `process` not among them.
    for p in ["crun", "runc", "runsc", "qemu"] {
        assert!(
            stderr.lines().any(|l| l.trim_start().starts_with(p)),
            "{p} not listed: {}",
            text(&o)
        );
    }
}

/// Flips one bit of `bytes` at `at` and returns the copy.
fn flipped(bytes: &[u8], at: usize) -> Vec<u8> {
    let mut b = bytes.to_vec();
    b[at] ^= 0x01;
    b
}

#[test]
fn a_bundle_of_the_three_runs_verifies_and_replays() {
    let test = "a_bundle_of_the_three_runs_verifies_and_replays";
    let Some(tools) = prerequisites(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("ci");
    let o = command(&tools.attest)
        .arg("keygen")
        .arg("--out")
        .arg(&prefix)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let (key, public) = (dir.path().join("ci.key"), dir.path().join("ci.pub"));
    let bundle = dir.path().join("runs.jsonl");
    let args = [
        "--provider",
        "crun",
        "--bundle",
        bundle.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
    ];
    let Some((o, json)) = oracle(test, &tools, dir.path(), &args) else {
        return;
    };
    check_summary(&o, &json);
    assert_eq!(json["provider"], "crun");
    assert_eq!(json["tier"], "container");
    assert_eq!(
        json["bundle"].as_str().map(PathBuf::from),
        Some(bundle.canonicalize().unwrap())
    );

    // It verifies: three entries and a close.
    let verify = |path: &Path| {
        command(&tools.attest)
            .arg("verify")
            .arg("--pub")
            .arg(&public)
            .arg(path)
            .output()
            .unwrap()
    };
    let o = verify(&bundle);
    assert!(o.status.success(), "{}", text(&o));
    let summary = String::from_utf8_lossy(&o.stdout);
    assert!(
        summary.contains("3 entries") && summary.contains("3 on crun (container)"),
        "{summary}"
    );

    // A flipped bit anywhere fails it: in each line's first, middle and last byte.
    let bytes = std::fs::read(&bundle).unwrap();
    let mut starts = vec![0];
    starts.extend(
        bytes
            .iter()
            .enumerate()
            .filter(|(i, b)| **b == b'\n' && i + 1 < bytes.len())
            .map(|(i, _)| i + 1),
    );
    assert_eq!(starts.len(), 4, "three entries and a close");
    let damaged = dir.path().join("damaged.jsonl");
    for (n, &s) in starts.iter().enumerate() {
        let end = starts.get(n + 1).copied().unwrap_or(bytes.len()) - 1;
        for at in [s, (s + end) / 2, end - 1] {
            std::fs::write(&damaged, flipped(&bytes, at)).unwrap();
            let o = verify(&damaged);
            assert_eq!(o.status.code(), Some(1), "byte {at} flipped: {}", text(&o));
        }
    }

    // Replayed against a daemon offering crun, every run gives the signed result.
    let daemon = plimsoll_test_daemon::TestDaemon::start("providers = [\"crun\"]\n");
    let o = command(&tools.attest)
        .args(["replay", "--daemon", &daemon.url, "--pub"])
        .arg(&public)
        .arg(&bundle)
        .env("PLIMSOLL_TOKEN", &daemon.token)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(out.matches("same result").count(), 3, "{}", text(&o));
    assert!(!out.contains("DIFFERS") && !out.contains("FAILED"), "{out}");

    // The oracle itself against that running daemon (--daemon, the token from the
    // environment) gives the same fingerprints.
    let mut c = command(Path::new(ORACLE));
    c.args(["--daemon", &daemon.url])
        .env("PLIMSOLL_TOKEN", &daemon.token);
    let Some((o, json)) = oracle_with(test, c, &dir.path().join("via-daemon"), &[]) else {
        return;
    };
    check_summary(&o, &json);
    assert_eq!(json["provider"], "crun");
    // Without the token it refuses before sending anything.
    let o = command(Path::new(ORACLE))
        .args(["--daemon", &daemon.url, "--out"])
        .arg(dir.path().join("no-token"))
        .env_remove("PLIMSOLL_TOKEN")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("PLIMSOLL_TOKEN"));
}

#[test]
fn the_accepted_fingerprint_is_the_same_at_every_provider() {
    let test = "the_accepted_fingerprint_is_the_same_at_every_provider";
    let Some(tools) = prerequisites(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut ran = Vec::new();
    for provider in ["crun", "runc", "runsc", "qemu"] {
        let out = dir.path().join(provider);
        let Some((o, json)) = oracle(
            &format!("{test} ({provider})"),
            &tools,
            &out,
            &["--provider", provider],
        ) else {
            continue;
        };
        let tier = check_summary(&o, &json);
        assert_eq!(json["provider"], provider);
        let expected: &[Tier] = match provider {
            "crun" | "runc" => &[Tier::Container],
            "runsc" => &[Tier::Kernel],
            _ => &[Tier::Kernel, Tier::Vm],
        };
        assert!(expected.contains(&tier), "{provider} ran at {tier}");
        ran.push(provider);
    }
    // check_summary compared each with the documented fingerprints: all are the same.
    eprintln!("the accepted fingerprint {ACCEPTED} at: {}", ran.join(", "));
}
