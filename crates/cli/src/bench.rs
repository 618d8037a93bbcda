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
    /// A run on the embedded engine, on one provider: the cold engine's, or the warm one's
    /// (pools kept; each sample waits, untimed, until its pool has a member).
    Engine {
        provider: String,
        tier: Tier,
        language: Language,
        warm: bool,
    },
    /// A run through plimsolld, on one provider: the daemon without pools, or the one with;
    /// `split`: the split daemon's (`--serving-user`).
    Daemon {
        provider: String,
        tier: Tier,
        language: Language,
        warm: bool,
        split: bool,
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
                provider,
                language,
                warm,
                ..
            } => format!("engine {} {provider} {}", start(*warm), language.as_str()),
            Case::Daemon {
                provider,
                language,
                warm,
                split,
                ..
            } => format!(
                "{} {} {provider} {}",
                if *split { "split " } else { "daemon" },
                start(*warm),
                language.as_str()
            ),
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

fn start(warm: bool) -> &'static str {
    if warm { "warm" } else { "cold" }
}

/// What one case gathered.
#[derive(Default)]
struct Samples {
    ms: Vec<f64>,
    /// Of the measured runs, how many said `start: warm`.
    warm: u32,
    failures: u32,
    first_failure: Option<String>,
}

/// Pools for both languages at every provider in `names`, as a `[pools]` table.
fn pools_table(names: &[String]) -> toml::Value {
    let mut pools = toml::Table::new();
    for name in names {
        let mut langs = toml::Table::new();
        for language in LANGUAGES {
            let mut p = toml::Table::new();
            p.insert("min_idle".into(), toml::Value::Integer(1));
            p.insert("max_members".into(), toml::Value::Integer(2));
            langs.insert(language.as_str().into(), toml::Value::Table(p));
        }
        pools.insert(name.clone(), toml::Value::Table(langs));
    }
    toml::Value::Table(pools)
}

