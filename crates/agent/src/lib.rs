//! plimsoll-agent: the program inside a sandbox that runs one job. It reads an
//! [`AgentJob`](plimsoll_wire::AgentJob) as JSON on stdin, writes a project's files under the
//! work directory and runs its steps (or runs a snippet), and answers one
//! [`RunResult`](plimsoll_wire::RunResult) as JSON on stdout. In a session
//! ([`start_session`]) it serves many calls instead: cells in one interpreter that keeps its
//! state, and project jobs, in the same work directory. docs/agent.md is the contract.
//!
//! The agent runs beside the untrusted code, as the same uid (a trial job starts it as root
//! with two capabilities, which it keeps for the trial runner alone: see `privilege`). The
//! host trusts it only to report what happened inside; code that interferes with it can only
//! make it lie about that code's own output.

pub mod egress;
mod fsops;
mod job;
mod oom;
mod privilege;
mod run;
mod session;
mod supervise;
mod wall;

pub use job::{MAX_JOB_BYTES, ReadJobError, read_job};
pub use privilege::{DropToError, RestoreUidError, TakePrivilegesError, drop_to};
pub use run::{RunJobError, Waiting, run_job, start_waiting};
pub use session::{
    MAX_CALL_BYTES, ServeSessionError, Session, StartInterpreterError, StartSessionError,
    start_session,
};
pub use wall::{ReadOwnWallError, own_wall};

/// An error and its sources on one line (`a: b: c`), with line breaks replaced, for the one
/// line the agent prints on stderr when it cannot do a job.
pub fn one_line(err: &dyn std::error::Error) -> String {
    plimsoll_sandbox::error_chain(err).replace(['\n', '\r'], " ")
}
