//! Egress grants end to end at crun, runc, runsc and qemu (docs/capability-grants.md, "Egress"):
//! real clients inside the sandbox (pip, npm, Python's urllib, node's fetch, a hand-made TLS
//! client) reach real servers on the host's loopback (scripts/egress-fixture: pypiserver over
//! TLS, a static npm registry, an HTTPS and a plain-HTTP file server, behind the test CA of
//! tests/fixtures/egress) through the broker, and every refusal is checked on the receipts and
//! on the servers, which must see nothing of a refused request. Needs root, the runtimes and
//! the images `sandbox` and `egress-test` (skipped without, failed under CI=true).

use std::path::PathBuf;
use std::time::Duration;

use plimsoll_broker::GrantProfiles;
use plimsoll_engine::{Engine, Reason, RunError, SessionCallKind, Settings, not_dispatched_reason};
use plimsoll_testing::egress::EgressFixture;
use plimsoll_testing::{TestDir, is_root, skip_or_fail};
use plimsoll_wire::digest::result_sha256;
use plimsoll_wire::{
    EgressReceipt, Language, Limits, PROTOCOL, Project, ProjectFile, RunRequest, RunResponse,
    RunSpec, SessionOpenRequest, Step, Tier,
};

const CALLER: &str = "egress";

/// The repository's image store, `build/images`.
fn store() -> PathBuf {
    plimsoll_engine::settings::default_image_dir()
        .parent()
        .expect("the image store")
        .to_owned()
}

