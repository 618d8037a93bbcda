//! `plimsoll-vm-run`: one snippet in one VM, the probe, or a benchmark, on the `qemu`
//! provider; for tests, benchmarks and debugging (the daemon and the CLI go through the
//! engine instead).
//!
//! ```text
//! plimsoll-vm-run run LANGUAGE CODE [options]     prints the result as JSON
//! plimsoll-vm-run probe [options]                 prints tier, checks and config
//! plimsoll-vm-run bench [--n 5] [options]         median timings and QEMU memory
//! plimsoll-vm-run reap [options]                  what a killed daemon left behind
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use plimsoll_sandbox::{LaunchPlan, Provider as _, ResolvedLimits};
use plimsoll_vm::{AccelChoice, VmConfig, VmProvider};
use plimsoll_wire::{Language, RunSpec, Snippet};

const USAGE: &str = "usage:
  plimsoll-vm-run run LANGUAGE CODE [options]   runs CODE (javascript or python); prints the result
  plimsoll-vm-run probe [options]               runs the provider's probe; prints tier and checks
  plimsoll-vm-run bench [--n N] [options]       N python and N javascript runs: median timings
  plimsoll-vm-run reap [options]                kills leftover QEMUs, removes leftover run dirs
options:
  --state-dir DIR    (default /run/plimsoll-vm)   --assets DIR (default: the repo's build/vm)
  --uid N            (default 2999100)            --timeout-ms N (default 10000)
  --accel auto|kvm|tcg (default tcg; probe: auto) --run-id ID";

struct Options {
    state_dir: PathBuf,
    assets: PathBuf,
    uid: u32,
    timeout: Duration,
    accel: Option<AccelChoice>,
    run_id: Option<String>,
    n: usize,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        state_dir: PathBuf::from("/run/plimsoll-vm"),
        assets: default_assets(),
        uid: 2_999_100,
        timeout: Duration::from_secs(10),
        accel: None,
        run_id: None,
        n: 5,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--state-dir" => o.state_dir = value()?.into(),
            "--assets" => o.assets = value()?.into(),
            "--uid" => o.uid = value()?.parse().map_err(|e| format!("--uid: {e}"))?,
            "--timeout-ms" => {
                o.timeout = Duration::from_millis(
                    value()?.parse().map_err(|e| format!("--timeout-ms: {e}"))?,
                )
            }
            "--accel" => o.accel = Some(AccelChoice::parse(&value()?).map_err(|e| e.to_string())?),
            "--run-id" => o.run_id = Some(value()?),
            "--n" => o.n = value()?.parse().map_err(|e| format!("--n: {e}"))?,
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(o)
}

/// `build/vm` of the repository this binary was built in.
fn default_assets() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    exe.ancestors()
        .map(|d| d.join("build/vm"))
        .find(|d| d.join("manifest").exists())
        .unwrap_or_else(|| PathBuf::from("/var/lib/plimsoll/build/vm"))
}

fn beside_me(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    exe.parent().unwrap_or(Path::new("/")).join(name)
}

fn provider(o: &Options, accel: AccelChoice) -> VmProvider {
    let mut c = VmConfig::new(
        o.assets.clone(),
        beside_me("plimsoll-agent"),
        beside_me("plimsoll-probe"),
        beside_me("plimsoll-guest-init"),
        o.state_dir.clone(),
        o.uid + 1,
        o.uid..o.uid + 1,
    );
    c.accelerator = accel;
    VmProvider::new(c)
}

fn plan(o: &Options, spec: RunSpec, n: usize) -> LaunchPlan {
    let run_id = o
        .run_id
        .clone()
        .unwrap_or_else(|| format!("vmrun{}x{n}", std::process::id()));
    LaunchPlan {
        image: None,
        run_dir: o.state_dir.join("runs").join(&run_id),
        run_id,
        request_id: "plimsoll-vm-run".into(),
        privileges: plimsoll_sandbox::Privileges::for_spec(&spec),
        spec,
        limits: ResolvedLimits {
            timeout: o.timeout,
            memory_bytes: 256 << 20,
            output_bytes: 1 << 20,
            pids: 64,
            disk_bytes: 64 << 20,
            artifact_bytes: 1 << 20,
        },
        uid: o.uid,
        gid: o.uid,
        controller_uid: o.uid + 1,
        controller_gid: o.uid + 1,
        broker: None,
        tap: None,
    }
}

