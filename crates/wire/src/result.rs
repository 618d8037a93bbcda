//! Results, as the daemon returns them: the outcome, where it ran, and the run record.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{Bytes, Tier};

/// What a run produced. Every field except the durations is covered by the result digest.
/// Serde checks the shapes; [`RunResult::validate`] checks what lies between members.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunResult {
    /// The exit status of the snippet, or of the last project step that ran; `None` when it
    /// was killed by a signal.
    pub exit_code: Option<i32>,
    /// The signal that ended it, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// The wall timeout fired and the sandbox was killed.
    pub timed_out: bool,
    /// The memory limit was hit and the sandbox's code was killed for it.
    #[serde(default, deserialize_with = "crate::nulls::or_default")]
    pub oom_killed: bool,
    /// Standard output, at most the output limit.
    pub stdout: Bytes,
    /// Standard output went past the limit; the rest was dropped.
    pub stdout_truncated: bool,
    /// Standard error, at most the output limit.
    pub stderr: Bytes,
    /// Standard error went past the limit; the rest was dropped.
    pub stderr_truncated: bool,
    /// One result per project step that ran, in order (empty for snippets).
    #[serde(
        default,
        deserialize_with = "crate::nulls::or_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub steps: Vec<StepResult>,
    /// Artifacts a project asked for, in the order asked.
    #[serde(
        default,
        deserialize_with = "crate::nulls::or_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub artifacts: Vec<Artifact>,
    /// Every call the run made through its grant's broker, in order (empty without a grant).
    #[serde(
        default,
        deserialize_with = "crate::nulls::or_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub calls: Vec<GrantCall>,
    /// How the sandbox started: fresh for this request (`Cold`), or ahead of it, from a warm
    /// pool (`Warm`). Every result this crate's engine produces has it; `None` only for a
    /// result written before the field existed (its digest unchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<Start>,
    /// How long the warm pool member waited between being started and being claimed, in
    /// milliseconds. Present exactly when `start` is `Warm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_age_ms: Option<u64>,
    /// What the sandbox looked like just before its code was handed over, as the kernel shows
    /// the process that then ran the code; the engine handed the code over only because it
    /// matched the provider's evidence. `None` where the provider does not read one yet
    /// (docs/protocol.md says which), and for a result written before the field existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall: Option<Wall>,
    /// A session's cell only: whether the interpreter that ran it is the one of the
    /// session's previous cell, alive with its state after this one (`false` when it ended
    /// during this cell, or when this cell started a fresh one). Absent outside cells.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_kept: Option<bool>,
    /// A session's cell only: why its interpreter ended during this cell (its state is lost;
    /// the next cell must ask for a restart). Absent when it did not end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interpreter_end: Option<crate::EndReason>,
    /// Every connection the run's code asked the broker's egress proxy for, allowed or
    /// refused, in the order the broker accepted them (empty without an egress grant).
    /// Covered by the result digest, offsets included, and by the outcome digest: it is what
    /// the code reached.
    #[serde(
        default,
        deserialize_with = "crate::nulls::or_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub egress: Vec<EgressReceipt>,
}

/// A run's sandbox as seen just before its code was handed over: who the code runs as, with
/// which privileges and filters, in which namespaces, under which limits, on which root and
/// network. Read from /proc for the process that runs the code (docs/protocol.md, `Wall`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Wall {
    /// Real uid.
    pub uid: u32,
    /// Effective uid.
    pub euid: u32,
    /// Real gid.
    pub gid: u32,
    /// Supplementary groups (empty when none).
    #[serde(
        default,
        deserialize_with = "crate::nulls::or_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub groups: Vec<u32>,
    /// The inheritable capability set, 16 hex digits as /proc shows it (`CapInh`); absent
    /// when the kernel shows no such line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap_inh: Option<String>,
    /// The permitted set (`CapPrm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap_prm: Option<String>,
    /// The effective set (`CapEff`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap_eff: Option<String>,
    /// The bounding set (`CapBnd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap_bnd: Option<String>,
    /// The ambient set (`CapAmb`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap_amb: Option<String>,
    /// `NoNewPrivs`; absent when the kernel shows no such line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_new_privs: Option<bool>,
    /// The seccomp mode (0 none, 1 strict, 2 filter); absent when the kernel shows none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seccomp: Option<u32>,
    /// Its namespaces, by name, each with whether it is the host's.
    #[serde(
        default,
        deserialize_with = "crate::nulls::or_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub namespaces: Vec<WallNamespace>,
    /// Its root directory's mount is read-only.
    pub root_read_only: bool,
    /// The network interfaces of its network namespace.
    #[serde(
        default,
        deserialize_with = "crate::nulls::or_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub network_interfaces: Vec<String>,
    /// Its memory cgroup's limit, bytes; absent when none is visible.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit_bytes: Option<u64>,
    /// Its pids cgroup's limit; absent when none is visible.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_limit: Option<u64>,
}

