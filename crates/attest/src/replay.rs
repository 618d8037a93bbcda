//! `replay`: verify a bundle, then resend each stored request (with a new request id) and
//! compare the new result digest with the signed one. Meaningful for deterministic runs.

use std::path::Path;

use plimsoll_client::{Client, RunOptions};
use plimsoll_wire::Tier;
use plimsoll_wire::digest::outcome_sha256;

use crate::keys::PublicKey;
use crate::verify::{VerifyBundleError, verify_bundle};

/// What replaying one entry gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayOutcome {
    /// The new result digest equals the signed one.
    Same {
        /// The replay's request id.
        request_id: String,
        /// Where the replay ran.
        provider: String,
        /// Its tier.
        isolation: Tier,
    },
    /// The new result digest differs.
    Differs {
        /// The replay's request id.
        request_id: String,
        /// The signed result digest.
        signed: String,
        /// The replay's result digest.
        replayed: String,
        /// Where the replay ran.
        provider: String,
        /// Its tier.
        isolation: Tier,
    },
    /// The replay did not produce a checked result.
    Failed {
        /// The client's error.
        message: String,
    },
}

/// One replayed entry.
#[derive(Debug, Clone)]
pub struct ReplayedEntry {
    /// Line number in the bundle, 1-based.
    pub line: usize,
    /// The entry's sequence.
    pub sequence: u64,
    /// The request id it was signed with.
    pub signed_request_id: String,
    /// What happened.
    pub outcome: ReplayOutcome,
}

/// The replay of a whole bundle.
#[derive(Debug, Clone)]
pub struct ReplayReport {
    /// One per entry, in order.
    pub entries: Vec<ReplayedEntry>,
}

impl ReplayReport {
    /// True when every entry gave the signed result again.
    pub fn all_same(&self) -> bool {
        self.entries
            .iter()
            .all(|e| matches!(e.outcome, ReplayOutcome::Same { .. }))
    }

    /// One line per entry and a total, for people.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let (mut same, mut differ, mut failed) = (0, 0, 0);
        for e in &self.entries {
            let head = format!(
                "line {} (sequence {}) run:{}",
                e.line, e.sequence, e.signed_request_id
            );
            match &e.outcome {
                ReplayOutcome::Same {
                    request_id,
                    provider,
                    isolation,
                } => {
                    same += 1;
                    out.push_str(&format!(
                        "{head}: same result (replayed as {request_id} on {provider}, {isolation})\n"
                    ));
                }
                ReplayOutcome::Differs {
                    request_id,
                    signed,
                    replayed,
                    provider,
                    isolation,
                } => {
                    differ += 1;
                    out.push_str(&format!(
                        "{head}: DIFFERS: signed result sha256:{signed}, replay sha256:{replayed} (replayed as {request_id} on {provider}, {isolation})\n"
                    ));
                }
                ReplayOutcome::Failed { message } => {
                    failed += 1;
                    out.push_str(&format!("{head}: FAILED: {message}\n"));
                }
            }
        }
        out.push_str(&format!(
            "replay: {} entries, {same} same, {differ} differ, {failed} failed\n",
            self.entries.len()
        ));
        out
    }
}

/// Why a bundle was not replayed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayBundleError {
    /// The bundle did not verify; nothing was sent.
    #[error("nothing was sent: the bundle does not verify: {0}")]
    Verify(VerifyBundleError),
}

impl From<VerifyBundleError> for ReplayBundleError {
    fn from(e: VerifyBundleError) -> Self {
        ReplayBundleError::Verify(e)
    }
}

/// Verifies the bundle with `key`, and only if it passes resends each entry's request through
/// `client`, in order, one at a time.
pub fn replay_bundle(
    client: &Client,
    bundle: &Path,
    key: &PublicKey,
) -> Result<ReplayReport, ReplayBundleError> {
    let verified = verify_bundle(bundle, key)?;
    let mut entries = Vec::new();
    for e in verified.entries {
        let outcome = match client.run(RunOptions::from(e.exchange.request.clone())) {
            Err(err) => ReplayOutcome::Failed {
                message: err.to_string(),
            },
            Ok(resp) => {
                // The request digest leaves the id out, so it must be the signed one; the
                // client has already recomputed both digests of the new answer.
                if resp.request_sha256 != e.predicate.request_sha256 {
                    ReplayOutcome::Failed {
                        message: format!(
                            "the replayed request has digest {}, not the signed {}",
                            resp.request_sha256, e.predicate.request_sha256
                        ),
                    }
                } else if resp.result_sha256 == e.predicate.result_sha256
                    || outcome_sha256(&resp.result) == outcome_sha256(&e.exchange.response.result)
                {
                    // The same result, or the same output from a sandbox that started or
                    // looked otherwise (a fresh one's wall differs: its namespaces, its uid).
                    // The stored result is the signed one: its digest was checked on verify.
                    ReplayOutcome::Same {
                        request_id: resp.request_id,
                        provider: resp.provider,
                        isolation: resp.isolation,
                    }
                } else {
                    ReplayOutcome::Differs {
                        request_id: resp.request_id,
                        signed: e.predicate.result_sha256.clone(),
                        replayed: resp.result_sha256,
                        provider: resp.provider,
                        isolation: resp.isolation,
                    }
                }
            }
        };
        entries.push(ReplayedEntry {
            line: e.line,
            sequence: e.predicate.sequence,
            signed_request_id: e.exchange.request.request_id,
            outcome,
        });
    }
    Ok(ReplayReport { entries })
}
