//! The launcher's socket (docs/privileges.md, "The launcher"): what the process that parses
//! requests sends the process that keeps root, and what comes back. Every request names a
//! provider the launcher hosts; a run's plan is a closed, typed record (unknown fields are
//! refused, so a plan can say nothing its type cannot express) that the launcher checks
//! against its settings before it does anything.
//!
//! One connection per request. A run's answer may be preceded by events: output as it is
//! read (a streamed answer) and, with a descriptor passed beside them, the broker channel's
//! streams and listeners the provider made for the sandbox (the caller serves them). After a
//! run whose sandbox's removal was deferred, the connection stays open for [`LaunchRequest::TearDown`].

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{Bytes, Evidence, OutputStream, Reason, RunResult, RunSpec, Tier};

/// A request to the launcher.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum LaunchRequest {
    /// What each hosted provider is: answered with [`LaunchAnswer::Described`].
    Describe,
    /// Whether the provider can do this kind of run at all.
    Supports {
        /// The provider.
        provider: String,
        /// The run.
        spec: RunSpec,
    },
    /// Whether the provider can run in this image.
    TakesImage {
        /// The provider.
        provider: String,
        /// The image.
        image: PlanImage,
    },
    /// The least memory a run of `spec` starts under there.
    MemoryFloor {
        /// The provider.
        provider: String,
        /// The run.
        spec: RunSpec,
    },
    /// What routing asks of every hosted provider for one run, at once (whether it supports
    /// the run, takes the image, and its memory floor): answered with
    /// [`LaunchAnswer::Admitted`], so a run's routing costs one round trip, not three per
    /// provider.
    Admit {
        /// The run.
        spec: RunSpec,
        /// The image it would run in, when it names or defaults to one.
        image: Option<PlanImage>,
        /// Per provider, the SHA-256 of the evidence it is offered on: the launcher also says
        /// whether that environment still holds, when it knows the evidence (it keeps what it
        /// probed and was given to adopt).
        evidence_sha256: std::collections::BTreeMap<String, String>,
    },
    /// Runs the provider's probe.
    Probe {
        /// The provider.
        provider: String,
    },
    /// Takes evidence from an earlier probe instead of probing.
    Adopt {
        /// The provider.
        provider: String,
        /// The evidence.
        evidence: Evidence,
    },
    /// Whether what the evidence names is still what a run would get.
    EnvironmentHolds {
        /// The provider.
        provider: String,
        /// The evidence.
        evidence: Evidence,
    },
    /// Runs one plan.
    Run {
        /// The provider.
        provider: String,
        /// The plan.
        plan: Plan,
    },
    /// Ends the processes of a dispatched run's sandbox.
    Cancel {
        /// The provider.
        provider: String,
        /// The sandbox's id (a run id, or a warm member's).
        id: String,
        /// The uid its code runs as.
        uid: u32,
    },
    /// Removes what is left of the sandbox of the run answered on this connection.
    TearDown,
    /// Makes one warm member: answered with [`LaunchAnswer::Warmed`]. The connection is the
    /// member from then on: a [`LaunchRequest::Run`] on it is the member's one run, a
    /// [`LaunchRequest::Discard`] (or the connection closing) destroys it.
    Warm {
        /// The provider.
        provider: String,
        /// Where and as whom.
        plan: MemberPlan,
    },
    /// Destroys the member this connection holds, unclaimed.
    Discard,
    /// Opens a session's sandbox: answered with [`LaunchAnswer::Opened`]. The connection is
    /// the session from then on: [`LaunchRequest::Call`], [`LaunchRequest::WallNow`],
    /// [`LaunchRequest::Alive`], and [`LaunchRequest::Close`] (or the connection closing,
    /// which ends its processes).
    OpenSession {
        /// The provider.
        provider: String,
        /// The plan.
        plan: Plan,
        /// Its longest life, milliseconds, even if the caller dies.
        lifetime_ms: u64,
    },
    /// One call in the session this connection holds; each output chunk comes first as a
    /// [`LaunchEvent::Chunk`].
    Call {
        /// The call.
        call: crate::SessionCall,
        /// Answered within this, milliseconds.
        within_ms: u64,
    },
    /// The session's wall now.
    WallNow,
    /// Whether the session's sandbox is still there.
    Alive,
    /// Ends the session's processes and removes everything of it.
    Close,
    /// The grants file as the launcher loaded it (with `reload`, read again first, as on
    /// SIGHUP), that load sent to the broker process: answered with
    /// [`LaunchAnswer::Grants`]. Refused when the launcher has no grants file.
    Grants {
        /// Read the file (and the variables it names) again first.
        reload: bool,
    },
    /// Sends one of the launcher's recent loads of the grants file to the broker process
    /// again (which lost it when it was started again).
    LoadGrants {
        /// Which load.
        generation: u64,
    },
    /// A copy of the broker process's control socket, passed beside a `Done` answer.
    BrokerControl,
    /// Cancels the cell a session is running, from a connection of its own.
    CancelCell {
        /// What [`LaunchAnswer::Opened`] named the session's canceller.
        token: String,
    },
}

