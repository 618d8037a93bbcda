//! plimsoll-trial-runner: parses the command line and calls the library (docs/trials.md).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use plimsoll_trial::creds::{
    Identities, args_with_hidden_command_line, holds_capabilities, make_undumpable,
};
use plimsoll_trial::runner::{RunConfig, SimSource};
use plimsoll_trial::sim::{SimulatorModule, bench};
use plimsoll_trial::trial::Deadlines;

const AFTER_HELP: &str = "\
Runs one trial per scenario: reads and deletes every scenario file, then starts the controller
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
  plimsoll-trial-runner --scenario standard.json --uid 1000 --gid 1000 \\
      --controller-uid 1001 --controller-gid 1001 -- node controller.js";

/// Runs a controller against a WebAssembly simulator, tick by tick, and prints a verdict.
#[derive(Debug, Parser)]
#[command(name = "plimsoll-trial-runner", version, after_help = AFTER_HELP)]
struct Args {
    /// Simulator module (default: the cart-pole built into the runner).
    #[arg(long, value_name = "PATH")]
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
    /// Write the built-in simulator module to PATH, print its SHA-256, and exit.
    #[arg(long, value_name = "PATH")]
    export_sim: Option<PathBuf>,
    /// Measure N simulator steps inside wasmtime, print JSON figures, and exit.
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

    // Both modes act before any privilege is given up (the benchmark runs the `--sim` file,
    // the export writes where it is told): never with a capability, e.g. as the trial step
    // of a sandbox, where the runner starts with CAP_SETUID and CAP_SETGID.
    if (args.export_sim.is_some() || args.bench_sim.is_some()) && holds_capabilities() {
        return fail(
            2,
            anyhow::anyhow!(
                "--export-sim and --bench-sim run only without capabilities: run them as an unprivileged user (e.g. `setpriv --reuid=nobody --regid=nogroup --clear-groups plimsoll-trial-runner ...`)"
            ),
        );
    }
    if let Some(path) = &args.export_sim {
        return export_sim(path);
    }
    if let Some(steps) = args.bench_sim {
        return bench_sim(args.sim.as_ref(), steps);
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
        sim: args.sim.map_or(SimSource::BuiltIn, SimSource::File),
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

fn export_sim(path: &PathBuf) -> ExitCode {
    let module = match SimulatorModule::from_bytes(plimsoll_trial::CARTPOLE_WASM) {
        Ok(m) => m,
        Err(e) => return fail(2, e.into()),
    };
    if let Err(e) = std::fs::write(path, plimsoll_trial::CARTPOLE_WASM) {
        return fail(2, anyhow::anyhow!("cannot write {}: {e}", path.display()));
    }
    println!("{}  {}", module.sha256(), path.display());
    ExitCode::SUCCESS
}

fn bench_sim(sim: Option<&PathBuf>, steps: u64) -> ExitCode {
    let module = match sim {
        None => SimulatorModule::from_bytes(plimsoll_trial::CARTPOLE_WASM),
        Some(p) => SimulatorModule::from_file(p),
    };
    let module = match module {
        Ok(m) => m,
        Err(e) => return fail(2, e.into()),
    };
    match bench(&module, steps) {
        Ok(b) => {
            println!(
                "{}",
                serde_json::json!({
                    "steps": b.steps,
                    "seconds": b.seconds,
                    "steps_per_second": b.steps as f64 / b.seconds,
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
