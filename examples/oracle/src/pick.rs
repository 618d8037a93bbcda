//! Which provider runs the three trials: the one asked for, or the strongest the daemon has
//! available at the floor or above.

use plimsoll_wire::{ProviderInfo, Tier};

/// No provider can run the oracle's trials.
#[derive(Debug, thiserror::Error)]
pub enum PickProviderError {
    /// The provider asked for is not configured.
    #[error(
        "the daemon has no provider `{name}` (it has: {have}): pass one of those to --provider"
    )]
    Unknown {
        /// Asked for.
        name: String,
        /// What the daemon lists.
        have: String,
    },
    /// The provider asked for is configured but withdrawn.
    #[error("provider `{name}` is not available: {why}")]
    Unavailable {
        /// Asked for.
        name: String,
        /// The daemon's reason.
        why: String,
    },
    /// The provider asked for is below the floor.
    #[error(
        "provider `{name}` is at tier {tier}, below the floor {floor}: the controllers are untrusted code; pick a provider of tier {floor} or above"
    )]
    BelowFloor {
        /// Asked for.
        name: String,
        /// Its tier.
        tier: Tier,
        /// The floor.
        floor: Tier,
    },
    /// Nothing available meets the floor.
    #[error(
        "no available provider meets the floor {floor}: {list}; install and build what the reasons name (`make deps build images`), or run as root"
    )]
    NoneAvailable {
        /// The floor.
        floor: Tier,
        /// Every provider with its state.
        list: String,
    },
}

/// Picks the provider. With `wanted`, that one (it must be available and meet the floor).
/// Without, the available provider of the highest tier at or above `floor`; among providers
/// of that tier, the first in the daemon's list. The daemon lists its providers cheapest first
/// (by the start-up cost each declares: crun before runc, runsc before QEMU under TCG), so a
/// tie goes to the cheaper one, as the daemon's own routing would choose.
pub fn pick<'a>(
    providers: &'a [ProviderInfo],
    wanted: Option<&str>,
    floor: Tier,
) -> Result<&'a ProviderInfo, PickProviderError> {
    if let Some(name) = wanted {
        let p = providers.iter().find(|p| p.name == name).ok_or_else(|| {
            PickProviderError::Unknown {
                name: name.to_owned(),
                have: providers
                    .iter()
                    .map(|p| p.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            }
        })?;
        if !p.available {
            return Err(PickProviderError::Unavailable {
                name: name.to_owned(),
                why: reason(p),
            });
        }
        if p.isolation < floor {
            return Err(PickProviderError::BelowFloor {
                name: name.to_owned(),
                tier: p.isolation,
                floor,
            });
        }
        return Ok(p);
    }
    let mut best: Option<&ProviderInfo> = None;
    for p in providers
        .iter()
        .filter(|p| p.available && p.isolation >= floor)
    {
        // Strictly stronger only: the first of a tier (the cheapest) stays.
        if best.is_none_or(|b| p.isolation > b.isolation) {
            best = Some(p);
        }
    }
    best.ok_or_else(|| PickProviderError::NoneAvailable {
        floor,
        list: describe(providers),
    })
}

fn reason(p: &ProviderInfo) -> String {
    p.unavailable_reason
        .clone()
        .unwrap_or_else(|| "withdrawn (no reason given)".to_owned())
}

/// Every provider on one line: `crun (container): available; qemu (kernel): <reason>`.
pub fn describe(providers: &[ProviderInfo]) -> String {
    if providers.is_empty() {
        return "the daemon lists no provider".to_owned();
    }
    providers
        .iter()
        .map(|p| {
            let state = if p.available {
                "available".to_owned()
            } else {
                reason(p)
            };
            format!("{} ({}): {state}", p.name, p.isolation)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use plimsoll_wire::Evidence;

    fn info(name: &str, tier: Tier, available: bool) -> ProviderInfo {
        ProviderInfo {
            name: name.into(),
            isolation: tier,
            available,
            unavailable_reason: (!available).then(|| format!("{name} is missing")),
            evidence: Evidence {
                provider: name.into(),
                isolation: tier,
                config: Default::default(),
                binaries: Vec::new(),
                probe: None,
                checks: Default::default(),
                environment: String::new(),
                checked_unix_ms: 0,
            },
            evidence_sha256: String::new(),
        }
    }

    fn all(qemu: Tier, qemu_up: bool) -> Vec<ProviderInfo> {
        vec![
            info("process", Tier::Process, true),
            info("crun", Tier::Container, true),
            info("runc", Tier::Container, true),
            info("runsc", Tier::Kernel, true),
            info("qemu", qemu, qemu_up),
        ]
    }

    #[test]
    fn the_strongest_wins_and_a_tie_goes_to_the_cheaper() {
        let c = Tier::Container;
        // QEMU under TCG is `kernel` like runsc, listed after it (dearer): runsc.
        assert_eq!(
            pick(&all(Tier::Kernel, true), None, c).unwrap().name,
            "runsc"
        );
        // With KVM it is `vm`: qemu.
        assert_eq!(pick(&all(Tier::Vm, true), None, c).unwrap().name, "qemu");
        // Without runsc and qemu: crun, the cheaper container.
        let mut p = all(Tier::Vm, false);
        p[3].available = false;
        assert_eq!(pick(&p, None, c).unwrap().name, "crun");
        // Only process: nothing meets the floor.
        let only = vec![info("process", Tier::Process, true), info("crun", c, false)];
        let e = pick(&only, None, c).unwrap_err();
        assert!(matches!(e, PickProviderError::NoneAvailable { .. }), "{e}");
        assert!(e.to_string().contains("crun is missing"), "{e}");
    }

    #[test]
    fn a_named_provider_must_exist_be_available_and_meet_the_floor() {
        let c = Tier::Container;
        let p = all(Tier::Kernel, false);
        assert_eq!(pick(&p, Some("runc"), c).unwrap().name, "runc");
        assert!(matches!(
            pick(&p, Some("nope"), c),
            Err(PickProviderError::Unknown { .. })
        ));
        assert!(matches!(
            pick(&p, Some("qemu"), c),
            Err(PickProviderError::Unavailable { .. })
        ));
        assert!(matches!(
            pick(&p, Some("process"), c),
            Err(PickProviderError::BelowFloor { .. })
        ));
    }
}