/// One namespace of a run's sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WallNamespace {
    /// Its kind, as /proc/PID/ns names it (`mnt`, `net`, `pid`, ...).
    pub name: String,
    /// Its identity, the link target (`net:[4026532281]`).
    pub id: String,
    /// Whether it is the daemon's own; absent where comparing says nothing (a guest kernel's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_as_host: Option<bool>,
}

/// How a run's sandbox started. A warm start is a fresh sandbox started ahead of the request
/// and used for exactly one run; a cold start is one started for the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Start {
    /// Started ahead of the request, from a warm pool, and used for this run only.
    Warm,
    /// Started for this request.
    Cold,
}

impl Start {
    /// The lowercase wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Start::Warm => "warm",
            Start::Cold => "cold",
        }
    }
}

/// Which kind of credential the broker attached to a grant's call: the profile's static
/// secret (development; the same on every call of every run) or a JWT minted for the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CredentialKind {
    /// The profile's static secret.
    Static,
    /// A short-lived JWT minted for this run.
    Minted,
}

impl CredentialKind {
    /// The lowercase wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            CredentialKind::Static => "static",
            CredentialKind::Minted => "minted",
        }
    }
}

impl fmt::Display for CredentialKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Start {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a result that parsed is still malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MalformedResult {
    /// `member_age_ms` is present but `start` is not `"warm"`.
    #[error(
        "the result is malformed: `member_age_ms` is present but `start` is {}, not \"warm\" (only a warm start has a pool member's age)",
        start.map_or("absent".to_owned(), |s| format!("\"{s}\""))
    )]
    MemberAgeWithoutWarmStart {
        /// The `start` the result stated.
        start: Option<Start>,
    },
    /// `start` is `"warm"` but `member_age_ms` is absent.
    #[error(
        "the result is malformed: `start` is \"warm\" but `member_age_ms` is absent (a warm start always says how long its pool member waited)"
    )]
    WarmStartWithoutMemberAge,
}

impl RunResult {
    /// Reads the result an agent inside a sandbox answered. What only the host can know is
    /// dropped whatever the answer claimed: how the sandbox started (`start`,
    /// `member_age_ms`), its `wall`, which the host reads itself or leaves absent, and the
    /// `egress` receipts, which only the broker writes. (The agent is not trusted beyond "it
    /// reports what happened inside".)
    pub fn from_agent(answer: &[u8]) -> serde_json::Result<RunResult> {
        let mut r: RunResult = serde_json::from_slice(answer)?;
        r.start = None;
        r.member_age_ms = None;
        r.wall = None;
        r.state_kept = None;
        r.interpreter_end = None;
        r.egress = Vec::new();
        Ok(r)
    }

    /// Checks what serde cannot: `member_age_ms` is present exactly when `start` is `Warm`.
    pub fn validate(&self) -> Result<(), MalformedResult> {
        match (self.start, self.member_age_ms) {
            (Some(Start::Warm), None) => Err(MalformedResult::WarmStartWithoutMemberAge),
            (start, Some(_)) if start != Some(Start::Warm) => {
                Err(MalformedResult::MemberAgeWithoutWarmStart { start })
            }
            _ => Ok(()),
        }
    }
}