/// Runs `plimsoll bench`.
pub fn bench(config: Option<&Path>, a: &BenchArgs) -> Result<u8, Failure> {
    let settings = load_settings(config)?;
    if let Some(images) = &a.images {
        return crate::bench_images::bench_images(&settings, images, a.runs, a.warmup);
    }
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

    // The providers that keep warm pools, and an embedded engine keeping them.
    let warming: Vec<String> = available
        .iter()
        .filter(|(name, _)| engine.warms(name))
        .map(|(name, _)| name.clone())
        .collect();
    let engine_uids = engine_settings.engine_config();
    let providers = engine_settings
        .providers
        .as_ref()
        .map_or(plimsoll_engine::settings::PROVIDER_NAMES.len(), Vec::len);
    // Past the embedded engine's whole range (run uids, the first probe uid, controller uids,
    // a probe uid per further provider, and its pools' uids, which it never uses): each
    // daemon and the warm engine a range of their own.
    let uid_base = plimsoll_engine::uid_range_end(
        engine_uids.sandbox_uid_base,
        engine_uids.max_concurrent,
        providers,
    )
    .and_then(|b| b.checked_add(10_000))
    .filter(|b| b.checked_add(3 * 10_000).is_some())
    .ok_or_else(|| Failure::usage(anyhow!("the embedded engine's uid range is out of range")))?;
    let warm_engine = if warming.is_empty() {
        None
    } else {
        let mut w = engine_settings.clone();
        w.state_dir = Some(dir.path().join("warm-engine-state"));
        w.sandbox_uid_base = Some(uid_base + 20_000);
        let pool = || {
            Some(plimsoll_engine::settings::PoolValues {
                min_idle: Some(1),
                max_members: Some(2),
                max_age_secs: None,
                images: None,
                shrink_after_secs: None,
            })
        };
        w.pools = Some(
            warming
                .iter()
                .map(|name| {
                    let langs = plimsoll_engine::settings::PoolsOfProvider {
                        javascript: pool(),
                        python: pool(),
                    };
                    (name.clone(), langs)
                })
                .collect(),
        );
        let e = embedded_engine(&w)?;
        e.start_pools();
        Some(e)
    };

    // The daemons' settings: the file in force, read once.
    let config_text = match settings_path(config) {
        Some(p) if !available.is_empty() => std::fs::read_to_string(&p)
            .with_context(|| format!("cannot read {}", p.display()))
            .map_err(Failure::usage)?,
        _ => String::new(),
    };
    // Two plimsolld, without pools and with; `serving_user`: split ones.
    let pair = |name: &str, base: u32, serving_user: Option<&str>| {
        let cold = BenchDaemon::start(
            &format!("{name}cold"),
            &config_text,
            &available,
            toml::Value::Table(toml::Table::new()),
            base,
            dir.path(),
            serving_user,
        )?;
        let warm = BenchDaemon::start(
            &format!("{name}warm"),
            &config_text,
            &available,
            pools_table(&warming),
            base + 10_000,
            dir.path(),
            serving_user,
        )?;
        anyhow::Ok((cold, warm))
    };
    let daemons = if available.is_empty() {
        None
    } else {
        eprintln!("plimsoll bench: starting two plimsolld, without pools and with");
        Some(pair("", uid_base, None).map_err(Failure::failed)?)
    };
    // The split daemon's pair, beside the others, with uids of their own.
    let split = match (&daemons, &a.serving_user) {
        (Some(_), Some(user)) => {
            eprintln!("plimsoll bench: starting two split plimsolld serving as {user}");
            Some(pair("split-", uid_base + 30_000, Some(user)).map_err(Failure::failed)?)
        }
        _ => None,
    };

    if a.sessions_only {
        let report = match &daemons {
            Some((cold, _)) => {
                let keeping: Vec<(String, Tier)> = available
                    .iter()
                    .filter(|(name, _)| engine.opens_sessions(name))
                    .cloned()
                    .collect();
                session_round_trips(&cold.client, &keeping, (a.runs * 3).max(20))
            }
            None => "no provider is available: no session to measure\n".to_owned(),
        };
        drop(daemons);
        drop(warm_engine);
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(report.as_bytes());
        let _ = out.flush();
        return Ok(EXIT_OK);
    }
    let mut cases = Vec::new();
    for (provider, tier) in &available {
        for language in LANGUAGES {
            let warms = [false]
                .into_iter()
                .chain(warming.contains(provider).then_some(true));
            for warm in warms {
                cases.push(Case::Engine {
                    provider: provider.clone(),
                    tier: *tier,
                    language,
                    warm,
                });
                cases.push(Case::Daemon {
                    provider: provider.clone(),
                    tier: *tier,
                    language,
                    warm,
                    split: false,
                });
                if split.is_some() {
                    cases.push(Case::Daemon {
                        provider: provider.clone(),
                        tier: *tier,
                        language,
                        warm,
                        split: true,
                    });
                }
            }
        }
    }
    let (node, python) = node_and_python(&settings);
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
            // Each sample starts on a quiet machine: nothing of an earlier sample still
            // being removed, every warm pool full again.
            let engines: Vec<(&Engine, bool)> = std::iter::once((&engine, false))
                .chain(warm_engine.iter().map(|w| (w, true)))
                .collect();
            let clients: Vec<&Client> = daemons
                .iter()
                .chain(split.iter())
                .flat_map(|(c, w)| [&c.client, &w.client])
                .collect();
            quiesce(&engines, &clients);
            let (engine, client) = match case {
                Case::Engine { warm: true, .. } => match &warm_engine {
                    Some(w) => (w, None),
                    None => (&engine, None),
                },
                Case::Daemon { warm, split: s, .. } => (
                    &engine,
                    if *s { split.as_ref() } else { daemons.as_ref() }
                        .map(|(c, w)| if *warm { &w.client } else { &c.client }),
                ),
                _ => (&engine, None),
            };
            let started = Instant::now();
            let outcome = measure(case, engine, client);
            let elapsed = started.elapsed();
            if round < a.warmup {
                continue;
            }
            let s = &mut samples[index];
            match outcome {
                Ok(warm) => {
                    s.ms.push(elapsed.as_secs_f64() * 1000.0);
                    s.warm += u32::from(warm);
                }
                Err(e) => {
                    s.failures += 1;
                    s.first_failure.get_or_insert_with(|| format!("{e:#}"));
                }
            }
        }
    }
    let mut report = table(&cases, &mut samples);
    if let Some(w) = &warm_engine {
        report.push_str(&members_memory(w, &warming, &node_and_python(&settings)));
    }
    if let Some((cold, _)) = &daemons {
        let keeping: Vec<(String, Tier)> = available
            .iter()
            .filter(|(name, _)| engine.opens_sessions(name))
            .cloned()
            .collect();
        report.push_str(&session_round_trips(
            &cold.client,
            &keeping,
            (a.runs * 3).max(20),
        ));
    }
    if let Some((_, warm)) = &daemons {
        report.push_str(&throughput(
            &warm.client,
            &available,
            &warming,
            &node_and_python(&settings),
            Duration::from_secs(u64::from(a.seconds)),
        ));
    }
    drop(daemons);
    drop(split);
    drop(warm_engine);

    let mut out = std::io::stdout().lock();
    let _ = out.write_all(report.as_bytes());
    let _ = out.flush();
    Ok(EXIT_OK)
}

