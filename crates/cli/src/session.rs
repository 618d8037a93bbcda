//! `plimsoll session ...`: sessions on a daemon (docs/sessions.md). Each call's answer is
//! verified by the client (digests, the tier, the session's chain); a cell's or step's output
//! is written as it comes, then its header on stderr.

use std::io::{Read as _, Write as _};
use std::path::Path;

use anyhow::{Context as _, anyhow};
use plimsoll_client::{Client, ClientError, Session, SessionOptions};
use plimsoll_wire::{
    OutputChunk, OutputStream, RunRequest, RunResponse, SessionInfo, SnapshotInfo, Tier,
};

use crate::args::{DaemonArgs, SessionCommand};
use crate::local::{client, daemon_url};
use crate::run::{Streamed, header, print_error, print_grant_lines, print_json};
use crate::{EXIT_FAILED, EXIT_OK, Failure};

/// Runs `plimsoll session ...`.
pub fn session(command: SessionCommand) -> Result<u8, Failure> {
    match command {
        SessionCommand::Open {
            lang,
            min_isolation,
            provider,
            image,
            grant,
            idle_timeout_ms,
            max_lifetime_ms,
            to,
        } => {
            let c = connect(&to)?;
            let mut options = SessionOptions::new(lang);
            options.minimum_isolation = min_isolation;
            options.provider = provider;
            options.image = image;
            options.grant = grant.clone();
            options.idle_timeout_ms = idle_timeout_ms;
            options.max_lifetime_ms = max_lifetime_ms;
            Ok(match c.open_session(options) {
                Ok(s) => {
                    let info = s.info();
                    if to.json {
                        print_json(info);
                    } else {
                        describe(info, grant.as_deref());
                        println!("{}", info.session_id);
                    }
                    EXIT_OK
                }
                Err(e) => failed(&e, to.json),
            })
        }
        SessionCommand::Run {
            id,
            code,
            file,
            restart,
            timeout_ms,
            to,
        } => {
            let code = match code {
                Some(c) => c,
                None => read_input(file.as_deref())?,
            };
            with_session(&to, &id, |s, on_chunk| {
                s.cell_with(code, restart, timeout_ms, Some(on_chunk))
            })
        }
        SessionCommand::Step {
            id,
            steps,
            timeout_ms,
            to,
        } => with_session(&to, &id, |s, on_chunk| {
            let steps: Vec<&str> = steps.iter().map(String::as_str).collect();
            s.steps_with(&steps, timeout_ms, Some(on_chunk))
        }),
        SessionCommand::Put { id, path, from, to } => {
            let bytes = read_bytes(from.as_deref())?;
            let c = connect(&to)?;
            Ok(
                match c.session(&id).and_then(|mut s| {
                    let resp = s.put(&path, &bytes)?;
                    Ok((s, resp))
                }) {
                    Ok((s, resp)) => {
                        record(&to, &s, &resp)?;
                        if to.json {
                            print_json(&resp);
                        } else {
                            eprintln!("{}", header(&resp));
                            print_grant_lines(&resp);
                        }
                        EXIT_OK
                    }
                    Err(e) => failed(&e, to.json),
                },
            )
        }
        SessionCommand::Get { id, path, out, to } => {
            let c = connect(&to)?;
            match c.session(&id).and_then(|mut s| {
                let (bytes, resp) = s.get(&path)?;
                Ok((s, bytes, resp))
            }) {
                Ok((s, bytes, resp)) => {
                    record(&to, &s, &resp)?;
                    if to.json {
                        print_json(&resp);
                        return Ok(EXIT_OK);
                    }
                    print_grant_lines(&resp);
                    let Some(bytes) = bytes else {
                        eprintln!("plimsoll: /work/{path} is not a file in session {id}");
                        return Ok(EXIT_FAILED);
                    };
                    match out {
                        Some(file) => std::fs::write(&file, &bytes)
                            .with_context(|| format!("cannot write {}", file.display()))
                            .map_err(Failure::failed)?,
                        None => {
                            let mut o = std::io::stdout().lock();
                            let _ = o.write_all(&bytes);
                            let _ = o.flush();
                        }
                    }
                    Ok(EXIT_OK)
                }
                Err(e) => Ok(failed(&e, to.json)),
            }
        }
        SessionCommand::Close { id, to } => {
            let c = connect(&to)?;
            Ok(match c.session(&id).and_then(Session::close) {
                Ok(info) => {
                    if to.json {
                        print_json(&info);
                    } else {
                        eprintln!(
                            "plimsoll: session {} closed after {} calls",
                            info.session_id, info.calls
                        );
                    }
                    EXIT_OK
                }
                Err(e) => failed(&e, to.json),
            })
        }
        command @ (SessionCommand::Snapshot { .. }
        | SessionCommand::Fork { .. }
        | SessionCommand::Restore { .. }
        | SessionCommand::Snapshots { .. }
        | SessionCommand::DropSnapshot { .. }) => snapshots(command),
        SessionCommand::List { to } => {
            let c = connect(&to)?;
            Ok(match c.list_sessions() {
                Ok(list) => {
                    if to.json {
                        print_json(&list);
                    } else {
                        for s in &list.sessions {
                            println!(
                                "{}\t{}\t{}\t{}\t{} calls",
                                s.session_id,
                                s.language.as_str(),
                                s.provider,
                                s.isolation,
                                s.calls
                            );
                        }
                    }
                    EXIT_OK
                }
                Err(e) => failed(&e, to.json),
            })
        }
    }
}

