//! Routing: the cheapest available provider that meets the floor, or the one named.

use plimsoll_wire::{Reason, Tier};

/// A provider as routing sees it.
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    /// Its name.
    pub name: &'a str,
    /// The tier its current evidence supports.
    pub tier: Tier,
    /// Lower is cheaper.
    pub cost: u32,
    /// `Err(why)` when its probe failed.
    pub available: Result<(), &'a str>,
    /// `Err(why)` when it cannot do this kind of run.
    pub supports: Result<(), &'a str>,
}

/// No provider can take the run; nothing ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteError {
    /// `request`, `unsupported`, `isolation` or `environment`.
    pub reason: Reason,
    /// What is wrong and how to get a provider that fits.
    pub message: String,
}

fn how_to_get(floor: Tier) -> &'static str {
    match floor {
        Tier::Process => "configure the process provider",
        Tier::Container => {
            "install crun or runc and build the sandbox image (make images), or accept the process tier with --min-isolation process"
        }
        Tier::Kernel => {
            "install gVisor runsc (scripts/install-deps) and build the sandbox image (make images)"
        }
        Tier::Vm => {
            "run on a host with hardware virtualisation (KVM) and configure the VM provider"
        }
    }
}

/// Picks the provider for a run. Among available providers that meet `floor` and support the
/// run, the cheapest wins (ties go to the first configured). A `named` provider must exist,
/// be available, support the run and meet the floor.
pub fn route<'a>(
    candidates: &[Candidate<'a>],
    floor: Tier,
    named: Option<&str>,
) -> Result<&'a str, RouteError> {
    if let Some(name) = named {
        let Some(c) = candidates.iter().find(|c| c.name == name) else {
            let known: Vec<&str> = candidates.iter().map(|c| c.name).collect();
            return Err(RouteError {
                reason: Reason::Request,
                message: format!(
                    "no provider named `{name}` on this server; configured: {}",
                    known.join(", ")
                ),
            });
        };
        if c.tier < floor {
            return Err(RouteError {
                reason: Reason::Isolation,
                message: format!(
                    "provider `{name}` gives `{}`, below the floor `{floor}`: name another provider or lower the floor",
                    c.tier
                ),
            });
        }
        if let Err(why) = c.supports {
            return Err(RouteError {
                reason: Reason::Unsupported,
                message: format!("provider `{name}`: {why}"),
            });
        }
        if let Err(why) = c.available {
            return Err(RouteError {
                reason: Reason::Environment,
                message: format!("provider `{name}` is not available: {why}"),
            });
        }
        return Ok(c.name);
    }
    let meeting: Vec<&Candidate<'a>> = candidates.iter().filter(|c| c.tier >= floor).collect();
    let supporting: Vec<&Candidate<'a>> = meeting
        .iter()
        .copied()
        .filter(|c| c.supports.is_ok())
        .collect();
    if let Some(best) = supporting
        .iter()
        .filter(|c| c.available.is_ok())
        .min_by_key(|c| c.cost)
    {
        return Ok(best.name);
    }
    let every = why_not_taken(candidates, floor);
    if meeting.is_empty() {
        let offered: Vec<String> = candidates
            .iter()
            .filter(|c| c.available.is_ok())
            .map(|c| format!("{} ({})", c.name, c.tier))
            .collect();
        return Err(RouteError {
            reason: Reason::Isolation,
            message: format!(
                "no available provider meets the floor `{floor}` (offered here: {}; not taken: {every}); to get one, {}",
                if offered.is_empty() {
                    "none".to_owned()
                } else {
                    offered.join(", ")
                },
                how_to_get(floor)
            ),
        });
    }
    if supporting.is_empty() {
        return Err(RouteError {
            reason: Reason::Unsupported,
            message: format!(
                "no provider at or above `{floor}` can do this run (not taken: {every})"
            ),
        });
    }
    Err(RouteError {
        reason: Reason::Isolation,
        message: format!(
            "no available provider meets the floor `{floor}`; those that would are withdrawn (not taken: {every}); to get one, {}",
            how_to_get(floor)
        ),
    })
}

