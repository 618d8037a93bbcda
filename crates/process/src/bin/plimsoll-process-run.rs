//! `plimsoll-process-run`: one process-tier run by hand, outside a daemon (for operators and
//! for the tests that kill the process running it): runs a snippet and prints the result's
//! exit code and output, or with `reap` removes what killed runs left.
//!
//! Usage: `plimsoll-process-run run <python|javascript> <code> --state-dir DIR --uid UID
//! [--run-id ID] [--timeout-ms MS] [--memory-bytes N] [--disk-bytes N]`, or
//! `plimsoll-process-run reap --state-dir DIR`.

use std::path::PathBuf;
use std::time::Duration;

use plimsoll_process::{ProcessConfig, ProcessProvider};
use plimsoll_sandbox::{LaunchPlan, Provider as _, ResolvedLimits};
use plimsoll_wire::{Language, RunSpec, Snippet};

fn usage() -> ! {
    eprintln!(
        "usage: plimsoll-process-run run <python|javascript> <code> --state-dir DIR --uid UID [--run-id ID] [--timeout-ms MS] [--memory-bytes N] [--disk-bytes N]\n       plimsoll-process-run reap --state-dir DIR"
    );
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut positional, mut flags) = (Vec::new(), std::collections::BTreeMap::new());
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        if let Some(name) = a.strip_prefix("--") {
            let Some(v) = it.next() else { usage() };
            flags.insert(name.to_owned(), v);
        } else {
            positional.push(a);
        }
    }
    let Some(state_dir) = flags.get("state-dir").map(PathBuf::from) else {
        usage()
    };
    let num = |name: &str, default: u64| -> u64 {
        flags.get(name).map_or(default, |v| {
            v.parse().unwrap_or_else(|_| {
                eprintln!("plimsoll-process-run: --{name} takes a number, not {v:?}");
                std::process::exit(2)
            })
        })
    };
    let uid = num("uid", 0) as u32;
    let provider = ProcessProvider::new(ProcessConfig {
        node: "/usr/bin/node".into(),
        python: "/usr/bin/python3".into(),
        probe: "/nonexistent/plimsoll-probe".into(),
        state_dir: state_dir.clone(),
        probe_uid: uid.saturating_add(1),
    });
    match positional.first().map(String::as_str) {
        Some("reap") => {
            let r = provider.reap();
            println!("removed {} run directories", r.run_dirs.len());
            for e in &r.errors {
                eprintln!("plimsoll-process-run: {e}");
            }
            std::process::exit(i32::from(!r.errors.is_empty()));
        }
        Some("run") if positional.len() == 3 && uid != 0 => {}
        _ => usage(),
    }
    let language = match positional[1].as_str() {
        "python" => Language::Python,
        "javascript" => Language::Javascript,
        _ => usage(),
    };
    let run_id = flags
        .get("run-id")
        .cloned()
        .unwrap_or_else(|| format!("by-hand-{}", std::process::id()));
    let plan = LaunchPlan {
        image: None,
        run_dir: state_dir.join("runs").join(&run_id),
        run_id,
        request_id: "by-hand".into(),
        privileges: plimsoll_sandbox::Privileges::Unprivileged,
        spec: RunSpec::Snippet(Snippet {
            language,
            code: positional[2].clone(),
        }),
        limits: ResolvedLimits {
            timeout: Duration::from_millis(num("timeout-ms", 10_000)),
            memory_bytes: num("memory-bytes", 512 << 20),
            output_bytes: 1 << 20,
            pids: 64,
            disk_bytes: num("disk-bytes", 64 << 20),
            artifact_bytes: 1 << 20,
        },
        uid,
        gid: uid,
        controller_uid: uid.saturating_add(1),
        controller_gid: uid.saturating_add(1),
        broker: None,
        tap: None,
    };
    match provider.run(&plan) {
        Ok(o) => {
            let r = o.result;
            eprintln!(
                "exit {:?} signal {:?} timed out {} oom {}",
                r.exit_code, r.signal, r.timed_out, r.oom_killed
            );
            use std::io::Write as _;
            let _ = std::io::stdout().write_all(&r.stdout.0);
            let _ = std::io::stderr().write_all(&r.stderr.0);
        }
        Err(e) => {
            eprintln!("plimsoll-process-run: {e}");
            std::process::exit(1);
        }
    }
}