/// `plimsoll session snapshot|fork|restore|snapshots|drop-snapshot`.
fn snapshots(command: SessionCommand) -> Result<u8, Failure> {
    let print_snapshot = |s: &SnapshotInfo| {
        eprintln!(
            "plimsoll: snapshot {} of session {} after {} calls: {} bytes, sha256 {}, checkpoint {} ms",
            s.snapshot_id, s.session_id, s.calls, s.bytes, s.sha256, s.checkpoint_ms
        );
    };
    match command {
        SessionCommand::Snapshot { id, to } => {
            let c = connect(&to)?;
            Ok(match c.session(&id).and_then(|mut s| s.snapshot()) {
                Ok(snap) if to.json => {
                    print_json(&snap);
                    EXIT_OK
                }
                Ok(snap) => {
                    print_snapshot(&snap);
                    println!("{}", snap.snapshot_id);
                    EXIT_OK
                }
                Err(e) => failed(&e, to.json),
            })
        }
        SessionCommand::Fork { id, count, to } => {
            let c = connect(&to)?;
            Ok(match c.session(&id).and_then(|mut s| s.fork(count)) {
                Ok((snap, copies)) => {
                    if to.json {
                        let infos: Vec<&SessionInfo> = copies.iter().map(Session::info).collect();
                        print_json(&serde_json::json!({"snapshot": snap, "sessions": infos}));
                    } else {
                        print_snapshot(&snap);
                        for copy in &copies {
                            println!("{}", copy.id());
                        }
                    }
                    EXIT_OK
                }
                Err(e) => failed(&e, to.json),
            })
        }
        SessionCommand::Restore { snapshot, to } => {
            let c = connect(&to)?;
            let found = c.list_snapshots().and_then(|l| {
                l.snapshots
                    .into_iter()
                    .find(|s| s.snapshot_id == snapshot)
                    .ok_or_else(|| ClientError::InvalidRequest {
                        request_id: String::new(),
                        message: format!(
                            "this caller has no snapshot {snapshot}: see `plimsoll session snapshots`"
                        ),
                    })
            });
            Ok(match found.and_then(|s| c.open_snapshot(&s)) {
                Ok(s) if to.json => {
                    print_json(s.info());
                    EXIT_OK
                }
                Ok(s) => {
                    describe(s.info(), None);
                    println!("{}", s.id());
                    EXIT_OK
                }
                Err(e) => failed(&e, to.json),
            })
        }
        SessionCommand::Snapshots { to } => {
            let c = connect(&to)?;
            Ok(match c.list_snapshots() {
                Ok(list) if to.json => {
                    print_json(&list);
                    EXIT_OK
                }
                Ok(list) => {
                    for s in &list.snapshots {
                        println!(
                            "{}\t{}\t{}\t{} calls\t{} bytes",
                            s.snapshot_id, s.session_id, s.provider, s.calls, s.bytes
                        );
                    }
                    EXIT_OK
                }
                Err(e) => failed(&e, to.json),
            })
        }
        SessionCommand::DropSnapshot { snapshot, to } => {
            let c = connect(&to)?;
            Ok(match c.delete_snapshot(&snapshot) {
                Ok(s) if to.json => {
                    print_json(&s);
                    EXIT_OK
                }
                Ok(s) => {
                    eprintln!("plimsoll: snapshot {} deleted", s.snapshot_id);
                    EXIT_OK
                }
                Err(e) => failed(&e, to.json),
            })
        }
        other => unreachable!("not a snapshot command: {other:?}"),
    }
}

