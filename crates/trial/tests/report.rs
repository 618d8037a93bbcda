//! The trial report page (plimsoll_trial::report), for every shipped simulator (the cart-pole,
//! the water tank, the DC motor): rendered from real trials of examples/controllers/ (the
//! accepted controller twice, the failing draft once, on the simulator's standard scenario) run
//! by the runner on the host as root (as tests/trial.rs does), checked as text, then opened in
//! a real headless Chromium that must replay it without a JavaScript error, with one chart per
//! state and action variable. The pages and screenshots are kept under target/tmp/trial-report/
//! as NAME.html and NAME.png.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use plimsoll_testing::skip_or_fail;
use plimsoll_trial::report::{self, ReportInput, RunInput, escape};
use plimsoll_trial::sim::{ActionVariable, Metadata, Variable};
use plimsoll_trial::trajectory::{decode, encode, record_bytes};
use plimsoll_trial::verdict::SimulatorJson;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

const RUNNER: &str = env!("CARGO_BIN_EXE_plimsoll-trial-runner");
const NODE: &str = "/usr/bin/node";
const CHROMIUM: &str = "/usr/bin/chromium";

fn controllers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/controllers")
}

/// A shipped simulator and its two example controllers (under examples/controllers/).
struct Case {
    sim: &'static str,
    accepted: &'static str,
    failing: &'static str,
    /// The uid pair no other test uses (tests/trial.rs has slots 0 to 17).
    slot: u32,
}

const CARTPOLE: Case = Case {
    sim: "cartpole",
    accepted: "accepted.js",
    failing: "draft.js",
    slot: 20,
};
const TANK: Case = Case {
    sim: "tank",
    accepted: "tank/accepted.js",
    failing: "tank/failing.js",
    slot: 21,
};
const MOTOR: Case = Case {
    sim: "motor",
    accepted: "motor/accepted.js",
    failing: "motor/failing.js",
    slot: 22,
};

/// The missing prerequisites among root and `needs`.
fn missing(root: bool, needs: &[&str]) -> Vec<String> {
    let mut missing = Vec::new();
    if root && !plimsoll_testing::is_root() {
        missing.push("root (the runner switches uids)".to_owned());
    }
    for n in needs {
        if !Path::new(n).exists() {
            missing.push(n.to_string());
        }
    }
    missing
}

