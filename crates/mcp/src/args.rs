//! The tools' arguments as a model sees them: JSON Schemas (from these types and their doc
//! comments) whose descriptions say what a tier is, what a floor does, when a retry is safe
//! and what a session keeps; and their translation into run options and session calls.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use plimsoll_client::{RunOptions, SessionOptions};
use plimsoll_wire::{
    Bytes, Language, Project, ProjectFile, RunSpec, Step, Tier, validate_session_id,
    validate_snapshot_id,
};

use crate::backend::SessionCall;
use schemars::JsonSchema;
use serde::Deserialize;

/// An isolation tier, weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TierArg {
    /// A hardened child process on the host: no wall at the OS level; never for hostile code.
    Process,
    /// An OCI container (crun or runc): namespaces, cgroups, seccomp; shares the host kernel.
    Container,
    /// A user-space kernel (gVisor) or an emulated VM without hardware acceleration between
    /// the code and the host kernel.
    Kernel,
    /// A hardware-virtualised VM with its own guest kernel.
    Vm,
}

impl From<TierArg> for Tier {
    fn from(t: TierArg) -> Tier {
        match t {
            TierArg::Process => Tier::Process,
            TierArg::Container => Tier::Container,
            TierArg::Kernel => Tier::Kernel,
            TierArg::Vm => Tier::Vm,
        }
    }
}

/// A snippet's language.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LanguageArg {
    /// Run by node (CommonJS script; top-level `await` is not available).
    Javascript,
    /// Run by python3.
    Python,
}

impl From<LanguageArg> for Language {
    fn from(l: LanguageArg) -> Language {
        match l {
            LanguageArg::Javascript => Language::Javascript,
            LanguageArg::Python => Language::Python,
        }
    }
}

/// Where and how long a run may go: shared by `run_code` and `run_project`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
pub struct Placement {
    /// The floor: the weakest isolation tier you accept (process < container < kernel < vm).
    /// The run goes to the cheapest available provider at or above it; if none is available
    /// the call is refused with "not dispatched (isolation)" and nothing runs. Omit it to take
    /// the operator's default floor (usually `container`). Set `container` or higher for code
    /// you do not trust.
    #[serde(default)]
    pub min_isolation: Option<TierArg>,
    /// Run on this provider only (a name from `list_providers`, e.g. `process`, `crun`,
    /// `runsc`, `qemu`); it must still meet the floor. Omit it to let plimsoll choose.
    #[serde(default)]
    pub provider: Option<String>,
    /// The image to run in: a name or an identity (`sha256:...`) from `list_providers`'
    /// `images` (which also says which languages each starts). Omit it for the operator's
    /// default image. A run is served by that image or refused ("not dispatched"), never by
    /// another; the result names the image that ran.
    #[serde(default)]
    pub image: Option<String>,
    /// Wall-clock limit for the whole run, in milliseconds. When it passes, the sandbox is
    /// killed and the result says `timed_out: true` (a result, not an error). Omit it for the
    /// operator's default.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub timeout_ms: Option<u64>,
    /// A grant profile the operator defined. An API grant lets the code call that API
    /// through the broker (`host.get(...)` in JavaScript, `plimsoll_host` in Python) without
    /// holding its credential; an egress grant lets it open connections to the hosts the
    /// operator listed (HTTPS_PROXY is set: pip, npm, urllib and fetch use it). The result
    /// lists every call (`calls`) and every connection attempt (`egress`). Without a grant
    /// the code has no network at all.
    #[serde(default)]
    pub grant: Option<String>,
}

/// Arguments of `run_code`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct RunCodeArgs {
    /// The language of `code`.
    pub language: LanguageArg,
    /// The program's source text. It runs in a fresh sandbox that is destroyed afterwards;
    /// print what you want to see (stdout and stderr come back, capped).
    pub code: String,
    /// Floor, provider, timeout and grant.
    #[serde(flatten)]
    pub placement: Placement,
}

/// One file of a project.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileArg {
    /// Path relative to the working directory `/work`, `/`-separated, no `.` or `..`.
    pub path: String,
    /// The file's text (UTF-8). Give this or `content_base64`, not both.
    #[serde(default)]
    pub content: Option<String>,
    /// The file's exact bytes, base64-encoded, for content that is not UTF-8 text.
    #[serde(default)]
    pub content_base64: Option<String>,
    /// Make the file executable.
    #[serde(default)]
    pub executable: bool,
}

