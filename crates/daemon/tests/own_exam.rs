//! An exam author's own simulator, written from docs/simulators.md alone, examined through a
//! real plimsolld in an image imported the way `plimsoll image import` imports one.
//!
//! The simulator (a room heated by a lagging electric heater, C, in this file) is not in the
//! repository: it is compiled here with clang and wasm-ld, put with an index declaring only it
//! into a copy of the default image's root file system (hard links, so the 220 MB are not
//! copied), packed as an OCI archive and imported into a temporary image store. A daemon over
//! that store (crun, and runsc where available) then examines Python controllers on hidden
//! scenarios through the Rust client: the accepted one passes twice with equal fingerprints,
//! the failing one fails with the simulator's own reason, one that never reaches the set point
//! scores below `min_score`, a scenario the simulator refuses starts no controller, and the
//! default image's cart-pole is refused in this image. Each trajectory is replayed here
//! against the same equations, bit for bit.
//!
//! Needs root, crun, clang and wasm-ld, skopeo and umoci, and the built default image
//! (`make images`); without them the test prints SKIP (and fails under CI=true).

use std::fs;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use plimsoll_client::{Client, ClientError, RunOptions, Token};
use plimsoll_sandbox::{CaptureLimits, Spawn, capture};
use plimsoll_test_daemon::TestDaemon;
use plimsoll_testing::{TestDir, is_root, skip_or_fail, workspace_root};
use plimsoll_wire::digest::sha256_hex;
use plimsoll_wire::simulators::SimulatorEntry;
use plimsoll_wire::{
    Bytes, ProjectFile, Reason, RunResponse, SimulatorRef, Tier, TrialEnd, not_dispatched_reason,
};
use serde_json::{Value, json};

/// The simulator, written from docs/simulators.md (the ABI, the metadata, the ends) alone.
const ROOM_C: &str = r##"/* room: a room heated by an electric heater (plimsoll-sim/1).
 *
 *   C dT/dt   = q - G (T - T_out)   the room's air and walls, one thermal mass
 *   tau dq/dt = P_max u - q         the heater's output lags its command u in [0, 1]
 *
 * explicit Euler, one tick = 1 s. Fails above 30 C or below 0 C. Scores the fraction of
 * ticks within 0.5 C of the set point.
 */
#define DT 1.0
#define C_ROOM 20000.0  /* J/K */
#define G_LOSS 100.0    /* W/K */
#define P_MAX 4000.0    /* W */
#define TAU 20.0        /* s */
#define T_HOT 30.0
#define T_FROZEN 0.0
#define BAND 0.5

static const char META[] =
    "{\"abi\":1,\"name\":\"room\",\"version\":\"0.1.0\","
    "\"description\":\"A room of 20 kJ/K losing 100 W/K to the outside, heated by a 4 kW "
    "heater whose output lags its command by 20 s. Fails above 30 C or below 0 C; scores "
    "the fraction of ticks within 0.5 C of the set point.\","
    "\"ticks_per_second\":1,"
    "\"state\":[{\"name\":\"temp\",\"unit\":\"C\"},{\"name\":\"heater\",\"unit\":\"W\"},"
    "{\"name\":\"setpoint\",\"unit\":\"C\"},{\"name\":\"outside\",\"unit\":\"C\"}],"
    "\"action\":[{\"name\":\"power\",\"unit\":\"1\",\"min\":0,\"max\":1}],"
    "\"initial\":[{\"name\":\"temp\",\"unit\":\"C\"},{\"name\":\"setpoint\",\"unit\":\"C\"},"
    "{\"name\":\"outside\",\"unit\":\"C\"}],"
    "\"score\":{\"name\":\"time_in_band\",\"unit\":\"1\"}}";

static double buf[4] __attribute__((aligned(8)));
static double temp, heater, setpoint, outside;
static unsigned long long steps, in_band;
static const char *why = "";

#define EXPORT(name) __attribute__((export_name(name)))

