//! Warm pools through the engine at the process tier: a member gives one run and is never
//! used again (files in its work directory and /tmp-like places, interpreter globals), a
//! member made under old evidence is never claimed after a re-probe, an empty pool runs cold
//! and says so, pools refill after claims, and dropping the engine leaves no member behind.
//! Real sandboxes (needs root).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use plimsoll_engine::{Engine, Settings};
use plimsoll_testing::{TestDir, is_root, probe_binary, skip_or_fail};
use plimsoll_wire::{Language, PROTOCOL, RunRequest, RunResponse, RunSpec, Snippet, Start, Tier};

/// An engine offering the process provider with a warm pool per language of `max` members
/// keeping `min` idle; its pools are kept.
fn engine(test: &str, uid_base: u32, min: usize, max: usize) -> Option<(Engine, TestDir)> {
    engine_with(
        test,
        uid_base,
        &format!("min_idle = {min}\nmax_members = {max}\nmax_age_secs = 120\n"),
    )
}

/// [`engine`] with `pool` as each pool's settings.
fn engine_with(test: &str, uid_base: u32, pool: &str) -> Option<(Engine, TestDir)> {
    if !is_root() {
        skip_or_fail(test, "needs root to run the process provider");
        return None;
    }
    let dir = TestDir::new("warm", test);
    let probe = probe_binary().unwrap_or_else(|e| panic!("{e}"));
    let toml = format!(
        "providers = [\"process\"]\ndefault_floor = \"process\"\nstate_dir = {state:?}\n\
         sandbox_uid_base = {uid_base}\nmax_concurrent = 2\n\
         [limits.defaults]\nmemory_bytes = 1073741824\n\
         [pools.process.javascript]\n{pool}[pools.process.python]\n{pool}\
         [process]\nprobe = {probe:?}\n",
        state = dir.path().join("state").display().to_string(),
        probe = probe.display().to_string(),
    );
    let engine = Settings::parse(&toml)
        .unwrap()
        .build_engine(&[])
        .unwrap_or_else(|e| panic!("{e}"));
    engine.probe_all();
    engine.start_pools();
    Some((engine, dir))
}

fn request(id: &str, language: Language, code: &str) -> RunRequest {
    RunRequest {
        image: None,
        protocol: PROTOCOL,
        request_id: id.into(),
        minimum_isolation: Some(Tier::Process),
        provider: None,
        limits: None,
        run: RunSpec::Snippet(Snippet {
            language,
            code: code.into(),
        }),
        grant: None,
    }
}