/// One shell step of a project.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StepArg {
    /// The command, run by `/bin/sh -c` in `/work`.
    pub run: String,
    /// A label for the step.
    #[serde(default)]
    pub name: Option<String>,
}

/// Arguments of `run_project`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct RunProjectArgs {
    /// Files written under `/work` before the first step.
    #[serde(default)]
    pub files: Vec<FileArg>,
    /// Shell steps run in order in `/work`; the first that fails stops the run. At least one.
    pub steps: Vec<StepArg>,
    /// Paths under `/work` whose contents to return after the steps.
    #[serde(default)]
    pub artifacts: Vec<String>,
    /// Floor, provider, timeout and grant.
    #[serde(flatten)]
    pub placement: Placement,
}

/// Arguments of `list_providers` (none).
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
pub struct ListProvidersArgs {}

/// Arguments of `open_session`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct OpenSessionArgs {
    /// The language of the session's interpreter: every `run_cell` in it is this language.
    pub language: LanguageArg,
    /// The floor: the weakest isolation tier you accept for the whole session (process <
    /// container < kernel < vm). It opens at the cheapest available provider that keeps
    /// sessions and meets it (the process tier keeps none: sessions start at `container`);
    /// if none is available the call is refused with "not dispatched" and nothing starts.
    /// Omit it to take the operator's default floor (usually `container`).
    #[serde(default)]
    pub min_isolation: Option<TierArg>,
    /// Open it on this provider only (a name from `list_providers` that keeps sessions:
    /// `crun`, `runc`, `runsc`, `qemu`); it must still meet the floor. Omit it to let
    /// plimsoll choose.
    #[serde(default)]
    pub provider: Option<String>,
    /// The image the session runs in, for its whole life: a name or an identity from
    /// `list_providers`' `images`. Omit it for the operator's default image.
    #[serde(default)]
    pub image: Option<String>,
    /// A grant profile the operator defined, held by the session for its whole life (a cell
    /// or step cannot name one of its own). An API grant lets its code call that API through
    /// the broker (`host.get(...)` in JavaScript, `plimsoll_host` in Python) without holding
    /// its credential; an egress grant lets it open connections to the hosts the operator
    /// listed (HTTPS_PROXY is set: pip install, npm install, urllib and fetch use it). Each
    /// call's result lists the calls (`calls`) and connection attempts (`egress`) since the
    /// call before. Without a grant the session has no network at all.
    #[serde(default)]
    pub grant: Option<String>,
    /// The session ends after this many milliseconds without a call (the operator's default,
    /// usually 5 minutes, when omitted). A call to an ended session is refused
    /// `session_ended`: open a new one.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub idle_timeout_ms: Option<u64>,
    /// The session ends this many milliseconds after it opened, whatever it is doing (the
    /// operator's default, usually 1 hour, when omitted).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub max_lifetime_ms: Option<u64>,
}

/// Arguments of `run_cell`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct RunCellArgs {
    /// The session's id, from `open_session` (`ses_...`).
    pub session_id: String,
    /// Code in the session's language, run by its interpreter: variables, imports and
    /// functions from earlier cells are there, and this cell's stay for the next
    /// (`state_kept` in the result says so). Print what you want to see.
    pub code: String,
    /// Start a fresh interpreter first (all earlier state gone). Required after the
    /// interpreter ended (a result with `interpreter_end`, or a refusal coded
    /// `interpreter_ended`); otherwise leave it false.
    #[serde(default)]
    pub restart: bool,
    /// This cell's wall-clock limit in milliseconds (the session's own when omitted). Past
    /// it the interpreter is killed and its state lost (`timed_out: true`,
    /// `interpreter_end: "cell_timeout"`); the session stays.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub timeout_ms: Option<u64>,
}

/// Arguments of `run_session_steps`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct RunSessionStepsArgs {
    /// The session's id, from `open_session` (`ses_...`).
    pub session_id: String,
    /// Shell commands, each run by `/bin/sh -c` in the session's `/work` (the directory its
    /// cells see too), in order; the first that fails stops them. At least one.
    pub commands: Vec<String>,
    /// Wall-clock limit for all of them, in milliseconds (the session's own when omitted).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub timeout_ms: Option<u64>,
}

