//! plimsoll: parses the command line and hands it to the library.

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    let cli = plimsoll_cli::Cli::parse();
    ExitCode::from(plimsoll_cli::main_with(cli))
}
