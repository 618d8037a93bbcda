//! Images through the engine with real providers (docs/images.md): a request names an image
//! by name or identity and is served by it or refused, nothing run; the record names the
//! image that ran; the process tier has none; `python-data` (a second shipped image) runs
//! pandas and matplotlib at crun, runsc and qemu, and keeps an import across a session's
//! cells. Needs root, the runtimes and `make images vm-assets` (skipped without, failed under
//! CI=true).

use std::path::PathBuf;

use plimsoll_engine::{Engine, Reason, RunError, SessionCallKind, Settings, not_dispatched_reason};
use plimsoll_testing::{TestDir, is_root, skip_or_fail};
use plimsoll_wire::digest::record_sha256;
use plimsoll_wire::{
    Bytes, Language, Limits, PROTOCOL, ProjectFile, RunRequest, RunResponse, RunSpec,
    SessionOpenRequest, Tier,
};

const CALLER: &str = "images";

/// The repository's image store, `build/images`.
fn store() -> PathBuf {
    plimsoll_engine::settings::default_image_dir()
        .parent()
        .expect("the image store")
        .to_owned()
}

fn identity_of(name: &str) -> Option<String> {
    std::fs::read_to_string(store().join(name).join("identity"))
        .ok()
        .map(|i| i.trim().to_owned())
}

/// An engine offering `providers`, probed, whose store is the repository's; `None` (after
/// the skip or the failure) when the host cannot run them or `needs` images are missing.
fn engine(test: &str, slot: u32, providers: &[&str], needs: &[&str]) -> Option<(Engine, TestDir)> {
    engine_with(test, slot, providers, needs, "[pools]\n")
}

