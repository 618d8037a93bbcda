//! `plimsoll-oci-run`: one snippet on one OCI provider, or a start-up benchmark of every OCI
//! runtime beside bare `node` and `python3`; for tests, benchmarks and debugging (the daemon
//! and the CLI go through the engine instead).
//!
//! ```text
//! plimsoll-oci-run run RUNTIME LANGUAGE CODE [--state-root DIR] [--cgroup-parent P]
//!                  [--image DIR] [--uid N] [--timeout-ms N] [--run-id ID] [--reap]
//! plimsoll-oci-run bench [--n 20] [--image DIR]
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use plimsoll_oci::{OciConfig, OciProvider, RuntimeKind};
use plimsoll_sandbox::{CaptureLimits, LaunchPlan, Provider, ResolvedLimits, Spawn, capture};
use plimsoll_wire::{Language, RunSpec, Snippet};

const USAGE: &str = "usage:
  plimsoll-oci-run run RUNTIME LANGUAGE CODE [--state-root DIR] [--cgroup-parent P]
                   [--image DIR] [--uid N] [--timeout-ms N] [--run-id ID]
      runs CODE (javascript or python) on crun, runc or runsc; prints the result as JSON
  plimsoll-oci-run reap RUNTIME [--state-root DIR] [--cgroup-parent P] [--image DIR]
      removes what a killed daemon left behind; prints what was removed
  plimsoll-oci-run bench [--n N] [--image DIR]
      median and p90 of a trivial snippet per runtime, beside bare node and python3";

struct Options {
    state_root: PathBuf,
    cgroup_parent: String,
    image: PathBuf,
    uid: u32,
    timeout: Duration,
    run_id: Option<String>,
    n: usize,
}

fn parse_options(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        state_root: PathBuf::from("/run/plimsoll"),
        cgroup_parent: "/plimsoll".into(),
        image: default_image(),
        uid: 2_999_000,
        timeout: Duration::from_secs(10),
        run_id: None,
        n: 20,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--state-root" => o.state_root = value()?.into(),
            "--cgroup-parent" => o.cgroup_parent = value()?,
            "--image" => o.image = value()?.into(),
            "--uid" => o.uid = value()?.parse().map_err(|e| format!("--uid: {e}"))?,
            "--timeout-ms" => {
                o.timeout = Duration::from_millis(
                    value()?.parse().map_err(|e| format!("--timeout-ms: {e}"))?,
                )
            }
            "--run-id" => o.run_id = Some(value()?),
            "--n" => o.n = value()?.parse().map_err(|e| format!("--n: {e}"))?,
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(o)
}

/// `build/images/sandbox` of the repository this binary was built in.
fn default_image() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    exe.ancestors()
        .map(|d| d.join("build/images/sandbox"))
        .find(|d| d.join("identity").exists())
        .unwrap_or_else(|| PathBuf::from("/var/lib/plimsoll/build/images/sandbox"))
}

fn beside_exe(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    exe.parent().map(|d| d.join(name)).unwrap_or_default()
}

fn provider(kind: RuntimeKind, o: &Options) -> OciProvider {
    let mut c = OciConfig::new(
        kind,
        o.image.clone(),
        beside_exe("plimsoll-agent"),
        beside_exe("plimsoll-probe"),
        o.uid + 1,
    );
    c.state_root = o.state_root.clone();
    c.cgroup_parent = o.cgroup_parent.clone();
    OciProvider::new(c)
}

fn plan(run_id: String, language: Language, code: &str, uid: u32, timeout: Duration) -> LaunchPlan {
    LaunchPlan {
        image: None,
        run_id,
        request_id: "plimsoll-oci-run".into(),
        privileges: plimsoll_sandbox::Privileges::Unprivileged,
        spec: RunSpec::Snippet(Snippet {
            language,
            code: code.into(),
        }),
        limits: ResolvedLimits {
            timeout,
            memory_bytes: 512 << 20,
            output_bytes: 1 << 20,
            pids: 64,
            disk_bytes: 64 << 20,
            artifact_bytes: 1 << 20,
        },
        uid,
        gid: uid,
        controller_uid: uid + 1,
        controller_gid: uid + 1,
        run_dir: PathBuf::from("/nonexistent"),
        broker: None,
        tap: None,
    }
}

fn fresh_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}{:x}{:x}{}",
        plimsoll_sandbox::unix_ms_now(),
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn kind_arg(s: Option<&String>) -> Result<RuntimeKind, String> {
    let s = s.ok_or("name a runtime: crun, runc or runsc")?;
    RuntimeKind::from_name(s).ok_or_else(|| format!("unknown runtime {s}: use crun, runc or runsc"))
}