/// One run of a case: whether it started warm; an error when it did not run or did not
/// print `1`.
fn measure(case: &Case, engine: &Engine, client: Option<&Client>) -> anyhow::Result<bool> {
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
            bare_run(program, language)?;
            return Ok(false);
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
    Ok(r.start == Some(plimsoll_wire::Start::Warm))
}

/// The interpreter itself, environment cleared, printing `1`.
fn bare_run(program: &Path, language: Language) -> anyhow::Result<()> {
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
    Ok(())
}

/// The interpreters the process tier runs, the bare cases' programs.
fn node_and_python(settings: &Settings) -> (PathBuf, PathBuf) {
    let node = settings.process.node.clone();
    let python = settings.process.python.clone();
    (
        node.unwrap_or_else(|| "/usr/bin/node".into()),
        python.unwrap_or_else(|| "/usr/bin/python3".into()),
    )
}

/// Waits (untimed, at most 10 s) until nothing of an earlier sample goes on: no engine or
/// daemon is still removing a sandbox after its answer, and every warm pool is full (its
/// refill ended). So a sample measures its own run, with a member waiting if its case is
/// warm, not the refill or teardown of the sample before it; the sustained figures are
/// where that work competes.
/// `engines`: each with whether it keeps its pools.
fn quiesce(engines: &[(&Engine, bool)], daemons: &[&Client]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let engines_quiet = || {
        engines
            .iter()
            .all(|(e, kept)| e.teardowns_running() == 0 && (!kept || pools_full(e)))
    };
    let daemons_quiet = || daemons.iter().all(|c| daemon_quiet(c).unwrap_or(false));
    while Instant::now() < deadline {
        if engines_quiet() && daemons_quiet() {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Every pool of `engine` holds a member and as many as it keeps now, and none is being
/// made: a refill still making a member would take the cores the next sample needs.
fn pools_full(engine: &Engine) -> bool {
    !engine.pool_making()
        && engine
            .pools_idle()
            .iter()
            .zip(engine.pools_wanted())
            .all(|((_, _, idle), (_, _, wanted))| *idle >= wanted.max(1))
}

/// From the daemon's `/metrics`: no teardown running, no member being made, and every warm
/// pool holds a member and as many as it keeps now.
fn daemon_quiet(client: &Client) -> anyhow::Result<bool> {
    let text = ureq::get(format!("{}/metrics", client.base_url()))
        .call()?
        .body_mut()
        .read_to_string()?;
    Ok(metrics_quiet(&text))
}

/// [`daemon_quiet`]'s reading of a `/metrics` text.
fn metrics_quiet(text: &str) -> bool {
    let mut quiet = true;
    let mut idle = std::collections::BTreeMap::new();
    let mut wanted = std::collections::BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let value: f64 = value.parse().unwrap_or(0.0);
        if series == "plimsoll_teardowns_running" || series == "plimsoll_pool_making" {
            quiet &= value == 0.0;
        } else if let Some(labels) = series.strip_prefix("plimsoll_pool_idle") {
            idle.insert(labels.to_owned(), value);
        } else if let Some(labels) = series.strip_prefix("plimsoll_pool_wanted") {
            wanted.insert(labels.to_owned(), value);
        }
    }
    quiet
        && idle
            .iter()
            .all(|(labels, n)| *n >= wanted.get(labels).copied().unwrap_or(0.0).max(1.0))
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| {
        l.strip_prefix("VmRSS:")?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    })
}

/// The memory of the idle members, per provider and language, with the pools full: the
/// resident memory of every host process in a member's memory cgroup (a member's id names
/// its cgroups; at runsc that is gVisor's sandbox process, whose Sentry holds the
/// interpreter), and what those cgroups are charged; beside each interpreter waiting on a
/// pipe unsandboxed.
fn members_memory(
    engine: &Engine,
    warming: &[String],
    (node, python): &(PathBuf, PathBuf),
) -> String {
    let full = || {
        engine
            .pools_idle()
            .iter()
            .filter(|(p, _, _)| warming.contains(p))
            .all(|(_, _, n)| *n >= 1)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !full() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut out = String::from("\nidle members (warm engine, pools full):\n");
    for (language, program) in [(Language::Javascript, node), (Language::Python, python)] {
        let bare = bare_waiting_rss_kib(program, language);
        out.push_str(&format!(
            "  {}: bare interpreter waiting on a pipe {} KiB RSS; reading and judging its wall {} us (median of 101)\n",
            language.as_str(),
            bare.map_or_else(|| "-".to_owned(), |(k, _)| k.to_string()),
            bare.and_then(|(_, w)| w)
                .map_or_else(|| "-".to_owned(), |w| format!("{w:.0}")),
        ));
    }
    let Some(hierarchy) = plimsoll_sandbox::cgroup::CgroupLayout::detect()
        .ok()
        .and_then(|l| l.memory_hierarchy().cloned())
    else {
        out.push_str("  no memory controller mounted: members cannot be told apart\n");
        return out;
    };
    let processes = memory_cgroups_of_processes(&hierarchy);
    // (provider, language) -> (members, RSS KiB, cgroup charge KiB, found by uid)
    let mut seen: std::collections::BTreeMap<(String, &str), (u64, u64, u64, bool)> =
        std::collections::BTreeMap::new();
    for (provider, language, id, uid) in engine.pool_idle_members() {
        let mine: Vec<&(i32, PathBuf)> = processes
            .iter()
            .filter(|(_, dir)| dir.to_string_lossy().contains(&id))
            .collect();
        // A member without a memory cgroup of its own (qemu: the QEMU process, bounded by
        // its guest's memory) is its processes on the host, found by the member's uid.
        let (rss, charged, by_uid) = if mine.is_empty() {
            let rss: u64 = plimsoll_sandbox::reap::processes_of_uids(uid..uid + 1)
                .into_iter()
                .filter_map(|pid| rss_kib(pid as u32))
                .sum();
            (rss, 0, true)
        } else {
            let rss: u64 = mine
                .iter()
                .filter_map(|(pid, _)| rss_kib(*pid as u32))
                .sum();
            let dirs: std::collections::BTreeSet<&PathBuf> = mine.iter().map(|(_, d)| d).collect();
            let charged: u64 = dirs
                .iter()
                .filter_map(|d| cgroup_usage_kib(&hierarchy, d))
                .sum();
            (rss, charged, false)
        };
        let e = seen.entry((provider, language.as_str())).or_default();
        *e = (e.0 + 1, e.1 + rss, e.2 + charged, e.3 || by_uid);
    }
    for ((provider, language), (n, rss, charged, by_uid)) in seen {
        if by_uid {
            out.push_str(&format!(
                "  {provider} {language}: {n} idle, {} KiB RSS a member (its host processes, by its uid: no memory cgroup of its own)\n",
                rss / n.max(1),
            ));
        } else {
            out.push_str(&format!(
                "  {provider} {language}: {n} idle, {} KiB RSS and {} KiB cgroup charge (resident memory, page cache and tmpfs) a member\n",
                rss / n.max(1),
                charged / n.max(1),
            ));
        }
    }
    out
}

/// Every process's memory cgroup directory (its own, not the root's).
fn memory_cgroups_of_processes(h: &plimsoll_sandbox::cgroup::Hierarchy) -> Vec<(i32, PathBuf)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
            // `id:controllers:path`; v2's line has no controllers.
            let path = text.lines().find_map(|l| {
                let mut f = l.splitn(3, ':');
                let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
                let ours = if h.v2 {
                    controllers.is_empty()
                } else {
                    controllers.split(',').any(|c| c == "memory")
                };
                ours.then(|| path.trim_start_matches('/').to_owned())
            })?;
            // A process in the root cgroup would count the whole host.
            (!path.is_empty()).then(|| (pid, h.mount.join(path)))
        })
        .collect()
}

