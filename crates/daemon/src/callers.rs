//! The callers file as the daemon sees it: [`CallerStore`] (in the `plimsoll-callers` crate,
//! shared with plimsoll-router) re-reads it when it changes.

pub use plimsoll_callers::store::{CallerStore, CallersUnavailable};
