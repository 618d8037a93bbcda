//! The serving side of the split without root: a process running as an unprivileged uid,
//! with no capability and no_new_privs, builds its engine through a launcher that runs as
//! root and runs code at crun through it (docs/privileges.md, "The launcher"). The test binary
//! runs itself again as that uid (`PLIMSOLL_LAUNCH_CHILD` naming the directory with the
//! settings and the launcher's socket); the copy says what it ran and what its own
//! `/proc/self/status` shows.

use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::sync::Arc;

use plimsoll_engine::Settings;
use plimsoll_env as env;
use plimsoll_sandbox::{PreExec, Spawn, Step};
use plimsoll_testing::{TestDir, is_root, skip_or_fail};
use plimsoll_wire::{Language, PROTOCOL, RunRequest, RunSpec, Snippet};

/// The uid the serving copy runs as: no sandbox's, no user's.
const SERVING_UID: u32 = 4_199_000;
const UID_BASE: u32 = 4_200_000;

fn settings_text(state: &std::path::Path) -> String {
    let image = plimsoll_engine::settings::default_image_dir();
    format!(
        "providers = [\"crun\"]\ndefault_floor = \"process\"\nstate_dir = {state:?}\n\
         sandbox_uid_base = {UID_BASE}\nmax_concurrent = 2\n[oci]\nimage = {image:?}\n\
         state_root = {oci:?}\ncgroup_parent = \"/plimsoll-launch-test-{pid}\"\n[pools]\n",
        state = state.display().to_string(),
        image = image.display().to_string(),
        oci = state.join("oci").display().to_string(),
        pid = std::process::id(),
    )
}

/// The copy's side: only when the variable is set. Prints one JSON line.
fn serving_child() {
    let Some(dir) = env::get(env::PLIMSOLL_LAUNCH_CHILD) else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let text = std::fs::read_to_string(dir.join("settings.toml")).expect("the settings");
    let engine = Settings::parse(&text)
        .expect("settings")
        .build_engine_through(&dir.join("launch.sock"))
        .expect("the engine through the launcher");
    engine.probe_all();
    let req = RunRequest {
        image: None,
        protocol: PROTOCOL,
        request_id: "unprivileged-serving".into(),
        minimum_isolation: None,
        provider: Some("crun".into()),
        limits: None,
        run: RunSpec::Snippet(Snippet {
            language: Language::Python,
            code: "import os; print('ran as', os.getuid())".into(),
        }),
        grant: None,
    };
    let ran = engine.run("tester", &req);
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.split_whitespace().next().unwrap_or("").to_owned())
            .unwrap_or_default()
    };
    let out = serde_json::json!({
        "stdout": ran.as_ref().map(|r| r.result.stdout.to_string_lossy()).map_err(|e| e.to_string()),
        "uid": field("Uid:"),
        "cap_eff": field("CapEff:"),
        "cap_prm": field("CapPrm:"),
        "no_new_privs": field("NoNewPrivs:"),
    });
    println!("SERVING {out}");
    std::process::exit(0);
}

/// The copy's entry point: a no-op in the normal run.
#[test]
fn serving_entry() {
    serving_child();
}

#[test]
fn an_unprivileged_process_runs_code_through_the_launcher() {
    let test = "an_unprivileged_process_runs_code_through_the_launcher";
    if !is_root() {
        skip_or_fail(test, "needs root to run the launcher");
        return;
    }
    let image = plimsoll_engine::settings::default_image_dir();
    if !image.join("identity").is_file() {
        skip_or_fail(test, "no sandbox image: run `make images`");
        return;
    }
    for (tool, package) in [
        ("plimsoll-probe", "plimsoll-probe"),
        ("plimsoll-agent", "plimsoll-agent"),
    ] {
        plimsoll_testing::tool_binary(tool, package).unwrap_or_else(|e| panic!("{e}"));
    }
    let dir = TestDir::new("launch", test);
    // Every directory on the way must be traversable by the serving uid and the sandbox's;
    // the state directory is root's (the launcher makes run directories in it), its lease
    // directory the serving process's own.
    let mut at = dir.path().to_owned();
    loop {
        let mode = std::fs::metadata(&at).unwrap().permissions().mode();
        std::fs::set_permissions(&at, std::fs::Permissions::from_mode(mode | 0o111)).unwrap();
        if !at.pop() || at.as_os_str() == "/" {
            break;
        }
    }
    let state = dir.path().join("state");
    let leases = state.join("uid-leases");
    std::fs::create_dir_all(&leases).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o711)).unwrap();
    rustix::fs::chown(
        &leases,
        Some(rustix::fs::Uid::from_raw(SERVING_UID)),
        Some(rustix::fs::Gid::from_raw(SERVING_UID)),
    )
    .unwrap();
    let text = settings_text(&state);
    std::fs::write(dir.path().join("settings.toml"), &text).unwrap();
    let socket = dir.path().join("launch.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    let launcher = Settings::parse(&text)
        .unwrap()
        .build_launcher(&[], SERVING_UID)
        .unwrap_or_else(|e| panic!("{e}"));
    let launcher = Arc::new(launcher);
    std::thread::spawn(move || launcher.serve(listener));
    let exe = std::env::current_exe().unwrap();
    let running = Spawn::new(&exe, "/")
        .args(["--exact", "serving_entry", "--nocapture"])
        .env(env::PLIMSOLL_LAUNCH_CHILD.name, dir.path())
        .before_exec(
            PreExec::new()
                .step("groups", Step::DropGroups)
                .step(
                    "gid",
                    Step::SetGids(Some(SERVING_UID), Some(SERVING_UID), Some(SERVING_UID)),
                )
                .step(
                    "uid",
                    Step::SetUids(Some(SERVING_UID), Some(SERVING_UID), Some(SERVING_UID)),
                )
                .step("no_new_privs", Step::NoNewPrivs),
        )
        .spawn()
        .unwrap();
    let (mut stdout, mut stderr) = (String::new(), String::new());
    let mut pipe = running.stdout;
    pipe.read_to_string(&mut stdout).unwrap();
    let mut pipe = running.stderr;
    pipe.read_to_string(&mut stderr).unwrap();
    let mut child = running.child;
    let status = child.wait().unwrap();
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("SERVING "))
        .unwrap_or_else(|| {
            panic!("the serving copy said nothing ({status:?}):\n{stdout}\n{stderr}")
        });
    let said: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(said["uid"], SERVING_UID.to_string(), "{said}");
    assert_eq!(said["cap_eff"], "0000000000000000", "{said}");
    assert_eq!(said["cap_prm"], "0000000000000000", "{said}");
    assert_eq!(said["no_new_privs"], "1", "{said}");
    assert_eq!(
        said["stdout"]["Ok"],
        format!("ran as {UID_BASE}\n"),
        "the run through the launcher: {said}\n{stderr}"
    );
}
