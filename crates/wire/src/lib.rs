//! The wire contract of plimsoll: every type that crosses a process boundary, the refusal
//! marks, and the digest encoding of requests, results and records.
//!
//! This crate does no I/O. It is the one place that derives `Serialize`/`Deserialize` for
//! types that travel between the daemon, its clients and the programs run inside sandboxes.

mod agent;
mod bytes;
pub mod digest;
mod error;
mod image;
pub mod launch;
mod nulls;
mod provider;
mod request;
mod result;
mod session;
mod shape;
pub mod simulators;
mod snapshot;
mod tier;
pub mod trial;
pub mod trial_step;

pub use agent::{
    AgentJob, SESSION_READY_LINE, SessionAnswer, SessionCall, SessionCell, SessionJob, SessionLine,
};
pub use bytes::Bytes;
pub use error::{
    ErrorBody, ErrorResponse, NotDispatched, Reason, RequestRejection, not_dispatched_reason,
};
pub use image::{
    IMAGE_NAME_MAX, ImageInfo, ImageRef, is_image_identity, is_image_name, validate_image_selector,
};
pub use provider::{
    BinaryIdentity, Evidence, NamespaceSeen, ProbeReport, ProviderInfo, ProvidersResponse,
};
pub use request::{
    Language, Limits, Project, ProjectFile, RunRequest, RunSpec, Snippet, Step, parse_request,
    parse_session_call, scan_request_id, validate_request_id,
};
pub use result::{
    Artifact, CredentialKind, EgressReceipt, GrantCall, MalformedResult, RunRecord, RunResponse,
    RunResult, SessionLink, Start, StepResult, Wall, WallNamespace,
};
pub use session::{
    EndReason, OutputChunk, OutputStream, SessionInfo, SessionList, SessionOpenRequest,
    StreamChunk, StreamLine, parse_session_open, session_instance, validate_session_id,
};
pub use snapshot::{
    ForkAnswer, ForkRequest, SessionOrigin, SessionStart, SnapshotInfo, SnapshotList,
    SnapshotOpenRequest, SnapshotRequest, parse_small_body, validate_snapshot_id,
};
pub use tier::{ParseTierError, Tier};
pub use trial::{
    BadVerdict, MalformedTrials, Score, SimulatorRef, TrialEnd, TrialOutcome, TrialStepRecord,
};
pub use trial_step::TrialIds;

/// The protocol number this crate speaks. A request carrying another number is refused with
/// [`Reason::Protocol`] before anything runs.
pub const PROTOCOL: u32 = 1;
