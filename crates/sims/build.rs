//! Builds every simulator under sims/ (a directory holding a `*.c` or `*.cpp` source) into a
//! plimsoll-sim/1 WebAssembly module in OUT_DIR with scripts/build-sim, the one place that
//! knows how a simulator is compiled, and writes `shipped.rs`, the list the library exposes.
//!
//! Needs what scripts/build-sim needs: clang, wasm-ld (Debian `lld`) and wasi-libc; a missing
//! one fails the build with the Debian package to install.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest_dir =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets it"));
    let root = manifest_dir.join("../..");
    let sims = root.join("sims");
    let script = root.join("scripts/build-sim");
    // A directory is scanned as a whole: a new simulator or source reruns the build.
    println!("cargo:rerun-if-changed={}", sims.display());
    println!("cargo:rerun-if-changed={}", script.display());
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=/usr/lib/wasm32-wasi/libc.a");

    let mut names = Vec::new();
    let entries = std::fs::read_dir(&sims)
        .unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", sims.display())));
    for entry in entries {
        let entry = entry.unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", sims.display())));
        let path = entry.path();
        if path.is_dir() && holds_source(&path) {
            let name = entry
                .file_name()
                .into_string()
                .unwrap_or_else(|n| fail(&format!("{} is not UTF-8", Path::new(&n).display())));
            names.push(name);
        }
    }
    names.sort();

    let mut shipped = String::from("&[\n");
    for name in &names {
        let output = out_dir.join(format!("{name}.wasm"));
        build(&script, &sims.join(name), &output);
        writeln!(
            shipped,
            "    Shipped {{ name: {name:?}, wasm: include_bytes!(concat!(env!(\"OUT_DIR\"), \
             \"/{name}.wasm\")), scenario_dir: concat!(env!(\"CARGO_MANIFEST_DIR\"), \
             \"/../../sims/{name}/scenarios\") }},"
        )
        .expect("writing to a String");
    }
    shipped.push_str("]\n");
    let list = out_dir.join("shipped.rs");
    std::fs::write(&list, shipped)
        .unwrap_or_else(|e| fail(&format!("cannot write {}: {e}", list.display())));
}

/// Whether `dir` holds a C or C++ source of its own (not in a subdirectory).
fn holds_source(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|entry| {
        let path = entry.path();
        path.is_file()
            && path
                .extension()
                .is_some_and(|ext| ext == "c" || ext == "cpp")
    })
}

fn build(script: &Path, source_dir: &Path, output: &Path) {
    #[allow(
        clippy::disallowed_methods,
        reason = "a build script runs the host's compiler with the developer's environment"
    )]
    let result = Command::new(script).arg(source_dir).arg(output).output();
    let result = match result {
        Ok(r) => r,
        Err(e) => fail(&format!("cannot run {}: {e}", script.display())),
    };
    if !result.status.success() {
        fail(&format!(
            "{} {} failed ({}):\n{}{}",
            script.display(),
            source_dir.display(),
            result.status,
            String::from_utf8_lossy(&result.stdout),
            String::from_utf8_lossy(&result.stderr)
        ));
    }
}

fn fail(message: &str) -> ! {
    eprintln!("error: cannot build the shipped simulators: {message}");
    std::process::exit(1);
}
