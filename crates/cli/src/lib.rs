//! plimsoll, the command line: the library behind the `plimsoll` binary. `main.rs` parses
//! arguments and calls [`main_with`]; every command lives in its own module.

pub mod args;
mod bench;
mod bench_images;
mod callers;
mod doctor;
mod host;
mod image;
mod init;
mod local;
mod manuals;
mod mcp;
mod providers;
mod report;
mod run;
mod session;
mod trial;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

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
    QUIET.store(cli.quiet, Ordering::Relaxed);
    let config = cli.config.as_deref();
    let outcome = match cli.command {
        Command::Run(a) => run::run(config, &a),
        Command::Trial(a) => trial::trial(config, &a),
        Command::Report(a) => report::report(&a),
        Command::Providers(a) => providers::providers(config, &a),
        Command::Session(c) => session::session(c),
        Command::Image(c) => image::image(config, c),
        Command::Callers(args::CallersCommand::Add { name, file }) => {
            callers::add(config, &name, file.as_deref())
        }
        Command::Bench(a) => bench::bench(config, &a),
        Command::Init(a) => init::init(config, &a),
        Command::Doctor(a) => doctor::doctor(config, &a),
        Command::Completions { shell } => manuals::completions(shell),
        Command::Man { dir } => manuals::man(&dir),
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

/// `--quiet`: no notes or progress on stderr.
static QUIET: AtomicBool = AtomicBool::new(false);

/// Whether `--quiet` was given.
pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// A note for the user on stderr (`plimsoll: ...`), unless `--quiet`.
pub fn note(message: &str) {
    if !quiet() {
        eprintln!("plimsoll: {message}");
    }
}

/// Logs go to stderr, filtered by PLIMSOLL_LOG (default `error`: a run's own stderr shares
/// the stream, and what a user needs is in the header or the error message).
fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = plimsoll_env::get(plimsoll_env::PLIMSOLL_LOG)
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| EnvFilter::new("error"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}
