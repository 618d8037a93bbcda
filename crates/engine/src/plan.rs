//! The decision point. [`plan`] turns a request, the operator's settings, the grants and one
//! snapshot of every provider's evidence into a [`Plan`] or a refusal, and does nothing else:
//! no I/O, no clock, no lock, so every decision is testable from data. [`Plan::launch`] then
//! adds what only admission can give (the run's uid slot, its id, its broker channel) and
//! gives the provider a [`LaunchPlan`] with everything decided; the provider applies it and
//! never looks at the request again (ARCHITECTURE.md, "Where policy is decided").

use std::path::Path;

use plimsoll_broker::{Grant, GrantProfiles};
use plimsoll_sandbox::{
    BrokerChannel, LaunchPlan, Privileges, ResolvedLimits, RunImage, Unsupported, Withdrawn,
};
use plimsoll_wire::{Reason, RunRequest, Tier};

use crate::admission::{controller_uid, run_uid};
use crate::config::EngineConfig;
use crate::error::RunError;
use crate::routing::{Candidate, route};

/// Why a provider cannot take runs right now, as the snapshot saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailable<'a> {
    /// Its first probe has not ended yet.
    Probing,
    /// Its environment changed since its probe (a rebuilt image) and it is being probed
    /// again; routing skips it until that check ends. (After a run's failure a provider is
    /// probed again too, but keeps serving on its last good evidence meanwhile.)
    Stale,
    /// Its probe failed: why, and what to do.
    Withdrawn(&'a Withdrawn),
}

impl Unavailable<'_> {
    fn why(&self) -> String {
        match self {
            Unavailable::Probing => {
                "not probed yet: its probe is still running; retry shortly".to_owned()
            }
            Unavailable::Stale => crate::recheck::STALE.to_owned(),
            Unavailable::Withdrawn(why) => why.to_string(),
        }
    }
}

/// One provider as the decision sees it: its fixed facts, its answer for this request, and
/// its evidence at the moment of the snapshot.
#[derive(Debug, Clone)]
pub struct ProviderView<'a> {
    /// Its name.
    pub name: &'a str,
    /// The tier its current evidence supports (the nominal tier while it has none).
    pub tier: Tier,
    /// Lower is cheaper.
    pub cost: u32,
    /// `Err(why)` when it cannot do this kind of run (its own `supports`).
    pub supports: Result<(), Unsupported>,
    /// The least `memory_bytes` this run can start under there (its own `memory_floor`):
    /// a run asking for less is not routed to it.
    pub memory_floor: Option<u64>,
    /// Whether it carries a grant's broker channel into the sandbox.
    pub carries_broker: bool,
    /// Whether it carries an egress grant's proxy into the sandbox (projects and sessions).
    pub carries_egress: bool,
    /// `Ok` when its evidence lets it take runs now.
    pub available: Result<(), Unavailable<'a>>,
    /// Whether its runs run in an image (all but the process tier).
    pub uses_image: bool,
    /// `Err(why)` when it cannot run in the request's image, or the image cannot start the
    /// run's language there (its own `takes_image`, the image's interpreters).
    pub image: Result<(), String>,
}

/// What the engine decided for one request: which provider, under which floor, with which
/// limits, grant and privileges. Everything but admission's part of a [`LaunchPlan`].
#[derive(Debug, Clone)]
pub struct Plan {
    /// The chosen provider's index in the snapshot.
    pub provider: usize,
    /// The floor applied: the request's, or the operator's default (never silently the
    /// weakest tier).
    pub floor: Tier,
    /// The limits, every value decided.
    pub limits: ResolvedLimits,
    /// The grant's profile, when the request named one the caller may use.
    pub grant: Option<Grant>,
    /// What the sandbox's first process holds.
    pub privileges: Privileges,
    /// The image it runs in: the request's, or the default one; `None` at a provider
    /// without images, or where no image could be resolved and none was named.
    pub image: Option<RunImage>,
}

/// The request's image as the engine found it in the store: `Ok(None)` when it named none
/// and there is no default image to give it (the providers then use the image they were
/// configured with, as before images had names); `Err(why)` when it named one that cannot
/// be served, which refuses it (`environment`).
pub type ImageChoice = Result<Option<RunImage>, String>;

