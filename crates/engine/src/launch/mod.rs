//! The launcher: the providers hosted behind a local socket, so that the process that decides
//! plans need not be the one that keeps root (docs/privileges.md, "The launcher").
//!
//! [`Launcher`] hosts the real providers and serves [`plimsoll_wire::launch`] requests from
//! one uid (the peer's credentials are checked on every connection); it checks every plan
//! against its [`Bounds`] (the settings' uid range, runs directory, image store and limit
//! maximums) and does nothing a plan does not say. [`Remote`] is the other side: a
//! [`plimsoll_sandbox::Provider`] whose every call is a request over the socket, so the engine
//! reaches the launcher's providers exactly as it reaches its own. Policy stays in the
//! engine's `plan()`; the launcher only refuses what is outside the settings.
//!
//! Through the socket today: every call of a cold run (probe, adopt, routing's questions,
//! run, output as it is read, the broker channel's ends, deferred teardown, cancel) and warm
//! members and sessions (each held by a connection of its own: a member's one run or its
//! discard; a session's calls, wall, liveness and close, its cell cancelled from a
//! connection of its own by a token the launcher gave). The connection ending ends what it
//! held.

mod client;
mod conn;
mod server;

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use plimsoll_sandbox::{
    BrokerChannel, LaunchError, LaunchPlan, OutputTap, Privileges, Probed, ResolvedLimits,
    RunImage, WarmPlan, WarmShape, Withdrawn, error_chain,
};
use plimsoll_wire::launch::{
    LaunchFailure, MemberPlan, Plan, PlanBroker, PlanImage, PlanLimits, PlanPrivileges, ProbedWire,
    WithdrawnWire,
};

pub use client::{LauncherBrokers, Remote};
pub use server::{Launcher, LauncherGrants};

/// What a plan may name: the launcher refuses any plan outside these.
#[derive(Debug, Clone)]
pub struct Bounds {
    /// The uids a run, its controller, a probe or a warm member may run as.
    pub uids: Range<u32>,
    /// The directory every run's directory is directly under (`<state_dir>/runs`).
    pub runs_dir: PathBuf,
    /// The image store, canonical (symlinks resolved once, when the launcher is built): an
    /// image's root file system and disk must be inside it.
    pub image_root: PathBuf,
    /// The settings' limit maximums.
    pub maximums: ResolvedLimits,
}

/// Each `(name, asked, maximum)`: `Err` for the first over its maximum.
fn at_most(limits: &[(&str, u64, u64)]) -> Result<(), String> {
    match limits.iter().find(|(_, asked, max)| asked > max) {
        Some((name, asked, max)) => Err(format!("{name} = {asked} is over the maximum {max}")),
        None => Ok(()),
    }
}