/// Where and as whom one warm member is made.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberPlan {
    /// A fresh id, unique on this host.
    pub member_id: String,
    /// The interpreter that waits.
    pub language: crate::Language,
    /// The memory limit, bytes.
    pub memory_bytes: u64,
    /// The processes-and-threads limit.
    pub pids: u64,
    /// The writable disk, bytes.
    pub disk_bytes: u64,
    /// The uid its code will run as.
    pub uid: u32,
    /// The gid.
    pub gid: u32,
    /// Where the provider keeps its files.
    pub run_dir: PathBuf,
    /// The longest timeout a run may ask for, milliseconds.
    pub max_timeout_ms: u64,
    /// The image it runs in.
    pub image: Option<PlanImage>,
}

/// A run's plan as it crosses the socket: every field of the provider's launch plan that is
/// data. The broker channel and the output tap are only flags here: the launcher makes their
/// ends and sends them back as [`LaunchEvent`]s.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// A fresh id for the sandbox.
    pub run_id: String,
    /// The caller's request id, for logs only.
    pub request_id: String,
    /// What to run.
    pub spec: RunSpec,
    /// Its limits, every one decided.
    pub limits: PlanLimits,
    /// The uid its code runs as.
    pub uid: u32,
    /// Its gid.
    pub gid: u32,
    /// A trial's controller's uid.
    pub controller_uid: u32,
    /// The controller's gid.
    pub controller_gid: u32,
    /// Where the provider keeps the run's files.
    pub run_dir: PathBuf,
    /// The run has a broker channel; `egress` when its grant is an egress grant.
    pub broker: Option<PlanBroker>,
    /// What the sandbox's first process holds.
    pub privileges: PlanPrivileges,
    /// Output is sent back as it is read ([`LaunchEvent::Output`]).
    pub tap: bool,
    /// The image to run in.
    pub image: Option<PlanImage>,
}

/// A plan's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanLimits {
    /// Wall-clock budget, milliseconds.
    pub timeout_ms: u64,
    /// Memory, bytes.
    pub memory_bytes: u64,
    /// Bytes kept per output stream per step.
    pub output_bytes: u64,
    /// Processes and threads at once.
    pub pids: u64,
    /// Writable disk, bytes.
    pub disk_bytes: u64,
    /// Bytes kept per artifact.
    pub artifact_bytes: u64,
}

/// A plan's broker channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanBroker {
    /// The grant is an egress grant: the sandbox gets the proxy endpoint too.
    pub egress: bool,
}

/// What a plan's first process holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanPrivileges {
    /// No capability at all.
    Unprivileged,
    /// The trial runner's.
    TrialRunner,
    /// A session's agent at runsc.
    DropsToRunUid,
}

/// An image as a plan names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanImage {
    /// Its name.
    pub name: String,
    /// `sha256:` over its manifest.
    pub identity: String,
    /// Its root file system.
    pub rootfs: PathBuf,
    /// Its VM disk.
    pub disk: Option<PathBuf>,
    /// The request named it.
    pub named: bool,
}

/// What the launcher sends before a run's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum LaunchEvent {
    /// Output as it was read.
    Output {
        /// Which stream.
        stream: OutputStream,
        /// Its offset in the stream.
        offset: u64,
        /// The bytes.
        bytes: Bytes,
    },
    /// A stream connected to the sandbox, passed beside this frame: serve it as the run's
    /// broker channel.
    BrokerStream,
    /// A listener only the sandbox reaches, passed beside this frame: accept on it.
    BrokerListener,
    /// One output chunk of a session's call.
    Chunk(crate::OutputChunk),
    /// The answer; nothing follows but what [`LaunchRequest::TearDown`] asks for.
    Answer(Box<LaunchAnswer>),
}

