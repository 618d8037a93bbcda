//! The `plimsoll` binary as a user runs it: exit statuses, output streams, JSON shapes, the
//! embedded engine and a real daemon.

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use plimsoll_client::{RunOptions, verify_response};
use plimsoll_test_daemon::TestDaemon;
use plimsoll_wire::digest::{evidence_sha256, request_sha256, sha256_hex};
use plimsoll_wire::{
    ErrorResponse, Evidence, Language, ProvidersResponse, Reason, RunRequest, RunResponse, Tier,
};
use serde_json::Value;

/// True when the test may go on; prints `SKIP` (or fails under CI=true) otherwise.
fn need_root(test: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    let why = "running sandboxes needs root (the process tier switches to a sandbox uid)";
    if plimsoll_env::strict() {
        panic!("{test}: {why}");
    }
    eprintln!("SKIP {test}: {why}");
    false
}

/// A settings file offering the process provider only (so a run without a floor is refused
/// whatever else the host has), whose runs live in a fresh state directory sandbox uids can
/// enter, with a sandbox uid range of its own (`slot` is unique per test: tests run in
/// parallel, and the end of a run kills every process of its uid).
struct Config {
    dir: tempfile::TempDir,
}

impl Config {
    fn new(slot: u32) -> Config {
        let dir = tempfile::Builder::new()
            .prefix("plimsoll-cli-test-")
            .tempdir()
            .unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let state = dir.path().join("state");
        std::fs::write(
            dir.path().join("plimsoll.toml"),
            format!(
                "providers = [\"process\"]\nstate_dir = \"{}\"\nsandbox_uid_base = {}\n",
                state.display(),
                uid_base(slot)
            ),
        )
        .unwrap();
        Config { dir }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("plimsoll.toml")
    }
}

/// The first sandbox uid of a test's own range.
fn uid_base(slot: u32) -> u32 {
    2_500_000 + 100 * slot
}

/// The binary with a clean plimsoll environment.
fn plimsoll() -> Command {
    #[allow(
        clippy::disallowed_methods,
        reason = "the test runs the built binary as a user would, with its own environment"
    )]
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_plimsoll"));
    for v in plimsoll_env::ALL {
        cmd.env_remove(v.name);
    }
    cmd.stdin(Stdio::null());
    cmd
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap();
    eprintln!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn run_with_the_process_floor_prints_the_header_and_the_exact_output() {
    if !need_root("run_with_the_process_floor_prints_the_header_and_the_exact_output") {
        return;
    }
    let c = Config::new(1);
    let out = run(plimsoll()
        .arg("run")
        .arg("--config")
        .arg(c.path())
        .args([
            "-e",
            "console.log(6 * 7); console.error('to stderr'); process.exit(5)",
        ])
        .args(["--min-isolation", "process"]));
    // It ran: exit 0, whatever the program's own exit code.
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(out.stdout, b"42\n");
    let err = text(&out.stderr);
    let header = err.lines().next().unwrap();
    assert!(
        header.starts_with(
            "plimsoll: provider process, isolation process, exit code 5, timed out no, truncated no, "
        ),
        "{header}"
    );
    assert!(err.contains("no wall for hostile code"), "{err}");
    assert!(err.ends_with("to stderr\n"), "{err}");
}

#[test]
fn run_reads_files_by_extension_and_standard_input() {
    if !need_root("run_reads_files_by_extension_and_standard_input") {
        return;
    }
    let c = Config::new(2);
    let file = c.dir.path().join("hello.py");
    std::fs::write(&file, "print('from', 'python')\n").unwrap();
    let out = run(plimsoll()
        .arg("run")
        .arg("--config")
        .arg(c.path())
        .arg(&file)
        .args(["--min-isolation", "process"]));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(out.stdout, b"from python\n");

    let mut child = plimsoll()
        .arg("run")
        .arg("--config")
        .arg(c.path())
        .args(["--lang", "py", "--min-isolation", "process", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"print(2 ** 10)\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(out.stdout, b"1024\n");

    let unknown = c.dir.path().join("x.rb");
    std::fs::write(&unknown, "puts 1").unwrap();
    let out = run(plimsoll().arg("run").arg(&unknown));
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--lang"));
}

#[test]
fn run_json_has_every_field_and_its_digests_verify() {
    if !need_root("run_json_has_every_field_and_its_digests_verify") {
        return;
    }
    let c = Config::new(3);
    let code = "console.log('json')";
    let out = run(plimsoll().arg("run").arg("--config").arg(c.path()).args([
        "-e",
        code,
        "--min-isolation",
        "process",
        "--json",
    ]));
    assert_eq!(out.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in [
        "request_id",
        "provider",
        "isolation",
        "duration_ms",
        "request_sha256",
        "result_sha256",
        "record",
        "result",
    ] {
        assert!(v.get(key).is_some(), "no `{key}` in {v}");
    }
    for key in [
        "exit_code",
        "timed_out",
        "stdout",
        "stderr",
        "stdout_truncated",
        "stderr_truncated",
    ] {
        assert!(v["result"].get(key).is_some(), "no `result.{key}` in {v}");
    }
    assert_eq!(v["result"]["stdout"], "json\n");
    assert_eq!(v["result"]["start"], "cold");
    assert!(v["result"].get("member_age_ms").is_none(), "{v}");
    assert_eq!(v["isolation"], "process");

    // The CLI's own members beside the response: the request as sent and the evidence.
    let mut v = v;
    let (printed, evidence) = split_cli_members(&mut v);
    // Recompute every digest over the request the CLI built.
    let resp: RunResponse = serde_json::from_value(v).unwrap();
    let sent = RunOptions::snippet(Language::Javascript, code)
        .min_isolation(Tier::Process)
        .into_request(resp.request_id.clone());
    assert_eq!(printed, sent);
    assert_eq!(
        evidence_sha256(&evidence.expect("the embedded engine prints its evidence")),
        resp.record.evidence_sha256
    );
    verify_response(&sent, resp).unwrap();
}

#[test]
fn run_without_a_floor_is_refused_for_isolation_with_status_3() {
    let c = Config::new(4);
    let out = run(plimsoll()
        .arg("run")
        .arg("--config")
        .arg(c.path())
        .args(["-e", "console.log(1)"]));
    assert_eq!(out.status.code(), Some(3));
    assert!(out.stdout.is_empty());
    let err = text(&out.stderr);
    assert!(err.starts_with("not dispatched (isolation): "), "{err}");
    assert!(err.contains("--min-isolation process"), "{err}");

    let out = run(plimsoll().arg("run").arg("--config").arg(c.path()).args([
        "-e",
        "console.log(1)",
        "--json",
    ]));
    assert_eq!(out.status.code(), Some(3));
    let e: ErrorResponse = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e.error.not_dispatched, Some(Reason::Isolation));
    assert_eq!(e.error.code, "isolation");
    assert_eq!(e.request_id.as_deref().map(str::len), Some(32));
}

#[test]
fn a_bad_min_isolation_is_a_usage_error() {
    let out = run(plimsoll().args(["run", "-e", "1", "--min-isolation", "fortress"]));
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("fortress"), "{err}");
    assert!(err.contains("process, container, kernel, vm"), "{err}");

    // Neither code nor file.
    let out = run(plimsoll().arg("run"));
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn help_lists_environment_variables_and_exit_statuses() {
    for args in [&["--help"][..], &["run", "--help"]] {
        let out = run(plimsoll().args(args));
        assert_eq!(out.status.code(), Some(0));
        let help = text(&out.stdout);
        for v in plimsoll_env::ALL {
            assert!(help.contains(v.name), "{} missing from {args:?}", v.name);
        }
        assert!(help.contains("3  not dispatched"), "{help}");
        assert!(help.contains("4  the code may have run"), "{help}");
    }
}

#[test]
fn callers_add_prints_the_token_once_and_the_file_keeps_only_its_digest() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("callers.toml");
    let out = run(plimsoll()
        .args(["callers", "add", "alice", "--file"])
        .arg(&file));
    assert_eq!(out.status.code(), Some(0));
    let stdout = text(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let token = stdout.trim();
    assert!(token.starts_with("plm_"), "{token}");
    assert!(text(&out.stderr).contains("shown only this once"));
    assert!(!text(&out.stderr).contains(token));

    let saved = std::fs::read_to_string(&file).unwrap();
    assert!(!saved.contains(token), "{saved}");
    assert!(saved.contains(&sha256_hex(token.as_bytes())), "{saved}");
    assert!(saved.contains("alice"));

    // A second caller of the same name is refused, and the file is unchanged.
    let out = run(plimsoll()
        .args(["callers", "add", "alice", "--file"])
        .arg(&file));
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), saved);

    // The default file comes from the settings' [daemon].callers_file.
    let settings = dir.path().join("plimsoll.toml");
    let other = dir.path().join("other-callers.toml");
    std::fs::write(
        &settings,
        format!("[daemon]\ncallers_file = \"{}\"\n", other.display()),
    )
    .unwrap();
    let out = run(plimsoll()
        .args(["callers", "add", "bob", "--config"])
        .arg(&settings));
    assert_eq!(out.status.code(), Some(0));
    assert!(std::fs::read_to_string(&other).unwrap().contains("bob"));
}