/// The grants every test uses, against the fixture's ports:
/// - `pkgs`: the fixture's names, pinned to 127.0.0.1, which `addresses` lets through;
///   `other.plimsoll.test` is pinned too but not listed.
/// - `strict`: the same names with no address range (so loopback is refused), `localhost`
///   through the system resolver, and a name pinned to a private address.
/// - `tiny`: 1 MiB down in all, and 2 s a connection.
fn grants(f: &EgressFixture) -> GrantProfiles {
    let ports = ["pypi", "registry", "files", "plain"]
        .iter()
        .map(|s| f.port(s).to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let pins = "resolve = { \"pypi.plimsoll.test\" = [\"127.0.0.1\"], \"registry.plimsoll.test\" = [\"127.0.0.1\"], \
                \"files.plimsoll.test\" = [\"127.0.0.1\"], \"other.plimsoll.test\" = [\"127.0.0.1\"], \
                \"private.plimsoll.test\" = [\"10.1.2.3\"] }";
    let text = format!(
        "[egress.pkgs]\ncallers = [\"{CALLER}\"]\n\
         hosts = [\"pypi.plimsoll.test\", \"registry.plimsoll.test\", \"files.plimsoll.test\"]\n\
         ports = [{ports}]\naddresses = [\"127.0.0.0/8\"]\n{pins}\n\
         [egress.strict]\ncallers = [\"{CALLER}\"]\n\
         hosts = [\"files.plimsoll.test\", \"localhost\", \"private.plimsoll.test\"]\n\
         ports = [{ports}]\n{pins}\n\
         [egress.tiny]\ncallers = [\"{CALLER}\"]\nhosts = [\"files.plimsoll.test\"]\nports = [{ports}]\n\
         addresses = [\"127.0.0.0/8\"]\n{pins}\nmax_bytes_down = 1048576\nmax_connection_secs = 2\n"
    );
    GrantProfiles::parse(&text, |_| None).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// The broker process, as plimsolld starts it (docs/privileges.md): every egress test goes
/// through it, so the proxy runs unprivileged under its seccomp filter here as in the daemon.
fn broker_process(test: &str) -> Option<std::sync::Arc<plimsoll_broker::apart::Apart>> {
    use plimsoll_broker::apart::{Apart, ProcessUser};
    let user = match ProcessUser::lookup(plimsoll_broker::apart::DEFAULT_USER) {
        Ok(u) => u,
        Err(why) => {
            skip_or_fail(
                test,
                &format!(
                    "the broker process's user plimsoll-broker, {why}: run scripts/install-deps"
                ),
            );
            return None;
        }
    };
    let plimsolld = plimsoll_testing::tool_binary("plimsolld", "plimsoll-daemon")
        .unwrap_or_else(|e| panic!("{e}"));
    Some(Apart::start(&plimsolld, user).unwrap_or_else(|e| panic!("the broker process: {e}")))
}

/// An engine offering `provider`, probed, with the grants above; and the fixture.
fn rig(
    test: &str,
    slot: u32,
    provider: &str,
    needs: &[&str],
) -> Option<(Engine, EgressFixture, TestDir)> {
    if !is_root() {
        skip_or_fail(test, "needs root to run sandboxes");
        return None;
    }
    for name in needs {
        if !store().join(name).join("identity").is_file() {
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
    ] {
        plimsoll_testing::tool_binary(tool, package).unwrap_or_else(|e| panic!("{e}"));
    }
    let dir = TestDir::new("egress", test);
    let fixture =
        EgressFixture::start(&dir.path().join("fixture")).unwrap_or_else(|e| panic!("{e}"));
    let toml = format!(
        "providers = [\"{provider}\"]\ndefault_floor = \"process\"\nstate_dir = {state:?}\n\
         sandbox_uid_base = {uid}\nmax_concurrent = 2\nmax_per_caller = 2\n[pools]\n\
         [sessions]\nmax_total = 1\nmax_per_caller = 1\n\
         [oci]\nstate_root = {oci:?}\ncgroup_parent = \"/plimsoll-egress-{pid}-{slot}\"\n",
        state = dir.path().join("state").display().to_string(),
        oci = dir.path().join("oci").display().to_string(),
        uid = 3_900_000 + slot * 1_000,
        pid = std::process::id(),
    );
    let engine = Settings::parse(&toml)
        .unwrap_or_else(|e| panic!("{e}"))
        .build_engine(&[])
        .unwrap_or_else(|e| panic!("{e}"))
        .with_grants(grants(&fixture))
        .with_brokers(plimsoll_broker::apart::Brokers::Apart(broker_process(
            test,
        )?));
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
    Some((engine, fixture, dir))
}

fn project(files: &[(&str, &str)], steps: &[&str]) -> RunSpec {
    RunSpec::Project(Project {
        files: files
            .iter()
            .map(|(path, content)| ProjectFile {
                path: (*path).into(),
                content: (*content).into(),
                executable: false,
            })
            .collect(),
        steps: steps
            .iter()
            .map(|s| Step {
                name: None,
                run: (*s).into(),
            })
            .collect(),
        artifacts: Vec::new(),
    })
}

fn request(id: &str, image: &str, grant: &str, run: RunSpec) -> RunRequest {
    RunRequest {
        protocol: PROTOCOL,
        request_id: id.into(),
        minimum_isolation: Some(Tier::Container),
        provider: None,
        limits: Some(Limits {
            timeout_ms: Some(120_000),
            memory_bytes: Some(512 << 20),
            ..Limits::default()
        }),
        run,
        grant: Some(grant.into()),
        image: Some(image.into()),
    }
}

/// What the code printed: every step's output in order for a project, else the run's.
fn stdout(r: &RunResponse) -> String {
    if r.result.steps.is_empty() {
        return String::from_utf8_lossy(r.result.stdout.as_slice()).into_owned();
    }
    r.result
        .steps
        .iter()
        .map(|s| String::from_utf8_lossy(s.stdout.as_slice()).into_owned())
        .collect()
}

fn explain(r: &RunResponse) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}\nsteps: {:#?}\negress: {:#?}",
        r.result.exit_code,
        stdout(r),
        String::from_utf8_lossy(r.result.stderr.as_slice()),
        r.result
            .steps
            .iter()
            .map(|s| (
                s.exit_code,
                String::from_utf8_lossy(s.stdout.as_slice()).into_owned(),
                String::from_utf8_lossy(s.stderr.as_slice()).into_owned()
            ))
            .collect::<Vec<_>>(),
        r.result.egress
    )
}

/// The run's result digest covers its receipts: the answer's digest is that of the result
/// with them, and changes without them.
fn receipts_are_covered(r: &RunResponse) {
    assert_eq!(result_sha256(&r.result), r.result_sha256);
    let mut without = r.result.clone();
    without.egress.clear();
    assert_ne!(result_sha256(&without), r.result_sha256);
}

fn summary(receipts: &[EgressReceipt]) -> Vec<(String, String, String)> {
    receipts
        .iter()
        .map(|r| (r.host.clone(), r.verdict.clone(), r.rule.clone()))
        .collect()
}

/// A Python step that fetches `url` and prints what came, or `refused: <error>`.
fn fetch_py(url: &str) -> String {
    format!(
        "python3 -c 'import urllib.request as u\ntry:\n    print(u.urlopen(\"{url}\", timeout=20).read().decode().strip())\nexcept Exception as e:\n    print(\"refused:\", type(e).__name__, e)'"
    )
}

/// urllib and node's fetch over TLS, and urllib over plain HTTP, reach the listed host; each
/// connection's receipt names the host, the address connected, the server name and the bytes.
fn listed_hosts_are_reached(provider: &str, slot: u32) {
    let test = format!("{provider}::listed_hosts_are_reached");
    let Some((engine, f, _dir)) = rig(&test, slot, provider, &["sandbox"]) else {
        return;
    };
    let files = f.port("files");
    let plain = f.port("plain");
    let ca = f.ca_pem();
    let steps = [
        format!(
            "SSL_CERT_FILE=/work/ca.pem {}",
            fetch_py(&format!("https://files.plimsoll.test:{files}/hello.txt"))
        ),
        format!(
            "NODE_EXTRA_CA_CERTS=/work/ca.pem node -e 'fetch(\"https://files.plimsoll.test:{files}/hello.txt\").then(r => r.text()).then(t => process.stdout.write(t))'"
        ),
        fetch_py(&format!("http://files.plimsoll.test:{plain}/hello.txt")),
    ];
    let steps: Vec<&str> = steps.iter().map(String::as_str).collect();
    let r = engine
        .run(
            CALLER,
            &request(
                "reach",
                "sandbox",
                "pkgs",
                project(&[("ca.pem", &ca)], &steps),
            ),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.result.exit_code, Some(0), "{}", explain(&r));
    assert_eq!(
        stdout(&r),
        "egress-ok\negress-ok\negress-ok\n",
        "{}",
        explain(&r)
    );
    let e = &r.result.egress;
    assert_eq!(e.len(), 3, "{}", explain(&r));
    for (i, kind) in [(0, "connect"), (1, "connect"), (2, "http")] {
        let x = &e[i];
        let port = if kind == "http" { plain } else { files };
        assert_eq!(
            (x.host.as_str(), x.port, x.kind.as_str(), x.verdict.as_str()),
            ("files.plimsoll.test", port, kind, "allowed"),
            "{x:?}"
        );
        assert_eq!(
            x.address.as_deref(),
            Some(format!("127.0.0.1:{port}").as_str()),
            "{x:?}"
        );
        assert_eq!(
            x.rule,
            format!("host files.plimsoll.test port {port} via 127.0.0.0/8")
        );
        assert_eq!(x.ended.as_deref(), Some("closed"), "{x:?}");
        assert!(
            x.bytes_up > 0 && x.bytes_down > 0 && x.end_ms >= x.start_ms,
            "{x:?}"
        );
        let sni = (kind == "connect").then_some("files.plimsoll.test");
        assert_eq!(x.sni.as_deref(), sni, "{x:?}");
    }
    receipts_are_covered(&r);
}

/// Every refusal at once, under the grant without an address range: nothing reaches any of
/// the fixture's servers, and each attempt's receipt says why.
fn refused_requests_reach_nothing(provider: &str, slot: u32) {
    let test = format!("{provider}::refused_requests_reach_nothing");
    let Some((engine, f, _dir)) = rig(&test, slot, provider, &["sandbox"]) else {
        return;
    };
    let files = f.port("files");
    let plain = f.port("plain");
    let before: Vec<u64> = ["pypi", "registry", "files", "plain"]
        .iter()
        .map(|s| f.connections(s))
        .collect();
    // A TLS client that names another server in its ClientHello than in its CONNECT.
    let fronting = format!(
        "python3 -c 'import socket, ssl\ns = socket.create_connection((\"127.0.0.1\", 3128))\n\
         s.sendall(b\"CONNECT files.plimsoll.test:{files} HTTP/1.1\\r\\nHost: files.plimsoll.test:{files}\\r\\n\\r\\n\")\n\
         print(s.recv(100).split(b\"\\r\\n\")[0].decode())\nctx = ssl.create_default_context()\n\
         try:\n    ctx.wrap_socket(s, server_hostname=\"other.plimsoll.test\")\n    print(\"handshake done\")\n\
         except Exception as e:\n    print(\"refused:\", type(e).__name__)'"
    );
    // Code that skips the proxy: the sandbox's loopback is its own, and it has no other.
    let direct = format!(
        "python3 -c 'import socket\nfor a in [(\"127.0.0.1\", {files}), (\"10.1.2.3\", 443), (\"1.1.1.1\", 443)]:\n    try:\n        socket.create_connection(a, timeout=3)\n        print(\"connected\", a)\n    except OSError as e:\n        print(\"direct refused:\", type(e).__name__)'"
    );
    let steps = [
        fetch_py(&format!("https://other.plimsoll.test:{files}/hello.txt")),
        fetch_py(&format!("https://127.0.0.1:{files}/hello.txt")),
        fetch_py(&format!("https://localhost:{files}/hello.txt")),
        fetch_py(&format!("https://files.plimsoll.test:{files}/hello.txt")),
        fetch_py(&format!("https://private.plimsoll.test:{files}/hello.txt")),
        fetch_py("https://files.plimsoll.test:1/hello.txt"),
        fetch_py(&format!("http://other.plimsoll.test:{plain}/hello.txt")),
        direct,
    ];
    let steps: Vec<&str> = steps.iter().map(String::as_str).collect();
    let r = engine
        .run(
            CALLER,
            &request("refused", "sandbox", "strict", project(&[], &steps)),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.result.exit_code, Some(0), "{}", explain(&r));
    let out = stdout(&r);
    assert!(!out.contains("egress-ok"), "{}", explain(&r));
    let refused = out.lines().filter(|l| l.starts_with("refused:")).count();
    assert_eq!(refused, 7, "{}", explain(&r));
    assert!(!out.contains("connected"), "{}", explain(&r));
    assert_eq!(out.matches("direct refused:").count(), 3, "{}", explain(&r));
    let s = |h: &str, v: &str, rule: &str| (h.to_owned(), v.to_owned(), rule.to_owned());
    assert_eq!(
        summary(&r.result.egress),
        [
            s("other.plimsoll.test", "refused", "host_not_allowed"),
            s("127.0.0.1", "refused", "ip_literal"),
            s("localhost", "refused", "address_not_allowed"),
            s("files.plimsoll.test", "refused", "address_not_allowed"),
            s("private.plimsoll.test", "refused", "address_not_allowed"),
            s("files.plimsoll.test", "refused", "port_not_allowed"),
            s("other.plimsoll.test", "refused", "host_not_allowed"),
        ],
        "{}",
        explain(&r)
    );
    receipts_are_covered(&r);
    // Under the grant that lets the host through, a ClientHello naming another server.
    let r = engine
        .run(
            CALLER,
            &request("fronting", "sandbox", "pkgs", project(&[], &[&fronting])),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let out = stdout(&r);
    assert!(
        out.starts_with("HTTP/1.1 200 Connection established\nrefused:"),
        "{}",
        explain(&r)
    );
    assert_eq!(
        summary(&r.result.egress),
        [s("files.plimsoll.test", "refused", "sni_mismatch")],
        "{}",
        explain(&r)
    );
    let fronted = &r.result.egress[0];
    assert_eq!(
        fronted.sni.as_deref(),
        Some("other.plimsoll.test"),
        "{fronted:?}"
    );
    // No refused request was connected: no server saw a connection.
    std::thread::sleep(Duration::from_millis(300));
    let after: Vec<u64> = ["pypi", "registry", "files", "plain"]
        .iter()
        .map(|s| f.connections(s))
        .collect();
    assert_eq!(before, after, "a refused request reached a server");
}

/// A redirect to an unlisted host, followed by the code, is a new request and refused; a
/// download over the byte budget and a connection that drips past its time are cut.
fn redirects_and_budgets(provider: &str, slot: u32) {
    let test = format!("{provider}::redirects_and_budgets");
    let Some((engine, f, _dir)) = rig(&test, slot, provider, &["sandbox"]) else {
        return;
    };
    let files = f.port("files");
    let ca = f.ca_pem();
    let steps = [
        format!(
            "SSL_CERT_FILE=/work/ca.pem {}",
            fetch_py(&format!("https://files.plimsoll.test:{files}/redirect"))
        ),
        // The drip first: the download then spends what is left of the run's 1 MiB.
        format!(
            "SSL_CERT_FILE=/work/ca.pem {}",
            fetch_py(&format!("https://files.plimsoll.test:{files}/slow"))
        ),
        format!(
            "SSL_CERT_FILE=/work/ca.pem {}",
            fetch_py(&format!("https://files.plimsoll.test:{files}/big"))
        ),
    ];
    let steps: Vec<&str> = steps.iter().map(String::as_str).collect();
    let r = engine
        .run(
            CALLER,
            &request(
                "budgets",
                "sandbox",
                "tiny",
                project(&[("ca.pem", &ca)], &steps),
            ),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.result.exit_code, Some(0), "{}", explain(&r));
    // The redirect's host and the budget are errors to the code; the cut drip may read as a
    // short answer (the TLS stream ends without a close_notify).
    assert!(
        stdout(&r).matches("refused:").count() >= 2,
        "{}",
        explain(&r)
    );
    let e = &r.result.egress;
    assert_eq!(e.len(), 4, "{}", explain(&r));
    // The redirect itself went back to the code; the host it named was refused.
    assert_eq!(
        (e[0].verdict.as_str(), e[0].ended.as_deref()),
        ("allowed", Some("closed")),
        "{e:?}"
    );
    assert_eq!(
        (e[1].host.as_str(), e[1].rule.as_str()),
        ("other.plimsoll.test", "host_not_allowed"),
        "{e:?}"
    );
    assert_eq!(e[3].ended.as_deref(), Some("budget_bytes"), "{e:?}");
    let down: u64 = e.iter().map(|x| x.bytes_down).sum();
    assert!(down <= 1 << 20, "{down} bytes down: {e:?}");
    assert_eq!(e[2].ended.as_deref(), Some("budget_time"), "{e:?}");
    let held = e[2].end_ms - e[2].start_ms;
    assert!(
        (1_900..6_000).contains(&held),
        "the drip was held {held} ms: {e:?}"
    );
    receipts_are_covered(&r);
}

/// pip installs a wheel from a package index in a session opened with the grant, and npm
/// installs a tarball from a registry in a project; each result lists the connections.
fn pip_and_npm_install(provider: &str, slot: u32) {
    let test = format!("{provider}::pip_and_npm_install");
    let Some((engine, f, _dir)) = rig(&test, slot, provider, &["egress-test"]) else {
        return;
    };
    let pypi = f.port("pypi");
    let registry = f.port("registry");
    let open = SessionOpenRequest {
        protocol: PROTOCOL,
        request_id: "open".into(),
        language: Language::Python,
        minimum_isolation: Some(Tier::Container),
        provider: None,
        grant: Some("pkgs".into()),
        limits: None,
        idle_timeout_ms: None,
        max_lifetime_ms: None,
        image: Some("egress-test".into()),
    };
    let info = engine
        .open_session(CALLER, &open)
        .unwrap_or_else(|e| panic!("{e}"));
    let cell = |id: &str, code: &str| {
        let req = RunRequest {
            limits: None,
            minimum_isolation: None,
            image: None,
            grant: None,
            ..request(id, "egress-test", "pkgs", plimsoll_testing::py(code))
        };
        engine
            .session_call(
                CALLER,
                &info.session_id,
                &req,
                SessionCallKind::Cell { restart: false },
                &mut |_| {},
            )
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let r = cell(
        "pip",
        &format!(
            "import subprocess, sys\np = subprocess.run([sys.executable, '-m', 'pip', 'install', '--no-cache-dir', '--target', '/tmp/site', \
             '--index-url', 'https://pypi.plimsoll.test:{pypi}/simple/', 'plimsoll-egress-probe'], capture_output=True, text=True)\n\
             print(p.returncode)\nprint(p.stdout[-2000:], p.stderr[-2000:], file=sys.stderr)"
        ),
    );
    assert!(stdout(&r).starts_with("0\n"), "{}", explain(&r));
    assert!(!r.result.egress.is_empty(), "{}", explain(&r));
    for x in &r.result.egress {
        assert_eq!(
            (
                x.host.as_str(),
                x.port,
                x.verdict.as_str(),
                x.sni.as_deref()
            ),
            (
                "pypi.plimsoll.test",
                pypi,
                "allowed",
                Some("pypi.plimsoll.test")
            ),
            "{x:?}"
        );
    }
    receipts_are_covered(&r);
    let r = cell(
        "use",
        "sys.path.insert(0, '/tmp/site')\nimport plimsoll_egress_probe\nprint(plimsoll_egress_probe.VALUE)",
    );
    assert_eq!(stdout(&r), "egress-ok\n", "{}", explain(&r));
    assert!(r.result.egress.is_empty(), "{}", explain(&r));
    // A call may not name a grant of its own: the session's applies.
    let named = RunRequest {
        limits: None,
        minimum_isolation: None,
        image: None,
        ..request("named", "egress-test", "pkgs", plimsoll_testing::py("1"))
    };
    let e = engine
        .session_call(
            CALLER,
            &info.session_id,
            &named,
            SessionCallKind::Cell { restart: false },
            &mut |_| {},
        )
        .unwrap_err();
    assert_eq!(not_dispatched_reason(&e), Some(Reason::Unsupported), "{e}");
    engine
        .close_session(CALLER, &info.session_id, None)
        .unwrap_or_else(|e| panic!("{e}"));

    let r = engine
        .run(
            CALLER,
            &request(
                "npm",
                "egress-test",
                "pkgs",
                project(
                    &[],
                    &[&format!(
                        "npm install --no-audit --no-fund --registry https://registry.plimsoll.test:{registry}/ plimsoll-egress-probe >&2 && node -e 'console.log(require(\"plimsoll-egress-probe\"))'"
                    )],
                ),
            ),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(stdout(&r), "egress-ok\n", "{}", explain(&r));
    assert!(
        r.result
            .egress
            .iter()
            .all(|x| x.host == "registry.plimsoll.test" && x.verdict == "allowed"),
        "{}",
        explain(&r)
    );
    receipts_are_covered(&r);
}

/// A snippet with an egress grant is refused (the proxy is the agent's), as is a grant the
/// caller is not on; nothing runs.
fn refused_before_dispatch(provider: &str, slot: u32) {
    let test = format!("{provider}::refused_before_dispatch");
    let Some((engine, _f, _dir)) = rig(&test, slot, provider, &["sandbox"]) else {
        return;
    };
    let refusal =
        |e: RunError| not_dispatched_reason(&e).unwrap_or_else(|| panic!("dispatched: {e}"));
    let e = engine
        .run(
            CALLER,
            &request("snippet", "sandbox", "pkgs", plimsoll_testing::py("1")),
        )
        .unwrap_err();
    assert_eq!(refusal(e), Reason::Unsupported);
    let e = engine
        .run(
            "someone-else",
            &request("caller", "sandbox", "pkgs", project(&[], &["true"])),
        )
        .unwrap_err();
    assert_eq!(refusal(e), Reason::Permission);
}

macro_rules! provider_tests {
    ($provider:ident, $slot:expr) => {
        mod $provider {
            #[test]
            fn listed_hosts_are_reached() {
                super::listed_hosts_are_reached(stringify!($provider), $slot);
            }
            #[test]
            fn refused_requests_reach_nothing() {
                super::refused_requests_reach_nothing(stringify!($provider), $slot + 1);
            }
            #[test]
            fn redirects_and_budgets() {
                super::redirects_and_budgets(stringify!($provider), $slot + 2);
            }
            #[test]
            fn refused_before_dispatch() {
                super::refused_before_dispatch(stringify!($provider), $slot + 3);
            }
        }
    };
}

provider_tests!(crun, 0);
provider_tests!(runc, 10);
provider_tests!(runsc, 20);
provider_tests!(qemu, 40);

/// A session opened with an API grant: a Python cell imports the client (its interpreter runs
/// under `-I`) and calls the API, and the call is listed on that cell's result alone.
#[test]
fn crun_session_cells_call_an_api_grant() {
    let test = "crun_session_cells_call_an_api_grant";
    let Some((engine, _f, _dir)) = rig(test, 35, "crun", &["sandbox"]) else {
        return;
    };
    let api = plimsoll_testing::api::TestApi::start(plimsoll_testing::api::Expect::Static {
        header: "authorization".into(),
        value: "Bearer tok-session".into(),
    });
    let text = format!(
        "[profiles.orders]\nbase_url = \"{}\"\nroutes = [\"GET /orders/*\"]\ncallers = [\"{CALLER}\"]\n\
         call_budget = 5\n[profiles.orders.credential]\nkind = \"static\"\nsecret_env = \"SESSION_TOKEN\"\n",
        api.url()
    );
    engine.replace_grants(
        GrantProfiles::parse(&text, |n| {
            (n == "SESSION_TOKEN").then(|| "tok-session".into())
        })
        .unwrap_or_else(|e| panic!("{e}")),
    );
    let open = SessionOpenRequest {
        protocol: PROTOCOL,
        request_id: "open".into(),
        language: Language::Python,
        minimum_isolation: Some(Tier::Container),
        provider: None,
        grant: Some("orders".into()),
        limits: None,
        idle_timeout_ms: None,
        max_lifetime_ms: None,
        image: None,
    };
    let info = engine
        .open_session(CALLER, &open)
        .unwrap_or_else(|e| panic!("{e}"));
    let cell = |id: &str, code: &str| {
        let req = RunRequest {
            limits: None,
            minimum_isolation: None,
            image: None,
            grant: None,
            ..request(id, "sandbox", "orders", plimsoll_testing::py(code))
        };
        engine
            .session_call(
                CALLER,
                &info.session_id,
                &req,
                SessionCallKind::Cell { restart: false },
                &mut |_| {},
            )
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let r = cell(
        "c1",
        "import plimsoll_host as host\nprint(host.get('/orders/7')['path'])",
    );
    assert_eq!(stdout(&r), "/orders/7\n", "{}", explain(&r));
    assert_eq!(r.result.calls.len(), 1, "{:?}", r.result.calls);
    let r = cell("c2", "print('quiet')");
    assert!(r.result.calls.is_empty(), "{:?}", r.result.calls);
    engine
        .close_session(CALLER, &info.session_id, None)
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn crun_pip_and_npm_install() {
    pip_and_npm_install("crun", 30);
}