fn connect(to: &DaemonArgs) -> Result<Client, Failure> {
    let url = daemon_url(to.daemon.as_deref()).ok_or_else(|| {
        Failure::usage(anyhow!(
            "sessions live in a daemon: pass --daemon URL or set PLIMSOLL_DAEMON"
        ))
    })?;
    client(&url)
}

/// A cell or steps in session `id`: output written as it comes (unless --json), then the
/// header on stderr.
fn with_session(
    to: &DaemonArgs,
    id: &str,
    call: impl FnOnce(&mut Session, &mut dyn FnMut(&OutputChunk)) -> Result<RunResponse, ClientError>,
) -> Result<u8, Failure> {
    let c = connect(to)?;
    let mut session = match c.session(id) {
        Ok(s) => s,
        Err(e) => return Ok(failed(&e, to.json)),
    };
    let json = to.json;
    let streamed = Streamed::default();
    let mut on_chunk = |chunk: &OutputChunk| {
        if !json {
            streamed.write(chunk.stream, chunk.bytes.as_slice());
        }
    };
    Ok(match call(&mut session, &mut on_chunk) {
        Ok(resp) => {
            record(to, &session, &resp)?;
            if json {
                print_json(&resp);
            } else {
                // Whatever did not come as chunks goes now.
                let [out, err] = streamed.counts();
                for (bytes, sent, stream) in [
                    (resp.result.stdout.as_slice(), out, OutputStream::Stdout),
                    (resp.result.stderr.as_slice(), err, OutputStream::Stderr),
                ] {
                    if let Some(rest) = bytes.get(sent..).filter(|r| !r.is_empty()) {
                        Streamed::default().write(stream, rest);
                    }
                }
                eprintln!("{}", header(&resp));
                print_grant_lines(&resp);
                if resp.result.state_kept == Some(false) {
                    match resp.result.interpreter_end {
                        Some(end) => eprintln!(
                            "plimsoll: the interpreter ended ({end}): its state is lost; the next cell needs --restart"
                        ),
                        None => eprintln!(
                            "plimsoll: a fresh interpreter ran this cell (no earlier state)"
                        ),
                    }
                }
            }
            EXIT_OK
        }
        Err(e) => failed(&e, json),
    })
}

/// With `--exchanges FILE`: appends the call's exchange to it, one line.
fn record(to: &DaemonArgs, session: &Session, resp: &RunResponse) -> Result<(), Failure> {
    let (Some(file), Some(request)) = (&to.exchanges, session.last_request()) else {
        return Ok(());
    };
    let line = exchange_line(request, resp)
        .map_err(|e| Failure::failed(anyhow!("cannot encode the exchange: {e}")))?;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
        .and_then(|mut f| f.write_all(&line))
        .with_context(|| format!("cannot append the exchange to {}", file.display()))
        .map_err(Failure::failed)
}

/// One exchange as a line of JSON, `{"request": ..., "response": ...}`, every object's
/// members in protocol order (docs/protocol.md's tables, the wire types' order): each side is
/// written from its own type, not through a map, which would sort them.
fn exchange_line(request: &RunRequest, resp: &RunResponse) -> serde_json::Result<Vec<u8>> {
    let mut line = b"{\"request\":".to_vec();
    serde_json::to_writer(&mut line, request)?;
    line.extend_from_slice(b",\"response\":");
    serde_json::to_writer(&mut line, resp)?;
    line.extend_from_slice(b"}\n");
    Ok(line)
}

