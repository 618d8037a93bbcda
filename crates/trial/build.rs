//! Builds the cart-pole simulator (sims/cartpole/cartpole.c) into a WebAssembly module with no
//! imports, so `cargo build` alone produces it. The module is embedded in the runner
//! (`plimsoll_trial::CARTPOLE_WASM`).
//!
//! Needs clang, wasm-ld (Debian `lld`) and wasi-libc's libc.a (for sin and cos); a missing one
//! fails the build with the Debian package to install.

use std::path::{Path, PathBuf};
use std::process::Command;

/// wasi-libc's static library on Debian. Its libm.a is an empty stub: sin and cos live here.
const WASI_LIBC: &str = "/usr/lib/wasm32-wasi/libc.a";

fn main() {
    let manifest_dir =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets it"));
    let source = manifest_dir.join("../../sims/cartpole/cartpole.c");
    println!("cargo:rerun-if-changed={}", source.display());
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={WASI_LIBC}");

    let clang = find_program(&["clang", "clang-14"]).unwrap_or_else(|| {
        fail("`clang` was not found on PATH. Install the Debian packages `clang lld wasi-libc` (scripts/install-deps does it).")
    });
    if find_program(&["wasm-ld", "wasm-ld-14"]).is_none() {
        fail(
            "`wasm-ld` was not found on PATH. Install the Debian package `lld` (scripts/install-deps does it).",
        );
    }
    if !Path::new(WASI_LIBC).is_file() {
        fail(&format!(
            "{WASI_LIBC} is missing. Install the Debian package `wasi-libc` (scripts/install-deps does it)."
        ));
    }

    let output = out_dir.join("cartpole.wasm");
    // -g0: no debug info, so no build path ends up in the module and the bytes (and so
    // simulator_sha256) depend only on the source and the toolchain versions.
    // -ffp-contract=off: no fused multiply-add, each operation rounds as written.
    #[allow(
        clippy::disallowed_methods,
        reason = "a build script runs the host's compiler with the developer's environment"
    )]
    let result = Command::new(&clang)
        .args([
            "--target=wasm32",
            "-O2",
            "-g0",
            "-ffp-contract=off",
            "-nostdlib",
            "-Wl,--no-entry",
            "-o",
        ])
        .arg(&output)
        .arg(&source)
        .arg(WASI_LIBC)
        .output();
    let result = match result {
        Ok(r) => r,
        Err(e) => fail(&format!("cannot run {}: {e}", clang.display())),
    };
    if !result.status.success() {
        fail(&format!(
            "{} failed to build {} ({}):\n{}{}",
            clang.display(),
            source.display(),
            result.status,
            String::from_utf8_lossy(&result.stdout),
            String::from_utf8_lossy(&result.stderr)
        ));
    }
}

/// The first of `names` that runs (`NAME --version` succeeds), looked up on PATH by the OS.
fn find_program(names: &[&str]) -> Option<PathBuf> {
    names.iter().map(PathBuf::from).find(|name| {
        #[allow(
            clippy::disallowed_methods,
            reason = "a build script runs the host's tools with the developer's environment"
        )]
        let status = Command::new(name)
            .arg("--version")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        status.is_ok_and(|s| s.success())
    })
}

fn fail(message: &str) -> ! {
    eprintln!("error: cannot build the cart-pole simulator: {message}");
    std::process::exit(1);
}
