//! `plimsoll completions SHELL` and `plimsoll man DIR`: shell completion scripts and man
//! pages, generated from the clap definitions, so they never drift from `--help`.

use std::io::Write as _;
use std::path::Path;

use anyhow::Context as _;
use clap::CommandFactory as _;

use crate::args::Cli;
use crate::{EXIT_OK, Failure};

/// Prints the completion script for `shell` on stdout.
pub fn completions(shell: clap_complete::Shell) -> Result<u8, Failure> {
    let mut cmd = Cli::command();
    let mut out = std::io::stdout().lock();
    clap_complete::generate(shell, &mut cmd, "plimsoll", &mut out);
    let _ = out.flush();
    Ok(EXIT_OK)
}

/// Writes plimsoll.1 and one page per subcommand (plimsoll-run.1, plimsoll-callers-add.1,
/// ...) into `dir`, and says on stderr how many.
pub fn man(dir: &Path) -> Result<u8, Failure> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create {}", dir.display()))
        .map_err(Failure::failed)?;
    // One page per command, named after its whole path (plimsoll-callers-add.1), as `man
    // plimsoll-run` expects.
    clap_mangen::generate_to(Cli::command(), dir)
        .with_context(|| format!("cannot write the man pages into {}", dir.display()))
        .map_err(Failure::failed)?;
    let written = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().ends_with(".1"))
                .count()
        })
        .unwrap_or(0);
    crate::note(&format!("{written} man pages in {}", dir.display()));
    Ok(EXIT_OK)
}
