//! The tools' arguments as a model sees them: JSON Schemas (from these types and their doc
//! comments) whose descriptions say what a tier is, what a floor does and when a retry is
//! safe; and their translation into run options.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use plimsoll_client::RunOptions;
use plimsoll_wire::{Bytes, Language, Project, ProjectFile, RunSpec, Step, Tier};
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
    /// Wall-clock limit for the whole run, in milliseconds. When it passes, the sandbox is
    /// killed and the result says `timed_out: true` (a result, not an error). Omit it for the
    /// operator's default.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub timeout_ms: Option<u64>,
    /// A grant profile the operator defined: lets the code call that API through the broker
    /// (`host.get(...)` in JavaScript, `plimsoll_host` in Python) without holding its
    /// credential. Without a grant the code has no network at all.
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

/// Arguments that cannot make a request (checked before anything is sent).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    /// A file gives both kinds of content, or neither.
    #[error("file `{0}`: give exactly one of `content` (text) or `content_base64`")]
    FileContent(String),
    /// `content_base64` is not base64.
    #[error("file `{0}`: `content_base64` is not valid base64: {1}")]
    Base64(String, String),
}

impl Placement {
    fn apply(&self, mut options: RunOptions) -> RunOptions {
        options.minimum_isolation = self.min_isolation.map(Tier::from);
        options.provider = self.provider.clone();
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
                let content = match (&f.content, &f.content_base64) {
                    (Some(text), None) => Bytes::from(text.as_str()),
                    (None, Some(b64)) => Bytes(
                        STANDARD
                            .decode(b64)
                            .map_err(|e| ArgsError::Base64(f.path.clone(), e.to_string()))?,
                    ),
                    _ => return Err(ArgsError::FileContent(f.path.clone())),
                };
                Ok(ProjectFile {
                    path: f.path.clone(),
                    content,
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
}
