//! Session chains: the calls of one plimsolld session, each answered with a record whose
//! `session` link names its session, its place (1, 2, 3, …) and the record digest of the call
//! before it. A bundle holds a session's calls whole and in order; checked before signing a
//! chain and again by `verify`.

use std::collections::{BTreeMap, HashMap, HashSet};

use plimsoll_wire::{RunRecord, SessionLink, Tier};

/// What is wrong with one record's session link on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SessionLinkProblem {
    /// Sequence 0: a session's calls count from 1.
    #[error("has sequence 0: a session's calls count from 1")]
    ZeroSequence,
    /// Call 1 names a previous record.
    #[error("is the session's first call but names a previous record")]
    PreviousOnFirst,
    /// A later call names no previous record.
    #[error("names no previous record: every call after the first names the one before it")]
    NoPrevious,
}

/// The problem with a link's shape, if any: `sequence >= 1`, and `previous_record_sha256`
/// present exactly when `sequence > 1`. A restored or forked session's chain goes on from
/// its parent's: its call 1 is its parent's call 1, so the same holds.
pub fn link_problem(link: &SessionLink) -> Option<SessionLinkProblem> {
    match (link.sequence, &link.previous_record_sha256) {
        (0, _) => Some(SessionLinkProblem::ZeroSequence),
        (1, Some(_)) => Some(SessionLinkProblem::PreviousOnFirst),
        (2.., None) => Some(SessionLinkProblem::NoPrevious),
        _ => None,
    }
}

/// Why the session calls of a run of records (a bundle's entries, in order) do not form whole
/// chains. Each names the session and the call (its `sequence`) where the chain breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionChainError {
    /// The link itself is malformed.
    #[error("session `{session_id}` call {sequence}: the link {problem}")]
    Link {
        /// The session.
        session_id: String,
        /// The call's sequence.
        sequence: u64,
        /// What is wrong.
        problem: SessionLinkProblem,
    },
    /// The session's first call here is not call 1, and call 1 does not follow.
    #[error(
        "session `{session_id}` call {sequence} is the session's first call here: {} missing before it (a bundle holds a session from its call 1)",
        calls_missing(*sequence - 1)
    )]
    StartsLate {
        /// The session.
        session_id: String,
        /// The call's sequence.
        sequence: u64,
    },
    /// Calls are missing before this one: the call expected here appears nowhere after it.
    #[error(
        "session `{session_id}` call {sequence} where call {expected} was expected: {} missing before it",
        calls_missing(*sequence - *expected)
    )]
    Missing {
        /// The session.
        session_id: String,
        /// The call's sequence.
        sequence: u64,
        /// The sequence expected here.
        expected: u64,
    },
    /// The same call (sequence) a second time.
    #[error(
        "session `{session_id}` call {sequence} appears again (first as request `{first_request_id}`): a call is repeated"
    )]
    Repeated {
        /// The session.
        session_id: String,
        /// The repeated sequence.
        sequence: u64,
        /// The request id of the entry that holds it first.
        first_request_id: String,
    },
    /// A later call comes before an earlier one that follows it.
    #[error(
        "session `{session_id}` call {sequence} comes before call {expected}: the calls are out of order"
    )]
    OutOfOrder {
        /// The session.
        session_id: String,
        /// The call's sequence.
        sequence: u64,
        /// The sequence expected here, which comes later.
        expected: u64,
    },
    /// The call names another record as the one before it.
    #[error(
        "session `{session_id}` call {sequence} names record {found} as the call before it, but call {} here has record {expected}: a call was replaced",
        *sequence - 1
    )]
    Previous {
        /// The session.
        session_id: String,
        /// The call's sequence.
        sequence: u64,
        /// The record digest of the previous call in the bundle.
        expected: String,
        /// The digest the link names.
        found: String,
    },
    /// A restored or forked session's first call here does not hang from its parent: the
    /// parent's record it names is not earlier in the bundle, as the parent's call it names.
    #[error(
        "session `{session_id}` call {sequence} is a branch of session `{parent_session_id}` after its call {} (record {parent_record}), but that record is not earlier in the bundle as that call: a branch must hang from its parent",
        *sequence - 1
    )]
    Detached {
        /// The session.
        session_id: String,
        /// The call's sequence.
        sequence: u64,
        /// The parent its origin names.
        parent_session_id: String,
        /// The parent's record its origin names.
        parent_record: String,
    },
    /// One session ran on one provider, tier, evidence and environment; this call did not.
    #[error(
        "session `{session_id}` call {sequence} has {field} `{found}`, but the session's first call here has `{first}`: a session runs in one sandbox"
    )]
    Changed {
        /// The session.
        session_id: String,
        /// The call's sequence.
        sequence: u64,
        /// `provider`, `isolation`, `evidence_sha256`, `environment` or `origin`.
        field: &'static str,
        /// The first call's value.
        first: String,
        /// This call's value.
        found: String,
    },
}

