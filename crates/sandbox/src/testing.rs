//! Helpers for tests that need something real from the host (root, a runtime, the probe
//! binary): skip with a visible line, or fail when tests run strictly (CI).

use std::path::{Path, PathBuf};

/// True when tests run strictly: env `CI` is `true` or `1` (declared as
/// `plimsoll_engine::env::CI`; read here directly because this crate sits below the engine).
pub fn strict() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Prints `SKIP <test>: <reason>` and returns, or panics with the same text when tests run
/// strictly. Call it, then `return` from the test.
pub fn skip_or_fail(test: &str, reason: &str) {
    if strict() {
        panic!("SKIP not allowed under CI=true: {test}: {reason}");
    }
    eprintln!("SKIP {test}: {reason}");
}

/// True when this process runs as root (many sandbox tests need it).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// The `plimsoll-probe` binary of this build: beside the running test binary's directory
/// (`target/<profile>/`), built with `cargo build -p plimsoll-probe` first when it is not
/// there yet (a `cargo nextest run -p <crate>` does not build other packages' binaries).
pub fn probe_binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the test binary: {e}"))?;
    // target/<profile>/deps/<test> -> target/<profile>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| format!("unexpected test binary path {}", exe.display()))?;
    let probe = profile_dir.join("plimsoll-probe");
    if probe.exists() {
        return Ok(probe);
    }
    let profile = profile_dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("debug");
    let target_dir = profile_dir.parent().unwrap_or(profile_dir);
    let mut args = vec![
        "build".to_owned(),
        "-p".into(),
        "plimsoll-probe".into(),
        "--target-dir".into(),
        target_dir.display().to_string(),
    ];
    if profile == "release" {
        args.push("--release".into());
    }
    #[expect(
        clippy::disallowed_methods,
        reason = "building a test fixture needs the developer's own environment (PATH, CARGO_HOME)"
    )]
    let status = std::process::Command::new("cargo")
        .args(&args)
        .status()
        .map_err(|e| format!("cannot run cargo to build plimsoll-probe: {e}"))?;
    if !status.success() || !probe.exists() {
        return Err(format!(
            "`cargo {}` did not produce {}",
            args.join(" "),
            probe.display()
        ));
    }
    Ok(probe)
}
