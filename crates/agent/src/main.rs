//! `plimsoll-agent`: reads one AgentJob (JSON) on stdin, runs it, writes one RunResult
//! (JSON) on stdout and exits 0; exits 2 with one line on stderr when it cannot do the job.
//! With `--session`, serves calls line by line instead. See docs/agent.md.

use std::io::{self, Write as _};
use std::os::fd::AsFd as _;
use std::process::ExitCode;
use std::time::Instant;

use plimsoll_agent::{
    drop_to, one_line, own_wall, read_job, run_job, start_session, start_waiting,
};
use plimsoll_wire::Language;

const USAGE: &str =
    "usage: plimsoll-agent [--wall-first] [--warm LANGUAGE] < job.json > result.json
       plimsoll-agent [--drop-to UID:GID] [--wall-first] --session LANGUAGE < calls > lines
       plimsoll-agent --wall-then-exec PROGRAM [ARG...]
Runs one plimsoll job inside a sandbox: reads an AgentJob as JSON on stdin, writes a
RunResult as JSON on stdout. Exit status 0 with a result, 2 with one line on stderr when the
job cannot be done. With --wall-first, it first writes its own wall (what /proc shows of it:
identity, capabilities, no_new_privs, seccomp, namespaces, root, interfaces, cgroup limits)
as one JSON line on stdout, and only then reads the job. With --wall-then-exec, it writes
its wall the same way and then becomes PROGRAM (execve: the same process, so the wall is
the program's), reading no job. With --warm javascript|python (a warm member's VM), it
starts that interpreter waiting for its code before it reads the job, writes
`plimsoll-member: waiting` as one line on stdout once the interpreter waits, and the job
must then be one snippet of that language.
With --session javascript|python (a session's sandbox), it starts that interpreter with its
session driver in its current directory (the work directory), writes
`plimsoll-session: ready` as one line on stdout once the interpreter takes cells, then
reads one SessionCall as JSON per line on stdin (a `cell` run in the interpreter, whose
state stays for the next; a project `job` run in the same directory; `wall`) and answers
each with one `{\"answer\":...}` line on stdout, after `{\"chunk\":...}` lines of output when
the call streams. At end of stdin it kills everything it started and exits 0. With
--drop-to UID:GID (a session at runsc), it is started as uid 0 holding exactly CAP_SETUID and
CAP_SETGID and becomes UID and GID for good before anything else, so that its standard input
and output stay uid 0's. See docs/agent.md.";

fn fail(message: &str) -> ExitCode {
    eprintln!("plimsoll-agent: {message}");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let started = Instant::now();
    let mut args = std::env::args_os().skip(1);
    let mut wall_first = false;
    let mut warm = None;
    let mut session = None;
    let mut drop_ids = None;
    while let Some(a) = args.next() {
        if a == "--help" || a == "-h" {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        } else if a == "--wall-first" {
            wall_first = true;
        } else if a == "--warm" || a == "--session" {
            let language = match args.next().as_ref().and_then(|l| l.to_str()) {
                Some("javascript") => Language::Javascript,
                Some("python") => Language::Python,
                other => {
                    return fail(&format!(
                        "{} takes javascript or python, not {other:?} (see --help)",
                        a.to_string_lossy()
                    ));
                }
            };
            if a == "--warm" {
                warm = Some(language);
            } else {
                session = Some(language);
            }
        } else if a == "--drop-to" {
            let ids = args.next().and_then(|v| {
                let (u, g) = v.to_str()?.split_once(':')?;
                Some((u.parse::<u32>().ok()?, g.parse::<u32>().ok()?))
            });
            match ids {
                Some(ids) => drop_ids = Some(ids),
                None => return fail("--drop-to takes UID:GID, two numbers (see --help)"),
            }
        } else if a == "--wall-then-exec" {
            return wall_then_exec(args.collect());
        } else {
            return fail(&format!(
                "unexpected argument {}: the job comes on stdin (see --help)",
                a.to_string_lossy()
            ));
        }
    }
    if warm.is_some() && session.is_some() {
        return fail("--warm and --session do not go together (see --help)");
    }
    if let Some((uid, gid)) = drop_ids {
        if session.is_none() {
            return fail("--drop-to goes with --session only (see --help)");
        }
        // First of all: nothing is read or said as uid 0.
        if let Err(e) = drop_to(uid, gid) {
            return fail(&one_line(&e));
        }
    }
    if wall_first && let Err(e) = say_wall() {
        return fail(&e);
    }
    // An egress grant's proxy endpoint, before any code runs.
    if let Err(e) = plimsoll_agent::egress::start_relay_from_env() {
        return fail(&one_line(&e));
    }
    if let Some(language) = session {
        return serve_session(language);
    }
    // A warm member: the interpreter waits before the job is known, and says so.
    let waiting = match warm.map(start_waiting) {
        None => None,
        Some(Ok(w)) => {
            let mut out = io::stdout().lock();
            if let Err(e) = out
                .write_all(plimsoll_sandbox::warm::READY_LINE)
                .and_then(|()| out.flush())
            {
                return fail(&format!("cannot say that it waits: {e}"));
            }
            Some(w)
        }
        Some(Err(e)) => return fail(&one_line(&e)),
    };
    let job = match read_job(io::stdin().lock()) {
        Ok(job) => job,
        Err(e) => return fail(&one_line(&e)),
    };
    let ran = match waiting {
        Some(w) => w.run(&job),
        None => run_job(&job, started),
    };
    let result = match ran {
        Ok(result) => result,
        Err(e) => return fail(&one_line(&e)),
    };
    let mut out = io::BufWriter::new(io::stdout().lock());
    let written = serde_json::to_writer(&mut out, &result)
        .map_err(io::Error::from)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&format!("cannot write the result to stdout: {e}")),
    }
}