#[test]
fn run_against_a_daemon() {
    if !need_root("run_against_a_daemon") {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let daemon = TestDaemon::start(&format!(
        "providers = [\"process\"]\nstate_dir = \"{}\"\nsandbox_uid_base = {}\n",
        state.path().display(),
        uid_base(20)
    ));
    let out = run(plimsoll()
        .args(["run", "--daemon", &daemon.url, "--min-isolation", "process"])
        .args(["-e", "console.log('via daemon')"])
        .env("PLIMSOLL_TOKEN", &daemon.token));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(out.stdout, b"via daemon\n");
    assert!(
        text(&out.stderr).starts_with("plimsoll: provider process, isolation process, exit code 0"),
        "{}",
        text(&out.stderr)
    );
    assert!(!text(&out.stderr).contains(&daemon.token));

    // PLIMSOLL_DAEMON works like --daemon; a refusal exits 3 with the error object.
    let out = run(plimsoll()
        .args(["run", "--json", "-e", "console.log(1)"])
        .env("PLIMSOLL_DAEMON", &daemon.url)
        .env("PLIMSOLL_TOKEN", &daemon.token));
    assert_eq!(out.status.code(), Some(3));
    let e: ErrorResponse = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e.error.not_dispatched, Some(Reason::Isolation));

    // No token: a clear usage error, nothing sent.
    let out = run(plimsoll().args(["run", "--daemon", &daemon.url, "-e", "console.log(1)"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("PLIMSOLL_TOKEN is not set"));

    // providers through the daemon.
    let out = run(plimsoll()
        .args(["providers", "--json", "--daemon", &daemon.url])
        .env("PLIMSOLL_TOKEN", &daemon.token));
    assert_eq!(out.status.code(), Some(0));
    let p: ProvidersResponse = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        p.providers
            .iter()
            .any(|p| p.name == "process" && p.available)
    );
}

#[test]
fn providers_shows_tier_availability_and_evidence() {
    if !need_root("providers_shows_tier_availability_and_evidence") {
        return;
    }
    let c = Config::new(5);
    let out = run(plimsoll().arg("providers").arg("--config").arg(c.path()));
    assert_eq!(out.status.code(), Some(0));
    let human = text(&out.stdout);
    assert!(human.contains("default floor: container"), "{human}");
    assert!(
        human.contains("process  tier process  available"),
        "{human}"
    );
    assert!(human.contains("binaries: node"), "{human}");
    assert!(human.contains("probe: uid "), "{human}");

    let out = run(plimsoll()
        .args(["providers", "--json", "--config"])
        .arg(c.path()));
    let p: ProvidersResponse = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(p.default_floor, Tier::Container);
    assert_eq!(p.providers[0].name, "process");
}

/// A scratch directory sandbox uids can traverse, and a uid range of its own derived from a
/// held loopback port (as plimsoll_test_daemon does), for tests that write settings.
fn scratch() -> (tempfile::TempDir, TcpListener, u32) {
    let dir = tempfile::Builder::new()
        .prefix("plimsoll-cli-init-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let port = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = plimsoll_test_daemon::uid_base_for_port(port.local_addr().unwrap().port());
    (dir, port, base)
}

fn mode(p: &std::path::Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn init_writes_what_passed_makes_the_directories_adds_a_caller_and_will_not_overwrite() {
    if !need_root(
        "init_writes_what_passed_makes_the_directories_adds_a_caller_and_will_not_overwrite",
    ) {
        return;
    }
    let (dir, _port, base) = scratch();
    let config = dir.path().join("etc/plimsoll.toml");
    let callers = dir.path().join("private/callers.toml");
    let state = dir.path().join("state");
    let init = |extra: &[&str]| {
        run(plimsoll()
            .arg("--config")
            .arg(&config)
            .args(["init", "--providers", "process,crun", "--caller", "ci"])
            .arg("--state-dir")
            .arg(&state)
            .arg("--callers-file")
            .arg(&callers)
            .args(["--sandbox-uid-base", &base.to_string()])
            .args(extra))
    };

    // An unknown provider is refused before anything is written.
    let out = run(plimsoll()
        .arg("--config")
        .arg(&config)
        .args(["init", "--providers", "process,docker"])
        .arg("--state-dir")
        .arg(&state));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("docker"),
        "{}",
        text(&out.stderr)
    );
    assert!(!config.exists());
    assert!(
        !state.exists(),
        "the state directory was made for a refused init"
    );

    let out = init(&[]);
    assert_eq!(out.status.code(), Some(0));
    // stdout is the token alone, once.
    let token = text(&out.stdout);
    let token = token.trim_end_matches('\n');
    assert!(
        token.starts_with("plm_") && !token.contains('\n'),
        "{token}"
    );
    assert!(text(&out.stderr).contains("probing 2 provider(s)"));

    let written = std::fs::read_to_string(&config).unwrap();
    let settings = plimsoll_engine::settings::Settings::parse(&written).unwrap();
    let providers = settings.providers.clone().unwrap();
    assert!(providers.contains(&"process".to_owned()), "{written}");
    // crun is listed if it passed, else a comment says why not.
    if !providers.contains(&"crun".to_owned()) {
        assert!(written.contains("#   crun (tier container): "), "{written}");
    }
    assert_eq!(settings.state_dir.as_deref(), Some(state.as_path()));
    assert_eq!(settings.sandbox_uid_base, Some(base));
    assert_eq!(
        settings.daemon.callers_file.as_deref(),
        Some(callers.as_path())
    );
    assert_eq!(mode(&config), 0o644);
    assert_eq!(mode(&state), 0o711);
    // The daemon it sets up is split: it serves as the user init made, which reads the
    // callers file through its group (docs/privileges.md, "The split daemon").
    assert_eq!(
        settings.daemon.serving_user.as_deref(),
        Some(plimsoll_engine::settings::DEFAULT_SERVING_USER),
        "{written}"
    );
    let serving = plimsoll_broker::apart::ProcessUser::lookup(
        plimsoll_engine::settings::DEFAULT_SERVING_USER,
    )
    .expect("init made the serving user");
    plimsoll_broker::apart::ProcessUser::lookup(plimsoll_broker::apart::DEFAULT_USER)
        .expect("init made the broker process's user");
    {
        use std::os::unix::fs::MetadataExt as _;
        for (path, want) in [
            (callers.parent().unwrap(), 0o750),
            (callers.as_path(), 0o640),
        ] {
            let meta = std::fs::metadata(path).unwrap();
            assert_eq!(mode(path), want, "{}", path.display());
            assert_eq!(
                (meta.uid(), meta.gid()),
                (0, serving.gid),
                "{}",
                path.display()
            );
        }
    }
    let callers_text = std::fs::read_to_string(&callers).unwrap();
    assert!(!callers_text.contains(token));
    assert!(callers_text.contains(&sha256_hex(token.as_bytes())));

    // The file it wrote runs code as written.
    let out = run(plimsoll().arg("--config").arg(&config).args([
        "run",
        "--min-isolation",
        "process",
        "-e",
        "console.log(6*7)",
    ]));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(out.stdout, b"42\n");

    // Not again without --force: the file is untouched.
    let out = init(&[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--force"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&config).unwrap(), written);

    // With --force it probes again and rewrites; the caller is kept, no token is shown.
    std::fs::write(&config, "# edited\n").unwrap();
    let out = init(&["--force", "--quiet"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    assert!(out.stderr.is_empty(), "--quiet: {}", text(&out.stderr));
    assert!(
        std::fs::read_to_string(&config)
            .unwrap()
            .contains("providers = [")
    );
    assert_eq!(std::fs::read_to_string(&callers).unwrap(), callers_text);
}

#[test]
fn doctor_says_what_this_host_offers_and_what_each_missing_tier_would_take() {
    if !need_root("doctor_says_what_this_host_offers_and_what_each_missing_tier_would_take") {
        return;
    }
    let (dir, _port, base) = scratch();
    let config = dir.path().join("plimsoll.toml");
    std::fs::write(
        &config,
        format!(
            "state_dir = \"{}\"\nsandbox_uid_base = {base}\n",
            dir.path().join("state").display()
        ),
    )
    .unwrap();
    let out = run(plimsoll()
        .arg("--config")
        .arg(&config)
        .args(["doctor", "--json"]));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let served = doc["default_floor_served"].as_bool().unwrap();
    assert_eq!(doc["default_floor"], "container");
    // The exit status says whether the default floor can be served.
    assert_eq!(out.status.code(), Some(if served { 0 } else { 1 }));
    let providers = doc["providers"].as_array().unwrap();
    assert_eq!(providers.len(), 5, "every provider of this build is probed");
    for p in providers {
        if !p["available"].as_bool().unwrap() {
            assert!(
                !p["unavailable_reason"].as_str().unwrap_or("").is_empty(),
                "{p}"
            );
        }
    }
    let tiers = doc["tiers"].as_array().unwrap();
    assert_eq!(tiers.len(), 4);
    for t in tiers {
        let offered_by: Vec<&str> = t["offered_by"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        // A tier is offered exactly when an available provider's evidence gives it.
        let expected: Vec<&str> = providers
            .iter()
            .filter(|p| p["available"] == true && p["tier"] == t["tier"])
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(offered_by, expected, "{t}");
        if offered_by.is_empty() {
            assert!(!t["to_get_it"].as_array().unwrap().is_empty(), "{t}");
        }
    }
    // The host's /dev/kvm, as this test sees it.
    let kvm = &doc["host"]["kvm"]["state"];
    if !std::path::Path::new("/dev/kvm").exists() {
        assert_eq!(kvm, "absent");
    }
    let vm = tiers.iter().find(|t| t["tier"] == "vm").unwrap();
    if vm["offered"] == false {
        let steps = vm["to_get_it"].to_string();
        assert!(steps.contains("KVM"), "{steps}");
        if kvm == "present" {
            assert!(steps.contains("/dev/kvm is present but"), "{steps}");
        }
    }
    let cgroups = doc["host"]["cgroups"]["layout"].as_str().unwrap();
    assert!(["unified", "hybrid", "legacy", "none"].contains(&cgroups));
}

#[test]
fn completions_and_man_pages_come_from_the_command_line_definitions() {
    let out = run(plimsoll().args(["completions", "bash"]));
    assert_eq!(out.status.code(), Some(0));
    let script = text(&out.stdout);
    for word in ["init", "doctor", "--min-isolation", "callers"] {
        assert!(
            script.contains(word),
            "{word} missing from the bash completion"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let out = run(plimsoll().arg("man").arg(dir.path()));
    assert_eq!(out.status.code(), Some(0));
    for page in [
        "plimsoll.1",
        "plimsoll-run.1",
        "plimsoll-init.1",
        "plimsoll-callers-add.1",
    ] {
        let body = std::fs::read_to_string(dir.path().join(page)).unwrap();
        assert!(body.starts_with(".ie"), "{page} is not roff: {body:.40}");
    }
    let init = std::fs::read_to_string(dir.path().join("plimsoll-init.1")).unwrap();
    assert!(init.contains("force"));
}

/// A one-shot HTTP server that answers every request with `status` and `body`.
fn canned_server(status: u16, body: &'static str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            // Read the request head and its whole body, then answer: closing with unread
            // bytes would reset the connection before the client reads the answer.
            let mut buf = vec![0u8; 64 * 1024];
            let mut got = Vec::new();
            let complete = |got: &[u8]| {
                let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
                    return false;
                };
                let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                got.len() >= end + 4 + length
            };
            while !complete(&got) {
                let n = conn.read(&mut buf).unwrap_or(0);
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            let _ = write!(
                conn,
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    url
}

#[test]
fn a_failure_that_may_have_run_exits_4_and_unreachable_exits_3() {
    let url = canned_server(
        500,
        r#"{"protocol":1,"request_id":null,"error":{"code":"sandbox_failed","message":"it broke","not_dispatched":null}}"#,
    );
    let out = run(plimsoll()
        .args(["run", "--daemon", &url, "--min-isolation", "container"])
        .args(["-e", "console.log(1)"])
        .env("PLIMSOLL_TOKEN", "plm_x"));
    assert_eq!(out.status.code(), Some(4));
    assert!(
        text(&out.stderr).contains("may have run"),
        "{}",
        text(&out.stderr)
    );
    // With no floor the client must learn the daemon's default floor first; this daemon's
    // listing fails, so nothing is sent.
    let out = run(plimsoll()
        .args(["run", "--daemon", &url, "-e", "console.log(1)"])
        .env("PLIMSOLL_TOKEN", "plm_x"));
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out.stderr).contains("could not learn the daemon's default floor"),
        "{}",
        text(&out.stderr)
    );

    // A refusal that does not echo our id cannot be trusted: may have run.
    let url = canned_server(
        422,
        r#"{"protocol":1,"request_id":"someone-else","error":{"code":"isolation","message":"no","not_dispatched":"isolation"}}"#,
    );
    let out = run(plimsoll()
        .args([
            "run",
            "--json",
            "--daemon",
            &url,
            "--min-isolation",
            "process",
        ])
        .args(["-e", "console.log(1)"])
        .env("PLIMSOLL_TOKEN", "plm_x"));
    assert_eq!(out.status.code(), Some(4));
    let e: ErrorResponse = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e.error.not_dispatched, None);
    assert_eq!(e.error.code, "unverified_refusal");

    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = run(plimsoll()
        .args(["run", "--daemon", &format!("http://127.0.0.1:{port}")])
        .args(["-e", "console.log(1)"])
        .env("PLIMSOLL_TOKEN", "plm_x"));
    assert_eq!(out.status.code(), Some(3));
    assert!(text(&out.stderr).starts_with("not dispatched (environment): "));
}

#[test]
fn an_unreadable_settings_file_is_a_usage_error() {
    let out = run(plimsoll().args(["run", "--config", "/nonexistent/plimsoll.toml", "-e", "1"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("/nonexistent/plimsoll.toml"));
}

/// Takes the CLI's own members out of `run --json` output, leaving the `RunResponse`: the
/// request as sent, and the evidence (checked against its printed digest) when the embedded
/// engine ran it.
fn split_cli_members(v: &mut Value) -> (RunRequest, Option<Evidence>) {
    let obj = v.as_object_mut().unwrap();
    let request: RunRequest = serde_json::from_value(obj.remove("request").unwrap()).unwrap();
    let evidence = obj.remove("evidence").map(|e| {
        let e: Evidence = serde_json::from_value(e).unwrap();
        let printed = obj.remove("evidence_sha256").unwrap();
        assert_eq!(printed.as_str(), Some(evidence_sha256(&e).as_str()));
        assert!(obj.remove("evidence_age_ms").unwrap().is_u64());
        assert!(obj.remove("evidence_cached").unwrap().is_boolean());
        e
    });
    (request, evidence)
}

/// Settings offering crun only, with a state root, cgroup parent, state directory and uid
/// range of the test's own; `None` after `SKIP` when the host lacks crun or the image.
fn crun_settings(test: &str, dir: &std::path::Path, slot: u32) -> Option<String> {
    use plimsoll_testing::{skip_or_fail, tool_binary, workspace_root};
    if !need_root(test) {
        return None;
    }
    if !std::path::Path::new("/usr/bin/crun").exists() {
        skip_or_fail(test, "crun is not installed (scripts/install-deps)");
        return None;
    }
    let Ok(image) = workspace_root().join("build/images/sandbox").canonicalize() else {
        skip_or_fail(test, "the sandbox image is not built (scripts/build-image)");
        return None;
    };
    let tools = ["plimsoll-probe", "plimsoll-agent"]
        .map(|t| tool_binary(t, t))
        .into_iter()
        .chain([tool_binary("plimsoll-trial-runner", "plimsoll-trial")])
        .collect::<Result<Vec<_>, _>>();
    let tools = match tools {
        Ok(t) => t,
        Err(e) => {
            skip_or_fail(test, &e);
            return None;
        }
    };
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    Some(format!(
        "providers = [\"crun\"]\nstate_dir = \"{state}\"\nsandbox_uid_base = {base}\n\
         [oci]\nimage = \"{image}\"\nprobe = \"{probe}\"\nagent = \"{agent}\"\n\
         trial_runner = \"{runner}\"\nstate_root = \"{root}\"\ncgroup_parent = \"/plimsoll-test-cli-{slot}-{pid}\"\n",
        state = dir.join("state").display(),
        base = uid_base(slot),
        image = image.display(),
        probe = tools[0].display(),
        agent = tools[1].display(),
        runner = tools[2].display(),
        root = dir.join("oci").display(),
        pid = std::process::id(),
    ))
}

/// A project of two files (one executable, one under a directory) and two steps, with two
/// artifacts, one of them not UTF-8; `--file` arguments for it.
fn project_inputs(dir: &std::path::Path) -> Vec<String> {
    let script = dir.join("make.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\nmkdir -p res && cp data/in.txt res/copy.bin && printf '\\377\\000end' >> res/copy.bin\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = dir.join("in.txt");
    std::fs::write(&data, "line one\n").unwrap();
    vec![
        script.display().to_string(),
        format!("{}=data/in.txt", data.display()),
    ]
}

fn project_args(files: &[String]) -> Vec<String> {
    let mut a = vec![
        "run".to_owned(),
        "--min-isolation".into(),
        "container".into(),
    ];
    for f in files {
        a.push("--file".into());
        a.push(f.clone());
    }
    for s in [
        "./make.sh",
        "wc -c < res/copy.bin > count.txt && echo steps done",
    ] {
        a.push("--step".into());
        a.push(s.into());
    }
    for art in ["res/copy.bin", "count.txt"] {
        a.push("--artifact".into());
        a.push(art.into());
    }
    a
}

fn check_project_outputs(out_dir: &std::path::Path) {
    assert_eq!(
        std::fs::read(out_dir.join("res/copy.bin")).unwrap(),
        b"line one\n\xff\x00end"
    );
    assert_eq!(
        std::fs::read_to_string(out_dir.join("count.txt"))
            .unwrap()
            .trim(),
        "14"
    );
}

/// What `run --json --out DIR` of the test project printed: it exited 0, wrote the artifacts
/// byte for byte, and its printed request recomputes the response's request digest. Returns
/// the request as sent, the evidence printed (embedded engine only) and the response.
fn project_answer(
    out: &std::process::Output,
    out_dir: &std::path::Path,
) -> (RunRequest, Option<Evidence>, RunResponse) {
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    check_project_outputs(out_dir);
    let mut v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (sent, evidence) = split_cli_members(&mut v);
    let resp: RunResponse = serde_json::from_value(v).unwrap();
    // A third party recomputes the request digest from the printed request alone.
    assert_eq!(request_sha256(&sent), resp.request_sha256);
    (sent, evidence, resp)
}

#[test]
fn a_project_runs_at_crun_and_its_artifacts_are_written_exactly() {
    let test = "a_project_runs_at_crun_and_its_artifacts_are_written_exactly";
    let dir = tempfile::tempdir().unwrap();
    let Some(settings) = crun_settings(test, dir.path(), 6) else {
        return;
    };
    let config = dir.path().join("plimsoll.toml");
    std::fs::write(&config, settings).unwrap();
    let files = project_inputs(dir.path());
    let out_dir = dir.path().join("out");

    let out = run(plimsoll()
        .arg("--config")
        .arg(&config)
        .args(project_args(&files))
        .arg("--out")
        .arg(&out_dir)
        .arg("--json"));
    let (sent, evidence, resp) = project_answer(&out, &out_dir);
    assert_eq!(resp.provider, "crun");
    assert_eq!(resp.result.stdout.as_slice(), b"steps done\n");
    let evidence = evidence.expect("the embedded engine prints its evidence");
    assert_eq!(evidence_sha256(&evidence), resp.record.evidence_sha256);
    assert_eq!(evidence.provider, "crun");
    let plimsoll_wire::RunSpec::Project(p) = &sent.run else {
        panic!("not a project: {sent:?}");
    };
    assert_eq!(p.files.len(), 2);
    assert_eq!(p.files[0].path, "make.sh");
    assert!(p.files[0].executable);
    assert_eq!(p.files[1].path, "data/in.txt");
    assert!(!p.files[1].executable);
    verify_response(&sent, resp.clone()).unwrap();

    // The printed request, sent again whole with --request: the same digest (the id is not
    // part of it), and the artifacts again byte for byte.
    let req_file = dir.path().join("request.json");
    std::fs::write(&req_file, serde_json::to_vec(&sent).unwrap()).unwrap();
    let again = dir.path().join("again");
    let out = run(plimsoll()
        .arg("--config")
        .arg(&config)
        .args(["run", "--json", "--request"])
        .arg(&req_file)
        .arg("--out")
        .arg(&again));
    let (sent2, _, resp2) = project_answer(&out, &again);
    assert_eq!(resp2.request_sha256, resp.request_sha256);
    assert_ne!(sent2.request_id, sent.request_id);

    // Without --out the human output lists the artifacts and writes nothing.
    let out = run(plimsoll()
        .arg("--config")
        .arg(&config)
        .args(project_args(&files)));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(out.stdout, b"steps done\n");
    let err = text(&out.stderr);
    assert!(
        err.contains("artifact res/copy.bin: 14 bytes (pass --out DIR to write it)"),
        "{err}"
    );
}

#[test]
fn a_project_runs_through_a_daemon_with_artifacts_and_a_request_from_stdin() {
    let test = "a_project_runs_through_a_daemon_with_artifacts_and_a_request_from_stdin";
    let dir = tempfile::tempdir().unwrap();
    let Some(settings) = crun_settings(test, dir.path(), 7) else {
        return;
    };
    let daemon = TestDaemon::start(&settings);
    let files = project_inputs(dir.path());
    let out_dir = dir.path().join("out");
    let out = run(plimsoll()
        .args(project_args(&files))
        .args(["--daemon", &daemon.url, "--json", "--out"])
        .arg(&out_dir)
        .env("PLIMSOLL_TOKEN", &daemon.token));
    let (sent, evidence, resp) = project_answer(&out, &out_dir);
    assert!(
        evidence.is_none(),
        "a daemon's evidence is its own: GET /v1/providers"
    );
    assert_eq!(resp.provider, "crun");
    verify_response(&sent, resp.clone()).unwrap();

    // The same request on standard input, without protocol or request_id.
    let mut body = serde_json::to_value(&sent).unwrap();
    body.as_object_mut().unwrap().remove("request_id");
    body.as_object_mut().unwrap().remove("protocol");
    let again = dir.path().join("again");
    let mut child = plimsoll()
        .args(["run", "--request", "-", "--daemon", &daemon.url, "--out"])
        .arg(&again)
        .env("PLIMSOLL_TOKEN", &daemon.token)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&serde_json::to_vec(&body).unwrap())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    eprintln!("stderr: {}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(out.stdout, b"steps done\n");
    check_project_outputs(&again);
}

#[test]
fn bad_project_and_request_arguments_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let c = Config::new(8);
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "--step".into(),
                "true".into(),
                "--file".into(),
                dir.path().join("nope").display().to_string(),
            ],
            "cannot read",
        ),
        (
            vec![
                "--step".into(),
                "true".into(),
                "--artifact".into(),
                "../up".into(),
            ],
            "invalid",
        ),
        (
            vec!["-e".into(), "1".into(), "--out".into(), "x".into()],
            "--out DIR",
        ),
        (
            vec![
                "--request".into(),
                dir.path().join("nope.json").display().to_string(),
            ],
            "cannot read",
        ),
    ];
    for (args, needle) in cases {
        let out = run(plimsoll()
            .arg("--config")
            .arg(c.path())
            .arg("run")
            .args(&args));
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            text(&out.stderr).contains(needle),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    let bad = dir.path().join("bad.json");
    for (body, needle) in [
        ("[1]", "one JSON object"),
        (
            "{\"run\": {\"kind\": \"snippet\"}}",
            "not a valid run request",
        ),
        ("{\"protocol\": 99, \"run\": {}}", "not a valid run request"),
        ("not json", "not JSON"),
    ] {
        std::fs::write(&bad, body).unwrap();
        let out = run(plimsoll()
            .arg("--config")
            .arg(c.path())
            .arg("run")
            .arg("--request")
            .arg(&bad));
        assert_eq!(out.status.code(), Some(2), "{body}");
        assert!(
            text(&out.stderr).contains(needle),
            "{body}: {}",
            text(&out.stderr)
        );
    }
    // --request is a whole request: flags that would change it are refused by clap.
    let out = run(plimsoll().args(["run", "--request", "x.json", "--min-isolation", "process"]));
    assert_eq!(out.status.code(), Some(2));
}

/// `run --json` through the embedded engine, as a `Value`.
fn json_run(config: &std::path::Path) -> Value {
    let out = run(plimsoll().arg("--config").arg(config).args([
        "run",
        "--min-isolation",
        "process",
        "--json",
        "-e",
        "console.log(1)",
    ]));
    assert_eq!(out.status.code(), Some(0));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn evidence_is_reused_while_it_holds_and_probed_again_when_not() {
    if !need_root("evidence_is_reused_while_it_holds_and_probed_again_when_not") {
        return;
    }
    use std::os::unix::fs::MetadataExt as _;
    let c = Config::new(9);
    // A probe binary of the test's own, so changing it touches nothing else.
    let probe = c.dir.path().join("plimsoll-probe");
    std::fs::copy(plimsoll_testing::probe_binary().unwrap(), &probe).unwrap();
    let mut settings = std::fs::read_to_string(c.path()).unwrap();
    settings.push_str(&format!("[process]\nprobe = \"{}\"\n", probe.display()));
    std::fs::write(c.path(), &settings).unwrap();
    let cache = c.dir.path().join("state/evidence-cache.json");

    let first = json_run(&c.path());
    assert_eq!(first["evidence_cached"], false, "nothing cached yet");
    let m = std::fs::metadata(&cache).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o600));
    let second = json_run(&c.path());
    assert_eq!(second["evidence_cached"], true);
    assert_eq!(second["evidence_sha256"], first["evidence_sha256"]);
    assert_eq!(
        second["record"]["evidence_sha256"],
        first["evidence_sha256"]
    );
    assert!(second["evidence_age_ms"].as_u64().unwrap() >= 1);

    // Writable by others: not trusted, probed again, written again root-only.
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o666)).unwrap();
    let third = json_run(&c.path());
    assert_eq!(third["evidence_cached"], false);
    assert_ne!(third["evidence_sha256"], first["evidence_sha256"]);
    assert_eq!(std::fs::metadata(&cache).unwrap().mode() & 0o777, 0o600);
    assert_eq!(json_run(&c.path())["evidence_cached"], true);

    // A forged entry (a better tier under the old digest): not used.
    let text_now = std::fs::read_to_string(&cache).unwrap();
    let forged = text_now.replacen(
        "\"isolation\": \"process\"",
        "\"isolation\": \"container\"",
        1,
    );
    assert_ne!(forged, text_now);
    std::fs::write(&cache, forged).unwrap();
    let v = json_run(&c.path());
    assert_eq!(v["evidence_cached"], false);
    assert_eq!(v["isolation"], "process");

    // The probe binary changed: its digest no longer matches, so it is probed again, and the
    // new evidence names the new digest.
    let before = v["evidence"]["binaries"].clone();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&probe)
        .unwrap();
    f.write_all(b"changed").unwrap();
    drop(f);
    let v = json_run(&c.path());
    assert_eq!(v["evidence_cached"], false);
    assert_ne!(v["evidence"]["binaries"], before);
    assert_eq!(json_run(&c.path())["evidence_cached"], true);

    // Stale: a maximum age of one second, waited out.
    std::fs::write(c.path(), format!("evidence_cache_secs = 1\n{settings}")).unwrap();
    assert_eq!(json_run(&c.path())["evidence_cached"], false);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert_eq!(json_run(&c.path())["evidence_cached"], false);

    // 0 turns the cache off.
    std::fs::write(c.path(), format!("evidence_cache_secs = 0\n{settings}")).unwrap();
    assert_eq!(json_run(&c.path())["evidence_cached"], false);
    assert_eq!(json_run(&c.path())["evidence_cached"], false);
}

/// `plimsoll session open --grant`: a session at crun through a daemon holds an egress grant
/// for its whole life. A cell's connection to a host the grant does not list is refused by
/// the broker, and its receipt printed, one line, after the header (and listed in `--json`);
/// the next call lists only what happened since the call before. A grant the caller may not
/// use opens nothing (exit 3).
#[test]
fn a_session_opened_with_a_grant_prints_its_egress_receipts() {
    let test = "a_session_opened_with_a_grant_prints_its_egress_receipts";
    let dir = tempfile::tempdir().unwrap();
    let Some(settings) = crun_settings(test, dir.path(), 23) else {
        return;
    };
    let grants = dir.path().join("grants.toml");
    // TestDaemon's caller is `test`. No secret: an egress grant holds none.
    std::fs::write(
        &grants,
        "[egress.pkgs]\ncallers = [\"test\"]\nhosts = [\"pypi.plimsoll.test\"]\nports = [80]\n\n\
         [egress.theirs]\ncallers = [\"someone-else\"]\nhosts = [\"pypi.plimsoll.test\"]\n",
    )
    .unwrap();
    let grants = plimsoll_engine::Engine::load_grants(&grants).unwrap();
    let daemon = TestDaemon::start_with_grants(&format!("{settings}[pools]\n"), grants);
    let session = |args: &[&str]| {
        let mut cmd = plimsoll();
        cmd.arg("session")
            .args(args)
            .env("PLIMSOLL_DAEMON", &daemon.url)
            .env("PLIMSOLL_TOKEN", &daemon.token);
        cmd
    };
    let out = run(&mut session(&[
        "open", "--lang", "python", "--grant", "pkgs",
    ]));
    if out.status.code() == Some(3) && !plimsoll_env::strict() {
        eprintln!("SKIP {test}: crun is unavailable: {}", text(&out.stderr));
        return;
    }
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_owned();
    assert!(
        text(&out.stderr).contains("holds grant pkgs for its whole life"),
        "{}",
        text(&out.stderr)
    );
    // Plain HTTP through HTTP_PROXY, which the session's interpreter has: the broker refuses
    // an unlisted host before resolving or connecting anything.
    let reach = "import urllib.request\n\
                 try:\n    urllib.request.urlopen('http://elsewhere.plimsoll.test/simple/', timeout=20)\n\
                 except Exception as e:\n    print('refused', getattr(e, 'code', e))";
    let out = run(&mut session(&["run", &id, "-e", reach]));
    let stderr = text(&out.stderr);
    assert_eq!(
        (out.status.code(), text(&out.stdout).as_str()),
        (Some(0), "refused 403\n"),
        "{stderr}"
    );
    let header = stderr
        .lines()
        .position(|l| l.starts_with("plimsoll: provider crun"))
        .unwrap_or_else(|| panic!("no header: {stderr}"));
    let receipts: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("plimsoll: egress "))
        .collect();
    assert_eq!(receipts.len(), 1, "{stderr}");
    assert!(
        receipts[0].starts_with(
            "plimsoll: egress refused http elsewhere.plimsoll.test:80 no address, no sni, 0 bytes up, 0 bytes down, "
        ) && receipts[0].ends_with(" ms, rule host_not_allowed"),
        "{stderr}"
    );
    assert_eq!(
        stderr.lines().nth(header + 1),
        Some(receipts[0]),
        "the receipt follows the header: {stderr}"
    );
    // The next call lists only what happened since the call before: nothing.
    let out = run(&mut session(&["run", &id, "-e", "print(1)"]));
    assert_eq!(out.status.code(), Some(0));
    assert!(
        !text(&out.stderr).contains("plimsoll: egress"),
        "{}",
        text(&out.stderr)
    );
    // --json: the receipt is on the verified result.
    let out = run(&mut session(&["run", &id, "-e", reach, "--json"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let egress = v["result"]["egress"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(egress.len(), 1, "{v}");
    assert_eq!(
        (
            &egress[0]["host"],
            &egress[0]["port"],
            &egress[0]["kind"],
            &egress[0]["verdict"],
            &egress[0]["rule"]
        ),
        (
            &Value::from("elsewhere.plimsoll.test"),
            &Value::from(80),
            &Value::from("http"),
            &Value::from("refused"),
            &Value::from("host_not_allowed")
        ),
        "{v}"
    );
    assert!(egress[0].get("address").is_none(), "{v}");
    assert_eq!(run(&mut session(&["close", &id])).status.code(), Some(0));
    // A grant this caller may not use: refused, nothing opened, as for one that does not exist.
    for name in ["theirs", "no-such-grant"] {
        let out = run(&mut session(&["open", "--lang", "python", "--grant", name]));
        assert_eq!(out.status.code(), Some(3), "{name}: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).starts_with("not dispatched (permission)"),
            "{name}: {}",
            text(&out.stderr)
        );
    }
    let out = run(&mut session(&["list"]));
    assert_eq!(text(&out.stdout), "", "nothing left open");
}

/// A daemon offering `provider` alone, in the sandbox image, with a state directory sandbox
/// uids can enter and uid range `slot`; `extra` is more settings after `[oci]`.
fn session_daemon(provider: &str, slot: u32, extra: &str) -> (TestDaemon, tempfile::TempDir) {
    let state = tempfile::tempdir().unwrap();
    std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let image = plimsoll_testing::workspace_root().join("build/images/sandbox");
    let daemon = TestDaemon::start(&format!(
        "providers = [\"{provider}\"]\nstate_dir = \"{}\"\nsandbox_uid_base = {}\n[pools]\n[oci]\nimage = \"{}\"\n{extra}",
        state.path().display(),
        uid_base(slot),
        image.display()
    ));
    (daemon, state)
}

/// `plimsoll session ARGS` against `daemon`.
fn session_command(daemon: &TestDaemon, args: &[&str]) -> Command {
    let mut cmd = plimsoll();
    cmd.arg("session")
        .args(args)
        .env("PLIMSOLL_DAEMON", &daemon.url)
        .env("PLIMSOLL_TOKEN", &daemon.token);
    cmd
}

/// #13: `plimsoll session` against a daemon at crun: open, cells keeping state, a step, put
/// and get bytes exact, each call's exchange kept; `plimsoll-attest sign` signs the session as
/// one chain that verifies, and refuses it with a call dropped or two swapped.
#[test]
fn session_commands_keep_state_and_their_exchanges_sign_as_one_chain() {
    let test = "session_commands_keep_state_and_their_exchanges_sign_as_one_chain";
    if !need_root(test) {
        return;
    }
    let (daemon, _state) = session_daemon("crun", 21, "");
    let session = |args: &[&str]| session_command(&daemon, args);
    let out = run(&mut session(&["open", "--lang", "python"]));
    if out.status.code() == Some(3) && !plimsoll_env::strict() {
        eprintln!("SKIP {test}: crun is unavailable: {}", text(&out.stderr));
        return;
    }
    assert_eq!(out.status.code(), Some(0));
    let id = text(&out.stdout).trim().to_owned();
    assert!(text(&out.stderr).contains("provider crun, isolation container"));
    let dir = tempfile::tempdir().unwrap();
    let ex = dir.path().join("session.jsonl");
    let ex = ex.to_str().unwrap();
    let out = run(&mut session(&[
        "run",
        &id,
        "-e",
        "n = 20",
        "--exchanges",
        ex,
    ]));
    assert_eq!(out.status.code(), Some(0));
    let out = run(&mut session(&[
        "step",
        &id,
        "echo 22 > /work/more",
        "--exchanges",
        ex,
    ]));
    assert_eq!(out.status.code(), Some(0));
    let out = run(&mut session(&[
        "run",
        &id,
        "-e",
        "print(n + int(open('/work/more').read()))",
        "--exchanges",
        ex,
    ]));
    assert_eq!(
        (out.status.code(), out.stdout.as_slice()),
        (Some(0), &b"42\n"[..])
    );
    let blob = dir.path().join("blob");
    std::fs::write(&blob, [0u8, 1, 255, 10]).unwrap();
    let out = run(&mut session(&[
        "put",
        &id,
        "x/blob",
        "--from",
        blob.to_str().unwrap(),
        "--exchanges",
        ex,
    ]));
    assert_eq!(out.status.code(), Some(0));
    let out = run(&mut session(&["get", &id, "x/blob", "--exchanges", ex]));
    assert_eq!(
        (out.status.code(), out.stdout.as_slice()),
        (Some(0), &[0u8, 1, 255, 10][..])
    );
    let out = run(&mut session(&["list"]));
    assert!(text(&out.stdout).contains(&id));
    let out = run(&mut session(&["close", &id]));
    assert_eq!(out.status.code(), Some(0));
    let out = run(&mut session(&["run", &id, "-e", "print(n)"]));
    assert_eq!(
        out.status.code(),
        Some(3),
        "a closed session's call runs nothing"
    );
    assert!(text(&out.stderr).contains("session_ended") || text(&out.stderr).contains("has ended"));
    // #28.9: with --json, the daemon's own code and the session's end reason, not the bare
    // reason.
    let out = run(&mut session(&["run", &id, "-e", "print(n)", "--json"]));
    assert_eq!(out.status.code(), Some(3));
    let refused: ErrorResponse = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (
            refused.error.code.as_str(),
            refused.error.not_dispatched,
            refused.error.end_reason
        ),
        (
            "session_ended",
            Some(Reason::Request),
            Some(plimsoll_wire::EndReason::Closed)
        ),
        "{refused:?}"
    );
    // An interpreter that ended: its next cell is refused `interpreter_ended` until a restart.
    let out = run(&mut session(&["open", "--lang", "python"]));
    assert_eq!(out.status.code(), Some(0));
    let second = text(&out.stdout).trim().to_owned();
    let out = run(&mut session(&[
        "run",
        &second,
        "-e",
        "import os; os._exit(3)",
    ]));
    assert!(
        text(&out.stderr).contains("the interpreter ended"),
        "{}",
        text(&out.stderr)
    );
    let out = run(&mut session(&["run", &second, "-e", "print(1)", "--json"]));
    assert_eq!(out.status.code(), Some(3));
    let refused: ErrorResponse = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (refused.error.code.as_str(), refused.error.not_dispatched),
        ("interpreter_ended", Some(Reason::Request)),
        "{refused:?}"
    );
    let out = run(&mut session(&[
        "run",
        &second,
        "-e",
        "print(1)",
        "--restart",
    ]));
    assert_eq!(
        (out.status.code(), out.stdout.as_slice()),
        (Some(0), &b"1\n"[..])
    );
    assert_eq!(
        run(&mut session(&["close", &second])).status.code(),
        Some(0)
    );

    // Signed as one chain, verified; a dropped or reordered call is refused.
    let attest = plimsoll_testing::tool_binary("plimsoll-attest", "plimsoll-attest").unwrap();
    #[allow(
        clippy::disallowed_methods,
        reason = "the test runs the built plimsoll-attest as a user would"
    )]
    let attest_cmd = |args: &[&str]| {
        let mut cmd = Command::new(&attest);
        cmd.args(args).stdin(Stdio::null());
        run(&mut cmd)
    };
    let key = dir.path().join("k");
    let key = key.to_str().unwrap();
    assert_eq!(attest_cmd(&["keygen", "--out", key]).status.code(), Some(0));
    let (private, public) = (format!("{key}.key"), format!("{key}.pub"));
    let bundle = dir.path().join("b.jsonl");
    let out = attest_cmd(&["sign", "--key", &private, bundle.to_str().unwrap(), ex]);
    assert_eq!(out.status.code(), Some(0));
    let out = attest_cmd(&["verify", "--pub", &public, bundle.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    let lines: Vec<String> = std::fs::read_to_string(ex)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(lines.len(), 5);
    // #28.10: each exchange is written with its members in protocol order (docs/protocol.md's
    // tables), not sorted.
    for line in &lines {
        in_protocol_order(line, &[], &["request", "response"]);
        in_protocol_order(
            line,
            &["request"],
            &[
                "protocol",
                "request_id",
                "minimum_isolation",
                "provider",
                "limits",
                "run",
                "grant",
                "image",
            ],
        );
        in_protocol_order(
            line,
            &["response"],
            &[
                "protocol",
                "request_id",
                "provider",
                "isolation",
                "duration_ms",
                "request_sha256",
                "result_sha256",
                "result",
                "record",
            ],
        );
        in_protocol_order(
            line,
            &["response", "result"],
            &[
                "exit_code",
                "signal",
                "timed_out",
                "oom_killed",
                "stdout",
                "stdout_truncated",
                "stderr",
                "stderr_truncated",
                "steps",
                "artifacts",
                "calls",
                "start",
                "member_age_ms",
                "wall",
                "state_kept",
                "interpreter_end",
            ],
        );
        in_protocol_order(
            line,
            &["response", "record"],
            &[
                "request_id",
                "request_sha256",
                "result_sha256",
                "provider",
                "isolation",
                "minimum_isolation",
                "evidence_sha256",
                "environment",
                "started_unix_ms",
                "ended_unix_ms",
                "session",
                "image",
                "record_sha256",
            ],
        );
    }
    for (name, kept) in [
        (
            "dropped",
            [&lines[0], &lines[2], &lines[3], &lines[4]]
                .map(|l| l.as_str())
                .to_vec(),
        ),
        (
            "swapped",
            [&lines[0], &lines[2], &lines[1], &lines[3], &lines[4]]
                .map(|l| l.as_str())
                .to_vec(),
        ),
    ] {
        let file = dir.path().join(format!("{name}.jsonl"));
        std::fs::write(&file, kept.join("\n") + "\n").unwrap();
        let b = dir.path().join(format!("{name}-bundle.jsonl"));
        let out = attest_cmd(&[
            "sign",
            "--key",
            &private,
            b.to_str().unwrap(),
            file.to_str().unwrap(),
        ]);
        assert_ne!(
            out.status.code(),
            Some(0),
            "{name}: a broken session chain was signed"
        );
        assert!(!b.exists(), "{name}: a refused chain left a bundle");
    }
}

/// Asserts that the object at `path` in the JSON `text` writes its members in the order of
/// `order` (each one it has, none it lacks), read from the text itself: a parsed value keeps
/// no order.
fn in_protocol_order(text: &str, path: &[&str], order: &[&str]) {
    let names = member_names(text, path);
    assert!(!names.is_empty(), "no object at {path:?} in {text}");
    let want: Vec<&str> = order
        .iter()
        .copied()
        .filter(|n| names.iter().any(|m| m == n))
        .collect();
    assert_eq!(names, want, "the members at {path:?} of {text}");
}

/// The member names of the object at `path` (member names from the top; an array's items are
/// `[]`) in `text`, in the order written.
fn member_names(text: &str, path: &[&str]) -> Vec<String> {
    let mut names = Vec::new();
    // Each open object or array: whether it is an object, and the member it is the value of.
    let mut open: Vec<(bool, Option<String>)> = Vec::new();
    let mut key: Option<String> = None;
    let mut expect_key = false;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                let mut s = String::new();
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => s.extend(chars.next()),
                        '"' => break,
                        c => s.push(c),
                    }
                }
                if expect_key {
                    let here: Vec<&str> = open
                        .iter()
                        .skip(1)
                        .map(|(_, k)| k.as_deref().unwrap_or("[]"))
                        .collect();
                    if here == path {
                        names.push(s.clone());
                    }
                    key = Some(s);
                    expect_key = false;
                }
            }
            '{' => {
                open.push((true, key.take()));
                expect_key = true;
            }
            '[' => open.push((false, key.take())),
            '}' | ']' => {
                open.pop();
                key = None;
            }
            ',' => {
                expect_key = open.last().is_some_and(|(object, _)| *object);
                key = None;
            }
            _ => {}
        }
    }
    names
}

