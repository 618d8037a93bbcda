//! plimsoll-router: one stateless front for many plimsolld nodes (docs/cluster.md).
//!
//! It finds the nodes ([`nodes`]), places each run and session open on one that meets the
//! request ([`place`]), sends every call of a session to the node that holds it, and passes
//! each node's answer on untouched ([`serve`]), telling a request that never reached a node
//! apart from one whose node was lost after it was sent ([`forward`]).

pub mod forward;
pub mod nodes;
pub mod place;
pub mod serve;

use std::sync::Arc;
use std::time::Duration;

pub use nodes::{Cluster, Seeds};
pub use serve::{NODE_HEADER, Shared};

/// How often the nodes are found and learned again, by default.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(2);

/// Learns the nodes now and then every `every`, for as long as the runtime runs.
pub fn keep_learning(cluster: Arc<Cluster>, every: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            cluster.refresh().await;
            tokio::time::sleep(every).await;
        }
    })
}