EXPORT("plimsoll_sim_abi") int sim_abi(void) { return 1; }
EXPORT("metadata") int metadata(void) { return (int)META; }
EXPORT("buffer") int buffer(void) { return (int)buf; }
EXPORT("reason") int reason(void) { return (int)why; }

/* Written as "inside", so that a NaN is never inside. */
static int inside(double v, double lo, double hi) { return v >= lo && v <= hi; }

EXPORT("init") int init(void) {
    double t = buf[0], sp = buf[1], out = buf[2];
    if (!inside(t, 5.0, 28.0)) {
        why = "the room must start between 5 C and 28 C";
        return 1;
    }
    if (!inside(sp, 10.0, 26.0)) {
        why = "the set point must be between 10 C and 26 C";
        return 1;
    }
    if (!inside(out, -30.0, 25.0)) {
        why = "the outside must be between -30 C and 25 C";
        return 1;
    }
    if (!(out <= sp)) {
        why = "a heater cannot hold a set point below the outside temperature";
        return 1;
    }
    temp = t;
    setpoint = sp;
    outside = out;
    heater = 0.0;
    steps = 0;
    in_band = 0;
    why = "";
    return 0;
}

EXPORT("step") int step(void) {
    double u = buf[0];
    double dtemp = (heater - G_LOSS * (temp - outside)) / C_ROOM;
    double dheater = (P_MAX * u - heater) / TAU;
    temp = temp + DT * dtemp;
    heater = heater + DT * dheater;
    steps = steps + 1;
    double err = temp - setpoint;
    if (err <= BAND && err >= -BAND)
        in_band = in_band + 1;
    if (!(temp <= T_HOT)) {
        why = "the room overheated above 30 C";
        return 1;
    }
    if (!(temp >= T_FROZEN)) {
        why = "the room froze below 0 C";
        return 1;
    }
    return 0;
}

EXPORT("state") double state(int i) {
    switch (i) {
    case 0: return temp;
    case 1: return heater;
    case 2: return setpoint;
    case 3: return outside;
    default: return 0.0;
    }
}

EXPORT("score") double score(void) {
    return steps == 0 ? 0.0 : (double)in_band / (double)steps;
}
"##;

/// The same equations as `ROOM_C`, in the same order, to replay a trajectory.
mod room {
    pub const G_LOSS: f64 = 100.0;
    pub const C_ROOM: f64 = 20000.0;
    pub const P_MAX: f64 = 4000.0;
    pub const TAU: f64 = 20.0;
    pub const DT: f64 = 1.0;
    pub const BAND: f64 = 0.5;

    /// `[temp, heater, setpoint, outside]` after one tick under `power` (clamped to [0, 1]
    /// as the runner clamps it); true when the trial failed there.
    pub fn step(s: [f64; 4], power: f64) -> ([f64; 4], bool) {
        let [temp, heater, setpoint, outside] = s;
        let u = power.clamp(0.0, 1.0);
        let dtemp = (heater - G_LOSS * (temp - outside)) / C_ROOM;
        let dheater = (P_MAX * u - heater) / TAU;
        let temp = temp + DT * dtemp;
        let heater = heater + DT * dheater;
        let failed = !(0.0..=30.0).contains(&temp);
        ([temp, heater, setpoint, outside], failed)
    }

    pub fn in_band(s: [f64; 4]) -> bool {
        let err = s[0] - s[2];
        (-BAND..=BAND).contains(&err)
    }
}

/// The accepted controller: feed-forward of the heat the room loses at its set point, plus a
/// proportional term.
const ACCEPTED_PY: &str = "import sys

for line in sys.stdin:
    temp, heater, setpoint, outside = map(float, line.split())
    hold = 100.0 * (setpoint - outside) / 4000.0
    power = hold + 0.2 * (setpoint - temp)
    print(repr(min(1.0, max(0.0, power))), flush=True)
";

