//! Every environment variable plimsoll's programs read, declared once with its meaning.
//! `--help` lists them, and a test fails when code reads one that is not declared here.

/// One declared environment variable.
#[derive(Debug, Clone, Copy)]
pub struct EnvVar {
    /// Its name.
    pub name: &'static str,
    /// What it does.
    pub doc: &'static str,
}

/// The settings file (TOML) for plimsolld and the CLI's embedded engine.
pub const PLIMSOLL_CONFIG: EnvVar = EnvVar {
    name: "PLIMSOLL_CONFIG",
    doc: "settings file for plimsolld and the embedded engine (default /etc/plimsoll/plimsoll.toml if it exists)",
};
/// The daemon URL the CLI and clients talk to.
pub const PLIMSOLL_DAEMON: EnvVar = EnvVar {
    name: "PLIMSOLL_DAEMON",
    doc: "daemon URL for `plimsoll run` (same as --daemon)",
};
/// The caller token presented to the daemon.
pub const PLIMSOLL_TOKEN: EnvVar = EnvVar {
    name: "PLIMSOLL_TOKEN",
    doc: "caller bearer token for the daemon (never logged)",
};
/// Log filter.
pub const PLIMSOLL_LOG: EnvVar = EnvVar {
    name: "PLIMSOLL_LOG",
    doc: "log filter, e.g. `info` or `plimsoll_engine=debug` (default info)",
};
/// Strict test mode.
pub const CI: EnvVar = EnvVar {
    name: "CI",
    doc: "when `true`, tests that would skip for a missing runtime fail instead",
};
/// Rewrite golden files.
pub const PLIMSOLL_BLESS: EnvVar = EnvVar {
    name: "PLIMSOLL_BLESS",
    doc: "when `1`, golden-vector tests rewrite their files and show the diff",
};
/// No colour.
pub const NO_COLOR: EnvVar = EnvVar {
    name: "NO_COLOR",
    doc: "when set, output has no colour",
};

/// All of them.
pub const ALL: &[EnvVar] = &[
    PLIMSOLL_CONFIG,
    PLIMSOLL_DAEMON,
    PLIMSOLL_TOKEN,
    PLIMSOLL_LOG,
    CI,
    PLIMSOLL_BLESS,
    NO_COLOR,
];

/// The `--help` section listing them.
pub fn help_text() -> String {
    let mut s = String::from("Environment:\n");
    for v in ALL {
        s.push_str(&format!("  {:<16} {}\n", v.name, v.doc));
    }
    s
}

/// Reads a declared variable.
pub fn get(var: EnvVar) -> Option<String> {
    std::env::var(var.name).ok().filter(|v| !v.is_empty())
}

/// True when tests run strictly (`CI=true`): a missing runtime fails instead of skipping.
pub fn strict() -> bool {
    get(CI).is_some_and(|v| v == "true" || v == "1")
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "target") {
                    rust_files(&path, out);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// Every direct read of a variable by name in the workspace names a declared
    /// variable, and reading through `env::get` needs a declared `EnvVar` by construction.
    #[test]
    fn every_environment_variable_read_is_declared() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut files = Vec::new();
        rust_files(&root.join("crates"), &mut files);
        rust_files(&root.join("examples"), &mut files);
        assert!(files.len() > 10, "found only {} source files", files.len());
        let declared: Vec<&str> = ALL.iter().map(|v| v.name).collect();
        let mut undeclared = Vec::new();
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            for pat in [
                "env::var(\"",
                "env::var_os(\"",
                "std::env::var(\"",
                "getenv(\"",
            ] {
                for (i, _) in text.match_indices(pat) {
                    let rest = &text[i + pat.len()..];
                    let name = &rest[..rest.find('"').unwrap_or(0)];
                    if !declared.contains(&name) {
                        undeclared.push(format!("{}: {name}", file.display()));
                    }
                }
            }
        }
        assert!(
            undeclared.is_empty(),
            "undeclared environment variables: {undeclared:?}"
        );
    }

    #[test]
    fn help_lists_every_variable() {
        let help = help_text();
        for v in ALL {
            assert!(help.contains(v.name));
        }
    }
}
