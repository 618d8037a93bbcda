//! The nodes: found through DNS (every address a name resolves to, as a headless Service's
//! records give) or a static list, and learned from what each one says about itself:
//! `/readyz` (ready or not, and its instance in the `Plimsoll-Instance` header), `/v1/providers`
//! (tiers, availability, images, default floor; with the router's own caller token) and
//! `/metrics` (runs in flight and sessions open, its load).
//!
//! The router keeps no state a restart would lose: all of this is learned again on the next
//! refresh, and a session's node is named by the session id itself (its instance part).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use axum::body::Body;
use http_body_util::BodyExt as _;
use plimsoll_secret::Secret;
use plimsoll_wire::{ProvidersResponse, Tier};
use serde::Serialize;

use crate::forward::{ExchangeError, exchange};

/// Where the nodes are.
#[derive(Debug, Clone)]
pub enum Seeds {
    /// `host:port` of each node; a host name is resolved on every refresh (its first address).
    Static(Vec<String>),
    /// Every address `name` resolves to is a node, serving on `port` (a headless Service).
    Dns {
        /// The name.
        name: String,
        /// The nodes' port.
        port: u16,
    },
}

/// How long each of a refresh's requests to a node may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// The most a node's answer to a refresh request may hold.
const PROBE_BODY_LIMIT: usize = 4 << 20;

/// One node as last seen.
#[derive(Debug, Clone, Serialize)]
pub struct Node {
    /// Its address, `ip:port`: also its name on answers (the `Plimsoll-Node` header).
    pub addr: SocketAddr,
    /// Its daemon's instance (the middle of its session ids), once it said it.
    pub instance: Option<String>,
    /// Instances of its earlier daemons whose sessions its daemon restored after a restart
    /// (`Plimsoll-Adopted-Instances`): their ids are served there too.
    pub adopted: Vec<String>,
    /// Whether its last `/readyz` answered 200.
    pub ready: bool,
    /// Its last `/v1/providers` answer.
    #[serde(skip)]
    pub providers: Option<ProvidersResponse>,
    /// Runs in flight plus sessions open, from its last `/metrics`.
    pub load: u64,
    /// Why the last refresh could not learn it, if it could not.
    pub error: Option<String>,
}

impl Node {
    /// The tiers of its available providers, strongest first (for `/v1/nodes` and messages).
    pub fn tiers(&self) -> Vec<(String, Tier)> {
        let mut t: Vec<(String, Tier)> = self
            .providers
            .iter()
            .flat_map(|p| &p.providers)
            .filter(|p| p.available)
            .map(|p| (p.name.clone(), p.isolation))
            .collect();
        t.sort_by_key(|x| std::cmp::Reverse(x.1));
        t
    }

    /// Whether it can take placements: ready, and its providers known.
    pub fn usable(&self) -> bool {
        self.ready && self.error.is_none() && self.providers.is_some()
    }
}

/// What the router knows of its nodes.
#[derive(Debug)]
pub struct Cluster {
    seeds: Seeds,
    token: Secret,
    nodes: RwLock<BTreeMap<SocketAddr, Node>>,
    /// Every instance any node said it had while this router ran, with that node's address:
    /// a session of a node that has since gone is told apart from an id no node gave.
    instances: RwLock<BTreeMap<String, SocketAddr>>,
    /// Exchanges this router has in flight to each node (its own share of their load, known
    /// between refreshes).
    in_flight: Mutex<BTreeMap<SocketAddr, u64>>,
}

/// Where a session id's node is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionNode {
    /// At this node, which answered the last refresh with this instance.
    At(SocketAddr),
    /// This node gave it, and now answers with another instance (its daemon restarted) or
    /// is no longer found: the session is gone with it.
    Gone {
        /// The node that held it.
        addr: SocketAddr,
        /// What became of it.
        why: String,
    },
    /// No node this router has seen gave this id.
    Unknown,
}

/// Counts an exchange as in flight to a node until dropped.
#[derive(Debug)]
pub struct InFlight<'a> {
    cluster: &'a Cluster,
    addr: SocketAddr,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut m = self
            .cluster
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.addr) {
            *n = n.saturating_sub(1);
        }
    }
}