/// #28.7 end to end: a daemon at crun (default floor container) behind a proxy that lowers
/// every run answer's tier and applied floor to `process` and recomputes the record digest.
/// With no floor sent, `plimsoll run --daemon` exits 4 (may have run: an evidence mismatch,
/// the code ran below the daemon's default floor) and `plimsoll mcp --daemon`'s `run_code`
/// says the code may have run; neither reports a run, nor "nothing ran".
#[test]
fn run_and_mcp_through_a_daemon_refuse_a_run_lowered_below_the_default_floor() {
    let test = "run_and_mcp_through_a_daemon_refuse_a_run_lowered_below_the_default_floor";
    if !need_root(test) {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    // This crate's own checkout (the image is refused through anything but its real path).
    let image = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../build/images/sandbox");
    let image = std::fs::canonicalize(&image).unwrap_or(image);
    let daemon = TestDaemon::start(&format!(
        "providers = [\"crun\"]\nstate_dir = \"{}\"\nsandbox_uid_base = {}\n[pools]\n[oci]\nimage = \"{}\"\n",
        state.path().display(),
        uid_base(22),
        image.display()
    ));
    // Straight to the daemon the run meets its default floor (or crun is missing here).
    let out = run(plimsoll()
        .args([
            "run",
            "--json",
            "--daemon",
            &daemon.url,
            "-e",
            "console.log(1)",
        ])
        .env("PLIMSOLL_TOKEN", &daemon.token));
    if out.status.code() == Some(3) && !plimsoll_env::strict() {
        eprintln!("SKIP {test}: crun is unavailable: {}", text(&out.stdout));
        return;
    }
    assert_eq!(out.status.code(), Some(0));
    let honest: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&honest["isolation"], &honest["record"]["minimum_isolation"]),
        (&Value::from("container"), &Value::from("container"))
    );

    let proxy = downgrading_proxy(&daemon.url);
    let out = run(plimsoll()
        .args(["run", "--daemon", &proxy, "-e", "console.log(1)"])
        .env("PLIMSOLL_TOKEN", &daemon.token));
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("evidence mismatch")
            && text(&out.stderr).contains("below the floor `container`"),
        "{}",
        text(&out.stderr)
    );

    // The MCP server on stdio, its runs through the Rust client and the proxy.
    let mut mcp = plimsoll()
        .args(["mcp", "--daemon", &proxy])
        .env("PLIMSOLL_TOKEN", &daemon.token)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdin = mcp.stdin.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(mcp.stdout.take().unwrap()));
    let mut answer_to = |id: u64| -> Value {
        loop {
            let line = lines.next().expect("the MCP server answered").unwrap();
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["id"] == id {
                return v;
            }
        }
    };
    for message in [
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "cli-test", "version": "0"}}}),
        serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    ] {
        writeln!(stdin, "{message}").unwrap();
    }
    assert!(answer_to(1)["result"].is_object());
    let call = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "run_code", "arguments": {"language": "javascript", "code": "console.log(1)"}}});
    writeln!(stdin, "{call}").unwrap();
    let result = answer_to(2)["result"].clone();
    drop(stdin);
    let _ = mcp.wait();
    assert_eq!(result["isError"], true, "{result}");
    let said = result["content"][0]["text"].as_str().unwrap_or_default();
    assert!(said.contains("may have run"), "{said}");
    assert!(said.contains("evidence mismatch"), "{said}");
}