/// An origin as a chain error shows it.
fn origin_text(o: Option<&plimsoll_wire::SessionOrigin>) -> String {
    o.map_or_else(
        || "(none)".to_owned(),
        |o| {
            format!(
                "{} from {} after call {}",
                o.start.as_str(),
                o.parent_session_id,
                o.parent_calls
            )
        },
    )
}

fn calls_missing(n: u64) -> String {
    if n == 1 {
        "1 call is".to_owned()
    } else {
        format!("{n} calls are")
    }
}

impl SessionChainError {
    /// The session the chain breaks in.
    pub fn session_id(&self) -> &str {
        match self {
            SessionChainError::Link { session_id, .. }
            | SessionChainError::StartsLate { session_id, .. }
            | SessionChainError::Missing { session_id, .. }
            | SessionChainError::Repeated { session_id, .. }
            | SessionChainError::OutOfOrder { session_id, .. }
            | SessionChainError::Previous { session_id, .. }
            | SessionChainError::Detached { session_id, .. }
            | SessionChainError::Changed { session_id, .. } => session_id,
        }
    }

    /// The call (its sequence in the session) where it breaks.
    pub fn sequence(&self) -> u64 {
        match self {
            SessionChainError::Link { sequence, .. }
            | SessionChainError::StartsLate { sequence, .. }
            | SessionChainError::Missing { sequence, .. }
            | SessionChainError::Repeated { sequence, .. }
            | SessionChainError::OutOfOrder { sequence, .. }
            | SessionChainError::Previous { sequence, .. }
            | SessionChainError::Detached { sequence, .. }
            | SessionChainError::Changed { sequence, .. } => *sequence,
        }
    }
}

/// Where a session's chain stands after the calls seen so far.
struct Chain<'a> {
    /// The sequence the next call must carry.
    next: u64,
    /// The record digest of the last call seen.
    last_record: &'a str,
    /// The request ids of the calls seen, by sequence - 1.
    request_ids: Vec<&'a str>,
    /// Where the session came from, as its last call said.
    origin: Option<&'a plimsoll_wire::SessionOrigin>,
    /// The first call's sandbox (or the one it was restored into after a daemon restart):
    /// provider, tier, evidence digest, environment.
    provider: &'a str,
    isolation: Tier,
    evidence_sha256: &'a str,
    environment: &'a str,
}

/// Checks the session calls among `records` (a bundle's entries, in order; runs outside a
/// session are passed over, and several sessions may interleave): per session, the first call
/// is call 1, each next call is the previous one's sequence + 1 and names its record digest,
/// and every call ran on the first call's provider, tier, evidence digest and environment.
/// A restored or forked session (its link's `origin`) is a branch: its first call here is
/// the one after its parent's last call when the snapshot was taken, and names that call's
/// record, which must come earlier in the bundle as that call of the parent; so a bundle of
/// a fork's calls is a tree whose every branch hangs from its parent. A session restored under
/// its own id after a daemon restart says so from the call after its last saved one (its
/// origin naming that call); from there its tier and evidence are the restoring daemon's.
/// On a break, returns the position in `records` of the record where it breaks, and why.
pub fn check_session_chains(records: &[&RunRecord]) -> Result<(), (usize, SessionChainError)> {
    // Every (session, sequence) present, to tell a call missing from one that comes later.
    let present: HashSet<(&str, u64)> = records
        .iter()
        .filter_map(|r| r.session.as_ref())
        .map(|l| (l.session_id.as_str(), l.sequence))
        .collect();
    let mut chains: BTreeMap<&str, Chain<'_>> = BTreeMap::new();
    // Every session call's record seen so far: its session and sequence.
    let mut seen: HashMap<&str, (&str, u64)> = HashMap::new();
    for (index, record) in records.iter().enumerate() {
        if let Some(link) = &record.session {
            check_call(record, link, &present, &seen, &mut chains).map_err(|e| (index, e))?;
            seen.insert(&record.record_sha256, (&link.session_id, link.sequence));
        }
    }
    Ok(())
}