/// True when the test (or its next part) can run; otherwise prints SKIP (or panics under
/// CI=true).
fn can_run(test: &str, root: bool, needs: &[&str]) -> bool {
    let missing = missing(root, needs);
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

/// The shipped simulators and their index, root's and readable by all (as tests/trial.rs
/// writes it).
fn write_index(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut entries = Vec::new();
    for sim in plimsoll_sims::SHIPPED {
        let path = dir.join(format!("{}.wasm", sim.name));
        std::fs::write(&path, sim.wasm).unwrap();
        entries.push(serde_json::json!({
            "name": sim.name,
            "path": path,
            "sha256": sha256(sim.wasm),
        }));
    }
    let index = dir.join("index.json");
    std::fs::write(
        &index,
        serde_json::json!({"format": "plimsoll-simulators/1", "simulators": entries}).to_string(),
    )
    .unwrap();
    index
}

/// One real run: what the report is given, and the simulator the verdict names.
struct Run {
    input: RunInput,
    simulator: SimulatorJson,
}

/// Runs `controller` through the runner under simulator `sim` on its standard scenario, as uid
/// pair `slot`, and returns the report's view of it, read from the verdict.
fn run_trial(slot: u32, sim: &str, index: &Path, controller: &str, label: &str) -> Run {
    let uid = 2_170_000 + 2 * slot;
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(dir.path(), Some(uid), Some(uid)).unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let shipped = plimsoll_sims::get(sim).unwrap();
    let standard = std::fs::read_to_string(shipped.scenario("standard")).unwrap();
    let scenario = dir.path().join("standard.json");
    std::fs::write(&scenario, &standard).unwrap();
    std::os::unix::fs::chown(&scenario, Some(uid), Some(uid)).unwrap();
    let source_path = controllers_dir().join(controller);
    #[allow(clippy::disallowed_methods, reason = "the test runs the runner binary")]
    let out: Output = Command::new(RUNNER)
        .current_dir(dir.path())
        .args(["--uid", &uid.to_string(), "--gid", &uid.to_string()])
        .args(["--controller-uid", &(uid + 1).to_string()])
        .args(["--controller-gid", &(uid + 1).to_string()])
        .args(["--simulator", sim])
        .arg("--simulators-index")
        .arg(index)
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
    assert_eq!(v["format"], "plimsoll-trial-verdict/2");
    let s = &v["simulator"];
    let simulator = SimulatorJson {
        name: s["name"].as_str().unwrap().to_owned(),
        version: s["version"].as_str().unwrap().to_owned(),
        sha256: s["sha256"].as_str().unwrap().to_owned(),
        metadata: Metadata::parse(s["metadata"].to_string().as_bytes()).unwrap(),
    };
    assert_eq!(simulator.name, sim);
    assert_eq!(simulator.sha256, sha256(shipped.wasm));
    let t = &v["trials"][0];
    let trajectory = std::fs::read(dir.path().join("trajectory.bin")).unwrap();
    let controller_source = std::fs::read_to_string(&source_path).unwrap();
    assert_eq!(t["fingerprint"], sha256(&trajectory));
    let input = RunInput {
        label: label.to_owned(),
        // No daemon here: the request digest stands for the source and scenario, the result
        // digest for the verdict line; the page shows whatever it is given.
        request_sha256: sha256(format!("{controller_source}\n{standard}").as_bytes()),
        result_sha256: sha256(text.as_bytes()),
        controller_source,
        fingerprint: t["fingerprint"].as_str().unwrap().to_owned(),
        ticks: t["ticks"].as_u64().unwrap(),
        pass: t["pass"].as_bool().unwrap(),
        end_reason: t["end_reason"].as_str().unwrap().to_owned(),
        detail: t["detail"].as_str().map(str::to_owned),
        failed_at_tick: t["failed_at_tick"].as_u64(),
        score: t["score"].as_f64(),
        min_score: t["min_score"].as_f64(),
        final_state: simulator
            .metadata
            .state
            .iter()
            .map(|var| t["final_state"][&var.name].as_f64().unwrap())
            .collect(),
        provider: "host-test (the runner run directly)".to_owned(),
        tier: "process".to_owned(),
        trajectory,
    };
    Run { input, simulator }
}

/// The accepted controller twice and the failing one once, on the case's uid pair.
fn real_input(case: &Case) -> ReportInput {
    let sims = tempfile::tempdir().unwrap();
    let index = write_index(sims.path());
    let run =
        |controller: &str, label: &str| run_trial(case.slot, case.sim, &index, controller, label);
    let accepted = run(case.accepted, case.accepted);
    let repeat = run(case.accepted, &format!("{} (again)", case.accepted));
    let failing = run(case.failing, case.failing);
    assert_eq!(accepted.simulator.sha256, failing.simulator.sha256);
    ReportInput {
        title: format!(
            "Trial report: {} vs {} on {}'s standard.json",
            case.accepted, case.failing, case.sim
        ),
        simulator: accepted.simulator,
        accepted: accepted.input,
        draft: failing.input,
        accepted_repeat_fingerprint: Some(repeat.input.fingerprint),
    }
}

/// Where the pages and screenshots are kept (target/tmp/trial-report/).
fn out_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("trial-report");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The first record where two trajectories of `size`-byte records differ in their first
/// `width` bytes, written again here from docs/trials.md.
fn first_difference(a: &[u8], b: &[u8], size: usize, width: usize) -> Option<usize> {
    let (na, nb) = (a.len() / size, b.len() / size);
    for k in 0..na.min(nb) {
        let r = k * size..k * size + width;
        if a[r.clone()] != b[r] {
            return Some(k);
        }
    }
    (na != nb).then_some(na.min(nb))
}

/// The value of attribute `attr` of the element with id `id`.
fn attribute(page: &str, id: &str, attr: &str) -> String {
    let at = page
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} on the page"));
    let tag = &page[page[..at].rfind('<').unwrap()..];
    let tag = &tag[..tag.find('>').unwrap()];
    let needle = format!(" {attr}=\"");
    let v = &tag[tag
        .find(&needle)
        .unwrap_or_else(|| panic!("#{id} has no {attr}: {tag}"))
        + needle.len()..];
    v[..v.find('"').unwrap()].to_owned()
}