/// A proxy on loopback in front of `upstream` that rewrites every run answer to say it ran
/// at `process` under a `process` floor, its record digest recomputed; everything else
/// passes unchanged. Its threads end with the test.
fn downgrading_proxy(upstream: &str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let upstream = upstream.to_owned();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let upstream = upstream.clone();
            std::thread::spawn(move || downgrade_one(conn, &upstream));
        }
    });
    url
}

fn downgrade_one(mut conn: std::net::TcpStream, upstream: &str) {
    use std::io::BufRead as _;
    let mut r = std::io::BufReader::new(&conn);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let mut parts = line.split_whitespace();
    let (method, path) = (
        parts.next().unwrap().to_owned(),
        parts.next().unwrap().to_owned(),
    );
    let (mut auth, mut length) = (String::new(), 0usize);
    loop {
        let mut h = String::new();
        r.read_line(&mut h).unwrap();
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap();
        match k.trim().to_ascii_lowercase().as_str() {
            "authorization" => auth = v.trim().to_owned(),
            "content-length" => length = v.trim().parse().unwrap(),
            _ => {}
        }
    }
    let mut body = vec![0; length];
    r.read_exact(&mut body).unwrap();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .proxy(None)
        .build()
        .into();
    let url = format!("{upstream}{path}");
    let mut resp = match method.as_str() {
        "POST" => agent
            .post(&url)
            .header("authorization", &auth)
            .header("content-type", "application/json")
            .send(&body[..])
            .unwrap(),
        _ => agent
            .get(&url)
            .header("authorization", &auth)
            .call()
            .unwrap(),
    };
    let status = resp.status().as_u16();
    let mut answer = resp.body_mut().read_to_vec().unwrap();
    if let Ok(mut v) = serde_json::from_slice::<Value>(&answer)
        && v.get("record").is_some()
    {
        v["isolation"] = "process".into();
        v["record"]["isolation"] = "process".into();
        v["record"]["minimum_isolation"] = "process".into();
        let record: plimsoll_wire::RunRecord = serde_json::from_value(v["record"].clone()).unwrap();
        v["record"]["record_sha256"] = plimsoll_wire::digest::record_sha256(&record).into();
        answer = serde_json::to_vec(&v).unwrap();
    }
    let head = format!(
        "HTTP/1.1 {status} Proxied\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        answer.len()
    );
    conn.write_all(head.as_bytes()).unwrap();
    conn.write_all(&answer).unwrap();
}

