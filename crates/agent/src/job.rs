//! Reading the job: one JSON document on stdin, up to end of file, at most [`MAX_JOB_BYTES`].

use std::io::{self, Read};

use plimsoll_wire::AgentJob;

/// The largest job the agent accepts (256 MiB): above the largest request the daemon admits.
pub const MAX_JOB_BYTES: u64 = 256 * 1024 * 1024;

/// The job could not be read; nothing was written and nothing ran.
#[derive(Debug, thiserror::Error)]
pub enum ReadJobError {
    /// Reading stdin failed.
    #[error("cannot read the job from stdin")]
    Read(#[source] io::Error),
    /// More than [`MAX_JOB_BYTES`] arrived.
    #[error(
        "the job is larger than the agent's limit of {MAX_JOB_BYTES} bytes: send fewer or smaller files"
    )]
    TooLarge,
    /// Stdin ended before any byte arrived.
    #[error("stdin was empty: send one AgentJob as JSON")]
    Empty,
    /// The bytes are not an `AgentJob` in JSON.
    #[error("the job is not a valid AgentJob in JSON")]
    Json(#[source] serde_json::Error),
}

/// Reads one job from `input` until end of file and parses it.
pub fn read_job(input: impl Read) -> Result<AgentJob, ReadJobError> {
    let mut buf = Vec::new();
    input
        .take(MAX_JOB_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(ReadJobError::Read)?;
    if buf.len() as u64 > MAX_JOB_BYTES {
        return Err(ReadJobError::TooLarge);
    }
    if buf.iter().all(u8::is_ascii_whitespace) {
        return Err(ReadJobError::Empty);
    }
    serde_json::from_slice(&buf).map_err(ReadJobError::Json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_job_and_refuses_garbage() {
        let ok = br#"{"spec":{"kind":"snippet","language":"python","code":"print(1)"},
            "work_dir":"/work","output_bytes":10,"artifact_bytes":10,"deadline_ms":1000}"#;
        let job = read_job(&ok[..]).unwrap();
        assert_eq!(job.work_dir, "/work");
        assert!(matches!(read_job(&b"  \n"[..]), Err(ReadJobError::Empty)));
        let e = read_job(&b"{nope"[..]).unwrap_err();
        assert!(matches!(e, ReadJobError::Json(_)), "{e:?}");
        assert!(crate::one_line(&e).contains("not a valid AgentJob"));
        let unknown = String::from_utf8(ok.to_vec())
            .unwrap()
            .replace("\"work_dir\"", "\"x\":1,\"work_dir\"");
        assert!(matches!(
            read_job(unknown.as_bytes()),
            Err(ReadJobError::Json(_))
        ));
    }
}