/// The `data-tick` of the element with id `id`.
fn stated_tick(page: &str, id: &str) -> String {
    attribute(page, id, "data-tick")
}

/// The text inside the element with id `id` (up to the next tag).
fn text_of<'a>(page: &'a str, id: &str) -> &'a str {
    let at = page
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} on the page"));
    let rest = &page[at + page[at..].find('>').unwrap() + 1..];
    &rest[..rest.find('<').unwrap()]
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

/// The embedded records of each run, exactly as the trajectory holds them (read with Rust's
/// exact parser, as JavaScript's Number() reads them; serde_json's default float parsing is
/// not exact), `n + m` numbers a record.
fn assert_embeds_the_trajectories(page: &str, input: &ReportInput) {
    let meta = &input.simulator.metadata;
    let (n, m) = (meta.state.len(), meta.action.len());
    let start = page.find("id=\"trajectories\">").unwrap();
    let json = &page[start..start + page[start..].find("</script>").unwrap()];
    let blocks: Vec<&str> = json.split("\"records\":[").skip(1).collect();
    assert_eq!(blocks.len(), 2);
    for (run, block) in [&input.accepted, &input.draft].iter().zip(blocks) {
        let want = decode(&run.trajectory, n, m).unwrap();
        assert_eq!(want.len() as u64, run.ticks);
        let block = &block[..block.find("]]").map_or(0, |e| e + 1)];
        let recs: Vec<&str> = if block.is_empty() {
            Vec::new()
        } else {
            block[1..block.len() - 1].split("],[").collect()
        };
        assert_eq!(recs.len(), want.len(), "{}", run.label);
        for (k, (rec, (state, action))) in recs.iter().zip(&want).enumerate() {
            let nums: Vec<f64> = rec.split(',').map(|t| t.parse().unwrap()).collect();
            assert_eq!(nums.len(), n + m);
            for (got, want) in nums.iter().zip(state.iter().chain(action)) {
                assert_eq!(got.to_bits(), want.to_bits(), "{} tick {k}", run.label);
            }
        }
    }
}