fn snippet(language: Language, code: &str) -> RunSpec {
    RunSpec::Snippet(Snippet {
        language,
        code: code.into(),
    })
}

fn cmd_run(args: &[String]) -> Result<(), String> {
    let [language, code, rest @ ..] = args else {
        return Err(format!("run needs LANGUAGE and CODE\n{USAGE}"));
    };
    let language = match language.as_str() {
        "javascript" | "js" => Language::Javascript,
        "python" | "py" => Language::Python,
        other => return Err(format!("unknown language {other}")),
    };
    let o = parse(rest)?;
    let p = provider(&o, o.accel.unwrap_or(AccelChoice::Tcg));
    let (out, stats) = p
        .run_measured(&plan(&o, snippet(language, code), 0))
        .map_err(|e| e.to_string())?;
    println!(
        "{}",
        serde_json::to_string(&out.result).map_err(|e| e.to_string())?
    );
    eprintln!("{stats:?}");
    Ok(())
}

fn cmd_probe(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    let p = provider(&o, o.accel.unwrap_or(AccelChoice::Auto));
    let t = Instant::now();
    let probed = p.probe();
    println!("tier {}", probed.tier);
    println!("available {:?}", probed.available);
    for (k, v) in &probed.evidence.config {
        println!("config {k} = {v}");
    }
    for (k, v) in &probed.evidence.checks {
        println!("check {k} = {v}");
    }
    for b in &probed.evidence.binaries {
        println!(
            "binary {} {} {} sha256:{}",
            b.name, b.path, b.version, b.sha256
        );
    }
    println!("probe took {} ms", t.elapsed().as_millis());
    Ok(())
}

fn median(v: &mut [u64]) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

fn cmd_bench(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    let p = provider(&o, o.accel.unwrap_or(AccelChoice::Tcg));
    for (language, code) in [
        (Language::Python, "print(6*7)"),
        (Language::Javascript, "console.log(6*7)"),
    ] {
        let (mut total, mut boot, mut guest, mut rss, mut agent) =
            (vec![], vec![], vec![], vec![], vec![]);
        for i in 0..o.n {
            let t = Instant::now();
            let (out, s) = p
                .run_measured(&plan(&o, snippet(language, code), i))
                .map_err(|e| e.to_string())?;
            total.push(t.elapsed().as_millis() as u64);
            if out.result.stdout.as_slice() != b"42\n" {
                return Err(format!("unexpected result {:?}", out.result));
            }
            boot.push(s.boot_ms);
            guest.push(s.guest_uptime_at_init_ms);
            rss.push(s.peak_rss_kib);
            agent.push(s.agent_ms);
        }
        println!(
            "{}: n={} request->result median {} ms (all {:?}); qemu start->hello {} ms; guest uptime at init {} ms; agent {} ms; QEMU peak RSS {} MiB",
            language.as_str(),
            o.n,
            median(&mut total.clone()),
            total,
            median(&mut boot),
            median(&mut guest),
            median(&mut agent),
            median(&mut rss) / 1024
        );
    }
    Ok(())
}

fn cmd_reap(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    let p = provider(&o, AccelChoice::Tcg);
    println!("{}", p.reaped_at_start().summary());
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("run") => cmd_run(&args[1..]),
        Some("probe") => cmd_probe(&args[1..]),
        Some("bench") => cmd_bench(&args[1..]),
        Some("reap") => cmd_reap(&args[1..]),
        Some("-h" | "--help") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => Err(format!("no command given\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plimsoll-vm-run: {e}");
            ExitCode::FAILURE
        }
    }
}