fn cmd_run(args: &[String]) -> Result<(), String> {
    let kind = kind_arg(args.first())?;
    let language: Language = args.get(1).ok_or("name a language")?.parse()?;
    let code = args.get(2).ok_or("give the code")?;
    let o = parse_options(&args[3..])?;
    let p = provider(kind, &o);
    let run_id = o.run_id.clone().unwrap_or_else(|| fresh_id("cli"));
    let outcome = p
        .run(&plan(run_id, language, code, o.uid, o.timeout))
        .map_err(|e| e.to_string())?;
    println!(
        "{}",
        serde_json::to_string(&outcome.result).map_err(|e| e.to_string())?
    );
    Ok(())
}

fn cmd_reap(args: &[String]) -> Result<(), String> {
    let kind = kind_arg(args.first())?;
    let o = parse_options(&args[1..])?;
    let r = provider(kind, &o).reap();
    println!("{}", r.summary());
    if r.errors.is_empty() {
        Ok(())
    } else {
        Err("some leftovers could not be removed".into())
    }
}

/// Milliseconds of one bare interpreter run with an empty environment.
fn bare(program: &str, flag: &str, code: &str) -> Result<f64, String> {
    let t = Instant::now();
    let r = Spawn::new(program, "/")
        .env("PATH", "/usr/bin:/bin")
        .args([flag, code])
        .spawn()
        .map_err(|e| e.to_string())?;
    let c = capture(r, &CaptureLimits::new(1 << 20, Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    if c.stdout != b"1\n" {
        return Err(format!(
            "{program} printed {:?}",
            String::from_utf8_lossy(&c.stdout)
        ));
    }
    Ok(t.elapsed().as_secs_f64() * 1000.0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn cmd_bench(args: &[String]) -> Result<(), String> {
    let o = parse_options(args)?;
    type Case = (String, Box<dyn Fn() -> Result<f64, String>>);
    let mut cases: Vec<Case> = vec![
        (
            "host node -e".into(),
            Box::new(|| bare("/usr/bin/node", "-e", "console.log(1)")),
        ),
        (
            "host python3 -c".into(),
            Box::new(|| bare("/usr/bin/python3", "-c", "print(1)")),
        ),
    ];
    let mut providers = Vec::new();
    for kind in RuntimeKind::ALL {
        if !Path::new(kind.default_binary()).exists() {
            eprintln!(
                "skipping {}: {} is not installed",
                kind.name(),
                kind.default_binary()
            );
            continue;
        }
        providers.push((kind, std::sync::Arc::new(provider(kind, &o))));
    }
    for (kind, p) in &providers {
        for (language, code) in [
            (Language::Javascript, "console.log(1)"),
            (Language::Python, "print(1)"),
        ] {
            let p = std::sync::Arc::clone(p);
            let uid = o.uid;
            let name = format!("{} {}", kind.name(), language.as_str());
            cases.push((
                name,
                Box::new(move || {
                    let t = Instant::now();
                    let out = p
                        .run(&plan(
                            fresh_id("bench"),
                            language,
                            code,
                            uid,
                            Duration::from_secs(30),
                        ))
                        .map_err(|e| e.to_string())?;
                    if out.result.stdout.as_slice() != b"1\n" {
                        return Err(format!(
                            "printed {:?}: {:?}",
                            out.result.stdout, out.result.stderr
                        ));
                    }
                    Ok(t.elapsed().as_secs_f64() * 1000.0)
                }),
            ));
        }
    }
    // One warm-up round, then n interleaved rounds.
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for round in 0..=o.n {
        for (i, (name, f)) in cases.iter().enumerate() {
            let ms = f().map_err(|e| format!("{name}: {e}"))?;
            if round > 0 {
                times[i].push(ms);
            }
        }
    }
    println!(
        "{:<18} {:>4} {:>9} {:>9} {:>9} {:>9}",
        "case", "n", "median", "p90", "min", "max"
    );
    for ((name, _), t) in cases.iter().zip(times.iter_mut()) {
        t.sort_by(f64::total_cmp);
        println!(
            "{:<18} {:>4} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
            name,
            t.len(),
            percentile(t, 0.5),
            percentile(t, 0.9),
            t[0],
            t[t.len() - 1]
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("run") => cmd_run(&args[1..]),
        Some("reap") => cmd_reap(&args[1..]),
        Some("bench") => cmd_bench(&args[1..]),
        Some("-h" | "--help") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => Err(format!("no command given\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plimsoll-oci-run: {e}");
            ExitCode::FAILURE
        }
    }
}
