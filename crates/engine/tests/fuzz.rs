//! Property-based fuzzing of the engine's two pure decisions before dispatch: routing (a
//! route is only ever to an available provider that supports the run and meets the floor,
//! the cheapest such unless one is named; a refusal only when there is none) and limit
//! resolution (nothing above a maximum is ever resolved; an ask above one is refused).
//!
//! Cases per property are bounded (`PROPTEST_CASES` raises them; DEVELOPERS.md). Failures are
//! kept in `tests/fuzz.proptest-regressions` and replayed first: commit that file.

use std::time::Duration;

use plimsoll_engine::{Candidate, LimitPolicy, Reason, ResolvedLimits, route};
use plimsoll_wire::{Limits, Tier};
use proptest::prelude::*;

#[path = "../../../tests/fuzz/common.rs"]
mod common;
use common::{config, tier};

const NAMES: [&str; 6] = ["p0", "p1", "p2", "p3", "p4", "p5"];

fn candidates() -> impl Strategy<Value = Vec<Candidate<'static>>> {
    proptest::collection::vec((tier(), 0u32..5, any::<bool>(), any::<bool>()), 0..6).prop_map(
        |cs| {
            cs.into_iter()
                .enumerate()
                .map(|(i, (tier, cost, available, supports))| Candidate {
                    name: NAMES[i],
                    tier,
                    cost,
                    available: if available {
                        Ok(())
                    } else {
                        Err("probe failed")
                    },
                    supports: if supports {
                        Ok(())
                    } else {
                        Err("cannot do this run")
                    },
                })
                .collect()
        },
    )
}

fn fit(c: &Candidate<'_>, floor: Tier) -> bool {
    c.tier >= floor && c.available.is_ok() && c.supports.is_ok()
}

fn limits_strategy() -> impl Strategy<Value = ResolvedLimits> {
    (1u64..1 << 40, any::<[u64; 5]>()).prop_map(|(ms, n)| ResolvedLimits {
        timeout: Duration::from_millis(ms),
        memory_bytes: n[0],
        output_bytes: n[1],
        pids: n[2],
        disk_bytes: n[3],
        artifact_bytes: n[4],
    })
}

fn fields(l: &ResolvedLimits) -> [u64; 6] {
    [
        l.timeout.as_millis() as u64,
        l.memory_bytes,
        l.output_bytes,
        l.pids,
        l.disk_bytes,
        l.artifact_bytes,
    ]
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn a_route_is_only_ever_to_a_provider_that_may_run_it(
        cs in candidates(),
        floor in tier(),
        named in proptest::option::of(prop_oneof![proptest::sample::select(&NAMES[..]), Just("nope")]),
    ) {
        match route(&cs, floor, named) {
            Ok(name) => {
                let c = cs.iter().find(|c| c.name == name).unwrap();
                prop_assert!(fit(c, floor), "routed to {c:?} under floor {floor}");
                match named {
                    Some(n) => prop_assert_eq!(name, n),
                    None => {
                        let cheapest = cs.iter().filter(|c| fit(c, floor)).map(|c| c.cost).min();
                        prop_assert_eq!(Some(c.cost), cheapest);
                    }
                }
            }
            Err(e) => {
                // A refusal only when nothing (or the named provider) may run it.
                match named {
                    Some(n) => prop_assert!(!cs.iter().any(|c| c.name == n && fit(c, floor))),
                    None => prop_assert!(!cs.iter().any(|c| fit(c, floor)), "refused {e:?} with {cs:?}"),
                }
                prop_assert!(
                    matches!(e.reason, Reason::Request | Reason::Isolation | Reason::Unsupported | Reason::Environment),
                    "{e:?}"
                );
                if cs.iter().all(|c| c.tier < floor) && named.is_none() {
                    prop_assert_eq!(e.reason, Reason::Isolation);
                }
                prop_assert!(!e.message.is_empty());
            }
        }
    }

    #[test]
    fn resolved_limits_never_exceed_a_maximum(
        defaults in limits_strategy(),
        maximums in limits_strategy(),
        asked in proptest::option::of(proptest::collection::vec(proptest::option::of(any::<u64>()), 6)),
    ) {
        let policy = LimitPolicy { defaults, maximums };
        let asked = asked.map(|a| Limits {
            timeout_ms: a[0],
            memory_bytes: a[1],
            output_bytes: a[2],
            pids: a[3],
            disk_bytes: a[4],
            artifact_bytes: a[5],
        });
        let ask = asked.as_ref().map_or([None; 6], |a| {
            [a.timeout_ms, a.memory_bytes, a.output_bytes, a.pids, a.disk_bytes, a.artifact_bytes]
        });
        let max = fields(&maximums);
        match policy.resolve(asked.as_ref()) {
            Ok(r) => {
                let got = fields(&r);
                for i in 0..6 {
                    prop_assert!(got[i] <= max[i], "field {i}: {} above {}", got[i], max[i]);
                    if let Some(a) = ask[i] {
                        prop_assert_eq!(got[i], a);
                    }
                }
            }
            Err(m) => {
                prop_assert!((0..6).any(|i| ask[i].is_some_and(|a| a > max[i])), "refused: {m}");
                prop_assert!(m.contains("maximum"));
            }
        }
    }
}
