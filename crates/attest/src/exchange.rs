//! A stored exchange (the request as sent, the response as received) and the checks that must
//! pass before it is signed and again whenever it is verified: every digest recomputed, every
//! echoed field consistent, the tier at or above the floor.

use std::path::{Path, PathBuf};

use plimsoll_wire::digest::{record_sha256, request_sha256, result_sha256, sha256_hex};
use plimsoll_wire::{PROTOCOL, RunRequest, RunResponse, Tier};
use serde::{Deserialize, Serialize};

use crate::session::{SessionLinkProblem, link_problem};

/// One request and the daemon's answer to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Exchange {
    /// The request as sent.
    pub request: RunRequest,
    /// The full response.
    pub response: RunResponse,
}

impl Exchange {
    /// The canonical JSON of the exchange: serde's field order, no whitespace. A bundle line
    /// stores exactly these bytes.
    pub fn canonical_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an exchange serialises")
    }

    /// SHA-256 (lowercase hex) of [`Exchange::canonical_json`].
    pub fn sha256(&self) -> String {
        sha256_hex(&self.canonical_json())
    }
}

/// Why a file of stored exchanges could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadExchangesError {
    /// The file could not be read.
    #[error("cannot read exchanges from {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A line is not an exchange.
    #[error("{} line {line} is not an exchange (one JSON object per line, `{{\"request\":…,\"response\":…}}`): {why}", path.display())]
    Line {
        /// The file.
        path: PathBuf,
        /// The line number, from 1.
        line: usize,
        /// The parser's complaint.
        why: String,
    },
}

/// Reads stored exchanges, one JSON object per line as [`Exchange`] serialises (blank lines are
/// passed over), in order. Nothing is checked here but the shape: see [`check_exchange`].
pub fn read_exchanges(path: &Path) -> Result<Vec<Exchange>, ReadExchangesError> {
    let text = std::fs::read_to_string(path).map_err(|source| ReadExchangesError::Read {
        path: path.to_owned(),
        source,
    })?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| ReadExchangesError::Line {
                path: path.to_owned(),
                line: i + 1,
                why: e.to_string(),
            })
        })
        .collect()
}

/// The digests of an exchange that passed [`check_exchange`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedDigests {
    /// Recomputed from the stored request.
    pub request_sha256: String,
    /// Recomputed from the stored result.
    pub result_sha256: String,
    /// Recomputed from the stored record.
    pub record_sha256: String,
    /// Of the whole exchange.
    pub exchange_sha256: String,
}

/// Why an exchange does not check; nothing is signed then.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckExchangeError {
    /// A protocol this version does not know.
    #[error("the {side} speaks protocol {found}; plimsoll-attest checks protocol {PROTOCOL}")]
    Protocol {
        /// `request` or `response`.
        side: &'static str,
        /// The number found.
        found: u32,
    },
    /// A digest stated in the response is not the one recomputed.
    #[error(
        "{field} recomputed from the stored {from} is {recomputed}, but {stated_in} says {stated}"
    )]
    Digest {
        /// Which digest.
        field: &'static str,
        /// What it was recomputed from.
        from: &'static str,
        /// Where the differing value is.
        stated_in: &'static str,
        /// The value stated.
        stated: String,
        /// The value recomputed.
        recomputed: String,
    },
    /// Two places that must agree do not.
    #[error("{field} differs: {a_name} says `{a}`, {b_name} says `{b}`")]
    Disagree {
        /// Which field.
        field: &'static str,
        /// First place.
        a_name: &'static str,
        /// Its value.
        a: String,
        /// Second place.
        b_name: &'static str,
        /// Its value.
        b: String,
    },
    /// The run's tier is below the floor the request set.
    #[error("ran at tier {ran}, below the floor {floor} the request set")]
    BelowFloor {
        /// The tier it ran at.
        ran: Tier,
        /// The floor.
        floor: Tier,
    },
    /// The record's session link is malformed.
    #[error("the record's session link (session `{session_id}`, call {sequence}) {problem}")]
    SessionLink {
        /// The session.
        session_id: String,
        /// The call's sequence.
        sequence: u64,
        /// What is wrong.
        problem: SessionLinkProblem,
    },
    /// A digest that is not 64 lowercase hex digits.
    #[error("{field} `{value}` is not 64 lowercase hex digits")]
    NotHex {
        /// Which field.
        field: &'static str,
        /// Its value.
        value: String,
    },
}

fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn agree(
    field: &'static str,
    a_name: &'static str,
    a: &str,
    b_name: &'static str,
    b: &str,
) -> Result<(), CheckExchangeError> {
    if a == b {
        return Ok(());
    }
    Err(CheckExchangeError::Disagree {
        field,
        a_name,
        a: a.to_owned(),
        b_name,
        b: b.to_owned(),
    })
}

fn digest(
    field: &'static str,
    from: &'static str,
    recomputed: &str,
    stated: &[(&'static str, &str)],
) -> Result<(), CheckExchangeError> {
    for (stated_in, value) in stated {
        if *value != recomputed {
            return Err(CheckExchangeError::Digest {
                field,
                from,
                stated_in,
                stated: (*value).to_owned(),
                recomputed: recomputed.to_owned(),
            });
        }
    }
    Ok(())
}

/// Recomputes the request, result and record digests from the exchange and checks that the
/// response and its record state exactly those, that the echoed fields agree, that a session
/// link is well formed (sequence from 1, a previous record digest exactly after call 1), and
/// that the tier meets the request's floor (and the provider is the one the request named, if
/// any). Where a session call stands in its session's chain is checked across entries
/// (`session`).
pub fn check_exchange(ex: &Exchange) -> Result<CheckedDigests, CheckExchangeError> {
    let (req, resp, rec) = (&ex.request, &ex.response, &ex.response.record);
    for (side, found) in [("request", req.protocol), ("response", resp.protocol)] {
        if found != PROTOCOL {
            return Err(CheckExchangeError::Protocol { side, found });
        }
    }
    agree(
        "request_id",
        "the request",
        &req.request_id,
        "the response",
        &resp.request_id,
    )?;
    agree(
        "request_id",
        "the request",
        &req.request_id,
        "the record",
        &rec.request_id,
    )?;
    let request = request_sha256(req);
    digest(
        "request_sha256",
        "request",
        &request,
        &[
            ("the response", &resp.request_sha256),
            ("the record", &rec.request_sha256),
        ],
    )?;
    let result = result_sha256(&resp.result);
    digest(
        "result_sha256",
        "result",
        &result,
        &[
            ("the response", &resp.result_sha256),
            ("the record", &rec.result_sha256),
        ],
    )?;
    let record = record_sha256(rec);
    digest(
        "record_sha256",
        "record",
        &record,
        &[("the record", &rec.record_sha256)],
    )?;
    agree(
        "provider",
        "the response",
        &resp.provider,
        "the record",
        &rec.provider,
    )?;
    agree(
        "isolation",
        "the response",
        resp.isolation.as_str(),
        "the record",
        rec.isolation.as_str(),
    )?;
    if !is_sha256_hex(&rec.evidence_sha256) {
        return Err(CheckExchangeError::NotHex {
            field: "record.evidence_sha256",
            value: rec.evidence_sha256.clone(),
        });
    }
    if let Some(link) = &rec.session {
        if let Some(problem) = link_problem(link) {
            return Err(CheckExchangeError::SessionLink {
                session_id: link.session_id.clone(),
                sequence: link.sequence,
                problem,
            });
        }
        if let Some(previous) = &link.previous_record_sha256
            && !is_sha256_hex(previous)
        {
            return Err(CheckExchangeError::NotHex {
                field: "record.session.previous_record_sha256",
                value: previous.clone(),
            });
        }
    }
    if let Some(floor) = req.minimum_isolation
        && rec.isolation < floor
    {
        return Err(CheckExchangeError::BelowFloor {
            ran: rec.isolation,
            floor,
        });
    }
    // The floor the daemon applied (records written before the field existed have none).
    if let Some(applied) = rec.minimum_isolation {
        if let Some(floor) = req.minimum_isolation {
            agree(
                "minimum_isolation",
                "the request",
                floor.as_str(),
                "the record",
                applied.as_str(),
            )?;
        }
        if rec.isolation < applied {
            return Err(CheckExchangeError::BelowFloor {
                ran: rec.isolation,
                floor: applied,
            });
        }
    }
    if let Some(named) = &req.provider {
        agree(
            "provider",
            "the request",
            named,
            "the record",
            &rec.provider,
        )?;
    }
    Ok(CheckedDigests {
        request_sha256: request,
        result_sha256: result,
        record_sha256: record,
        exchange_sha256: ex.sha256(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::sample_exchange;

    #[test]
    fn the_applied_floor_must_equal_the_request_s_and_be_met() {
        let ex = sample_exchange(0);
        // The request set no floor: the record's is the operator's default, and the tier
        // must meet it.
        let mut e = ex.clone();
        e.request.minimum_isolation = None;
        e.response.record.minimum_isolation = Some(Tier::Container);
        crate::sample::restate_digests(&mut e);
        let got = check_exchange(&e);
        assert!(
            matches!(
                got,
                Err(CheckExchangeError::BelowFloor {
                    floor: Tier::Container,
                    ..
                })
            ),
            "{got:?}"
        );
        // The request set one: the record must state that one.
        let mut e = ex.clone();
        e.request.minimum_isolation = Some(Tier::Process);
        e.response.record.minimum_isolation = None;
        crate::sample::restate_digests(&mut e);
        check_exchange(&e).unwrap();
        e.response.record.minimum_isolation = Some(Tier::Container);
        e.response.record.isolation = Tier::Container;
        e.response.isolation = Tier::Container;
        crate::sample::restate_digests(&mut e);
        let msg = check_exchange(&e).unwrap_err().to_string();
        assert!(msg.contains("minimum_isolation"), "{msg}");
    }

    #[test]
    fn a_consistent_exchange_checks_and_each_break_is_named() {
        let ex = sample_exchange(0);
        let d = check_exchange(&ex).unwrap();
        assert_eq!(d.record_sha256, ex.response.record.record_sha256);

        let mut e = ex.clone();
        e.response.result.stdout = "other".into();
        let msg = check_exchange(&e).unwrap_err().to_string();
        assert!(
            msg.starts_with("result_sha256 recomputed from the stored result"),
            "{msg}"
        );

        let mut e = ex.clone();
        e.request.limits = Some(Default::default());
        e.request.limits.as_mut().unwrap().timeout_ms = Some(1);
        let msg = check_exchange(&e).unwrap_err().to_string();
        assert!(msg.starts_with("request_sha256 recomputed"), "{msg}");

        let mut e = ex.clone();
        e.response.record.ended_unix_ms += 1;
        let msg = check_exchange(&e).unwrap_err().to_string();
        assert!(msg.starts_with("record_sha256 recomputed"), "{msg}");

        let mut e = ex.clone();
        e.request.minimum_isolation = Some(Tier::Vm);
        // The request digest changes with the floor; restate it so the floor check is reached.
        crate::sample::restate_digests(&mut e);
        assert!(matches!(
            check_exchange(&e),
            Err(CheckExchangeError::BelowFloor { .. })
        ));

        let mut e = ex.clone();
        e.response.request_id = "other".into();
        assert!(matches!(
            check_exchange(&e),
            Err(CheckExchangeError::Disagree {
                field: "request_id",
                ..
            })
        ));
    }
}
