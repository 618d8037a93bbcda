//! Where the tools' runs go: the embedded engine or a daemon through the Rust client, behind
//! one small blocking trait.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, Once};

use plimsoll_client::{Client, RunOptions, new_request_id};
use plimsoll_engine::{Engine, RunError};
use plimsoll_wire::{NotDispatched, ProvidersResponse, Reason, RunResponse, Tier};

/// A run or a listing that gave no result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// Refused before anything ran.
    #[error("not dispatched ({reason}): {message}")]
    NotDispatched {
        /// Why.
        reason: Reason,
        /// What to do.
        message: String,
    },
    /// Failed after the code may have started, or no verified answer came back.
    #[error("{message}")]
    MayHaveRun {
        /// What failed.
        message: String,
    },
}

impl NotDispatched for BackendError {
    fn not_dispatched(&self) -> Option<Reason> {
        match self {
            BackendError::NotDispatched { reason, .. } => Some(*reason),
            BackendError::MayHaveRun { .. } => None,
        }
    }
}

impl BackendError {
    /// Sorts any error by its not-dispatched mark: the mark is the only thing that says
    /// nothing ran, never the message text.
    pub fn from_marked<E: NotDispatched + std::fmt::Display>(e: &E) -> Self {
        match plimsoll_wire::not_dispatched_reason(e) {
            Some(reason) => BackendError::NotDispatched {
                reason,
                // The engine's and client's messages already begin `not dispatched (R): `.
                message: strip_mark(&e.to_string(), reason),
            },
            None => BackendError::MayHaveRun {
                message: e.to_string(),
            },
        }
    }
}

fn strip_mark(message: &str, reason: Reason) -> String {
    let prefix = format!("not dispatched ({reason}): ");
    message.strip_prefix(&prefix).unwrap_or(message).to_owned()
}

/// What the tools need from plimsoll. Blocking: the server calls it off the async threads.
pub trait Backend: Send + Sync + std::fmt::Debug + 'static {
    /// Runs `options` for `caller` (the authenticated caller a transport named, if any) and
    /// returns the verified response.
    fn run(&self, caller: Option<&str>, options: RunOptions) -> Result<RunResponse, BackendError>;
    /// Every provider, its tier, availability and evidence.
    fn providers(&self, caller: Option<&str>) -> Result<ProvidersResponse, BackendError>;
}

/// The embedded engine, in this process, not probed yet (the CLI's): each run probes only
/// what it needs, once, and `list_providers` probes every provider the first time.
#[derive(Debug)]
pub struct EngineBackend {
    engine: Arc<Engine>,
    /// Who runs: the transport (stdio) names no caller.
    caller: String,
    /// The (floor, provider, kind) combinations probed for with a provider found, so a
    /// long-lived server probes each once rather than before every call; one that found
    /// none is probed again at its next call (this server has no periodic re-check).
    probed_for: Mutex<HashSet<(Tier, Option<String>, &'static str)>>,
    probed_all: Once,
}

impl EngineBackend {
    /// Runs by `caller` on `engine`, probed as runs need it.
    pub fn lazy(engine: Arc<Engine>, caller: impl Into<String>) -> Self {
        EngineBackend {
            engine,
            caller: caller.into(),
            probed_for: Mutex::new(HashSet::new()),
            probed_all: Once::new(),
        }
    }
}

impl Backend for EngineBackend {
    fn run(&self, caller: Option<&str>, options: RunOptions) -> Result<RunResponse, BackendError> {
        let caller = caller.unwrap_or(&self.caller);
        let request = options.into_request(new_request_id());
        let floor = request
            .minimum_isolation
            .unwrap_or(self.engine.config().default_floor);
        let key = (floor, request.provider.clone(), request.run.kind());
        {
            let mut done = self.probed_for.lock().unwrap_or_else(|p| p.into_inner());
            if done.insert(key.clone()) {
                self.engine.probe_for(
                    request.minimum_isolation,
                    request.provider.as_deref(),
                    &request.run,
                );
            }
        }
        let result = self.engine.run(caller, &request);
        if matches!(
            &result,
            Err(RunError::Refused {
                reason: Reason::Isolation | Reason::Environment,
                ..
            })
        ) {
            // No provider was found for it: probe again next time.
            self.probed_for
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&key);
        }
        result.map_err(|e| BackendError::from_marked(&e))
    }

    fn providers(&self, _caller: Option<&str>) -> Result<ProvidersResponse, BackendError> {
        self.probed_all.call_once(|| self.engine.probe_all());
        Ok(self.engine.providers_response())
    }
}

/// A daemon, through the Rust client (which checks request ids, digests and the tier). The
/// caller is whoever the client's token names; a transport's caller is not used.
#[derive(Debug)]
pub struct ClientBackend {
    client: Client,
}

impl ClientBackend {
    /// Runs go to this client's daemon.
    pub fn new(client: Client) -> Self {
        ClientBackend { client }
    }
}

impl Backend for ClientBackend {
    fn run(&self, _caller: Option<&str>, options: RunOptions) -> Result<RunResponse, BackendError> {
        self.client
            .run(options)
            .map_err(|e| BackendError::from_marked(&e))
    }

    fn providers(&self, _caller: Option<&str>) -> Result<ProvidersResponse, BackendError> {
        // Listing runs nothing, so any failure here is safe to retry: mark it as a request
        // that was not served.
        self.client
            .providers()
            .map_err(|e| BackendError::NotDispatched {
                reason: Reason::Environment,
                message: format!("cannot list the daemon's providers: {e}"),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_decides_never_the_text() {
        let refused = plimsoll_engine::RunError::refused(Some("r"), Reason::Isolation, "no vm");
        let e = BackendError::from_marked(&refused);
        assert_eq!(
            e,
            BackendError::NotDispatched {
                reason: Reason::Isolation,
                message: "no vm".into()
            }
        );
        // A failure after dispatch whose text looks like a refusal is still "may have run".
        let failed = plimsoll_engine::RunError::Failed {
            request_id: "r".into(),
            provider: "process".into(),
            message: "not dispatched (isolation): a lie".into(),
        };
        let e = BackendError::from_marked(&failed);
        assert!(matches!(e, BackendError::MayHaveRun { .. }), "{e:?}");
        assert_eq!(plimsoll_wire::not_dispatched_reason(&e), None);
    }
}
