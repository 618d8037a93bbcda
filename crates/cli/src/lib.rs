//! plimsoll, the command line: the library behind the `plimsoll` binary. `main.rs` parses
//! arguments and calls [`main_with`]; every command lives in its own module.

pub mod args;
mod bench;
mod callers;
mod local;
mod mcp;
mod providers;
mod run;

use std::fmt;

pub use args::Cli;
use args::Command;

/// The run happened, or the command succeeded.
pub const EXIT_OK: u8 = 0;
/// A command other than `run` failed.
pub const EXIT_FAILED: u8 = 1;
/// Bad usage or inputs; nothing was sent.
pub const EXIT_USAGE: u8 = 2;
/// Refused before anything ran.
pub const EXIT_NOT_DISPATCHED: u8 = 3;
/// The code may have run, but no verified result came back.
pub const EXIT_MAY_HAVE_RUN: u8 = 4;

/// A command that failed, with the exit status it means.
#[derive(Debug)]
pub struct Failure {
    /// One of the `EXIT_*` statuses.
    pub status: u8,
    /// What went wrong.
    pub error: anyhow::Error,
}

impl Failure {
    /// Bad usage or inputs (exit 2).
    pub fn usage(error: impl Into<anyhow::Error>) -> Self {
        Failure {
            status: EXIT_USAGE,
            error: error.into(),
        }
    }

    /// Any other failure (exit 1).
    pub fn failed(error: impl Into<anyhow::Error>) -> Self {
        Failure {
            status: EXIT_FAILED,
            error: error.into(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#}", self.error)
    }
}

/// Runs a parsed command line and returns the process's exit status.
pub fn main_with(cli: Cli) -> u8 {
    init_logging();
    let config = cli.config.as_deref();
    let outcome = match cli.command {
        Command::Run(a) => run::run(config, &a),
        Command::Providers(a) => providers::providers(config, &a),
        Command::Callers(args::CallersCommand::Add { name, file }) => {
            callers::add(config, &name, file.as_deref())
        }
        Command::Bench(a) => bench::bench(config, &a),
        Command::Mcp(a) => mcp::mcp(config, &a),
    };
    match outcome {
        Ok(status) => status,
        Err(f) => {
            eprintln!("plimsoll: error: {f}");
            f.status
        }
    }
}

/// Logs go to stderr, filtered by PLIMSOLL_LOG (default `error`: a run's own stderr shares
/// the stream, and what a user needs is in the header or the error message).
fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = plimsoll_engine::env::get(plimsoll_engine::env::PLIMSOLL_LOG)
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| EnvFilter::new("error"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}
