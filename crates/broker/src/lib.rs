//! Grants and the broker: sandboxed code calls an operator's HTTP API without ever holding
//! the credential or having network access (docs/capability-grants.md).
//!
//! - [`GrantProfiles`]: the operator's grants file, parsed and validated, its secrets read
//!   from the daemon's environment at load. A request only names a profile;
//!   [`GrantProfiles::authorize`] refuses an unknown profile and a forbidden one alike.
//! - [`Broker`]: one per run with a grant. It mints the run's credential, serves the run's
//!   channel (a provider hands it a connected stream through
//!   [`plimsoll_sandbox::BrokerPort`]), checks every call and makes it, and lists the calls
//!   for the result ([`Broker::finish`]).
//!
//! Nothing but the broker ever holds a minted credential: it is attached to the upstream
//! request here and goes nowhere else (not the sandbox, a log, an error, a result or a record).

pub mod apart;
mod broker;
pub mod credential;
pub mod egress;
mod frame;
mod leak;
mod profile;
pub mod route;
mod upstream;

pub use broker::{Broker, ERROR_CODES, Finished};
pub use credential::{Credential, EnvSecret, Minter, Secret};
pub use egress::profile::EgressProfile;
pub use egress::proxy::{EGRESS_CODES, EGRESS_ENDS};
pub use profile::{
    DEFAULT_CALL_TIMEOUT, DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_RESPONSE_BYTES, GRANT_REFUSED,
    Grant, GrantProfiles, GrantRefused, GrantsSource, LoadGrantsError, Profile,
};
pub use route::{PathRefused, Route};