#[test]
fn image_list_show_and_check_say_what_the_store_holds_and_what_each_image_starts() {
    let test = "image_list_show_and_check_say_what_the_store_holds_and_what_each_image_starts";
    if !need_root(test) {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("plimsoll-cli-image-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let config = dir.path().join("plimsoll.toml");
    std::fs::write(
        &config,
        format!(
            "providers = [\"crun\"]\nstate_dir = {:?}\nsandbox_uid_base = {}\n[pools]\n\
             [oci]\nstate_root = {:?}\ncgroup_parent = \"/plimsoll-cli-image-{}\"\n",
            dir.path().join("state").display().to_string(),
            uid_base(40),
            dir.path().join("oci").display().to_string(),
            std::process::id()
        ),
    )
    .unwrap();
    let cfg = config.to_str().unwrap();
    // The repository's store: the default image listed with its identity and languages.
    let out = run(plimsoll().args(["--config", cfg, "image", "list", "--json"]));
    assert_eq!(out.status.code(), Some(0));
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    let sandbox = list
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "sandbox")
        .expect("the sandbox image is listed");
    assert_eq!(sandbox["default"], true);
    assert!(sandbox["identity"].as_str().unwrap().starts_with("sha256:"));
    assert_eq!(
        sandbox["languages"],
        serde_json::json!(["python", "javascript"])
    );
    // A name the store does not have: a usage error naming what it has.
    let out = run(plimsoll().args(["--config", cfg, "image", "show", "no-such-image"]));
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("no image `no-such-image`") && err.contains("sandbox (sha256:"),
        "{err}"
    );
    // check starts each interpreter and a shell step in the image, for real.
    let out = run(plimsoll().args(["--config", cfg, "image", "check", "sandbox", "--json"]));
    assert_eq!(out.status.code(), Some(0));
    let checked: Value = serde_json::from_slice(&out.stdout).unwrap();
    for what in ["python", "javascript", "shell step"] {
        assert_eq!(checked["checks"][what]["ok"], true, "{what}: {checked}");
    }
    assert!(
        checked["checks"]["python"]["said"]
            .as_str()
            .unwrap()
            .starts_with("3.11")
    );
}

