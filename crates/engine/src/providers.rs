//! The closed set of providers, dispatched through one enum.

use plimsoll_oci::OciProvider;
use plimsoll_process::ProcessProvider;
use plimsoll_sandbox::{LaunchError, LaunchPlan, Outcome, Probed, Provider, Unsupported};
use plimsoll_vm::VmProvider;
use plimsoll_wire::{RunSpec, Tier};

/// Every provider family plimsoll has.
#[derive(Debug)]
pub enum AnyProvider {
    /// A hardened child process.
    Process(ProcessProvider),
    /// An OCI runtime driven directly: crun or runc (`container`), runsc (`kernel`).
    Oci(Box<OciProvider>),
    /// A QEMU microVM per run: `vm` under KVM, `kernel` under TCG emulation.
    Vm(Box<VmProvider>),
    /// One of the above, hosted by the launcher and reached over its socket
    /// (docs/privileges.md, "The launcher").
    Remote(Box<crate::launch::Remote>),
}

impl AnyProvider {
    fn inner(&self) -> &dyn Provider {
        match self {
            AnyProvider::Process(p) => p,
            AnyProvider::Oci(p) => p.as_ref(),
            AnyProvider::Vm(p) => p.as_ref(),
            AnyProvider::Remote(p) => p.as_ref(),
        }
    }
}

impl Provider for AnyProvider {
    fn name(&self) -> &str {
        self.inner().name()
    }
    fn nominal_tier(&self) -> Tier {
        self.inner().nominal_tier()
    }
    fn cost(&self) -> u32 {
        self.inner().cost()
    }
    fn supports(&self, spec: &RunSpec) -> Result<(), plimsoll_sandbox::Unsupported> {
        self.inner().supports(spec)
    }
    fn memory_floor(&self, spec: &RunSpec) -> Option<u64> {
        self.inner().memory_floor(spec)
    }
    fn takes_image(
        &self,
        image: &plimsoll_sandbox::RunImage,
    ) -> Result<(), plimsoll_sandbox::Unsupported> {
        self.inner().takes_image(image)
    }
    fn uses_image(&self) -> bool {
        self.inner().uses_image()
    }
    fn probe(&self) -> Probed {
        self.inner().probe()
    }
    fn run(&self, plan: &LaunchPlan) -> Result<Outcome, LaunchError> {
        self.inner().run(plan)
    }
    fn run_then_tear_down(
        &self,
        plan: &LaunchPlan,
    ) -> Result<(Outcome, Option<plimsoll_sandbox::Teardown>), LaunchError> {
        self.inner().run_then_tear_down(plan)
    }
    fn supports_broker(&self) -> bool {
        self.inner().supports_broker()
    }
    fn supports_egress(&self) -> bool {
        self.inner().supports_egress()
    }
    fn adopt(&self, evidence: &plimsoll_wire::Evidence) -> Result<(), plimsoll_sandbox::Stale> {
        self.inner().adopt(evidence)
    }
    fn environment_holds(
        &self,
        evidence: &plimsoll_wire::Evidence,
    ) -> Result<(), plimsoll_sandbox::Stale> {
        self.inner().environment_holds(evidence)
    }
    fn warms(&self) -> bool {
        self.inner().warms()
    }
    fn warm(
        &self,
        plan: &plimsoll_sandbox::WarmPlan,
    ) -> Result<Box<dyn plimsoll_sandbox::WarmMember>, LaunchError> {
        self.inner().warm(plan)
    }
    fn opens_sessions(&self) -> bool {
        self.inner().opens_sessions()
    }
    fn cancel(
        &self,
        sandbox: &plimsoll_sandbox::RunningIn,
    ) -> Result<(), plimsoll_sandbox::CancelRunError> {
        self.inner().cancel(sandbox)
    }
    fn open_session(
        &self,
        plan: &LaunchPlan,
        lifetime: std::time::Duration,
    ) -> Result<Box<dyn plimsoll_sandbox::SessionSandbox>, LaunchError> {
        self.inner().open_session(plan, lifetime)
    }
    fn restore_session(
        &self,
        plan: &LaunchPlan,
        lifetime: std::time::Duration,
        image: &std::path::Path,
    ) -> Result<Box<dyn plimsoll_sandbox::SessionSandbox>, LaunchError> {
        self.inner().restore_session(plan, lifetime, image)
    }
}

/// What routing asks of one provider for one run.
pub(crate) struct Admission {
    /// Whether it can do this kind of run at all.
    pub supports: Result<(), plimsoll_sandbox::Unsupported>,
    /// Whether it can run in the run's image (yes when there is none).
    pub takes_image: Result<(), plimsoll_sandbox::Unsupported>,
    /// The least memory the run starts under there.
    pub memory_floor: Option<u64>,
    /// Whether the environment of the evidence it is offered on still holds, when that was
    /// answered with the rest (by a launcher that knows the evidence); `None`: ask
    /// [`Provider::environment_holds`].
    pub holds: Option<Result<(), plimsoll_sandbox::Stale>>,
}

/// Each provider's [`Admission`] for a run of `spec` in `image`, in their order. Providers
/// the launcher hosts (the split daemon) are asked all at once, in one round trip; others
/// are asked here.
///
/// Each provider comes paired with the digest of the evidence it is offered on
/// (none: not offered), so the launcher can say in the same round trip whether that
/// environment still holds.
pub(crate) fn admissions<'a>(
    providers: impl Iterator<Item = (&'a AnyProvider, Option<&'a str>)> + Clone,
    spec: &RunSpec,
    image: Option<&plimsoll_sandbox::RunImage>,
) -> Vec<Admission> {
    let remote = providers.clone().find_map(|(p, _)| match p {
        AnyProvider::Remote(r) => Some(r),
        _ => None,
    });
    let asked = remote.map(|r| {
        let evidence = providers
            .clone()
            .filter_map(|(p, sha)| Some((p.name().to_owned(), sha?.to_owned())))
            .collect();
        r.admit_all(spec, image, evidence)
    });
    providers
        .map(|(p, _)| match (p, &asked) {
            (AnyProvider::Remote(_), Some(Ok(all))) => {
                match all.iter().find(|a| a.provider == p.name()) {
                    Some(a) => Admission {
                        supports: a.supports.clone().map_err(Unsupported::Said),
                        takes_image: a.takes_image.clone().map_err(Unsupported::Said),
                        memory_floor: a.memory_floor,
                        holds: a
                            .holds
                            .clone()
                            .map(|r| r.map_err(plimsoll_sandbox::Stale::Said)),
                    },
                    None => refused(format!(
                        "the launcher hosts no provider `{}`; restart the daemon",
                        p.name()
                    )),
                }
            }
            (AnyProvider::Remote(_), Some(Err(why))) => refused(why.clone()),
            _ => Admission {
                supports: p.supports(spec),
                takes_image: image.map_or(Ok(()), |i| p.takes_image(i)),
                memory_floor: p.memory_floor(spec),
                holds: None,
            },
        })
        .collect()
}

/// An admission that says no, for `why`.
fn refused(why: String) -> Admission {
    Admission {
        supports: Err(Unsupported::Said(why.clone())),
        takes_image: Err(Unsupported::Said(why)),
        memory_floor: None,
        holds: None,
    }
}
