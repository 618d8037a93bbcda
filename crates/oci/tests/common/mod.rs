//! What the provider tests share: a rig (a provider with a state root and a cgroup parent of
//! its own), the runs' uids, the check that nothing of a run is left, and a macro that runs a
//! scenario at crun, runc and runsc.
//!
//! uids: the run uids of provider.rs are 2,100,000 + 10 × scenario + runtime, those of
//! trials.rs 2,120,000 + 10 × scenario + runtime; a plan's controller uid is its run uid plus
//! [`CONTROLLER_OFFSET`]; the probes run at 2,199,000 + runtime. No two tests that may run at
//! the same time share a uid (the trial launcher kills every process of its controller uid).

#![allow(
    dead_code,
    reason = "each test binary uses a different part of this module"
)]

use std::path::{Path, PathBuf};

use plimsoll_oci::{OciConfig, OciProvider, RuntimeKind, spec};
use plimsoll_sandbox::reap::processes_of_uid;
use plimsoll_sandbox::{LaunchPlan, Provider, ResolvedLimits};
use plimsoll_testing::{fresh_id, is_root, probe_and_agent, skip_or_fail, workspace_root};
use plimsoll_wire::{RunResult, RunSpec};

/// A plan's controller uid is its run uid plus this.
pub const CONTROLLER_OFFSET: u32 = 10_000;

pub fn image() -> PathBuf {
    workspace_root().join("build/images/sandbox")
}

/// One provider with a state root and a cgroup parent of its own, so tests running at the
/// same time never reap each other's runs. Removed on drop.
pub struct Rig {
    pub p: OciProvider,
    pub state_root: PathBuf,
    pub cgroup_parent: String,
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = self.p.reap();
        let _ = std::fs::remove_dir_all(&self.state_root);
        if let Ok(layout) = self.p.layout() {
            let _ = layout.remove(&self.cgroup_parent);
            // The shared parent goes too once the last test is done with it.
            for dir in layout.dirs("/plimsoll-test") {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
}

/// The runtime's place in `RuntimeKind::ALL` (crun 0, runc 1, runsc 2).
pub fn kind_index(kind: RuntimeKind) -> u32 {
    RuntimeKind::ALL.iter().position(|k| *k == kind).unwrap() as u32
}

/// A rig for `kind`, or `None` after `SKIP` (a panic under `CI=true`) when the host lacks
/// root, the runtime, the image, or the probe and agent binaries.
pub fn rig(kind: RuntimeKind, test: &str) -> Option<Rig> {
    if !is_root() {
        skip_or_fail(
            test,
            "needs root (cgroups, namespaces, the runtime's state)",
        );
        return None;
    }
    if !Path::new(kind.default_binary()).exists() {
        skip_or_fail(
            test,
            &format!(
                "{} is not installed (scripts/install-deps)",
                kind.default_binary()
            ),
        );
        return None;
    }
    if !image().join("identity").exists() {
        skip_or_fail(test, "the sandbox image is not built (scripts/build-image)");
        return None;
    }
    let (probe, agent) = match probe_and_agent() {
        Ok(pa) => pa,
        Err(e) => {
            skip_or_fail(test, &e);
            return None;
        }
    };
    let tag = format!("{test}-{}", std::process::id());
    let state_root = PathBuf::from("/run/plimsoll-test").join(&tag);
    let cgroup_parent = format!("/plimsoll-test/{tag}");
    let mut c = OciConfig::new(kind, image(), agent, probe, 2_199_000 + kind_index(kind));
    c.state_root = state_root.clone();
    c.cgroup_parent = cgroup_parent.clone();
    Some(Rig {
        p: OciProvider::new(c),
        state_root,
        cgroup_parent,
    })
}

impl Rig {
    pub fn plan(&self, spec: RunSpec, limits: ResolvedLimits, uid: u32) -> LaunchPlan {
        LaunchPlan {
            image: None,
            run_id: fresh_id("t"),
            request_id: "attack".into(),
            privileges: plimsoll_sandbox::Privileges::for_spec(&spec),
            spec,
            limits,
            uid,
            gid: uid,
            controller_uid: uid + CONTROLLER_OFFSET,
            controller_gid: uid + CONTROLLER_OFFSET,
            run_dir: self.state_root.join("unused"),
            broker: None,
            tap: None,
        }
    }

    /// Runs, then checks that nothing of the run is left.
    pub fn run(&self, spec: RunSpec, limits: ResolvedLimits, uid: u32) -> RunResult {
        self.run_plan(&self.plan(spec, limits, uid))
    }

    pub fn run_plan(&self, plan: &LaunchPlan) -> RunResult {
        let uid = plan.uid;
        let outcome = self.p.run(plan);
        self.assert_clean(&plan.run_id, uid);
        match outcome {
            Ok(o) => o.result,
            Err(e) => panic!("{} run failed: {e}", self.p.name()),
        }
    }

    pub fn assert_clean(&self, run_id: &str, uid: u32) {
        let id = format!("plimsoll-{run_id}");
        let name = self.p.name();
        let list = self.p.runtime().list().expect("list containers");
        assert!(
            !list.contains(&id),
            "{name}: container {id} is still listed: {list:?}"
        );
        assert!(
            !self.p.runtime().has_state(&id),
            "{name}: runtime state of {id} remains"
        );
        let layout = self.p.layout().expect("cgroup layout");
        for dir in layout.dirs(&spec::run_cgroup(self.p.cgroup_parent(), run_id)) {
            assert!(!dir.exists(), "{name}: cgroup {} remains", dir.display());
        }
        let run_dir = self.p.state().runs().join(&id);
        assert!(
            !run_dir.exists(),
            "{name}: run directory {} remains",
            run_dir.display()
        );
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(
            !mounts.contains(run_id),
            "{name}: a mount of {run_id} remains"
        );
        for uid in [uid, uid + CONTROLLER_OFFSET] {
            let left = processes_of_uid(uid);
            assert!(
                left.is_empty(),
                "{name}: processes of uid {uid} remain: {left:?}"
            );
        }
        let runtimes = processes_naming(&id);
        assert!(
            runtimes.is_empty(),
            "{name}: processes naming {id} remain: {runtimes:?}"
        );
    }
}

/// Processes whose command line names `needle` (a runtime, runsc's sandbox and gofer).
pub fn processes_naming(needle: &str) -> Vec<(i32, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(needle) {
            out.push((pid, cmd));
        }
    }
    out
}

/// Runs each scenario `fn name(kind, test)` at crun, runc and runsc, as tests
/// `crun::name`, `runc::name`, `runsc::name`.
macro_rules! on_every_runtime {
    ($($scenario:ident),* $(,)?) => {
        mod crun {
            $(#[test] fn $scenario() { super::$scenario(plimsoll_oci::RuntimeKind::Crun, concat!("crun::", stringify!($scenario))) })*
        }
        mod runc {
            $(#[test] fn $scenario() { super::$scenario(plimsoll_oci::RuntimeKind::Runc, concat!("runc::", stringify!($scenario))) })*
        }
        mod runsc {
            $(#[test] fn $scenario() { super::$scenario(plimsoll_oci::RuntimeKind::Runsc, concat!("runsc::", stringify!($scenario))) })*
        }
    };
}