/// One call a run made through its grant's broker. Never carries the credential, the
/// request's own path (only the route template it matched) or any body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantCall {
    /// `GET`, `POST`, `PUT`, `PATCH` or `DELETE`; `OTHER` for a request naming none of them.
    pub method: String,
    /// The granted route's path template it matched (e.g. `/orders/*`); absent when it
    /// matched none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// The API's HTTP status; absent when the API was not called or did not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Why the broker refused the call or it failed (`route_not_allowed`,
    /// `path_not_canonical`, `budget_exhausted`, ... see docs/capability-grants.md); absent
    /// when the API answered and the answer went back to the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Bytes of the request body sent to the API.
    pub request_bytes: u64,
    /// Bytes of the response body received from the API.
    pub response_bytes: u64,
    /// Wall time of the call in the broker. Not covered by the result digest.
    pub latency_ms: u64,
    /// The kind of credential the broker attached (`static` or `minted`). The broker sets it
    /// on every call it lists; `None` only for a result written before the field existed
    /// (its digest unchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<CredentialKind>,
}

/// One connection the run's code asked the broker for (docs/capability-grants.md, "Egress"):
/// where it asked to go, where the broker went, how much crossed, when, and what decided.
/// The broker writes one for every attempt, refused ones included; the engine lists them on
/// the result, inside its digest, so a signature over the result covers what the code reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressReceipt {
    /// The host the code named (lowercased), or the IP literal or the target as sent (at
    /// most 255 bytes) when refused before it parsed.
    pub host: String,
    /// The port the code named; 0 when it named none that parsed.
    pub port: u16,
    /// `connect` (a CONNECT tunnel) or `http` (one plain-HTTP request).
    pub kind: String,
    /// The address the broker connected to, `ip:port` (`[v6]:port`); absent when it
    /// connected to none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The server name the TLS ClientHello carried; absent for plain HTTP or when none was
    /// read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
    /// Bytes from the code to the host (payload after the CONNECT exchange; for `http`, the
    /// request as forwarded).
    pub bytes_up: u64,
    /// Bytes from the host to the code (likewise; for `http`, the response as forwarded).
    pub bytes_down: u64,
    /// When the broker accepted the request, in milliseconds from the run's start.
    pub start_ms: u64,
    /// When the connection ended, in milliseconds from the run's start.
    pub end_ms: u64,
    /// `allowed` or `refused`.
    pub verdict: String,
    /// What decided: for `allowed`, the rule that allowed it (`host *.example.com port 443`,
    /// plus ` via 127.0.0.0/8` when an address range let a non-public address through); for
    /// `refused`, the check's code (`host_not_allowed`, `port_not_allowed`, `ip_literal`,
    /// `address_not_allowed`, `resolve_failed`, `sni_missing`, `sni_mismatch`, `not_tls`,
    /// `bad_request`, `budget_connections`, `deadline`, ...).
    pub rule: String,
    /// How an allowed connection ended: `closed`, `deadline`, `budget_bytes`, `budget_time`,
    /// `connect_failed`, `upstream_failed`; absent for a refused one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
}

/// The outcome of one project step.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepResult {
    /// The step's label, if it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Exit status; `None` when killed by a signal.
    pub exit_code: Option<i32>,
    /// The signal that ended it, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// The run's wall timeout fired during this step.
    pub timed_out: bool,
    /// Killed by the memory limit.
    #[serde(default, deserialize_with = "crate::nulls::or_default")]
    pub oom_killed: bool,
    /// Standard output of the step.
    pub stdout: Bytes,
    /// Standard output went past the limit.
    pub stdout_truncated: bool,
    /// Standard error of the step.
    pub stderr: Bytes,
    /// Standard error went past the limit.
    pub stderr_truncated: bool,
    /// Wall time of the step. Not covered by the result digest.
    pub duration_ms: u64,
}

/// A file returned from `/work` after a project's steps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Artifact {
    /// The path asked for, relative to `/work`.
    pub path: String,
    /// `false` when the file did not exist (or was not a regular file); `content` is then empty.
    pub found: bool,
    /// The file's size on disk, in bytes.
    pub size: u64,
    /// The content, at most the artifact limit.
    pub content: Bytes,
    /// The file was larger than the artifact limit; the rest was dropped.
    pub truncated: bool,
}