/// Full power, always: warms fast and never stops.
const FAILING_PY: &str = "import sys

for line in sys.stdin:
    print('1', flush=True)
";

/// Too little power, always: never fails, never reaches the set point.
const LAZY_PY: &str = "import sys

for line in sys.stdin:
    print('0.3', flush=True)
";

const NAME: &str = "room";
const IMAGE: &str = "room-exam";

/// A hidden scenario: name, initial values (temp, setpoint, outside), ticks, pass_ticks,
/// min_score.
struct Scenario {
    name: &'static str,
    initial: [f64; 3],
    ticks: u64,
    pass_ticks: u64,
    min_score: Option<f64>,
}

impl Scenario {
    fn json(&self) -> Value {
        let [temp, setpoint, outside] = self.initial;
        let mut v = json!({
            "name": self.name,
            "initial": {"temp": temp, "setpoint": setpoint, "outside": outside},
            "ticks": self.ticks,
            "pass_ticks": self.pass_ticks,
        });
        if let Some(m) = self.min_score {
            v["min_score"] = json!(m);
        }
        v
    }
}

const COLD_MORNING: Scenario = Scenario {
    name: "cold-morning",
    initial: [15.0, 21.0, 5.0],
    ticks: 300,
    pass_ticks: 300,
    min_score: Some(0.6),
};
const MILD_EVENING: Scenario = Scenario {
    name: "mild-evening",
    initial: [19.0, 20.0, 12.0],
    ticks: 200,
    pass_ticks: 200,
    min_score: Some(0.6),
};
/// Held 100 ticks is a pass, whatever happens after.
const SHORT_MARK: Scenario = Scenario {
    name: "short-mark",
    initial: [15.0, 21.0, 5.0],
    ticks: 300,
    pass_ticks: 100,
    min_score: None,
};
/// A set point the simulator's `init` refuses.
const SAUNA: Scenario = Scenario {
    name: "sauna",
    initial: [15.0, 35.0, 5.0],
    ticks: 300,
    pass_ticks: 300,
    min_score: None,
};

fn file(path: &str, content: &[u8]) -> ProjectFile {
    ProjectFile {
        path: path.into(),
        content: Bytes(content.to_vec()),
        executable: false,
    }
}

/// A trial run: `controller` against `scenarios`, at `provider`, in the imported image;
/// `simulator` is what the step says of the simulator (`--simulator NAME [...]`).
fn trial(provider: &str, simulator: &str, controller: &str, scenarios: &[&Scenario]) -> RunOptions {
    let mut files = vec![file("controller.py", controller.as_bytes())];
    let mut step = format!("plimsoll-trial-runner {simulator}");
    let mut artifacts = Vec::new();
    for s in scenarios {
        files.push(file(
            &format!("{}.json", s.name),
            s.json().to_string().as_bytes(),
        ));
        step.push_str(&format!(
            " --scenario {0}.json --trajectory {0}.bin",
            s.name
        ));
        artifacts.push(format!("{}.bin", s.name));
    }
    // The deadlines are outside the fingerprint; generous ones keep a loaded host from
    // turning into a controller timeout.
    step.push_str(
        " --first-deadline-ms 20000 --tick-deadline-ms 5000 --reproducible -- python3 controller.py",
    );
    let artifacts: Vec<&str> = artifacts.iter().map(String::as_str).collect();
    RunOptions::new(plimsoll_testing::project(files, &[&step], &artifacts))
        .image(IMAGE)
        .provider(provider)
        .min_isolation(Tier::Container)
        .timeout_ms(120_000)
}

fn explain(r: &RunResponse) -> String {
    let step = r.result.steps.first();
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        r.result.exit_code,
        step.map(|s| s.stdout.to_string_lossy()).unwrap_or_default(),
        step.map(|s| s.stderr.to_string_lossy()).unwrap_or_default(),
    )
}

