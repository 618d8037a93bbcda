//! `plimsoll init`: sets a host up for plimsolld. Probes every provider, writes the settings
//! file listing those that passed (with a comment saying why each other one did not), creates
//! the state and callers directories, and adds a first caller whose token it prints once.

use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, anyhow};
use plimsoll_engine::settings::Settings;
use plimsoll_env as env;
use plimsoll_wire::{ProviderInfo, Tier};

use crate::args::InitArgs;
use crate::host::{self, one_line};
use crate::local::{DEFAULT_CONFIG, ensure_state_dir};
use crate::{EXIT_FAILED, EXIT_OK, Failure};

/// Runs `plimsoll init`.
pub fn init(config: Option<&Path>, a: &InitArgs) -> Result<u8, Failure> {
    let path = config
        .map(Path::to_path_buf)
        .or_else(|| env::get(env::PLIMSOLL_CONFIG).map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG));
    // Refuse before anything is probed or created.
    if path.exists() && !a.force {
        return Err(Failure::usage(anyhow!(
            "{} already exists: plimsoll init does not overwrite it. Edit it, or run \
             `plimsoll init --force` to probe again and replace it (its callers file is kept)",
            path.display()
        )));
    }
    if !a.state_dir.is_absolute() {
        return Err(Failure::usage(anyhow!(
            "--state-dir {} must be an absolute path",
            a.state_dir.display()
        )));
    }
    let names = a.providers.clone().unwrap_or_else(host::all_providers);
    if let Some(unknown) = names
        .iter()
        .find(|n| !plimsoll_engine::settings::PROVIDER_NAMES.contains(&n.as_str()))
    {
        return Err(Failure::usage(anyhow!(
            "--providers: there is no provider `{unknown}`; the providers are {}",
            plimsoll_engine::settings::PROVIDER_NAMES.join(", ")
        )));
    }
    let callers_file = a
        .callers_file
        .clone()
        .unwrap_or_else(|| path.parent().unwrap_or(Path::new("/")).join("callers.toml"));
    let settings = Settings {
        providers: Some(names.clone()),
        state_dir: Some(a.state_dir.clone()),
        sandbox_uid_base: a.sandbox_uid_base,
        oci: plimsoll_engine::settings::OciSection {
            image: Some(real_path(
                a.image
                    .clone()
                    .unwrap_or_else(|| host::image_dir(&Settings::default())),
            )),
            ..Default::default()
        },
        qemu: plimsoll_engine::settings::QemuSection {
            assets: Some(real_path(
                a.vm_assets
                    .clone()
                    .unwrap_or_else(|| host::vm_assets_dir(&Settings::default())),
            )),
            ..Default::default()
        },
        daemon: plimsoll_engine::settings::DaemonSection {
            listen: Some(a.listen.clone()),
            callers_file: Some(callers_file.clone()),
            ..Default::default()
        },
        ..Default::default()
    };

    // The broker process's user, and the serving user: with it, the settings split the
    // daemon (docs/privileges.md, "The split daemon").
    ensure_system_user(
        plimsoll_broker::apart::DEFAULT_USER,
        "plimsoll broker process",
    )
    .map_err(Failure::failed)?;
    let serving = plimsoll_engine::settings::DEFAULT_SERVING_USER;
    let mut settings = settings;
    if ensure_system_user(serving, "plimsoll serving process").map_err(Failure::failed)? {
        settings.daemon.serving_user = Some(serving.to_owned());
    }

    ensure_state_dir(&a.state_dir).map_err(Failure::failed)?;
    let found = host::probe(&settings, &names)?;
    let text = render(&settings, &found);
    if !found.iter().any(|p| p.available) {
        for p in &found {
            crate::note(&format!(
                "{}: {}",
                p.name,
                one_line(p.unavailable_reason.as_deref())
            ));
        }
        return Err(Failure {
            status: EXIT_FAILED,
            error: anyhow!(
                "no provider passed its probe on this host, so {} was not written: \
                 `plimsoll doctor` says what each tier would take",
                path.display()
            ),
        });
    }
    // What was written must load as the daemon will load it.
    Settings::parse(&text)
        .map_err(|e| Failure::failed(anyhow!("the settings init wrote do not parse: {e}")))?;
    write_settings(&path, &text).map_err(Failure::failed)?;
    crate::note(&format!("wrote {}", path.display()));

    let callers_dir = callers_file.parent().unwrap_or(Path::new("/"));
    let made_dir = make_private_dir(callers_dir).map_err(Failure::failed)?;
    match plimsoll_callers::add_caller(&callers_file, &a.caller) {
        Ok(token) => {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{}", token.expose());
            let _ = out.flush();
            crate::note(&format!(
                "added caller `{}` to {}. The token above is shown only this once: the file \
                 keeps only its SHA-256. Give it to the caller (PLIMSOLL_TOKEN).",
                a.caller,
                callers_file.display()
            ));
        }
        Err(plimsoll_callers::AddCallerError::Duplicate { .. }) if a.force => {
            crate::note(&format!(
                "caller `{}` is already in {}: kept, with its old token (not shown again)",
                a.caller,
                callers_file.display()
            ));
        }
        Err(e) => {
            use plimsoll_callers::AddCallerError as E;
            let usage = matches!(e, E::InvalidName { .. } | E::Duplicate { .. });
            let err = anyhow!(e).context(format!(
                "{} was written, but the first caller was not added: fix this, then run \
                 `plimsoll callers add NAME --config {}`",
                path.display(),
                path.display()
            ));
            return Err(if usage {
                Failure::usage(err)
            } else {
                Failure::failed(err)
            });
        }
    }
    // The serving process reads the callers file as the serving user: the file (and the
    // directory init made for it) are root's, readable by that user's group.
    if let Some(user) = &settings.daemon.serving_user {
        let made = made_dir.then_some(callers_dir);
        share_with_group(&callers_file, made, user).map_err(Failure::failed)?;
    }
    crate::note(&format!(
        "next: plimsolld --config {}   (or, installed from the package: systemctl start \
         plimsolld)",
        path.display()
    ));
    Ok(EXIT_OK)
}

