//! `plimsoll run`: a snippet, a project or a whole request, on the embedded engine or a
//! daemon, with its tier stated; artifacts written under `--out`.

use std::io::{Read as _, Write as _};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, anyhow, bail};
use plimsoll_client::{RunOptions, new_request_id};
use plimsoll_engine::ProviderEvidence;
use plimsoll_wire::{
    EgressReceipt, ErrorResponse, GrantCall, Language, PROTOCOL, Project, ProjectFile, Reason,
    RunRequest, RunResponse, RunResult, RunSpec, Step, Tier,
};

use crate::args::RunArgs;
use crate::local::{client, daemon_url, granted_engine, load_settings};
use crate::{EXIT_FAILED, EXIT_MAY_HAVE_RUN, EXIT_NOT_DISPATCHED, EXIT_OK, Failure};

/// The caller name of runs on the embedded engine.
pub const LOCAL_CALLER: &str = "local";

/// Runs `plimsoll run`.
pub fn run(config: Option<&Path>, a: &RunArgs) -> Result<u8, Failure> {
    let options = options(a).map_err(Failure::usage)?;
    if a.out.is_some() && !matches!(options.run, RunSpec::Project(_)) {
        return Err(Failure::usage(anyhow!(
            "--out DIR is where a project's artifacts go: give --step and --artifact (or a --request holding a project)"
        )));
    }
    // Checked here too, so a bad path or an empty step is a usage error and nothing is sent.
    let request = options.clone().into_request(new_request_id());
    request
        .validate()
        .map_err(|r| Failure::usage(anyhow!("the request is invalid: {}", r.message)))?;
    // What of the output went out as it came (--stream).
    let streamed = Arc::new(Streamed::default());
    match daemon_url(a.daemon.as_deref()) {
        Some(url) => {
            if a.grants.is_some() {
                return Err(Failure::usage(anyhow!(
                    "--grants is for the embedded engine: a daemon's grant profiles are its operator's (plimsolld --grants); name one with --grant"
                )));
            }
            let client = client(&url)?;
            let answered = if a.stream {
                let seen = Arc::clone(&streamed);
                client.run_streamed(options, &mut |c| {
                    seen.write(c.stream, c.bytes.as_slice());
                })
            } else {
                client.run(options)
            };
            match answered {
                Ok(resp) => {
                    // The client sent exactly these options under the id the answer echoes
                    // (it checked the echo and the request digest against what it sent).
                    let sent = RunRequest {
                        request_id: resp.request_id.clone(),
                        ..request
                    };
                    Ok(finish(&sent, &resp, None, a, &streamed))
                }
                Err(e) => Ok(print_error(
                    &e.to_response(),
                    &e.to_string(),
                    plimsoll_wire::not_dispatched_reason(&e),
                    a.json,
                )),
            }
        }
        None => {
            let engine = granted_engine(&load_settings(config)?, a.grants.as_deref())?;
            engine.probe_for(
                request.minimum_isolation,
                request.provider.as_deref(),
                &request.run,
            );
            let hooks = plimsoll_engine::RunHooks {
                tap: a.stream.then(|| {
                    let seen = Arc::clone(&streamed);
                    plimsoll_engine::OutputTap::new(move |stream, _, bytes| {
                        seen.write(stream, bytes);
                    })
                }),
                cancel: None,
            };
            match engine.run_with(LOCAL_CALLER, &request, hooks) {
                Ok(resp) => {
                    // The evidence the run carried, if the engine still holds exactly it.
                    let evidence = engine
                        .evidence(&resp.provider)
                        .filter(|e| e.evidence_sha256 == resp.record.evidence_sha256);
                    Ok(finish(&request, &resp, evidence.as_ref(), a, &streamed))
                }
                Err(e) => Ok(print_error(
                    &e.to_response(),
                    &e.to_string(),
                    plimsoll_wire::not_dispatched_reason(&e),
                    a.json,
                )),
            }
        }
    }
}