/// Sends `options`, printing how long the answer took.
fn timed(
    client: &Client,
    what: &str,
    options: RunOptions,
    figures: &mut Vec<(String, Duration)>,
) -> Result<RunResponse, ClientError> {
    let start = Instant::now();
    let r = client.run(options);
    let took = start.elapsed();
    eprintln!("own_exam: {what}: {} ms", took.as_millis());
    figures.push((what.to_owned(), took));
    r
}

/// The verdict (the trial step's stdout).
fn verdict(r: &RunResponse) -> Value {
    let step = &r.result.steps[0];
    serde_json::from_slice(step.stdout.as_slice())
        .unwrap_or_else(|e| panic!("no verdict ({e}): {}", explain(r)))
}

/// Checks one trial of a run against an independent replay of its trajectory: every state
/// the controller was shown is the equations' (bit for bit), as are the end, the tick of a
/// failure, the final state and the score; the verdict's fingerprint is the trajectory's
/// SHA-256, and the record says the same as the verdict. Returns the fingerprint.
fn check_trial(r: &RunResponse, i: usize, s: &Scenario) -> String {
    let v = &verdict(r)["trials"][i];
    let record = &r.record.trials[0].trials[i];
    let artifact = &r.result.artifacts[i];
    assert!(artifact.found && !artifact.truncated, "{artifact:?}");
    let bytes = artifact.content.as_slice();
    let fingerprint = sha256_hex(bytes);
    assert_eq!(v["fingerprint"], fingerprint.as_str(), "{v}");
    assert_eq!(record.fingerprint, fingerprint);
    assert_eq!(v["name"], s.name);
    assert_eq!(record.scenario.as_deref(), Some(s.name));

    // One record per tick: four state values and one action, little-endian binary64.
    assert_eq!(bytes.len() % 40, 0);
    assert_eq!(v["trajectory_bytes"], bytes.len());
    let values: Vec<f64> = bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let [temp, setpoint, outside] = s.initial;
    let mut state = [temp, 0.0, setpoint, outside];
    let (mut ticks, mut in_band, mut failed) = (0u64, 0u64, false);
    for rec in values.chunks_exact(5) {
        assert!(!failed, "a record after the failure");
        let shown: Vec<u64> = rec[..4].iter().map(|x| x.to_bits()).collect();
        let model: Vec<u64> = state.iter().map(|x| x.to_bits()).collect();
        assert_eq!(
            shown, model,
            "{}: tick {ticks}: {rec:?} vs {state:?}",
            s.name
        );
        (state, failed) = room::step(state, rec[4]);
        ticks += 1;
        in_band += u64::from(room::in_band(state));
    }
    assert_eq!(v["ticks"], ticks);
    assert_eq!(record.ticks, ticks);
    let final_state = &v["final_state"];
    for (k, name) in ["temp", "heater", "setpoint", "outside"].iter().enumerate() {
        let got = final_state[name].as_f64().unwrap();
        assert_eq!(got.to_bits(), state[k].to_bits(), "{name}: {final_state}");
    }
    let score = in_band as f64 / ticks as f64;
    assert_eq!(v["score"].as_f64().unwrap().to_bits(), score.to_bits());
    assert_eq!(
        record.score.map(|x| x.get().to_bits()),
        Some(score.to_bits())
    );
    // The pass mark held (a failure only after `pass_ticks` ticks), and the score reached.
    let held = if failed {
        assert_eq!(v["end_reason"], "failed");
        assert_eq!(v["failed_at_tick"], ticks);
        assert_eq!(record.end, TrialEnd::Failed);
        ticks > s.pass_ticks
    } else {
        assert_eq!(ticks, s.ticks);
        assert_eq!(v["end_reason"], "completed");
        assert_eq!(v["detail"], Value::Null);
        assert_eq!(v["failed_at_tick"], Value::Null);
        assert_eq!(record.end, TrialEnd::Completed);
        true
    };
    let pass = held && s.min_score.is_none_or(|m| score >= m);
    assert_eq!(v["pass"], pass, "{v}");
    assert_eq!(record.pass, pass);
    fingerprint
}

