//! Property-based fuzzing of the agent's job parsing (`read_job`): arbitrary and mutated
//! bytes never panic, and a refusal is always one of the typed errors with a message; a
//! generated job written as JSON reads back equal, and reads back equal again after a second
//! trip; whatever `read_job` accepts serialises and reads back to the same job.
//!
//! Cases per property are bounded (`PROPTEST_CASES` raises them; DEVELOPERS.md). Failures are
//! kept in `tests/fuzz.proptest-regressions` and replayed first: commit that file.

use plimsoll_agent::{ReadJobError, read_job};
use plimsoll_wire::{
    AgentJob, Bytes, Language, Project, ProjectFile, RunSpec, Snippet, Step, TrialIds,
};
use proptest::prelude::*;

#[path = "../../../tests/fuzz/common.rs"]
mod common;
use common::{config, mutated};

const VALID: &str = r#"{"spec":{"kind":"project","files":[{"path":"s.json","content":{"base64":"e30="},"executable":false}],"steps":[{"run":"ls"},{"name":"t","run":"plimsoll-trial-runner --scenario s.json -- node c.js"}],"artifacts":["trajectory.bin"]},"work_dir":"/work","output_bytes":65536,"artifact_bytes":1048576,"deadline_ms":30000,"trial":{"uid":1000,"gid":1000,"controller_uid":2000,"controller_gid":2000}}"#;

fn text() -> impl Strategy<Value = String> {
    prop_oneof![3 => "[ -~]{0,16}", 1 => any::<String>()]
}

fn job() -> impl Strategy<Value = AgentJob> {
    let language = prop_oneof![Just(Language::Javascript), Just(Language::Python)];
    let snippet = (language, text())
        .prop_map(|(language, code)| RunSpec::Snippet(Snippet { language, code }));
    let file = (
        text(),
        proptest::collection::vec(any::<u8>(), 0..16),
        any::<bool>(),
    )
        .prop_map(|(path, content, executable)| ProjectFile {
            path,
            content: Bytes(content),
            executable,
        });
    let step = (proptest::option::of(text()), text()).prop_map(|(name, run)| Step { name, run });
    let project = (
        proptest::collection::vec(file, 0..3),
        proptest::collection::vec(step, 0..3),
        proptest::collection::vec(text(), 0..3),
    )
        .prop_map(|(files, steps, artifacts)| {
            RunSpec::Project(Project {
                files,
                steps,
                artifacts,
            })
        });
    (
        prop_oneof![snippet, project],
        text(),
        any::<[u64; 3]>(),
        proptest::option::of(any::<[u32; 4]>()),
    )
        .prop_map(|(spec, work_dir, n, trial)| AgentJob {
            spec,
            work_dir,
            output_bytes: n[0],
            artifact_bytes: n[1],
            deadline_ms: n[2],
            trial: trial.map(|t| TrialIds {
                uid: t[0],
                gid: t[1],
                controller_uid: t[2],
                controller_gid: t[3],
            }),
        })
}

fn check(body: &[u8]) -> Result<(), TestCaseError> {
    match read_job(body) {
        Ok(job) => {
            let again = serde_json::to_vec(&job).unwrap();
            let back = read_job(&again[..])
                .map_err(|e| TestCaseError::fail(format!("round trip refused: {e}")))?;
            prop_assert_eq!(back, job);
        }
        Err(e) => {
            prop_assert!(
                matches!(e, ReadJobError::Empty | ReadJobError::Json(_)),
                "{e:?}"
            );
            prop_assert!(!plimsoll_agent::one_line(&e).is_empty());
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn read_job_survives_arbitrary_bytes(body in proptest::collection::vec(any::<u8>(), 0..256)) {
        check(&body)?;
    }

    #[test]
    fn read_job_survives_mutated_jobs(body in mutated(VALID)) {
        check(&body)?;
    }

    #[test]
    fn a_generated_job_reads_back_equal(job in job(), pad in "[ \t\n]{0,3}") {
        let mut body = pad.clone().into_bytes();
        body.extend(serde_json::to_vec(&job).unwrap());
        body.extend(pad.as_bytes());
        let back = read_job(&body[..]).map_err(|e| TestCaseError::fail(format!("{e}")))?;
        prop_assert_eq!(&back, &job);
        check(&body)?;
    }
}
