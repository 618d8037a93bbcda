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
/// The filter tests' child (crates/broker/tests/filter.rs, crates/daemon/tests/split_filter.rs).
pub const PLIMSOLL_FILTER_PROBE: EnvVar = EnvVar {
    name: "PLIMSOLL_FILTER_PROBE",
    doc: "test only: makes a filter test's binary install its process's seccomp filter (the broker process's, the serving process's) and try the named syscall",
};
/// The launcher test's serving copy (crates/engine/tests/launch.rs).
pub const PLIMSOLL_LAUNCH_CHILD: EnvVar = EnvVar {
    name: "PLIMSOLL_LAUNCH_CHILD",
    doc: "test only: makes the launcher test's binary serve, as an unprivileged uid, through the launcher whose settings and socket are in the named directory",
};
/// No colour.
pub const NO_COLOR: EnvVar = EnvVar {
    name: "NO_COLOR",
    doc: "when set, output has no colour",
};

/// Handed on to the repository's build scripts by `plimsoll image build` (they find
/// rustup, mmdebstrap and pip on it); never to a sandbox.
pub const PATH: EnvVar = EnvVar {
    name: "PATH",
    doc: "handed on to scripts/build-image by `plimsoll image build` (never to a sandbox); searched by tests for a python3 with `cryptography`",
};

/// Handed on to the repository's build scripts by `plimsoll image build` (rustup finds its
/// toolchains under it); never to a sandbox.
pub const HOME: EnvVar = EnvVar {
    name: "HOME",
    doc: "handed on to scripts/build-image by `plimsoll image build` (never to a sandbox)",
};

/// All of them.
pub const ALL: &[EnvVar] = &[
    PLIMSOLL_CONFIG,
    PLIMSOLL_DAEMON,
    PLIMSOLL_TOKEN,
    PLIMSOLL_LOG,
    CI,
    PLIMSOLL_BLESS,
    PLIMSOLL_FILTER_PROBE,
    PLIMSOLL_LAUNCH_CHILD,
    NO_COLOR,
    PATH,
    HOME,
];

/// The variables the grants file names, as a pattern: each profile's `credential.secret_env`
/// (a static API token) or `credential.key_env` (an HS256 key), read once when the grants
/// file is loaded, through [`get_named_by_grants`] only.
pub const NAMED_BY_GRANTS: EnvVar = EnvVar {
    name: "<secret_env>, <key_env>",
    doc: "variables the grants file names (credential.secret_env / key_env): each profile's API secret or HMAC key, read when the grants file loads; never logged, never passed to a sandbox",
};

/// Where the run's broker channel is, inside a sandbox: set by the provider, read by the
/// agent's egress relay (and by the in-sandbox clients).
pub const PLIMSOLL_BROKER_SOCKET: EnvVar = EnvVar {
    name: "PLIMSOLL_BROKER_SOCKET",
    doc: "inside a sandbox with a grant: the broker channel's socket (set by the provider)",
};
/// Asks the agent inside a sandbox for the egress relay: set by the provider for a run with
/// an egress grant.
pub const PLIMSOLL_EGRESS_RELAY: EnvVar = EnvVar {
    name: "PLIMSOLL_EGRESS_RELAY",
    doc: "inside a sandbox with an egress grant: the agent listens on the proxy endpoint (set by the provider)",
};
/// Variables read only inside a sandbox, set there by a provider: not an operator's to set,
/// so not in `--help`.
pub const IN_SANDBOX: &[EnvVar] = &[PLIMSOLL_BROKER_SOCKET, PLIMSOLL_EGRESS_RELAY];

/// Variables read only by build scripts and tests, never by plimsoll's programs.
pub const BUILD_AND_TEST: &[EnvVar] = &[
    EnvVar {
        name: "OUT_DIR",
        doc: "set by cargo for build scripts (the trial crate's simulator build)",
    },
    EnvVar {
        name: "CARGO_MANIFEST_DIR",
        doc: "set by cargo for build scripts",
    },
    EnvVar {
        name: "PROPTEST_CASES",
        doc: "cases per property of the fuzz tests (`tests/fuzz.rs` of several crates); raise it to fuzz longer",
    },
];

/// The `--help` section listing them.
pub fn help_text() -> String {
    let mut s = String::from("Environment:\n");
    for v in ALL.iter().chain([&NAMED_BY_GRANTS]) {
        s.push_str(&format!("  {:<16} {}\n", v.name, v.doc));
    }
    s
}

/// Reads a declared variable.
pub fn get(var: EnvVar) -> Option<String> {
    std::env::var(var.name).ok().filter(|v| !v.is_empty())
}

/// Reads a variable the grants file names ([`NAMED_BY_GRANTS`]): the one way a name not
/// declared here is read. plimsoll's own variables are never handed out this way (a grant
/// naming `PLIMSOLL_TOKEN` would send the caller's token to an API), nor is anything but a
/// plain `[A-Z_][A-Z0-9_]*` name.
pub fn get_named_by_grants(name: &str) -> Option<String> {
    let plain = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    if !plain || name.starts_with("PLIMSOLL_") || ALL.iter().any(|v| v.name == name) {
        return None;
    }
    std::env::var(name).ok().filter(|v| !v.is_empty())
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
        let declared: Vec<&str> = ALL
            .iter()
            .chain(BUILD_AND_TEST)
            .chain(IN_SANDBOX)
            .map(|v| v.name)
            .collect();
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

    /// A read by a name that is not a string literal would escape the check above. Only
    /// this module ([`get`], [`get_named_by_grants`]) and build scripts (Cargo's own
    /// variables) may read one.
    #[test]
    fn every_read_by_a_computed_name_goes_through_this_module() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let this = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs");
        let mut files = Vec::new();
        rust_files(&root.join("crates"), &mut files);
        rust_files(&root.join("examples"), &mut files);
        let mut computed = Vec::new();
        for file in &files {
            if file.ends_with("build.rs") || file.canonicalize().ok() == this.canonicalize().ok() {
                continue;
            }
            let text = std::fs::read_to_string(file).unwrap();
            // Spelt in pieces so that this file does not match the other test's patterns.
            for pat in [
                concat!("env::", "var("),
                concat!("env::", "var_os("),
                concat!("get", "env("),
            ] {
                for (i, _) in text.match_indices(pat) {
                    if !text[i + pat.len()..].starts_with('"') {
                        computed.push(format!(
                            "{}: {}",
                            file.display(),
                            &text[i..(i + 40).min(text.len())]
                        ));
                    }
                }
            }
        }
        assert!(
            computed.is_empty(),
            "environment read by a computed name outside plimsoll_env: {computed:?}"
        );
    }

    #[test]
    fn grants_cannot_name_plimsolls_own_variables() {
        for name in [
            "PLIMSOLL_TOKEN",
            "PLIMSOLL_ANYTHING",
            "CI",
            "NO_COLOR",
            "lower",
            "A-B",
            "",
        ] {
            assert_eq!(get_named_by_grants(name), None, "{name}");
        }
        // The programs hand PATH and HOME on to build scripts: a grant names neither.
        for name in ["PATH", "HOME"] {
            assert_eq!(get_named_by_grants(name), None, "{name}");
        }
        // cargo and nextest set CARGO_PKG_NAME for every test: an ordinary name.
        assert!(get_named_by_grants("CARGO_PKG_NAME").is_some());
    }

    #[test]
    fn help_lists_every_variable() {
        let help = help_text();
        for v in ALL {
            assert!(help.contains(v.name));
        }
    }
}