/// The verdict and the record name the simulator that ran: the module built here.
fn names_the_simulator(r: &RunResponse, sha256: &str) {
    let v = verdict(r);
    assert_eq!(v["format"], "plimsoll-trial-verdict/2");
    let sim = &v["simulator"];
    assert_eq!(
        (&sim["name"], &sim["version"], &sim["sha256"]),
        (&json!(NAME), &json!("0.1.0"), &json!(sha256)),
        "{sim}"
    );
    let meta = &sim["metadata"];
    assert_eq!(meta["ticks_per_second"], 1);
    assert_eq!(meta["score"]["name"], "time_in_band");
    let names = |list: &str| -> Vec<String> {
        meta[list]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names("state"), ["temp", "heater", "setpoint", "outside"]);
    assert_eq!(names("action"), ["power"]);
    assert_eq!(names("initial"), ["temp", "setpoint", "outside"]);
    let [step] = r.record.trials.as_slice() else {
        panic!("one trial step in the record: {:?}", r.record.trials);
    };
    assert_eq!(step.step, 0);
    assert_eq!(
        step.simulator,
        SimulatorRef {
            name: NAME.into(),
            version: "0.1.0".into(),
            sha256: sha256.into(),
        }
    );
    assert_eq!(step.pass, v["pass"].as_bool().unwrap());
    let image = r.record.image.as_ref().expect("the record names its image");
    assert_eq!(image.name, IMAGE);
}

/// Compiles `ROOM_C` in `dir`.
fn compile(dir: &Path) -> Vec<u8> {
    fs::write(dir.join("room.c"), ROOM_C).unwrap();
    // The flags docs/simulators.md gives (scripts/build-sim), without wasi-libc: Euler steps
    // need none of its maths.
    let running = Spawn::new("/usr/bin/clang", dir)
        .args([
            "--target=wasm32",
            "-O2",
            "-g0",
            "-ffp-contract=off",
            "-nostdlib",
            "-Wl,--no-entry",
            "-Wall",
            "-Werror",
            "-o",
            "room.wasm",
            "room.c",
        ])
        .env("PATH", "/usr/bin:/bin")
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start clang: {e}"));
    let got = capture(
        running,
        &CaptureLimits::new(64 << 10, Duration::from_secs(120)),
    )
    .unwrap();
    assert_eq!(
        got.exit_code,
        Some(0),
        "clang: {}",
        String::from_utf8_lossy(&got.stderr)
    );
    let wasm = fs::read(dir.join("room.wasm")).unwrap();
    assert!(wasm.starts_with(b"\0asm\x01\0\0\0"));
    wasm
}

/// Makes `to` a copy of the tree `from` in which every regular file is a hard link to the
/// original (directories and symlinks are new, with the same owner and mode), leaving out
/// `skip`. Nothing may ever write into a file of `to`: it would write the original.
fn link_tree(from: &Path, to: &Path, skip: &Path) -> std::io::Result<u64> {
    let meta = fs::symlink_metadata(from)?;
    fs::create_dir(to)?;
    std::os::unix::fs::lchown(to, Some(meta.uid()), Some(meta.gid()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(meta.mode() & 0o7777))?;
    let mut entries = 1;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if src == skip {
            continue;
        }
        let kind = entry.file_type()?;
        if kind.is_dir() {
            entries += link_tree(&src, &dst, skip)?;
        } else if kind.is_symlink() {
            let m = fs::symlink_metadata(&src)?;
            std::os::unix::fs::symlink(fs::read_link(&src)?, &dst)?;
            std::os::unix::fs::lchown(&dst, Some(m.uid()), Some(m.gid()))?;
            entries += 1;
        } else if kind.is_file() {
            fs::hard_link(&src, &dst)?;
            entries += 1;
        }
        // A built image holds nothing else; an import would remove it anyway.
    }
    Ok(entries)
}

