//! `plimsoll callers add`: a new caller in the daemon's callers file, its token shown once.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::anyhow;

use crate::local::load_settings;
use crate::{EXIT_OK, Failure};

/// The callers file when neither --file nor the settings name one.
pub const DEFAULT_CALLERS_FILE: &str = "/etc/plimsoll/callers.toml";

/// Runs `plimsoll callers add NAME [--file PATH]`.
pub fn add(config: Option<&Path>, name: &str, file: Option<&Path>) -> Result<u8, Failure> {
    let path = match file {
        Some(f) => f.to_path_buf(),
        None => load_settings(config)?
            .daemon
            .callers_file
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CALLERS_FILE)),
    };
    let token = plimsoll_callers::add_caller(&path, name).map_err(|e| {
        use plimsoll_callers::AddCallerError as E;
        let status_usage = matches!(e, E::InvalidName { .. } | E::Duplicate { .. });
        let err = anyhow!(e);
        if status_usage {
            Failure::usage(err)
        } else {
            Failure::failed(err)
        }
    })?;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", token.expose());
    let _ = out.flush();
    crate::note(&format!(
        "added caller `{name}` to {}. The token above is shown only this once: \
         the file keeps only its SHA-256. Give it to the caller (PLIMSOLL_TOKEN).",
        path.display()
    ));
    Ok(EXIT_OK)
}