/// What the page says as text, for the real runs of one case.
fn check_text(case: &Case, input: &ReportInput, page: &str) {
    assert_loads_nothing(page);
    let meta = &input.simulator.metadata;
    let (n, m) = (meta.state.len(), meta.action.len());
    let (a, d) = (&input.accepted, &input.draft);
    assert_eq!((a.end_reason.as_str(), a.pass), ("completed", true));
    assert_eq!((d.end_reason.as_str(), d.pass), ("failed", false));
    let detail = d.detail.as_deref().expect("the simulator says why");
    let failed_at = d.failed_at_tick.expect("a failure tick");

    // The simulator, the end, the score.
    assert_eq!(text_of(page, "simulator-name"), case.sim);
    assert_eq!(text_of(page, "simulator-version"), meta.version);
    assert_eq!(text_of(page, "simulator-sha256"), input.simulator.sha256);
    assert_eq!(text_of(page, "end-0"), "completed");
    assert_eq!(text_of(page, "end-1"), "failed");
    assert_eq!(text_of(page, "detail-1"), escape(detail));
    assert!(!page.contains("id=\"detail-0\""));
    assert_eq!(stated_tick(page, "failed-1"), failed_at.to_string());
    let seconds = failed_at as f64 / f64::from(meta.ticks_per_second);
    assert_eq!(
        text_of(page, "failed-1"),
        format!("tick {failed_at} ({seconds} s)")
    );
    assert_eq!(text_of(page, "pass-0"), "pass");
    assert_eq!(text_of(page, "pass-1"), "no pass");
    match &meta.score {
        Some(score) => {
            for (k, run) in [a, d].iter().enumerate() {
                // "1" is a fraction: no unit after the number.
                let unit = match score.unit.as_str() {
                    "" | "1" => String::new(),
                    u => format!(" {u}"),
                };
                assert_eq!(
                    text_of(page, &format!("score-{k}")),
                    format!("{}{unit}", run.score.unwrap())
                );
                assert_eq!(
                    text_of(page, &format!("min-score-{k}")),
                    format!("{}{unit}", run.min_score.unwrap())
                );
            }
            assert!(page.contains(&score.name));
        }
        None => assert!(!page.contains("id=\"score-0\"") && !page.contains("min_score")),
    }

    // One chart per state variable and per action variable, named and with its unit.
    assert_eq!(page.matches("<svg class=\"chart\"").count(), n + m);
    for (kind, vars) in [
        (
            "state",
            meta.state
                .iter()
                .map(|v| (&v.name, &v.unit))
                .collect::<Vec<_>>(),
        ),
        (
            "action",
            meta.action.iter().map(|v| (&v.name, &v.unit)).collect(),
        ),
    ] {
        for (i, (name, unit)) in vars.iter().enumerate() {
            let at = page
                .find(&format!("id=\"chart-{kind}-{i}\" data-kind=\"{kind}\""))
                .unwrap_or_else(|| panic!("no chart of {kind} {name}"));
            let svg = &page[at..at + page[at..].find("</svg>").unwrap()];
            assert!(svg.contains(&format!("<title>{kind} {name} ({unit})</title>")));
            assert_eq!(svg.matches("class=\"cursor\"").count(), 1);
            assert_eq!(svg.matches("<polyline class=\"run run-").count(), 2);
            // Action bounds are drawn.
            assert_eq!(
                svg.matches("class=\"bound\"").count(),
                if kind == "action" { 2 } else { 0 }
            );
        }
    }
    // The cart-pole, and only the cart-pole, keeps its own view.
    assert_eq!(
        page.contains("<canvas id=\"replay\""),
        case.sim == "cartpole"
    );
    assert_eq!(
        page.contains("\"view\":\"cartpole\""),
        case.sim == "cartpole"
    );

    // Fingerprints, digests, badges.
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
    assert_eq!(
        page.matches("yes (checked when this page was made)")
            .count(),
        2
    );
    assert!(page.contains("What this page does not claim"));
    assert!(
        page.contains(">process</span>") && page.contains("host-test (the runner run directly)")
    );
    // The sources, escaped.
    assert!(page.contains(&escape(&a.controller_source)));
    assert!(page.contains(&escape(&d.controller_source)));
    assert!(page.contains("&quot;use strict&quot;;"));

    // The divergence, computed here from the bytes.
    let size = record_bytes(n, m);
    let record = first_difference(&a.trajectory, &d.trajectory, size, size).unwrap();
    let state = first_difference(&a.trajectory, &d.trajectory, size, 8 * n).unwrap();
    assert_eq!(stated_tick(page, "divergence"), record.to_string());
    assert_eq!(stated_tick(page, "state-divergence"), state.to_string());
    assert!(record <= state);

    assert_embeds_the_trajectories(page, input);
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

/// A number as the page's readout shows it (six significant digits), or None for "–".
fn readout(dom: &str, id: &str) -> Option<f64> {
    let t = text_of(dom, id);
    (t != "\u{2013}").then(|| {
        t.parse()
            .unwrap_or_else(|e| panic!("#{id} reads {t:?}: {e}"))
    })
}

fn close(got: f64, want: f64) -> bool {
    (got - want).abs() <= 1e-5 * want.abs().max(1e-300)
}

/// What the page shows once Chromium has run its script for 3 s of virtual time.
fn check_in_chromium(case: &Case, input: &ReportInput, page: &Path) {
    let meta = &input.simulator.metadata;
    let (n, m) = (meta.state.len(), meta.action.len());
    let started = Instant::now();
    let out = chromium(
        page,
        &["--virtual-time-budget=3000".into(), "--dump-dom".into()],
    );
    let dom = String::from_utf8(out.stdout).unwrap();
    let head = &dom[..dom.len().min(2000)];
    assert!(dom.contains("id=\"readout\""), "the page rendered: {head}");
    assert!(
        dom.contains("<body data-errors=\"\">"),
        "no JavaScript error: {head}"
    );
    let tick: u64 = stated_tick(&dom, "tick").parse().unwrap();
    assert!(tick > 0, "the replay advanced: tick {tick}");
    let title = &dom[dom.find("<title>").unwrap() + 7..dom.find("</title>").unwrap()];
    assert_eq!(title, format!("tick {tick} - plimsoll trial report"));

    // One chart per variable, each with its cursor moved to the tick.
    let last = input.accepted.ticks.max(input.draft.ticks);
    assert_eq!(dom.matches("<svg class=\"chart\"").count(), n + m);
    for id in (0..n)
        .map(|i| format!("chart-state-{i}"))
        .chain((0..m).map(|j| format!("chart-action-{j}")))
    {
        let at = dom
            .find(&format!("id=\"{id}\""))
            .unwrap_or_else(|| panic!("no #{id} in the DOM"));
        let svg = &dom[at..at + dom[at..].find("</svg>").unwrap()];
        let cursor = &svg[svg.find("<line class=\"cursor\"").unwrap()..];
        let cursor = &cursor[..cursor.find('>').unwrap()];
        let get = |attr: &str| -> f64 {
            let v = &cursor[cursor.find(&format!(" {attr}=\"")).unwrap() + attr.len() + 3..];
            v[..v.find('"').unwrap()].parse().unwrap()
        };
        let want = get("data-left") + get("data-width") * tick as f64 / last as f64;
        assert!(
            (get("x1") - want).abs() < 1e-6 && get("x2") == get("x1"),
            "#{id}'s cursor is at tick {tick}: {cursor}"
        );
    }

    // The readout holds each run's values at the tick: its record, or after its last one its
    // final state and no action.
    for (r, run) in [&input.accepted, &input.draft].iter().enumerate() {
        let records = decode(&run.trajectory, n, m).unwrap();
        let status = text_of(&dom, &format!("status-{r}"));
        let (state, action): (&[f64], Option<&[f64]>) = match records.get(tick as usize) {
            Some((s, a)) => {
                assert_eq!(status, "running");
                (s.as_slice(), Some(a.as_slice()))
            }
            None => {
                assert_eq!(
                    status,
                    format!("{} after tick {}", run.end_reason, run.ticks)
                );
                (run.final_state.as_slice(), None)
            }
        };
        for (j, want) in state.iter().enumerate() {
            let got = readout(&dom, &format!("v-{r}-{j}")).unwrap();
            assert!(
                close(got, *want),
                "{} state {j}: {got} vs {want}",
                run.label
            );
        }
        for j in 0..m {
            let got = readout(&dom, &format!("v-{r}-{}", n + j));
            match action {
                Some(a) => assert!(close(got.unwrap(), a[j]), "{} action {j}", run.label),
                None => assert_eq!(got, None),
            }
        }
    }
    let dump_s = started.elapsed().as_secs_f64();

    let shot = out_dir().join(format!("{}.png", case.sim));
    let _ = std::fs::remove_file(&shot);
    let started = Instant::now();
    chromium(
        page,
        &[
            "--virtual-time-budget=3000".into(),
            "--window-size=1200,1300".into(),
            format!("--screenshot={}", shot.display()),
        ],
    );
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000,
        "a screenshot"
    );
    eprintln!(
        "{}: report {} (tick {tick} after 3 s of virtual time); screenshot {} ({} bytes); chromium --dump-dom {dump_s:.1} s, --screenshot {:.1} s",
        case.sim,
        page.display(),
        shot.display(),
        png.len(),
        started.elapsed().as_secs_f64()
    );
}