/// [`engine`] with `pools` as its `[pools]` settings.
fn engine_with(
    test: &str,
    slot: u32,
    providers: &[&str],
    needs: &[&str],
    pools: &str,
) -> Option<(Engine, TestDir)> {
    if !is_root() {
        skip_or_fail(test, "needs root to run sandboxes");
        return None;
    }
    for name in needs {
        if identity_of(name).is_none() {
            skip_or_fail(
                test,
                &format!(
                    "no image {name} in {}: run `make images`",
                    store().display()
                ),
            );
            return None;
        }
    }
    for (tool, package) in [
        ("plimsoll-probe", "plimsoll-probe"),
        ("plimsoll-agent", "plimsoll-agent"),
        ("plimsoll-guest-init", "plimsoll-guest-init"),
    ] {
        plimsoll_testing::tool_binary(tool, package).unwrap_or_else(|e| panic!("{e}"));
    }
    let dir = TestDir::new("images", test);
    let list = providers
        .iter()
        .map(|p| format!("{p:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    let toml = format!(
        "providers = [{list}]\ndefault_floor = \"process\"\nstate_dir = {state:?}\n\
         sandbox_uid_base = {uid}\nmax_concurrent = 2\nmax_per_caller = 2\n{pools}\
         [sessions]\nmax_total = 1\nmax_per_caller = 1\n\
         [oci]\nstate_root = {oci:?}\ncgroup_parent = \"/plimsoll-images-{pid}-{slot}\"\n",
        state = dir.path().join("state").display().to_string(),
        oci = dir.path().join("oci").display().to_string(),
        uid = 3_700_000 + slot * 1_000,
        pid = std::process::id(),
    );
    let engine = Settings::parse(&toml)
        .unwrap_or_else(|e| panic!("{e}"))
        .build_engine(&[])
        .unwrap_or_else(|e| panic!("{e}"));
    engine.probe_all();
    for p in engine.providers() {
        if !p.available {
            skip_or_fail(
                test,
                &format!(
                    "{} is not available here: {}",
                    p.name,
                    p.unavailable_reason.unwrap_or_default()
                ),
            );
            return None;
        }
    }
    Some((engine, dir))
}

fn request(id: &str, image: Option<&str>, provider: Option<&str>, run: RunSpec) -> RunRequest {
    RunRequest {
        protocol: PROTOCOL,
        request_id: id.into(),
        minimum_isolation: Some(Tier::Process),
        provider: provider.map(str::to_owned),
        limits: Some(Limits {
            timeout_ms: Some(120_000),
            memory_bytes: Some(512 << 20),
            ..Limits::default()
        }),
        run,
        grant: None,
        image: image.map(str::to_owned),
    }
}

fn stdout(r: &RunResponse) -> String {
    String::from_utf8_lossy(r.result.stdout.as_slice()).into_owned()
}

fn explain(r: &RunResponse) -> String {
    format!(
        "exit {:?} signal {:?}\nstdout: {}\nstderr: {}",
        r.result.exit_code,
        r.result.signal,
        stdout(r),
        String::from_utf8_lossy(r.result.stderr.as_slice())
    )
}

/// The record names `name` and its identity, under a digest that covers them.
fn ran_in(r: &RunResponse, name: &str) {
    let image = r
        .record
        .image
        .as_ref()
        .unwrap_or_else(|| panic!("no image on the record: {r:?}"));
    assert_eq!(image.name, name);
    assert_eq!(Some(image.identity.clone()), identity_of(name));
    assert_eq!(r.record.environment, image.identity);
    assert_eq!(r.record.record_sha256, record_sha256(&r.record));
}

fn refusal(e: RunError) -> (Reason, String) {
    let reason = not_dispatched_reason(&e).unwrap_or_else(|| panic!("not a refusal: {e}"));
    (reason, e.to_string())
}

#[test]
fn a_named_image_is_served_by_it_or_refused_with_the_list() {
    let test = "named_or_refused";
    let Some((engine, _dir)) = engine(test, 0, &["process", "crun"], &["sandbox"]) else {
        return;
    };
    let sandbox = identity_of("sandbox").expect("the default image");
    let py = || plimsoll_testing::py("print(6*7)");
    // By name, by identity, and by default: the sandbox image, said on the record.
    for (id, image) in [
        ("by-name", Some("sandbox")),
        ("by-identity", Some(sandbox.as_str())),
        ("default", None),
    ] {
        let r = engine
            .run(CALLER, &request(id, image, Some("crun"), py()))
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        assert_eq!(stdout(&r), "42\n", "{}", explain(&r));
        ran_in(&r, "sandbox");
    }
    // An image the daemon does not have: refused before routing, naming what it has.
    for missing in ["no-such-image", &format!("sha256:{}", "0".repeat(64))] {
        let (reason, message) = refusal(
            engine
                .run(CALLER, &request("missing", Some(missing), None, py()))
                .unwrap_err(),
        );
        assert_eq!(reason, Reason::Environment, "{message}");
        assert!(
            message.contains(&format!("no image `{missing}`"))
                && message.contains(&format!("sandbox ({sandbox})")),
            "{message}"
        );
        assert_eq!(engine.in_flight(), 0);
    }
    // A malformed one is the request's fault.
    let (reason, _) = refusal(
        engine
            .run(CALLER, &request("bad", Some("Not An Image"), None, py()))
            .unwrap_err(),
    );
    assert_eq!(reason, Reason::Request);
    // The process tier has no image: named there, refused; unnamed, it goes elsewhere.
    let (reason, message) = refusal(
        engine
            .run(
                CALLER,
                &request("process", Some("sandbox"), Some("process"), py()),
            )
            .unwrap_err(),
    );
    assert_eq!(reason, Reason::Unsupported, "{message}");
    assert!(
        message.contains("the process tier has no image"),
        "{message}"
    );
    let r = engine
        .run(CALLER, &request("routed", Some("sandbox"), None, py()))
        .unwrap();
    assert_eq!(
        r.provider, "crun",
        "the process tier cannot serve a named image"
    );
    ran_in(&r, "sandbox");
    // Naming none at the process tier: no image on the record, the engine's version as
    // its environment.
    let r = engine
        .run(
            CALLER,
            &request("process-plain", None, Some("process"), py()),
        )
        .unwrap();
    assert!(r.record.image.is_none(), "{:?}", r.record);
    assert!(r.record.environment.starts_with("plimsoll-engine/"));
    // The listing names the images and which one is the default.
    let images = engine.providers_response().images;
    let listed = images
        .iter()
        .find(|i| i.name == "sandbox")
        .expect("sandbox listed");
    assert!(listed.default && listed.identity == sandbox);
    assert_eq!(listed.languages, [Language::Python, Language::Javascript]);
}

/// An agent's usual data script: a CSV sent as a file, `describe()` printed, a matplotlib
/// PNG returned as an artifact.
fn data_project() -> RunSpec {
    let csv = "city,temp\nOslo,4.5\nLima,19.0\nCairo,28.25\nQuito,14.0\n";
    let script = "import pandas as pd, matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n\
                  df = pd.read_csv('data.csv')\nprint(df.describe())\n\
                  df.plot(x='city', y='temp', kind='bar')\nplt.savefig('plot.png')\n";
    plimsoll_testing::project(
        vec![
            ProjectFile {
                path: "data.csv".into(),
                content: Bytes(csv.as_bytes().to_vec()),
                executable: false,
            },
            ProjectFile {
                path: "analyse.py".into(),
                content: Bytes(script.as_bytes().to_vec()),
                executable: false,
            },
        ],
        &["python3 analyse.py"],
        &["plot.png"],
    )
}

fn python_data_at(provider: &'static str, slot: u32) {
    let test = format!("python_data_at_{provider}");
    let Some((engine, _dir)) = engine(&test, slot, &[provider], &["sandbox", "python-data"]) else {
        return;
    };
    let r = engine
        .run(
            CALLER,
            &request("data", Some("python-data"), None, data_project()),
        )
        .unwrap_or_else(|e| panic!("{provider}: {e}"));
    assert_eq!(r.provider, provider);
    assert_eq!(r.result.exit_code, Some(0), "{}", explain(&r));
    let out = stdout(&r);
    // describe() of the four temperatures: count 4, mean 16.4375, max 28.25.
    assert!(
        out.contains("count")
            && out.contains("4.000000")
            && out.contains("16.437500")
            && out.contains("28.250000"),
        "{out}"
    );
    let png = &r.result.artifacts[0];
    assert!(
        png.found && png.content.as_slice().starts_with(b"\x89PNG\r\n\x1a\n"),
        "{png:?}"
    );
    ran_in(&r, "python-data");
    // The default image has no pandas: the same import fails cleanly there, as a result.
    let r = engine
        .run(
            CALLER,
            &request("plain", None, None, plimsoll_testing::py("import pandas")),
        )
        .unwrap();
    assert_eq!(r.result.exit_code, Some(1), "{}", explain(&r));
    assert!(
        String::from_utf8_lossy(r.result.stderr.as_slice()).contains("No module named 'pandas'"),
        "{}",
        explain(&r)
    );
    ran_in(&r, "sandbox");
}

#[test]
fn python_data_runs_pandas_and_matplotlib_at_crun() {
    python_data_at("crun", 1);
}

#[test]
fn python_data_runs_pandas_and_matplotlib_at_runsc() {
    python_data_at("runsc", 2);
}

#[test]
fn python_data_runs_pandas_and_matplotlib_at_qemu() {
    python_data_at("qemu", 3);
}

#[test]
fn a_session_in_python_data_keeps_pandas_across_cells() {
    let test = "session_python_data";
    let Some((engine, _dir)) = engine(test, 4, &["crun"], &["sandbox", "python-data"]) else {
        return;
    };
    let open = |id: &str, image: Option<&str>| SessionOpenRequest {
        protocol: PROTOCOL,
        request_id: id.into(),
        language: Language::Python,
        minimum_isolation: None,
        provider: None,
        grant: None,
        limits: None,
        idle_timeout_ms: None,
        max_lifetime_ms: None,
        image: image.map(str::to_owned),
    };
    // An image the daemon does not have: nothing opens.
    let (reason, message) = refusal(
        engine
            .open_session(CALLER, &open("o0", Some("gone")))
            .unwrap_err(),
    );
    assert_eq!(reason, Reason::Environment, "{message}");
    let info = engine
        .open_session(CALLER, &open("o1", Some("python-data")))
        .unwrap_or_else(|e| panic!("{e}"));
    let image = info.image.clone().expect("the session names its image");
    assert_eq!(image.name, "python-data");
    assert_eq!(info.environment, image.identity);
    let cell = |id: &str, code: &str, image: Option<&str>| {
        // A call's memory is the session's, fixed at open: none asked for here.
        let req = RunRequest {
            limits: None,
            ..request(id, image, None, plimsoll_testing::py(code))
        };
        engine.session_call(
            CALLER,
            &info.session_id,
            &req,
            SessionCallKind::Cell { restart: false },
            &mut |_| {},
        )
    };
    let r = cell("c1", "import pandas as pd", None).unwrap();
    assert_eq!(r.result.exit_code, Some(0), "{}", explain(&r));
    let r = cell(
        "c2",
        "print(pd.Series([1, 2, 3]).sum())",
        Some("python-data"),
    )
    .unwrap();
    assert_eq!(stdout(&r), "6\n", "{}", explain(&r));
    assert_eq!(r.record.image.as_ref(), Some(&image));
    // A call naming another image is refused; the session goes on.
    let (reason, message) = refusal(cell("c3", "print(1)", Some("sandbox")).unwrap_err());
    assert_eq!(reason, Reason::Environment, "{message}");
    let r = cell("c4", "print(pd.__version__ > '1')", None).unwrap();
    assert_eq!(stdout(&r), "True\n", "{}", explain(&r));
    // While the session is open its image is in use (what `plimsoll image rm` refuses on);
    // once it is closed, no longer.
    let data = plimsoll_image::ImageStore::new(store(), "sandbox".into())
        .read("python-data")
        .unwrap();
    assert!(!plimsoll_image::processes_using(&data).is_empty());
    engine
        .close_session(CALLER, &info.session_id, None)
        .unwrap();
    let start = std::time::Instant::now();
    while !plimsoll_image::processes_using(&data).is_empty() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "still in use after the close: {:?}",
            plimsoll_image::processes_using(&data)
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Removes a test's image from the store when the test ends, however it ends.
struct Imported(PathBuf);

impl Drop for Imported {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn an_imported_oci_archive_runs_python_at_every_provider_naming_it() {
    let test = "imported";
    let providers = ["crun", "runc", "runsc", "qemu"];
    let Some((engine, dir)) = engine(test, 5, &providers, &["sandbox"]) else {
        return;
    };
    // An OCI archive built here from a root file system that has Python (the sandbox
    // image's), as an image built elsewhere would come; imported under a name of its own.
    let archive = dir.path().join("from-elsewhere.oci.tar");
    plimsoll_image::testing::oci_archive_from_rootfs(&store().join("sandbox/rootfs"), &archive)
        .unwrap_or_else(|e| panic!("{e}"));
    let name = format!("test-imported-{}", std::process::id());
    let image_store = plimsoll_image::ImageStore::new(store(), "sandbox".into());
    let _cleanup = Imported(store().join(&name));
    let imported = plimsoll_image::import(
        &plimsoll_image::Source {
            path: archive,
            image: None,
        },
        &name,
        &image_store,
        &plimsoll_image::Limits::default(),
        &mut |line| eprintln!("{test}: {line}"),
    )
    .unwrap_or_else(|e| panic!("{}", plimsoll_engine::error_chain(&e)));
    let script = plimsoll_testing::workspace_root().join("scripts/make-image-disk");
    plimsoll_image::make_vm_disk(&imported.image, &script).unwrap_or_else(|e| panic!("{e}"));
    let identity = imported.image.identity.clone();
    // Listed with its identity.
    let listed = engine.providers_response().images;
    assert!(
        listed
            .iter()
            .any(|i| i.name == name && i.identity == identity && i.vm_disk),
        "{listed:?}"
    );
    for provider in providers {
        for selector in [name.as_str(), identity.as_str()] {
            let r = engine
                .run(
                    CALLER,
                    &request(
                        "imported",
                        Some(selector),
                        Some(provider),
                        plimsoll_testing::py("import sys; print(sys.version_info[0])"),
                    ),
                )
                .unwrap_or_else(|e| panic!("{provider}: {e}"));
            assert_eq!(stdout(&r), "3\n", "{provider}: {}", explain(&r));
            let image = r.record.image.as_ref().expect("the record names the image");
            assert_eq!(
                (image.name.as_str(), image.identity.as_str()),
                (name.as_str(), identity.as_str())
            );
            assert_eq!(r.record.record_sha256, record_sha256(&r.record));
        }
    }
}

#[test]
fn each_image_kept_warm_has_members_of_its_own() {
    let test = "warm_per_image";
    let pools = "[pools.crun.python]\nmin_idle = 1\nmax_members = 1\nimages = [\"sandbox\", \"python-data\"]\n";
    let Some((engine, _dir)) = engine_with(test, 6, &["crun"], &["sandbox", "python-data"], pools)
    else {
        return;
    };
    engine.start_pools();
    let filled = |engine: &Engine| {
        let start = std::time::Instant::now();
        while engine.pools_idle().iter().any(|(_, _, n)| *n == 0) {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(120),
                "the pools did not fill: {:?}",
                engine.pool_counts()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    filled(&engine);
    assert_eq!(engine.pools_idle().len(), 2, "{:?}", engine.pools_idle());
    // Each run claims a member of its own image: pandas in python-data's, not in the
    // default image's, and each record names the image.
    let plain = |image: Option<&str>, code: &str| RunRequest {
        limits: None,
        ..request("warm", image, Some("crun"), plimsoll_testing::py(code))
    };
    for round in 0..2 {
        let r = engine
            .run(
                CALLER,
                &plain(
                    Some("python-data"),
                    "import pandas; print(pandas.Series([2, 3]).sum())",
                ),
            )
            .unwrap();
        assert_eq!(stdout(&r), "5\n", "round {round}: {}", explain(&r));
        assert_eq!(
            r.result.start,
            Some(plimsoll_wire::Start::Warm),
            "round {round}"
        );
        ran_in(&r, "python-data");
        let r = engine
            .run(
                CALLER,
                &plain(
                    None,
                    "import importlib.util as u; print(u.find_spec('pandas') is None)",
                ),
            )
            .unwrap();
        assert_eq!(stdout(&r), "True\n", "round {round}: {}", explain(&r));
        assert_eq!(
            r.result.start,
            Some(plimsoll_wire::Start::Warm),
            "round {round}"
        );
        ran_in(&r, "sandbox");
        filled(&engine);
    }
    engine.stop_pools();
}

#[test]
fn a_trial_runs_in_python_data_with_the_fingerprint_it_has_in_the_default_image() {
    let test = "trial_python_data";
    plimsoll_testing::tool_binary("plimsoll-trial-runner", "plimsoll-trial")
        .unwrap_or_else(|e| panic!("{e}"));
    let Some((engine, _dir)) = engine(test, 7, &["crun"], &["sandbox", "python-data"]) else {
        return;
    };
    let file = |path: &str| {
        let p = plimsoll_testing::workspace_root().join(path);
        ProjectFile {
            path: p.file_name().unwrap().to_string_lossy().into_owned(),
            content: Bytes(std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))),
            executable: false,
        }
    };
    // The accepted Python controller on the standard scenario: the oracle's fingerprint
    // (docs/trials.md) in both images, so the runner's simulation does not depend on the
    // image; each record names its image.
    let trial = plimsoll_testing::project(
        vec![
            file("examples/controllers/accepted.py"),
            file("sims/cartpole/scenarios/standard.json"),
        ],
        &[
            "plimsoll-trial-runner --simulator cartpole --scenario standard.json --first-deadline-ms 20000 --tick-deadline-ms 5000 -- python3 accepted.py",
        ],
        &["trajectory.bin"],
    );
    for image in ["python-data", "sandbox"] {
        let r = engine
            .run(CALLER, &request("trial", Some(image), None, trial.clone()))
            .unwrap_or_else(|e| panic!("{image}: {e}"));
        assert_eq!(r.result.exit_code, Some(0), "{image}: {}", explain(&r));
        let a = &r.result.artifacts[0];
        assert!(a.found && !a.truncated, "{a:?}");
        assert_eq!(
            plimsoll_wire::digest::sha256_hex(a.content.as_slice()),
            "93585277088f4cfbd7683a2db52ab4a44906d74c74468ab9a49d4ddc8e959d41",
            "{image}"
        );
        ran_in(&r, image);
        // The record states the verdict: the image's cart-pole, how the trial ended, its
        // fingerprint.
        let [t] = r.record.trials.as_slice() else {
            panic!(
                "{image}: one trial step in the record: {:?}",
                r.record.trials
            );
        };
        assert_eq!((t.step, t.pass), (0, true), "{image}");
        assert_eq!(t.simulator.name, "cartpole");
        assert_eq!(
            t.simulator.sha256,
            plimsoll_wire::digest::sha256_hex(plimsoll_sims::get("cartpole").unwrap().wasm)
        );
        assert_eq!(t.trials.len(), 1);
        assert_eq!(t.trials[0].end, plimsoll_wire::TrialEnd::Completed);
        assert_eq!(t.trials[0].scenario.as_deref(), Some("standard"));
        assert_eq!(
            t.trials[0].fingerprint,
            plimsoll_wire::digest::sha256_hex(a.content.as_slice())
        );
    }

    // A trial step naming a simulator the image does not carry is refused before anything
    // runs, naming what the image has.
    let mut other = trial.clone();
    if let plimsoll_wire::RunSpec::Project(p) = &mut other {
        p.steps[0].run = p.steps[0]
            .run
            .replace("--simulator cartpole", "--simulator boat");
    }
    let e = engine
        .run(CALLER, &request("boat", Some("python-data"), None, other))
        .unwrap_err();
    let resp = e.to_response();
    assert_eq!(
        resp.error.not_dispatched,
        Some(plimsoll_wire::Reason::Environment),
        "{resp:?}"
    );
    assert!(
        resp.error
            .message
            .contains("declares no simulator boat (it has: cartpole, tank, motor)"),
        "{}",
        resp.error.message
    );
}