/// Decides one request. Refusals come in this order: the request itself, its limits, its
/// grant, its image, then routing (named provider, floor, support, availability). Pure.
pub fn plan(
    caller: &str,
    req: &RunRequest,
    config: &EngineConfig,
    grants: &GrantProfiles,
    providers: &[ProviderView<'_>],
    image: &ImageChoice,
) -> Result<Plan, RunError> {
    let id = Some(req.request_id.as_str());
    req.validate()
        .map_err(|r| RunError::refused(r.request_id.as_deref().or(id), r.reason, r.message))?;
    let limits = config
        .limits
        .resolve(req.limits.as_ref())
        .map_err(|m| RunError::refused(id, Reason::Request, m))?;
    // An unknown profile and a forbidden one get the same answer, so names cannot be
    // probed.
    let grant = match &req.grant {
        None => None,
        Some(name) => Some(
            grants
                .authorize(name, caller)
                .map_err(|e| RunError::refused(id, Reason::Permission, e.to_string()))?,
        ),
    };
    // A named image that is not here is refused before routing: no provider could serve it,
    // and none may serve another.
    let image = image
        .as_ref()
        .map_err(|why| RunError::refused(id, Reason::Environment, why.clone()))?;
    let floor = req.minimum_isolation.unwrap_or(config.default_floor);
    const NO_BROKER: &str = "this provider cannot carry a grant's broker channel: name a provider that can (process, crun, runc, runsc, qemu)";
    const NO_EGRESS: &str = "this provider cannot carry an egress grant's proxy: name a provider that can (crun, runc, runsc, qemu)";
    if let Some(Grant::Egress(p)) = &grant
        && Privileges::for_spec(&req.run).is_trial()
        && !p.trials()
    {
        return Err(RunError::refused(
            id,
            Reason::Permission,
            "this egress grant is not for runs with a trial step: its operator allows that with `trials = true`",
        ));
    }
    let egress = grant.as_ref().is_some_and(|g| g.egress().is_some());
    // Routing reads each reason as text, for the refusal that names them all.
    let reasons: Vec<(Option<String>, Option<String>)> = providers
        .iter()
        .map(|p| {
            let unsupported = match &p.supports {
                Err(why) => Some(why.to_string()),
                Ok(()) if grant.is_some() && !p.carries_broker => Some(NO_BROKER.to_owned()),
                Ok(()) if egress && !p.carries_egress => Some(NO_EGRESS.to_owned()),
                Ok(()) if p.image.is_err() => p.image.clone().err(),
                // It would fail while its sandbox is set up, which says nothing of the
                // provider: another takes it, or it is refused.
                Ok(()) => p
                    .memory_floor
                    .filter(|needs| limits.memory_bytes < *needs)
                    .map(|needs| Unsupported::MemoryBelowFloor { needs }.to_string()),
            };
            (
                unsupported,
                p.available.as_ref().err().map(Unavailable::why),
            )
        })
        .collect();
    let candidates: Vec<Candidate<'_>> = providers
        .iter()
        .zip(&reasons)
        .map(|(p, (unsupported, unavailable))| Candidate {
            name: p.name,
            tier: p.tier,
            cost: p.cost,
            available: unavailable.as_deref().map_or(Ok(()), Err),
            supports: unsupported.as_deref().map_or(Ok(()), Err),
        })
        .collect();
    let chosen = route(&candidates, floor, req.provider.as_deref())
        .map_err(|e| RunError::refused(id, e.reason, e.message))?;
    let provider = providers
        .iter()
        .position(|p| p.name == chosen)
        .expect("routing chooses among the candidates");
    Ok(Plan {
        provider,
        floor,
        limits,
        grant,
        privileges: Privileges::for_spec(&req.run),
        image: image.clone().filter(|_| providers[provider].uses_image),
    })
}

impl Plan {
    /// The provider's plan, once admission gave the run its uid slot and the engine its id
    /// and broker. Pure: the run uid and the controller uid follow from the slot
    /// (`admission::run_uid`, `admission::controller_uid`).
    pub fn launch(
        &self,
        req: &RunRequest,
        config: &EngineConfig,
        slot: usize,
        run_id: &str,
        broker: Option<BrokerChannel>,
    ) -> LaunchPlan {
        let uid = run_uid(config.sandbox_uid_base, slot);
        let controller = controller_uid(config.sandbox_uid_base, config.max_concurrent, slot);
        LaunchPlan {
            image: self.image.clone(),
            run_id: run_id.to_owned(),
            request_id: req.request_id.clone(),
            spec: req.run.clone(),
            limits: self.limits,
            uid,
            gid: uid,
            controller_uid: controller,
            controller_gid: controller,
            run_dir: run_dir(&config.state_dir, run_id),
            broker,
            privileges: self.privileges,
            tap: None,
        }
    }
}

fn run_dir(state_dir: &Path, run_id: &str) -> std::path::PathBuf {
    state_dir.join("runs").join(run_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use plimsoll_wire::{Language, RunSpec, Snippet};

    fn view(name: &'static str, tier: Tier, cost: u32) -> ProviderView<'static> {
        ProviderView {
            name,
            tier,
            cost,
            supports: Ok(()),
            memory_floor: None,
            carries_broker: true,
            carries_egress: true,
            available: Ok(()),
            uses_image: name != "process",
            image: Ok(()),
        }
    }

    fn request(run: RunSpec) -> RunRequest {
        RunRequest {
            image: None,
            protocol: plimsoll_wire::PROTOCOL,
            request_id: "req-1".into(),
            minimum_isolation: None,
            provider: None,
            limits: None,
            run,
            grant: None,
        }
    }

    fn snippet() -> RunSpec {
        RunSpec::Snippet(Snippet {
            language: Language::Python,
            code: "print(1)".into(),
        })
    }

    fn project(steps: &[&str]) -> RunSpec {
        plimsoll_testing::project(Vec::new(), steps, &[])
    }

    /// The plan of `req` for a caller with no grant, naming no image.
    fn decide(
        req: &RunRequest,
        c: &EngineConfig,
        views: &[ProviderView<'_>],
    ) -> Result<Plan, RunError> {
        plan("a", req, c, &GrantProfiles::none(), views, &Ok(None))
    }

    fn refusal(r: Result<Plan, RunError>) -> (Reason, String) {
        match r {
            Err(RunError::Refused {
                reason, message, ..
            }) => (reason, message),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    fn grants() -> GrantProfiles {
        GrantProfiles::parse(
            "[profiles.orders]\nbase_url = \"http://127.0.0.1:9\"\nroutes = [\"GET /orders/*\"]\ncallers = [\"alice\"]\ncall_budget = 5\n[profiles.orders.credential]\nkind = \"static\"\nsecret_env = \"ORDERS_TOKEN\"\n",
            |_| Some("s3cret".into()),
        )
        .unwrap()
    }

    #[test]
    fn privileges_are_decided_here_from_the_steps() {
        let c = EngineConfig::default();
        let views = [view("crun", Tier::Container, 80)];
        let trial = request(project(&[
            "echo ok",
            "plimsoll-trial-runner --scenario s.json -- python3 c.py",
        ]));
        let p = decide(&trial, &c, &views).unwrap();
        assert_eq!(p.privileges, Privileges::TrialRunner);
        let launch = p.launch(&trial, &c, 3, "run3", None);
        assert_eq!(launch.privileges, Privileges::TrialRunner);
        let ids = launch
            .trial_ids()
            .expect("a trial run is told its two uids");
        assert_eq!((ids.uid, ids.gid), (2_000_003, 2_000_003));
        assert_eq!(
            (ids.controller_uid, ids.controller_gid),
            (2_000_000 + 8 + 1 + 3, 2_000_000 + 8 + 1 + 3)
        );

        // The runner's name elsewhere in a step, a snippet: no privileges, no uids to tell.
        for run in [project(&["echo plimsoll-trial-runner"]), snippet()] {
            let req = request(run);
            let p = decide(&req, &c, &views).unwrap();
            assert_eq!(p.privileges, Privileges::Unprivileged);
            assert_eq!(p.launch(&req, &c, 0, "run0", None).trial_ids(), None);
        }
    }

    #[test]
    fn a_malformed_trial_step_is_refused_before_any_privilege() {
        let c = EngineConfig::default();
        let req = request(project(&[
            "plimsoll-trial-runner --scenario s.json -- node c.js; id",
        ]));
        let views = [view("crun", Tier::Container, 80)];
        let (reason, message) = refusal(decide(&req, &c, &views));
        assert_eq!(reason, Reason::Request);
        assert!(message.contains("`;`"), "{message}");
    }

    #[test]
    fn the_launch_plan_carries_the_decision_and_admission_s_part() {
        let c = EngineConfig {
            state_dir: "/state".into(),
            ..EngineConfig::default()
        };
        let req = request(snippet());
        let views = [view("process", Tier::Process, 10)];
        let req = RunRequest {
            minimum_isolation: Some(Tier::Process),
            ..req
        };
        let p = decide(&req, &c, &views).unwrap();
        assert_eq!((p.provider, p.floor), (0, Tier::Process));
        let l = p.launch(&req, &c, 5, "abc", None);
        assert_eq!(l.run_id, "abc");
        assert_eq!(l.request_id, "req-1");
        assert_eq!(l.run_dir, Path::new("/state/runs/abc"));
        assert_eq!((l.uid, l.gid), (2_000_005, 2_000_005));
        assert_eq!(l.limits, c.limits.resolve(None).unwrap());
        assert!(l.broker.is_none());
        assert_eq!(l.spec, req.run);
    }

    #[test]
    fn the_default_floor_applies_and_refuses_with_nothing_to_meet_it() {
        let c = EngineConfig::default();
        let req = request(snippet());
        let only_process = [view("process", Tier::Process, 10)];
        let (reason, _) = refusal(decide(&req, &c, &only_process));
        assert_eq!(reason, Reason::Isolation);
        let both = [
            view("process", Tier::Process, 10),
            view("crun", Tier::Container, 80),
        ];
        let p = decide(&req, &c, &both).unwrap();
        assert_eq!((p.provider, p.floor), (1, Tier::Container));
    }

    #[test]
    fn a_provider_whose_environment_moved_is_skipped_and_says_so_when_named() {
        let c = EngineConfig::default();
        let mut views = [
            view("crun", Tier::Container, 80),
            view("runc", Tier::Container, 100),
        ];
        views[0].available = Err(Unavailable::Stale);
        let req = request(snippet());
        let p = decide(&req, &c, &views).unwrap();
        assert_eq!(p.provider, 1, "the cheaper provider's environment moved");
        let named = RunRequest {
            provider: Some("crun".into()),
            ..request(snippet())
        };
        let (reason, message) = refusal(decide(&named, &c, &views));
        assert_eq!(reason, Reason::Environment);
        assert!(message.contains("being probed again"), "{message}");
        // With nothing else to take it, the refusal names both and why.
        views[1].available = Err(Unavailable::Probing);
        let (reason, message) = refusal(decide(&req, &c, &views));
        assert_eq!(reason, Reason::Isolation);
        assert!(
            message.contains("being probed again") && message.contains("not probed yet"),
            "{message}"
        );
    }

    #[test]
    fn an_image_is_refused_before_routing_and_skipped_where_it_cannot_run() {
        let c = EngineConfig::default();
        let req = request(snippet());
        // A named image the store does not have: refused, nothing routed.
        let missing: ImageChoice = Err("no image `x` here: the image store has sandbox".into());
        let views = vec![view("crun", Tier::Container, 10)];
        let (reason, message) = refusal(plan(
            "a",
            &req,
            &c,
            &GrantProfiles::none(),
            &views,
            &missing,
        ));
        assert_eq!(reason, Reason::Environment);
        assert!(message.contains("no image `x`"), "{message}");
        // One that cannot start the language (or one a provider cannot take): that
        // provider is skipped with the reason; none left is `unsupported`.
        let image = RunImage {
            name: "tools".into(),
            identity: format!("sha256:{}", "a".repeat(64)),
            rootfs: "/images/tools/rootfs".into(),
            disk: None,
            named: true,
        };
        let chosen: ImageChoice = Ok(Some(image.clone()));
        let mut crun = view("crun", Tier::Container, 10);
        crun.image = Err(
            "image `tools` cannot start python: /usr/bin/python3 is not an executable file in it"
                .into(),
        );
        let (reason, message) = refusal(plan(
            "a",
            &req,
            &c,
            &GrantProfiles::none(),
            &[crun.clone()],
            &chosen,
        ));
        assert_eq!(reason, Reason::Unsupported);
        assert!(message.contains("/usr/bin/python3"), "{message}");
        let runsc = view("runsc", Tier::Kernel, 20);
        let p = plan(
            "a",
            &req,
            &c,
            &GrantProfiles::none(),
            &[crun, runsc],
            &chosen,
        )
        .unwrap();
        assert_eq!((p.provider, p.image.as_ref()), (1, Some(&image)));
        // The process tier's plan carries no image, even the default one.
        let default: ImageChoice = Ok(Some(RunImage {
            named: false,
            ..image
        }));
        let process = view("process", Tier::Process, 1);
        let floor_process = RunRequest {
            minimum_isolation: Some(Tier::Process),
            ..request(snippet())
        };
        let p = plan(
            "a",
            &floor_process,
            &c,
            &GrantProfiles::none(),
            &[process],
            &default,
        )
        .unwrap();
        assert_eq!(p.image, None);
    }

    #[test]
    fn a_grant_needs_a_caller_it_names_and_a_provider_that_carries_it() {
        let c = EngineConfig::default();
        let g = grants();
        let req = RunRequest {
            grant: Some("orders".into()),
            ..request(snippet())
        };
        let mut views = [view("crun", Tier::Container, 80)];
        let p = plan("alice", &req, &c, &g, &views, &Ok(None)).unwrap();
        assert_eq!(p.grant.as_ref().map(|p| p.name()), Some("orders"));
        let (reason, _) = refusal(plan("bob", &req, &c, &g, &views, &Ok(None)));
        assert_eq!(reason, Reason::Permission);
        views[0].carries_broker = false;
        let (reason, message) = refusal(plan("alice", &req, &c, &g, &views, &Ok(None)));
        assert_eq!(reason, Reason::Unsupported);
        assert!(message.contains("broker channel"), "{message}");
    }

    #[test]
    fn limits_beyond_the_operator_s_maximum_are_the_request_s_fault() {
        let c = EngineConfig::default();
        let req = RunRequest {
            limits: Some(plimsoll_wire::Limits {
                timeout_ms: Some(u64::MAX),
                ..Default::default()
            }),
            ..request(snippet())
        };
        let views = [view("crun", Tier::Container, 80)];
        let (reason, _) = refusal(decide(&req, &c, &views));
        assert_eq!(reason, Reason::Request);
    }

    /// #28 (13): what cannot run is refused here, before any provider sees it, so that it
    /// can neither fail inside nor say anything about the provider: a step with a NUL byte
    /// (it failed `sandbox_failed`), limits below what an interpreter needs (they failed
    /// `environment`), each `request`, naming the minimum.
    #[test]
    fn a_request_that_cannot_run_is_refused_before_routing() {
        let c = EngineConfig::default();
        let views = [view("crun", Tier::Container, 80)];
        let nul = request(project(&["echo a\0b"]));
        let (reason, message) = refusal(decide(&nul, &c, &views));
        assert_eq!(reason, Reason::Request);
        assert!(message.contains("NUL"), "{message}");
        for (limits, min) in [
            (
                plimsoll_wire::Limits {
                    memory_bytes: Some(1),
                    ..Default::default()
                },
                plimsoll_wire::Limits::MIN_MEMORY_BYTES,
            ),
            (
                plimsoll_wire::Limits {
                    pids: Some(1),
                    ..Default::default()
                },
                plimsoll_wire::Limits::MIN_PIDS,
            ),
        ] {
            let req = RunRequest {
                limits: Some(limits.clone()),
                ..request(snippet())
            };
            let (reason, message) = refusal(decide(&req, &c, &views));
            assert_eq!(reason, Reason::Request, "{limits:?}");
            assert!(message.contains(&format!("minimum {min}")), "{message}");
        }
        // At the minimums, it is planned.
        let at_min = RunRequest {
            limits: Some(plimsoll_wire::Limits {
                memory_bytes: Some(plimsoll_wire::Limits::MIN_MEMORY_BYTES),
                pids: Some(plimsoll_wire::Limits::MIN_PIDS),
                disk_bytes: Some(plimsoll_wire::Limits::MIN_DISK_BYTES),
                ..Default::default()
            }),
            ..request(snippet())
        };
        assert!(decide(&at_min, &c, &views).is_ok());
    }

    /// #28 (13): a run asking for less memory than its interpreter needs at a provider (node
    /// at the process tier, whose address space is bounded by `memory_bytes`) is routed to
    /// another, or refused `unsupported` when none can take it: never dispatched to fail
    /// while its sandbox is set up (`environment`, and a re-check).
    #[test]
    fn a_run_below_a_provider_s_memory_floor_goes_elsewhere_or_is_refused() {
        let c = EngineConfig::default();
        let mut process = view("process", Tier::Process, 10);
        process.memory_floor = Some(768 << 20);
        let small = RunRequest {
            minimum_isolation: Some(Tier::Process),
            limits: Some(plimsoll_wire::Limits {
                memory_bytes: Some(256 << 20),
                ..Default::default()
            }),
            ..request(snippet())
        };
        let both = [process.clone(), view("crun", Tier::Container, 80)];
        let p = decide(&small, &c, &both).unwrap();
        assert_eq!(
            p.provider, 1,
            "crun takes what the process tier cannot start"
        );
        let (reason, message) = refusal(decide(&small, &c, &[process.clone()]));
        assert_eq!(reason, Reason::Unsupported);
        assert!(message.contains("at least 805306368"), "{message}");
        // At the floor (and by default, 1 GiB) it runs there.
        let enough = RunRequest {
            limits: Some(plimsoll_wire::Limits {
                memory_bytes: Some(768 << 20),
                ..Default::default()
            }),
            ..small.clone()
        };
        for req in [
            enough,
            RunRequest {
                limits: None,
                ..small
            },
        ] {
            let p = decide(&req, &c, &both).unwrap();
            assert_eq!(p.provider, 0);
        }
    }
}