/// What to run, from the flags: a snippet (-e, FILE), a project (--step, --file,
/// --artifact) or a whole request (--request).
fn options(a: &RunArgs) -> anyhow::Result<RunOptions> {
    if let Some(path) = &a.request {
        return Ok(RunOptions::from(read_request(path)?));
    }
    let mut options = if let Some(project) = &a.project {
        RunOptions::new(RunSpec::Project(project.clone()))
    } else if a.steps.is_empty() {
        let (language, code) = source(a)?;
        RunOptions::snippet(language, code)
    } else {
        let files = a
            .project_files
            .iter()
            .map(|f| project_file(f))
            .collect::<anyhow::Result<Vec<_>>>()?;
        RunOptions::new(RunSpec::Project(Project {
            files,
            steps: a
                .steps
                .iter()
                .map(|s| Step {
                    name: None,
                    run: s.clone(),
                })
                .collect(),
            artifacts: a.artifacts.clone(),
        }))
    };
    options.minimum_isolation = a.min_isolation;
    options.provider = a.provider.clone();
    options.image = a.image.clone();
    if let Some(ms) = a.timeout_ms {
        options = options.timeout_ms(ms);
    }
    options.grant = a.grant.clone();
    Ok(options)
}

/// A whole request from a JSON file (`-`: standard input). `protocol` and `request_id` may be
/// left out; the id is replaced by a fresh one when it is sent either way.
fn read_request(path: &Path) -> anyhow::Result<RunRequest> {
    let bytes = if path == Path::new("-") {
        let mut b = Vec::new();
        std::io::stdin()
            .read_to_end(&mut b)
            .context("cannot read the request from standard input")?;
        b
    } else {
        std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?
    };
    let mut value: serde_json::Value = serde_json::from_slice(&bytes).with_context(|| {
        format!(
            "{} is not JSON: write one run request object (docs/protocol.md)",
            path.display()
        )
    })?;
    let Some(obj) = value.as_object_mut() else {
        bail!(
            "{} must hold one JSON object, a run request (docs/protocol.md)",
            path.display()
        );
    };
    obj.entry("protocol").or_insert(PROTOCOL.into());
    obj.entry("request_id").or_insert("cli".into());
    let body = serde_json::to_vec(&value).context("the request does not serialise")?;
    plimsoll_wire::parse_request(&body).map_err(|r| {
        anyhow!(
            "{} is not a valid run request: {} (see docs/protocol.md)",
            path.display(),
            r.message
        )
    })
}