/// The default image's root file system, with `/opt/plimsoll/simulators` holding the room
/// alone, packed as an OCI archive at `archive`.
fn pack_image(base: &Path, work: &Path, wasm: &[u8], sha256: &str, archive: &Path) {
    let rootfs = work.join("rootfs");
    let simulators = Path::new("opt/plimsoll/simulators");
    let start = Instant::now();
    let entries = link_tree(base, &rootfs, &base.join(simulators))
        .unwrap_or_else(|e| panic!("linking {}: {e}", base.display()));
    let dir = rootfs.join(simulators);
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(dir.join("room.wasm"), wasm).unwrap();
    let index = json!({
        "format": "plimsoll-simulators/1",
        "simulators": [{
            "name": NAME,
            "path": "/opt/plimsoll/simulators/room.wasm",
            "sha256": sha256,
        }],
    });
    fs::write(
        dir.join("index.json"),
        serde_json::to_vec_pretty(&index).unwrap(),
    )
    .unwrap();
    for f in ["room.wasm", "index.json"] {
        fs::set_permissions(dir.join(f), fs::Permissions::from_mode(0o644)).unwrap();
    }
    eprintln!(
        "own_exam: rootfs of {entries} entries linked in {} ms",
        start.elapsed().as_millis()
    );
    let start = Instant::now();
    plimsoll_image::testing::oci_archive_from_rootfs(&rootfs, archive)
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "own_exam: oci-archive of {} bytes in {} ms",
        fs::metadata(archive).unwrap().len(),
        start.elapsed().as_millis()
    );
    // Unlinking the links leaves the default image as it was.
    fs::remove_dir_all(&rootfs).unwrap();
}

/// True when `provider` is available; otherwise prints SKIP (or fails under CI=true).
fn available(test: &str, client: &Client, provider: &str) -> bool {
    let providers = client.providers().unwrap_or_else(|e| panic!("{e}"));
    match providers.providers.iter().find(|p| p.name == provider) {
        Some(p) if p.available => true,
        p => {
            skip_or_fail(
                test,
                &format!(
                    "{provider} is not available: {}",
                    p.and_then(|p| p.unavailable_reason.clone())
                        .unwrap_or_else(|| "not probed".into())
                ),
            );
            false
        }
    }
}

fn refusal(e: &ClientError) -> (Option<Reason>, String) {
    (not_dispatched_reason(e), e.to_string())
}