/// Arguments of `write_session_file`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct WriteSessionFileArgs {
    /// The session's id, from `open_session` (`ses_...`).
    pub session_id: String,
    /// Path relative to `/work`, `/`-separated, no `.` or `..`; parent directories are
    /// made. An existing file is replaced.
    pub path: String,
    /// The file's text (UTF-8). Give this or `content_base64`, not both.
    #[serde(default)]
    pub content: Option<String>,
    /// The file's exact bytes, base64-encoded, for content that is not UTF-8 text.
    #[serde(default)]
    pub content_base64: Option<String>,
}

/// Arguments of `read_session_file`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct ReadSessionFileArgs {
    /// The session's id, from `open_session` (`ses_...`).
    pub session_id: String,
    /// Path relative to `/work`, `/`-separated, no `.` or `..`.
    pub path: String,
}

/// Arguments of `close_session`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct CloseSessionArgs {
    /// The session's id, from `open_session` (`ses_...`).
    pub session_id: String,
}

/// Arguments of `list_sessions` (none).
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
pub struct ListSessionsArgs {}

/// Arguments of `snapshot_session`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct SnapshotSessionArgs {
    /// The session's id, from `open_session` (`ses_...`): a python session at a provider
    /// that can save one (`runsc`), opened without a grant. It is paused while it is saved,
    /// then goes on; its interpreter's state and /work are in the snapshot.
    pub session_id: String,
}

/// Arguments of `fork_session`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct ForkSessionArgs {
    /// The session's id, from `open_session` (`ses_...`): a python session at a provider
    /// that can save one (`runsc`), opened without a grant. It goes on after the fork.
    pub session_id: String,
    /// How many copies: at least 1, at most the operator's `max_fork` (usually 8). Each copy
    /// is a new session that counts against your session limits.
    #[schemars(range(min = 1))]
    pub count: u32,
}

/// Arguments of `open_snapshot`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct OpenSnapshotArgs {
    /// The snapshot's id, from `snapshot_session`, `fork_session` or `list_snapshots`
    /// (`snp_...`).
    pub snapshot_id: String,
}

/// Arguments of `list_snapshots` (none).
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
pub struct ListSnapshotsArgs {}

/// Arguments of `delete_snapshot`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct DeleteSnapshotArgs {
    /// The snapshot's id, from `snapshot_session`, `fork_session` or `list_snapshots`
    /// (`snp_...`).
    pub snapshot_id: String,
}

/// Arguments that cannot make a request (checked before anything is sent).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    /// A file gives both kinds of content, or neither.
    #[error("file `{0}`: give exactly one of `content` (text) or `content_base64`")]
    FileContent(String),
    /// `content_base64` is not base64.
    #[error("file `{0}`: `content_base64` is not valid base64: {1}")]
    Base64(String, String),
    /// A session id that no session can have.
    #[error(
        "`{0}` is not a session id ({1}): use the `session_id` open_session or list_sessions gave"
    )]
    SessionId(String, String),
    /// A snapshot id that no snapshot can have.
    #[error(
        "`{0}` is not a snapshot id ({1}): use the `snapshot_id` snapshot_session, fork_session or list_snapshots gave"
    )]
    SnapshotId(String, String),
    /// A session's steps with no command.
    #[error("give at least one command in `commands`")]
    NoCommands,
}

/// A file's bytes from exactly one of `content` (text) and `content_base64`.
fn file_bytes(
    path: &str,
    content: Option<&String>,
    content_base64: Option<&String>,
) -> Result<Vec<u8>, ArgsError> {
    match (content, content_base64) {
        (Some(text), None) => Ok(text.as_bytes().to_vec()),
        (None, Some(b64)) => STANDARD
            .decode(b64)
            .map_err(|e| ArgsError::Base64(path.to_owned(), e.to_string())),
        _ => Err(ArgsError::FileContent(path.to_owned())),
    }
}

/// `id` if a session can have it. Checked before anything is sent: an id goes into the
/// daemon's URL path, where a `/` or `?` would name another route.
pub fn session_id(id: &str) -> Result<&str, ArgsError> {
    validate_session_id(id).map_err(|m| ArgsError::SessionId(id.to_owned(), m))?;
    Ok(id)
}

/// `id` if a snapshot can have it. Checked before anything is sent, as a session id is.
pub fn snapshot_id(id: &str) -> Result<&str, ArgsError> {
    validate_snapshot_id(id).map_err(|m| ArgsError::SnapshotId(id.to_owned(), m))?;
    Ok(id)
}