/// `PATH[=NAME]`: the local file PATH, written as NAME under /work (default: PATH's file
/// name). The text after the last `=` is the name, so a path holding `=` needs an explicit
/// `=NAME`.
pub(crate) fn project_file(spec: &str) -> anyhow::Result<ProjectFile> {
    let (path, name) = match spec.rsplit_once('=') {
        Some((p, n)) if !p.is_empty() => (PathBuf::from(p), n.to_owned()),
        _ => {
            let p = PathBuf::from(spec);
            let name = p
                .file_name()
                .and_then(|n| n.to_str())
                .ok_or_else(|| {
                    anyhow!("--file {spec}: name the file in the project with --file {spec}=NAME")
                })?
                .to_owned();
            (p, name)
        }
    };
    let content =
        std::fs::read(&path).with_context(|| format!("--file: cannot read {}", path.display()))?;
    let executable = {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::metadata(&path)
            .map(|m| m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    Ok(ProjectFile {
        path: name,
        content: content.into(),
        executable,
    })
}

/// Prints a result (see [`print_result`]), then writes its artifacts under `--out`.
fn finish(
    sent: &RunRequest,
    resp: &RunResponse,
    evidence: Option<&ProviderEvidence>,
    a: &RunArgs,
    streamed: &Streamed,
) -> u8 {
    let mut status = print_result(sent, resp, evidence, a.json, streamed.counts());
    if !a.json {
        for t in &resp.record.trials {
            for line in t.describe() {
                eprintln!("plimsoll: {line}");
            }
        }
    }
    // `plimsoll trial`: a run whose trials did not all pass (or that printed no verdict)
    // failed.
    if a.trial
        && status == EXIT_OK
        && (resp.record.trials.is_empty() || resp.record.trials.iter().any(|t| !t.pass))
    {
        if resp.record.trials.is_empty() && !a.json {
            eprintln!(
                "plimsoll: error: the trial step printed no verdict (its stderr above says why)"
            );
        }
        status = EXIT_FAILED;
    }
    let asked: &[String] = match &sent.run {
        RunSpec::Project(p) => &p.artifacts,
        RunSpec::Snippet(_) => &[],
    };
    let mut failed = false;
    for art in &resp.result.artifacts {
        let line = match &a.out {
            _ if !art.found => format!("artifact {}: not found", art.path),
            None => format!(
                "artifact {}: {} bytes{} (pass --out DIR to write it)",
                art.path,
                art.content.as_slice().len(),
                if art.truncated {
                    ", truncated at the limit"
                } else {
                    ""
                }
            ),
            Some(dir) => match write_artifact(dir, asked, &art.path, art.content.as_slice()) {
                Ok(to) => format!(
                    "artifact {}: {} bytes written to {}{}",
                    art.path,
                    art.content.as_slice().len(),
                    to.display(),
                    if art.truncated {
                        " (truncated at the limit)"
                    } else {
                        ""
                    }
                ),
                Err(e) => {
                    failed = true;
                    eprintln!("plimsoll: error: artifact {}: {e:#}", art.path);
                    continue;
                }
            },
        };
        eprintln!("plimsoll: {line}");
    }
    if failed { EXIT_FAILED } else { status }
}

/// Writes one artifact as `dir/name`, refusing a name that was not asked for or would leave
/// `dir` (absolute, `..`, or through a symbolic link), and never following a link.
pub fn write_artifact(
    dir: &Path,
    asked: &[String],
    name: &str,
    content: &[u8],
) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt as _;
    if !asked.iter().any(|a| a == name) {
        bail!("the answer holds an artifact that was not asked for: not written");
    }
    let rel = Path::new(name);
    let parts: Vec<&std::ffi::OsStr> = rel
        .components()
        .map(|c| match c {
            Component::Normal(p) => Ok(p),
            _ => Err(anyhow!(
                "the name would leave {}: not written (an artifact is a relative path without `.` or `..`)",
                dir.display()
            )),
        })
        .collect::<anyhow::Result<_>>()?;
    let Some((file, parents)) = parts.split_last() else {
        bail!("an empty artifact name: not written");
    };
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut at = dir.to_path_buf();
    for p in parents {
        at.push(p);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => bail!(
                "{} is a symbolic link: not followed, not written",
                at.display()
            ),
            Ok(m) if m.is_dir() => {}
            Ok(_) => bail!("{} is not a directory: not written", at.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir(&at)
                .with_context(|| format!("cannot create {}", at.display()))?,
            Err(e) => return Err(e).with_context(|| format!("cannot inspect {}", at.display())),
        }
    }
    at.push(file);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(&at)
        .with_context(|| {
            format!(
                "cannot write {} (a symbolic link is not followed)",
                at.display()
            )
        })?;
    f.write_all(content)
        .with_context(|| format!("cannot write {}", at.display()))?;
    Ok(at)
}

/// The language and the code: -e, a file, or standard input (`-`).
fn source(a: &RunArgs) -> anyhow::Result<(Language, String)> {
    if let Some(code) = &a.code {
        return Ok((a.lang.unwrap_or(Language::Javascript), code.clone()));
    }
    let file = a
        .file
        .as_deref()
        .ok_or_else(|| anyhow!("give -e CODE or a FILE"))?;
    if file == Path::new("-") {
        let mut code = String::new();
        std::io::stdin()
            .read_to_string(&mut code)
            .context("cannot read the code from standard input (it must be UTF-8)")?;
        return Ok((a.lang.unwrap_or(Language::Javascript), code));
    }
    let code = std::fs::read_to_string(file).with_context(|| {
        format!(
            "cannot read {} (it must be a UTF-8 text file)",
            file.display()
        )
    })?;
    let language = match a.lang {
        Some(l) => l,
        None => language_of(file).ok_or_else(|| {
            anyhow!(
                "cannot tell the language of {} from its extension: pass --lang javascript or --lang python",
                file.display()
            )
        })?,
    };
    Ok((language, code))
}

/// The language a file's extension names.
pub fn language_of(file: &Path) -> Option<Language> {
    match file.extension()?.to_str()? {
        "js" | "mjs" | "cjs" => Some(Language::Javascript),
        "py" => Some(Language::Python),
        _ => None,
    }
}

/// The one-line header printed on stderr before the program's output; the image last.
pub fn header(resp: &RunResponse) -> String {
    let r = &resp.result;
    let image = resp.record.image.as_ref().map_or_else(String::new, |i| {
        format!(", image {} ({})", i.name, i.identity)
    });
    format!(
        "plimsoll: provider {}, isolation {}, {}, timed out {}, truncated {}, {} ms{image}",
        resp.provider,
        resp.isolation,
        ending(r),
        yes_no(r.timed_out),
        truncation(r),
        resp.duration_ms
    )
}

fn ending(r: &RunResult) -> String {
    let mut s = match (r.exit_code, r.signal) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        (None, None) => "no exit code".to_owned(),
    };
    if r.oom_killed {
        s.push_str(" (memory limit)");
    }
    s
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn truncation(r: &RunResult) -> &'static str {
    match (r.stdout_truncated, r.stderr_truncated) {
        (false, false) => "no",
        (true, false) => "stdout",
        (false, true) => "stderr",
        (true, true) => "stdout and stderr",
    }
}

