//! plimsolld: parses arguments and settings, then serves.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use plimsoll_engine::settings::Settings;
use plimsoll_env as env;

/// The plimsoll daemon: HTTP/JSON in front of the sandbox engine (see docs/daemon.md).
#[derive(Debug, Parser)]
#[command(name = "plimsolld", version, after_help = env::help_text())]
struct Args {
    /// Settings file (TOML). Default: PLIMSOLL_CONFIG, else /etc/plimsoll/plimsoll.toml if it
    /// exists.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address to listen on, overriding [daemon].listen (default 127.0.0.1:7878).
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Grant profiles (TOML, docs/capability-grants.md). The secrets it names are read from
    /// this process's environment at start-up. Without it, every grant is refused.
    #[arg(long, value_name = "FILE")]
    grants: Option<PathBuf>,
}

const DEFAULT_CONFIG: &str = "/etc/plimsoll/plimsoll.toml";

/// The settings, and the file they came from (none: the defaults).
fn load_settings(args: &Args) -> anyhow::Result<(Settings, Option<PathBuf>)> {
    let path = args
        .config
        .clone()
        .or_else(|| env::get(env::PLIMSOLL_CONFIG).map(PathBuf::from))
        .or_else(|| {
            let default = PathBuf::from(DEFAULT_CONFIG);
            default.exists().then_some(default)
        });
    match path {
        Some(p) => Ok((Settings::load(&p)?, Some(p))),
        None => Ok((Settings::default(), None)),
    }
}

fn main() -> ExitCode {
    // The broker process (docs/privileges.md): the daemon starts this same program as it,
    // unprivileged, before this process has started a thread.
    if std::env::args_os().nth(1).as_deref()
        == Some(std::ffi::OsStr::new(
            plimsoll_broker::apart::BROKER_PROCESS_ARG,
        ))
    {
        plimsoll_daemon::logging::init();
        return match plimsoll_broker::apart::child_main() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!(error = %e, "the broker process stopped");
                ExitCode::FAILURE
            }
        };
    }
    // The split daemon's launcher (docs/privileges.md): started by the daemon, as root.
    if std::env::args_os().nth(1).as_deref()
        == Some(std::ffi::OsStr::new(plimsoll_daemon::split::LAUNCHER_ARG))
    {
        plimsoll_daemon::logging::init();
        return match plimsoll_daemon::split::launcher_main(std::env::args_os().skip(2)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!(error = %e, "the launcher stopped");
                ExitCode::FAILURE
            }
        };
    }
    let args = Args::parse();
    plimsoll_daemon::logging::init();
    let result = load_settings(&args).and_then(|(settings, file)| {
        // With a serving user, what needs root is done now, before any thread, and this
        // process drops to that user before its runtime starts.
        let prepared = plimsoll_daemon::split::serving_user(&settings)
            .map(|_| {
                plimsoll_daemon::split::prepare(
                    &settings,
                    file.as_deref(),
                    args.listen.as_deref(),
                    args.grants.as_deref(),
                )
            })
            .transpose()?;
        let rt = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
        let served = rt.block_on(async {
            match prepared {
                Some(prepared) => {
                    plimsoll_daemon::run_split(&settings, file.as_deref(), prepared).await
                }
                None => {
                    plimsoll_daemon::run(
                        &settings,
                        file.as_deref(),
                        args.listen.as_deref(),
                        args.grants.as_deref(),
                    )
                    .await
                }
            }
        });
        // Dropping a runtime waits for every blocking task; a run abandoned at the shutdown
        // bound must not hold the process open.
        rt.shutdown_timeout(std::time::Duration::from_secs(1));
        Ok(served?)
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "plimsolld stopped");
            eprintln!("plimsolld: {e:#}");
            ExitCode::FAILURE
        }
    }
}
