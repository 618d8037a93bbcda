//! plimsoll-attest: signs checked run results, chains them into bundles, verifies and replays
//! them. It holds the Ed25519 key the daemon never has (docs/attestation.md).
//!
//! A bundle is a file of JSON lines. Each entry line holds an exchange (the request as sent and
//! the full response) and a DSSE envelope around an in-toto statement whose subject is the run
//! record's digest; each statement carries its sequence number and the digest of the envelope
//! before it. A signed close statement ends the bundle with the count of entries. Entries that
//! are calls of a plimsolld session must also form that session's chain, whole and in order.
//!
//! The serialisable types here (bundle lines, envelopes, statements) are this tool's own file
//! format, not an IPC contract between plimsoll processes, so they live here and not in the
//! wire crate.

pub mod bench;
pub mod bundle;
pub mod chain;
pub mod dsse;
pub mod exchange;
pub mod keys;
pub mod line;
pub mod replay;
pub mod run;
pub mod sample;
pub mod session;
pub mod statement;
pub mod verify;

pub use bundle::{
    AppendError, Appended, SignExchangeError, append_entry, close_bundle, preflight, sign_close,
    sign_exchange,
};
pub use chain::{SignChainError, SignedChain, sign_chain, sign_session};
pub use exchange::{
    CheckExchangeError, CheckedDigests, Exchange, ReadExchangesError, check_exchange,
    read_exchanges,
};
pub use keys::{
    AttestKey, KeyFiles, KeygenError, LoadKeyError, PublicKey, keygen, load_private_key,
    load_public_key,
};
pub use line::{BundleLine, LineProblem};
pub use replay::{ReplayBundleError, ReplayOutcome, ReplayReport, replay_bundle};
pub use run::{RunAndSignError, SignedRun, run_and_sign};
pub use session::{SessionChainError, SessionLinkProblem, check_session_chains, link_problem};
pub use verify::{
    VerifiedBundle, VerifiedEntry, VerifyBundleError, verify_bundle, verify_bundle_bytes,
};