/// Prints a result: JSON on stdout (the response's members, `request`: the request as sent,
/// and from the embedded engine `evidence`, `evidence_sha256`, `evidence_age_ms` and
/// `evidence_cached`), or the header on stderr and the program's exact output on stdout and
/// stderr. Exit 0: the run happened.
pub(crate) fn print_result(
    sent: &RunRequest,
    resp: &RunResponse,
    evidence: Option<&ProviderEvidence>,
    json: bool,
    streamed: [usize; 2],
) -> u8 {
    let age_ms = evidence
        .map(|e| plimsoll_sandbox::unix_ms_now().saturating_sub(e.evidence.checked_unix_ms));
    if json {
        let mut v = serde_json::to_value(resp).unwrap_or_default();
        if let Some(obj) = v.as_object_mut() {
            obj.insert(
                "request".into(),
                serde_json::to_value(sent).unwrap_or_default(),
            );
            if let (Some(e), Some(age)) = (evidence, age_ms) {
                obj.insert(
                    "evidence".into(),
                    serde_json::to_value(&e.evidence).unwrap_or_default(),
                );
                obj.insert("evidence_sha256".into(), e.evidence_sha256.clone().into());
                obj.insert("evidence_age_ms".into(), age.into());
                obj.insert("evidence_cached".into(), e.cached.into());
            }
        }
        print_json(&v);
        return EXIT_OK;
    }
    eprintln!("{}", header(resp));
    if resp.isolation == Tier::Process {
        eprintln!("plimsoll: note: the process tier is no wall for hostile code");
    }
    if let (Some(e), Some(age)) = (evidence, age_ms) {
        eprintln!(
            "plimsoll: evidence {} checked {} s ago{}",
            short(&e.evidence_sha256),
            age / 1000,
            if e.cached {
                " (reused from this host's evidence cache)"
            } else {
                ""
            }
        );
    }
    print_grant_lines(resp);
    // What went out as it came (--stream) is not written again: chunks are exactly the
    // result's leading bytes. The rest (all of it for a run that streams none: a project's
    // steps, a VM's run) goes now.
    let rest = |bytes: &[u8], sent: usize| bytes.get(sent..).unwrap_or_default().to_vec();
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(&rest(resp.result.stdout.as_slice(), streamed[0]));
    let _ = out.flush();
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(&rest(resp.result.stderr.as_slice(), streamed[1]));
    let _ = err.flush();
    EXIT_OK
}

fn short(digest: &str) -> &str {
    digest.get(..12).unwrap_or(digest)
}

/// What the run's grant saw, on stderr: one line per call through the broker and one per
/// connection attempt through the egress proxy (in a session, those since the call before).
pub(crate) fn print_grant_lines(resp: &RunResponse) {
    for c in &resp.result.calls {
        eprintln!("plimsoll: {}", call_line(c));
    }
    for e in &resp.result.egress {
        eprintln!("plimsoll: {}", egress_line(e));
    }
}

