//! Placement: which nodes may take a run or a session's open, in the order to try them.
//!
//! A node may take it when it is ready and one of its available providers meets the
//! request's floor (the node's own default floor when the request sets none), is the named
//! provider when one is named, and keeps sessions for an open (every tier above `process`);
//! and when the request names an image, the node keeps it. Of those, two are picked at random
//! and the less loaded goes first (its daemon's runs in flight and sessions open, plus this
//! router's exchanges to it since); the others follow, least loaded first, to be tried if a
//! node refuses with nothing run (see `serve`). When no node may take it, the router refuses
//! it itself, not dispatched, with the reason a node would have given.

use std::net::SocketAddr;

use plimsoll_wire::{Reason, Tier};

use crate::nodes::{Cluster, Node};

/// What a request asks of the node that takes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Want {
    /// `minimum_isolation`; the node's default floor when absent.
    pub floor: Option<Tier>,
    /// `provider`, when named.
    pub provider: Option<String>,
    /// `image`, when named (a name or `sha256:` identity).
    pub image: Option<String>,
    /// A session's open: its provider must keep sessions.
    pub session: bool,
}

impl Want {
    /// What a run request or session open asks, read leniently from its JSON: a member of
    /// the wrong type counts as absent (the node that takes it refuses it properly).
    pub fn of(body: &serde_json::Value, session: bool) -> Want {
        Want::read(body, "minimum_isolation", session)
    }

    /// What an MCP tool call that runs (or opens a session) asks, from its arguments.
    pub fn of_tool(args: &serde_json::Value, session: bool) -> Want {
        Want::read(args, "min_isolation", session)
    }

    fn read(body: &serde_json::Value, floor: &str, session: bool) -> Want {
        let text = |k: &str| body.get(k).and_then(|v| v.as_str()).map(str::to_owned);
        Want {
            floor: text(floor).and_then(|t| t.parse().ok()),
            provider: text("provider"),
            image: text("image"),
            session,
        }
    }
}

/// Why no node may take a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoNode {
    /// The not-dispatched reason.
    pub reason: Reason,
    /// What to tell the caller.
    pub message: String,
}

/// Whether `node` may take what `want` asks, and if not, why (reason and words).
fn fits(node: &Node, want: &Want) -> Result<(), (Reason, String)> {
    let Some(p) = node.providers.as_ref().filter(|_| node.usable()) else {
        return Err((Reason::Environment, format!("{} is not ready", node.addr)));
    };
    let floor = want.floor.unwrap_or(p.default_floor);
    let meets = p.providers.iter().any(|x| {
        x.available
            && x.isolation >= floor
            && want.provider.as_ref().is_none_or(|n| *n == x.name)
            && (!want.session || x.isolation > Tier::Process)
    });
    if !meets {
        let strongest = node
            .tiers()
            .first()
            .map_or("nothing".to_owned(), |(n, t)| format!("{n} at {t}"));
        let what = match &want.provider {
            Some(n) => format!("provider {n} at or above the floor {floor}"),
            None => format!("provider at or above the floor {floor}"),
        };
        let keeps = if want.session {
            " that keeps sessions"
        } else {
            ""
        };
        return Err((
            Reason::Isolation,
            format!(
                "{} has no available {what}{keeps} (its strongest: {strongest})",
                node.addr
            ),
        ));
    }
    if let Some(image) = &want.image
        && !p
            .images
            .iter()
            .any(|i| i.name == *image || i.identity == *image)
    {
        return Err((
            Reason::Environment,
            format!("{} keeps no image {image}", node.addr),
        ));
    }
    Ok(())
}