/// A successful answer to `POST /v1/runs`: the run happened, here is what it did and where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunResponse {
    /// The protocol number of the answer.
    pub protocol: u32,
    /// The caller's request id, echoed.
    pub request_id: String,
    /// The provider that ran it.
    pub provider: String,
    /// The tier of that provider, from its evidence.
    pub isolation: Tier,
    /// Wall time from dispatch to result, in milliseconds.
    pub duration_ms: u64,
    /// SHA-256 (lowercase hex) of the request's digest encoding.
    pub request_sha256: String,
    /// SHA-256 (lowercase hex) of the result's digest encoding.
    pub result_sha256: String,
    /// What the run produced.
    pub result: RunResult,
    /// The run record: what ran, where, when, with its own digest.
    pub record: RunRecord,
}

/// Where a session call's record sits in its session's chain: a signer's bundle of a
/// session refuses a call missing, repeated or reordered by these.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionLink {
    /// The session's id.
    pub session_id: String,
    /// The call's sequence number in the session: 1 for its first call, then one more each.
    pub sequence: u64,
    /// The record digest of the session's previous call; absent exactly for sequence 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_record_sha256: Option<String>,
    /// Where a restored or forked session came from (record field 14); absent for a
    /// session opened fresh, whose records keep their digests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<crate::SessionOrigin>,
}

/// The run record: the facts a signer needs, with a digest over them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRecord {
    /// The caller's request id.
    pub request_id: String,
    /// Digest of the request.
    pub request_sha256: String,
    /// Digest of the result.
    pub result_sha256: String,
    /// The provider that ran it.
    pub provider: String,
    /// Its tier.
    pub isolation: Tier,
    /// The floor the run was held to: the request's `minimum_isolation`, or the operator's
    /// default floor when the request set none. Every record this crate's engine writes has
    /// it; `None` only for a record written before the field existed (its digest unchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_isolation: Option<Tier>,
    /// Digest of the provider's evidence when it ran (see `GET /v1/providers`).
    pub evidence_sha256: String,
    /// What the code ran on: the sandbox image identity, or the engine version for the
    /// process tier.
    pub environment: String,
    /// When the sandbox was started, Unix milliseconds.
    pub started_unix_ms: u64,
    /// When the result was complete, Unix milliseconds.
    pub ended_unix_ms: u64,
    /// A session call's place in its session's chain; absent for a run outside a session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionLink>,
    /// The image the code ran in (its name and identity); absent at the process tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<crate::ImageRef>,
    /// What each trial step's verdict said (the simulator, each trial's end, score and
    /// fingerprint), one entry per trial step that printed one, in step order; empty for a
    /// run without trial steps (and left out, so such a record keeps its digest).
    #[serde(
        default,
        deserialize_with = "crate::nulls::or_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub trials: Vec<crate::TrialStepRecord>,
    /// SHA-256 (lowercase hex) of the record's digest encoding (every field above).
    pub record_sha256: String,
}

