//! The trial report page (plimsoll_trial::report): rendered from real trials of
//! examples/controllers/accepted.js and draft.js run by the runner on the host as root (as
//! tests/trial.rs does), checked as text, then opened in a real headless Chromium that must
//! replay it without a JavaScript error. The page and its screenshot are kept under
//! target/tmp/trial-report/.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use plimsoll_testing::skip_or_fail;
use plimsoll_trial::report::{self, ReportInput, RunInput};
use plimsoll_trial::trajectory::encode;

/// The cart-pole's trajectory record: four state values and the force.
const RECORD_BYTES: usize = 40;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

const RUNNER: &str = env!("CARGO_BIN_EXE_plimsoll-trial-runner");
const NODE: &str = "/usr/bin/node";
const CHROMIUM: &str = "/usr/bin/chromium";
const STANDARD: &str = include_str!("../../../sims/cartpole/scenarios/standard.json");

fn controllers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/controllers")
}

/// True when the test can run; otherwise prints SKIP (or panics under CI=true).
fn can_run(test: &str, root: bool, needs: &[&str]) -> bool {
    let mut missing = Vec::new();
    if root && !plimsoll_testing::is_root() {
        missing.push("root (the runner switches uids)".to_owned());
    }
    for n in needs {
        if !Path::new(n).exists() {
            missing.push(n.to_string());
        }
    }
    if missing.is_empty() {
        return true;
    }
    let reason = format!(
        "needs {} (scripts/install-deps installs chromium)",
        missing.join(", ")
    );
    skip_or_fail(test, &reason);
    false
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Runs one controller through the runner on the standard scenario, as uid pair `slot` (the
/// slots of tests/trial.rs are 0 to 14), and returns the report's view of it.
fn run_trial(slot: u32, controller: &str, label: &str) -> RunInput {
    let uid = 2_170_000 + 2 * slot;
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(dir.path(), Some(uid), Some(uid)).unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let scenario = dir.path().join("standard.json");
    std::fs::write(&scenario, STANDARD).unwrap();
    std::os::unix::fs::chown(&scenario, Some(uid), Some(uid)).unwrap();
    let source_path = controllers_dir().join(controller);
    #[allow(clippy::disallowed_methods, reason = "the test runs the runner binary")]
    let out: Output = Command::new(RUNNER)
        .current_dir(dir.path())
        .args(["--uid", &uid.to_string(), "--gid", &uid.to_string()])
        .args(["--controller-uid", &(uid + 1).to_string()])
        .args(["--controller-gid", &(uid + 1).to_string()])
        .args(["--scenario", "standard.json"])
        .args([
            "--first-deadline-ms",
            "20000",
            "--tick-deadline-ms",
            "10000",
        ])
        .args(["--", NODE, source_path.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout.clone()).unwrap();
    let v: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{e}: {text} {}", String::from_utf8_lossy(&out.stderr)));
    let t = &v["trials"][0];
    let trajectory = std::fs::read(dir.path().join("trajectory.bin")).unwrap();
    let controller_source = std::fs::read_to_string(&source_path).unwrap();
    assert_eq!(t["fingerprint"], sha256(&trajectory));
    RunInput {
        label: label.to_owned(),
        // No daemon here: the request digest stands for the source and scenario, the result
        // digest for the verdict line; the page shows whatever it is given.
        request_sha256: sha256(format!("{controller_source}\n{STANDARD}").as_bytes()),
        result_sha256: sha256(text.as_bytes()),
        controller_source,
        fingerprint: t["fingerprint"].as_str().unwrap().to_owned(),
        ticks: t["ticks"].as_u64().unwrap(),
        fell_at_tick: t["fell_at_tick"].as_u64(),
        end_reason: t["end_reason"].as_str().unwrap().to_owned(),
        provider: "host-test (the runner run directly)".to_owned(),
        tier: "process".to_owned(),
        trajectory,
    }
}

/// The accepted controller twice and the draft once, each on its own uid pair.
fn real_input(slot: u32) -> ReportInput {
    let accepted = run_trial(slot, "accepted.js", "accepted.js");
    let repeat = run_trial(slot, "accepted.js", "accepted.js (again)");
    let draft = run_trial(slot, "draft.js", "draft.js");
    ReportInput {
        title: "Trial report: accepted.js vs draft.js on standard.json".to_owned(),
        accepted,
        draft,
        accepted_repeat_fingerprint: Some(repeat.fingerprint),
    }
}

/// Where the page and screenshot are kept (target/tmp/trial-report/).
fn out_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("trial-report");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The first record where two trajectories differ, written again here from docs/trials.md.
fn first_difference(a: &[u8], b: &[u8], width: usize) -> Option<usize> {
    let (na, nb) = (a.len() / RECORD_BYTES, b.len() / RECORD_BYTES);
    for k in 0..na.min(nb) {
        let r = k * RECORD_BYTES..k * RECORD_BYTES + width;
        if a[r.clone()] != b[r] {
            return Some(k);
        }
    }
    (na != nb).then_some(na.min(nb))
}

/// The `data-tick` of the element with id `id`.
fn stated_tick(page: &str, id: &str) -> String {
    let needle = format!("id=\"{id}\" data-tick=\"");
    let at = page
        .find(&needle)
        .unwrap_or_else(|| panic!("no #{id} on the page"));
    let rest = &page[at + needle.len()..];
    rest[..rest.find('"').unwrap()].to_owned()
}

/// Nothing on the page can load anything.
fn assert_loads_nothing(page: &str) {
    let lower = page.to_ascii_lowercase();
    for bad in ["http://", "https://", "url(", "@import", "//fonts"] {
        assert!(!lower.contains(bad), "the page contains {bad:?}");
    }
    // Inside tags (escaped text has no raw `<`): no attribute that loads anything.
    for tag in lower
        .split('<')
        .skip(1)
        .map(|t| &t[..t.find('>').unwrap_or(t.len())])
    {
        for bad in ["src=", "href=", "srcset=", "action=", "poster=", "data="] {
            assert!(!tag.contains(bad), "a tag with {bad:?}: <{tag}>");
        }
    }
    assert!(
        lower.contains("default-src 'none'"),
        "the CSP forbids loading"
    );
    assert_eq!(
        lower.matches("<script").count(),
        2,
        "the data and the page's script only"
    );
}

#[test]
fn the_report_of_real_runs_is_self_contained_and_states_the_divergence() {
    let test = "the_report_of_real_runs_is_self_contained_and_states_the_divergence";
    if !can_run(test, true, &[NODE]) {
        return;
    }
    let input = real_input(20);
    let page = report::render(&input);
    std::fs::write(out_dir().join("report-text-check.html"), &page).unwrap();
    assert_loads_nothing(&page);

    let (a, d) = (&input.accepted, &input.draft);
    assert_eq!(a.end_reason, "completed");
    assert_eq!(d.end_reason, "fell");
    for s in [
        &a.fingerprint,
        &d.fingerprint,
        &a.request_sha256,
        &a.result_sha256,
        &d.request_sha256,
        &d.result_sha256,
    ] {
        assert!(page.contains(s.as_str()), "{s} is on the page");
    }
    assert_ne!(a.fingerprint, d.fingerprint);
    // Two in the table, one in the comparison; the repeat is identical.
    assert_eq!(
        page.matches("<span class=\"badge differs\">differs</span>")
            .count(),
        3
    );
    let repeat = format!(
        "<code class=\"fingerprint\">{}</code><span class=\"badge same\">identical</span></li>",
        a.fingerprint
    );
    assert!(
        page.contains(&repeat),
        "the repeated run is marked identical"
    );
    assert!(page.contains("What this page does not claim"));
    assert!(
        page.contains(">process</span>") && page.contains("host-test (the runner run directly)")
    );
    // The sources, escaped.
    assert!(page.contains("&quot;use strict&quot;;"));
    assert!(page.contains("const K_X = -1.0; // wrong sign"));

    // The divergence, computed here from the bytes.
    let record = first_difference(&a.trajectory, &d.trajectory, RECORD_BYTES).unwrap();
    let state = first_difference(&a.trajectory, &d.trajectory, 32).unwrap();
    assert_eq!(stated_tick(&page, "divergence"), record.to_string());
    assert_eq!(stated_tick(&page, "state-divergence"), state.to_string());
    // Same initial state, different first force (x = 0.3 and K_X differs): tick 0, then tick 1.
    assert_eq!((record, state), (0, 1));

    // The embedded numbers are the trajectory's, exactly (read with Rust's exact parser, as
    // JavaScript's Number() reads them; serde_json's default float parsing is not exact).
    let start = page.find("id=\"trajectories\">").unwrap();
    let json = &page[start..start + page[start..].find("</script>").unwrap()];
    let blocks: Vec<&str> = json.split("\"records\":[[").skip(1).collect();
    assert_eq!(blocks.len(), 2);
    for (run, block) in [a, d].iter().zip(blocks) {
        let block = &block[..block.find("]]").unwrap()];
        let recs: Vec<&str> = block.split("],[").collect();
        assert_eq!(recs.len() as u64, run.ticks);
        for (k, rec) in recs.iter().enumerate() {
            let nums: Vec<f64> = rec.split(',').map(|t| t.parse().unwrap()).collect();
            assert_eq!(nums.len(), 5);
            for (i, got) in nums.iter().enumerate() {
                let off = k * RECORD_BYTES + i * 8;
                let want = f64::from_le_bytes(run.trajectory[off..off + 8].try_into().unwrap());
                assert_eq!(got.to_bits(), want.to_bits(), "{} tick {k}", run.label);
            }
        }
    }
}

#[test]
fn untrusted_strings_stay_inert() {
    let hostile = "</script><script>alert(1)</script><img src=x onerror=alert(2)>";
    let traj = |forces: &[f64]| -> Vec<u8> {
        forces
            .iter()
            .flat_map(|f| encode(&[0.0, 0.0, 0.01, 0.0], &[*f]))
            .collect()
    };
    let run = |label: &str, t: Vec<u8>| RunInput {
        label: label.to_owned(),
        controller_source: format!("// {hostile}\nconsole.log(0);\n"),
        fingerprint: sha256(&t),
        ticks: (t.len() / RECORD_BYTES) as u64,
        fell_at_tick: None,
        end_reason: "completed".to_owned(),
        provider: hostile.to_owned(),
        tier: "<b>vm</b>".to_owned(),
        request_sha256: "\"><script>alert(3)</script>".to_owned(),
        result_sha256: "r".to_owned(),
        trajectory: t,
    };
    let input = ReportInput {
        title: format!("title {hostile}"),
        accepted: run(&format!("a {hostile}"), traj(&[1.0, 2.0, 3.0])),
        draft: run("d'\"&", traj(&[1.0, 2.0, 3.0, 4.0])),
        accepted_repeat_fingerprint: Some(hostile.to_owned()),
    };
    let page = report::render(&input);
    assert_loads_nothing(&page);
    assert!(!page.contains("alert(1)</script>") && !page.contains("<img"));
    assert!(!page.contains("<b>vm</b>"));
    assert!(page.contains("// &lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x"));
    assert!(page.contains("d&#39;&quot;&amp;"));
    // A prefix: identical records, then the draft goes on; the page says so.
    assert_eq!(stated_tick(&page, "divergence"), "3");
    assert_eq!(
        page.matches("<span class=\"badge differs\">differs</span>")
            .count(),
        4
    );
}

/// Runs Chromium headless on `page` with `extra` arguments, a fresh profile, at most 120 s.
fn chromium(page: &Path, extra: &[String]) -> Output {
    let profile = tempfile::tempdir().unwrap();
    #[allow(
        clippy::disallowed_methods,
        reason = "the test runs a browser on the host"
    )]
    let out = Command::new("/usr/bin/timeout")
        .args(["120", CHROMIUM])
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(format!("file://{}", page.display()))
        .env("HOME", profile.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "chromium failed: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn the_report_replays_in_headless_chromium() {
    let test = "the_report_replays_in_headless_chromium";
    if !can_run(test, true, &[NODE, CHROMIUM, "/usr/bin/timeout"]) {
        return;
    }
    let input = real_input(21);
    let page = out_dir().join("report.html");
    std::fs::write(&page, report::render(&input)).unwrap();

    let started = Instant::now();
    let out = chromium(
        &page,
        &["--virtual-time-budget=3000".into(), "--dump-dom".into()],
    );
    let dom = String::from_utf8(out.stdout).unwrap();
    assert!(
        dom.contains("<canvas id=\"replay\""),
        "the page rendered: {}",
        &dom[..dom.len().min(2000)]
    );
    assert!(dom.contains("id=\"chart-theta\"") && dom.contains("id=\"chart-x\""));
    assert!(
        dom.contains("<body data-errors=\"\">"),
        "no JavaScript error: {}",
        &dom[..dom.len().min(2000)]
    );
    let tick: u64 = stated_tick(&dom, "tick").parse().unwrap();
    assert!(tick > 0, "the replay advanced: tick {tick}");
    let title = &dom[dom.find("<title>").unwrap() + 7..dom.find("</title>").unwrap()];
    assert_eq!(title, format!("tick {tick} - plimsoll trial report"));
    let dump_s = started.elapsed().as_secs_f64();

    let shot = out_dir().join("report.png");
    let _ = std::fs::remove_file(&shot);
    let started = Instant::now();
    chromium(
        &page,
        &[
            "--virtual-time-budget=3000".into(),
            "--window-size=1200,900".into(),
            format!("--screenshot={}", shot.display()),
        ],
    );
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000,
        "a screenshot"
    );
    eprintln!(
        "report {} (tick {tick} after 3 s of virtual time); screenshot {} ({} bytes); chromium --dump-dom {dump_s:.1} s, --screenshot {:.1} s",
        page.display(),
        shot.display(),
        png.len(),
        started.elapsed().as_secs_f64()
    );
}
