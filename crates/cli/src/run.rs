//! `plimsoll run`: one snippet, on the embedded engine or a daemon, with its tier stated.

use std::io::{Read as _, Write as _};
use std::path::Path;

use anyhow::{Context as _, anyhow};
use plimsoll_client::{RunOptions, new_request_id};
use plimsoll_engine::Engine;
use plimsoll_wire::{ErrorResponse, GrantCall, Language, Reason, RunResponse, RunResult, Tier};

use crate::args::RunArgs;
use crate::local::{client, daemon_url, load_settings, unprobed_engine};
use crate::{EXIT_MAY_HAVE_RUN, EXIT_NOT_DISPATCHED, EXIT_OK, Failure};

/// The caller name of runs on the embedded engine.
pub const LOCAL_CALLER: &str = "local";

/// Runs `plimsoll run`.
pub fn run(config: Option<&Path>, a: &RunArgs) -> Result<u8, Failure> {
    let (language, code) = source(a).map_err(Failure::usage)?;
    let mut options = RunOptions::snippet(language, code);
    options.minimum_isolation = a.min_isolation;
    options.provider = a.provider.clone();
    if let Some(ms) = a.timeout_ms {
        options = options.timeout_ms(ms);
    }
    options.grant = a.grant.clone();
    match daemon_url(a.daemon.as_deref()) {
        Some(url) => {
            if a.grants.is_some() {
                return Err(Failure::usage(anyhow!(
                    "--grants is for the embedded engine: a daemon's grant profiles are its operator's (plimsolld --grants); name one with --grant"
                )));
            }
            let client = client(&url)?;
            match client.run(options) {
                Ok(resp) => Ok(print_result(&resp, a.json)),
                Err(e) => Ok(print_error(
                    &e.to_response(),
                    &e.to_string(),
                    plimsoll_wire::not_dispatched_reason(&e),
                    a.json,
                )),
            }
        }
        None => {
            let settings = load_settings(config)?;
            // Read before the engine is built and probed: a missing secret fails at once.
            let grants_file = a.grants.clone().or_else(|| settings.grants_file.clone());
            let grants = match &grants_file {
                Some(path) => Some(Engine::load_grants(path).map_err(Failure::usage)?),
                None => None,
            };
            let mut engine = unprobed_engine(&settings)?;
            if let Some(grants) = grants {
                engine = engine.with_grants(grants);
            }
            let request = options.into_request(new_request_id());
            engine.probe_for(
                request.minimum_isolation,
                request.provider.as_deref(),
                &request.run,
            );
            match engine.run(LOCAL_CALLER, &request) {
                Ok(resp) => Ok(print_result(&resp, a.json)),
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

/// The one-line header printed on stderr before the program's output.
pub fn header(resp: &RunResponse) -> String {
    let r = &resp.result;
    format!(
        "plimsoll: provider {}, isolation {}, {}, timed out {}, truncated {}, {} ms",
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

/// Prints a result: JSON on stdout, or the header on stderr and the program's exact output on
/// stdout and stderr. Exit 0: the run happened.
fn print_result(resp: &RunResponse, json: bool) -> u8 {
    if json {
        print_json(resp);
        return EXIT_OK;
    }
    eprintln!("{}", header(resp));
    if resp.isolation == Tier::Process {
        eprintln!("plimsoll: note: the process tier is no wall for hostile code");
    }
    for c in &resp.result.calls {
        eprintln!("plimsoll: {}", call_line(c));
    }
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(resp.result.stdout.as_slice());
    let _ = out.flush();
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(resp.result.stderr.as_slice());
    let _ = err.flush();
    EXIT_OK
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
fn print_error(response: &ErrorResponse, message: &str, nd: Option<Reason>, json: bool) -> u8 {
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

fn print_json<T: serde::Serialize>(value: &T) {
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer_pretty(&mut out, value);
    let _ = writeln!(out);
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn the_header_says_how_it_ended() {
        let mut r = RunResult {
            signal: Some(9),
            oom_killed: true,
            stderr_truncated: true,
            ..RunResult::default()
        };
        assert_eq!(ending(&r), "killed by signal 9 (memory limit)");
        assert_eq!(truncation(&r), "stderr");
        r.exit_code = Some(3);
        r.oom_killed = false;
        assert_eq!(ending(&r), "exit code 3");
    }
}
