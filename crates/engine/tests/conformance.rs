//! One conformance suite, run against every provider through the engine: the same attacks,
//! limits, cleanup, digests and refusals at process, crun, runc, runsc and qemu. A provider
//! gets the whole suite by adding one line at the bottom (and, where its sandbox differs in
//! what it shows the code, a row in [`Shape::of`]). Each case is a test of its own at each
//! provider (`crun::memory`), on an engine of its own; the provider is probed once, by its
//! first test, and the others adopt that evidence from a cache the way the CLI does. Needs
//! root and each provider's runtime (skipped without, failed under CI=true).
//!
//! Beside it, what belongs to one provider stays with it: its probe and what withdraws it
//! (crates/process/tests/attacks.rs, crates/oci/tests/attacks.rs, crates/vm/tests/vm.rs),
//! how it reaps after a killed daemon, and the daemon-level suite for a daemon killed
//! mid-run (crates/daemon/tests/daemon.rs, every provider).

use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::time::Duration;

use plimsoll_broker::GrantProfiles;
use plimsoll_engine::{Engine, EvidenceCache, Reason, RunError, Settings, not_dispatched_reason};
use plimsoll_testing::api::{Expect, TestApi};
use plimsoll_testing::egress::EgressFixture;
use plimsoll_testing::{
    NAMESPACE_ATTACK, TestDir, is_root, namespace_attack_refused, no_connection_came,
    quiet_listener, skip_or_fail,
};
use plimsoll_wire::digest::{record_sha256, request_sha256, result_sha256};
use plimsoll_wire::{
    Language, Limits, PROTOCOL, Project, ProjectFile, RunRequest, RunResponse, RunSpec, Snippet,
    Step, Tier,
};

const MIB: u64 = 1024 * 1024;
/// The caller every run is made as; the grant profile names it.
const CALLER: &str = "conformance";
/// The credential the grant profile holds. It must never reach the sandbox.
const TOKEN: &str = "tok-conformance-never-in-the-sandbox";

/// Where providers differ in what the code sees, by design (docs/isolation-tiers.md). Every
/// case that depends on one of these reads it from here, so a difference is stated once.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// The code's uid as the code sees it: the run's host uid, or a fixed uid in a guest.
    guest_uid: Option<u32>,
    /// The work directory is `/work` (a sandbox root of its own), not a host directory.
    work_is_slash_work: bool,
    /// Directories the sandbox has of its own and may write besides the work directory,
    /// each a tmpfs inside the disk bound (the process tier has none: `/tmp` is the host's
    /// and denied).
    own_dirs: &'static [&'static str],
    /// The snippet is PID 1 of its PID namespace (crun and runc start it as the container's
    /// process) and the kernel's rule for a namespace's init holds: a signal it sends itself
    /// without a handler is dropped. (gVisor's Sentry delivers it; in a guest the snippet is
    /// no init.)
    self_signal_dropped: bool,
    /// The variables a snippet's process starts with, sorted.
    environment: &'static [&'static str],
    /// No socket of any family can be made (the process tier's seccomp filter); elsewhere
    /// loopback exists inside the sandbox and only the sandbox's own.
    no_sockets: bool,
    /// Projects (steps and artifacts) run; the process tier runs snippets only.
    projects: bool,
    /// The share of the disk bound the work directory gets (the rest goes to the sandbox's
    /// own /tmp and /dev/shm), as (numerator, denominator).
    work_share: (u64, u64),
    /// The address space is bounded at the memory limit (RLIMIT_AS, the process tier): node
    /// reserves far more address space than it uses, so JavaScript needs a limit near the
    /// default there, and at the bound node's own allocator fails before any OOM kill.
    address_space_bound: bool,
    /// gVisor: the host's pids limit counts the Sentry's threads, so when it bites the
    /// sandbox may end instead of a fork failing; and an OOM may end the whole sandbox.
    gvisor: bool,
}

impl Shape {
    fn of(provider: &str) -> Shape {
        let container = Shape {
            guest_uid: None,
            work_is_slash_work: true,
            own_dirs: &["/tmp", "/dev/shm"],
            self_signal_dropped: true,
            environment: &["HOME", "LANG", "PATH"],
            no_sockets: false,
            projects: true,
            address_space_bound: false,
            work_share: (3, 4),
            gvisor: false,
        };
        match provider {
            "process" => Shape {
                work_is_slash_work: false,
                own_dirs: &[],
                self_signal_dropped: false,
                environment: &[],
                no_sockets: true,
                projects: false,
                address_space_bound: true,
                work_share: (1, 1),
                ..container
            },
            "crun" | "runc" => container,
            "runsc" => Shape {
                gvisor: true,
                self_signal_dropped: false,
                ..container
            },
            "qemu" => Shape {
                guest_uid: Some(1000),
                own_dirs: &["/tmp"],
                self_signal_dropped: false,
                ..container
            },
            other => panic!("no shape for {other}: add a row to Shape::of"),
        }
    }
}

/// The engine for one provider, probed, with a uid range of its own (two runs at a time, for
/// the concurrent case) and a grant profile whose API is a real HTTP server.
struct Rig {
    engine: Engine,
    /// The launcher's socket, in a split rig, and the directory that holds it.
    launch_socket: Option<PathBuf>,
    _launch_dir: Option<tempfile::TempDir>,
    provider: &'static str,
    /// The engine keeps warm pools matching the suite's limits, so snippets run on members.
    warm: bool,
    /// The image every run must name on its record: the default image of the rig's store
    /// (`sandbox`, or `python-data` in an `_image` rig); none at the process tier.
    image: Option<String>,
    tier: Tier,
    shape: Shape,
    /// The run uids (two slots) and, after them, the probe and controller uids: nothing may
    /// be left running as any of them after a run.
    uids: std::ops::Range<u32>,
    run_uids: std::ops::Range<u32>,
    /// The uids warm members run as (none run as them in a cold rig).
    pool_uids: std::ops::Range<u32>,
    state: PathBuf,
    api: TestApi,
    dir: TestDir,
}

fn rig(name: &'static str, slot: u32, case: &str) -> Option<Rig> {
    let test = format!("{name}::{case}");
    // `<provider>_split`: the provider hosted by a launcher, the engine reaching it over the
    // launcher's socket (docs/privileges.md, "The launcher").
    let rig_name = name;
    let (name, split) = match name.strip_suffix("_split") {
        Some(p) => (p, true),
        None => (name, false),
    };
    // `<provider>_warm`: the provider with warm pools (docs/warm-pools.md);
    // `<provider>_image`: with a second image, python-data, as the default (docs/images.md).
    let (provider, warm) = match name.strip_suffix("_warm") {
        Some(p) => (p, true),
        None => (name, false),
    };
    let (provider, image_name) = match provider.strip_suffix("_image") {
        Some(p) => (p, "python-data"),
        None => (provider, "sandbox"),
    };
    let image_dir = plimsoll_engine::settings::default_image_dir()
        .parent()
        .expect("the image store")
        .join(image_name);
    let image_identity = match std::fs::read_to_string(image_dir.join("identity")) {
        Ok(i) => i.trim().to_owned(),
        Err(_) if image_name != "sandbox" => {
            skip_or_fail(
                &test,
                &format!(
                    "no image {image_name} at {}: run `make images`",
                    image_dir.display()
                ),
            );
            return None;
        }
        Err(_) => String::new(),
    };
    if !is_root() {
        skip_or_fail(&test, "needs root to run sandboxes");
        return None;
    }
    // Every tool the providers start, built first when missing.
    for tool in [
        "plimsoll-probe",
        "plimsoll-agent",
        "plimsoll-trial-runner",
        "plimsoll-guest-init",
    ] {
        let package = if tool == "plimsoll-trial-runner" {
            "plimsoll-trial"
        } else {
            tool
        };
        if let Err(e) = plimsoll_testing::tool_binary(tool, package) {
            panic!("{e}");
        }
    }
    let dir = TestDir::new("conformance", &format!("{rig_name}-{case}"));
    let uid_base = 3_100_000 + slot * 1_000;
    let image_line = format!("image = {:?}\n", image_dir.display().to_string());
    let section = match provider {
        "process" | "qemu" => format!("[oci]\n{image_line}"),
        "crun" | "runc" | "runsc" => format!(
            "[oci]\n{image_line}state_root = {root:?}\ncgroup_parent = \"/plimsoll-conformance-{provider}-{pid}\"\n",
            root = dir.path().join("oci").display().to_string(),
            pid = std::process::id(),
        ),
        other => panic!("no settings for {other}"),
    };
    let state = dir.path().join("state");
    // A warm rig's pools are keyed on the suite's own limits, so every ask with them claims.
    let pools = if warm {
        let l = warm_limits(case);
        let pool = "min_idle = 1\nmax_members = 2\n";
        format!(
            "[limits.defaults]\ntimeout_ms = {}\nmemory_bytes = {}\npids = {}\ndisk_bytes = {}\noutput_bytes = {}\n\
             [pools.{provider}.python]\n{pool}{js}",
            l.timeout_ms.unwrap(),
            l.memory_bytes.unwrap(),
            l.pids.unwrap(),
            l.disk_bytes.unwrap(),
            l.output_bytes.unwrap(),
            // node cannot start under the process tier's address-space bound below about
            // 1 GiB, so such a rig warms Python only there.
            js = if Shape::of(provider).address_space_bound
                && l.memory_bytes < limits().memory_bytes
            {
                String::new()
            } else {
                format!("[pools.{provider}.javascript]\n{pool}")
            },
        )
    } else {
        "[pools]\n".to_owned()
    };
    let toml = format!(
        "providers = [\"{provider}\"]\ndefault_floor = \"process\"\nstate_dir = {state:?}\n\
         sandbox_uid_base = {uid_base}\nmax_concurrent = 2\nmax_per_caller = 2\n{section}{pools}",
        state = state.display().to_string(),
    );
    let api = TestApi::start(Expect::Static {
        header: "authorization".into(),
        value: format!("Bearer {TOKEN}"),
    });
    let grants = GrantProfiles::parse(
        &format!(
            "[profiles.orders]\nbase_url = \"{}\"\nroutes = [\"GET /orders/*\", \"GET /echo-auth/*\"]\ncallers = [\"{CALLER}\"]\n\
             call_budget = 20\ntimeout_ms = 5000\n[profiles.orders.credential]\nkind = \"static\"\n\
             secret_env = \"ORDERS_API_TOKEN\"\n",
            api.url()
        ),
        |name| (name == "ORDERS_API_TOKEN").then(|| TOKEN.to_owned()),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let settings = Settings::parse(&toml).unwrap_or_else(|e| panic!("{e}"));
    let (launch_socket, launch_dir) = match split.then(|| start_launcher(&settings)) {
        Some((socket, dir)) => (Some(socket), Some(dir)),
        None => (None, None),
    };
    let engine = match &launch_socket {
        Some(socket) => settings.build_engine_through(socket),
        None => settings.build_engine(&[]),
    }
    .unwrap_or_else(|e| panic!("{e}"))
    .with_grants(grants)
    .with_evidence_cache(shared_evidence(provider));
    // The provider's first rig probes it; the others wait for that, then adopt its evidence
    // as the CLI does (the provider checks it still holds: binaries, image, accelerator).
    let lock = std::fs::File::create(shared_dir().join(format!("{provider}.lock")))
        .and_then(|f| f.lock().map(|()| f))
        .unwrap_or_else(|e| panic!("locking the shared evidence: {e}"));
    engine.probe_for(Some(Tier::Process), Some(provider), &js("1"));
    drop(lock);
    let info = engine.providers().into_iter().next().expect("one provider");
    if !info.available {
        skip_or_fail(
            &test,
            &format!(
                "{provider} is not available here: {}",
                info.unavailable_reason.unwrap_or_default()
            ),
        );
        return None;
    }
    let provider: &'static str = match provider {
        "process" => "process",
        "crun" => "crun",
        "runc" => "runc",
        "runsc" => "runsc",
        "qemu" => "qemu",
        other => panic!("no provider {other}"),
    };
    let pool_uids = engine.pool_uid_range();
    if warm {
        engine.start_pools();
        idle_members(&engine).unwrap_or_else(|e| panic!("{test}: {e}"));
    }
    let image = (provider != "process").then(|| format!("{image_name} {image_identity}"));
    Some(Rig {
        launch_socket,
        _launch_dir: launch_dir,
        warm,
        image,
        pool_uids,
        engine,
        provider,
        tier: info.isolation,
        shape: Shape::of(provider),
        uids: uid_base..plimsoll_engine::uid_range_end(uid_base, 2, 1).unwrap(),
        run_uids: uid_base..uid_base + 2,
        state,
        api,
        dir,
    })
}

