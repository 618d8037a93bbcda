//! The oracle: three ordinary project runs through plimsolld and the Rust client, at the
//! strongest sandbox available: the accepted cart-pole controller twice, then a draft whose
//! two cart gains have the wrong sign. The accepted runs must give one fingerprint, the draft
//! must drop the pole and give another, and every fingerprint must be the SHA-256 of the
//! trajectory the run returned. It writes the report page (plimsoll_trial::report), can sign
//! the three exchanges into a closed bundle (plimsoll_attest::append_entry, as
//! `plimsoll-attest run` does), and prints one JSON line last (docs/trials.md, "The oracle").
//!
//! Run it as root after `cargo build --workspace` and `make images`, or `make demo`.

mod daemon;
mod pick;
mod report;
mod trial;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Parser;
use plimsoll_client::{Client, Token};
use plimsoll_env as env;
use plimsoll_wire::{Tier, not_dispatched_reason};
use serde::Serialize;

use crate::daemon::{DaemonPlan, LocalDaemon};
use crate::trial::{ACCEPTED, Controller, DRAFT, Expect, TrialRun};

/// Exit status when no provider can run the trials (nothing ran).
const EXIT_UNAVAILABLE: u8 = 3;
/// The providers the oracle's own daemon is given when none is named. Those this host cannot
/// run are withdrawn by their probe; `process` is left out, since it runs no project.
const PROVIDERS: [&str; 4] = ["crun", "runc", "runsc", "qemu"];

/// Sends an accepted cart-pole controller twice and a falling draft through plimsolld at the
/// strongest sandbox available, checks the fingerprints, and writes the report.
#[derive(Debug, Parser)]
#[command(
    name = "plimsoll-example-oracle",
    version,
    after_help = format!(
        "Exit status: 0 every check passed; 1 a check or a run failed; 2 usage; {EXIT_UNAVAILABLE} no \
         provider of tier container or above is available (nothing ran).\n\n{}",
        env::help_text()
    )
)]
struct Args {
    /// Run on this provider instead of the strongest available.
    #[arg(long, value_name = "NAME", value_parser = PROVIDERS)]
    provider: Option<String>,
    /// Use this running daemon instead of starting one (the token from PLIMSOLL_TOKEN).
    #[arg(long, value_name = "URL")]
    daemon: Option<String>,
    /// The plimsolld binary to start (default: plimsolld beside this program).
    #[arg(long, value_name = "PATH", conflicts_with = "daemon")]
    plimsolld: Option<PathBuf>,
    /// Where the report (report.html) and the daemon's log (plimsolld.log) go (default:
    /// target/oracle of the build this program belongs to).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Sign the three runs into this new bundle and close it (needs --key).
    #[arg(long, value_name = "PATH", requires = "key")]
    bundle: Option<PathBuf>,
    /// The signing key, from `plimsoll-attest keygen --out PREFIX`.
    #[arg(long, value_name = "PREFIX.key", requires = "bundle")]
    key: Option<PathBuf>,
    /// Each run's wall timeout.
    #[arg(long, value_name = "MS", default_value_t = trial::DEFAULT_TIMEOUT_MS)]
    timeout_ms: u64,
}

/// The fingerprints of the three runs.
#[derive(Debug, Serialize)]
struct Fingerprints {
    accepted_1: String,
    accepted_2: String,
    draft: String,
}

/// The last line on stdout.
#[derive(Debug, Serialize)]
struct Summary {
    fingerprints: Fingerprints,
    draft_fell_at_seconds: f64,
    draft_fell_at_tick: u64,
    provider: String,
    tier: Tier,
    report: String,
    bundle: Option<String>,
}

