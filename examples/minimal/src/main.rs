//! The smallest real use of plimsoll: an engine embedded in this process, one provider, one
//! JavaScript snippet, and the tier it ran at printed beside its output and digests.
//!
//! Run it as root (the sandbox switches to an unprivileged uid): `cargo run -p
//! plimsoll-example-minimal`, or `make demo`.

use std::os::unix::fs::PermissionsExt as _;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use plimsoll_engine::settings::Settings;
use plimsoll_wire::{Language, PROTOCOL, RunRequest, RunSpec, Snippet, Tier};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plimsoll-example-minimal: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    // Runs live under a fresh directory; mode 0711 lets the sandbox's uid reach its own run
    // directory without listing anyone else's.
    let state = tempfile::Builder::new()
        .prefix("plimsoll-example-")
        .tempdir()
        .context("cannot create a state directory")?;
    std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o711))?;

    // THE PROCESS TIER: a hardened child process on the host kernel (its own uid, empty
    // environment, rlimits, landlock, seccomp). It is no wall for hostile code; it is here
    // because it works on any Linux host. Ask for `container` or stronger for untrusted code.
    let settings = Settings {
        providers: Some(vec!["process".into()]),
        default_floor: Some(Tier::Process),
        state_dir: Some(state.path().to_path_buf()),
        ..Settings::default()
    };
    let engine = settings.build_engine(&[])?;
    // Probing runs the probe program inside the wall and checks what it saw.
    engine.probe_all();
    if let Some(p) = engine.providers().iter().find(|p| !p.available) {
        bail!(
            "provider `{}` is not available: {}\n(run it as root; and if the probe program is \
             missing: `cargo run -p plimsoll-example-minimal` builds only this package, so run \
             `cargo build --workspace` or `make demo` first)",
            p.name,
            p.unavailable_reason.as_deref().unwrap_or("no reason given")
        );
    }

    let request = RunRequest {
        image: None,
        protocol: PROTOCOL,
        request_id: hex::encode(rand::random::<[u8; 16]>()),
        // Explicit floor: accept nothing weaker than the process tier.
        minimum_isolation: Some(Tier::Process),
        provider: None,
        limits: None,
        run: RunSpec::Snippet(Snippet {
            language: Language::Javascript,
            code: "console.log(`hello from ${process.release.name} ${process.version}`)".into(),
        }),
        grant: None,
    };
    let response = engine.run("example", &request)?;

    print!("{}", response.result.stdout.to_string_lossy());
    eprint!("{}", response.result.stderr.to_string_lossy());
    println!(
        "tier: {} (provider {})",
        response.isolation, response.provider
    );
    match response.result.exit_code {
        Some(code) => println!("exit code: {code}"),
        None => println!("killed by signal {:?}", response.result.signal),
    }
    println!("request sha256: {}", response.request_sha256);
    println!("result sha256:  {}", response.result_sha256);
    println!("record sha256:  {}", response.record.record_sha256);
    Ok(())
}