impl Placement {
    fn apply(&self, mut options: RunOptions) -> RunOptions {
        options.minimum_isolation = self.min_isolation.map(Tier::from);
        options.provider = self.provider.clone();
        options.image = self.image.clone();
        options.grant = self.grant.clone();
        if let Some(ms) = self.timeout_ms {
            options = options.timeout_ms(ms);
        }
        options
    }
}

impl RunCodeArgs {
    /// The run these arguments ask for.
    pub fn to_options(&self) -> RunOptions {
        self.placement
            .apply(RunOptions::snippet(self.language.into(), self.code.clone()))
    }
}

impl RunProjectArgs {
    /// The run these arguments ask for; structural checks (paths, step count) are the
    /// engine's and come back as refusals.
    pub fn to_options(&self) -> Result<RunOptions, ArgsError> {
        let files = self
            .files
            .iter()
            .map(|f| {
                let content = file_bytes(&f.path, f.content.as_ref(), f.content_base64.as_ref())?;
                Ok(ProjectFile {
                    path: f.path.clone(),
                    content: Bytes(content),
                    executable: f.executable,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let steps = self
            .steps
            .iter()
            .map(|s| Step {
                name: s.name.clone(),
                run: s.run.clone(),
            })
            .collect();
        let project = Project {
            files,
            steps,
            artifacts: self.artifacts.clone(),
        };
        Ok(self
            .placement
            .apply(RunOptions::new(RunSpec::Project(project))))
    }
}

impl OpenSessionArgs {
    /// The session these arguments ask for.
    pub fn to_options(&self) -> SessionOptions {
        let mut o = SessionOptions::new(self.language.into());
        o.minimum_isolation = self.min_isolation.map(Tier::from);
        o.provider = self.provider.clone();
        o.image = self.image.clone();
        o.grant = self.grant.clone();
        o.idle_timeout_ms = self.idle_timeout_ms;
        o.max_lifetime_ms = self.max_lifetime_ms;
        o
    }
}

impl RunCellArgs {
    /// The session and the cell.
    pub fn to_call(&self) -> Result<(&str, SessionCall), ArgsError> {
        Ok((
            session_id(&self.session_id)?,
            SessionCall::Cell {
                code: self.code.clone(),
                restart: self.restart,
                timeout_ms: self.timeout_ms,
            },
        ))
    }
}

impl RunSessionStepsArgs {
    /// The session and its steps.
    pub fn to_call(&self) -> Result<(&str, SessionCall), ArgsError> {
        let id = session_id(&self.session_id)?;
        if self.commands.is_empty() {
            return Err(ArgsError::NoCommands);
        }
        Ok((
            id,
            SessionCall::Steps {
                steps: self.commands.clone(),
                timeout_ms: self.timeout_ms,
            },
        ))
    }
}

impl WriteSessionFileArgs {
    /// The session and the file.
    pub fn to_call(&self) -> Result<(&str, SessionCall), ArgsError> {
        let id = session_id(&self.session_id)?;
        let content = file_bytes(
            &self.path,
            self.content.as_ref(),
            self.content_base64.as_ref(),
        )?;
        Ok((
            id,
            SessionCall::Put {
                path: self.path.clone(),
                content,
            },
        ))
    }
}

impl ReadSessionFileArgs {
    /// The session and the path.
    pub fn to_call(&self) -> Result<(&str, SessionCall), ArgsError> {
        Ok((
            session_id(&self.session_id)?,
            SessionCall::Get {
                path: self.path.clone(),
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_code_arguments_make_the_request_they_say() {
        let args: RunCodeArgs = serde_json::from_value(serde_json::json!({
            "language": "python", "code": "print(1)", "min_isolation": "container",
            "provider": "crun", "timeout_ms": 500, "grant": "orders"
        }))
        .unwrap();
        let o = args.to_options();
        assert_eq!(o.minimum_isolation, Some(Tier::Container));
        assert_eq!(o.provider.as_deref(), Some("crun"));
        assert_eq!(o.grant.as_deref(), Some("orders"));
        assert_eq!(o.limits.unwrap().timeout_ms, Some(500));
        assert_eq!(
            o.run,
            RunSpec::Snippet(plimsoll_wire::Snippet {
                language: Language::Python,
                code: "print(1)".into()
            })
        );
    }

    #[test]
    fn project_files_take_text_or_base64_never_both() {
        let mut args: RunProjectArgs = serde_json::from_value(serde_json::json!({
            "files": [{"path": "a.bin", "content_base64": "/wA="}, {"path": "b.txt", "content": "hi"}],
            "steps": [{"run": "cat a.bin"}], "artifacts": ["out"]
        }))
        .unwrap();
        let RunSpec::Project(p) = args.to_options().unwrap().run else {
            panic!("not a project")
        };
        assert_eq!(p.files[0].content.as_slice(), &[0xff, 0x00]);
        assert_eq!(p.files[1].content.as_slice(), b"hi");
        assert_eq!(p.artifacts, vec!["out".to_owned()]);
        args.files[1].content_base64 = Some("aGk=".into());
        assert_eq!(
            args.to_options().unwrap_err(),
            ArgsError::FileContent("b.txt".into())
        );
        args.files[1].content_base64 = Some("%%".into());
        args.files[1].content = None;
        assert!(matches!(
            args.to_options().unwrap_err(),
            ArgsError::Base64(..)
        ));
    }

    #[test]
    fn the_schemas_tell_a_model_what_a_floor_and_a_tier_are() {
        let schema = serde_json::to_string(&schemars::schema_for!(RunCodeArgs)).unwrap();
        for needle in [
            "not dispatched",
            "floor",
            "no wall at the OS level",
            "timed_out",
            "\"vm\"",
        ] {
            assert!(schema.contains(needle), "{needle} missing from {schema}");
        }
    }

    const ID: &str = "ses_0123456789abcdef_00112233445566778899aabbccddeeff";

    #[test]
    fn session_arguments_make_the_calls_they_say() {
        let open: OpenSessionArgs = serde_json::from_value(serde_json::json!({
            "language": "javascript", "min_isolation": "kernel", "provider": "runsc",
            "idle_timeout_ms": 1000, "max_lifetime_ms": 60000, "grant": "pkgs"
        }))
        .unwrap();
        let o = open.to_options();
        assert_eq!(o.grant.as_deref(), Some("pkgs"));
        assert_eq!(
            o.clone().into_request("r".into()).grant.as_deref(),
            Some("pkgs"),
            "the open request carries it"
        );
        assert_eq!(o.language, Language::Javascript);
        assert_eq!(o.minimum_isolation, Some(Tier::Kernel));
        assert_eq!(o.provider.as_deref(), Some("runsc"));
        assert_eq!(
            (o.idle_timeout_ms, o.max_lifetime_ms),
            (Some(1000), Some(60000))
        );
        assert_eq!(o.limits, None);

        let cell: RunCellArgs = serde_json::from_value(serde_json::json!({
            "session_id": ID, "code": "x = 1", "restart": true, "timeout_ms": 900
        }))
        .unwrap();
        assert_eq!(
            cell.to_call().unwrap(),
            (
                ID,
                SessionCall::Cell {
                    code: "x = 1".into(),
                    restart: true,
                    timeout_ms: Some(900)
                }
            )
        );
        let cell: RunCellArgs =
            serde_json::from_value(serde_json::json!({"session_id": ID, "code": "x"})).unwrap();
        assert!(matches!(
            cell.to_call().unwrap().1,
            SessionCall::Cell {
                restart: false,
                timeout_ms: None,
                ..
            }
        ));

        let steps: RunSessionStepsArgs = serde_json::from_value(serde_json::json!({
            "session_id": ID, "commands": ["echo a > f", "cat f"]
        }))
        .unwrap();
        assert_eq!(
            steps.to_call().unwrap().1,
            SessionCall::Steps {
                steps: vec!["echo a > f".into(), "cat f".into()],
                timeout_ms: None
            }
        );
        let none: RunSessionStepsArgs =
            serde_json::from_value(serde_json::json!({"session_id": ID, "commands": []})).unwrap();
        assert_eq!(none.to_call().unwrap_err(), ArgsError::NoCommands);

        let read: ReadSessionFileArgs =
            serde_json::from_value(serde_json::json!({"session_id": ID, "path": "out/a.txt"}))
                .unwrap();
        assert_eq!(
            read.to_call().unwrap().1,
            SessionCall::Get {
                path: "out/a.txt".into()
            }
        );
    }

    #[test]
    fn a_session_file_takes_text_or_base64_never_both() {
        let write = |v: serde_json::Value| {
            serde_json::from_value::<WriteSessionFileArgs>(v)
                .unwrap()
                .to_call()
                .map(|(_, call)| call)
        };
        assert_eq!(
            write(serde_json::json!({"session_id": ID, "path": "a.txt", "content": "hi"})),
            Ok(SessionCall::Put {
                path: "a.txt".into(),
                content: b"hi".to_vec()
            })
        );
        assert_eq!(
            write(serde_json::json!({"session_id": ID, "path": "a.bin", "content_base64": "/wA="})),
            Ok(SessionCall::Put {
                path: "a.bin".into(),
                content: vec![0xff, 0x00]
            })
        );
        assert_eq!(
            write(
                serde_json::json!({"session_id": ID, "path": "a", "content": "x", "content_base64": "eA=="})
            ),
            Err(ArgsError::FileContent("a".into()))
        );
        assert_eq!(
            write(serde_json::json!({"session_id": ID, "path": "a"})),
            Err(ArgsError::FileContent("a".into()))
        );
        assert!(matches!(
            write(serde_json::json!({"session_id": ID, "path": "a", "content_base64": "%%"})),
            Err(ArgsError::Base64(..))
        ));
    }

    #[test]
    fn a_session_id_is_checked_before_it_goes_anywhere() {
        // An id goes into the daemon's URL path: one with `/` or `?` would name another route.
        for bad in [
            "",
            "ses_x",
            "ses_0123456789abcdef_00112233445566778899aabbccddeeff/cells",
            "../runs",
            "ses_0123456789abcdef_00112233445566778899aabbccddeeff?restart=true",
        ] {
            let cell: RunCellArgs =
                serde_json::from_value(serde_json::json!({"session_id": bad, "code": "1"}))
                    .unwrap();
            assert!(
                matches!(cell.to_call(), Err(ArgsError::SessionId(..))),
                "{bad} was taken"
            );
        }
        assert_eq!(session_id(ID), Ok(ID));
    }

    #[test]
    fn a_snapshot_id_is_checked_before_it_goes_anywhere() {
        let good = "snp_0123456789abcdef_00112233445566778899aabbccddeeff";
        assert_eq!(snapshot_id(good), Ok(good));
        // A snapshot id goes into the daemon's URL path as a session id does.
        for bad in [
            "",
            ID,
            "snp_0123456789abcdef_00112233445566778899aabbccddeeff/sessions",
            "snp_0123456789abcdef_00112233445566778899aabbccddeeff?x=1",
            "snp_../../v1/runs",
        ] {
            assert!(
                matches!(snapshot_id(bad), Err(ArgsError::SnapshotId(..))),
                "{bad} was taken"
            );
        }
        let open: OpenSnapshotArgs =
            serde_json::from_value(serde_json::json!({"snapshot_id": good})).unwrap();
        assert_eq!(open.snapshot_id, good);
        // A fork names its copies' count; none is not a fork of one.
        let fork: ForkSessionArgs =
            serde_json::from_value(serde_json::json!({"session_id": ID, "count": 3})).unwrap();
        assert_eq!((fork.session_id.as_str(), fork.count), (ID, 3));
        assert!(
            serde_json::from_value::<ForkSessionArgs>(serde_json::json!({"session_id": ID}))
                .is_err()
        );
        assert!(
            serde_json::from_value::<ForkSessionArgs>(
                serde_json::json!({"session_id": ID, "count": -1})
            )
            .is_err()
        );
        let schema = serde_json::to_string(&schemars::schema_for!(ForkSessionArgs)).unwrap();
        for needle in ["runsc", "max_fork", "session limits"] {
            assert!(schema.contains(needle), "{needle} missing from {schema}");
        }
    }

    #[test]
    fn the_session_schemas_tell_a_model_what_a_session_keeps_and_how_to_recover() {
        let cell = serde_json::to_string(&schemars::schema_for!(RunCellArgs)).unwrap();
        for needle in ["state_kept", "interpreter_ended", "restart", "open_session"] {
            assert!(cell.contains(needle), "{needle} missing from {cell}");
        }
        let open = serde_json::to_string(&schemars::schema_for!(OpenSessionArgs)).unwrap();
        for needle in [
            "floor",
            "session_ended",
            "\"vm\"",
            "keeps none",
            "\"grant\"",
            "whole life",
            "egress",
        ] {
            assert!(open.contains(needle), "{needle} missing from {open}");
        }
        let write = serde_json::to_string(&schemars::schema_for!(WriteSessionFileArgs)).unwrap();
        assert!(
            write.contains("content_base64") && write.contains("/work"),
            "{write}"
        );
    }
}
