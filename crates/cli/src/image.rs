//! `plimsoll image`: the image store of the settings (docs/images.md): list, show, import,
//! remove. Listing through a daemon reads its `GET /v1/providers`.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, anyhow};
use plimsoll_client::RunOptions;
use plimsoll_image::{ImageStore, StoredImage};
use plimsoll_wire::ImageInfo;
use serde_json::json;

use crate::args::ImageCommand;
use crate::local::{client, daemon_url, load_settings};
use crate::{EXIT_OK, Failure};

/// Runs `plimsoll image ...`.
pub fn image(config: Option<&Path>, command: ImageCommand) -> Result<u8, Failure> {
    match command {
        ImageCommand::List { json, daemon } => {
            let images = match daemon_url(daemon.as_deref()) {
                Some(url) => {
                    client(&url)?
                        .providers()
                        .map_err(|e| Failure::failed(anyhow!(e)))?
                        .images
                }
                None => local_infos(&store(config)?)?,
            };
            if json {
                print_json(&serde_json::to_value(&images).expect("images serialise"));
            } else {
                print_text(&render_list(&images));
            }
            Ok(EXIT_OK)
        }
        ImageCommand::Show { image, json } => {
            let store = store(config)?;
            let found = store.resolve(Some(&image)).map_err(Failure::usage)?;
            let facts = facts(&store, &found);
            if json {
                print_json(&facts);
            } else {
                print_text(&render_facts(&facts));
            }
            Ok(EXIT_OK)
        }
        ImageCommand::Import { source, name, json } => {
            let store = store(config)?;
            let source = plimsoll_image::import::Source {
                path: source,
                image: None,
            };
            let imported = plimsoll_image::import::import(
                &source,
                &name,
                &store,
                &plimsoll_image::import::Limits::default(),
                &mut |line| {
                    if !crate::quiet() {
                        eprintln!("plimsoll: {line}");
                    }
                },
            )
            .map_err(|e| Failure::failed(anyhow!(plimsoll_sandbox::error_chain(&e))))?;
            let disk = make_disk(&imported.image);
            let mut facts = facts(&store, &store.read(&name).map_err(Failure::failed)?);
            facts["source"] = json!({
                "form": imported.form.as_str(),
                "path": imported.source,
                "oci_manifest": imported.oci_manifest,
                "layers": imported.layers,
                "unpacked_bytes": imported.unpacked_bytes,
                "entries": imported.entries,
            });
            facts["neutralised"] = json!({
                "removed": imported.neutralised.removed.iter().map(|(p, k)| json!({"path": p, "kind": k})).collect::<Vec<_>>(),
                "cleared_setid": imported.neutralised.cleared_setid.iter().map(|(p, m)| json!({"path": p, "mode_was": format!("{m:04o}")})).collect::<Vec<_>>(),
                "removed_xattrs": imported.neutralised.removed_xattrs.iter().map(|(p, n)| json!({"path": p, "name": n})).collect::<Vec<_>>(),
                "made": imported.neutralised.made,
            });
            if let Err(e) = &disk {
                facts["vm_disk_error"] = json!(format!("{e:#}"));
            }
            if json {
                print_json(&facts);
            } else {
                print_text(&render_facts(&facts));
                if let Err(e) = disk {
                    eprintln!("plimsoll: no VM disk was made, so qemu refuses this image: {e:#}");
                }
            }
            Ok(EXIT_OK)
        }
        ImageCommand::Check {
            image,
            provider,
            json,
        } => {
            let settings = load_settings(config)?;
            let store = settings
                .image_store()
                .map_err(|e| Failure::usage(anyhow!(e)))?;
            let found = store.resolve(Some(&image)).map_err(Failure::usage)?;
            let engine = crate::local::unprobed_engine(&settings)?;
            let checks = check(&engine, &found, provider.as_deref());
            let all_ok = checks.iter().all(|(_, outcome)| outcome.is_ok());
            if json {
                let v: serde_json::Map<String, serde_json::Value> = checks
                    .iter()
                    .map(|(what, outcome)| {
                        let value = match outcome {
                            Ok(said) => json!({"ok": true, "said": said}),
                            Err(why) => json!({"ok": false, "why": why}),
                        };
                        ((*what).to_owned(), value)
                    })
                    .collect();
                print_json(&json!({"name": found.name(), "identity": found.identity, "checks": v}));
            } else {
                let mut text = format!("{} ({})\n", found.name(), found.identity);
                for (what, outcome) in &checks {
                    match outcome {
                        Ok(said) => text.push_str(&format!("  {what}: ok ({said})\n")),
                        Err(why) => text.push_str(&format!("  {what}: NO: {why}\n")),
                    }
                }
                print_text(&text);
            }
            Ok(if all_ok { EXIT_OK } else { crate::EXIT_FAILED })
        }
        ImageCommand::Build { name, force } => {
            let script = repo_script("build-image").ok_or_else(|| {
                Failure::usage(anyhow!(
                    "scripts/build-image is not beside this build: build images from a checkout of the repository"
                ))
            })?;
            let mut args = vec![name];
            if force {
                args.insert(0, "--force".to_owned());
            }
            run_showing_progress(&script, &args).map_err(Failure::failed)?;
            Ok(EXIT_OK)
        }
        ImageCommand::Rm { name } => {
            // A run that starts between the check and the removal keeps what it opened (its
            // root mount, its disk): Linux keeps a removed file for whoever holds it.
            let store = store(config)?;
            if name == store.default_name() {
                return Err(Failure::usage(anyhow!(
                    "`{name}` is the default image: set another [images] default first"
                )));
            }
            let found = store.read(&name).map_err(Failure::usage)?;
            let users = plimsoll_image::processes_using(&found);
            if !users.is_empty() {
                return Err(Failure::failed(anyhow!(
                    "image `{name}` is in use by {} process(es) (pids {:?}: runs, sessions or warm members in it); nothing was removed: retry once they have ended (close its sessions; drop it from [pools] images)",
                    users.len(),
                    users
                )));
            }
            remove(&store, &found).map_err(Failure::failed)?;
            if !crate::quiet() {
                eprintln!(
                    "plimsoll: removed image {name} ({}); runs and sessions already in it keep what they opened",
                    found.identity
                );
            }
            Ok(EXIT_OK)
        }
    }
}