/// Waits until every pool has `n` idle members.
fn wait_idle(engine: &Engine, n: usize) {
    let start = Instant::now();
    loop {
        let idle = engine.pools_idle();
        if idle.iter().all(|(_, _, i)| *i >= n) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the pools did not fill: {idle:?} (counts {:?})",
            engine.pool_counts()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn run(engine: &Engine, id: &str, language: Language, code: &str) -> RunResponse {
    let r = engine
        .run("warm", &request(id, language, code))
        .unwrap_or_else(|e| panic!("{id}: {e}"));
    assert_eq!(
        r.result.exit_code,
        Some(0),
        "{id}: {}",
        String::from_utf8_lossy(&r.result.stderr.0)
    );
    r
}

/// A warm run's member was made after `when` (`what`): none older was used.
fn made_since(r: &RunResponse, when: Instant, what: &str) {
    if let Some(age) = r.result.member_age_ms {
        assert!(
            Duration::from_millis(age) <= when.elapsed(),
            "a member made before {what} ({age} ms old) was used"
        );
    }
}

fn stdout(r: &RunResponse) -> String {
    String::from_utf8_lossy(&r.result.stdout.0)
        .trim()
        .to_owned()
}

/// Each language's marker writer and reader: a file in the work directory, one in a hidden
/// subdirectory, and a global of the interpreter; the reader prints what it still sees.
const JS_LEAVE: &str = "const fs = require('fs'); fs.writeFileSync('marker', 'x'); \
fs.mkdirSync('.hidden'); fs.writeFileSync('.hidden/marker', 'x'); globalThis.plimsollMarker = 1; \
console.log(process.pid)";
const JS_LOOK: &str = "const fs = require('fs'); \
console.log(JSON.stringify({files: fs.readdirSync('.'), global: typeof globalThis.plimsollMarker, pid: process.pid}))";
const PY_LEAVE: &str = "import os, builtins\nopen('marker', 'w').write('x')\nos.mkdir('.hidden')\n\
open('.hidden/marker', 'w').write('x')\nbuiltins.plimsoll_marker = 1\nprint(os.getpid())";
const PY_LOOK: &str = "import os, builtins, json\n\
print(json.dumps({'files': sorted(os.listdir('.')), 'global': hasattr(builtins, 'plimsoll_marker'), 'pid': os.getpid()}))";

#[test]
fn a_member_gives_one_run_and_no_later_run_sees_it() {
    let Some((engine, _dir)) = engine("once", 3_300_000, 2, 3) else {
        return;
    };
    for (language, leave, look, absent) in [
        (
            Language::Javascript,
            JS_LEAVE,
            JS_LOOK,
            "\"global\":\"undefined\"",
        ),
        (Language::Python, PY_LEAVE, PY_LOOK, "\"global\": false"),
    ] {
        wait_idle(&engine, 2);
        let first = run(&engine, "leave", language, leave);
        assert_eq!(first.result.start, Some(Start::Warm), "{first:?}");
        assert!(first.result.member_age_ms.is_some());
        let pid = stdout(&first);
        // Several later runs, warm and after refills: none sees the first's files or globals.
        for i in 0..4 {
            wait_idle(&engine, 1);
            let later = run(&engine, &format!("look-{i}"), language, look);
            assert_eq!(later.result.start, Some(Start::Warm), "{later:?}");
            let seen = stdout(&later);
            assert!(
                seen.contains("\"files\":[]") || seen.contains("\"files\": []"),
                "{language:?}: a later run sees files: {seen}"
            );
            assert!(
                seen.contains(absent),
                "{language:?}: a later run sees the global: {seen}"
            );
            assert!(!seen.contains(&format!("\"pid\":{pid}}}")), "{seen}");
        }
    }
    assert!(engine.wait_for_teardowns(Duration::from_secs(30)));
}

#[test]
fn an_empty_pool_runs_cold_and_says_so_and_refills() {
    let Some((engine, _dir)) = engine("empty", 3_300_100, 1, 1) else {
        return;
    };
    wait_idle(&engine, 1);
    let warm = run(&engine, "warm", Language::Python, "print('a')");
    assert_eq!(warm.result.start, Some(Start::Warm));
    // The one member is used; until the keeper has made the next, a run starts cold.
    let cold = run(&engine, "cold", Language::Python, "print('b')");
    if cold.result.start == Some(Start::Cold) {
        assert_eq!(cold.result.member_age_ms, None);
        assert!(engine.pool_counts().empty.load(Ordering::SeqCst) >= 1);
    }
    wait_idle(&engine, 1);
    let again = run(&engine, "again", Language::Python, "print('c')");
    assert_eq!(again.result.start, Some(Start::Warm), "the pool refilled");
    // A request the pool's key does not match (other limits) runs cold.
    let mut other = request("other", Language::Python, "print('d')");
    other.limits = Some(plimsoll_wire::Limits {
        memory_bytes: Some(512 * 1024 * 1024),
        ..Default::default()
    });
    let r = engine.run("warm", &other).unwrap();
    assert_eq!(r.result.start, Some(Start::Cold));
    assert!(engine.pool_counts().claimed.load(Ordering::SeqCst) >= 2);
}

#[test]
fn a_member_made_under_old_evidence_is_never_used_after_a_re_probe() {
    let Some((engine, _dir)) = engine("reprobe", 3_300_200, 1, 2) else {
        return;
    };
    wait_idle(&engine, 1);
    let before = engine.evidence("process").unwrap().evidence_sha256;
    engine.probe_all();
    let reprobed = Instant::now();
    let after = engine.evidence("process").unwrap().evidence_sha256;
    assert_ne!(before, after, "a re-probe gives new evidence");
    for i in 0..3 {
        let r = run(
            &engine,
            &format!("after-{i}"),
            Language::Javascript,
            "console.log(1)",
        );
        assert_eq!(r.record.evidence_sha256, after);
        made_since(&r, reprobed, "the re-probe");
    }
    assert!(engine.pool_counts().discarded.load(Ordering::SeqCst) >= 1);
}

#[test]
fn dropping_the_engine_leaves_no_member_behind() {
    let Some((engine, dir)) = engine("drop", 3_300_300, 2, 2) else {
        return;
    };
    wait_idle(&engine, 2);
    let uids = 3_300_300..3_300_400;
    assert!(!plimsoll_sandbox::reap::processes_of_uids(uids.clone()).is_empty());
    drop(engine);
    assert!(
        plimsoll_sandbox::reap::processes_of_uids(uids).is_empty(),
        "a member's process outlived the engine"
    );
    let left = plimsoll_testing::run_dirs_under(dir.path());
    assert!(left.is_empty(), "members' directories left: {left:?}");
}

/// The same snippet warm and cold ends the same: status, output, the last line of standard
/// error (a traceback's frames above it name the run's own paths), and what the code sees of
/// itself.
#[test]
fn a_warm_run_ends_as_a_cold_one_does() {
    let Some((engine, _dir)) = engine("same", 3_300_400, 1, 2) else {
        return;
    };
    let cases: &[(Language, &str)] = &[
        (Language::Python, "print('a')"),
        (Language::Python, "import sys; sys.exit(3)"),
        (Language::Python, "import sys; sys.exit('bye')"),
        (Language::Python, "raise ValueError('x')"),
        (
            Language::Python,
            "import sys; sys.stdout.write('no newline')",
        ),
        (
            Language::Python,
            "import atexit\natexit.register(lambda: print('at exit'))\nprint('main')",
        ),
        (
            Language::Python,
            "import threading, time\ndef f():\n    time.sleep(0.2)\n    print('thread')\nthreading.Thread(target=f).start()\nprint('main')",
        ),
        (
            Language::Python,
            "import sys\nprint(__name__, len(sys.argv), sys.argv[0].endswith('main.py'), sys.path[0] != '')",
        ),
        (Language::Javascript, "console.log('a')"),
        (Language::Javascript, "process.exit(3)"),
        (Language::Javascript, "throw new Error('x')"),
        (Language::Javascript, "process.stdout.write('no newline')"),
        (
            Language::Javascript,
            "process.on('exit', (c) => console.log('exit', c)); console.log('main')",
        ),
        (
            Language::Javascript,
            "setTimeout(() => console.log('later'), 200); console.log('now')",
        ),
        (
            Language::Javascript,
            "console.log(require.main === module, process.argv.length, __filename.endsWith('main.js'))",
        ),
    ];
    for (i, (language, code)) in cases.iter().enumerate() {
        wait_idle(&engine, 1);
        let warm = engine
            .run("warm", &request(&format!("warm-{i}"), *language, code))
            .unwrap();
        let mut cold = request(&format!("cold-{i}"), *language, code);
        cold.limits = Some(plimsoll_wire::Limits {
            memory_bytes: Some(1024 * 1024 * 1024 - 4096),
            ..Default::default()
        });
        let cold = engine.run("warm", &cold).unwrap();
        assert_eq!(warm.result.start, Some(Start::Warm), "{code}");
        assert_eq!(cold.result.start, Some(Start::Cold), "{code}");
        let last = |r: &RunResponse| {
            String::from_utf8_lossy(&r.result.stderr.0)
                .lines()
                .rfind(|l| !l.trim().is_empty())
                .unwrap_or("")
                .to_owned()
        };
        let said = |r: &RunResponse| {
            (
                r.result.exit_code,
                r.result.signal,
                String::from_utf8_lossy(&r.result.stdout.0).into_owned(),
                last(r),
            )
        };
        let (w, c) = (said(&warm), said(&cold));
        // Node's uncaught-error report ends with its own version line; compare the error.
        if code.starts_with("throw") {
            assert_eq!((w.0, w.1, &w.2), (c.0, c.1, &c.2), "{code}");
            for r in [&warm, &cold] {
                assert!(
                    r.result.stderr.to_string_lossy().contains("Error: x"),
                    "{code}: {r:?}"
                );
            }
            continue;
        }
        assert_eq!(w, c, "{language:?} {code}: warm and cold differ");
    }
}

/// A bind mount of the built image's root file system, undone when dropped.
struct Bound(std::path::PathBuf);

impl Drop for Bound {
    fn drop(&mut self) {
        let _ = mount("/bin/umount", &["-l", &self.0.display().to_string()]);
    }
}

/// Runs `program` (mount or umount) with `args` to its end.
fn mount(program: &str, args: &[&str]) -> Result<(), String> {
    let mut r = plimsoll_sandbox::Spawn::new(program, "/")
        .args(args)
        .spawn()
        .map_err(|e| format!("{program}: {e}"))?;
    let status = r.child.wait().map_err(|e| format!("{program}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{program} {args:?}: {status}"))
    }
}

/// An image rebuilt under a running engine (its identity changed, as `make images` changes
/// it): the next run at crun is refused, not dispatched (`environment`), the provider is
/// probed again, and from then on runs carry the new identity and never get a member made
/// under the old one, which is dropped.
#[test]
fn a_rebuilt_image_is_refused_until_probed_again_and_its_old_members_are_never_used() {
    let test = "a_rebuilt_image_is_refused_until_probed_again";
    if !is_root() {
        skip_or_fail(test, "needs root to run crun");
        return;
    }
    let built = plimsoll_testing::workspace_root().join("build/images/sandbox");
    if !built.join("rootfs").is_dir() {
        skip_or_fail(test, "no sandbox image: run `make images`");
        return;
    }
    let dir = TestDir::new("warm", "rebuild");
    // The image, as the engine sees it: the built root file system (bound read-only, not
    // copied) and an identity file this test can change.
    let image = dir.path().join("image");
    std::fs::create_dir_all(image.join("rootfs")).unwrap();
    let identity = std::fs::read_to_string(built.join("identity")).unwrap();
    let old = identity.trim().to_owned();
    std::fs::write(image.join("identity"), &identity).unwrap();
    let rootfs = image.join("rootfs").display().to_string();
    let src = built.join("rootfs").display().to_string();
    mount("/bin/mount", &["--bind", &src, &rootfs]).unwrap_or_else(|e| panic!("{e}"));
    let _bound = Bound(image.join("rootfs"));
    mount("/bin/mount", &["-o", "remount,bind,ro", &rootfs]).unwrap_or_else(|e| panic!("{e}"));
    let toml = format!(
        "providers = [\"crun\"]\ndefault_floor = \"process\"\nstate_dir = {state:?}\n\
         sandbox_uid_base = 3300600\nmax_concurrent = 2\n\
         [pools.crun.javascript]\nmin_idle = 1\nmax_members = 2\nmax_age_secs = 120\n\
         [oci]\nimage = {image:?}\nstate_root = {root:?}\ncgroup_parent = \"/plimsoll-warm-rebuild-{pid}\"\n",
        state = dir.path().join("state").display().to_string(),
        image = image.display().to_string(),
        root = dir.path().join("oci").display().to_string(),
        pid = std::process::id(),
    );
    let engine = Settings::parse(&toml)
        .unwrap()
        .build_engine(&[])
        .unwrap_or_else(|e| panic!("{e}"));
    engine.probe_all();
    let info = engine.providers().into_iter().next().expect("one provider");
    if !info.available {
        skip_or_fail(
            test,
            &format!("crun is not available here: {:?}", info.unavailable_reason),
        );
        return;
    }
    engine.start_pools();
    wait_idle(&engine, 1);
    let container = |id: &str| {
        let mut r = request(id, Language::Javascript, "console.log(1)");
        r.minimum_isolation = Some(Tier::Container);
        r
    };
    let before = engine.run("warm", &container("before")).unwrap();
    assert_eq!(before.result.start, Some(Start::Warm));
    assert_eq!(before.record.environment, old);
    wait_idle(&engine, 1);

    // Rebuilt: the identity moves (the files a run gets would be the new image's).
    let new = format!("sha256:{}", "e".repeat(64));
    std::fs::write(image.join("identity"), format!("{new}\n")).unwrap();
    let rebuilt = Instant::now();
    match engine.run("warm", &container("stale")) {
        Err(plimsoll_engine::RunError::Refused {
            reason, message, ..
        }) => {
            assert_eq!(reason, plimsoll_wire::Reason::Environment, "{message}");
            assert!(
                message.contains(&new) && message.contains(&old),
                "{message}"
            );
        }
        other => panic!("a run on the rebuilt image's old evidence was not refused: {other:?}"),
    }

    // Probed again in the background: then runs carry the new identity, from new members.
    let start = Instant::now();
    loop {
        let e = engine.evidence("crun").map(|e| e.evidence.environment);
        if !engine.rechecking("crun") && e.as_deref() == Some(new.as_str()) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "crun was not probed again: {e:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for i in 0..3 {
        let r = engine
            .run("warm", &container(&format!("after-{i}")))
            .unwrap_or_else(|e| panic!("after-{i}: {e}"));
        assert_eq!(r.result.exit_code, Some(0), "{r:?}");
        assert_eq!(r.record.environment, new);
        made_since(&r, rebuilt, "the rebuild");
    }
    assert!(engine.pool_counts().discarded.load(Ordering::SeqCst) >= 1);
}

#[test]
fn a_pool_grows_while_claims_outpace_its_refill_and_shrinks_back_when_idle() {
    let Some((engine, _dir)) = engine_with(
        "grows",
        3_300_500,
        "min_idle = 1\nmax_members = 3\nmax_age_secs = 120\nshrink_after_secs = 1\n",
    ) else {
        return;
    };
    wait_idle(&engine, 1);
    // Back to back, faster than one member is made: each claim empties the pool, which then
    // keeps one more idle member, up to its maximum.
    for i in 0..3 {
        let r = run(&engine, &format!("burst-{i}"), Language::Python, "print(1)");
        assert_eq!(stdout(&r), "1");
    }
    let python_idle = |engine: &Engine| {
        engine
            .pools_idle()
            .into_iter()
            .find(|(_, l, _)| *l == Language::Python)
            .map_or(0, |(_, _, n)| n)
    };
    let start = Instant::now();
    while python_idle(&engine) < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the pool did not grow: {:?} (counts {:?})",
            engine.pools_idle(),
            engine.pool_counts()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // No claim for a while: back down to min_idle, one member per shrink_after.
    let start = Instant::now();
    while python_idle(&engine) > 1 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the pool did not shrink back: {:?}",
            engine.pools_idle()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(python_idle(&engine), 1, "{:?}", engine.pools_idle());
}