#[test]
fn an_exam_authors_own_simulator_examines_controllers_through_plimsolld_in_an_imported_image() {
    let test = "own_exam";
    if !is_root() {
        skip_or_fail(test, "needs root to run sandboxes and import images");
        return;
    }
    let base = workspace_root().join("build/images/sandbox");
    if !base.join("identity").is_file() || !base.join("rootfs").is_dir() {
        skip_or_fail(
            test,
            &format!("no default image at {}: run `make images`", base.display()),
        );
        return;
    }
    // The compiler, and what makes and imports an OCI archive.
    for tool in ["clang", "wasm-ld", "skopeo", "umoci"] {
        if !Path::new("/usr/bin").join(tool).is_file() {
            skip_or_fail(
                test,
                &format!("/usr/bin/{tool} is missing (scripts/install-deps)"),
            );
            return;
        }
    }
    for (tool, package) in [
        ("plimsoll-probe", "plimsoll-probe"),
        ("plimsoll-agent", "plimsoll-agent"),
        ("plimsoll-trial-runner", "plimsoll-trial"),
    ] {
        plimsoll_testing::tool_binary(tool, package).unwrap_or_else(|e| panic!("{e}"));
    }
    let dir = TestDir::new("daemon", test);
    let wasm = compile(dir.path());
    let sha256 = sha256_hex(&wasm);
    eprintln!(
        "own_exam: room.wasm: {} bytes, SHA-256 {sha256}",
        wasm.len()
    );

    // The image: built from the default image's root file system, imported under a name.
    let archive = dir.path().join("room-exam.oci.tar");
    pack_image(&base.join("rootfs"), dir.path(), &wasm, &sha256, &archive);
    let store_dir: PathBuf = dir.path().join("images");
    let store = plimsoll_image::ImageStore::new(store_dir.clone(), IMAGE.into());
    let start = Instant::now();
    let imported = plimsoll_image::import(
        &plimsoll_image::Source {
            path: archive.clone(),
            image: None,
        },
        IMAGE,
        &store,
        &plimsoll_image::Limits::default(),
        &mut |line| eprintln!("own_exam: {line}"),
    )
    .unwrap_or_else(|e| panic!("{}", plimsoll_engine::error_chain(&e)));
    eprintln!("own_exam: imported in {} ms", start.elapsed().as_millis());
    fs::remove_file(&archive).unwrap();
    let entry = SimulatorEntry {
        name: NAME.into(),
        path: "/opt/plimsoll/simulators/room.wasm".into(),
        sha256: sha256.clone(),
    };
    assert_eq!(imported.image.simulators, Ok(vec![entry.clone()]));

    // A daemon over that store, whose default (and only) image is the imported one: the
    // providers' probes run in it too.
    let daemon = TestDaemon::start(&format!(
        "default_floor = \"container\"\nproviders = [\"crun\", \"runsc\"]\n[pools]\n\
         [oci]\nimage = {image:?}\nstate_root = {oci:?}\n",
        image = store_dir.join(IMAGE).display().to_string(),
        oci = dir.path().join("oci").display().to_string(),
    ));
    let client = Client::new(daemon.url.clone(), Token::new(daemon.token.clone()));
    if !available(test, &client, "crun") {
        return;
    }
    let runsc = available(test, &client, "runsc");
    let listed = client.providers().unwrap().images;
    let [listed] = listed.as_slice() else {
        panic!("one image: {listed:?}");
    };
    assert_eq!(
        (listed.name.as_str(), &listed.identity, &listed.simulators),
        (IMAGE, &imported.image.identity, &vec![entry])
    );

    let mut figures = Vec::new();
    let named = format!("--simulator {NAME}");
    let pinned = format!("--simulator {NAME} --simulator-sha256 {sha256}");

    // The accepted controller, twice at crun (and once at runsc): every trial passes, with
    // the same fingerprints every time.
    let accepted = [&COLD_MORNING, &MILD_EVENING];
    let mut runs = vec![("crun", &named), ("crun", &pinned)];
    if runsc {
        runs.push(("runsc", &pinned));
    }
    let mut fingerprints: Vec<Vec<String>> = Vec::new();
    for (i, (provider, simulator)) in runs.into_iter().enumerate() {
        let what = format!("accepted #{} at {provider}", i + 1);
        let r = timed(
            &client,
            &what,
            trial(provider, simulator, ACCEPTED_PY, &accepted),
            &mut figures,
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(r.provider, provider);
        assert_eq!(r.result.exit_code, Some(0), "{what}: {}", explain(&r));
        assert_eq!(r.record.image.as_ref().unwrap().identity, listed.identity);
        names_the_simulator(&r, &sha256);
        assert!(r.record.trials[0].pass);
        fingerprints.push(
            accepted
                .iter()
                .enumerate()
                .map(|(i, s)| check_trial(&r, i, s))
                .collect(),
        );
    }
    assert!(
        fingerprints.windows(2).all(|w| w[0] == w[1]),
        "{fingerprints:?}"
    );
    assert_ne!(fingerprints[0][0], fingerprints[0][1]);

    // The failing controller overheats the room: failed, with the simulator's own reason in
    // the verdict and the record; on a scenario whose pass mark came before, it still passes.
    let r = timed(
        &client,
        "failing at crun",
        trial("crun", &named, FAILING_PY, &[&COLD_MORNING, &SHORT_MARK]),
        &mut figures,
    )
    .unwrap_or_else(|e| panic!("failing: {e}"));
    assert_eq!(r.result.exit_code, Some(1), "{}", explain(&r));
    names_the_simulator(&r, &sha256);
    let v = verdict(&r);
    for (i, s) in [&COLD_MORNING, &SHORT_MARK].iter().enumerate() {
        let fingerprint = check_trial(&r, i, s);
        assert_ne!(fingerprint, fingerprints[0][0]);
        assert_eq!(v["trials"][i]["end_reason"], "failed", "{v}");
        assert_eq!(v["trials"][i]["detail"], "the room overheated above 30 C");
        let outcome = &r.record.trials[0].trials[i];
        assert_eq!(
            (outcome.end, outcome.reason.as_deref()),
            (TrialEnd::Failed, Some("the room overheated above 30 C"))
        );
    }
    assert_eq!(v["trials"][0]["pass"], false);
    assert_eq!(v["trials"][1]["pass"], true);
    assert!(!r.record.trials[0].pass);

    // A controller that never fails but never reaches the band: completed, below min_score.
    let r = timed(
        &client,
        "lazy at crun",
        trial("crun", &named, LAZY_PY, &[&COLD_MORNING]),
        &mut figures,
    )
    .unwrap_or_else(|e| panic!("lazy: {e}"));
    assert_eq!(r.result.exit_code, Some(1), "{}", explain(&r));
    names_the_simulator(&r, &sha256);
    check_trial(&r, 0, &COLD_MORNING);
    let v = &verdict(&r)["trials"][0];
    assert_eq!(
        (&v["end_reason"], &v["pass"]),
        (&json!("completed"), &json!(false))
    );
    assert!(v["score"].as_f64().unwrap() < 0.6, "{v}");

    // A scenario the simulator's init refuses: the run says so, and no controller started
    // (exit 2, no verdict, no trial on the record).
    let r = timed(
        &client,
        "refused scenario at crun",
        trial("crun", &named, ACCEPTED_PY, &[&SAUNA]),
        &mut figures,
    )
    .unwrap_or_else(|e| panic!("sauna: {e}"));
    assert_eq!(r.result.exit_code, Some(2), "{}", explain(&r));
    let step = &r.result.steps[0];
    assert!(step.stdout.as_slice().is_empty(), "{}", explain(&r));
    let said = step.stderr.to_string_lossy();
    assert!(
        said.contains("the simulator room refused it: the set point must be between 10 C and 26 C")
            && said.contains("no controller was started"),
        "{said}"
    );
    assert!(r.record.trials.is_empty(), "{:?}", r.record.trials);

    // The default image's cart-pole, or the room under another digest, in this image:
    // refused before anything runs.
    for (what, simulator, said) in [
        (
            "cartpole",
            "--simulator cartpole".to_owned(),
            format!("image `{IMAGE}` declares no simulator cartpole (it has: {NAME})"),
        ),
        (
            "another digest",
            format!("--simulator {NAME} --simulator-sha256 {}", "0".repeat(64)),
            format!("but image `{IMAGE}` carries {sha256}"),
        ),
    ] {
        let e = timed(
            &client,
            &format!("{what} at crun"),
            trial("crun", &simulator, ACCEPTED_PY, &[&COLD_MORNING]),
            &mut figures,
        )
        .expect_err(what);
        let (reason, message) = refusal(&e);
        assert_eq!(reason, Some(Reason::Environment), "{what}: {message}");
        assert!(message.contains(&said), "{what}: {message}");
    }
    assert_eq!(daemon.engine().in_flight(), 0);

    eprintln!(
        "own_exam: figures: {}",
        figures
            .iter()
            .map(|(w, d)| format!("{w} {} ms", d.as_millis()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    // Everything this test made goes: the daemon first, then the store and the rest.
    drop(daemon);
    let path = dir.path().to_owned();
    drop(dir);
    assert!(!path.exists(), "{} is left behind", path.display());
}