/// System user `name` (`role` says what runs as it: docs/privileges.md), created when this host
/// lacks it (`useradd`, as root), as the package's postinst and scripts/install-deps do.
/// Whether the host has it now (not when init is not root and it was missing: a note says
/// how to make it).
fn ensure_system_user(name: &str, role: &str) -> anyhow::Result<bool> {
    if plimsoll_broker::apart::ProcessUser::lookup(name).is_ok() {
        crate::note(&format!("the {role}'s user {name} exists"));
        return Ok(true);
    }
    if !rustix::process::geteuid().is_root() {
        crate::note(&format!(
            "no user {name}, which the {role} runs as: as root, run `plimsoll init` again or \
             `useradd --system --user-group --no-create-home --home-dir /nonexistent --shell \
             /usr/sbin/nologin {name}`"
        ));
        return Ok(false);
    }
    let mut running = plimsoll_sandbox::Spawn::new("/usr/sbin/useradd", "/")
        .args([
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            "--comment",
            role,
            name,
        ])
        .spawn()
        .context("cannot run useradd")?;
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(&mut running.stderr, &mut err);
    let status = running.child.wait().context("waiting for useradd")?;
    if !status.success() {
        return Err(anyhow!(
            "useradd could not create the {role}'s user {name} ({status}): {}",
            err.trim()
        ));
    }
    crate::note(&format!(
        "created the system user {name}, which the {role} runs as"
    ));
    Ok(true)
}

