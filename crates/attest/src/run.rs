//! `run`: send a request through the Rust client (which checks the request id, the digests and
//! the tier), check the exchange again from what is stored, and only then sign it into a
//! bundle.

use std::path::Path;

use plimsoll_client::{Client, ClientError, RunOptions};
use plimsoll_wire::{NotDispatched, Reason};

use crate::bundle::{AppendError, Appended, append_entry, preflight};
use crate::exchange::Exchange;
use crate::keys::AttestKey;

/// A run that was signed into a bundle.
#[derive(Debug, Clone)]
pub struct SignedRun {
    /// The exchange as stored.
    pub exchange: Exchange,
    /// Where it went.
    pub appended: Appended,
}

/// Why `run` signed nothing.
#[derive(Debug, thiserror::Error)]
pub enum RunAndSignError {
    /// The bundle cannot take another entry; nothing was sent.
    #[error("nothing was sent: {0}")]
    Bundle(Box<AppendError>),
    /// The client refused or failed (this includes "not dispatched" refusals and results
    /// whose digests or tier did not check); nothing was signed.
    #[error("nothing was signed: {0}")]
    Client(ClientError),
    /// The run came back and checked with the client, but signing or appending failed.
    #[error("the run (request {request_id}) completed but was not signed: {error}")]
    Append {
        /// The run's request id.
        request_id: String,
        /// Why.
        error: Box<AppendError>,
    },
}

impl NotDispatched for RunAndSignError {
    fn not_dispatched(&self) -> Option<Reason> {
        match self {
            RunAndSignError::Client(e) => e.not_dispatched(),
            // The bundle was found unusable before anything was sent.
            RunAndSignError::Bundle(_) => Some(Reason::Request),
            RunAndSignError::Append { .. } => None,
        }
    }
}

/// Sends `options` through `client` and signs the checked exchange into `bundle`. The bundle is
/// checked before anything is sent, so a run is not spent on a bundle that cannot take it.
pub fn run_and_sign(
    client: &Client,
    options: RunOptions,
    key: &AttestKey,
    bundle: &Path,
) -> Result<SignedRun, RunAndSignError> {
    preflight(bundle, key).map_err(|e| RunAndSignError::Bundle(Box::new(e)))?;
    let response = client
        .run(options.clone())
        .map_err(RunAndSignError::Client)?;
    // The client built the request from these options and the id the response echoes (it
    // checked the echo), so this is the request exactly as sent.
    let exchange = Exchange {
        request: options.into_request(response.request_id.clone()),
        response,
    };
    let appended =
        append_entry(bundle, key, &exchange).map_err(|source| RunAndSignError::Append {
            request_id: exchange.request.request_id.clone(),
            error: Box::new(source),
        })?;
    Ok(SignedRun { exchange, appended })
}