/// `plimsoll trial` at crun: the image's water tank examines the accepted Python controller on
/// two hidden scenarios (the scenario files are sent and deleted in the sandbox; the
/// trajectories come back), the failing draft exits 1 with the simulator's reason, and a
/// simulator the image lacks is refused, not dispatched, with status 3.
#[test]
fn trial_examines_a_controller_with_the_images_simulator() {
    let test = "trial_examines_a_controller_with_the_images_simulator";
    let dir = tempfile::tempdir().unwrap();
    let Some(settings) = crun_settings(test, dir.path(), 12) else {
        return;
    };
    let config = dir.path().join("plimsoll.toml");
    std::fs::write(&config, settings).unwrap();
    let tank = plimsoll_sims::get("tank").unwrap();
    let root = plimsoll_testing::workspace_root();
    let trial = |controller: &str, scenarios: &[&str], simulator: &str| {
        let mut cmd = plimsoll();
        cmd.arg("--config")
            .arg(&config)
            .args(["trial", "--simulator", simulator, "--reproducible"])
            .arg("--controller")
            .arg(root.join("examples/controllers/tank").join(controller))
            .arg("--out")
            .arg(dir.path().join("out"));
        for s in scenarios {
            cmd.arg("--scenario").arg(tank.scenario(s));
        }
        run(&mut cmd)
    };
    let out = trial("accepted.py", &["hidden-1", "hidden-2"], "tank");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("simulator tank 1.0.0"), "{err}");
    assert!(
        err.contains("hidden-1: completed after 1800 ticks"),
        "{err}"
    );
    assert!(
        err.contains("hidden-2: completed after 2400 ticks"),
        "{err}"
    );
    let verdict: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(verdict["simulator"]["name"], "tank");
    for (i, name) in ["hidden-1", "hidden-2"].iter().enumerate() {
        let t = &verdict["trials"][i];
        assert_eq!(t["pass"], true, "{t}");
        let bin = std::fs::read(dir.path().join("out").join(format!("{name}.bin"))).unwrap();
        assert_eq!(t["fingerprint"], plimsoll_wire::digest::sha256_hex(&bin));
    }
    // The scenario files on this side are untouched: only the sandbox's copies are deleted.
    assert!(tank.scenario("hidden-1").exists());

    let out = trial("failing.py", &["hidden-1"], "tank");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("failed after 92 ticks (the tank overflowed"),
        "{}",
        text(&out.stderr)
    );

    let out = trial("accepted.py", &["hidden-1"], "boat");
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("declares no simulator boat"),
        "{}",
        text(&out.stderr)
    );

    // `plimsoll report` of the accepted and the failing controller, from their `--json`
    // answers: one page naming both fingerprints, the simulator and the failure's reason.
    let answer = |controller: &str| {
        let mut cmd = plimsoll();
        cmd.arg("--config")
            .arg(&config)
            .args(["trial", "--simulator", "tank", "--json", "--scenario"])
            .arg(tank.scenario("hidden-1"))
            .arg("--controller")
            .arg(root.join("examples/controllers/tank").join(controller));
        let out = run(&mut cmd);
        let path = dir.path().join(format!("{controller}.json"));
        std::fs::write(&path, &out.stdout).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (
            path,
            v["record"]["trials"][0]["trials"][0]["fingerprint"].clone(),
        )
    };
    let (accepted, accepted_print) = answer("accepted.py");
    let (failing, failing_print) = answer("failing.py");
    let page = dir.path().join("report.html");
    let out = run(plimsoll()
        .arg("report")
        .arg(&accepted)
        .arg(&failing)
        .arg("--out")
        .arg(&page));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let html = std::fs::read_to_string(&page).unwrap();
    for want in [
        accepted_print.as_str().unwrap(),
        failing_print.as_str().unwrap(),
        "the tank overflowed",
        "accepted.py",
        "failing.py",
    ] {
        assert!(html.contains(want), "the page lacks {want}");
    }
    // A file that is not a trial's answer is a usage error, and no page is written.
    std::fs::write(dir.path().join("other.json"), "{\"protocol\": 1}").unwrap();
    let out = run(plimsoll()
        .arg("report")
        .arg(&accepted)
        .arg(dir.path().join("other.json"))
        .arg("--out")
        .arg(dir.path().join("no.html")));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("holds no `request`"),
        "{}",
        text(&out.stderr)
    );
    assert!(!dir.path().join("no.html").exists());
}