/// Every candidate and why it was not taken, in the order configured: below the floor,
/// cannot do this kind of run, or not available (and why).
fn why_not_taken(candidates: &[Candidate<'_>], floor: Tier) -> String {
    let lines: Vec<String> = candidates
        .iter()
        .map(|c| {
            let why = if c.tier < floor {
                format!("gives `{}`, below the floor", c.tier)
            } else if let Err(w) = c.supports {
                format!("cannot do this run: {w}")
            } else if let Err(w) = c.available {
                format!("not available: {w}")
            } else {
                "available".to_owned()
            };
            format!("{} ({}): {why}", c.name, c.tier)
        })
        .collect();
    if lines.is_empty() {
        "no provider is configured".to_owned()
    } else {
        lines.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(name: &str, tier: Tier, cost: u32) -> Candidate<'_> {
        Candidate {
            name,
            tier,
            cost,
            available: Ok(()),
            supports: Ok(()),
        }
    }

    #[test]
    fn cheapest_meeting_the_floor_wins() {
        let cs = [
            c("runsc", Tier::Kernel, 150),
            c("crun", Tier::Container, 12),
            c("process", Tier::Process, 2),
        ];
        assert_eq!(route(&cs, Tier::Process, None).unwrap(), "process");
        assert_eq!(route(&cs, Tier::Container, None).unwrap(), "crun");
        assert_eq!(route(&cs, Tier::Kernel, None).unwrap(), "runsc");
        let e = route(&cs, Tier::Vm, None).unwrap_err();
        assert_eq!(e.reason, Reason::Isolation);
        assert!(e.message.contains("KVM"), "{}", e.message);
    }

    #[test]
    fn unavailable_providers_are_skipped_and_reported() {
        let mut crun = c("crun", Tier::Container, 12);
        crun.available = Err("probe failed");
        let cs = [crun, c("process", Tier::Process, 2)];
        let e = route(&cs, Tier::Container, None).unwrap_err();
        assert_eq!(e.reason, Reason::Isolation);
        assert!(e.message.contains("probe failed"));
        assert_eq!(route(&cs, Tier::Process, None).unwrap(), "process");
    }

    #[test]
    fn named_provider_must_meet_the_floor() {
        let cs = [
            c("crun", Tier::Container, 12),
            c("process", Tier::Process, 2),
        ];
        assert_eq!(route(&cs, Tier::Process, Some("crun")).unwrap(), "crun");
        assert_eq!(
            route(&cs, Tier::Container, Some("process"))
                .unwrap_err()
                .reason,
            Reason::Isolation
        );
        assert_eq!(
            route(&cs, Tier::Process, Some("nope")).unwrap_err().reason,
            Reason::Request
        );
    }

    #[test]
    fn a_refusal_names_every_provider_and_why_it_was_not_taken() {
        let mut crun = c("crun", Tier::Container, 12);
        crun.available = Err("crun is not offered: image missing");
        let mut runsc = c("runsc", Tier::Kernel, 150);
        runsc.supports = Err("snippets only");
        let qemu = c("qemu", Tier::Kernel, 400);
        let cs = [c("process", Tier::Process, 2), crun, runsc, qemu];
        let e = route(&cs, Tier::Vm, None).unwrap_err();
        assert_eq!(e.reason, Reason::Isolation);
        for part in [
            "process (process): gives `process`, below the floor",
            "crun (container): gives `container`, below the floor",
            "runsc (kernel): gives `kernel`, below the floor",
            "qemu (kernel): gives `kernel`, below the floor",
        ] {
            assert!(e.message.contains(part), "{part} missing: {}", e.message);
        }
        // Without qemu nothing at `container` or above is left.
        let e = route(&cs[..3], Tier::Container, None).unwrap_err();
        assert_eq!(e.reason, Reason::Isolation);
        for part in [
            "process (process): gives `process`, below the floor",
            "crun (container): not available: crun is not offered: image missing",
            "runsc (kernel): cannot do this run: snippets only",
        ] {
            assert!(e.message.contains(part), "{part} missing: {}", e.message);
        }
        // qemu was available and meets the floor: it is taken.
        assert_eq!(route(&cs, Tier::Kernel, None).unwrap(), "qemu");
    }

    #[test]
    fn unsupported_kind_is_unsupported() {
        let mut p = c("process", Tier::Process, 2);
        p.supports = Err("snippets only");
        assert_eq!(
            route(&[p], Tier::Process, None).unwrap_err().reason,
            Reason::Unsupported
        );
    }
}
