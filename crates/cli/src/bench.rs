//! `plimsoll bench`: start-up cost of a trivial snippet per available provider, through the
//! embedded engine and through a plimsolld started for the purpose, beside bare `node` and
//! `python3` run with a cleared environment (as a sandbox gets), all in one run and
//! interleaved round-robin so drift hits every case alike. A benchmark, not a test: it
//! asserts nothing about speed.

use std::io::{Read, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use plimsoll_client::{Client, RunOptions, new_request_id};
use plimsoll_engine::Engine;
use plimsoll_engine::settings::Settings;
use plimsoll_sandbox::spawn::{Running, Spawn};
use plimsoll_wire::{Language, RunResponse, Tier};

use crate::args::BenchArgs;
use crate::local::{embedded_engine, load_settings, settings_path};
use crate::{EXIT_OK, Failure};

/// How long plimsolld may take to probe its providers and report ready.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// The trivial snippet of a language, and the output it must print.
fn snippet(language: Language) -> &'static str {
    match language {
        Language::Javascript => "console.log(1)",
        Language::Python => "print(1)",
    }
}

const LANGUAGES: [Language; 2] = [Language::Javascript, Language::Python];

/// One thing measured.
enum Case {
    /// A run on the embedded engine, on one provider.
    Engine {
        provider: String,
        tier: Tier,
        language: Language,
    },
    /// A run through plimsolld, on one provider.
    Daemon {
        provider: String,
        tier: Tier,
        language: Language,
    },
    /// The interpreter itself, environment cleared.
    Bare {
        language: Language,
        program: PathBuf,
    },
}

impl Case {
    fn label(&self) -> String {
        match self {
            Case::Engine {
                provider, language, ..
            } => format!("engine  {provider} {}", language.as_str()),
            Case::Daemon {
                provider, language, ..
            } => format!("daemon  {provider} {}", language.as_str()),
            Case::Bare { language, program } => {
                format!("bare    {} ({})", language.as_str(), program.display())
            }
        }
    }

    fn language(&self) -> Language {
        match self {
            Case::Engine { language, .. }
            | Case::Daemon { language, .. }
            | Case::Bare { language, .. } => *language,
        }
    }
}

/// What one case gathered.
#[derive(Default)]
struct Samples {
    ms: Vec<f64>,
    failures: u32,
    first_failure: Option<String>,
}

/// Runs `plimsoll bench`.
pub fn bench(config: Option<&Path>, a: &BenchArgs) -> Result<u8, Failure> {
    let settings = load_settings(config)?;
    let dir = tempfile::Builder::new()
        .prefix("plimsoll-bench-")
        .tempdir()
        .context("cannot create a temporary directory")
        .map_err(Failure::failed)?;
    // Sandbox uids must pass through to their run directories.
    set_mode(dir.path(), 0o711).map_err(Failure::failed)?;

    eprintln!("plimsoll bench: probing providers (embedded engine)");
    let mut engine_settings = settings.clone();
    if engine_settings.state_dir.is_none() {
        engine_settings.state_dir = Some(dir.path().join("engine-state"));
    }
    let engine = embedded_engine(&engine_settings)?;
    let available: Vec<(String, Tier)> = engine
        .providers()
        .into_iter()
        .filter(|p| p.available)
        .map(|p| (p.name, p.isolation))
        .collect();
    if available.is_empty() {
        eprintln!(
            "plimsoll bench: no provider is available (see `plimsoll providers`); measuring the bare interpreters only"
        );
    }

    let daemon = if available.is_empty() {
        None
    } else {
        eprintln!("plimsoll bench: starting plimsolld");
        let config_text = match settings_path(config) {
            Some(p) => std::fs::read_to_string(&p)
                .with_context(|| format!("cannot read {}", p.display()))
                .map_err(Failure::usage)?,
            None => String::new(),
        };
        let engine_uids = engine_settings.engine_config();
        // Past the embedded engine's whole range: run uids, the first probe uid, controller
        // uids, then one probe uid per further provider.
        let providers = engine_settings
            .providers
            .as_ref()
            .map_or(plimsoll_engine::settings::PROVIDER_NAMES.len(), Vec::len);
        let uid_base = plimsoll_engine::uid_range_end(
            engine_uids.sandbox_uid_base,
            engine_uids.max_concurrent,
            providers,
        )
        .ok_or_else(|| {
            Failure::usage(anyhow!("the embedded engine's uid range is out of range"))
        })?;
        Some(
            BenchDaemon::start(&config_text, &available, uid_base, dir.path())
                .map_err(Failure::failed)?,
        )
    };

    let mut cases = Vec::new();
    for (provider, tier) in &available {
        for language in LANGUAGES {
            cases.push(Case::Engine {
                provider: provider.clone(),
                tier: *tier,
                language,
            });
            cases.push(Case::Daemon {
                provider: provider.clone(),
                tier: *tier,
                language,
            });
        }
    }
    let node = settings
        .process
        .node
        .clone()
        .unwrap_or_else(|| "/usr/bin/node".into());
    let python = settings
        .process
        .python
        .clone()
        .unwrap_or_else(|| "/usr/bin/python3".into());
    cases.push(Case::Bare {
        language: Language::Javascript,
        program: node,
    });
    cases.push(Case::Bare {
        language: Language::Python,
        program: python,
    });

    let mut samples: Vec<Samples> = cases.iter().map(|_| Samples::default()).collect();
    let rounds = a.warmup + a.runs;
    eprintln!(
        "plimsoll bench: {} cases, {} warm-up and {} measured rounds, interleaved",
        cases.len(),
        a.warmup,
        a.runs
    );
    for round in 0..rounds {
        // Rotate the starting case each round, so no case always follows the same one.
        for i in 0..cases.len() {
            let index = (i + round as usize) % cases.len();
            let case = &cases[index];
            let started = Instant::now();
            let outcome = measure(case, &engine, daemon.as_ref().map(|d| &d.client));
            let elapsed = started.elapsed();
            if round < a.warmup {
                continue;
            }
            let s = &mut samples[index];
            match outcome {
                Ok(()) => s.ms.push(elapsed.as_secs_f64() * 1000.0),
                Err(e) => {
                    s.failures += 1;
                    s.first_failure.get_or_insert_with(|| format!("{e:#}"));
                }
            }
        }
    }
    drop(daemon);

    let mut out = std::io::stdout().lock();
    let _ = out.write_all(table(&cases, &mut samples).as_bytes());
    let _ = out.flush();
    Ok(EXIT_OK)
}

