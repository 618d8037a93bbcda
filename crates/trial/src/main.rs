//! plimsoll-trial-runner: parses the command line and calls the library (docs/trials.md).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use plimsoll_trial::creds::{
    Identities, args_with_hidden_command_line, holds_capabilities, make_undumpable,
};
use plimsoll_trial::index::IMAGE_INDEX;
use plimsoll_trial::runner::{RunConfig, SimSource, load};
use plimsoll_trial::scenario;
use plimsoll_trial::sim::bench;
use plimsoll_trial::trial::Deadlines;

const AFTER_HELP: &str = "\
Runs one trial per scenario against the simulator named by --simulator, which the image declares
in /opt/plimsoll/simulators/index.json (docs/simulators.md): reads and deletes every scenario
file, then starts the controller
(as --controller-uid) once per scenario and exchanges one line per tick with it. Prints one JSON
verdict on stdout; writes one trajectory file per scenario.

Exit status: 0 every trial passed; 1 a trial failed (verdict printed); 2 nothing ran (usage,
privileges, simulator or scenario error); 3 a trial could not be carried out (simulator
failure, I/O), no verdict.

The runner needs CAP_SETUID and CAP_SETGID when it starts (root, or root in a container with
only those two capabilities); it drops them before reading any scenario.

Environment: the runner reads no environment variable. The controller gets only
PATH=/usr/local/bin:/usr/bin:/bin, HOME=/tmp and LANG=C.UTF-8.

Example:
  plimsoll-trial-runner --simulator cartpole --scenario standard.json --uid 1000 --gid 1000 \\
      --controller-uid 1001 --controller-gid 1001 -- node controller.js";

/// Runs a controller against a WebAssembly simulator, tick by tick, and prints a verdict.
#[derive(Debug, Parser)]
#[command(name = "plimsoll-trial-runner", version, after_help = AFTER_HELP)]
struct Args {
    /// The simulator, by the name the image's simulator index gives it.
    #[arg(long, value_name = "NAME")]
    simulator: Option<String>,
    /// And the SHA-256 (64 hex digits) its module must have.
    #[arg(long, value_name = "HEX", requires = "simulator")]
    simulator_sha256: Option<String>,
    /// Outside a sandbox: look the simulator up in this index instead of the image's
    /// (/opt/plimsoll/simulators/index.json, which must be on a read-only filesystem).
    #[arg(long, value_name = "PATH", requires = "simulator")]
    simulators_index: Option<PathBuf>,
    /// Outside a sandbox: a simulator module file, instead of --simulator (an exam author
    /// trying a simulator).
    #[arg(long, value_name = "PATH", conflicts_with = "simulator")]
    sim: Option<PathBuf>,
    /// Scenario file (JSON); repeat for several trials. Deleted once read.
    #[arg(long = "scenario", value_name = "FILE")]
    scenarios: Vec<PathBuf>,
    /// Trajectory output, one per scenario in order (default for a single scenario:
    /// ./trajectory.bin).
    #[arg(long = "trajectory", value_name = "PATH")]
    trajectories: Vec<PathBuf>,
    /// The runner's own uid once privileges are dropped (1000, `sandbox`, in the image).
    #[arg(long, value_name = "UID")]
    uid: Option<u32>,
    /// The runner's own gid.
    #[arg(long, value_name = "GID")]
    gid: Option<u32>,
    /// The controller's uid (1001, `controller`, in the image).
    #[arg(long, value_name = "UID")]
    controller_uid: Option<u32>,
    /// The controller's gid.
    #[arg(long, value_name = "GID")]
    controller_gid: Option<u32>,
    /// Answer deadline for the first tick, in ms (interpreter start-up included).
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    first_deadline_ms: u64,
    /// Answer deadline for every later tick, in ms.
    #[arg(long, value_name = "MS", default_value_t = 100)]
    tick_deadline_ms: u64,
    /// Leave the wall time out of the verdict (`wall_ms` null): identical trials then print
    /// identical verdicts, byte for byte, so a replayed run gives the same result digest.
    #[arg(long)]
    reproducible: bool,
    /// Measure N simulator steps inside wasmtime from the one --scenario (read, not deleted),
    /// print JSON figures, and exit.
    #[arg(long, value_name = "N", hide = true)]
    bench_sim: Option<u64>,
    /// The controller command, after `--`.
    #[arg(last = true, value_name = "CONTROLLER_CMD")]
    controller: Vec<OsString>,
}