/// Nothing could run: no provider meets the floor (exit 3).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
struct Unavailable(pick::PickProviderError);

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(summary) => {
            println!(
                "{}",
                serde_json::to_string(&summary).expect("the summary serialises")
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("plimsoll-example-oracle: {e:#}");
            if e.downcast_ref::<Unavailable>().is_some() {
                ExitCode::from(EXIT_UNAVAILABLE)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// `target/oracle` of the build this program belongs to (the directory above
/// `target/debug` holds cargo's CACHEDIR.TAG), else `target/oracle` under the current
/// directory.
fn default_out_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    exe.parent()
        .and_then(Path::parent)
        .filter(|target| target.join("CACHEDIR.TAG").is_file())
        .map(|target| target.join("oracle"))
        .unwrap_or_else(|| PathBuf::from("target/oracle"))
}

/// `PREFIX.pub` beside `PREFIX.key`, for the hint printed after signing.
fn public_key_path(key: &Path) -> PathBuf {
    match key.to_str().and_then(|k| k.strip_suffix(".key")) {
        Some(prefix) => PathBuf::from(format!("{prefix}.pub")),
        None => key.with_extension("pub"),
    }
}

fn run(args: &Args) -> anyhow::Result<Summary> {
    let out = args.out.clone().unwrap_or_else(default_out_dir);
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;

    // The bundle is checked before anything runs, so no run is spent on a bundle that
    // cannot take it.
    let signing = match (&args.bundle, &args.key) {
        (Some(bundle), Some(key_path)) => {
            let key = plimsoll_attest::load_private_key(key_path)?;
            if bundle.exists() {
                bail!(
                    "{} exists: the oracle writes a new bundle and closes it (nothing can follow a close); give a new path",
                    bundle.display()
                );
            }
            Some((bundle.clone(), key_path.clone(), key))
        }
        _ => None,
    };

    // A daemon: the one named, or one of our own.
    let (client, _daemon) = match &args.daemon {
        Some(url) => {
            let token = env::get(env::PLIMSOLL_TOKEN).context(
                "--daemon needs a caller token: set PLIMSOLL_TOKEN to the token your operator gave you",
            )?;
            (Client::new(url.clone(), Token::new(token)), None)
        }
        None => {
            let plan = DaemonPlan {
                plimsolld: args
                    .plimsolld
                    .clone()
                    .unwrap_or_else(|| plimsoll_engine::settings::default_tool_path("plimsolld")),
                providers: match &args.provider {
                    // Only the one asked for: probing the others would be time spent for
                    // nothing.
                    Some(p) => vec![p.clone()],
                    None => PROVIDERS.iter().map(|p| (*p).to_owned()).collect(),
                },
                log: out.join("plimsolld.log"),
            };
            let mut daemon = LocalDaemon::start(&plan)?;
            eprintln!(
                "plimsolld at {} (log {}); probing {}…",
                daemon.url,
                daemon.log().display(),
                plan.providers.join(", ")
            );
            daemon.wait_probed()?;
            (daemon.client(), Some(daemon))
        }
    };

    let listed = client
        .providers()
        .with_context(|| format!("cannot list the providers of {}", client.base_url()))?;
    eprintln!("providers, cheapest first:");
    for p in &listed.providers {
        let state = match (&p.available, &p.unavailable_reason) {
            (true, _) => "available".to_owned(),
            (false, Some(why)) => format!("unavailable: {why}"),
            (false, None) => "unavailable".to_owned(),
        };
        eprintln!("  {:<7} {:<9} {state}", p.name, p.isolation.as_str());
    }
    let chosen = pick::pick(&listed.providers, args.provider.as_deref(), trial::FLOOR).map_err(
        |e| match e {
            pick::PickProviderError::Unavailable { .. }
            | pick::PickProviderError::NoneAvailable { .. } => Unavailable(e).into(),
            e => anyhow::Error::from(e),
        },
    )?;
    let (provider, tier) = (chosen.name.clone(), chosen.isolation);
    eprintln!(
        "running at {provider} ({tier}): {}",
        if args.provider.is_some() {
            "as asked (--provider)"
        } else {
            "the strongest tier available; of equal tiers, the cheaper"
        }
    );

    let plan: [(&'static str, Controller, Expect); 3] = [
        ("accepted_1", ACCEPTED, Expect::Pass),
        ("accepted_2", ACCEPTED, Expect::Pass),
        ("draft", DRAFT, Expect::Fall),
    ];
    let mut runs: Vec<TrialRun> = Vec::new();
    let runs_started = std::time::Instant::now();
    for (i, (label, controller, expect)) in plan.into_iter().enumerate() {
        // Each trial takes seconds (longer under TCG): say which one is under way, and for how
        // long the runs have gone on.
        eprintln!(
            "[{}/3, {:.1} s] {label}: sending {} …",
            i + 1,
            runs_started.elapsed().as_secs_f64(),
            controller.file
        );
        let options = trial::options(&controller, Some(&provider), args.timeout_ms);
        let response = client.run(options.clone()).map_err(|e| {
            let ran = match not_dispatched_reason(&e) {
                Some(reason) => format!("nothing ran ({reason})"),
                None => "it may have run".to_owned(),
            };
            anyhow::anyhow!("{label} ({}): {ran}: {e}", controller.file)
        })?;
        // The client built the request from these options and the id the answer echoes (it
        // checked the echo): this is the request exactly as sent, as `plimsoll-attest run`
        // stores it.
        let request = options.into_request(response.request_id.clone());
        let run = trial::check_run(label, controller, expect, request, response)?;
        println!(
            "{label}: {} at {} ({}, {} ms): {}, {} ticks, fingerprint {}",
            run.controller.file,
            run.response.provider,
            run.response.isolation,
            run.response.duration_ms,
            run.end_reason,
            run.ticks,
            run.fingerprint
        );
        runs.push(run);
    }
    let [accepted_1, accepted_2, draft] =
        <[TrialRun; 3]>::try_from(runs).map_err(|_| anyhow::anyhow!("expected three runs"))?;
    trial::compare_runs(&accepted_1, &accepted_2, &draft)?;
    let fell_at_tick = draft.fell_at_tick.context("the draft's fall tick")?;
    let fell_at_seconds = draft.fell_at_seconds.context("the draft's fall time")?;
    println!("accepted twice: identical fingerprints; the draft's differs");
    println!("draft fell at tick {fell_at_tick} ({fell_at_seconds} s)");
    for (run, documented) in [
        (&accepted_1, trial::DOCUMENTED_ACCEPTED),
        (&draft, trial::DOCUMENTED_DRAFT),
    ] {
        if run.fingerprint != documented {
            eprintln!(
                "note: {}'s fingerprint differs from the one docs/trials.md gives ({documented}): \
                 another simulator module, scenario or controller?",
                run.controller.file
            );
        }
    }

    let report_path = out.join("report.html");
    report::write(&report_path, &accepted_1, &accepted_2, &draft)?;
    let report_path = std::fs::canonicalize(&report_path).unwrap_or(report_path);
    println!("report: {}", report_path.display());

    let bundle = match signing {
        Some((bundle, key_path, key)) => {
            for run in [&accepted_1, &accepted_2, &draft] {
                let exchange = plimsoll_attest::Exchange {
                    request: run.request.clone(),
                    response: run.response.clone(),
                };
                plimsoll_attest::append_entry(&bundle, &key, &exchange).with_context(|| {
                    format!("cannot sign {} into {}", run.label, bundle.display())
                })?;
            }
            let closed = plimsoll_attest::close_bundle(&bundle, &key)
                .with_context(|| format!("cannot close {}", bundle.display()))?;
            let bundle = std::fs::canonicalize(&bundle).unwrap_or(bundle);
            println!(
                "bundle: {} ({} entries and a close, key id {}); check it with \
                 `plimsoll-attest verify --pub {} {}`",
                bundle.display(),
                closed.sequence,
                key.key_id(),
                public_key_path(&key_path).display(),
                bundle.display()
            );
            Some(bundle.display().to_string())
        }
        None => None,
    };

    Ok(Summary {
        fingerprints: Fingerprints {
            accepted_1: accepted_1.fingerprint.clone(),
            accepted_2: accepted_2.fingerprint.clone(),
            draft: draft.fingerprint.clone(),
        },
        draft_fell_at_seconds: fell_at_seconds,
        draft_fell_at_tick: fell_at_tick,
        provider,
        tier,
        report: report_path.display().to_string(),
        bundle,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[test]
    fn the_arguments_parse() {
        Args::command().debug_assert();
        let a = Args::try_parse_from([
            "oracle",
            "--provider",
            "crun",
            "--bundle",
            "b.jsonl",
            "--key",
            "k.key",
        ])
        .unwrap();
        assert_eq!(a.provider.as_deref(), Some("crun"));
        assert_eq!(a.timeout_ms, trial::DEFAULT_TIMEOUT_MS);
        // --bundle and --key go together; --plimsolld makes no sense with --daemon.
        assert!(Args::try_parse_from(["oracle", "--bundle", "b"]).is_err());
        // Only the providers of tier container or above.
        assert!(Args::try_parse_from(["oracle", "--provider", "process"]).is_err());
        assert!(Args::try_parse_from(["oracle", "--key", "k.key"]).is_err());
        assert!(
            Args::try_parse_from(["oracle", "--daemon", "http://x", "--plimsolld", "p"]).is_err()
        );
    }

    #[test]
    fn the_summary_has_the_documented_shape() {
        let s = Summary {
            fingerprints: Fingerprints {
                accepted_1: "a".into(),
                accepted_2: "a".into(),
                draft: "d".into(),
            },
            draft_fell_at_seconds: 1.88,
            draft_fell_at_tick: 188,
            provider: "runsc".into(),
            tier: Tier::Kernel,
            report: "/r/report.html".into(),
            bundle: None,
        };
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            "{\"fingerprints\":{\"accepted_1\":\"a\",\"accepted_2\":\"a\",\"draft\":\"d\"},\
             \"draft_fell_at_seconds\":1.88,\"draft_fell_at_tick\":188,\"provider\":\"runsc\",\
             \"tier\":\"kernel\",\"report\":\"/r/report.html\",\"bundle\":null}"
        );
    }

    #[test]
    fn the_public_key_sits_beside_the_private_one() {
        assert_eq!(
            public_key_path(Path::new("a/ci.key")),
            Path::new("a/ci.pub")
        );
        assert_eq!(
            public_key_path(Path::new("a.v2.key")),
            Path::new("a.v2.pub")
        );
    }
}