/// What memory cgroup `dir` is charged, KiB (`memory.usage_in_bytes` under cgroup v1,
/// `memory.current` under v2).
fn cgroup_usage_kib(h: &plimsoll_sandbox::cgroup::Hierarchy, dir: &Path) -> Option<u64> {
    let file = if h.v2 {
        "memory.current"
    } else {
        "memory.usage_in_bytes"
    };
    let bytes: u64 = std::fs::read_to_string(dir.join(file))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(bytes / 1024)
}

/// The resident set of `program` started as a member's interpreter is, outside any sandbox,
/// once it waits on its input; and how long reading and judging its wall takes.
fn bare_waiting_rss_kib(program: &Path, language: Language) -> Option<(u64, Option<f64>)> {
    use plimsoll_sandbox::warm::{wait_command, wait_until_reading};
    let dir = tempfile::tempdir().ok()?;
    let code = dir.path().join(plimsoll_sandbox::snippet_file(language));
    let wait = wait_command(language, &code, false, false);
    for (name, text) in &wait.files {
        std::fs::write(dir.path().join(name), text).ok()?;
    }
    let mut running = Spawn::new(program, "/")
        .args(&wait.args)
        .stdin_pipe()
        .spawn()
        .ok()?;
    let pid = running.child.id();
    let rss = wait_until_reading(pid, Duration::from_secs(10))
        .ok()
        .and_then(|()| rss_kib(pid));
    let wall = rss.and_then(|_| wall_read_us(pid));
    drop(running.stdin.take());
    let _ = running.child.wait();
    rss.map(|r| (r, wall))
}