/// `s` with control characters escaped: a host or server name in a receipt is whatever the
/// sandboxed code sent, and must neither break the line nor reach the terminal as an escape.
fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// One egress receipt, for the human output: the verdict, where the code asked to go, the
/// address the broker connected to and the TLS server name, what crossed, when (ms from the
/// run's start), the rule that decided, and how it ended.
pub fn egress_line(e: &EgressReceipt) -> String {
    let address = e
        .address
        .as_deref()
        .map_or("no address".into(), |a| format!("to {}", printable(a)));
    let sni = e
        .sni
        .as_deref()
        .map_or("no sni".into(), |n| format!("sni {}", printable(n)));
    let ended = e
        .ended
        .as_deref()
        .map(|x| format!(", ended {}", printable(x)))
        .unwrap_or_default();
    format!(
        "egress {} {} {}:{} {address}, {sni}, {} bytes up, {} bytes down, {}-{} ms, rule {}{ended}",
        printable(&e.verdict),
        printable(&e.kind),
        printable(&e.host),
        e.port,
        e.bytes_up,
        e.bytes_down,
        e.start_ms,
        e.end_ms,
        printable(&e.rule),
    )
}

/// One call through the broker, for the human output.
pub fn call_line(c: &GrantCall) -> String {
    let route = c.route.as_deref().unwrap_or("(no granted route)");
    let outcome = match (c.status, c.error.as_deref()) {
        (Some(status), None) => format!("status {status}"),
        (Some(status), Some(error)) => format!("status {status}, {error}"),
        (None, Some(error)) => error.to_owned(),
        (None, None) => "no answer".to_owned(),
    };
    format!(
        "call {} {route}: {outcome}, {} bytes out, {} bytes in, {} ms",
        c.method, c.request_bytes, c.response_bytes, c.latency_ms
    )
}

/// Prints an error: the error object as JSON on stdout, or its message on stderr. Exit 3
/// when nothing ran, 4 when the code may have run.
pub(crate) fn print_error(
    response: &ErrorResponse,
    message: &str,
    nd: Option<Reason>,
    json: bool,
) -> u8 {
    if json {
        print_json(response);
    } else if nd.is_some() {
        // Every not-dispatched error reads `not dispatched (REASON): MESSAGE`.
        eprintln!("{message}");
    } else {
        eprintln!("plimsoll: error: {message}");
    }
    match nd {
        Some(_) => EXIT_NOT_DISPATCHED,
        None => EXIT_MAY_HAVE_RUN,
    }
}

/// How much of each stream went out as it came (`--stream`).
#[derive(Debug, Default)]
pub(crate) struct Streamed([std::sync::atomic::AtomicUsize; 2]);

impl Streamed {
    /// Writes a chunk of the run's output where the run wrote it, at once, and counts it.
    pub(crate) fn write(&self, stream: plimsoll_wire::OutputStream, bytes: &[u8]) {
        use std::sync::atomic::Ordering;
        let (i, written) = match stream {
            plimsoll_wire::OutputStream::Stdout => {
                let mut o = std::io::stdout().lock();
                (0, o.write_all(bytes).and_then(|()| o.flush()))
            }
            plimsoll_wire::OutputStream::Stderr => {
                let mut e = std::io::stderr().lock();
                (1, e.write_all(bytes).and_then(|()| e.flush()))
            }
        };
        if written.is_ok() {
            self.0[i].fetch_add(bytes.len(), Ordering::SeqCst);
        }
    }

    /// Bytes of stdout and stderr written so far.
    pub(crate) fn counts(&self) -> [usize; 2] {
        use std::sync::atomic::Ordering;
        [
            self.0[0].load(Ordering::SeqCst),
            self.0[1].load(Ordering::SeqCst),
        ]
    }
}