/// The whole check of one shipped simulator's report: real runs, the text, the browser.
fn the_report_of(case: &Case, test: &str) {
    if !can_run(test, true, &[NODE]) {
        return;
    }
    let input = real_input(case);
    let page = out_dir().join(format!("{}.html", case.sim));
    let html = report::render(&input);
    std::fs::write(&page, &html).unwrap();
    check_text(case, &input, &html);
    if !can_run(test, false, &[CHROMIUM, "/usr/bin/timeout"]) {
        return;
    }
    check_in_chromium(case, &input, &page);
}

#[test]
fn the_cartpole_report_replays_in_headless_chromium() {
    the_report_of(
        &CARTPOLE,
        "the_cartpole_report_replays_in_headless_chromium",
    );
}

#[test]
fn the_tank_report_replays_in_headless_chromium() {
    the_report_of(&TANK, "the_tank_report_replays_in_headless_chromium");
}

#[test]
fn the_motor_report_replays_in_headless_chromium() {
    the_report_of(&MOTOR, "the_motor_report_replays_in_headless_chromium");
}

/// A metadata of two state variables and two actions, with `text` in every free string, and
/// bounds no checked metadata has.
fn metadata(name: &str, text: &str) -> Metadata {
    let var = |name: &str| Variable {
        name: name.to_owned(),
        unit: text.to_owned(),
    };
    let action = |name: &str, min, max| ActionVariable {
        name: name.to_owned(),
        unit: text.to_owned(),
        min,
        max,
    };
    Metadata {
        abi: 1,
        name: name.to_owned(),
        version: text.to_owned(),
        description: Some(text.to_owned()),
        ticks_per_second: 50,
        state: vec![var(text), var("b")],
        action: vec![
            action(text, -1.0, 1.0),
            action("d", f64::NEG_INFINITY, f64::NAN),
        ],
        initial: vec![var(text)],
        score: Some(var(text)),
    }
}