fn failed(e: &ClientError, json: bool) -> u8 {
    print_error(
        &e.to_response(),
        &e.to_string(),
        plimsoll_wire::not_dispatched_reason(e),
        json,
    )
}

fn describe(info: &SessionInfo, grant: Option<&str>) {
    if crate::quiet() {
        return;
    }
    let image = info.image.as_ref().map_or_else(String::new, |i| {
        format!(", image {} ({})", i.name, i.identity)
    });
    eprintln!(
        "plimsoll: session on provider {}, isolation {}, idle timeout {} ms, expires at {} (Unix ms){image}",
        info.provider, info.isolation, info.idle_timeout_ms, info.expires_unix_ms
    );
    if let Some(g) = grant {
        eprintln!(
            "plimsoll: the session holds grant {g} for its whole life: each call lists the calls and connections since the call before"
        );
    }
    if info.isolation == Tier::Process {
        eprintln!("plimsoll: note: the process tier is no wall for hostile code");
    }
}

fn read_bytes(file: Option<&Path>) -> Result<Vec<u8>, Failure> {
    let mut bytes = Vec::new();
    match file {
        None => std::io::stdin()
            .read_to_end(&mut bytes)
            .map(|_| ())
            .context("cannot read standard input"),
        Some(p) if p == Path::new("-") => std::io::stdin()
            .read_to_end(&mut bytes)
            .map(|_| ())
            .context("cannot read standard input"),
        Some(p) => std::fs::read(p)
            .map(|b| bytes = b)
            .with_context(|| format!("cannot read {}", p.display())),
    }
    .map_err(Failure::usage)?;
    Ok(bytes)
}

fn read_input(file: Option<&Path>) -> Result<String, Failure> {
    String::from_utf8(read_bytes(file)?)
        .map_err(|_| Failure::usage(anyhow!("the code is not UTF-8")))
}

#[cfg(test)]
mod tests {
    use plimsoll_wire::{Language, PROTOCOL, RunSpec, Snippet};

    use super::*;

    #[test]
    fn an_exchange_line_keeps_protocol_order_and_reads_back() {
        let request = RunRequest {
            image: None,
            protocol: PROTOCOL,
            request_id: "r-1".into(),
            minimum_isolation: Some(Tier::Container),
            provider: None,
            limits: None,
            run: RunSpec::Snippet(Snippet {
                language: Language::Python,
                code: "print(1)".into(),
            }),
            grant: None,
        };
        let line = String::from_utf8(exchange_line(&request, &sample_response()).unwrap()).unwrap();
        assert!(
            line.ends_with("}\n") && !line[..line.len() - 1].contains('\n'),
            "{line}"
        );
        assert!(
            line.starts_with(r#"{"request":{"protocol":1,"request_id":"r-1","minimum_isolation":"container","run":{"kind":"snippet","#),
            "{line}"
        );
        assert!(
            line.contains(r#"},"response":{"protocol":1,"request_id":"r-1","provider":"p","isolation":"container","duration_ms":1,"#),
            "{line}"
        );
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            serde_json::from_value::<RunRequest>(v["request"].clone()).unwrap(),
            request
        );
    }

    fn sample_response() -> RunResponse {
        serde_json::from_value(serde_json::json!({
            "protocol": 1, "request_id": "r-1", "provider": "p", "isolation": "container",
            "duration_ms": 1, "request_sha256": "a", "result_sha256": "b",
            "result": {"exit_code": 0, "timed_out": false, "stdout": "1\n",
                "stdout_truncated": false, "stderr": "", "stderr_truncated": false},
            "record": {"request_id": "r-1", "request_sha256": "a", "result_sha256": "b",
                "provider": "p", "isolation": "container", "minimum_isolation": "container",
                "evidence_sha256": "e", "environment": "x", "started_unix_ms": 1,
                "ended_unix_ms": 2, "record_sha256": "c"}
        }))
        .unwrap()
    }
}
