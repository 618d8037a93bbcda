//! The `plimsoll` binary as a user runs it: exit statuses, output streams, JSON shapes, the
//! embedded engine and a real daemon.

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use plimsoll_client::{RunOptions, verify_response};
use plimsoll_daemon::testing::TestDaemon;
use plimsoll_wire::digest::sha256_hex;
use plimsoll_wire::{ErrorResponse, Language, ProvidersResponse, Reason, RunResponse, Tier};
use serde_json::Value;

/// True when the test may go on; prints `SKIP` (or fails under CI=true) otherwise.
fn need_root(test: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    let why = "running sandboxes needs root (the process tier switches to a sandbox uid)";
    if plimsoll_engine::env::strict() {
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
    for v in plimsoll_engine::env::ALL {
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
    assert_eq!(v["isolation"], "process");

    // Recompute every digest over the request the CLI built.
    let resp: RunResponse = serde_json::from_value(v).unwrap();
    let sent = RunOptions::snippet(Language::Javascript, code)
        .min_isolation(Tier::Process)
        .into_request(resp.request_id.clone());
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
        for v in plimsoll_engine::env::ALL {
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
/// held loopback port (as plimsoll_daemon::testing does), for tests that write settings.
fn scratch() -> (tempfile::TempDir, TcpListener, u32) {
    let dir = tempfile::Builder::new()
        .prefix("plimsoll-cli-init-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let port = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = plimsoll_daemon::testing::uid_base_for_port(port.local_addr().unwrap().port());
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
    assert_eq!(mode(callers.parent().unwrap()), 0o700);
    assert_eq!(mode(&callers), 0o600);
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
        .args(["run", "--daemon", &url, "-e", "console.log(1)"])
        .env("PLIMSOLL_TOKEN", "plm_x"));
    assert_eq!(out.status.code(), Some(4));
    assert!(
        text(&out.stderr).contains("may have run"),
        "{}",
        text(&out.stderr)
    );

    // A refusal that does not echo our id cannot be trusted: may have run.
    let url = canned_server(
        422,
        r#"{"protocol":1,"request_id":"someone-else","error":{"code":"isolation","message":"no","not_dispatched":"isolation"}}"#,
    );
    let out = run(plimsoll()
        .args(["run", "--json", "--daemon", &url, "-e", "console.log(1)"])
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