/// The median time, in microseconds, of reading a waiting process's wall and judging it as a
/// claim does (a container's checks: identity, capabilities, no_new_privs, seccomp, six
/// namespaces, network, limits, root), over 101 reads.
fn wall_read_us(pid: u32) -> Option<f64> {
    use plimsoll_sandbox::judge::{
        Capabilities, Expectations, Filesystem, HostView, Identity, Limits, Namespaces, NoNewPrivs,
        Seccomp,
    };
    let strings = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect::<Vec<String>>();
    let expected = Expectations {
        identity: Identity::Uid(0),
        capabilities: Capabilities {
            empty: strings(&["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"]),
            may_be_absent: vec![],
            held: Vec::new(),
        },
        no_new_privs: NoNewPrivs::Set,
        seccomp: Some(Seccomp::Filter),
        namespaces: Namespaces::Separate {
            names: strings(&["cgroup", "ipc", "mnt", "net", "pid", "uts"]),
            unreported_ok: false,
        },
        filesystem: Some(Filesystem {
            rw_mounts: strings(&["/work", "/tmp"]),
            writable: vec![],
            must_be_writable: vec![],
        }),
        work_dir: None,
        host_files: true,
        shadow_unreadable: false,
        loopback_only: true,
        environment: vec![],
        sockets_denied: false,
        limits: Some(Limits::Cgroup {
            memory_keys: strings(&["cgroup_v1.memory.limit_in_bytes"]),
            memory: 256 << 20,
            pids_keys: strings(&["cgroup_v1.pids.max"]),
            pids: 64,
        }),
        kernel: None,
    };
    // What a claim does: the host's namespaces and cgroup layout are read once, by the
    // provider, not per claim.
    let host = HostView::read();
    let layout = plimsoll_sandbox::cgroup::CgroupLayout::detect().ok()?;
    let mut times = Vec::new();
    for _ in 0..101 {
        let t = Instant::now();
        let wall = plimsoll_sandbox::wall::read(pid, &expected, &host, &layout).ok()?;
        let _ = plimsoll_sandbox::wall::judge(&wall, &expected, &host);
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    Some(times[times.len() / 2])
}

/// Sustained trivial runs per second through the daemon with pools, two clients at once, for
/// `length` per provider and language; beside bare interpreter starts per second on the
/// same cores, two at once.
fn throughput(
    client: &Client,
    available: &[(String, Tier)],
    warming: &[String],
    (node, python): &(PathBuf, PathBuf),
    length: Duration,
) -> String {
    let mut out = format!("\nsustained, 2 at once for {} s:\n", length.as_secs_f64());
    let rate = |f: &(dyn Fn() -> bool + Sync)| -> (f64, u32) {
        let stop = Instant::now() + length;
        let (ok, bad) = std::thread::scope(|s| {
            let workers: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        let (mut ok, mut bad) = (0u32, 0u32);
                        while Instant::now() < stop {
                            if f() { ok += 1 } else { bad += 1 }
                        }
                        (ok, bad)
                    })
                })
                .collect();
            workers
                .into_iter()
                .filter_map(|w| w.join().ok())
                .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
        });
        (f64::from(ok) / length.as_secs_f64(), bad)
    };
    for language in LANGUAGES {
        let program = match language {
            Language::Javascript => node,
            Language::Python => python,
        };
        let (bare, _) = rate(&|| bare_run(program, language).is_ok());
        out.push_str(&format!(
            "  bare {}: {bare:.1} starts/s\n",
            language.as_str()
        ));
        for (provider, tier) in available.iter().filter(|(p, _)| warming.contains(p)) {
            let (runs, failed) = rate(&|| {
                let options = RunOptions::snippet(language, snippet(language))
                    .min_isolation(*tier)
                    .provider(provider.clone());
                client
                    .run(options)
                    .is_ok_and(|r| r.result.stdout.as_slice() == b"1\n")
            });
            let ratio = if bare > 0.0 { runs / bare } else { 0.0 };
            out.push_str(&format!(
                "  daemon warm {provider} {}: {runs:.1} runs/s ({ratio:.2}x bare){}\n",
                language.as_str(),
                if failed > 0 {
                    format!(", {failed} failed")
                } else {
                    String::new()
                }
            ));
        }
    }
    out
}