/// A sandbox id as the engine makes them: letters, digits, `-` and `_`, 1 to 64 of them.
fn is_sandbox_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl Bounds {
    /// `Err(why)` when `plan` names anything outside the settings.
    pub fn check(&self, plan: &Plan) -> Result<(), String> {
        self.check_place("run", &plan.run_id, &plan.run_dir)?;
        for (what, id) in [
            ("uid", plan.uid),
            ("gid", plan.gid),
            ("controller uid", plan.controller_uid),
            ("controller gid", plan.controller_gid),
        ] {
            self.check_uid(what, id)?;
        }
        let (l, m) = (&plan.limits, &self.maximums);
        at_most(&[
            ("timeout_ms", l.timeout_ms, m.timeout.as_millis() as u64),
            ("memory_bytes", l.memory_bytes, m.memory_bytes),
            ("output_bytes", l.output_bytes, m.output_bytes),
            ("pids", l.pids, m.pids),
            ("disk_bytes", l.disk_bytes, m.disk_bytes),
            ("artifact_bytes", l.artifact_bytes, m.artifact_bytes),
        ])?;
        let due = privileges_to_wire(Privileges::for_spec(&plan.spec));
        if plan.privileges != due {
            return Err(format!(
                "privileges {:?} for a run whose steps call for {due:?}",
                plan.privileges
            ));
        }
        self.check_image(plan.image.as_ref())
    }

    /// `Err(why)` when a warm member's plan names anything outside the settings.
    pub fn check_member(&self, plan: &MemberPlan) -> Result<(), String> {
        self.check_place("member", &plan.member_id, &plan.run_dir)?;
        self.check_uid("uid", plan.uid)?;
        self.check_uid("gid", plan.gid)?;
        let m = &self.maximums;
        at_most(&[
            (
                "timeout_ms",
                plan.max_timeout_ms,
                m.timeout.as_millis() as u64,
            ),
            ("memory_bytes", plan.memory_bytes, m.memory_bytes),
            ("pids", plan.pids, m.pids),
            ("disk_bytes", plan.disk_bytes, m.disk_bytes),
        ])?;
        self.check_image(plan.image.as_ref())
    }

    fn check_uid(&self, what: &str, id: u32) -> Result<(), String> {
        if self.uids.contains(&id) {
            Ok(())
        } else {
            Err(format!(
                "{what} {id} is outside the sandbox uids {}..{}",
                self.uids.start, self.uids.end
            ))
        }
    }

    /// A sandbox's id is a sandbox id and its directory exactly `<runs_dir>/<id>`.
    fn check_place(&self, kind: &str, id: &str, run_dir: &Path) -> Result<(), String> {
        if !is_sandbox_id(id) {
            return Err(format!("{kind} id {id:?} is not a sandbox id"));
        }
        let dir = self.runs_dir.join(id);
        if run_dir != dir {
            return Err(format!(
                "run directory {} is not {}",
                run_dir.display(),
                dir.display()
            ));
        }
        Ok(())
    }

    fn check_image(&self, image: Option<&PlanImage>) -> Result<(), String> {
        let Some(image) = image else { return Ok(()) };
        self.inside_store("root file system", &image.rootfs)?;
        match &image.disk {
            Some(disk) => self.inside_store("disk", disk),
            None => Ok(()),
        }
    }

    /// Checks a cancel's sandbox.
    pub fn check_sandbox(&self, id: &str, uid: u32) -> Result<(), String> {
        if !is_sandbox_id(id) {
            return Err(format!("sandbox id {id:?} is not a sandbox id"));
        }
        self.check_uid("uid", uid)
    }

    fn inside_store(&self, what: &str, path: &Path) -> Result<(), String> {
        let root = &self.image_root;
        let real = path
            .canonicalize()
            .map_err(|e| format!("the image's {what} {} cannot be read: {e}", path.display()))?;
        if real.starts_with(root) && real != *root {
            Ok(())
        } else {
            Err(format!(
                "the image's {what} {} is outside the image store {}",
                path.display(),
                root.display()
            ))
        }
    }
}

fn privileges_to_wire(p: Privileges) -> PlanPrivileges {
    match p {
        Privileges::Unprivileged => PlanPrivileges::Unprivileged,
        Privileges::TrialRunner => PlanPrivileges::TrialRunner,
        Privileges::DropsToRunUid => PlanPrivileges::DropsToRunUid,
    }
}

fn image_to_wire(i: &RunImage) -> PlanImage {
    PlanImage {
        name: i.name.clone(),
        identity: i.identity.clone(),
        rootfs: i.rootfs.clone(),
        disk: i.disk.clone(),
        named: i.named,
    }
}

fn image_from_wire(i: PlanImage) -> RunImage {
    RunImage {
        name: i.name,
        identity: i.identity,
        rootfs: i.rootfs,
        disk: i.disk,
        named: i.named,
    }
}

/// The plan as it crosses the socket.
fn plan_to_wire(p: &LaunchPlan) -> Plan {
    let l = &p.limits;
    Plan {
        run_id: p.run_id.clone(),
        request_id: p.request_id.clone(),
        spec: p.spec.clone(),
        limits: PlanLimits {
            timeout_ms: l.timeout.as_millis() as u64,
            memory_bytes: l.memory_bytes,
            output_bytes: l.output_bytes,
            pids: l.pids,
            disk_bytes: l.disk_bytes,
            artifact_bytes: l.artifact_bytes,
        },
        uid: p.uid,
        gid: p.gid,
        controller_uid: p.controller_uid,
        controller_gid: p.controller_gid,
        run_dir: p.run_dir.clone(),
        broker: p.broker.as_ref().map(|b| PlanBroker { egress: b.egress() }),
        privileges: privileges_to_wire(p.privileges),
        tap: p.tap.is_some(),
        image: p.image.as_ref().map(image_to_wire),
    }
}