/// A run of a simulator of 2 states and 2 actions, one record per action pair.
fn synthetic_run(label: &str, text: &str, actions: &[[f64; 2]]) -> RunInput {
    let t: Vec<u8> = actions
        .iter()
        .flat_map(|a| encode(&[0.0, 0.5], a))
        .collect();
    RunInput {
        label: label.to_owned(),
        controller_source: format!("// {text}\nconsole.log(0);\n"),
        fingerprint: sha256(&t),
        ticks: actions.len() as u64,
        pass: false,
        end_reason: text.to_owned(),
        detail: Some(text.to_owned()),
        failed_at_tick: Some(actions.len() as u64),
        score: Some(0.5),
        min_score: Some(0.75),
        final_state: vec![1.0, 2.0],
        provider: text.to_owned(),
        tier: "<b>vm</b>".to_owned(),
        request_sha256: "\"><script>alert(3)</script>".to_owned(),
        result_sha256: "r".to_owned(),
        trajectory: t,
    }
}

#[test]
fn untrusted_strings_stay_inert() {
    // Every string the page shows is someone else's: the controller's, the daemon's, the
    // exam author's metadata (given here unchecked, names too).
    let hostile = "</script><script>alert(1)</script><img src=x onerror=alert(2)>";
    let input = ReportInput {
        title: format!("title {hostile}"),
        simulator: SimulatorJson {
            name: hostile.to_owned(),
            version: hostile.to_owned(),
            sha256: hostile.to_owned(),
            metadata: metadata(hostile, hostile),
        },
        accepted: synthetic_run(
            &format!("a {hostile}"),
            hostile,
            &[[1.0, 0.0], [2.0, 0.0], [3.0, 0.0]],
        ),
        // Then answers no runner records: the page still renders, and ends.
        draft: synthetic_run(
            "d'\"&",
            hostile,
            &[
                [1.0, 0.0],
                [2.0, 0.0],
                [3.0, 0.0],
                [4.0, 0.0],
                [f64::NAN, f64::INFINITY],
                [1e308, -1e308],
            ],
        ),
        accepted_repeat_fingerprint: Some(hostile.to_owned()),
    };
    let page = report::render(&input);
    assert_loads_nothing(&page);
    assert!(!page.contains("alert(1)</script>") && !page.contains("<img"));
    assert!(!page.contains("<b>vm</b>"));
    assert!(page.contains("// &lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x"));
    assert!(page.contains("d&#39;&quot;&amp;"));
    // The script's data holds numbers and fixed strings only.
    let start = page.find("id=\"trajectories\">").unwrap();
    let json = &page[start..start + page[start..].find("</script>").unwrap()];
    assert!(!json.contains("alert") && !json.contains('<'));
    // Charts by index, not by the (untrusted) name.
    for id in [
        "chart-state-0",
        "chart-state-1",
        "chart-action-0",
        "chart-action-1",
    ] {
        assert!(page.contains(&format!("id=\"{id}\"")), "{id}");
    }
    // A prefix: identical records, then the draft goes on; the page says so.
    assert_eq!(stated_tick(&page, "divergence"), "3");
    assert_eq!(stated_tick(&page, "state-divergence"), "3");
    assert_eq!(
        page.matches("<span class=\"badge differs\">differs</span>")
            .count(),
        4
    );
    let path = out_dir().join("untrusted.html");
    std::fs::write(&path, &page).unwrap();

    // And in a browser: the hostile text is text, the wild numbers break no script.
    let test = "untrusted_strings_stay_inert";
    if !can_run(test, false, &[CHROMIUM, "/usr/bin/timeout"]) {
        return;
    }
    let out = chromium(
        &path,
        &["--virtual-time-budget=1000".into(), "--dump-dom".into()],
    );
    let dom = String::from_utf8(out.stdout).unwrap();
    assert!(
        dom.contains("<body data-errors=\"\">"),
        "no JavaScript error: {}",
        &dom[..dom.len().min(2000)]
    );
    assert!(!dom.contains("<img") && dom.contains("&lt;img src=x onerror=alert(2)&gt;"));
    // The replay ran to the draft's last tick, and shows its final state.
    assert_eq!(stated_tick(&dom, "tick"), "6");
    assert_eq!(readout(&dom, "v-1-1"), Some(2.0));
}