/// Sessions through the daemon: per provider that keeps them and language, how long an
/// open takes, and a trivial cell's round trip on the open session (the client's whole
/// call: HTTP, the wall re-read and compared, the cell, digests and chain verified).
fn session_round_trips(client: &Client, providers: &[(String, Tier)], cells: u32) -> String {
    let mut out = format!(
        "
sessions through the daemon ({cells} cells each, after 3 unmeasured):
"
    );
    for (provider, tier) in providers {
        for language in LANGUAGES {
            let options = plimsoll_client::SessionOptions::new(language)
                .min_isolation(*tier)
                .provider(provider.clone());
            let opened = Instant::now();
            let mut session = match client.open_session(options) {
                Ok(s) => s,
                Err(e) => {
                    out.push_str(&format!(
                        "  {provider} {}: cannot open a session: {e}\n",
                        language.as_str()
                    ));
                    continue;
                }
            };
            let open_ms = opened.elapsed().as_secs_f64() * 1000.0;
            let code = match language {
                Language::Javascript => "globalThis.n = (globalThis.n || 0) + 1",
                Language::Python => "n = globals().get('n', 0) + 1",
            };
            let mut ms = Vec::new();
            let mut failed = 0u32;
            for i in 0..cells + 3 {
                let started = Instant::now();
                let ok = session.cell(code).is_ok_and(|r| {
                    r.result.exit_code == Some(0) && r.result.state_kept == Some(true)
                });
                if i >= 3 {
                    if ok {
                        ms.push(started.elapsed().as_secs_f64() * 1000.0);
                    } else {
                        failed += 1;
                    }
                }
            }
            ms.sort_by(f64::total_cmp);
            let closed = session.close().is_ok();
            match median_p90(&ms) {
                Some((p50, p90)) => out.push_str(&format!(
                    "  {provider} {}: open {open_ms:.1} ms, cell round trip p50 {p50:.2} ms, p90 {p90:.2} ms{}{}\n",
                    language.as_str(),
                    if failed > 0 { format!(", {failed} failed") } else { String::new() },
                    if closed { "" } else { ", close failed" }
                )),
                None => out.push_str(&format!(
                    "  {provider} {}: every cell failed\n",
                    language.as_str()
                )),
            }
        }
    }
    out
}