/// #29: `plimsoll session snapshot|fork|restore|snapshots|drop-snapshot` against a daemon at
/// runsc: a session holding `x = 41` forked into 2 copies and snapshotted, a session restored
/// from the snapshot; each prints 42. The exchanges of the parent and its branches sign as one
/// tree that verifies; a branch put before the call it hangs from is refused.
#[test]
fn session_snapshots_and_forks_sign_as_a_tree() {
    let test = "session_snapshots_and_forks_sign_as_a_tree";
    if !need_root(test) {
        return;
    }
    let (daemon, _state) = session_daemon(
        "runsc",
        41,
        "[sessions]\nmax_total = 6\nmax_per_caller = 6\n",
    );
    let session = |args: &[&str]| run(&mut session_command(&daemon, args));
    let out = session(&["open", "--lang", "python", "--provider", "runsc"]);
    if out.status.code() == Some(3) && !plimsoll_env::strict() {
        eprintln!("SKIP {test}: runsc is unavailable: {}", text(&out.stderr));
        return;
    }
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let parent = text(&out.stdout).trim().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let ex = dir.path().join("tree.jsonl");
    let ex = ex.to_str().unwrap();
    let out = session(&["run", &parent, "-e", "x = 41", "--exchanges", ex]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = session(&["fork", &parent, "--count", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let copies: Vec<String> = text(&out.stdout).lines().map(str::to_owned).collect();
    assert_eq!(copies.len(), 2, "{}", text(&out.stdout));
    let out = session(&["snapshot", &parent]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let snapshot = text(&out.stdout).trim().to_owned();
    let out = session(&["restore", &snapshot]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let restored = text(&out.stdout).trim().to_owned();
    for id in copies.iter().chain([&restored]) {
        let out = session(&["run", id, "-e", "print(x + 1)", "--exchanges", ex]);
        assert_eq!(
            (out.status.code(), out.stdout.as_slice()),
            (Some(0), &b"42\n"[..]),
            "{}",
            text(&out.stderr)
        );
    }
    let out = session(&["snapshots"]);
    assert_eq!(
        text(&out.stdout).lines().count(),
        2,
        "{}",
        text(&out.stdout)
    );
    assert_eq!(
        session(&["drop-snapshot", &snapshot]).status.code(),
        Some(0)
    );
    let out = session(&["restore", &snapshot]);
    assert_ne!(
        out.status.code(),
        Some(0),
        "a deleted snapshot restores nothing"
    );

    let attest = plimsoll_testing::tool_binary("plimsoll-attest", "plimsoll-attest").unwrap();
    #[allow(
        clippy::disallowed_methods,
        reason = "the test runs the built plimsoll-attest as a user would"
    )]
    let attest_cmd = |args: &[&str]| {
        let mut cmd = Command::new(&attest);
        cmd.args(args).stdin(Stdio::null());
        run(&mut cmd)
    };
    let key = dir.path().join("k");
    let key = key.to_str().unwrap();
    assert_eq!(attest_cmd(&["keygen", "--out", key]).status.code(), Some(0));
    let (private, public) = (format!("{key}.key"), format!("{key}.pub"));
    let bundle = dir.path().join("b.jsonl");
    let out = attest_cmd(&["sign", "--key", &private, bundle.to_str().unwrap(), ex]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = attest_cmd(&["verify", "--pub", &public, bundle.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // The independent check (tests/independent/attest_check.py) agrees.
    #[allow(
        clippy::disallowed_methods,
        reason = "the test runs the project's Python tools as a user would"
    )]
    let python = {
        let root = plimsoll_testing::workspace_root();
        let o = run(Command::new(root.join("scripts/python-env"))
            .env("PATH", "/usr/local/bin:/usr/bin:/bin"));
        assert!(o.status.success(), "{}", text(&o.stderr));
        let python = text(&o.stdout).trim().to_owned();
        run(Command::new(python)
            .arg(root.join("tests/independent/attest_check.py"))
            .args(["bundle", &public, bundle.to_str().unwrap()]))
    };
    assert_eq!(
        python.status.code(),
        Some(0),
        "{}{}",
        text(&python.stdout),
        text(&python.stderr)
    );
    // A branch before the call it hangs from: refused.
    let lines: Vec<String> = std::fs::read_to_string(ex)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(lines.len(), 4);
    let swapped = dir.path().join("swapped.jsonl");
    std::fs::write(
        &swapped,
        format!("{}\n{}\n{}\n{}\n", lines[1], lines[0], lines[2], lines[3]),
    )
    .unwrap();
    let out = attest_cmd(&[
        "sign",
        "--key",
        &private,
        dir.path().join("b2.jsonl").to_str().unwrap(),
        swapped.to_str().unwrap(),
    ]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("hang from its parent"),
        "{}",
        text(&out.stderr)
    );
}