/// The launcher's answer to one request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum LaunchAnswer {
    /// Each hosted provider, in the settings' order.
    Described(Vec<DescribedProvider>),
    /// Yes, or why not (said as text).
    Done(Result<(), String>),
    /// A memory floor.
    Floor(Option<u64>),
    /// Each hosted provider's answers to a [`LaunchRequest::Admit`], in the settings' order.
    Admitted(Vec<Admitted>),
    /// A probe's outcome.
    Probed(ProbedWire),
    /// A run's outcome.
    Ran(Result<Ran, LaunchFailure>),
    /// A warm member made (its uid), or why not.
    Warmed(Result<u32, LaunchFailure>),
    /// A session opened, or why not.
    Opened(Result<OpenedSession, LaunchFailure>),
    /// A session's call answered, or why not.
    Called(Result<crate::SessionAnswer, LaunchFailure>),
    /// A session's wall now, or why it cannot be read or no longer passes.
    Walled(Result<crate::Wall, LaunchFailure>),
    /// A load of the grants file: its text (the secrets it names stay with the launcher and
    /// the broker process), and the generation the broker process knows it by.
    Grants {
        /// The launcher's number for this load.
        generation: u64,
        /// The file's text.
        text: String,
    },
    /// The launcher did nothing: the peer, the request or the plan is not one it takes.
    Refused(String),
}

/// A session's sandbox, opened.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenedSession {
    /// The uid its code runs as.
    pub uid: u32,
    /// Its wall when it opened, judged.
    pub wall: crate::Wall,
    /// What names its canceller in a [`LaunchRequest::CancelCell`]; `None` where it has none.
    pub cancel_token: Option<String>,
}

/// One hosted provider's answers for one run ([`LaunchRequest::Admit`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Admitted {
    /// The provider.
    pub provider: String,
    /// Whether it can do this kind of run at all, or why not.
    pub supports: Result<(), String>,
    /// Whether it can run in the image (yes when none was asked about), or why not.
    pub takes_image: Result<(), String>,
    /// The least memory a run of the spec starts under there.
    pub memory_floor: Option<u64>,
    /// Whether the environment of the evidence named for it still holds, or why not; `None`
    /// when none was named or the launcher does not know that evidence (then ask
    /// [`LaunchRequest::EnvironmentHolds`]).
    pub holds: Option<Result<(), String>>,
}

/// A hosted provider's fixed facts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DescribedProvider {
    /// Its name.
    pub name: String,
    /// The tier it is built to give.
    pub nominal_tier: Tier,
    /// Its start-up cost.
    pub cost: u32,
    /// Whether a run there runs in an image.
    pub uses_image: bool,
    /// Whether it carries a broker channel.
    pub supports_broker: bool,
    /// Whether it gives the egress proxy endpoint.
    pub supports_egress: bool,
    /// Whether it makes warm members.
    pub warms: bool,
    /// Whether it keeps sessions.
    pub opens_sessions: bool,
}

/// A probe's outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbedWire {
    /// The tier the evidence supports.
    pub tier: Tier,
    /// What was checked.
    pub evidence: Evidence,
    /// `Err` with the failed checks (each name and why), or why it could not probe.
    pub available: Result<(), WithdrawnWire>,
}

/// Why a provider is not offered.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum WithdrawnWire {
    /// These checks failed.
    Checks {
        /// The provider.
        provider: String,
        /// Each failed check and what it saw.
        failed: Vec<(String, String)>,
    },
    /// The probe could not run.
    NotProbed(String),
}

/// A run that happened.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ran {
    /// The result.
    pub result: RunResult,
    /// When the sandbox was started, Unix milliseconds.
    pub started_unix_ms: u64,
    /// When the result was complete, Unix milliseconds.
    pub ended_unix_ms: u64,
    /// The sandbox's removal waits for [`LaunchRequest::TearDown`] on this connection.
    pub teardown: bool,
}

/// A launch that gave no result.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchFailure {
    /// The refusal reason when nothing ran; `None` when the code may have run.
    pub not_started: Option<Reason>,
    /// What failed, with its sources.
    pub error: String,
    /// The cleanup that failed after it.
    pub cleanup: Option<String>,
}