impl RunRecord {
    /// Checks what serde cannot: each trial step's record within its bounds
    /// ([`crate::TrialStepRecord::validate`]), and the trial steps listed once each, in step
    /// order.
    pub fn validate(&self) -> Result<(), crate::MalformedTrials> {
        crate::trial::validate_trial_steps(&self.trials)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_with_nulls_for_its_optional_members_parses() {
        let json = r#"{"exit_code":null,"signal":9,"timed_out":false,"oom_killed":null,"stdout":"","stdout_truncated":false,"stderr":"","stderr_truncated":false,"steps":null,"artifacts":null,"calls":null}"#;
        let r: RunResult = serde_json::from_str(json).unwrap();
        assert!(
            !r.oom_killed && r.steps.is_empty() && r.artifacts.is_empty() && r.calls.is_empty()
        );
        // A required member is never null.
        let bad = json.replace(r#""timed_out":false"#, r#""timed_out":null"#);
        assert!(serde_json::from_str::<RunResult>(&bad).is_err());
    }

    #[test]
    fn start_is_lowercase_and_optional_for_reading() {
        let old = r#"{"exit_code":0,"timed_out":false,"stdout":"","stdout_truncated":false,"stderr":"","stderr_truncated":false}"#;
        let r: RunResult = serde_json::from_str(old).unwrap();
        assert_eq!((r.start, r.member_age_ms), (None, None));
        assert_eq!(r.validate(), Ok(()));
        // Absent members are left out when written, so an old result reads back unchanged.
        assert!(!serde_json::to_string(&r).unwrap().contains("start"));

        let warm = old.replace('}', r#","start":"warm","member_age_ms":1500}"#);
        let r: RunResult = serde_json::from_str(&warm).unwrap();
        assert_eq!((r.start, r.member_age_ms), (Some(Start::Warm), Some(1500)));
        assert_eq!(r.validate(), Ok(()));
        let json = serde_json::to_string(&r).unwrap();
        assert!(
            json.contains(r#""start":"warm","member_age_ms":1500"#),
            "{json}"
        );

        let cold = old.replace('}', r#","start":"cold"}"#);
        let r: RunResult = serde_json::from_str(&cold).unwrap();
        assert_eq!(r.start, Some(Start::Cold));
        assert_eq!(r.validate(), Ok(()));

        for bad in [r#""Warm""#, r#""hot""#, "1"] {
            let json = old.replace('}', &format!(r#","start":{bad}}}"#));
            assert!(serde_json::from_str::<RunResult>(&json).is_err(), "{json}");
        }
    }

    #[test]
    fn a_member_age_without_a_warm_start_is_malformed() {
        for start in [None, Some(Start::Cold)] {
            let r = RunResult {
                start,
                member_age_ms: Some(7),
                ..RunResult::default()
            };
            let e = r.validate().unwrap_err();
            assert_eq!(e, MalformedResult::MemberAgeWithoutWarmStart { start });
            let text = e.to_string();
            assert!(text.contains("`member_age_ms` is present"), "{text}");
            assert!(text.contains(r#"not "warm""#), "{text}");
        }
        let cold = RunResult {
            start: Some(Start::Cold),
            member_age_ms: Some(7),
            ..RunResult::default()
        };
        assert!(
            cold.validate()
                .unwrap_err()
                .to_string()
                .contains(r#"`start` is "cold""#)
        );
        let warm = RunResult {
            start: Some(Start::Warm),
            ..RunResult::default()
        };
        assert_eq!(
            warm.validate(),
            Err(MalformedResult::WarmStartWithoutMemberAge)
        );
    }

    #[test]
    fn a_records_trials_default_to_none_and_are_validated() {
        let plain = r#"{"request_id":"r","request_sha256":"a","result_sha256":"b","provider":"crun","isolation":"container","evidence_sha256":"c","environment":"e","started_unix_ms":1,"ended_unix_ms":2,"record_sha256":"d"}"#;
        let r: RunRecord = serde_json::from_str(plain).unwrap();
        assert!(r.trials.is_empty() && r.validate().is_ok());
        // Left out when empty, so a record without trial steps reads back unchanged.
        assert!(!serde_json::to_string(&r).unwrap().contains("trials"));
        let null = plain.replace('}', r#","trials":null}"#);
        assert_eq!(serde_json::from_str::<RunRecord>(&null).unwrap(), r);
        let fp = "f".repeat(64);
        let step = |step: u32, pass: bool| {
            format!(
                r#"{{"step":{step},"simulator":{{"name":"cartpole","version":"1.0.0","sha256":"{fp}"}},"pass":{pass},"trials":[{{"end":"completed","ticks":2,"pass":{pass},"fingerprint":"{fp}"}}]}}"#
            )
        };
        let with = |steps: &[String]| {
            let json = plain.replace('}', &format!(r#","trials":[{}]}}"#, steps.join(",")));
            serde_json::from_str::<RunRecord>(&json).unwrap()
        };
        let good = with(&[step(0, true), step(2, false)]);
        assert_eq!(good.trials.len(), 2);
        assert_eq!(good.validate(), Ok(()));
        let e = with(&[step(2, true), step(0, true)])
            .validate()
            .unwrap_err();
        assert_eq!(
            e,
            crate::MalformedTrials::StepOrder {
                step: 0,
                previous: 2
            }
        );
        let bad_pass = with(&[step(0, true).replacen(r#""pass":true"#, r#""pass":false"#, 1)]);
        assert!(matches!(
            bad_pass.validate(),
            Err(crate::MalformedTrials::Pass { step: 0, .. })
        ));
    }

    #[test]
    fn an_agent_cannot_say_how_its_sandbox_started_or_what_its_wall_is() {
        let answer = r#"{"exit_code":0,"timed_out":false,"stdout":"","stdout_truncated":false,
            "stderr":"","stderr_truncated":false,"start":"warm","member_age_ms":5,
            "wall":{"uid":0,"euid":0,"gid":0,"root_read_only":true}}"#;
        let r = RunResult::from_agent(answer.as_bytes()).unwrap();
        assert_eq!((r.start, r.member_age_ms, r.wall), (None, None, None));
        assert_eq!(r.exit_code, Some(0));
    }

    const RECEIPT: &str = r#"{"host":"api.example.com","port":443,"kind":"connect","address":"93.184.215.14:443","sni":"api.example.com","bytes_up":517,"bytes_down":4821,"start_ms":112,"end_ms":348,"verdict":"allowed","rule":"host *.example.com port 443","ended":"closed"}"#;

    #[test]
    fn an_agent_cannot_claim_egress_receipts() {
        let answer = format!(
            r#"{{"exit_code":0,"timed_out":false,"stdout":"","stdout_truncated":false,"stderr":"","stderr_truncated":false,"egress":[{RECEIPT}]}}"#
        );
        // The shape is a result's, so serde reads it; the agent's claim is dropped.
        let read: RunResult = serde_json::from_str(&answer).unwrap();
        assert_eq!(read.egress.len(), 1);
        let r = RunResult::from_agent(answer.as_bytes()).unwrap();
        assert!(r.egress.is_empty());
    }

    #[test]
    fn an_egress_receipt_reads_strictly_and_writes_back_in_table_order() {
        let r: EgressReceipt = serde_json::from_str(RECEIPT).unwrap();
        assert_eq!(
            (r.port, r.sni.as_deref(), r.ended.as_deref()),
            (443, Some("api.example.com"), Some("closed"))
        );
        assert_eq!(serde_json::to_string(&r).unwrap(), RECEIPT);
        // Optional members: null is absent, and absent ones are left out when written.
        let refused = r#"{"host":"169.254.169.254","port":80,"kind":"http","address":null,"sni":null,"bytes_up":0,"bytes_down":0,"start_ms":5,"end_ms":5,"verdict":"refused","rule":"ip_literal","ended":null}"#;
        let r: EgressReceipt = serde_json::from_str(refused).unwrap();
        assert_eq!((&r.address, &r.sni, &r.ended), (&None, &None, &None));
        let written = serde_json::to_string(&r).unwrap();
        assert!(
            !written.contains("address") && !written.contains("sni") && !written.contains("ended"),
            "{written}"
        );
        for bad in [
            RECEIPT.replace(r#""port":443"#, r#""port":65536"#),
            RECEIPT.replace(r#""port":443"#, r#""port":null"#),
            RECEIPT.replace(r#","ended":"closed""#, r#","ended":"closed","extra":1"#),
            RECEIPT.replace(r#""verdict":"allowed","#, ""),
        ] {
            assert!(
                serde_json::from_str::<EgressReceipt>(&bad).is_err(),
                "{bad}"
            );
        }
        // A result without receipts writes none, and `"egress": null` reads as none.
        let plain = r#"{"exit_code":0,"timed_out":false,"stdout":"","stdout_truncated":false,"stderr":"","stderr_truncated":false}"#;
        let r: RunResult = serde_json::from_str(plain).unwrap();
        assert!(!serde_json::to_string(&r).unwrap().contains("egress"));
        let null = plain.replace('}', r#","egress":null}"#);
        assert_eq!(serde_json::from_str::<RunResult>(&null).unwrap(), r);
        assert!(
            serde_json::from_str::<RunResult>(&plain.replace('}', r#","egress":[null]}"#)).is_err()
        );
    }
}