/// The nodes that may take `want`, in the order to try them; or why there is none.
pub fn candidates(cluster: &Cluster, want: &Want) -> Result<Vec<SocketAddr>, NoNode> {
    let nodes = cluster.nodes();
    // A provider no node has configured is a bad request, as a node says it.
    let configured: std::collections::BTreeSet<&str> = nodes
        .iter()
        .flat_map(|n| n.providers.iter().flat_map(|p| &p.providers))
        .map(|p| p.name.as_str())
        .collect();
    if let Some(name) = &want.provider
        && !configured.is_empty()
        && !configured.contains(name.as_str())
    {
        let known: Vec<&str> = configured.into_iter().collect();
        return Err(NoNode {
            reason: Reason::Request,
            message: format!(
                "no provider named `{name}` on any node; configured: {}",
                known.join(", ")
            ),
        });
    }
    let mut fit = Vec::new();
    let mut why = Vec::new();
    for n in &nodes {
        match fits(n, want) {
            Ok(()) => fit.push((n.load + cluster.in_flight(n.addr), n.addr)),
            Err(e) => why.push(e),
        }
    }
    if fit.is_empty() {
        // The strongest reason a node gave: one that is ready but cannot meet the request
        // says more than one that is not ready.
        let reason = if why.iter().any(|(r, _)| *r == Reason::Isolation) {
            Reason::Isolation
        } else {
            Reason::Environment
        };
        let detail: Vec<String> = why.into_iter().map(|(_, m)| m).collect();
        let message = if nodes.is_empty() {
            "the router knows no node yet: check its --nodes or --dns and that the nodes \
             answer /readyz"
                .to_owned()
        } else if reason == Reason::Isolation {
            format!(
                "no node meets this request's floor, so it ran nowhere: {}",
                detail.join("; ")
            )
        } else {
            format!(
                "no node can take this request, so it ran nowhere: {}",
                detail.join("; ")
            )
        };
        return Err(NoNode { reason, message });
    }
    Ok(order(fit, &mut rand::rng()))
}

/// Two picked at random, the less loaded first; then the rest, least loaded first.
fn order(mut fit: Vec<(u64, SocketAddr)>, rng: &mut impl rand::Rng) -> Vec<SocketAddr> {
    let mut out = Vec::with_capacity(fit.len());
    if fit.len() >= 2 {
        let a = rng.random_range(0..fit.len());
        let mut b = rng.random_range(0..fit.len() - 1);
        if b >= a {
            b += 1;
        }
        let first = if fit[b].0 < fit[a].0 { b } else { a };
        out.push(fit.swap_remove(first).1);
    }
    fit.sort();
    out.extend(fit.into_iter().map(|(_, a)| a));
    out
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng as _;

    use super::*;

    fn addr(i: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, i], 7070))
    }

    #[test]
    fn the_less_loaded_of_two_goes_first_then_the_rest_by_load() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut firsts = std::collections::BTreeMap::new();
        for _ in 0..3000 {
            let fit = vec![(5, addr(1)), (0, addr(2)), (9, addr(3))];
            let o = order(fit, &mut rng);
            assert_eq!(o.len(), 3);
            let mut sorted = o.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), 3, "every node once: {o:?}");
            *firsts.entry(o[0]).or_insert(0) += 1;
        }
        // The most loaded node loses every pair it is in; the least loaded wins every pair
        // it is in (2 of the 3 pairs), the middle one wins one.
        assert_eq!(firsts.get(&addr(3)), None);
        assert!(
            firsts[&addr(2)] > 1800 && firsts[&addr(2)] < 2200,
            "{firsts:?}"
        );
        assert!(
            firsts[&addr(1)] > 800 && firsts[&addr(1)] < 1200,
            "{firsts:?}"
        );
        assert_eq!(order(vec![(1, addr(4))], &mut rng), [addr(4)]);
        assert!(order(vec![], &mut rng).is_empty());
    }

    #[test]
    fn what_a_request_asks_is_read_leniently() {
        let w = Want::of(
            &serde_json::json!({"minimum_isolation": "kernel", "provider": "runsc", "image": "py"}),
            true,
        );
        assert_eq!(
            w,
            Want {
                floor: Some(Tier::Kernel),
                provider: Some("runsc".into()),
                image: Some("py".into()),
                session: true
            }
        );
        let w = Want::of(
            &serde_json::json!({"minimum_isolation": 3, "image": null}),
            false,
        );
        assert_eq!(w, Want::default());
    }
}