/// The image store the settings name.
fn store(config: Option<&Path>) -> Result<ImageStore, Failure> {
    load_settings(config)?
        .image_store()
        .map_err(|e| Failure::usage(anyhow!(e)))
}

/// Runs in `image`, for real: Python and JavaScript snippets (each interpreter started by the
/// agent that serves every run, which runs on the image's own C library) and a shell step
/// (a project, as trials and grants' clients run). Each check: what it said, or why not.
fn check(
    engine: &plimsoll_engine::Engine,
    image: &StoredImage,
    provider: Option<&str>,
) -> Vec<(&'static str, Result<String, String>)> {
    use plimsoll_wire::Language;
    let cases: [(&'static str, plimsoll_wire::RunSpec); 3] = [
        (
            "python",
            plimsoll_wire::RunSpec::Snippet(plimsoll_wire::Snippet {
                language: Language::Python,
                code: "import sys; print(sys.version.split()[0])".into(),
            }),
        ),
        (
            "javascript",
            plimsoll_wire::RunSpec::Snippet(plimsoll_wire::Snippet {
                language: Language::Javascript,
                code: "console.log(process.version)".into(),
            }),
        ),
        (
            "shell step",
            plimsoll_wire::RunSpec::Project(plimsoll_wire::Project {
                files: Vec::new(),
                steps: vec![plimsoll_wire::Step {
                    name: None,
                    run: "uname -sm".into(),
                }],
                artifacts: Vec::new(),
            }),
        ),
    ];
    cases
        .into_iter()
        .map(|(what, run)| {
            let mut options = RunOptions::new(run).image(image.identity.clone());
            options.provider = provider.map(str::to_owned);
            let request = options.into_request(plimsoll_client::new_request_id());
            engine.probe_for(request.minimum_isolation, provider, &request.run);
            let outcome = match engine.run("local", &request) {
                Ok(r) if r.result.exit_code == Some(0) => Ok(format!(
                    "{} at {}",
                    r.result.stdout.to_string_lossy().trim(),
                    r.provider
                )),
                Ok(r) => Err(format!(
                    "exit {:?}: {}",
                    r.result.exit_code,
                    r.result.stderr.to_string_lossy().trim()
                )),
                Err(e) => Err(e.to_string()),
            };
            (what, outcome)
        })
        .collect()
}

/// The store's images as a daemon lists them (without a daemon's VM provider to ask: a
/// disk of its own, or the VM assets' when they were made from it).
fn local_infos(store: &ImageStore) -> Result<Vec<ImageInfo>, Failure> {
    let listing = store.list().map_err(Failure::failed)?;
    for (name, why) in &listing.broken {
        eprintln!("plimsoll: image {name} cannot be used: {why}");
    }
    let assets = assets_image();
    Ok(listing
        .images
        .into_iter()
        .map(|i| {
            let vm_disk = i.disk.is_some() || assets.as_deref() == Some(i.identity.as_str());
            i.info(store, vm_disk)
        })
        .collect())
}

/// The identity of the image the VM assets' own disk was made from.
fn assets_image() -> Option<String> {
    let dir = plimsoll_engine::settings::default_vm_assets_dir();
    std::fs::read_to_string(dir.join("image-identity"))
        .ok()
        .map(|s| s.trim().to_owned())
}

/// What `plimsoll image show` says of an image.
fn facts(store: &ImageStore, i: &StoredImage) -> serde_json::Value {
    let read = |f: &str| std::fs::read_to_string(i.at.dir.join(f)).ok();
    json!({
        "name": i.name(),
        "identity": i.identity,
        "default": i.name() == store.default_name(),
        "dir": i.at.dir,
        "languages": i.languages,
        "vm_disk": i.disk.as_ref().map(|d| d.display().to_string())
            .or_else(|| (assets_image().as_deref() == Some(i.identity.as_str())).then(|| "the VM assets' own".to_owned())),
        "simulators": match &i.simulators {
            Ok(sims) => serde_json::to_value(sims).unwrap_or_default(),
            Err(why) => json!({"unusable": why}),
        },
        "build_info": read("build-info"),
        "source": read("source"),
    })
}

fn render_list(images: &[ImageInfo]) -> String {
    if images.is_empty() {
        return "no images: build one (`make images`) or import one (`plimsoll image import`)\n"
            .to_owned();
    }
    images
        .iter()
        .map(|i| {
            let languages: Vec<&str> = i.languages.iter().map(|l| l.as_str()).collect();
            format!(
                "{}{}  {}  starts: {}  qemu: {}\n",
                i.name,
                if i.default { " (default)" } else { "" },
                i.identity,
                if languages.is_empty() {
                    "nothing".to_owned()
                } else {
                    languages.join(", ")
                },
                if i.vm_disk { "yes" } else { "no (no VM disk)" }
            )
        })
        .collect()
}

fn render_facts(v: &serde_json::Value) -> String {
    let mut s = String::new();
    if let Some(map) = v.as_object() {
        for (k, value) in map {
            match value {
                serde_json::Value::Null => {}
                serde_json::Value::String(text) => {
                    s.push_str(&format!("{k}: {}\n", text.trim_end().replace('\n', "\n  ")));
                }
                serde_json::Value::Array(items) if k == "simulators" => {
                    s.push_str("simulators:");
                    if items.is_empty() {
                        s.push_str(" none");
                    }
                    s.push('\n');
                    for sim in items {
                        s.push_str(&format!(
                            "  {}  {}  sha256:{}\n",
                            sim["name"].as_str().unwrap_or("?"),
                            sim["path"].as_str().unwrap_or("?"),
                            sim["sha256"].as_str().unwrap_or("?")
                        ));
                    }
                }
                other => s.push_str(&format!("{k}: {other}\n")),
            }
        }
    }
    s
}

/// Removes an image: renamed out of the store's names first (a request naming it is then
/// refused), then deleted without crossing into another file system. A run or session that
/// already mounted its root or opened its disk keeps them until it ends.
fn remove(store: &ImageStore, i: &StoredImage) -> anyhow::Result<()> {
    let aside: PathBuf = store
        .dir()
        .join(format!(".{}.removing.{}", i.name(), std::process::id()));
    std::fs::rename(&i.at.dir, &aside)
        .with_context(|| format!("cannot move {} aside", i.at.dir.display()))?;
    std::fs::remove_dir_all(&aside).with_context(|| format!("cannot delete {}", aside.display()))
}

/// Makes the image's VM disk with the repository's `scripts/make-image-disk`.
fn make_disk(i: &StoredImage) -> anyhow::Result<()> {
    let script = repo_script("make-image-disk")
        .ok_or_else(|| anyhow!("scripts/make-image-disk not found beside this build"))?;
    plimsoll_image::make_vm_disk(i, &script)?;
    Ok(())
}

/// A script of the repository this binary was built in (`scripts/NAME`), or the package's
/// copy in /usr/lib/plimsoll.
fn repo_script(name: &str) -> Option<PathBuf> {
    let from_repo = plimsoll_engine::settings::default_image_dir()
        .ancestors()
        .nth(3)
        .map(|repo| repo.join("scripts").join(name));
    from_repo
        .into_iter()
        .chain([PathBuf::from("/usr/lib/plimsoll").join(name)])
        .find(|p| p.is_file())
}

/// Runs a script to its end, its output passed on to stderr line by line as it comes.
fn run_showing_progress(script: &Path, args: &[String]) -> anyhow::Result<()> {
    use std::io::BufRead as _;
    let path = plimsoll_env::get(plimsoll_env::PATH).unwrap_or_else(|| {
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned()
    });
    let mut spawn = plimsoll_sandbox::Spawn::new(script, "/").env("PATH", path);
    if let Some(home) = plimsoll_env::get(plimsoll_env::HOME) {
        spawn = spawn.env("HOME", home);
    }
    let running = spawn
        .args(args)
        .spawn()
        .with_context(|| format!("cannot run {}", script.display()))?;
    let plimsoll_sandbox::Running {
        mut child,
        stdout,
        stderr,
        ..
    } = running;
    let out = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            eprintln!("{line}");
        }
    });
    for line in std::io::BufReader::new(stderr)
        .lines()
        .map_while(Result::ok)
    {
        eprintln!("{line}");
    }
    let _ = out.join();
    let status = child.wait()?;
    if !status.success() {
        return Err(anyhow!(
            "{} {} failed ({status})",
            script.display(),
            args.join(" ")
        ));
    }
    Ok(())
}

fn print_json(v: &serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer_pretty(&mut out, v);
    let _ = writeln!(out);
    let _ = out.flush();
}

fn print_text(s: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(s.as_bytes());
    let _ = out.flush();
}