pub(crate) fn print_json<T: serde::Serialize>(value: &T) {
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer_pretty(&mut out, value);
    let _ = writeln!(out);
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn artifacts_are_written_exactly_and_never_outside_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let asked: Vec<String> = ["a/b.bin", "../up", "/etc/x", "link/x", "c"]
            .map(str::to_owned)
            .to_vec();
        let to = write_artifact(&out, &asked, "a/b.bin", b"\xff\x00x").unwrap();
        assert_eq!(to, out.join("a/b.bin"));
        assert_eq!(std::fs::read(&to).unwrap(), b"\xff\x00x");
        // Not asked for (a server that adds files), or leaving the directory.
        for name in ["other", "../up", "/etc/x"] {
            let e = write_artifact(&out, &asked, name, b"x").unwrap_err();
            assert!(e.to_string().contains("not written"), "{name}: {e}");
        }
        assert!(!dir.path().join("up").exists());
        // Through a symbolic link that points out of the directory.
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, out.join("link")).unwrap();
        let e = write_artifact(&out, &asked, "link/x", b"x").unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        // A link as the file itself is not followed either.
        std::os::unix::fs::symlink(outside.join("target"), out.join("c")).unwrap();
        assert!(write_artifact(&out, &asked, "c", b"x").is_err());
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    }

    #[test]
    fn a_project_file_is_named_by_its_path_or_after_the_last_equals_sign() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.sh");
        std::fs::write(&p, b"echo").unwrap();
        let f = project_file(&p.display().to_string()).unwrap();
        assert_eq!((f.path.as_str(), f.executable), ("x.sh", false));
        assert_eq!(f.content.as_slice(), b"echo");
        let f = project_file(&format!("{}=bin/run", p.display())).unwrap();
        assert_eq!(f.path, "bin/run");
        assert!(project_file("/no/such/file").is_err());
    }

    #[test]
    fn languages_come_from_extensions() {
        assert_eq!(language_of(Path::new("a.js")), Some(Language::Javascript));
        assert_eq!(language_of(Path::new("a.mjs")), Some(Language::Javascript));
        assert_eq!(language_of(Path::new("a.cjs")), Some(Language::Javascript));
        assert_eq!(language_of(Path::new("dir/a.py")), Some(Language::Python));
        assert_eq!(language_of(Path::new("a.rb")), None);
        assert_eq!(language_of(Path::new("Makefile")), None);
    }

    #[test]
    fn a_call_line_says_what_happened() {
        let mut c = GrantCall {
            method: "GET".into(),
            route: Some("/orders/*".into()),
            status: Some(200),
            error: None,
            request_bytes: 0,
            response_bytes: 27,
            latency_ms: 3,
            credential: Some(plimsoll_wire::CredentialKind::Minted),
        };
        assert_eq!(
            call_line(&c),
            "call GET /orders/*: status 200, 0 bytes out, 27 bytes in, 3 ms"
        );
        c.route = None;
        c.status = None;
        c.error = Some("route_not_allowed".into());
        assert!(call_line(&c).contains("(no granted route): route_not_allowed"));
    }

    #[test]
    fn an_egress_line_says_what_the_receipt_says() {
        let mut e = EgressReceipt {
            host: "pypi.org".into(),
            port: 443,
            kind: "connect".into(),
            address: Some("151.101.0.223:443".into()),
            sni: Some("pypi.org".into()),
            bytes_up: 517,
            bytes_down: 48_213,
            start_ms: 12,
            end_ms: 340,
            verdict: "allowed".into(),
            rule: "host pypi.org port 443".into(),
            ended: Some("closed".into()),
        };
        assert_eq!(
            egress_line(&e),
            "egress allowed connect pypi.org:443 to 151.101.0.223:443, sni pypi.org, 517 bytes up, 48213 bytes down, 12-340 ms, rule host pypi.org port 443, ended closed"
        );
        // A refusal: nothing connected, no server name read, no end; what the code named
        // cannot break the line or reach the terminal as an escape.
        e = EgressReceipt {
            host: "evil.example\n\u{1b}[2J".into(),
            port: 80,
            kind: "http".into(),
            address: None,
            sni: None,
            bytes_up: 0,
            bytes_down: 0,
            start_ms: 5,
            end_ms: 5,
            verdict: "refused".into(),
            rule: "host_not_allowed".into(),
            ended: None,
        };
        let line = egress_line(&e);
        assert_eq!(
            line,
            "egress refused http evil.example\\n\\u{1b}[2J:80 no address, no sni, 0 bytes up, 0 bytes down, 5-5 ms, rule host_not_allowed"
        );
        assert!(!line.contains('\n') && !line.contains('\u{1b}'));
    }

    #[test]
    fn the_header_says_how_it_ended() {
        let mut r = RunResult {
            signal: Some(9),
            oom_killed: true,
            stderr_truncated: true,
            start: None,
            member_age_ms: None,
            ..RunResult::default()
        };
        assert_eq!(ending(&r), "killed by signal 9 (memory limit)");
        assert_eq!(truncation(&r), "stderr");
        r.exit_code = Some(3);
        r.oom_killed = false;
        assert_eq!(ending(&r), "exit code 3");
    }
}
