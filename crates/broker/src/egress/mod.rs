//! Egress: a run's code reaches listed hosts through the broker, which acts as its HTTP
//! proxy (docs/capability-grants.md, "Egress").
//!
//! - [`profile`]: the `[egress.NAME]` tables of the grants file.
//! - [`proxy`]: one run's proxy: each connection on the run's channel that opens with the
//!   egress hello is read as HTTP proxy traffic (`CONNECT host:port`, or a plain-HTTP
//!   request in absolute form), checked, and, when allowed, connected and spliced; every
//!   attempt, allowed or refused, leaves a receipt.

pub mod profile;
pub(crate) mod proxy;