/// The median and the 90th percentile (nearest rank) of sorted samples.
pub(crate) fn median_p90(sorted: &[f64]) -> Option<(f64, f64)> {
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
        "{:<width$}  {:>10}  {:>10}  {:>4}  {:>8}  {:>6}\n",
        "case", "median ms", "p90 ms", "n", "x bare", "warm"
    );
    for (case, s) in cases.iter().zip(samples.iter()) {
        let label = case.label();
        match median_p90(&s.ms) {
            Some((median, p90)) => {
                let ratio = bare_median(case.language())
                    .filter(|b| *b > 0.0)
                    .map_or_else(|| "-".to_owned(), |b| format!("{:.2}", median / b));
                out.push_str(&format!(
                    "{label:<width$}  {median:>10.1}  {p90:>10.1}  {:>4}  {ratio:>8}  {:>6}\n",
                    s.ms.len(),
                    s.warm
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
        name: &str,
        config_text: &str,
        providers: &[(String, Tier)],
        pools: toml::Value,
        uid_base: u32,
        dir: &Path,
        serving_user: Option<&str>,
    ) -> anyhow::Result<BenchDaemon> {
        let exe = std::env::current_exe().context("cannot find this executable")?;
        let plimsolld = exe.with_file_name("plimsolld");
        if !plimsolld.exists() {
            bail!(
                "plimsolld is not beside plimsoll ({}): build it (cargo build -p plimsoll-daemon, or make build)",
                plimsolld.display()
            );
        }
        let state = dir.join(format!("daemon-{name}-state"));
        std::fs::create_dir(&state).context("cannot create the daemon's state directory")?;
        set_mode(&state, 0o711)?;
        let callers = dir.join(format!("callers-{name}.toml"));
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
        doc.insert("pools".into(), pools);
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
        if let Some(user) = serving_user {
            daemon.insert("serving_user".into(), toml::Value::String(user.to_owned()));
            // The serving process reads the callers file as that user; the bench's own
            // directory must let it through.
            set_mode(&callers, 0o644)?;
            set_mode(dir, 0o711)?;
        }
        let settings_file = dir.join(format!("plimsolld-{name}.toml"));
        let text = toml::to_string(&doc).context("cannot write the daemon's settings")?;
        Settings::parse(&text).map_err(|e| anyhow!("the daemon's settings are invalid: {e}"))?;
        std::fs::write(&settings_file, text).context("cannot write the daemon's settings")?;

        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("cannot find a free loopback port")?
            .port();
        let listen = format!("127.0.0.1:{port}");
        let log_path = dir.join(format!("plimsolld-{name}.log"));
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

    /// A sample waits for the refill of the sample before it: a pool holding one member
    /// where it keeps two, or a member being made, is not quiet.
    #[test]
    fn a_daemon_is_quiet_only_with_its_pools_full_and_nothing_being_made() {
        let text = |teardowns: u32, idle: u32, wanted: u32, making: u32| {
            format!(
                "# TYPE plimsoll_teardowns_running gauge\nplimsoll_teardowns_running {teardowns}\n\
                 plimsoll_pool_idle{{provider=\"crun\",language=\"python\"}} {idle}\n\
                 plimsoll_pool_idle{{provider=\"crun\",language=\"javascript\"}} 1\n\
                 plimsoll_pool_wanted{{provider=\"crun\",language=\"python\"}} {wanted}\n\
                 plimsoll_pool_wanted{{provider=\"crun\",language=\"javascript\"}} 1\n\
                 plimsoll_pool_making {making}\n"
            )
        };
        assert!(metrics_quiet(&text(0, 2, 2, 0)));
        assert!(metrics_quiet(&text(0, 1, 1, 0)));
        assert!(!metrics_quiet(&text(0, 1, 2, 0)), "a refill is due");
        assert!(!metrics_quiet(&text(0, 2, 2, 1)), "a member is being made");
        assert!(!metrics_quiet(&text(1, 2, 2, 0)), "a teardown runs");
        assert!(!metrics_quiet(&text(0, 0, 0, 0)), "an empty pool");
        // A daemon without pools is quiet once its teardowns end.
        assert!(metrics_quiet("plimsoll_teardowns_running 0\n"));
    }

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