fn check_call<'a>(
    record: &'a RunRecord,
    link: &'a SessionLink,
    present: &HashSet<(&str, u64)>,
    seen: &HashMap<&str, (&str, u64)>,
    chains: &mut BTreeMap<&'a str, Chain<'a>>,
) -> Result<(), SessionChainError> {
    let id = link.session_id.as_str();
    let sequence = link.sequence;
    let session_id = || id.to_owned();
    if let Some(problem) = link_problem(link) {
        return Err(SessionChainError::Link {
            session_id: session_id(),
            sequence,
            problem,
        });
    }
    let chain = chains.get(id);
    // A branch's first call follows its parent's last call at the snapshot.
    let first = link.origin.as_ref().map_or(1, |o| o.parent_calls + 1);
    let expected = chain.map_or(first, |c| c.next);
    if sequence < expected {
        let first_request_id = chain
            .and_then(|c| c.request_ids.get(usize::try_from(sequence - 1).ok()?))
            .map_or_else(String::new, |r| (*r).to_owned());
        return Err(SessionChainError::Repeated {
            session_id: session_id(),
            sequence,
            first_request_id,
        });
    }
    if sequence > expected {
        // Present means after this one: had it come before, the chain would be past it.
        let later = present.contains(&(id, expected));
        return Err(match (later, chain) {
            (true, _) => SessionChainError::OutOfOrder {
                session_id: session_id(),
                sequence,
                expected,
            },
            (false, None) => SessionChainError::StartsLate {
                session_id: session_id(),
                sequence,
            },
            (false, Some(_)) => SessionChainError::Missing {
                session_id: session_id(),
                sequence,
                expected,
            },
        });
    }
    let Some(chain) = chains.get_mut(id) else {
        if let Some(origin) = &link.origin {
            // A branch: it names its parent's record, and that record came earlier as the
            // parent's call it says.
            let hangs = link.previous_record_sha256 == origin.parent_record_sha256
                && origin.parent_record_sha256.as_deref().is_none_or(|parent| {
                    seen.get(parent)
                        == Some(&(origin.parent_session_id.as_str(), origin.parent_calls))
                });
            if !hangs {
                return Err(SessionChainError::Detached {
                    session_id: session_id(),
                    sequence,
                    parent_session_id: origin.parent_session_id.clone(),
                    parent_record: origin.parent_record_sha256.clone().unwrap_or_default(),
                });
            }
        }
        // Its first call here (call 1 names no previous record: the link check saw to it).
        chains.insert(
            id,
            Chain {
                next: 2,
                last_record: &record.record_sha256,
                request_ids: vec![&record.request_id],
                origin: link.origin.as_ref(),
                provider: &record.provider,
                isolation: record.isolation,
                evidence_sha256: &record.evidence_sha256,
                environment: &record.environment,
            },
        );
        return Ok(());
    };
    let named = link.previous_record_sha256.as_deref().unwrap_or_default();
    if named != chain.last_record {
        return Err(SessionChainError::Previous {
            session_id: session_id(),
            sequence,
            expected: chain.last_record.to_owned(),
            found: named.to_owned(),
        });
    }
    if link.origin.as_ref() != chain.origin {
        // Restored under its own id (a daemon restart saved and restored it): the record
        // names the call before it as its origin's parent call, and from here on it runs in
        // the sandbox it was restored into, at the tier and evidence the daemon that restored
        // it measured (its provider and environment stay the session's).
        let restored_here = link.origin.as_ref().is_some_and(|o| {
            o.start == plimsoll_wire::SessionStart::Restored
                && o.parent_session_id == id
                && o.parent_calls + 1 == sequence
                && o.parent_record_sha256.as_deref() == Some(chain.last_record)
        });
        if !restored_here {
            return Err(SessionChainError::Changed {
                session_id: session_id(),
                sequence,
                field: "origin",
                first: origin_text(chain.origin),
                found: origin_text(link.origin.as_ref()),
            });
        }
        chain.origin = link.origin.as_ref();
        chain.isolation = record.isolation;
        chain.evidence_sha256 = &record.evidence_sha256;
    }
    for (field, first, found) in [
        ("provider", chain.provider, record.provider.as_str()),
        (
            "isolation",
            chain.isolation.as_str(),
            record.isolation.as_str(),
        ),
        (
            "evidence_sha256",
            chain.evidence_sha256,
            record.evidence_sha256.as_str(),
        ),
        (
            "environment",
            chain.environment,
            record.environment.as_str(),
        ),
    ] {
        if first != found {
            return Err(SessionChainError::Changed {
                session_id: session_id(),
                sequence,
                field,
                first: first.to_owned(),
                found: found.to_owned(),
            });
        }
    }
    chain.next += 1;
    chain.last_record = &record.record_sha256;
    chain.request_ids.push(&record.request_id);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::sample_session;

    fn records(ex: &[crate::Exchange]) -> Vec<&RunRecord> {
        ex.iter().map(|e| &e.response.record).collect()
    }

    #[test]
    fn links_have_one_shape() {
        let link = |sequence, previous: Option<&str>| SessionLink {
            session_id: "s".into(),
            sequence,
            previous_record_sha256: previous.map(str::to_owned),
            origin: None,
        };
        assert_eq!(link_problem(&link(1, None)), None);
        assert_eq!(link_problem(&link(2, Some("x"))), None);
        assert_eq!(
            link_problem(&link(0, None)),
            Some(SessionLinkProblem::ZeroSequence)
        );
        assert_eq!(
            link_problem(&link(1, Some("x"))),
            Some(SessionLinkProblem::PreviousOnFirst)
        );
        assert_eq!(
            link_problem(&link(3, None)),
            Some(SessionLinkProblem::NoPrevious)
        );
    }

    #[test]
    fn whole_chains_pass_and_each_break_is_placed() {
        let s = sample_session("a", 0, 4);
        check_session_chains(&records(&s)).unwrap();
        // Two sessions interleaved with a plain run.
        let t = sample_session("b", 10, 2);
        let plain = crate::sample::sample_exchange(99);
        let mixed = [&s[0], &t[0], &plain, &s[1], &t[1], &s[2], &s[3]];
        let recs: Vec<&RunRecord> = mixed.iter().map(|e| &e.response.record).collect();
        check_session_chains(&recs).unwrap();

        let at = |order: &[usize]| {
            let recs: Vec<&RunRecord> = order.iter().map(|&i| &s[i].response.record).collect();
            check_session_chains(&recs).unwrap_err()
        };
        let (i, e) = at(&[0, 2, 3]);
        assert_eq!(i, 1);
        assert!(
            matches!(
                e,
                SessionChainError::Missing {
                    sequence: 3,
                    expected: 2,
                    ..
                }
            ),
            "{e}"
        );
        let (i, e) = at(&[0, 1, 1, 2]);
        assert_eq!(i, 2);
        assert!(
            matches!(&e, SessionChainError::Repeated { sequence: 2, first_request_id, .. } if first_request_id == &s[1].request.request_id),
            "{e}"
        );
        let (i, e) = at(&[0, 2, 1, 3]);
        assert_eq!(i, 1);
        assert!(
            matches!(
                e,
                SessionChainError::OutOfOrder {
                    sequence: 3,
                    expected: 2,
                    ..
                }
            ),
            "{e}"
        );
        let (i, e) = at(&[1, 2]);
        assert_eq!(i, 0);
        assert!(
            matches!(e, SessionChainError::StartsLate { sequence: 2, .. }),
            "{e}"
        );
        assert_eq!(e.session_id(), "a");
        assert_eq!(e.sequence(), 2);
    }
}