/// `--session LANGUAGE`: starts the interpreter, says it is ready, serves calls until stdin
/// ends.
fn serve_session(language: Language) -> ExitCode {
    let session = match start_session(language) {
        Ok(s) => s,
        Err(e) => return fail(&one_line(&e)),
    };
    let mut out = io::stdout().lock();
    if let Err(e) = out
        .write_all(plimsoll_wire::SESSION_READY_LINE)
        .and_then(|()| out.flush())
    {
        return fail(&format!("cannot say that the session is ready: {e}"));
    }
    let stdin = io::stdin();
    match session.serve(stdin.as_fd(), &mut out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&one_line(&e)),
    }
}

/// Writes this process's own wall, as its /proc shows it, as one JSON line on stdout: said
/// before any of a job is known.
fn say_wall() -> Result<(), String> {
    let wall = own_wall().map_err(|e| one_line(&e))?;
    let mut out = io::stdout().lock();
    serde_json::to_writer(&mut out, &wall)
        .map_err(io::Error::from)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush())
        .map_err(|e| format!("cannot write its wall to stdout: {e}"))
}

/// `--wall-then-exec PROGRAM [ARG...]`: says the wall, then becomes PROGRAM with the same
/// environment and descriptors. An execve keeps the process: its ids, capability sets (an
/// unprivileged uid gains none), no_new_privs, seccomp filter, namespaces and cgroups are
/// what the wall said. Returns only when it cannot.
fn wall_then_exec(argv: Vec<std::ffi::OsString>) -> ExitCode {
    use std::os::unix::process::CommandExt as _;
    let Some((program, rest)) = argv.split_first() else {
        return fail("--wall-then-exec needs the program to become (see --help)");
    };
    if let Err(e) = say_wall() {
        return fail(&e);
    }
    #[expect(
        clippy::disallowed_methods,
        reason = "exec replaces this process; no child is spawned"
    )]
    let e = std::process::Command::new(program).args(rest).exec();
    fail(&format!(
        "cannot execute {}: {e}",
        program.to_string_lossy()
    ))
}