impl Cluster {
    /// Nodes found from `seeds`, learned with `token` (a caller of every node). Nothing is
    /// known until [`Cluster::refresh`].
    pub fn new(seeds: Seeds, token: Secret) -> Cluster {
        Cluster {
            seeds,
            token,
            nodes: RwLock::new(BTreeMap::new()),
            instances: RwLock::new(BTreeMap::new()),
            in_flight: Mutex::new(BTreeMap::new()),
        }
    }

    /// Every node as last seen.
    pub fn nodes(&self) -> Vec<Node> {
        self.nodes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// One node as last seen.
    pub fn node(&self, addr: SocketAddr) -> Option<Node> {
        self.nodes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&addr)
            .cloned()
    }

    /// The router's own exchanges in flight to `addr`.
    pub fn in_flight(&self, addr: SocketAddr) -> u64 {
        self.in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&addr)
            .copied()
            .unwrap_or(0)
    }

    /// Counts one more exchange in flight to `addr` until the value is dropped.
    pub fn start_exchange(&self, addr: SocketAddr) -> InFlight<'_> {
        *self
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(addr)
            .or_default() += 1;
        InFlight {
            cluster: self,
            addr,
        }
    }

    /// Marks a node unusable until the next refresh finds it again (a connect to it failed).
    pub fn mark_unreachable(&self, addr: SocketAddr, why: &str) {
        if let Some(n) = self
            .nodes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&addr)
        {
            n.ready = false;
            n.error = Some(format!("unreachable: {why}"));
        }
    }

    /// The node holding session `id` (by its instance part).
    pub fn session_node(&self, id: &str) -> SessionNode {
        let Some(instance) = plimsoll_wire::session_instance(id) else {
            return SessionNode::Unknown;
        };
        let Some(addr) = self
            .instances
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(instance)
            .copied()
        else {
            return SessionNode::Unknown;
        };
        match self.node(addr) {
            None => SessionNode::Gone {
                addr,
                why: format!("node {addr} is no longer found"),
            },
            Some(n) => match &n.instance {
                // Its daemon restarted and restored that instance's saved sessions.
                Some(_) if n.adopted.iter().any(|a| a == instance) => SessionNode::At(addr),
                Some(now) if now != instance => SessionNode::Gone {
                    addr,
                    why: format!("node {addr}'s daemon restarted (instance {instance}, now {now})"),
                },
                // Still that instance, or not heard from since: try it.
                _ => SessionNode::At(addr),
            },
        }
    }

    /// Finds the nodes again and learns each one. Nodes no longer found are dropped (their
    /// instances stay known, so their sessions answer as gone).
    pub async fn refresh(&self) {
        let addrs = self.resolve().await;
        let mut set = tokio::task::JoinSet::new();
        for addr in addrs.clone() {
            let token = self.token.clone();
            set.spawn(async move { learn(addr, &token).await });
        }
        let mut learned = Vec::new();
        while let Some(r) = set.join_next().await {
            if let Ok(node) = r {
                learned.push(node);
            }
        }
        let mut nodes = self.nodes.write().unwrap_or_else(|p| p.into_inner());
        let mut instances = self.instances.write().unwrap_or_else(|p| p.into_inner());
        nodes.retain(|a, _| addrs.contains(a));
        for mut node in learned {
            for i in node.instance.iter().chain(&node.adopted) {
                instances.insert(i.clone(), node.addr);
            }
            if node.error.is_some()
                && let Some(old) = nodes.get(&node.addr)
            {
                // Keep what it said before (its instance routes its sessions' calls) while it
                // cannot be reached: only its readiness is lost.
                node.instance = node.instance.or_else(|| old.instance.clone());
                node.adopted.clone_from(&old.adopted);
                node.providers = old.providers.clone();
            }
            nodes.insert(node.addr, node);
        }
    }

    async fn resolve(&self) -> Vec<SocketAddr> {
        let mut out = Vec::new();
        match &self.seeds {
            Seeds::Static(list) => {
                for hp in list {
                    match tokio::net::lookup_host(hp.as_str()).await {
                        Ok(mut a) => out.extend(a.next()),
                        Err(e) => tracing::warn!(node = %hp, error = %e, "cannot resolve a node"),
                    }
                }
            }
            Seeds::Dns { name, port } => {
                match tokio::net::lookup_host((name.as_str(), *port)).await {
                    Ok(a) => out.extend(a),
                    Err(e) => tracing::warn!(%name, error = %e, "cannot resolve the nodes' name"),
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }
}

/// Whether `v` is a daemon instance: 16 hex digits.
fn is_instance(v: &str) -> bool {
    v.len() == 16 && v.bytes().all(|b| b.is_ascii_hexdigit())
}

/// What one node says about itself now.
async fn learn(addr: SocketAddr, token: &Secret) -> Node {
    let mut node = Node {
        addr,
        instance: None,
        adopted: Vec::new(),
        ready: false,
        providers: None,
        load: 0,
        error: None,
    };
    match get(addr, "/readyz", None).await {
        Ok((status, headers, _)) => {
            node.ready = status == 200;
            node.instance = headers
                .get("plimsoll-instance")
                .and_then(|v| v.to_str().ok())
                .filter(|v| is_instance(v))
                .map(str::to_owned);
            node.adopted = headers
                .get("plimsoll-adopted-instances")
                .and_then(|v| v.to_str().ok())
                .map(|v| {
                    v.split(',')
                        .filter(|i| is_instance(i))
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
        }
        Err(e) => {
            node.error = Some(e);
            return node;
        }
    }
    match get(addr, "/v1/providers", Some(token)).await {
        Ok((200, _, body)) => match serde_json::from_slice::<ProvidersResponse>(&body) {
            Ok(p) => node.providers = Some(p),
            Err(e) => node.error = Some(format!("its /v1/providers does not parse: {e}")),
        },
        Ok((status, _, body)) => {
            node.error = Some(format!(
                "its /v1/providers answered {status} to the router's token: {}",
                String::from_utf8_lossy(&body[..body.len().min(300)])
            ));
        }
        Err(e) => node.error = Some(e),
    }
    if let Ok((200, _, body)) = get(addr, "/metrics", None).await {
        node.load = load_of(&String::from_utf8_lossy(&body));
    }
    node
}

/// Runs in flight plus sessions open, from a node's `/metrics`.
pub fn load_of(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter_map(|l| {
            let (name, value) = l.split_once(' ')?;
            matches!(name, "plimsoll_runs_in_flight" | "plimsoll_sessions_open")
                .then(|| value.trim().parse::<u64>().ok())?
        })
        .sum()
}

/// A GET of `path` at `addr`: status, headers and body, within [`PROBE_TIMEOUT`].
async fn get(
    addr: SocketAddr,
    path: &str,
    token: Option<&Secret>,
) -> Result<(u16, hyper::HeaderMap, Vec<u8>), String> {
    let mut req = hyper::Request::get(path).header(hyper::header::HOST, addr.to_string());
    if let Some(t) = token {
        req = req.header(
            hyper::header::AUTHORIZATION,
            format!("Bearer {}", t.expose()),
        );
    }
    let req = req.body(Body::empty()).map_err(|e| e.to_string())?;
    let fetch = async {
        let resp = exchange(addr, req).await.map_err(|e| match e {
            ExchangeError::NotSent(m) | ExchangeError::Lost(m) => m,
        })?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = http_body_util::Limited::new(resp.into_body(), PROBE_BODY_LIMIT)
            .collect()
            .await
            .map_err(|e| format!("its answer to GET {path} broke off: {e}"))?
            .to_bytes()
            .to_vec();
        Ok((status, headers, body))
    };
    tokio::time::timeout(PROBE_TIMEOUT, fetch)
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "no answer to GET {path} within {} s",
                PROBE_TIMEOUT.as_secs()
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_load_is_runs_in_flight_and_sessions_open() {
        let text = "# HELP plimsoll_runs_in_flight x\n# TYPE plimsoll_runs_in_flight gauge\n\
                    plimsoll_runs_in_flight 3\nplimsoll_runs_total{provider=\"p\"} 9\n\
                    plimsoll_sessions_open 2\nplimsoll_sessions_open_other 5\n";
        assert_eq!(load_of(text), 5);
        assert_eq!(load_of(""), 0);
    }
}