/// Waits until every pool of `engine` has an idle member.
fn idle_members(engine: &Engine) -> Result<(), String> {
    let start = std::time::Instant::now();
    while engine.pools_idle().iter().any(|(_, _, n)| *n == 0) {
        if start.elapsed() > Duration::from_secs(60) {
            return Err(format!(
                "the pools did not fill: {:?}",
                engine.pool_counts()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Where the rigs of one test binary share their providers' evidence: root's own directory
/// under the build's tmp directory, so the cache trusts it.
fn shared_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("conformance-evidence");
    std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

/// The evidence cache of `provider`'s rigs. Its key is the provider alone (the rigs' settings
/// differ only in their uids and directories) beside the test binary's identity and the boot,
/// which the cache adds.
fn shared_evidence(provider: &str) -> EvidenceCache {
    EvidenceCache::new(
        shared_dir().join(format!("{provider}.json")),
        Duration::from_secs(3600),
        &format!("conformance {provider}"),
    )
}

fn snippet(language: Language, code: &str) -> RunSpec {
    RunSpec::Snippet(Snippet {
        language,
        code: code.into(),
    })
}

fn py(code: &str) -> RunSpec {
    snippet(Language::Python, code)
}

fn js(code: &str) -> RunSpec {
    snippet(Language::Javascript, code)
}

fn stdout(r: &RunResponse) -> String {
    String::from_utf8_lossy(r.result.stdout.as_slice()).into_owned()
}

fn stderr(r: &RunResponse) -> String {
    String::from_utf8_lossy(r.result.stderr.as_slice()).into_owned()
}

/// What to send: a spec, its limits, and optionally a grant.
struct Ask {
    spec: RunSpec,
    limits: Limits,
    grant: Option<&'static str>,
}

impl Ask {
    fn new(spec: RunSpec) -> Ask {
        Ask {
            spec,
            limits: limits(),
            grant: None,
        }
    }

    fn limits(self, limits: Limits) -> Ask {
        Ask { limits, ..self }
    }

    fn grant(self, grant: &'static str) -> Ask {
        Ask {
            grant: Some(grant),
            ..self
        }
    }
}

impl Rig {
    fn request(&self, case: &str, ask: Ask) -> RunRequest {
        RunRequest {
            image: None,
            protocol: PROTOCOL,
            request_id: format!("{}-{case}", self.provider),
            minimum_isolation: None,
            provider: None,
            limits: Some(ask.limits),
            run: ask.spec,
            grant: ask.grant.map(str::to_owned),
        }
    }

    /// Runs, checks the answer's digests and tier, and that nothing of the run is left on the
    /// host.
    fn run(&self, case: &str, ask: impl Into<Ask>) -> Result<RunResponse, String> {
        let resp = self.run_beside(case, ask.into())?;
        self.nothing_left(case)?;
        Ok(resp)
    }

    /// [`Rig::run`] without the look for leftovers, for a run with another beside it (whose
    /// processes are still there): the caller looks once both are done.
    fn run_beside(&self, case: &str, ask: Ask) -> Result<RunResponse, String> {
        let req = self.request(case, ask);
        let resp = self
            .engine
            .run(CALLER, &req)
            .map_err(|e| format!("{case}: the run did not give a result: {e}"))?;
        self.check_answer(case, &req, &resp)?;
        Ok(resp)
    }

    /// Sends a request that must be refused with `reason`, with nothing run or left.
    fn refused(&self, case: &str, ask: Ask, reason: Reason) -> Result<(), String> {
        let req = self.request(case, ask);
        match self.engine.run(CALLER, &req) {
            Err(e @ RunError::Refused { .. }) => {
                if not_dispatched_reason(&e) != Some(reason) {
                    return Err(format!("{case}: not a {reason:?} refusal: {e}"));
                }
                if self.engine.in_flight() != 0 {
                    return Err(format!("{case}: a run is still in flight"));
                }
                self.nothing_left(case)
            }
            other => Err(format!("{case}: not refused: {other:?}")),
        }
    }

    fn check_answer(&self, case: &str, req: &RunRequest, r: &RunResponse) -> Result<(), String> {
        let problems: Vec<&str> = [
            (r.request_sha256 != request_sha256(req), "request digest"),
            (r.result_sha256 != result_sha256(&r.result), "result digest"),
            (
                r.record.record_sha256 != record_sha256(&r.record),
                "record digest",
            ),
            (
                r.record.request_sha256 != r.request_sha256,
                "record's request digest",
            ),
            (
                r.record.result_sha256 != r.result_sha256,
                "record's result digest",
            ),
            (r.provider != self.provider, "provider"),
            (
                r.isolation != self.tier || r.record.isolation != self.tier,
                "tier",
            ),
            (r.request_id != req.request_id, "request id"),
            (
                r.record
                    .image
                    .as_ref()
                    .map(|i| format!("{} {}", i.name, i.identity))
                    != self.image,
                "image",
            ),
        ]
        .into_iter()
        .filter_map(|(bad, what)| bad.then_some(what))
        .collect();
        if !problems.is_empty() {
            return Err(format!("{case}: wrong {problems:?} in {r:?}"));
        }
        self.check_wall(case, r)
    }

    /// Every run (warm or cold, with a grant or not; no trial runs here) has its wall on its
    /// result, and the wall shows what this provider's sandbox is: checked here from the
    /// wall's own members, not through the engine's judging.
    fn check_wall(&self, case: &str, r: &RunResponse) -> Result<(), String> {
        let Some(w) = &r.result.wall else {
            return Err(format!("{case}: the result has no wall: {r:?}"));
        };
        let zero = Some("0000000000000000");
        let container = matches!(self.provider, "crun" | "runc");
        // gVisor's /proc (the agent's own view, inside) shows no CapAmb or NoNewPrivs line
        // and no cgroup; its Sentry is the boundary.
        let gvisor = self.shape.gvisor;
        // In a guest: the guest's sandbox user; its namespaces are the guest kernel's own,
        // compared with nothing.
        let guest = self.shape.guest_uid;
        let uid_ok = (self.pool_uids.contains(&w.uid)
            || self.run_uids.contains(&w.uid)
            || guest == Some(w.uid))
            && w.euid == w.uid
            && w.gid == w.uid
            && w.groups.iter().all(|g| *g == w.uid);
        let mut wrong = Vec::new();
        for (bad, what) in [
            (!uid_ok, "uid"),
            (
                [&w.cap_inh, &w.cap_prm, &w.cap_eff]
                    .iter()
                    .any(|c| c.as_deref() != zero)
                    || (w.cap_amb.as_deref() != zero && !(gvisor && w.cap_amb.is_none())),
                "capabilities",
            ),
            // Empty everywhere, the process tier too (its child empties it while root).
            (w.cap_bnd.as_deref() != zero, "bounding set"),
            (
                w.no_new_privs != Some(true) && !(gvisor && w.no_new_privs.is_none()),
                "no_new_privs",
            ),
            (
                !gvisor && guest.is_none() && w.seccomp != Some(2),
                "seccomp",
            ),
            (
                guest.is_some() && w.namespaces.iter().any(|n| n.same_as_host.is_some()),
                "a guest's namespaces compared with the host's",
            ),
            (
                guest.is_some() && !w.root_read_only,
                "the guest's read-only root",
            ),
            (
                guest.is_some() && w.network_interfaces != ["lo"],
                "the guest's network",
            ),
            (
                guest.is_some() && (w.memory_limit_bytes.is_none() || w.pids_limit.is_none()),
                "the guest's cgroup limits",
            ),
            (
                gvisor
                    && ["net", "pid"].iter().any(|n| {
                        !w.namespaces
                            .iter()
                            .any(|s| s.name == *n && s.same_as_host == Some(false))
                    }),
                "gVisor's namespaces",
            ),
            (gvisor && !w.root_read_only, "gVisor's read-only root"),
            (gvisor && w.network_interfaces != ["lo"], "gVisor's network"),
            (
                container
                    && ["cgroup", "ipc", "mnt", "net", "pid", "uts"]
                        .iter()
                        .any(|n| {
                            !w.namespaces
                                .iter()
                                .any(|s| s.name == *n && s.same_as_host == Some(false))
                        }),
                "namespaces",
            ),
            (container && !w.root_read_only, "read-only root"),
            (container && w.network_interfaces != ["lo"], "network"),
            (
                container && (w.memory_limit_bytes.is_none() || w.pids_limit.is_none()),
                "cgroup limits",
            ),
        ] {
            if bad {
                wrong.push(what);
            }
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(format!("{case}: the wall is wrong in {wrong:?}: {w:?}"))
        }
    }

    /// No process of the engine's uids outlives a run (the reap runs from a forked child, so
    /// give it a moment), and no run directory or mount of a run is left.
    fn nothing_left(&self, case: &str) -> Result<(), String> {
        // A used member is removed off the answer's path: wait for that. What idle members
        // (and one being made) hold is theirs, not a run's.
        if !self.engine.wait_for_teardowns(Duration::from_secs(30)) {
            return Err(format!("{case}: a used member's teardown did not end"));
        }
        // Asked each time: the keeper may make a member (on a freed uid) meanwhile.
        let member = |pid: &i32| {
            let held = self.engine.pool_uids_held();
            std::fs::metadata(format!("/proc/{pid}"))
                .is_ok_and(|m| held.contains(&std::os::unix::fs::MetadataExt::uid(&m)))
        };

        let start = std::time::Instant::now();
        loop {
            let mut left = plimsoll_sandbox::reap::processes_of_uids(self.uids.clone());
            left.extend(plimsoll_sandbox::reap::processes_of_uids(
                self.pool_uids.clone(),
            ));
            left.retain(|p| !member(p));
            if left.is_empty() {
                break;
            }
            if start.elapsed() > Duration::from_secs(5) {
                return Err(format!("{case}: processes outlived the run: {left:?}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let entries = |d: PathBuf| -> Vec<String> {
            std::fs::read_dir(&d)
                .map(|r| {
                    r.filter_map(Result::ok)
                        .map(|e| d.join(e.file_name()).display().to_string())
                        .collect()
                })
                .unwrap_or_default()
        };
        let oci = self.dir.path().join("oci").join(self.provider);
        // The engine's and the container provider's run directories, the runtime's state of
        // a container (named `plimsoll-<run id>`), and the run's cgroups in every hierarchy.
        let mut left: Vec<String> = self
            .run_dirs()
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        left.extend(
            entries(oci.join("runtime"))
                .into_iter()
                .filter(|e| e.contains("plimsoll-")),
        );
        let parent = format!(
            "plimsoll-conformance-{}-{}",
            self.provider,
            std::process::id()
        );
        for hierarchy in entries(PathBuf::from("/sys/fs/cgroup"))
            .into_iter()
            .chain(["/sys/fs/cgroup".to_owned()])
        {
            // The provider's cgroup (`<parent>/<provider>`) stays; no run's below it.
            let ours = PathBuf::from(hierarchy).join(&parent);
            let provider = ours.join(self.provider).display().to_string();
            left.extend(
                entries(ours.clone())
                    .into_iter()
                    .chain(entries(ours.join(self.provider)))
                    .filter(|e| *e != provider && std::path::Path::new(e).is_dir()),
            );
        }
        // Asked after the listing: a member listed then is idle or still being made now. Its
        // id names its directory, container, cgroups and the runtime's state of it (runsc's
        // `<id>_sandbox:<id>.state`).
        let members = self.engine.pool_member_ids();
        left.retain(|p| !members.iter().any(|m| p.contains(m.as_str())));
        if !left.is_empty() {
            return Err(format!("{case}: left behind: {left:?}"));
        }
        let dir = self.dir.path().display().to_string();
        // No runtime, shim, gofer or QEMU still names the rig's directory (given the same
        // moment to go as the run's own processes).
        let start = std::time::Instant::now();
        loop {
            // An idle member's runtime helpers (runsc's sandbox and gofer, as root) name its id.
            let members = self.engine.pool_member_ids();
            let naming: Vec<String> = entries(PathBuf::from("/proc"))
                .into_iter()
                .filter(|p| {
                    std::fs::read(format!("{p}/cmdline")).is_ok_and(|c| {
                        let c = String::from_utf8_lossy(&c);
                        c.contains(&dir) && !members.iter().any(|m| c.contains(m.as_str()))
                    })
                })
                .filter(|p| {
                    let pid = p.trim_start_matches("/proc/").parse::<i32>().unwrap_or(0);
                    !member(&pid)
                })
                .collect();
            if naming.is_empty() {
                break;
            }
            if start.elapsed() > Duration::from_secs(5) {
                return Err(format!("{case}: processes still name {dir}: {naming:?}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        // Asked again after the read: the keeper may have made a member since the listing.
        let members = self.engine.pool_member_ids();
        let of_member = |l: &str| members.iter().any(|m| l.contains(&format!("{m}/")));
        if let Some(m) = mounts.lines().find(|l| l.contains(&dir) && !of_member(l)) {
            return Err(format!("{case}: a run's mount is left: {m}"));
        }
        Ok(())
    }

    /// Every run directory under the rig's directory: the entries of each `runs` directory
    /// there (the engine's, the container provider's, the VM provider's).
    fn run_dirs(&self) -> Vec<PathBuf> {
        plimsoll_testing::run_dirs_under(self.dir.path())
    }

    /// The uid the code must see: the guest's fixed one, or one of the run uids.
    fn uid_ok(&self, seen: u32) -> bool {
        match self.shape.guest_uid {
            Some(u) => seen == u,
            None => self.run_uids.contains(&seen) || self.pool_uids.contains(&seen),
        }
    }
}

impl From<RunSpec> for Ask {
    fn from(spec: RunSpec) -> Ask {
        Ask::new(spec)
    }
}

/// The limits a warm rig's pools are keyed on for `case`: the suite's, or those of the case's
/// main ask where it sets its own (so the bound it tests is the member's).
fn warm_limits(case: &str) -> Limits {
    match case {
        "fork_bomb" => Limits {
            pids: Some(32),
            ..limits()
        },
        "inodes" => Limits {
            disk_bytes: Some(16 * MIB),
            memory_bytes: Some(256 * MIB),
            ..limits()
        },
        "memory" => Limits {
            memory_bytes: Some(256 * MIB),
            ..limits()
        },
        _ => limits(),
    }
}

fn limits() -> Limits {
    Limits {
        timeout_ms: Some(60_000),
        memory_bytes: Some(1024 * MIB),
        pids: Some(64),
        disk_bytes: Some(64 * MIB),
        output_bytes: Some(MIB),
        ..Default::default()
    }
}

type Case = fn(&Rig) -> Result<(), String>;

fn explain(r: &RunResponse) -> String {
    format!(
        "stdout {:?} stderr {:?} exit {:?} signal {:?} timed_out {} oom {}",
        stdout(r).chars().take(400).collect::<String>(),
        stderr(r).chars().take(400).collect::<String>(),
        r.result.exit_code,
        r.result.signal,
        r.result.timed_out,
        r.result.oom_killed
    )
}

fn expect(case: &str, ok: bool, r: &RunResponse) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(format!("{case}: {}", explain(r)))
    }
}

/// The code runs as the run's own unprivileged uid (never root), in its work directory, with
/// no_new_privs set; exit codes, stderr and signals come back as they were.
fn identity(rig: &Rig) -> Result<(), String> {
    let r = rig.run(
        "identity",
        py("import ctypes, os\nprint(6*7, os.getuid(), os.getgid(), os.getcwd(), ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))"),
    )?;
    let out = stdout(&r);
    let f: Vec<&str> = out.split_whitespace().collect();
    let uid: Option<u32> = f.get(1).and_then(|u| u.parse().ok());
    let cwd = f.get(3).copied().unwrap_or("");
    let cwd_ok = if rig.shape.work_is_slash_work {
        cwd == "/work"
    } else {
        cwd.starts_with(&rig.state.display().to_string()) && cwd.ends_with("/work")
    };
    expect(
        "identity",
        f.len() == 5
            && f[0] == "42"
            && uid.is_some_and(|u| u != 0 && rig.uid_ok(u))
            && f[2] == f[1]
            && cwd_ok
            && f[4] == "1",
        &r,
    )?;
    let r = rig.run(
        "identity",
        py("import sys\nprint('hi')\nprint('to err', file=sys.stderr)\nsys.exit(3)"),
    )?;
    expect(
        "identity (exit code)",
        r.result.exit_code == Some(3)
            && r.result.signal.is_none()
            && stdout(&r) == "hi\n"
            && stderr(&r) == "to err\n"
            && !r.result.timed_out
            && !r.result.oom_killed,
        &r,
    )?;
    let r = rig.run(
        "identity",
        js("console.log(6*7, process.getuid()); process.exit(7)"),
    )?;
    expect(
        "identity (javascript)",
        r.result.exit_code == Some(7) && stdout(&r).starts_with("42 "),
        &r,
    )?;
    let r = rig.run(
        "identity",
        py("import os, signal\nprint(os.getpid(), flush=True)\nos.kill(os.getpid(), signal.SIGKILL)"),
    )?;
    let signalled = if rig.shape.self_signal_dropped {
        // Its namespace's init: the kernel drops the signal, and the code goes on.
        stdout(&r) == "1\n" && r.result.exit_code == Some(0)
    } else {
        r.result.exit_code.is_none() && r.result.signal == Some(9)
    };
    expect("identity (signal)", signalled && !r.result.timed_out, &r)
}

/// A file only root may read, the daemon's own files, and the host's root through
/// /proc/1/root all stay unread, from Python and from JavaScript.
fn host_files(rig: &Rig) -> Result<(), String> {
    let secret = rig.state.join("daemon-secret");
    std::fs::create_dir_all(&rig.state).map_err(|e| e.to_string())?;
    std::fs::write(&secret, "TOPSECRET-daemon-file").map_err(|e| e.to_string())?;
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| e.to_string())?;
    let shadow_root = std::fs::read_to_string("/etc/shadow")
        .ok()
        .and_then(|s| s.lines().next().map(str::to_owned))
        .unwrap_or_else(|| "root:".into());
    let code = format!(
        "for p in ['/etc/shadow', {s:?}, '/proc/1/root/etc/shadow', '/proc/1/root' + {s:?}]:\n    \
         try:\n        print(p, 'READ', open(p).read()[:200])\n    \
         except Exception as e:\n        print(p, 'denied', type(e).__name__)\n",
        s = secret.display().to_string()
    );
    let r = rig.run("host_files", py(&code))?;
    let out = stdout(&r);
    expect(
        "host_files",
        r.result.exit_code == Some(0)
            && out.matches(" denied ").count() == 4
            && !out.contains("READ")
            && !out.contains("TOPSECRET")
            && !out.contains(&shadow_root),
        &r,
    )?;
    let r = rig.run(
        "host_files",
        js("try { require('fs').readFileSync('/etc/shadow'); console.log('READ') } catch (e) { console.log('denied ' + e.code) }"),
    )?;
    let _ = std::fs::remove_file(&secret);
    expect(
        "host_files (javascript)",
        stdout(&r).starts_with("denied E"),
        &r,
    )
}

/// Nothing outside the work directory (and the sandbox's own /tmp, where it has one) can be
/// written: not the root, system directories, the daemon's state or a file of the daemon's
/// left writable by mistake. On the host nothing appears and nothing changes.
fn writes_outside_work(rig: &Rig) -> Result<(), String> {
    let state = rig.state.display().to_string();
    let runs = rig.state.join("runs").display().to_string();
    let daemon_file = rig.state.join("daemon-file");
    // A daemon's state directory exists before its first run (a rig's may not yet, when its
    // evidence came from the cache rather than a probe here).
    std::fs::create_dir_all(&rig.state).map_err(|e| e.to_string())?;
    std::fs::write(&daemon_file, "daemon data").map_err(|e| e.to_string())?;
    std::fs::set_permissions(&daemon_file, std::fs::Permissions::from_mode(0o666))
        .map_err(|e| e.to_string())?;
    let dirs = [
        "/",
        "/etc",
        "/usr/bin",
        "/opt/plimsoll/bin",
        "/var/tmp",
        "/root",
        "/home",
        "/dev",
        "/dev/shm",
        "/sys/fs/cgroup",
        "/proc/sys/kernel",
        state.as_str(),
        runs.as_str(),
        "/tmp",
    ];
    let image = plimsoll_engine::settings::default_image_dir().join("rootfs");
    let planted = |root: &std::path::Path| -> Vec<String> {
        dirs.iter()
            .map(|d| {
                root.join(d.trim_start_matches('/'))
                    .join("plimsoll-was-here")
            })
            .filter(|p| p.exists())
            .map(|p| p.display().to_string())
            .collect()
    };
    // The guest's root disk, shared by every VM run, must come out untouched too.
    let vm_disk = plimsoll_engine::settings::default_vm_assets_dir().join("disk.ext4");
    let disk_stamp = || std::fs::metadata(&vm_disk).and_then(|m| m.modified()).ok();
    let disk_before = disk_stamp();
    // The shared image's directories, listed: no mount point or file may be created in them.
    let listing = || -> Vec<Vec<String>> {
        ["", "opt/plimsoll/bin", "work", "tmp", "dev", "etc"]
            .iter()
            .map(|d| {
                let mut v: Vec<String> = std::fs::read_dir(image.join(d))
                    .map(|r| {
                        r.filter_map(Result::ok)
                            .map(|e| e.file_name().to_string_lossy().into_owned())
                            .collect()
                    })
                    .unwrap_or_default();
                v.sort();
                v
            })
            .collect()
    };
    let image_before = listing();
    let before: Vec<String> = planted(std::path::Path::new("/"))
        .into_iter()
        .chain(planted(&image))
        .collect();
    let code = format!(
        "import os\nfor d in {dirs:?} + [os.getcwd()]:\n    try:\n        \
         with open(os.path.join(d, 'plimsoll-was-here'), 'w') as f:\n            f.write('x')\n        \
         print(d, 'WROTE')\n    except Exception as e:\n        print(d, 'denied', type(e).__name__)\n\
         try:\n    open({f:?}, 'a').write('x')\n    print('daemon file WROTE')\n\
         except Exception as e:\n    print('daemon file denied', type(e).__name__)\n",
        f = daemon_file.display().to_string(),
    );
    let r = rig.run("writes_outside_work", py(&code))?;
    let out = stdout(&r);
    let lines: Vec<&str> = out.lines().collect();
    // One line per directory, then the work directory's, then the daemon's file's.
    let wrote_outside: Vec<&str> = dirs
        .iter()
        .zip(&lines)
        .filter(|(d, l)| l.ends_with(" WROTE") && !rig.shape.own_dirs.contains(d))
        .map(|(d, _)| *d)
        .collect();
    let tmp_ok = rig
        .shape
        .own_dirs
        .iter()
        .all(|d| lines.contains(&format!("{d} WROTE").as_str()));
    let work_ok = lines.get(dirs.len()).is_some_and(|l| l.ends_with(" WROTE"));
    let after: Vec<String> = planted(std::path::Path::new("/"))
        .into_iter()
        .chain(planted(&image))
        .filter(|p| !before.contains(p))
        .collect();
    let unchanged = std::fs::read_to_string(&daemon_file).ok().as_deref() == Some("daemon data");
    let _ = std::fs::remove_file(&daemon_file);
    expect(
        "writes_outside_work",
        lines.len() == dirs.len() + 2
            && wrote_outside.is_empty()
            && tmp_ok
            && work_ok
            && lines[dirs.len() + 1].starts_with("daemon file denied")
            && after.is_empty()
            && unchanged
            && disk_stamp() == disk_before
            && listing() == image_before,
        &r,
    )
    .map_err(|e| format!("{e}; wrote outside: {wrote_outside:?}; appeared on the host: {after:?}"))
}

/// No connection leaves the sandbox: not to a listener on the host's loopback, not to the
/// host's own address, not out; from Python and from JavaScript.
fn network(rig: &Rig) -> Result<(), String> {
    let local = quiet_listener("127.0.0.1:0");
    let any = quiet_listener("0.0.0.0:0");
    // The host's own address on its default route (no packet is sent).
    let host_ip = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect("192.0.2.1:9").map(|()| s))
        .and_then(|s| s.local_addr())
        .map(|a| a.ip().to_string())
        .unwrap_or_else(|_| "127.0.0.1".into());
    let targets = [
        ("127.0.0.1".to_owned(), local.local_addr().unwrap().port()),
        (host_ip, any.local_addr().unwrap().port()),
        ("10.0.2.2".to_owned(), local.local_addr().unwrap().port()),
        ("192.0.2.1".to_owned(), 80),
        ("1.1.1.1".to_owned(), 53),
    ];
    let mut code = String::from("import socket\n");
    for (host, port) in &targets {
        code.push_str(&format!(
            "try:\n    socket.create_connection(('{host}', {port}), timeout=3).close()\n    print('{host}', 'CONNECTED')\nexcept OSError as e:\n    print('{host}', 'refused', type(e).__name__)\n"
        ));
    }
    if rig.shape.no_sockets {
        code.push_str(
            "for fam in (socket.AF_INET, socket.AF_INET6, socket.AF_UNIX):\n    try:\n        \
             socket.socket(fam, socket.SOCK_STREAM)\n        print('OPEN', fam)\n    \
             except OSError as e:\n        print('no socket', e.errno)\n",
        );
    } else {
        code.push_str("import os\nprint('interfaces', sorted(os.listdir('/sys/class/net')))\n");
    }
    let r = rig.run("network", py(&code))?;
    let out = stdout(&r);
    let shape_ok = if rig.shape.no_sockets {
        out.matches("no socket 1\n").count() == 3
    } else {
        out.contains("interfaces ['lo']")
    };
    expect(
        "network",
        !out.contains("CONNECTED")
            && !out.contains("OPEN")
            && out.matches(" refused ").count() == targets.len()
            && shape_ok,
        &r,
    )?;
    let port = local.local_addr().unwrap().port();
    let r = rig.run(
        "network",
        js(&format!(
            "const s = require('net').connect({port}, '127.0.0.1');\n\
             s.on('connect', () => {{ console.log('CONNECTED'); process.exit(0); }});\n\
             s.on('error', (e) => {{ console.log('refused ' + e.code); process.exit(3); }});"
        )),
    )?;
    expect(
        "network (javascript)",
        r.result.exit_code == Some(3) && stdout(&r).starts_with("refused E"),
        &r,
    )?;
    if no_connection_came(&local) && no_connection_came(&any) {
        Ok(())
    } else {
        Err("network: the host's listener was reached".into())
    }
}

/// The sandbox gets none of the host's environment: the variables a snippet starts with are
/// exactly the provider's documented few.
fn environment(rig: &Rig) -> Result<(), String> {
    let r = rig.run(
        "environment",
        js("console.log(Object.keys(process.env).sort().join(','))"),
    )?;
    expect(
        "environment (javascript)",
        stdout(&r).trim_end() == rig.shape.environment.join(","),
        &r,
    )?;
    // What the process was given, from /proc. Python adds LC_CTYPE itself (PEP 538 locale
    // coercion) to os.environ, never to what it was given.
    let r = rig.run(
        "environment",
        py("print(','.join(sorted(v.split(b'=')[0].decode() for v in open('/proc/self/environ','rb').read().split(b'\\0') if v)))"),
    )?;
    expect(
        "environment",
        stdout(&r).trim_end() == rig.shape.environment.join(","),
        &r,
    )
}

/// No namespace of any kind can be made, by any call (the shared attack), and ordinary
/// subprocesses still work.
fn namespaces(rig: &Rig) -> Result<(), String> {
    let r = rig.run("namespaces", py(NAMESPACE_ATTACK))?;
    let out = stdout(&r);
    let uid: Option<u32> = out.split_whitespace().nth(1).and_then(|u| u.parse().ok());
    expect(
        "namespaces",
        uid.is_some_and(|u| rig.uid_ok(u) && out == namespace_attack_refused(u)),
        &r,
    )?;
    let r = rig.run(
        "namespaces",
        py("import subprocess\nprint(subprocess.run(['/bin/echo', 'child ok'], capture_output=True).stdout.decode(), end='')"),
    )?;
    expect("namespaces (subprocess)", stdout(&r) == "child ok\n", &r)?;
    let r = rig.run(
        "namespaces",
        js("console.log(require('child_process').execFileSync('/bin/echo', ['node child ok']).toString().trim())"),
    )?;
    expect(
        "namespaces (javascript subprocess)",
        stdout(&r) == "node child ok\n",
        &r,
    )
}

/// Forks stop at the pids limit: children that stay are counted below the limit, and a real
/// bomb (every child forking forever) is stopped by the limit, not the deadline.
fn fork_bomb(rig: &Rig) -> Result<(), String> {
    let r = rig.run(
        "fork_bomb",
        Ask::new(py(
            "import os, time\nfor i in range(10000):\n    try:\n        if os.fork() == 0:\n            time.sleep(30)\n            os._exit(0)\n    except OSError as e:\n        print('limited', i, type(e).__name__, flush=True)\n        os._exit(0)\nprint('UNLIMITED')",
        ))
        .limits(Limits {
            pids: Some(32),
            memory_bytes: Some(1024 * MIB),
            ..limits()
        }),
    )?;
    let out = stdout(&r);
    let forks: Option<u32> = out.split_whitespace().nth(1).and_then(|n| n.parse().ok());
    let held = if out.starts_with("limited") {
        forks.is_some_and(|n| n < 32) && out.contains("BlockingIOError")
    } else {
        rig.shape.gvisor && r.result.exit_code != Some(0)
    };
    expect(
        "fork_bomb",
        held && !out.contains("UNLIMITED") && !r.result.timed_out,
        &r,
    )?;
    // The first process counts its own forks until one fails and then exits, which ends the
    // run: the limit held if that fork failed with EAGAIN long before the deadline.
    let bomb = "import errno, os, time\nkids = 0\nfailed = None\nwhile kids < 5000:\n    \
                try:\n        pid = os.fork()\n    except OSError as e:\n        \
                failed = errno.errorcode.get(e.errno, e.errno)\n        break\n    \
                if pid == 0:\n        while True:\n            try:\n                os.fork()\n            \
                except OSError:\n                time.sleep(0.001)\n    kids += 1\n\
                print('bomb forked', kids, 'then', failed, flush=True)\nos._exit(0)\n";
    let r = rig.run(
        "fork_bomb",
        Ask::new(py(bomb)).limits(Limits {
            pids: Some(24),
            timeout_ms: Some(30_000),
            memory_bytes: Some(1024 * MIB),
            ..limits()
        }),
    )?;
    let out = stdout(&r);
    let kids: Option<u32> = out.split_whitespace().nth(2).and_then(|n| n.parse().ok());
    let stopped = (out.starts_with("bomb forked ")
        && out.trim_end().ends_with("then EAGAIN")
        && kids.is_some_and(|k| k < 24))
        || (rig.shape.gvisor && r.result.exit_code.is_some_and(|c| c != 0) && out.is_empty());
    expect("fork_bomb (bomb)", stopped && !r.result.timed_out, &r)?;
    // The classic: every process forks forever and none exits. The deadline ends it (or,
    // under gVisor, the limit may end the sandbox first), and nothing of it is left.
    let r = rig.run(
        "fork_bomb",
        Ask::new(py(
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        ))
        .limits(Limits {
            pids: Some(16),
            timeout_ms: Some(3_000),
            ..limits()
        }),
    )?;
    expect(
        "fork_bomb (classic)",
        r.result.timed_out || (rig.shape.gvisor && r.result.exit_code != Some(0)),
        &r,
    )
}

/// Memory stops at the limit: one process allocating four times it never succeeds; a
/// JavaScript loop growing without end is OOM-killed and the run returns; four processes,
/// each under the limit, together past it cannot all hold their memory at once.
fn memory(rig: &Rig) -> Result<(), String> {
    let quarter = Limits {
        memory_bytes: Some(256 * MIB),
        ..limits()
    };
    let r = rig.run(
        "memory",
        Ask::new(py("b = bytearray(1024 << 20)\nfor i in range(0, len(b), 4096):\n    b[i] = 1\nprint('ALLOCATED')"))
            .limits(quarter.clone()),
    )?;
    expect(
        "memory",
        !stdout(&r).contains("ALLOCATED") && r.result.exit_code != Some(0),
        &r,
    )?;
    let r = rig.run(
        "memory",
        Ask::new(js(
            "const a = []; for (;;) { a.push(Buffer.alloc(1 << 20).fill(1)); }",
        ))
        .limits(Limits {
            memory_bytes: Some(if rig.shape.address_space_bound {
                1024 * MIB
            } else {
                128 * MIB
            }),
            ..limits()
        }),
    )?;
    let killed = if rig.shape.gvisor {
        r.result.oom_killed || r.result.signal == Some(9)
    } else if rig.shape.address_space_bound {
        r.result.oom_killed || stderr(&r).contains("out of memory") || stderr(&r).contains("OOM")
    } else {
        r.result.oom_killed
    };
    expect(
        "memory (javascript)",
        killed && !r.result.timed_out && r.result.exit_code != Some(0),
        &r,
    )?;
    // The kernel's OOM killer picks the largest process, which may be one that already said
    // it held its memory: what must not happen is all four living to the end.
    let r = rig.run(
        "memory",
        Ask::new(py("import os, sys, time\npids = []\nfor i in range(4):\n    pid = os.fork()\n    if pid == 0:\n        \
            b = bytearray(100 << 20)\n        for j in range(0, len(b), 4096):\n            b[j] = 1\n        \
            print('held', i, flush=True)\n        time.sleep(3)\n        os._exit(0)\n    pids.append(pid)\n\
            codes = [os.waitpid(p, 0)[1] for p in pids]\nprint('survived', sum(1 for c in codes if os.WIFEXITED(c) and os.WEXITSTATUS(c) == 0))\n"))
            .limits(quarter),
    )?;
    let out = stdout(&r);
    let survived: Option<u32> = out
        .lines()
        .find_map(|l| l.strip_prefix("survived "))
        .and_then(|n| n.parse().ok());
    let held = match survived {
        Some(n) => n < 4 && (r.result.oom_killed || rig.shape.gvisor),
        // The parent itself was killed: the bound held too, and the run says so.
        None => r.result.exit_code != Some(0),
    };
    expect("memory (four processes)", held && !r.result.timed_out, &r)
}

/// The disk stops at its bound: one big file, or many files each small, end with ENOSPC at
/// or below the limit.
fn disk(rig: &Rig) -> Result<(), String> {
    let fill = |how: &str| {
        format!(
            "import errno, os\nn = 0\ntry:\n{how}    print('wrote', n, 'no error')\n\
             except OSError as e:\n    print('wrote', n, errno.errorcode.get(e.errno, e.errno))\n"
        )
    };
    let one = fill(
        "    with open('big', 'wb') as f:\n        while n < 200 << 20:\n            \
         f.write(b'\\0' * 65536)\n            f.flush()\n            n += 65536\n",
    );
    let many = fill(
        "    for i in range(40):\n        with open('f%d' % i, 'wb') as f:\n            \
         for _ in range(4):\n                f.write(b'x' * (1 << 20))\n                \
         f.flush()\n                n += 1 << 20\n",
    );
    for (what, code, disk) in [("one file", one, 64 * MIB), ("many files", many, 32 * MIB)] {
        let r = rig.run(
            "disk",
            Ask::new(py(&code)).limits(Limits {
                disk_bytes: Some(disk),
                ..limits()
            }),
        )?;
        let out = stdout(&r);
        let written: u64 = out
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(u64::MAX);
        expect(
            &format!("disk ({what})"),
            // ENOSPC from the full file system, or EFBIG where the file size is bounded
            // at the disk limit too (RLIMIT_FSIZE, the process tier).
            (out.trim_end().ends_with("ENOSPC") || out.trim_end().ends_with("EFBIG"))
                && written <= disk / rig.shape.work_share.1 * rig.shape.work_share.0 + 4096,
            &r,
        )?;
    }
    Ok(())
}

/// Files that hold no bytes still cost the kernel an inode each: creating them without end
/// stops at a bound tied to the disk limit (ENOSPC), long before the host's own. gVisor's
/// tmpfs takes no inode count: there the Sentry's memory for them is held by the memory
/// limit, and the run is OOM-killed instead.
fn inodes(rig: &Rig) -> Result<(), String> {
    let disk = 16 * MIB;
    let r = rig.run(
        "inodes",
        Ask::new(py(
            "import errno, os\nn = 0\ntry:\n    while n < 1000000:\n        os.close(os.open('i%d' % n, os.O_CREAT | os.O_WRONLY, 0o600))\n        n += 1\n    print('made', n, 'no error')\nexcept OSError as e:\n    print('made', n, errno.errorcode.get(e.errno, e.errno))\n",
        ))
        .limits(Limits {
            disk_bytes: Some(disk),
            memory_bytes: Some(256 * MIB),
            ..limits()
        }),
    )?;
    let out = stdout(&r);
    if rig.shape.gvisor && r.result.oom_killed && !out.contains("no error") {
        return Ok(());
    }
    let made: u64 = out
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(u64::MAX);
    expect(
        "inodes",
        out.trim_end().ends_with("ENOSPC") && made <= inode_bound(disk),
        &r,
    )
}

/// The most inodes a sandbox's file systems may hold for a disk limit: one per KiB of it
/// (docs/isolation-tiers.md), summed over the work directory and the sandbox's own /tmp
/// and /dev/shm.
fn inode_bound(disk_bytes: u64) -> u64 {
    disk_bytes / 1024
}

/// Sleeping past the timeout is cut off at the timeout with SIGKILL, and says so.
fn timeout(rig: &Rig) -> Result<(), String> {
    let r = rig.run(
        "timeout",
        Ask::new(py(
            "import time\nprint('started', flush=True)\ntime.sleep(120)\nprint('WOKE')",
        ))
        .limits(Limits {
            timeout_ms: Some(3_000),
            ..limits()
        }),
    )?;
    expect(
        "timeout",
        r.result.timed_out
            && r.result.signal == Some(9)
            && !r.result.oom_killed
            && stdout(&r) == "started\n"
            && r.duration_ms < 60_000,
        &r,
    )
}

/// Children that leave the run's session, alive while the run ends, do not outlive it
/// (`Rig::run` looks for any process of the run's uids afterwards).
fn outlive(rig: &Rig) -> Result<(), String> {
    let r = rig.run(
        "outlive",
        py("import os, subprocess, time\n\
            subprocess.Popen(['sleep', '300'], start_new_session=True)\n\
            r, w = os.pipe()\npid = os.fork()\nif pid == 0:\n    os.close(r)\n    os.setsid()\n    \
            if os.fork() == 0:\n        null = os.open('/dev/null', os.O_RDWR)\n        \
            for fd in (0, 1, 2):\n            os.dup2(null, fd)\n        \
            os.write(w, str(os.getpid()).encode())\n        os.close(w)\n        time.sleep(300)\n    \
            os._exit(0)\nos.close(w)\nos.waitpid(pid, 0)\nesc = int(os.read(r, 32))\nos.kill(esc, 0)\n\
            state = open(f'/proc/{esc}/stat').read().rpartition(')')[2].split()[0]\n\
            print('escapee', state, os.getsid(esc) != os.getsid(0))\n"),
    )?;
    let out = stdout(&r);
    let f: Vec<&str> = out.split_whitespace().collect();
    // Alive during the run: sleeping, or still on its way to the sleep; in its own session.
    expect(
        "outlive",
        r.result.exit_code == Some(0) && matches!(f.as_slice(), ["escapee", "S" | "R", "True"]),
        &r,
    )
}

/// A hundred megabytes of output is cut at the cap, marked, and the run still finishes;
/// the other stream is untouched.
fn output_cap(rig: &Rig) -> Result<(), String> {
    let r = rig.run(
        "output_cap",
        Ask::new(js("const chunk = Buffer.alloc(1 << 20, 120);\n\
             for (let i = 0; i < 100; i++) process.stdout.write(chunk);\n\
             process.stderr.write('done\\n');"))
        .limits(Limits {
            timeout_ms: Some(120_000),
            ..limits()
        }),
    )?;
    let out = r.result.stdout.as_slice();
    expect(
        "output_cap",
        r.result.exit_code == Some(0)
            && r.result.stdout_truncated
            && out.len() as u64 == MIB
            && out.iter().all(|b| *b == b'x')
            && r.result.stderr.as_slice() == b"done\n"
            && !r.result.stderr_truncated,
        &r,
    )
}

/// Output that is not UTF-8 comes back byte for byte.
fn raw_output(rig: &Rig) -> Result<(), String> {
    let r = rig.run(
        "raw_output",
        py("import sys\nsys.stdout.buffer.write(bytes(range(256)))\nsys.stderr.buffer.write(b'\\xff\\xfe\\x00end')"),
    )?;
    expect(
        "raw_output",
        r.result.exit_code == Some(0)
            && r.result.stdout.as_slice() == (0..=255u8).collect::<Vec<u8>>().as_slice()
            && r.result.stderr.as_slice() == b"\xff\xfe\x00end",
        &r,
    )
}

/// Two runs at once: the second cannot read or list the first's files, however it looks
/// (its own paths, /proc/*/root, the daemon's run directories), and no other local user on
/// the host can read the first's code or files while it runs. Each run stamps the wall clock,
/// so the test shows the attempts fell while the secret existed.
fn concurrent(rig: &Rig) -> Result<(), String> {
    let secret = plimsoll_testing::fresh_id("SECRET-");
    // Long enough for the reader's sandbox to come up while the writer still holds the
    // secret: at qemu the reader may boot a VM cold under TCG (the writer took the member).
    let hold = if rig.provider == "qemu" {
        30
    } else if rig.shape.gvisor {
        14
    } else {
        8
    };
    let writer = format!(
        "import os, time\n# {secret} is in the code too\nfor p in ['secret', '/tmp/secret']:\n    try:\n        \
         open(p, 'w').write('{secret}')\n    except OSError:\n        pass\n\
         print('written', time.time(), flush=True)\ntime.sleep({hold})\nprint('ending', time.time(), flush=True)\n"
    );
    // The reader knows the writer's run directory on the host exactly (the test looks it up
    // as root): its work, its code, the runs root; and the paths any sandbox shares.
    let reader = |other: &str| {
        format!(
            "import glob, os, time\nbegan = time.time()\nfound = []\ntried = 0\n\
             pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n\
             paths = ['/work/secret', '/tmp/secret', {other:?} + '/work/secret', {other:?} + '/code/main.py']\n\
             paths += [f'/proc/{{p}}/root{{f}}' for p in pids for f in ('/work/secret', '/tmp/secret')]\n\
             paths += glob.glob({runs:?} + '/*/work/secret') + glob.glob({runs:?} + '/*/code/*')\n\
             for p in paths:\n    tried += 1\n    try:\n        found.append(open(p).read())\n    except Exception:\n        pass\n\
             for d in [{runs:?}, {other:?}, {other:?} + '/work', {other:?} + '/code']:\n    try:\n        found.append(os.listdir(d))\n    except Exception:\n        pass\n\
             try:\n    open({other:?} + '/work/planted', 'x').write('x')\n    found.append('PLANTED')\nexcept Exception:\n    pass\n\
             print('found', found)\nprint('tried', tried)\nprint('attempts', began, time.time())\n",
            runs = rig.state.join("runs").display().to_string(),
        )
    };
    // Not an idle warm member's (the reader may be about to claim one): the writer's.
    let run_dirs = || {
        let dirs = rig.run_dirs();
        let idle = rig.engine.pool_member_ids();
        dirs.into_iter()
            .filter(|d| !idle.iter().any(|m| d.ends_with(m)))
            .collect::<Vec<_>>()
    };
    let (a, b, host) = std::thread::scope(|s| {
        let a = s.spawn(|| {
            rig.run_beside(
                "concurrent",
                Ask::new(py(&writer)).limits(Limits {
                    timeout_ms: Some((hold + 30) * 1000),
                    ..limits()
                }),
            )
        });
        // Once the writer's run directory is there, give its code time to start (checked
        // below from its stamps, not assumed).
        let start = std::time::Instant::now();
        while run_dirs().is_empty() && start.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_secs(if hold > 8 { 5 } else { 2 }));
        let found = run_dirs();
        let Some(other) = found.first().cloned() else {
            return (
                a.join().expect("the writer"),
                Err("concurrent: the writer's run directory never appeared".to_owned()),
                Ok(()),
            );
        };
        // Another local user on the host, while the writer runs, and its directory is there.
        let host = nobody_reads(&[rig.dir.path().to_path_buf()], &secret).and_then(|()| {
            if other.exists() {
                Ok(())
            } else {
                Err(format!(
                    "the writer's run directory {other:?} was gone before the look"
                ))
            }
        });
        let b = rig.run_beside(
            "concurrent",
            Ask::new(py(&reader(&other.display().to_string()))),
        );
        (a.join().expect("the writer"), b, host)
    });
    let (a, b) = (a?, b?);
    rig.nothing_left("concurrent")?;
    let (written, out) = (stdout(&a), stdout(&b));
    let stamp = |text: &str, key: &str, nth: usize| -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().nth(nth))
            .and_then(|t| t.parse().ok())
    };
    let during = match (
        stamp(&written, "written ", 0),
        stamp(&written, "ending ", 0),
        stamp(&out, "attempts ", 0),
        stamp(&out, "attempts ", 1),
    ) {
        (Some(w0), Some(w1), Some(t0), Some(t1)) => w0 < t0 && t1 < w1,
        _ => false,
    };
    if !during {
        return Err(format!(
            "concurrent: the reader did not run while the secret existed: writer {written:?}, reader {out:?}"
        ));
    }
    expect(
        "concurrent",
        out.contains("found []")
            && !out.contains(&secret)
            && stamp(&out, "tried ", 0).is_some_and(|n| n >= 2.0),
        &b,
    )?;
    host.map_err(|e| format!("concurrent: {e}"))
}

/// Walks `roots` as uid 65534 (another local user) and reads every file it can: none may hold
/// `secret`. Returns what was readable for the message.
fn nobody_reads(roots: &[PathBuf], secret: &str) -> Result<(), String> {
    use std::os::unix::process::CommandExt as _;
    let script = format!(
        "import os, sys\nleaks = []\nfor root in {roots:?}:\n    for d, _, files in os.walk(root):\n        \
         for f in files:\n            p = os.path.join(d, f)\n            try:\n                \
         if {secret:?}.encode() in open(p, 'rb').read():\n                    leaks.append(p)\n            \
         except Exception:\n                pass\nprint(leaks)\n",
        roots = roots
            .iter()
            .map(|r| r.display().to_string())
            .collect::<Vec<_>>(),
    );
    #[expect(
        clippy::disallowed_methods,
        reason = "another local user's plain process on the host, not a sandboxed run"
    )]
    let out = std::process::Command::new("/usr/bin/python3")
        .args(["-I", "-c", &script])
        .env_clear()
        .uid(65534)
        .gid(65534)
        .current_dir("/")
        .output()
        .map_err(|e| format!("cannot run python3 as nobody: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && text.trim() == "[]" {
        Ok(())
    } else {
        Err(format!(
            "another local user read a running run's files: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A project runs its steps in order in one work directory and returns its artifacts; a step
/// past the deadline or the memory limit ends the run and the run still answers. Where only
/// snippets run, a project is refused, not dispatched.
fn project(rig: &Rig) -> Result<(), String> {
    let file = |path: &str, content: &str| ProjectFile {
        path: path.into(),
        content: content.into(),
        executable: false,
    };
    let step = |name: Option<&str>, run: &str| Step {
        name: name.map(str::to_owned),
        run: run.into(),
    };
    let spec = RunSpec::Project(Project {
        files: vec![
            file(
                "main.py",
                "print(open('data/in.txt').read().upper(), end='')\n",
            ),
            file("data/in.txt", "hello from a project\n"),
        ],
        steps: vec![
            step(Some("build"), "python3 main.py > out.txt && echo built"),
            step(
                Some("check"),
                "wc -c < out.txt; node -e 'console.log(require(\"fs\").readFileSync(\"out.txt\", \"utf8\").length)'",
            ),
        ],
        artifacts: vec!["out.txt".into(), "missing.txt".into()],
    });
    if !rig.shape.projects {
        return rig.refused("project", Ask::new(spec), Reason::Unsupported);
    }
    let r = rig.run("project", spec)?;
    let s = &r.result.steps;
    let a = &r.result.artifacts;
    expect(
        "project",
        s.len() == 2
            && s[0].exit_code == Some(0)
            && s[0].stdout.as_slice() == b"built\n"
            && s[1].stdout.as_slice() == b"21\n21\n"
            && r.result.exit_code == Some(0)
            && a.len() == 2
            && a[0].found
            && a[0].content.as_slice() == b"HELLO FROM A PROJECT\n"
            && !a[1].found,
        &r,
    )
    .map_err(|e| format!("{e} steps {s:?} artifacts {a:?}"))?;
    let sleepy = RunSpec::Project(Project {
        files: vec![],
        steps: vec![
            step(None, "echo first"),
            step(None, "sleep 60"),
            step(None, "echo never"),
        ],
        artifacts: vec![],
    });
    let r = rig.run(
        "project",
        Ask::new(sleepy).limits(Limits {
            timeout_ms: Some(3_000),
            ..limits()
        }),
    )?;
    let s = &r.result.steps;
    expect(
        "project (deadline)",
        r.result.timed_out
            && s.len() == 2
            && s[1].timed_out
            && s[0].stdout.as_slice() == b"first\n",
        &r,
    )?;
    let hungry = RunSpec::Project(Project {
        files: vec![],
        steps: vec![step(
            None,
            "node -e 'const a = []; for (;;) a.push(Buffer.alloc(1 << 20).fill(1))'",
        )],
        artifacts: vec![],
    });
    let r = rig.run(
        "project",
        Ask::new(hungry).limits(Limits {
            memory_bytes: Some(128 * MIB),
            ..limits()
        }),
    )?;
    // runsc: the whole sandbox is killed, agent included; the run's cgroup says why.
    expect(
        "project (memory)",
        !r.result.timed_out
            && r.result.oom_killed
            && (rig.shape.gvisor || r.result.steps.first().is_some_and(|s| s.oom_killed)),
        &r,
    )
}

/// A run with a grant calls the operator's API through the broker from Python and from
/// JavaScript: an allowed route answers, any other is refused, and the credential is nowhere
/// the code can see. The API sees the credential on the allowed calls only. A run without a
/// grant has no broker socket; a grant the caller is not on is refused, not dispatched.
fn grant(rig: &Rig) -> Result<(), String> {
    let seen_before = rig.api.seen().len();
    let r = rig.run(
        "grant",
        Ask::new(py(
            "import os, plimsoll_host as host\nprint(host.get('/orders/3')['path'])\ntry:\n    \
             host.get('/admin')\n    print('ADMIN ANSWERED')\nexcept host.HostError as e:\n    print('refused', e.code)\n\
             environ = open('/proc/self/environ', 'rb').read()\n\
             print('token seen', b'tok-' in environ or any('tok-' in v for v in os.environ.values()))\n",
        ))
        .grant("orders"),
    )?;
    let first = r;
    let out = stdout(&first);
    expect(
        "grant",
        out == "/orders/3\nrefused route_not_allowed\ntoken seen False\n",
        &first,
    )?;
    let r = rig.run(
        "grant",
        Ask::new(js(
            "host.get('/orders/4').then((r) => console.log(r.path)).then(() => host.get('/admin'))\n\
             .then(() => console.log('ADMIN ANSWERED'), (e) => console.log('refused', e.code))\n\
             .then(() => console.log('token seen', JSON.stringify(process.env).includes('tok-')))",
        ))
        .grant("orders"),
    )?;
    expect(
        "grant (javascript)",
        stdout(&r) == "/orders/4\nrefused route_not_allowed\ntoken seen false\n",
        &r,
    )?;
    if [&first, &r]
        .iter()
        .any(|r| stdout(r).contains(TOKEN) || stderr(r).contains(TOKEN))
    {
        return Err("grant: the credential reached the sandbox's output".into());
    }
    let seen = rig.api.seen();
    let new = &seen[seen_before..];
    if new.len() != 2
        || !new
            .iter()
            .all(|s| s.authorized && s.target.starts_with("/orders/"))
    {
        return Err(format!(
            "grant: the API should see the two allowed calls, authorised: {new:?}"
        ));
    }
    // An API that echoes the credential, in any encoding the broker searches for (base32
    // among them), has its answer withheld on every provider.
    let encodings = plimsoll_testing::api::ECHO_ENCODINGS;
    let list = encodings
        .iter()
        .map(|e| format!("'{e}'"))
        .collect::<Vec<_>>()
        .join(",");
    let r = rig.run(
        "grant",
        Ask::new(js(&format!(
            "(async () => {{ for (const e of [{list}]) {{\n\
             try {{ console.log(e, 'ok', JSON.stringify(await host.get('/echo-auth/' + e))); }}\n\
             catch (err) {{ console.log(e, err.code); }} }} }})()"
        )))
        .grant("orders"),
    )?;
    let want: String = encodings
        .iter()
        .map(|e| format!("{e} response_rejected\n"))
        .collect();
    expect("grant (echoed credential)", stdout(&r) == want, &r)?;
    if rig.shape.projects {
        let step = RunSpec::Project(Project {
            files: vec![],
            steps: vec![Step {
                name: None,
                run: "node -e 'console.log(typeof host)' && python3 -c 'import plimsoll_host; print(plimsoll_host.__name__)'".into(),
            }],
            artifacts: vec![],
        });
        let r = rig.run("grant", Ask::new(step).grant("orders"))?;
        expect(
            "grant (project step)",
            r.result
                .steps
                .first()
                .is_some_and(|s| s.stdout.as_slice() == b"object\nplimsoll_host\n"),
            &r,
        )?;
    }
    let r = rig.run(
        "grant",
        py("import os\nprint(os.environ.get('PLIMSOLL_BROKER_SOCKET'), os.path.exists('/run/plimsoll/broker.sock'))"),
    )?;
    expect("grant (none)", stdout(&r) == "None False\n", &r)?;
    rig.refused(
        "grant",
        Ask::new(py("print('RAN')")).grant("payroll"),
        Reason::Permission,
    )
}

/// An egress grant: a project's Python reaches a listed host through the broker (urllib,
/// `HTTPS_PROXY`), its result lists the receipt, a host the grant does not list is refused
/// and reaches no server, and code that skips the proxy reaches nothing. A provider that
/// carries no egress (the process tier) refuses the grant, not dispatched.
fn egress(rig: &Rig) -> Result<(), String> {
    // Beside the rig's directory, not in it: the fixture is no process of the run's.
    let dir = TestDir::new("egress-fixture", rig.provider);
    let fixture = EgressFixture::start(dir.path())?;
    let files = fixture.port("files");
    let grants = format!(
        "[profiles.orders]\nbase_url = \"{}\"\nroutes = [\"GET /orders/*\"]\ncallers = [\"{CALLER}\"]\n\
         call_budget = 20\n[profiles.orders.credential]\nkind = \"static\"\nsecret_env = \"ORDERS_API_TOKEN\"\n\
         [egress.web]\ncallers = [\"{CALLER}\"]\nhosts = [\"files.plimsoll.test\"]\nports = [{files}]\n\
         addresses = [\"127.0.0.0/8\"]\n\
         resolve = {{ \"files.plimsoll.test\" = [\"127.0.0.1\"], \"other.plimsoll.test\" = [\"127.0.0.1\"] }}\n",
        rig.api.url()
    );
    let grants = GrantProfiles::parse(&grants, |name| {
        (name == "ORDERS_API_TOKEN").then(|| TOKEN.to_owned())
    })
    .map_err(|e| format!("egress: the grants: {e}"))?;
    rig.engine.replace_grants(grants);
    if !rig.shape.projects {
        let req = rig.request("egress", Ask::new(py("print('RAN')")).grant("web"));
        return match rig.engine.run(CALLER, &req) {
            Err(e)
                if not_dispatched_reason(&e) == Some(Reason::Unsupported)
                    && e.to_string().contains("egress") =>
            {
                rig.nothing_left("egress")
            }
            other => Err(format!("egress: not refused for want of egress: {other:?}")),
        };
    }
    let fetch = |url: &str| {
        format!(
            "import urllib.request as u\ntry:\n    print(u.urlopen('{url}', timeout=20).read().decode().strip())\n\
             except Exception as e:\n    print('refused', type(e).__name__)\n"
        )
    };
    let code = format!(
        "{}{}import socket\ntry:\n    socket.create_connection(('127.0.0.1', {files}), timeout=3)\n    print('DIRECT')\n\
         except OSError as e:\n    print('direct refused')\n",
        fetch(&format!("https://files.plimsoll.test:{files}/hello.txt")),
        fetch(&format!("https://other.plimsoll.test:{files}/hello.txt")),
    );
    let spec = RunSpec::Project(Project {
        files: vec![
            ProjectFile {
                path: "ca.pem".into(),
                content: fixture.ca_pem().as_str().into(),
                executable: false,
            },
            ProjectFile {
                path: "fetch.py".into(),
                content: code.as_str().into(),
                executable: false,
            },
        ],
        steps: vec![Step {
            name: None,
            run: "SSL_CERT_FILE=/work/ca.pem python3 fetch.py".into(),
        }],
        artifacts: vec![],
    });
    let r = rig.run("egress", Ask::new(spec).grant("web"))?;
    let out = r
        .result
        .steps
        .first()
        .map(|s| String::from_utf8_lossy(s.stdout.as_slice()).into_owned())
        .unwrap_or_default();
    expect(
        "egress",
        out == "egress-ok\nrefused URLError\ndirect refused\n",
        &r,
    )?;
    let seen: Vec<(&str, &str, &str, Option<&str>)> = r
        .result
        .egress
        .iter()
        .map(|x| {
            (
                x.host.as_str(),
                x.verdict.as_str(),
                x.rule.as_str(),
                x.ended.as_deref(),
            )
        })
        .collect();
    let rule = format!("host files.plimsoll.test port {files} via 127.0.0.0/8");
    if seen
        != [
            (
                "files.plimsoll.test",
                "allowed",
                rule.as_str(),
                Some("closed"),
            ),
            ("other.plimsoll.test", "refused", "host_not_allowed", None),
        ]
    {
        return Err(format!("egress: the receipts are {seen:?}"));
    }
    let connected = fixture.connections("files");
    if connected != 1 {
        return Err(format!(
            "egress: the file server saw {connected} connections, not the allowed one alone"
        ));
    }
    Ok(())
}

/// A floor above what the provider gives is refused, and nothing runs.
/// A sandbox gives one run: a run leaves a marker in its work directory (a hidden one too),
/// in each directory the sandbox has of its own (`/tmp`, `/dev/shm`) and in its
/// interpreter's globals, and no later run, of either language, sees any of them. In a warm
/// rig the later runs are members made after the first was claimed.
fn used_once(rig: &Rig) -> Result<(), String> {
    let dirs = format!("{:?}", rig.shape.own_dirs);
    let leave = [
        js(&format!(
            "const fs = require('fs'); fs.writeFileSync('marker', 'x'); fs.mkdirSync('.hidden'); \
             fs.writeFileSync('.hidden/marker', 'x'); \
             for (const d of {dirs}) fs.writeFileSync(d + '/plimsoll-marker', 'x'); \
             globalThis.plimsoll_marker = 1; console.log('left')"
        )),
        py(&format!(
            "import os, builtins\nopen('marker', 'w').write('x')\nos.mkdir('.hidden')\n\
             open('.hidden/marker', 'w').write('x')\n\
             for d in {dirs}:\n    open(d + '/plimsoll-marker', 'w').write('x')\n\
             builtins.plimsoll_marker = 1\nprint('left')"
        )),
    ];
    let look = [
        (
            js(&format!(
                "const fs = require('fs'); console.log(JSON.stringify({{files: fs.readdirSync('.'), \
                 seen: {dirs}.filter(d => fs.existsSync(d + '/plimsoll-marker')), \
                 global: typeof globalThis.plimsoll_marker}}))"
            )),
            r#"{"files":[],"seen":[],"global":"undefined"}"#,
        ),
        (
            py(&format!(
                "import os, builtins, json\nprint(json.dumps({{'files': sorted(os.listdir('.')), \
                 'seen': [d for d in {dirs} if os.path.exists(d + '/plimsoll-marker')], \
                 'global': hasattr(builtins, 'plimsoll_marker')}}, separators=(',', ':')))"
            )),
            r#"{"files":[],"seen":[],"global":false}"#,
        ),
    ];
    for spec in leave {
        let r = rig.run("used_once", spec)?;
        expect(
            "used_once (leave)",
            r.result.exit_code == Some(0) && stdout(&r) == "left\n",
            &r,
        )?;
        for (spec, clean) in look.clone() {
            if rig.warm {
                idle_members(&rig.engine)?;
            }
            let r = rig.run("used_once", spec)?;
            expect(
                "used_once (a later run sees nothing of it)",
                r.result.exit_code == Some(0)
                    && stdout(&r).trim_end() == clean
                    && (!rig.warm || r.result.start == Some(plimsoll_wire::Start::Warm)),
                &r,
            )?;
        }
    }
    Ok(())
}

fn refusal(rig: &Rig) -> Result<(), String> {
    let Some(above) = [Tier::Container, Tier::Kernel, Tier::Vm]
        .into_iter()
        .find(|t| *t > rig.tier)
    else {
        return Ok(());
    };
    let mut req = rig.request("refusal", Ask::new(py("print('RAN')")));
    req.minimum_isolation = Some(above);
    match rig.engine.run(CALLER, &req) {
        Err(e @ RunError::Refused { .. }) => {
            if not_dispatched_reason(&e) != Some(Reason::Isolation) {
                return Err(format!("refusal: not an isolation refusal: {e}"));
            }
            if rig.engine.in_flight() != 0 {
                return Err("refusal: a run is still in flight".into());
            }
            rig.nothing_left("refusal")
        }
        other => Err(format!(
            "refusal: a floor of {above} on {} was not refused: {other:?}",
            rig.tier
        )),
    }
}

/// Starts a launcher hosting the settings' providers for this process's uid, on a thread;
/// its socket, in a directory any uid may reach (so that the launcher's own check of its
/// peer is what refuses another uid), and that directory.
fn start_launcher(settings: &Settings) -> (PathBuf, tempfile::TempDir) {
    let at = tempfile::Builder::new()
        .prefix("plimsoll-launch")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(at.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = at.path().join("launch.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    let launcher = settings
        .build_launcher(&[], rustix::process::geteuid().as_raw())
        .unwrap_or_else(|e| panic!("{e}"));
    let launcher = std::sync::Arc::new(launcher);
    std::thread::spawn(move || launcher.serve(listener));
    (socket, at)
}

/// One request to the launcher at `socket`, written as JSON, and its answer (events before
/// it are skipped); for a run whose teardown waits, the teardown is asked for too.
fn launch_raw(
    socket: &std::path::Path,
    request: &serde_json::Value,
) -> Result<serde_json::Value, String> {
    use std::io::{Read as _, Write as _};
    let mut s = std::os::unix::net::UnixStream::connect(socket).map_err(|e| e.to_string())?;
    let send = |s: &mut std::os::unix::net::UnixStream, v: &serde_json::Value| {
        let body = serde_json::to_vec(v).unwrap();
        s.write_all(&(body.len() as u32).to_be_bytes())?;
        s.write_all(&body)
    };
    let recv = |s: &mut std::os::unix::net::UnixStream| -> std::io::Result<serde_json::Value> {
        let mut len = [0u8; 4];
        s.read_exact(&mut len)?;
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut body)?;
        serde_json::from_slice(&body).map_err(std::io::Error::other)
    };
    send(&mut s, request).map_err(|e| e.to_string())?;
    loop {
        let event = recv(&mut s).map_err(|e| e.to_string())?;
        let Some(answer) = event.get("answer") else {
            continue;
        };
        if answer["ran"]["Ok"]["teardown"] == serde_json::json!(true) {
            send(&mut s, &serde_json::json!("tear_down")).map_err(|e| e.to_string())?;
            let done = recv(&mut s).map_err(|e| e.to_string())?;
            if done["answer"]["done"] != serde_json::json!({"Ok": null}) {
                return Err(format!("the teardown: {done}"));
            }
        }
        return Ok(answer.clone());
    }
}

/// The launcher refuses what the settings do not allow, and does nothing for it: another
/// uid's connection, a plan naming a uid, a run directory, an image or limits outside the
/// settings, privileges its steps do not call for, or a field the plan type has not (a
/// mount). The same plan unspoilt runs, so each refusal is the field's.
fn launcher_refuses(rig: &Rig) -> Result<(), String> {
    use plimsoll_wire::launch::{LaunchRequest, Plan, PlanImage, PlanLimits, PlanPrivileges};
    type Spoil<'a> = Box<dyn Fn(&mut Plan) + 'a>;
    let socket = rig
        .launch_socket
        .as_ref()
        .ok_or("launcher_refuses: not a split rig")?;
    let image = rig.image.as_ref().map(|_| {
        let dir = plimsoll_engine::settings::default_image_dir();
        let identity = std::fs::read_to_string(dir.join("identity")).unwrap_or_default();
        PlanImage {
            name: "sandbox".into(),
            identity: identity.trim().to_owned(),
            rootfs: dir.join("rootfs"),
            disk: Some(dir.join("disk.ext4")).filter(|d| rig.provider == "qemu" && d.is_file()),
            named: false,
        }
    });
    // Run ids are the host's: each test process's own.
    let id = |name: &str| format!("b{}-{name}", std::process::id());
    let plan = |name: &str| Plan {
        run_id: id(name),
        request_id: "launcher_refuses".into(),
        spec: py("print('RAN', 6 * 7)"),
        limits: PlanLimits {
            timeout_ms: 60_000,
            memory_bytes: 1024 * MIB,
            output_bytes: MIB,
            pids: 64,
            disk_bytes: 64 * MIB,
            artifact_bytes: MIB,
        },
        uid: rig.run_uids.start,
        gid: rig.run_uids.start,
        controller_uid: rig.run_uids.start + 2,
        controller_gid: rig.run_uids.start + 2,
        run_dir: rig.state.join("runs").join(id(name)),
        broker: None,
        privileges: PlanPrivileges::Unprivileged,
        tap: false,
        image: image.clone(),
    };
    let request = |plan: Plan| {
        serde_json::to_value(LaunchRequest::Run {
            provider: rig.provider.to_owned(),
            plan,
        })
        .unwrap()
    };
    // The plan as the engine would make it runs.
    let ok = launch_raw(socket, &request(plan("bounds-ok")))?;
    let stdout = ok["ran"]["Ok"]["result"]["stdout"].to_string();
    if !stdout.contains("RAN 42") {
        return Err(format!(
            "launcher_refuses: the plan within the settings did not run: {ok}"
        ));
    }
    rig.nothing_left("launcher_refuses")?;
    let spoilt: Vec<(&str, Spoil<'_>)> = vec![
        ("uid 0", Box::new(|p| p.uid = 0)),
        (
            "uid outside the range",
            Box::new(|p| p.uid = rig.uids.end.max(rig.pool_uids.end)),
        ),
        ("controller uid 0", Box::new(|p| p.controller_uid = 0)),
        (
            "run directory elsewhere",
            Box::new(|p| p.run_dir = "/etc".into()),
        ),
        (
            "memory over the maximum",
            Box::new(|p| p.limits.memory_bytes = u64::MAX),
        ),
        (
            "trial privileges",
            Box::new(|p| p.privileges = PlanPrivileges::TrialRunner),
        ),
        (
            "an image outside the store",
            Box::new(|p| {
                p.image = Some(PlanImage {
                    name: "host".into(),
                    identity: "sha256:00".into(),
                    rootfs: "/".into(),
                    disk: None,
                    named: true,
                })
            }),
        ),
    ];
    for (i, (what, spoil)) in spoilt.iter().enumerate() {
        let run_id = format!("bounds-{i}");
        let mut p = plan(&run_id);
        spoil(&mut p);
        let answer = launch_raw(socket, &request(p))?;
        let Some(why) = answer["refused"].as_str() else {
            return Err(format!(
                "launcher_refuses: {what} was not refused: {answer}"
            ));
        };
        if !why.contains("outside the settings") {
            return Err(format!(
                "launcher_refuses: {what}: refused for another reason: {why}"
            ));
        }
        if rig.state.join("runs").join(id(&run_id)).exists() {
            return Err(format!(
                "launcher_refuses: {what}: its run directory was made"
            ));
        }
    }
    // A uid another sandbox of the launcher holds: a run still going, or an idle member.
    let busy = rig.run_uids.start + 1;
    let long = {
        let mut p = plan("bounds-long");
        p.uid = busy;
        p.gid = busy;
        p.controller_uid = busy + 2;
        p.controller_gid = busy + 2;
        p.spec = py("import time; time.sleep(6); print('RAN', 6 * 7)");
        request(p)
    };
    let socket_for_long = socket.clone();
    let long = std::thread::spawn(move || launch_raw(&socket_for_long, &long));
    let started = std::time::Instant::now();
    // Under way once a process runs as its uid.
    let runs_as = |uid: u32| {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                std::fs::read_to_string(e.path().join("status")).is_ok_and(|st| {
                    st.lines()
                        .find(|l| l.starts_with("Uid:"))
                        .is_some_and(|l| l.split_whitespace().nth(1) == Some(&uid.to_string()))
                })
            })
    };
    // (gVisor's processes are the Sentry's, not the host's: there, two seconds; the launcher
    // holds the uid from the request's arrival, and the run sleeps for six.)
    while !runs_as(busy) && started.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut held_uids = vec![busy];
    held_uids.extend(rig.engine.pool_uids_held());
    for uid in held_uids {
        let mut p = plan("bounds-held");
        p.uid = uid;
        p.gid = uid;
        let answer = launch_raw(socket, &request(p))?;
        match answer["refused"].as_str() {
            Some(why) if why.contains("held by another sandbox") => {}
            _ => {
                let long = long.join().unwrap();
                return Err(format!(
                    "launcher_refuses: uid {uid}, held, was not refused: {answer}; the run holding it: {long:?}"
                ));
            }
        }
    }
    let long = long.join().unwrap()?;
    if !long["ran"]["Ok"]["result"]["stdout"]
        .to_string()
        .contains("RAN 42")
    {
        return Err(format!(
            "launcher_refuses: the long run did not run: {long}"
        ));
    }
    // A warm member's plan is held to the same bounds.
    for (what, uid, run_dir) in [
        (
            "a member as uid 0",
            0,
            rig.state.join("runs").join(id("bounds-member")),
        ),
        (
            "a member elsewhere",
            rig.run_uids.start,
            PathBuf::from("/etc"),
        ),
    ] {
        let member = serde_json::json!({"warm": {"provider": rig.provider, "plan": {
            "member_id": id("bounds-member"), "language": "python", "memory_bytes": 256 * MIB,
            "pids": 64, "disk_bytes": 64 * MIB, "uid": uid, "gid": uid, "run_dir": run_dir,
            "max_timeout_ms": 60_000, "image": image,
        }}});
        let answer = launch_raw(socket, &member)?;
        match answer["refused"].as_str() {
            Some(why) if why.contains("outside the settings") => {}
            _ => {
                return Err(format!(
                    "launcher_refuses: {what} was not refused: {answer}"
                ));
            }
        }
    }
    // A mount: a field the plan type has not.
    let mut mounted = request(plan("bounds-mount"));
    mounted["run"]["plan"]["mounts"] = serde_json::json!([{"source": "/", "target": "/host"}]);
    let answer = launch_raw(socket, &mounted)?;
    match answer["refused"].as_str() {
        Some(why) if why.contains("unknown field `mounts`") => {}
        _ => {
            return Err(format!(
                "launcher_refuses: a plan with a mount was not refused: {answer}"
            ));
        }
    }
    // Another uid: a client run as nobody gets a refusal, not a description (the launcher
    // answers before it reads anything and closes, so the client's send may find it gone).
    use plimsoll_sandbox::{PreExec, Step};
    use std::io::Read as _;
    let running = plimsoll_sandbox::Spawn::new("/usr/bin/python3", "/")
        .arg("-c")
        .arg(
            "import json, socket, struct, sys\n\
             s = socket.socket(socket.AF_UNIX)\n\
             s.connect(sys.argv[1])\n\
             b = json.dumps('describe').encode()\n\
             try: s.sendall(struct.pack('>I', len(b)) + b)\n\
             except BrokenPipeError: pass\n\
             n = struct.unpack('>I', s.recv(4, socket.MSG_WAITALL))[0]\n\
             print(s.recv(n, socket.MSG_WAITALL).decode())\n",
        )
        .arg(socket)
        .before_exec(
            PreExec::new()
                .step("groups", Step::DropGroups)
                .step(
                    "gid",
                    Step::SetGids(Some(65_534), Some(65_534), Some(65_534)),
                )
                .step(
                    "uid",
                    Step::SetUids(Some(65_534), Some(65_534), Some(65_534)),
                ),
        )
        .spawn()
        .map_err(|e| format!("launcher_refuses: python3: {e}"))?;
    let (mut stdout, mut stderr) = (String::new(), String::new());
    let mut pipe = running.stdout;
    let _ = pipe.read_to_string(&mut stdout);
    let mut pipe = running.stderr;
    let _ = pipe.read_to_string(&mut stderr);
    let mut child = running.child;
    let _ = child.wait();
    let out = (stdout, stderr);
    let said = &out.0;
    if !said.contains("is not the serving process's uid") || said.contains("described") {
        return Err(format!(
            "launcher_refuses: a connection from uid 65534 was not refused: {said} {}",
            out.1
        ));
    }
    rig.nothing_left("launcher_refuses")
}

/// A session through the launcher: cells keep their state, a cell under way is cancelled
/// and the session goes on (its next cell restarts the interpreter), and closing it leaves
/// nothing (the process tier keeps none: the
/// open is refused, not dispatched).
fn session(rig: &Rig) -> Result<(), String> {
    use plimsoll_engine::SessionCallKind;
    use plimsoll_wire::SessionOpenRequest;
    let open = SessionOpenRequest {
        protocol: PROTOCOL,
        request_id: "session-open".into(),
        language: Language::Python,
        minimum_isolation: None,
        provider: Some(rig.provider.into()),
        grant: None,
        limits: None,
        idle_timeout_ms: None,
        max_lifetime_ms: None,
        image: None,
    };
    let opened = rig.engine.open_session(CALLER, &open);
    if rig.provider == "process" {
        return match opened {
            Err(e) if not_dispatched_reason(&e) == Some(Reason::Unsupported) => {
                rig.nothing_left("session")
            }
            other => Err(format!(
                "session: the process tier opened a session: {other:?}"
            )),
        };
    }
    let info = opened.map_err(|e| format!("session: the open failed: {e}"))?;
    let cell = |n: &str,
                code: &str,
                restart: bool,
                cancel: Option<std::sync::Arc<plimsoll_engine::Cancel>>| {
        let req = rig.request(&format!("session-{n}"), Ask::new(py(code)));
        let req = RunRequest {
            limits: None,
            provider: None,
            ..req
        };
        rig.engine.session_call_with(
            CALLER,
            &info.session_id,
            &req,
            SessionCallKind::Cell { restart },
            &mut |_| {},
            cancel,
        )
    };
    let r = cell("a", "x = 41", false, None).map_err(|e| format!("session: cell a: {e}"))?;
    expect("session", r.result.exit_code == Some(0), &r)?;
    let r = cell("b", "print(x + 1)", false, None).map_err(|e| format!("session: cell b: {e}"))?;
    expect("session", stdout(&r) == "42\n", &r)?;
    let cancel = plimsoll_engine::Cancel::new();
    let later = std::sync::Arc::clone(&cancel);
    let canceller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(2));
        later.cancel();
    });
    let started = std::time::Instant::now();
    let r = cell(
        "c",
        "import time\nprint('waiting', flush=True)\ntime.sleep(60)",
        false,
        Some(cancel),
    )
    .map_err(|e| format!("session: cell c: {e}"))?;
    canceller.join().unwrap();
    expect(
        "session",
        r.result.signal.is_some()
            && !r.result.timed_out
            && started.elapsed() < Duration::from_secs(45),
        &r,
    )?;
    let r = cell("d", "print('after', 6 * 7)", true, None)
        .map_err(|e| format!("session: cell d: {e}"))?;
    expect("session", stdout(&r) == "after 42\n", &r)?;
    rig.engine
        .close_session(CALLER, &info.session_id, None)
        .map_err(|e| format!("session: the close failed: {e}"))?;
    rig.nothing_left("session")
}

/// One case at one provider, on a rig of its own (uids, state, cgroup parent), so cases run
/// side by side and one's failure is its own test's.
fn conformance(provider: &'static str, slot: u32, name: &str, case: Case) {
    let Some(rig) = rig(provider, slot, name) else {
        return;
    };
    let start = std::time::Instant::now();
    let mut outcome = case(&rig);
    // A warm rig's case ran on members (every case with a snippet at the suite's limits; a
    // project, a refusal and egress, which serves projects, claim none).
    let claimed = rig
        .engine
        .pool_counts()
        .claimed
        .load(std::sync::atomic::Ordering::SeqCst);
    if rig.warm
        && outcome.is_ok()
        && claimed == 0
        && ![
            "project",
            "refusal",
            "egress",
            "launcher_refuses",
            "session",
        ]
        .contains(&name)
    {
        outcome = Err(format!("{name}: no run claimed a warm member"));
    }
    if rig.warm {
        eprintln!("conformance {provider}: {name}: {claimed} runs on warm members");
    }
    eprintln!(
        "conformance {provider}: {name} {} in {:?}",
        if outcome.is_ok() { "passed" } else { "FAILED" },
        start.elapsed()
    );
    if let Err(e) = outcome {
        panic!("{provider} failed {name}:\n{e}");
    }
}

/// A test per case and provider, named `<provider>::<case>`; a provider's rigs get the uid
/// slots `index * 32 + case`.
macro_rules! suite {
    (providers: [$($provider:ident => $index:expr),* $(,)?], cases: $cases:tt $(,)?) => {
        $( suite!(@provider $provider, $index, $cases); )*
    };
    (@provider $provider:ident, $index:expr, [$($case:ident),* $(,)?]) => {
        mod $provider {
            const CASES: &[&str] = &[$(stringify!($case)),*];
            $(
                #[test]
                fn $case() {
                    let at = CASES.iter().position(|c| *c == stringify!($case)).unwrap();
                    super::conformance(
                        stringify!($provider),
                        $index * 32 + at as u32,
                        stringify!($case),
                        super::$case,
                    );
                }
            )*
        }
    };
}

suite! {
    // One line per provider.
    providers: [
        process => 0,
        crun => 1,
        runc => 2,
        runsc => 3,
        qemu => 4,
        process_warm => 5,
        crun_warm => 6,
        runc_warm => 7,
        runsc_warm => 8,
        qemu_warm => 9,
        crun_image => 10,
        runc_image => 11,
        runsc_image => 12,
        qemu_image => 13,
    ],
    cases: [
        identity,
        host_files,
        writes_outside_work,
        network,
        environment,
        namespaces,
        fork_bomb,
        memory,
        disk,
        inodes,
        timeout,
        outlive,
        output_cap,
        raw_output,
        concurrent,
        project,
        grant,
        egress,
        refusal,
        used_once,
    ],
}

suite! {
    // Each provider hosted by a launcher, reached over its socket: every case above, and
    // what the launcher must refuse.
    providers: [
        process_split => 14,
        crun_split => 15,
        runsc_split => 16,
        qemu_split => 17,
        process_warm_split => 18,
        crun_warm_split => 19,
        runsc_warm_split => 20,
    ],
    cases: [
        identity,
        host_files,
        writes_outside_work,
        network,
        environment,
        namespaces,
        fork_bomb,
        memory,
        disk,
        inodes,
        timeout,
        outlive,
        output_cap,
        raw_output,
        concurrent,
        project,
        grant,
        egress,
        refusal,
        used_once,
        launcher_refuses,
        session,
    ],
}
