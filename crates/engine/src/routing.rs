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
    if meeting.is_empty() {
        let offered: Vec<String> = candidates
            .iter()
            .filter(|c| c.available.is_ok())
            .map(|c| format!("{} ({})", c.name, c.tier))
            .collect();
        return Err(RouteError {
            reason: Reason::Isolation,
            message: format!(
                "no available provider meets the floor `{floor}` (offered here: {}); to get one, {}",
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
        let why: Vec<String> = meeting
            .iter()
            .filter_map(|c| c.supports.err().map(|w| format!("{}: {w}", c.name)))
            .collect();
        return Err(RouteError {
            reason: Reason::Unsupported,
            message: format!(
                "no provider at or above `{floor}` can do this run ({})",
                why.join("; ")
            ),
        });
    }
    let why: Vec<String> = supporting
        .iter()
        .filter_map(|c| c.available.err().map(|w| format!("{}: {w}", c.name)))
        .collect();
    Err(RouteError {
        reason: Reason::Isolation,
        message: format!(
            "no available provider meets the floor `{floor}`; those that would are withdrawn ({}); to get one, {}",
            why.join("; "),
            how_to_get(floor)
        ),
    })
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
    fn unsupported_kind_is_unsupported() {
        let mut p = c("process", Tier::Process, 2);
        p.supports = Err("snippets only");
        assert_eq!(
            route(&[p], Tier::Process, None).unwrap_err().reason,
            Reason::Unsupported
        );
    }
}