/// `file` (and `dir`, when init made it) owned by root with `user`'s group, readable by that
/// group alone: 0640 and 0750.
fn share_with_group(file: &Path, dir: Option<&Path>, user: &str) -> anyhow::Result<()> {
    let who = plimsoll_broker::apart::ProcessUser::lookup(user)
        .map_err(|problem| anyhow!("the serving user {user}, {problem}"))?;
    let gid = rustix::fs::Gid::from_raw(who.gid);
    for (path, mode) in dir.map(|d| (d, 0o750)).into_iter().chain([(file, 0o640)]) {
        rustix::fs::chown(path, Some(rustix::fs::Uid::ROOT), Some(gid))
            .with_context(|| format!("cannot give {} to group {user}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("cannot set the mode of {}", path.display()))?;
    }
    Ok(())
}

/// The grant profile the settings file shows, commented out, as the one to copy: a credential
/// minted per run, short-lived, naming the caller and the run. The same text is the first
/// profile of docs/capability-grants.md's example (a test checks), which the broker's tests
/// load.
const EXAMPLE_GRANT: &str = r#"[profiles.orders]
base_url = "https://orders.example.com"
routes = ["GET /orders/*", "PATCH /orders/*"]
callers = ["alice"]
call_budget = 50

[profiles.orders.credential]
kind = "jwt"
key_env = "ORDERS_JWT_KEY"                  # the HMAC key, at least 32 bytes
audience = "orders-api"                     # `aud`
issuer = "plimsoll"                         # `iss` (optional)
max_lifetime_secs = 60                      # optional: a cap below the run's budget
header = "Authorization"                    # optional, the default
scheme = "Bearer"                           # optional, the default; "" sends the token alone
"#;

/// The settings file's text: the providers that passed, a comment for each that did not.
pub fn render(settings: &Settings, found: &[ProviderInfo]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# plimsoll settings, written by `plimsoll init` from the probes of this host.\n\
         # The format: docs/daemon.md and crates/engine/src/settings.rs. `plimsoll doctor`\n\
         # says what each missing tier would take; `plimsoll init --force` probes again.\n"
    );
    let passed: Vec<&ProviderInfo> = found.iter().filter(|p| p.available).collect();
    let _ = writeln!(s, "# Providers that passed their probe here:");
    for p in &passed {
        let _ = writeln!(s, "#   {} (tier {})", p.name, p.isolation);
    }
    let failed: Vec<&ProviderInfo> = found.iter().filter(|p| !p.available).collect();
    if !failed.is_empty() {
        let _ = writeln!(s, "# Not offered (left out of `providers`):");
        for p in &failed {
            let _ = writeln!(
                s,
                "#   {} (tier {}): {}",
                p.name,
                p.isolation,
                one_line(p.unavailable_reason.as_deref())
            );
        }
    }
    let list: Vec<String> = passed.iter().map(|p| quote(&p.name)).collect();
    let _ = writeln!(s, "providers = [{}]", list.join(", "));
    let best = passed.iter().map(|p| p.isolation).max();
    let _ = writeln!(
        s,
        "\n# The floor of a request that sets none: nothing runs below it."
    );
    if best.is_none_or(|t| t < Tier::Container) {
        let _ = writeln!(
            s,
            "# No provider at `container` or above passed here, so a request without a floor\n\
             # is refused; a caller must ask for `process` explicitly (no wall for hostile code)."
        );
    }
    let _ = writeln!(s, "default_floor = \"container\"");
    if let Some(dir) = &settings.state_dir {
        let _ = writeln!(s, "state_dir = {}", quote_path(dir));
    }
    match settings.sandbox_uid_base {
        Some(base) => {
            let _ = writeln!(s, "sandbox_uid_base = {base}");
        }
        None => {
            let _ = writeln!(
                s,
                "# sandbox_uid_base = 2000000   # two daemons on one host need disjoint ranges"
            );
        }
    }
    let grants = settings
        .daemon
        .callers_file
        .as_deref()
        .and_then(Path::parent)
        .unwrap_or(Path::new("/etc/plimsoll"))
        .join("grants.toml");
    let _ = writeln!(
        s,
        "\n# Grants (docs/capability-grants.md) let sandboxed code call an API of yours without\n\
         # ever holding its credential. To offer one, write a grants file with a profile such as\n\
         # the one below and name it here. Its credential is minted for each run: an HS256 JWT\n\
         # naming the caller and the run, dead within a minute. Prefer it to `kind = \"static\"`\n\
         # (one secret for every run, for development only).\n\
         # grants_file = {}\n#",
        quote_path(&grants)
    );
    for line in EXAMPLE_GRANT.lines() {
        let _ = writeln!(s, "#   {line}");
    }
    let _ = writeln!(s, "\n[oci]");
    if let Some(image) = &settings.oci.image {
        if !image.join("identity").is_file() {
            let _ = writeln!(
                s,
                "# not built yet: `make images` builds it (scripts/build-image)"
            );
        }
        let _ = writeln!(s, "image = {}", quote_path(image));
    }
    let _ = writeln!(s, "\n[qemu]");
    if let Some(assets) = &settings.qemu.assets {
        if !assets.join("vmlinux").is_file() {
            let _ = writeln!(
                s,
                "# not built yet: `make vm-assets` builds them (scripts/build-vm-assets)"
            );
        }
        let _ = writeln!(s, "assets = {}", quote_path(assets));
    }
    let _ = writeln!(s, "\n[daemon]");
    if let Some(listen) = &settings.daemon.listen {
        let _ = writeln!(s, "listen = {}", quote(listen));
    }
    if let Some(callers) = &settings.daemon.callers_file {
        let _ = writeln!(s, "callers_file = {}", quote_path(callers));
    }
    let _ = writeln!(
        s,
        "# The process that serves HTTP and MCP and reads what sandboxes send back runs as this\n\
         # user, with no capability; a launcher process keeps root (docs/privileges.md)."
    );
    match &settings.daemon.serving_user {
        Some(user) => {
            let _ = writeln!(s, "serving_user = {}", quote(user));
        }
        None => {
            let _ = writeln!(
                s,
                "# Not set: the user {} is missing (run `plimsoll init` as root), so one root\n\
                 # process serves.\n# serving_user = {}",
                plimsoll_engine::settings::DEFAULT_SERVING_USER,
                quote(plimsoll_engine::settings::DEFAULT_SERVING_USER)
            );
        }
    }
    s
}

/// Why a provider is not offered, on one line.
fn quote(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

fn quote_path(p: &Path) -> String {
    quote(&p.display().to_string())
}

/// The path with symlinks resolved when it exists (the OCI providers refuse an image reached
/// through a symlink), else as given.
fn real_path(p: PathBuf) -> PathBuf {
    std::fs::canonicalize(&p).unwrap_or(p)
}

/// Writes the settings file (mode 0644: it holds no secret) through a temporary file in the
/// same directory, so a reader never sees half of it. Creates the directory (0755) if needed.
fn write_settings(path: &Path, text: &str) -> anyhow::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let dir = dir.unwrap_or(Path::new("."));
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let mut tmp = tempfile::Builder::new()
        .prefix(".plimsoll-init-")
        .tempfile_in(dir)
        .with_context(|| format!("cannot write in {}", dir.display()))?;
    tmp.write_all(text.as_bytes())
        .with_context(|| format!("cannot write in {}", dir.display()))?;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o644))
        .with_context(|| format!("cannot set the mode of {}", tmp.path().display()))?;
    tmp.persist(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Creates the callers file's directory with mode 0700 when it does not exist (an existing
/// one, such as /etc/plimsoll holding the settings too, keeps its mode; the file itself is
/// 0600).
/// Makes `dir` (mode 0700) when it is not there; whether it made it.
fn make_private_dir(dir: &Path) -> anyhow::Result<bool> {
    if dir.as_os_str().is_empty() || dir.exists() {
        return Ok(false);
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use plimsoll_wire::Evidence;

    use super::*;

    fn info(name: &str, tier: Tier, reason: Option<&str>) -> ProviderInfo {
        ProviderInfo {
            name: name.into(),
            isolation: tier,
            available: reason.is_none(),
            unavailable_reason: reason.map(str::to_owned),
            evidence: Evidence {
                provider: name.into(),
                isolation: tier,
                config: Default::default(),
                binaries: vec![],
                probe: None,
                checks: Default::default(),
                environment: String::new(),
                checked_unix_ms: 0,
            },
            evidence_sha256: String::new(),
        }
    }

    #[test]
    fn the_file_lists_what_passed_and_says_why_the_rest_did_not() {
        let settings = Settings {
            state_dir: Some("/var/lib/plimsoll".into()),
            oci: plimsoll_engine::settings::OciSection {
                image: Some("/srv/\"odd\" image".into()),
                ..Default::default()
            },
            daemon: plimsoll_engine::settings::DaemonSection {
                listen: Some("127.0.0.1:7878".into()),
                callers_file: Some("/etc/plimsoll/callers.toml".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let text = render(
            &settings,
            &[
                info("process", Tier::Process, None),
                info(
                    "crun",
                    Tier::Container,
                    Some("no crun at /usr/bin/crun:\ninstall it"),
                ),
            ],
        );
        assert!(text.contains("providers = [\"process\"]\n"), "{text}");
        assert!(
            text.contains("#   crun (tier container): no crun at /usr/bin/crun: install it\n"),
            "{text}"
        );
        assert!(
            text.contains("No provider at `container` or above"),
            "{text}"
        );
        let parsed = Settings::parse(&text).unwrap();
        assert_eq!(parsed.providers, Some(vec!["process".to_owned()]));
        assert_eq!(
            parsed.oci.image.as_deref(),
            Some(Path::new("/srv/\"odd\" image"))
        );
        assert_eq!(parsed.default_floor, Some(Tier::Container));
        assert_eq!(
            parsed.daemon.callers_file.as_deref(),
            Some(Path::new("/etc/plimsoll/callers.toml"))
        );
    }

    /// The settings file shows a grant profile to copy, commented out, and it is the
    /// recommended kind: a JWT minted per run with a short lifetime, the same profile the
    /// grants doc shows first (whose example the broker's tests load).
    #[test]
    fn the_file_shows_a_minted_grant_to_copy() {
        let settings = Settings {
            daemon: plimsoll_engine::settings::DaemonSection {
                callers_file: Some("/etc/plimsoll/callers.toml".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let text = render(&settings, &[info("process", Tier::Process, None)]);
        let example: String = text
            .lines()
            .filter_map(|l| l.strip_prefix("#   "))
            .filter(|l| !l.starts_with("process (tier"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(example, EXAMPLE_GRANT, "{text}");
        let doc = include_str!("../../../docs/capability-grants.md");
        assert!(
            doc.contains(&format!("```toml\n# The recommended default: an HS256 JWT minted for each run, naming the caller and the run,\n# and dead within a minute, or when the run's time is up if that is sooner.\n{EXAMPLE_GRANT}")),
            "docs/capability-grants.md's example does not start with init's profile"
        );
        let grants: toml::Value = toml::from_str(&example).unwrap();
        let credential = &grants["profiles"]["orders"]["credential"];
        assert_eq!(credential["kind"].as_str(), Some("jwt"));
        assert!(
            credential["max_lifetime_secs"]
                .as_integer()
                .is_some_and(|s| s <= 300)
        );
        // Uncommenting the `grants_file` line names the file beside the callers file.
        let named = text.replace(
            "# grants_file = \"/etc/plimsoll/grants.toml\"",
            "grants_file = \"/etc/plimsoll/grants.toml\"",
        );
        assert_ne!(named, text);
        assert_eq!(
            Settings::parse(&named).unwrap().grants_file.as_deref(),
            Some(Path::new("/etc/plimsoll/grants.toml"))
        );
    }
}
