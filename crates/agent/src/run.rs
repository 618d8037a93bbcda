//! Running one job: check every path, open the work directory, then run a snippet, or write
//! a project's files, run its steps in order and collect its artifacts; answer one
//! [`RunResult`].

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use plimsoll_wire::trial_step::{
    BadTrialStep, TRIAL_RUNNER, TRIAL_RUNNER_PATH, scenario_paths, trial_step,
};
use plimsoll_wire::{
    AgentJob, Bytes, Language, Project, RunResult, RunSpec, Snippet, StepResult, TrialIds,
};

use crate::fsops::{
    BadPath, OpenWorkDirError, SnippetFile, WorkDir, WriteFileError, WriteSnippetError, segments,
};
use crate::privilege::{
    CONTROLLER_WRITABLE, ClearControllerFilesError, Privileges, RestoreUidError,
    TakePrivilegesError, as_run_uid, as_runner, clear_controller, take,
};
use crate::supervise::{
    Outcome, RunChildError, StartSupervisorError, Started, Supervisor, Tap, command,
};

/// Where the snippet's source file goes: the sandbox's per-run tmpfs (and `HOME`).
const SNIPPET_BASE: &str = "/tmp";

/// The job could not be done. The agent prints this on one line on stderr and exits 2; the
/// host reports an error (code may have run when the failure came after a step started).
#[derive(Debug, thiserror::Error)]
pub enum RunJobError {
    /// A file or artifact path is not a plain relative path; nothing was written.
    #[error("{what}[{index}] is refused")]
    Path {
        /// `run.files` or `run.artifacts`.
        what: &'static str,
        /// Its index in the job.
        index: usize,
        /// Why.
        #[source]
        source: BadPath,
    },
    /// The agent may not run this job with the privileges it was started with.
    #[error(transparent)]
    Privileges(#[from] TakePrivilegesError),
    /// A trial step is malformed; nothing was written.
    #[error("step #{index} ({TRIAL_RUNNER}) is refused")]
    TrialStep {
        /// Its index in the job.
        index: usize,
        /// Why.
        #[source]
        source: BadTrialStep,
    },
    /// A trial step in a job without trial ids; nothing was written.
    #[error(
        "step #{index} runs {TRIAL_RUNNER}, but the job has no trial ids: the host must send \
         them and start the agent for a trial job (docs/trials.md)"
    )]
    TrialWithoutIds {
        /// Its index in the job.
        index: usize,
    },
    /// The work directory cannot be used.
    #[error(transparent)]
    WorkDir(#[from] OpenWorkDirError),
    /// The agent cannot watch children.
    #[error(transparent)]
    Supervisor(#[from] StartSupervisorError),
    /// A project file could not be written; no step ran.
    #[error(transparent)]
    WriteFile(#[from] WriteFileError),
    /// The snippet's file could not be written; nothing ran.
    #[error(transparent)]
    WriteSnippet(#[from] WriteSnippetError),
    /// A step could not be started or watched; the steps before it ran.
    #[error("cannot run step #{index}")]
    Step {
        /// Its index in the job.
        index: usize,
        /// Why.
        #[source]
        source: RunChildError,
    },
    /// The snippet's interpreter could not be started or watched.
    #[error("cannot run the snippet")]
    Snippet(#[source] RunChildError),
    /// The agent could not become the run's uid again; it stopped before reading artifacts.
    #[error(transparent)]
    RestoreUid(#[from] RestoreUidError),
    /// What a trial's controller left could not be removed; no later step ran.
    #[error(transparent)]
    ClearController(#[from] ClearControllerFilesError),
    /// A warm member's interpreter did not come to wait for its code, or could not be handed
    /// it; nothing of a job ran.
    #[error("the warm member's interpreter {0}")]
    NotWaiting(String),
    /// A job a warm member does not take; nothing of it ran.
    #[error(
        "a warm member runs one {member} snippet in its own work directory (where the agent \
         started), with no trial ids; this job is {job}: run it cold"
    )]
    NotForMember {
        /// The member's language.
        member: &'static str,
        /// What the job is.
        job: String,
    },
}

/// Runs `job`, whose deadline counts from `started` (the agent's start). Blocks SIGCHLD in
/// the calling thread: meant for the agent binary, a single-threaded process. Every process
/// the job started has been killed when this returns.
///
/// Refuses to run as root unless the job is a trial job; for a trial job, first checks that
/// the agent started as uid 0 with exactly CAP_SETUID and CAP_SETGID and becomes the run's
/// uid (docs/agent.md, "Trial jobs").
pub fn run_job(job: &AgentJob, started: Instant) -> Result<RunResult, RunJobError> {
    let privileges = take(job)?;
    mark_inherited_descriptors_cloexec();
    // A deadline too far to represent is as good as none (the host kills the sandbox anyway).
    let deadline = started
        .checked_add(Duration::from_millis(job.deadline_ms))
        .or_else(|| started.checked_add(Duration::from_secs(100 * 365 * 86_400)))
        .unwrap_or(started);
    match &job.spec {
        RunSpec::Snippet(snippet) => run_snippet(job, snippet, deadline),
        RunSpec::Project(project) => {
            let mut sup = Supervisor::new(deadline)?;
            run_project(&mut sup, job, project, privileges, None)
        }
    }
}

/// How one step runs.
enum StepKind {
    /// `/bin/sh -c RUN`.
    Shell,
    /// The trial runner, with these words after its name, in a trial job.
    Trial(Vec<String>, TrialIds),
}

/// Runs a project under `sup` (whose deadline is the job's): every path and step checked,
/// files written, steps run in order, the clean-up ([`Supervisor::end_job`]: everything the
/// job started, or in a session everything but its interpreter), artifacts read. `tap` sees
/// each step's output as it comes.
pub(crate) fn run_project(
    sup: &mut Supervisor,
    job: &AgentJob,
    project: &Project,
    privileges: Privileges,
    mut tap: Tap<'_>,
) -> Result<RunResult, RunJobError> {
    // Every step is read before anything is written: the host refuses a malformed trial
    // step already, but the agent does not rely on it.
    let mut kinds = Vec::with_capacity(project.steps.len());
    for (index, step) in project.steps.iter().enumerate() {
        kinds.push(match (trial_step(step), privileges) {
            (None, _) => StepKind::Shell,
            (Some(Err(source)), _) => return Err(RunJobError::TrialStep { index, source }),
            (Some(Ok(_)), Privileges::Plain) => {
                return Err(RunJobError::TrialWithoutIds { index });
            }
            (Some(Ok(args)), Privileges::Trial(ids)) => StepKind::Trial(args, ids),
        });
    }
    // Every path is checked before anything is written.
    let paths = project
        .files
        .iter()
        .map(|f| ("run.files", &f.path))
        .chain(project.artifacts.iter().map(|a| ("run.artifacts", a)));
    let mut counts = [0usize; 2];
    for (what, path) in paths {
        let slot = usize::from(what == "run.artifacts");
        let index = counts[slot];
        counts[slot] += 1;
        segments(path).map_err(|source| RunJobError::Path {
            what,
            index,
            source,
        })?;
    }
    // A trial's scenarios are readable by the run's uid only, so a controller of an earlier
    // trial step of the run cannot read a later step's scenario.
    let scenarios: Vec<String> = kinds
        .iter()
        .filter_map(|k| match k {
            StepKind::Trial(args, _) => Some(scenario_paths(args)),
            StepKind::Shell => None,
        })
        .flatten()
        .collect();
    let work = WorkDir::open(&job.work_dir)?;
    for f in &project.files {
        let private = scenarios.contains(&f.path);
        work.write_file(&f.path, f.content.as_slice(), f.executable, private)?;
    }
    if let Privileges::Trial(ids) = privileges {
        sup.end_controller_too(ids);
    }
    let mut steps = Vec::with_capacity(project.steps.len());
    let mut stopped_by_deadline = false;
    for (index, (step, kind)) in project.steps.iter().zip(kinds).enumerate() {
        if sup.past_deadline() {
            stopped_by_deadline = true;
            break;
        }
        let trial = match &kind {
            StepKind::Trial(_, ids) => Some(*ids),
            StepKind::Shell => None,
        };
        let cmd = step_command(&step.run, kind, privileges, &job.work_dir);
        let outcome = sup
            .run(cmd, job.output_bytes, tap.as_mut().map(|t| &mut **t as _))
            .map_err(|source| RunJobError::Step { index, source })?;
        let ok = outcome.succeeded();
        steps.push(step_result(step.name.clone(), outcome));
        // Nothing of the controller may meet a later step: its processes and its files in
        // the directories it could write (HOME=/tmp for both uids) go now.
        if let Some(ids) = trial {
            clear_controller(&ids, &CONTROLLER_WRITABLE)?;
        }
        if !ok {
            break;
        }
    }
    sup.end_job();
    if let Some(e) = sup.take_restore_error() {
        return Err(e.into());
    }
    let artifacts = project
        .artifacts
        .iter()
        .map(|a| work.read_artifact(a, job.artifact_bytes))
        .collect();
    let mut result = steps.last().map(mirror).unwrap_or_default();
    // The deadline stopped the run between steps: not every step ran.
    if stopped_by_deadline {
        result.timed_out = true;
    }
    result.steps = steps;
    result.artifacts = artifacts;
    Ok(result)
}

/// The command for one step: the shell, or for a trial step the runner (never through a
/// shell) with the run's ids first. In a trial job an ordinary step runs as the run's uid
/// with no capability, the runner as uid 0 with the two the agent kept.
fn step_command(run: &str, kind: StepKind, privileges: Privileges, work_dir: &str) -> Command {
    let mut cmd = match kind {
        StepKind::Shell => {
            let mut cmd = command("/bin/sh");
            cmd.arg("-c").arg(run);
            if let Privileges::Trial(ids) = privileges {
                as_run_uid(&mut cmd, ids);
            }
            cmd
        }
        StepKind::Trial(args, ids) => {
            let mut cmd = command(TRIAL_RUNNER_PATH);
            cmd.args(ids.runner_options()).args(args);
            as_runner(&mut cmd);
            cmd
        }
    };
    cmd.current_dir(work_dir);
    cmd
}

fn run_snippet(
    job: &AgentJob,
    snippet: &Snippet,
    deadline: Instant,
) -> Result<RunResult, RunJobError> {
    let _work = WorkDir::open(&job.work_dir)?;
    let mut sup = Supervisor::new(deadline)?;
    if sup.past_deadline() {
        return Ok(RunResult {
            timed_out: true,
            start: None,
            member_age_ms: None,
            ..RunResult::default()
        });
    }
    let (program, args, file_name) = interpreter(snippet.language);
    let file = SnippetFile::write(Path::new(SNIPPET_BASE), file_name, snippet.code.as_bytes())?;
    let mut cmd = command(program);
    cmd.args(args).arg(file.path()).current_dir(&job.work_dir);
    let outcome = sup.run(cmd, job.output_bytes, None);
    sup.end_all();
    file.remove();
    let outcome = outcome.map_err(RunJobError::Snippet)?;
    Ok(mirror(&step_result(None, outcome)))
}

/// A warm member's interpreter (`plimsoll-agent --warm LANGUAGE`): started before any job
/// is known, as the snippet's interpreter of a cold run would be (the same uid, cgroup,
/// directory and environment), and blocked reading its standard input. [`Waiting::run`]
/// gives it its one job; dropping it without one is the host's business (the sandbox is
/// destroyed with it).
#[derive(Debug)]
pub struct Waiting {
    sup: Supervisor,
    child: Started,
    language: Language,
    /// The directory its code goes in (made before it started; its file's path is the one
    /// its wait program was given).
    dir: std::path::PathBuf,
    /// Its work directory: the agent's own, where the interpreter started.
    work_dir: std::path::PathBuf,
}

/// Starts `language`'s interpreter waiting for its code ([`plimsoll_sandbox::warm`]'s wait
/// program, which says [`plimsoll_sandbox::warm::READY_LINE`] just before it blocks) and
/// returns once it has said so. Its work directory is the agent's current one (a VM's
/// `/work`). Refuses to start as root.
pub fn start_waiting(language: Language) -> Result<Waiting, RunJobError> {
    use plimsoll_sandbox::warm::{READY_LINE, wait_command};
    crate::privilege::not_root()?;
    mark_inherited_descriptors_cloexec();
    // No deadline until the job comes; the host bounds the wait (and the member's age).
    let far = Instant::now() + Duration::from_secs(100 * 365 * 86_400);
    let work_dir = std::env::current_dir().map_err(|e| {
        RunJobError::NotWaiting(format!("has no work directory (the agent's: {e})"))
    })?;
    let mut sup = Supervisor::new(far)?;
    let (program, _, file_name) = interpreter(language);
    let dir = SnippetFile::make_dir(Path::new(SNIPPET_BASE))?;
    let path = dir.join(file_name);
    let mut cmd = command(program);
    let wait = wait_command(language, &path, false, true);
    for (name, text) in &wait.files {
        if let Err(e) = std::fs::write(dir.join(name), text) {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(RunJobError::NotWaiting(format!(
                "cannot write its wait program: {e}"
            )));
        }
    }
    cmd.args(&wait.args).current_dir(&work_dir);
    let child = match sup.start(cmd) {
        Ok(c) => c,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(RunJobError::Snippet(e));
        }
    };
    let said = child
        .out
        .as_ref()
        .ok_or_else(|| "has no stdout pipe".to_owned())
        .and_then(|out| {
            let mut line = vec![0u8; READY_LINE.len()];
            read_exact(out, &mut line).map_err(|e| format!("ended before it waited ({e})"))?;
            if line == READY_LINE {
                Ok(())
            } else {
                Err(format!(
                    "said {:?}, not that it waits",
                    String::from_utf8_lossy(&line)
                ))
            }
        });
    if let Err(why) = said {
        drop(child);
        sup.end_all();
        let _ = std::fs::remove_dir_all(&dir);
        return Err(RunJobError::NotWaiting(why));
    }
    Ok(Waiting {
        sup,
        child,
        language,
        dir,
        work_dir,
    })
}

/// Fills `buf` from `fd` (blocking).
fn read_exact(fd: &std::os::fd::OwnedFd, buf: &mut [u8]) -> std::io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match rustix::io::read(fd, &mut buf[got..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

impl Waiting {
    /// Runs `job`, which must be a snippet of the member's language with the warm work
    /// directory and no trial ids: its code is written where the interpreter will look,
    /// the interpreter is told to go, and it is followed to its end as a cold snippet's is.
    /// The job's deadline counts from now. Every process the job started has been killed
    /// when this returns.
    pub fn run(self, job: &AgentJob) -> Result<RunResult, RunJobError> {
        let Waiting {
            mut sup,
            mut child,
            language,
            dir,
            work_dir,
        } = self;
        let ran = (|| {
            let member = match language {
                Language::Javascript => "javascript",
                Language::Python => "python",
            };
            let not_for = |job: String| RunJobError::NotForMember { member, job };
            let snippet = match &job.spec {
                RunSpec::Snippet(s) if s.language == language => s,
                RunSpec::Snippet(s) => return Err(not_for(format!("a {:?} snippet", s.language))),
                RunSpec::Project(_) => return Err(not_for("a project".into())),
            };
            if job.trial.is_some() {
                return Err(not_for("a trial job".into()));
            }
            if Path::new(&job.work_dir) != work_dir {
                return Err(not_for(format!("in {}", job.work_dir)));
            }
            let _work = WorkDir::open(&job.work_dir)?;
            let now = Instant::now();
            sup.set_deadline(
                now.checked_add(Duration::from_millis(job.deadline_ms))
                    .unwrap_or(now + Duration::from_secs(100 * 365 * 86_400)),
            );
            if sup.past_deadline() {
                return Ok(RunResult {
                    timed_out: true,
                    ..RunResult::default()
                });
            }
            let (_, _, file_name) = interpreter(language);
            let file = SnippetFile::write_in(dir.clone(), file_name, snippet.code.as_bytes())?;
            child.at = Instant::now();
            let sent = child
                .stdin
                .take()
                .ok_or_else(|| std::io::Error::other("no stdin pipe"))
                .and_then(|mut stdin| {
                    std::io::Write::write_all(&mut stdin, plimsoll_sandbox::warm::GO)
                });
            if let Err(e) = sent {
                file.remove();
                return Err(RunJobError::NotWaiting(format!(
                    "could not be handed its code: {e}"
                )));
            }
            let outcome = sup.finish(child, job.output_bytes, None);
            sup.end_all();
            file.remove();
            Ok(mirror(&step_result(
                None,
                outcome.map_err(RunJobError::Snippet)?,
            )))
        })();
        sup.end_all();
        // The wait program's file, and a job refused before its file was written.
        let _ = std::fs::remove_dir_all(&dir);
        ran
    }
}

/// The interpreter for a language: Debian's path first, else a search of `PATH` (by exec,
/// so the agent itself reads no variable), its arguments, and the source file's name.
pub(crate) fn interpreter(
    language: Language,
) -> (&'static str, &'static [&'static str], &'static str) {
    let pick = |fixed: &'static str, bare: &'static str| {
        if Path::new(fixed).exists() {
            fixed
        } else {
            bare
        }
    };
    match language {
        Language::Javascript => (pick("/usr/bin/node", "node"), &[], "main.js"),
        Language::Python => (pick("/usr/bin/python3", "python3"), &["-I"], "main.py"),
    }
}

fn step_result(name: Option<String>, o: Outcome) -> StepResult {
    StepResult {
        name,
        exit_code: o.exit_code,
        signal: o.signal,
        timed_out: o.timed_out,
        oom_killed: o.oom_killed,
        stdout: Bytes(o.stdout),
        stdout_truncated: o.stdout_truncated,
        stderr: Bytes(o.stderr),
        stderr_truncated: o.stderr_truncated,
        duration_ms: o.duration_ms,
    }
}

/// The top-level fields of a result, from the last step that ran.
fn mirror(step: &StepResult) -> RunResult {
    RunResult {
        exit_code: step.exit_code,
        signal: step.signal,
        timed_out: step.timed_out,
        oom_killed: step.oom_killed,
        stdout: step.stdout.clone(),
        stdout_truncated: step.stdout_truncated,
        stderr: step.stderr.clone(),
        stderr_truncated: step.stderr_truncated,
        steps: Vec::new(),
        artifacts: Vec::new(),
        calls: Vec::new(),
        start: None,
        member_age_ms: None,
        wall: None,
        state_kept: None,
        interpreter_end: None,
        egress: Vec::new(),
    }
}

/// Marks every descriptor above 2 close-on-exec, so nothing the agent inherited reaches a
/// step (the agent's own descriptors are opened close-on-exec, and each child gets fresh
/// pipes as 0, 1 and 2). close_range where the kernel has it, else one by one from
/// /proc/self/fd; without either, inherited descriptors stay as they are.
pub(crate) fn mark_inherited_descriptors_cloexec() {
    if plimsoll_sandbox::fds::close_range_cloexec().is_err() {
        let _ = plimsoll_sandbox::fds::mark_cloexec_from_proc();
    }
}