fn main() -> ExitCode {
    // First thing, and again after the re-exec (exec makes a process dumpable again).
    if let Err(e) = make_undumpable() {
        return fail(
            2,
            anyhow::anyhow!("cannot make the runner not dumpable: {e}"),
        );
    }
    let args = match args_with_hidden_command_line() {
        Ok(a) => a,
        Err(e) => return fail(2, e.into()),
    };
    if let Err(e) = make_undumpable() {
        return fail(
            2,
            anyhow::anyhow!("cannot make the runner not dumpable: {e}"),
        );
    }
    let args =
        Args::parse_from(std::iter::once(OsString::from("plimsoll-trial-runner")).chain(args));

    let sim = match (args.simulator, args.sim) {
        (Some(name), None) => SimSource::Named {
            name,
            sha256: args.simulator_sha256,
            image: args.simulators_index.is_none(),
            index: args
                .simulators_index
                .unwrap_or_else(|| PathBuf::from(IMAGE_INDEX)),
        },
        (None, Some(path)) => SimSource::File(path),
        _ => {
            return fail(
                2,
                anyhow::anyhow!(
                    "name the simulator: --simulator NAME (one the image declares; docs/simulators.md), or --sim PATH outside a sandbox"
                ),
            );
        }
    };
    if let Some(sha) = match &sim {
        SimSource::Named { sha256, .. } => sha256.as_deref(),
        SimSource::File(_) => None,
    } && !plimsoll_wire::simulators::is_sha256_hex(sha)
    {
        return fail(
            2,
            anyhow::anyhow!("--simulator-sha256 must be 64 lowercase hex digits, not {sha:?}"),
        );
    }
    // The benchmark acts before any privilege is given up (it reads the scenario it is
    // given and leaves it): never with a capability, e.g. as the trial step of a sandbox,
    // where the runner starts with CAP_SETUID and CAP_SETGID.
    if let Some(steps) = args.bench_sim {
        if holds_capabilities() {
            return fail(
                2,
                anyhow::anyhow!(
                    "--bench-sim runs only without capabilities: run it as an unprivileged user (e.g. `setpriv --reuid=nobody --regid=nogroup --clear-groups plimsoll-trial-runner ...`)"
                ),
            );
        }
        return bench_sim(&sim, &args.scenarios, steps);
    }
    let (Some(uid), Some(gid), Some(controller_uid), Some(controller_gid)) =
        (args.uid, args.gid, args.controller_uid, args.controller_gid)
    else {
        return fail(
            2,
            anyhow::anyhow!(
                "give --uid, --gid, --controller-uid and --controller-gid (in the sandbox image: 1000, 1000, 1001, 1001)"
            ),
        );
    };
    let config = RunConfig {
        sim,
        scenarios: args.scenarios,
        trajectories: args.trajectories,
        ids: Identities {
            runner_uid: uid,
            runner_gid: gid,
            controller_uid,
            controller_gid,
        },
        controller: args.controller,
        deadlines: Deadlines {
            first: Duration::from_millis(args.first_deadline_ms),
            tick: Duration::from_millis(args.tick_deadline_ms),
        },
    };
    match plimsoll_trial::run(&config) {
        Ok(mut verdict) => {
            if args.reproducible {
                for t in &mut verdict.trials {
                    t.wall_ms = None;
                }
            }
            println!("{}", verdict.to_json_line());
            if verdict.pass {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            let code = e.exit_code();
            fail(code, e.into())
        }
    }
}

fn bench_sim(sim: &SimSource, scenarios: &[PathBuf], steps: u64) -> ExitCode {
    let [path] = scenarios else {
        return fail(
            2,
            anyhow::anyhow!("--bench-sim takes exactly one --scenario"),
        );
    };
    let module = match load(sim) {
        Ok(m) => m,
        Err(e) => return fail(2, e.into()),
    };
    let initial = std::fs::read(path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))
        .and_then(|bytes| Ok(scenario::parse(path, &bytes)?))
        .and_then(|s| {
            s.check_against(module.metadata())
                .map_err(|e| anyhow::anyhow!("scenario {}: {e}", path.display()))
        });
    let initial = match initial {
        Ok(i) => i,
        Err(e) => return fail(2, e),
    };
    match bench(&module, &initial, steps) {
        Ok(b) => {
            println!(
                "{}",
                serde_json::json!({
                    "simulator": module.metadata().name,
                    "steps": b.steps,
                    "seconds": b.seconds,
                    "steps_per_second": b.steps as f64 / b.seconds,
                    "microseconds_per_step": b.seconds * 1e6 / b.steps as f64,
                    "fuel_per_step": b.fuel_per_step,
                    "simulator_sha256": module.sha256(),
                })
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(3, e.into()),
    }
}

fn fail(code: u8, e: anyhow::Error) -> ExitCode {
    eprintln!("plimsoll-trial-runner: error: {e:#}");
    ExitCode::from(code)
}