/// One run of a case; an error when it did not run or did not print `1`.
fn measure(case: &Case, engine: &Engine, client: Option<&Client>) -> anyhow::Result<()> {
    let language = case.language();
    let response: RunResponse = match case {
        Case::Engine { provider, tier, .. } => {
            let options = RunOptions::snippet(language, snippet(language))
                .min_isolation(*tier)
                .provider(provider.clone());
            engine
                .run("bench", &options.into_request(new_request_id()))
                .map_err(|e| anyhow!(e))?
        }
        Case::Daemon { provider, tier, .. } => {
            let client = client.ok_or_else(|| anyhow!("no daemon"))?;
            let options = RunOptions::snippet(language, snippet(language))
                .min_isolation(*tier)
                .provider(provider.clone());
            client.run(options).map_err(|e| anyhow!(e))?
        }
        Case::Bare { program, .. } => {
            let flag = match language {
                Language::Javascript => "-e",
                Language::Python => "-c",
            };
            // Spawn clears the environment, as a sandbox's is.
            let running = Spawn::new(program, "/")
                .arg(flag)
                .arg(snippet(language))
                .spawn()
                .with_context(|| format!("cannot start {}", program.display()))?;
            let (status, stdout) = wait_with_output(running)?;
            if !status.success() || stdout != b"1\n" {
                bail!(
                    "{} exited with {} and printed {:?}",
                    program.display(),
                    status,
                    String::from_utf8_lossy(&stdout)
                );
            }
            return Ok(());
        }
    };
    let r = &response.result;
    if r.exit_code != Some(0) || r.stdout.as_slice() != b"1\n" {
        bail!(
            "exit {:?}, stdout {:?}, stderr {:?}",
            r.exit_code,
            r.stdout.to_string_lossy(),
            r.stderr.to_string_lossy()
        );
    }
    Ok(())
}

/// The median and the 90th percentile (nearest rank) of sorted samples.
fn median_p90(sorted: &[f64]) -> Option<(f64, f64)> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len();
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    let rank = (0.9 * n as f64).ceil() as usize;
    Some((median, sorted[rank.clamp(1, n) - 1]))
}

fn table(cases: &[Case], samples: &mut [Samples]) -> String {
    for s in samples.iter_mut() {
        s.ms.sort_by(f64::total_cmp);
    }
    let bare_median = |language: Language| {
        cases
            .iter()
            .zip(samples.iter())
            .find(|(c, _)| matches!(c, Case::Bare { .. }) && c.language() == language)
            .and_then(|(_, s)| median_p90(&s.ms))
            .map(|(m, _)| m)
    };
    let width = cases
        .iter()
        .map(|c| c.label().len())
        .max()
        .unwrap_or(4)
        .max(4);
    let mut out = format!(
        "{:<width$}  {:>10}  {:>10}  {:>4}  {:>8}\n",
        "case", "median ms", "p90 ms", "n", "x bare"
    );
    for (case, s) in cases.iter().zip(samples.iter()) {
        let label = case.label();
        match median_p90(&s.ms) {
            Some((median, p90)) => {
                let ratio = bare_median(case.language())
                    .filter(|b| *b > 0.0)
                    .map_or_else(|| "-".to_owned(), |b| format!("{:.2}", median / b));
                out.push_str(&format!(
                    "{label:<width$}  {median:>10.1}  {p90:>10.1}  {:>4}  {ratio:>8}\n",
                    s.ms.len()
                ));
            }
            None => out.push_str(&format!(
                "{label:<width$}  {:>10}  {:>10}  {:>4}  {:>8}\n",
                "-", "-", 0, "-"
            )),
        }
        if let Some(why) = &s.first_failure {
            out.push_str(&format!("  {} failed run(s), first: {why}\n", s.failures));
        }
    }
    out
}

