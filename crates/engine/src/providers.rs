//! The closed set of providers, dispatched through one enum.

use plimsoll_oci::OciProvider;
use plimsoll_process::ProcessProvider;
use plimsoll_sandbox::{LaunchError, LaunchPlan, Outcome, Probed, Provider};
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
}
