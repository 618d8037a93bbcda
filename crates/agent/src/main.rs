//! `plimsoll-agent`: reads one AgentJob (JSON) on stdin, runs it, writes one RunResult
//! (JSON) on stdout and exits 0; exits 2 with one line on stderr when it cannot do the job.
//! See docs/agent.md.

use std::io::{self, Write as _};
use std::process::ExitCode;
use std::time::Instant;

use plimsoll_agent::{one_line, read_job, run_job};

const USAGE: &str = "usage: plimsoll-agent [--wall-first] < job.json > result.json
Runs one plimsoll job inside a sandbox: reads an AgentJob as JSON on stdin, writes a
RunResult as JSON on stdout. Exit status 0 with a result, 2 with one line on stderr when the
job cannot be done. With --wall-first, it first writes its own wall (what /proc shows of it:
identity, capabilities, no_new_privs, seccomp, namespaces, root, interfaces, cgroup limits)
as one JSON line on stdout, and only then reads the job. See docs/agent.md.";

fn fail(message: &str) -> ExitCode {
    eprintln!("plimsoll-agent: {message}");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let started = Instant::now();
    let mut args = std::env::args_os().skip(1);
    let mut wall_first = false;
    for a in args.by_ref() {
        if a == "--help" || a == "-h" {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        } else if a == "--wall-first" {
            wall_first = true;
        } else {
            return fail(&format!(
                "unexpected argument {}: the job comes on stdin (see --help)",
                a.to_string_lossy()
            ));
        }
    }
    if wall_first {
        // Before any of the job is known: what this process is, as its own /proc shows it.
        let wall = match plimsoll_sandbox::cgroup::CgroupLayout::detect()
            .and_then(|layout| plimsoll_sandbox::wall::read_unmarked(std::process::id(), &layout))
        {
            Ok(w) => w,
            Err(e) => return fail(&format!("cannot read its own wall: {e}")),
        };
        let mut out = io::stdout().lock();
        let written = serde_json::to_writer(&mut out, &wall)
            .map_err(io::Error::from)
            .and_then(|()| out.write_all(b"\n"))
            .and_then(|()| out.flush());
        if let Err(e) = written {
            return fail(&format!("cannot write its wall to stdout: {e}"));
        }
    }
    let job = match read_job(io::stdin().lock()) {
        Ok(job) => job,
        Err(e) => return fail(&one_line(&e)),
    };
    let result = match run_job(&job, started) {
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