#[test]
fn the_cartpole_view_is_chosen_by_the_simulator_name_and_its_state() {
    let cartpole = Metadata::parse(
        br#"{"abi":1,"name":"cartpole","version":"1","ticks_per_second":100,
        "state":[{"name":"x","unit":"m"},{"name":"x_dot","unit":"m/s"},{"name":"theta","unit":"rad"},{"name":"theta_dot","unit":"rad/s"}],
        "action":[{"name":"force","unit":"N","min":-10,"max":10}]}"#,
    )
    .unwrap();
    let run = |t: Vec<u8>| RunInput {
        fingerprint: sha256(&t),
        ticks: 1,
        pass: true,
        end_reason: "completed".into(),
        detail: None,
        failed_at_tick: None,
        score: None,
        min_score: None,
        final_state: Vec::new(),
        label: "r".into(),
        controller_source: String::new(),
        provider: "p".into(),
        tier: "process".into(),
        request_sha256: "q".into(),
        result_sha256: "r".into(),
        trajectory: t,
    };
    let page = |metadata: Metadata| {
        let t = encode(&vec![0.0; metadata.state.len()], &[1.0]);
        report::render(&ReportInput {
            title: "t".into(),
            simulator: SimulatorJson {
                name: metadata.name.clone(),
                version: "1".into(),
                sha256: "s".into(),
                metadata,
            },
            accepted: run(t.clone()),
            draft: run(t),
            accepted_repeat_fingerprint: None,
        })
    };
    let canvas = "<canvas id=\"replay\"";
    assert!(page(cartpole.clone()).contains(canvas));
    // Another simulator with the same state names, or a cart-pole with other ones: charts only.
    let mut other = cartpole.clone();
    other.name = "pendulum".into();
    assert!(!page(other).contains(canvas));
    let mut renamed = cartpole;
    renamed.state[2].name = "angle".into();
    let renamed = page(renamed);
    assert!(!renamed.contains(canvas) && renamed.contains("\"view\":null"));
    // No score declared, none given: no score rows.
    assert!(!renamed.contains("id=\"score-0\""));
}