/// The provider's plan from what crossed the socket, with the launcher's own ends of the
/// broker channel and the tap.
fn plan_from_wire(p: Plan, broker: Option<BrokerChannel>, tap: Option<OutputTap>) -> LaunchPlan {
    let l = p.limits;
    LaunchPlan {
        run_id: p.run_id,
        request_id: p.request_id,
        spec: p.spec,
        limits: ResolvedLimits {
            timeout: Duration::from_millis(l.timeout_ms),
            memory_bytes: l.memory_bytes,
            output_bytes: l.output_bytes,
            pids: l.pids,
            disk_bytes: l.disk_bytes,
            artifact_bytes: l.artifact_bytes,
        },
        uid: p.uid,
        gid: p.gid,
        controller_uid: p.controller_uid,
        controller_gid: p.controller_gid,
        run_dir: p.run_dir,
        broker,
        privileges: match p.privileges {
            PlanPrivileges::Unprivileged => Privileges::Unprivileged,
            PlanPrivileges::TrialRunner => Privileges::TrialRunner,
            PlanPrivileges::DropsToRunUid => Privileges::DropsToRunUid,
        },
        tap,
        image: p.image.map(image_from_wire),
    }
}

fn probed_to_wire(p: Probed) -> ProbedWire {
    ProbedWire {
        tier: p.tier,
        evidence: p.evidence,
        available: p.available.map_err(|w| match w {
            Withdrawn::Checks { provider, failed } => WithdrawnWire::Checks { provider, failed },
            Withdrawn::NotProbed(why) => WithdrawnWire::NotProbed(why),
        }),
    }
}

fn probed_from_wire(p: ProbedWire) -> Probed {
    Probed {
        tier: p.tier,
        evidence: p.evidence,
        available: p.available.map_err(|w| match w {
            WithdrawnWire::Checks { provider, failed } => Withdrawn::Checks { provider, failed },
            WithdrawnWire::NotProbed(why) => Withdrawn::NotProbed(why),
        }),
    }
}

fn failure_to_wire(e: &LaunchError) -> LaunchFailure {
    LaunchFailure {
        not_started: e.not_dispatched(),
        error: error_chain(e.error()),
        cleanup: e.cleanup().map(|c| error_chain(c)),
    }
}

fn failure_from_wire(f: LaunchFailure) -> LaunchError {
    let e = match f.not_started {
        Some(reason) => LaunchError::not_started(reason, f.error),
        None => LaunchError::may_have_run(f.error),
    };
    match f.cleanup {
        Some(c) => e.with_cleanup(c),
        None => e,
    }
}

fn member_to_wire(p: &WarmPlan) -> MemberPlan {
    MemberPlan {
        member_id: p.member_id.clone(),
        language: p.shape.language,
        memory_bytes: p.shape.memory_bytes,
        pids: p.shape.pids,
        disk_bytes: p.shape.disk_bytes,
        uid: p.uid,
        gid: p.gid,
        run_dir: p.run_dir.clone(),
        max_timeout_ms: p.max_timeout.as_millis() as u64,
        image: p.image.as_ref().map(image_to_wire),
    }
}

fn member_from_wire(p: MemberPlan) -> WarmPlan {
    WarmPlan {
        member_id: p.member_id,
        shape: WarmShape {
            language: p.language,
            memory_bytes: p.memory_bytes,
            pids: p.pids,
            disk_bytes: p.disk_bytes,
        },
        uid: p.uid,
        gid: p.gid,
        run_dir: p.run_dir,
        max_timeout: Duration::from_millis(p.max_timeout_ms),
        image: p.image.map(image_from_wire),
    }
}

#[cfg(test)]
mod tests;