/// A plimsolld child process, stopped when dropped.
struct BenchDaemon {
    child: Child,
    client: Client,
}

impl BenchDaemon {
    /// Starts `plimsolld` (beside this executable) on a free loopback port with every
    /// available provider, a fresh callers file and state directory under `dir`.
    fn start(
        config_text: &str,
        providers: &[(String, Tier)],
        uid_base: u32,
        dir: &Path,
    ) -> anyhow::Result<BenchDaemon> {
        let exe = std::env::current_exe().context("cannot find this executable")?;
        let plimsolld = exe.with_file_name("plimsolld");
        if !plimsolld.exists() {
            bail!(
                "plimsolld is not beside plimsoll ({}): build it (cargo build -p plimsoll-daemon, or make build)",
                plimsolld.display()
            );
        }
        let state = dir.join("daemon-state");
        std::fs::create_dir(&state).context("cannot create the daemon's state directory")?;
        set_mode(&state, 0o711)?;
        let callers = dir.join("callers.toml");
        let token = plimsoll_callers::add_caller(&callers, "bench")?;

        let mut doc: toml::Table = config_text
            .parse()
            .context("the settings file is not valid TOML")?;
        doc.insert(
            "providers".into(),
            toml::Value::Array(
                providers
                    .iter()
                    .map(|(name, _)| toml::Value::String(name.clone()))
                    .collect(),
            ),
        );
        doc.insert(
            "state_dir".into(),
            toml::Value::String(state.display().to_string()),
        );
        doc.insert(
            "sandbox_uid_base".into(),
            toml::Value::Integer(i64::from(uid_base)),
        );
        let daemon = doc
            .entry("daemon")
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let toml::Value::Table(daemon) = daemon else {
            bail!("[daemon] in the settings file is not a table");
        };
        daemon.insert(
            "callers_file".into(),
            toml::Value::String(callers.display().to_string()),
        );
        let settings_file = dir.join("plimsolld.toml");
        let text = toml::to_string(&doc).context("cannot write the daemon's settings")?;
        Settings::parse(&text).map_err(|e| anyhow!("the daemon's settings are invalid: {e}"))?;
        std::fs::write(&settings_file, text).context("cannot write the daemon's settings")?;

        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("cannot find a free loopback port")?
            .port();
        let listen = format!("127.0.0.1:{port}");
        let log_path = dir.join("plimsolld.log");
        let log =
            std::fs::File::create(&log_path).context("cannot create the daemon's log file")?;
        // Spawn gives it an empty environment: the settings file says everything.
        let Running {
            child,
            stdout,
            stderr,
            ..
        } = Spawn::new(&plimsolld, "/")
            .arg("--config")
            .arg(&settings_file)
            .arg("--listen")
            .arg(&listen)
            .spawn()
            .with_context(|| format!("cannot start {}", plimsolld.display()))?;
        for mut pipe in [Box::new(stdout) as Box<dyn Read + Send>, Box::new(stderr)] {
            let mut log = log
                .try_clone()
                .context("cannot share the daemon's log file")?;
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut pipe, &mut log);
            });
        }
        let mut daemon = BenchDaemon {
            child,
            client: Client::new(format!("http://{listen}"), token),
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if daemon.client.is_ready() {
                return Ok(daemon);
            }
            if let Some(status) = daemon.child.try_wait()? {
                std::thread::sleep(Duration::from_millis(100));
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                bail!("plimsolld exited ({status}) before it was ready:\n{log}");
            }
            if Instant::now() > deadline {
                bail!(
                    "plimsolld was not ready after {} s: see its log {}",
                    READY_TIMEOUT.as_secs(),
                    log_path.display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for BenchDaemon {
    fn drop(&mut self) {
        // SIGTERM first so it can clean up; SIGKILL if it has not stopped in 5 s.
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for a child, returning its status and its standard output (stderr is drained and
/// dropped).
fn wait_with_output(running: Running) -> anyhow::Result<(std::process::ExitStatus, Vec<u8>)> {
    let Running {
        mut child,
        mut stdout,
        mut stderr,
        ..
    } = running;
    let drain = std::thread::spawn(move || {
        let _ = std::io::copy(&mut stderr, &mut std::io::sink());
    });
    let mut out = Vec::new();
    stdout
        .read_to_end(&mut out)
        .context("cannot read the child's output")?;
    let _ = drain.join();
    let status = child.wait().context("cannot wait for the child")?;
    Ok((status, out))
}

fn set_mode(path: &Path, mode: u32) -> anyhow::Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_p90_use_nearest_rank() {
        assert_eq!(median_p90(&[]), None);
        assert_eq!(median_p90(&[5.0]), Some((5.0, 5.0)));
        assert_eq!(median_p90(&[1.0, 3.0]), Some((2.0, 3.0)));
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(median_p90(&v), Some((10.5, 18.0)));
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(median_p90(&v), Some((5.5, 9.0)));
    }
}
