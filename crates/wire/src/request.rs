//! Run requests: what a caller asks to run, under which floor and limits.

use serde::{Deserialize, Serialize};

use crate::error::{Reason, RequestRejection};
use crate::{Bytes, PROTOCOL, Tier};

/// One run, as the caller sends it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// Must equal [`PROTOCOL`].
    pub protocol: u32,
    /// Chosen by the caller, echoed on every answer; 1 to 128 characters of `A-Z a-z 0-9 . _ : -`.
    /// Not part of the request digest, so a replay has the same digest.
    pub request_id: String,
    /// The floor: the weakest tier the caller accepts. `None` takes the operator's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_isolation: Option<Tier>,
    /// Run on this provider only (it must still meet the floor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Limits the caller asks for; each absent one takes the operator's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    /// What to run.
    pub run: RunSpec,
    /// The name of a grant profile defined by the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<String>,
    /// The image to run in: a name in the daemon's image store or an identity
    /// (`sha256:...`). `None` takes the operator's default image; a request is never served
    /// by another image than the one it names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// Limits a request may ask for. The operator's maximums bound every one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Wall-clock budget for the whole run, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Memory for the sandbox, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// Bytes kept per output stream (stdout, stderr) per step; the rest is dropped and flagged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<u64>,
    /// Processes and threads the sandbox may hold at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    /// Writable disk for the sandbox, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
    /// Bytes kept per returned artifact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_bytes: Option<u64>,
}

impl Limits {
    /// The least memory a run may ask for: what an interpreter (python3, node) and the
    /// sandbox's own processes need to start at every provider, 32 MiB. Below it a run could
    /// only fail while its sandbox is set up, which would say nothing of the provider.
    pub const MIN_MEMORY_BYTES: u64 = 32 * 1024 * 1024;
    /// The fewest processes and threads a run may ask for: node alone starts about a dozen
    /// threads, 16.
    pub const MIN_PIDS: u64 = 16;
    /// The least writable disk a run may ask for, 1 MiB: a sandbox's tmpfs mounts are split
    /// from it and each needs whole pages and inodes.
    pub const MIN_DISK_BYTES: u64 = 1024 * 1024;

    /// The first member below its minimum, with that minimum: 1 for every limit but
    /// `memory_bytes`, `pids` and `disk_bytes` ([`Limits::MIN_MEMORY_BYTES`],
    /// [`Limits::MIN_PIDS`], [`Limits::MIN_DISK_BYTES`]).
    pub fn below_minimum(&self) -> Option<(&'static str, u64, u64)> {
        [
            ("timeout_ms", self.timeout_ms, 1),
            ("memory_bytes", self.memory_bytes, Self::MIN_MEMORY_BYTES),
            ("output_bytes", self.output_bytes, 1),
            ("pids", self.pids, Self::MIN_PIDS),
            ("disk_bytes", self.disk_bytes, Self::MIN_DISK_BYTES),
            ("artifact_bytes", self.artifact_bytes, 1),
        ]
        .into_iter()
        .find_map(|(name, value, min)| match value {
            Some(v) if v < min => Some((name, v, min)),
            _ => None,
        })
    }

    /// The refusal's message for [`Limits::below_minimum`]'s answer.
    pub fn below_minimum_message(&self) -> Option<String> {
        self.below_minimum().map(|(name, value, min)| {
            if min == 1 {
                format!("limits.{name} must be greater than 0")
            } else {
                format!(
                    "limits.{name} = {value} is below the minimum {min} a sandbox's interpreter needs: ask for at least {min}, or omit it for the server's default"
                )
            }
        })
    }
}

/// The kinds of run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum RunSpec {
    /// A piece of code in one language.
    Snippet(Snippet),
    /// Files, shell steps run in order, artifacts to return.
    Project(Project),
}

impl RunSpec {
    /// `snippet` or `project`.
    pub fn kind(&self) -> &'static str {
        match self {
            RunSpec::Snippet(_) => "snippet",
            RunSpec::Project(_) => "project",
        }
    }
}

/// A snippet: a language and its code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Snippet {
    /// The language.
    pub language: Language,
    /// The source text; must not be empty.
    pub code: String,
}

/// Snippet languages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// Run by node.
    Javascript,
    /// Run by python3.
    Python,
}

impl Language {
    /// The lowercase wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Language::Javascript => "javascript",
            Language::Python => "python",
        }
    }
}

impl std::str::FromStr for Language {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "javascript" | "js" => Ok(Language::Javascript),
            "python" | "py" => Ok(Language::Python),
            other => Err(format!(
                "unknown language `{other}`: use javascript or python"
            )),
        }
    }
}

/// A project: files written under `/work`, steps run in order, artifacts returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Project {
    /// Files to write before the first step.
    #[serde(default, deserialize_with = "crate::nulls::or_default")]
    pub files: Vec<ProjectFile>,
    /// Shell steps, run in order; the first that fails stops the run. At least one.
    pub steps: Vec<Step>,
    /// Paths under `/work` to return after the steps.
    #[serde(default, deserialize_with = "crate::nulls::or_default")]
    pub artifacts: Vec<String>,
}

/// A file of a project.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectFile {
    /// Relative path under `/work`, `/`-separated, no `.` or `..` segments.
    pub path: String,
    /// The exact content.
    pub content: Bytes,
    /// Mark the file executable.
    #[serde(default, deserialize_with = "crate::nulls::or_default")]
    pub executable: bool,
}

/// One shell step of a project.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// A label for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The command, run by `/bin/sh -c` in `/work`.
    pub run: String,
}

/// The request id of a body that will not be run, if one can be read from its first bytes.
///
/// A whole JSON body is parsed; a cut-off prefix is scanned tolerantly for the first
/// `"request_id"`, a colon and a string without escapes. Either way the id must be a valid
/// request id. A client puts `request_id` early (before `run`) to be sure it is echoed.
pub fn scan_request_id(prefix: &[u8]) -> Option<String> {
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(prefix) {
        let id = value.get("request_id")?.as_str()?;
        validate_request_id(id).ok()?;
        return Some(id.to_owned());
    }
    const KEY: &[u8] = b"\"request_id\"";
    let at = prefix.windows(KEY.len()).position(|w| w == KEY)?;
    let rest = &prefix[at + KEY.len()..];
    let rest = rest.trim_ascii_start().strip_prefix(b":")?;
    let rest = rest.trim_ascii_start().strip_prefix(b"\"")?;
    let end = rest.iter().position(|&b| b == b'"' || b == b'\\')?;
    if rest[end] != b'"' {
        return None;
    }
    let id = std::str::from_utf8(&rest[..end]).ok()?;
    validate_request_id(id).ok()?;
    Some(id.to_owned())
}

/// Checks a request id: 1 to 128 characters of `A-Z a-z 0-9 . _ : -`.
pub fn validate_request_id(id: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-');
    if id.is_empty() || id.len() > 128 || !id.chars().all(ok_char) {
        return Err(format!(
            "request_id must be 1 to 128 characters of A-Z a-z 0-9 . _ : - (got {} characters)",
            id.chars().count()
        ));
    }
    Ok(())
}

/// Checks a project path: relative, `/`-separated, no empty, `.` or `..` segment, no NUL or
/// backslash, at most 4096 bytes.
fn validate_project_path(path: &str) -> Result<(), String> {
    let bad = path.is_empty()
        || path.len() > 4096
        || path.starts_with('/')
        || path.contains('\0')
        || path.contains('\\')
        || path
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..");
    if bad {
        return Err(format!(
            "path `{}` must be relative to /work, with no empty, `.` or `..` segments",
            path.escape_debug()
        ));
    }
    Ok(())
}

impl RunRequest {
    /// Structural checks that need no operator settings. Limits against maximums and the
    /// floor against providers are the engine's job.
    pub fn validate(&self) -> Result<(), RequestRejection> {
        self.validate_with(true)
    }

    /// [`RunRequest::validate`] for a call in a session, where a project may have no step
    /// when it writes files or reads artifacts (an upload, a download).
    pub fn validate_session_call(&self) -> Result<(), RequestRejection> {
        self.validate_with(false)
    }

    fn validate_with(&self, steps_required: bool) -> Result<(), RequestRejection> {
        let reject = |message: String| RequestRejection {
            request_id: Some(self.request_id.clone()),
            reason: Reason::Request,
            message,
        };
        if self.protocol != PROTOCOL {
            return Err(RequestRejection {
                // Echo only an id a client could have sent (as `parse_request` does): an
                // invalid one never equals the caller's, and may not even be printable.
                request_id: validate_request_id(&self.request_id)
                    .ok()
                    .map(|()| self.request_id.clone()),
                reason: Reason::Protocol,
                message: format!(
                    "protocol {} is not served: this server speaks protocol {PROTOCOL}",
                    self.protocol
                ),
            });
        }
        validate_request_id(&self.request_id).map_err(|m| RequestRejection {
            request_id: None,
            reason: Reason::Request,
            message: m,
        })?;
        if let Some(p) = &self.provider
            && p.is_empty()
        {
            return Err(reject(
                "provider must not be empty: omit it to let the server choose".into(),
            ));
        }
        if let Some(m) = self.limits.as_ref().and_then(Limits::below_minimum_message) {
            return Err(reject(m));
        }
        match &self.run {
            RunSpec::Snippet(s) => {
                if s.code.trim().is_empty() {
                    return Err(reject("run.code is empty: send the code to run".into()));
                }
            }
            RunSpec::Project(p) => {
                if p.steps.is_empty()
                    && (steps_required || (p.files.is_empty() && p.artifacts.is_empty()))
                {
                    return Err(reject(
                        "run.steps is empty: a project needs at least one step".into(),
                    ));
                }
                for (i, step) in p.steps.iter().enumerate() {
                    if step.run.trim().is_empty() {
                        return Err(reject(format!("run.steps[{i}].run is empty")));
                    }
                    // A step is a shell's argument: a NUL cannot be passed to a program.
                    if step.run.contains('\0') {
                        return Err(reject(format!(
                            "run.steps[{i}].run contains a NUL byte, which no command line can hold: remove it"
                        )));
                    }
                    if let Some(Err(e)) = crate::trial_step::trial_step(step) {
                        return Err(reject(format!("run.steps[{i}] {e}")));
                    }
                }
                let mut seen = std::collections::BTreeSet::new();
                for f in &p.files {
                    validate_project_path(&f.path)
                        .map_err(|m| reject(format!("run.files: {m}")))?;
                    if !seen.insert(f.path.as_str()) {
                        return Err(reject(format!("run.files: `{}` appears twice", f.path)));
                    }
                }
                for a in &p.artifacts {
                    validate_project_path(a).map_err(|m| reject(format!("run.artifacts: {m}")))?;
                }
            }
        }
        if let Some(g) = &self.grant
            && g.is_empty()
        {
            return Err(reject(
                "grant must not be empty: omit it for a run without grants".into(),
            ));
        }
        if let Some(image) = &self.image {
            crate::validate_image_selector(image).map_err(reject)?;
        }
        Ok(())
    }
}

/// Parses and checks a request body. The protocol number is checked before the rest, so a
/// request from a future protocol gets `protocol`, not `request`. Nothing ran on any error.
pub fn parse_request(body: &[u8]) -> Result<RunRequest, RequestRejection> {
    parse_with(body, true)
}

/// [`parse_request`] for a call in a session, checked by
/// [`RunRequest::validate_session_call`] (a project may have no step when it writes files or
/// reads artifacts).
pub fn parse_session_call(body: &[u8]) -> Result<RunRequest, RequestRejection> {
    parse_with(body, false)
}

/// The members of a run request that are lists; a JSON array anywhere else is refused
/// (`crate::shape`).
const REQUEST_LISTS: &[&str] = &["run.files", "run.steps", "run.artifacts"];

fn parse_with(body: &[u8], steps_required: bool) -> Result<RunRequest, RequestRejection> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| RequestRejection {
        request_id: None,
        reason: Reason::Request,
        message: format!("the body is not valid JSON ({e}): send a JSON run request"),
    })?;
    let obj = value.as_object().ok_or_else(|| RequestRejection {
        request_id: None,
        reason: Reason::Request,
        message: "the body must be a JSON object".into(),
    })?;
    let request_id = obj
        .get("request_id")
        .and_then(|v| v.as_str())
        .filter(|id| validate_request_id(id).is_ok())
        .map(str::to_owned);
    match obj.get("protocol") {
        Some(v) if v.as_u64() == Some(u64::from(PROTOCOL)) => {}
        Some(v) => {
            return Err(RequestRejection {
                request_id,
                reason: Reason::Protocol,
                message: format!(
                    "protocol {v} is not served: this server speaks protocol {PROTOCOL}"
                ),
            });
        }
        None => {
            return Err(RequestRejection {
                request_id,
                reason: Reason::Protocol,
                message: format!("the request has no `protocol`: set \"protocol\": {PROTOCOL}"),
            });
        }
    }
    if let Some(message) = crate::shape::array_outside(&value, REQUEST_LISTS, "run request") {
        return Err(RequestRejection {
            request_id,
            reason: Reason::Request,
            message,
        });
    }
    // Deserialise from the original bytes, not from `value`: the derived types refuse a
    // duplicated key, where a `Value` would keep the last one silently.
    let request: RunRequest = serde_json::from_slice(body).map_err(|e| RequestRejection {
        request_id: request_id.clone(),
        reason: Reason::Request,
        message: format!("the request does not match protocol {PROTOCOL}: {e}"),
    })?;
    request.validate_with(steps_required)?;
    Ok(request)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(extra: &str) -> String {
        format!(
            r#"{{"protocol":1,"request_id":"r-1","run":{{"kind":"snippet","language":"python","code":"print(1)"}}{extra}}}"#
        )
    }

    #[test]
    fn parses_a_snippet() {
        let r = parse_request(body("").as_bytes()).unwrap();
        assert_eq!(r.request_id, "r-1");
        assert!(matches!(
            r.run,
            RunSpec::Snippet(Snippet {
                language: Language::Python,
                ..
            })
        ));
    }

    #[test]
    fn unknown_fields_are_refused_as_request() {
        let e = parse_request(body(r#","colour":"red""#).as_bytes()).unwrap_err();
        assert_eq!(e.reason, Reason::Request);
        assert_eq!(e.request_id.as_deref(), Some("r-1"));
        assert!(e.message.contains("colour"), "{}", e.message);
        let nested = r#"{"protocol":1,"request_id":"r","run":{"kind":"snippet","language":"python","code":"1","x":1}}"#;
        assert_eq!(
            parse_request(nested.as_bytes()).unwrap_err().reason,
            Reason::Request
        );
    }

    #[test]
    fn wrong_or_missing_protocol_is_protocol() {
        let e = parse_request(
            body("")
                .replace(r#""protocol":1"#, r#""protocol":2"#)
                .as_bytes(),
        )
        .unwrap_err();
        assert_eq!(e.reason, Reason::Protocol);
        assert_eq!(e.request_id.as_deref(), Some("r-1"));
        let e = parse_request(body("").replace(r#""protocol":1,"#, "").as_bytes()).unwrap_err();
        assert_eq!(e.reason, Reason::Protocol);
    }

    #[test]
    fn malformed_json_unknown_tier_and_empty_code_are_request() {
        assert_eq!(parse_request(b"{nope").unwrap_err().reason, Reason::Request);
        let e = parse_request(body(r#","minimum_isolation":"fortress""#).as_bytes()).unwrap_err();
        assert_eq!(e.reason, Reason::Request);
        assert!(e.message.contains("fortress"), "{}", e.message);
        let e = parse_request(body("").replace("print(1)", "  ").as_bytes()).unwrap_err();
        assert_eq!(e.reason, Reason::Request);
        assert!(e.message.contains("empty"));
    }

    #[test]
    fn project_paths_are_checked() {
        for bad in ["../x", "/etc/passwd", "a//b", "a/./b", "a\\b", ""] {
            let p = RunRequest {
                image: None,
                protocol: PROTOCOL,
                request_id: "r".into(),
                minimum_isolation: None,
                provider: None,
                limits: None,
                run: RunSpec::Project(Project {
                    files: vec![ProjectFile {
                        path: bad.into(),
                        content: "x".into(),
                        executable: false,
                    }],
                    steps: vec![Step {
                        name: None,
                        run: "true".into(),
                    }],
                    artifacts: vec![],
                }),
                grant: None,
            };
            assert_eq!(p.validate().unwrap_err().reason, Reason::Request, "{bad}");
        }
    }

    #[test]
    fn a_malformed_trial_step_is_refused_before_anything_runs() {
        let with_step = |run: &str| RunRequest {
            image: None,
            protocol: PROTOCOL,
            request_id: "r".into(),
            minimum_isolation: None,
            provider: None,
            limits: None,
            run: RunSpec::Project(Project {
                files: vec![],
                steps: vec![
                    Step {
                        name: None,
                        run: "echo ok; ls".into(),
                    },
                    Step {
                        name: None,
                        run: run.into(),
                    },
                ],
                artifacts: vec![],
            }),
            grant: None,
        };
        assert!(
            with_step("plimsoll-trial-runner --scenario s.json -- node a.js")
                .validate()
                .is_ok()
        );
        for bad in [
            "plimsoll-trial-runner -- node a.js; cat /etc/shadow",
            "plimsoll-trial-runner --uid 0 -- node a.js",
        ] {
            let e = with_step(bad).validate().unwrap_err();
            assert_eq!(e.reason, Reason::Request, "{bad}");
            assert!(e.message.starts_with("run.steps[1] "), "{}", e.message);
        }
    }

    #[test]
    fn null_is_absent_and_a_member_with_a_default_takes_it() {
        let nulls = r#"{"protocol":1,"request_id":"r","provider":null,"grant":null,"minimum_isolation":null,"limits":{"timeout_ms":null},"run":{"kind":"project","files":[{"path":"a","content":"x","executable":null}],"steps":[{"name":null,"run":"true"}],"artifacts":null}}"#;
        let r = parse_request(nulls.as_bytes()).unwrap();
        let RunSpec::Project(p) = &r.run else {
            panic!("{r:?}")
        };
        assert!(!p.files[0].executable && p.artifacts.is_empty() && p.steps[0].name.is_none());
        assert_eq!(r.limits, Some(Limits::default()));
        let nulls = r#"{"protocol":1,"request_id":"r","run":{"kind":"project","files":null,"steps":[{"run":"true"}]}}"#;
        assert!(parse_request(nulls.as_bytes()).is_ok());
        // A required member is never null.
        for bad in [
            r#"{"protocol":1,"request_id":"r","run":null}"#,
            r#"{"protocol":1,"request_id":"r","run":{"kind":"snippet","language":"python","code":null}}"#,
            r#"{"protocol":1,"request_id":"r","run":{"kind":"project","steps":null}}"#,
            r#"{"protocol":1,"request_id":null,"run":{"kind":"snippet","language":"python","code":"1"}}"#,
        ] {
            assert_eq!(
                parse_request(bad.as_bytes()).unwrap_err().reason,
                Reason::Request,
                "{bad}"
            );
        }
    }

    /// serde's derived structs read a JSON array positionally: `"limits": [100]` ran with a
    /// 100 ms timeout under the digest of `{"timeout_ms": 100}` (issue 28, finding 17).
    #[test]
    fn an_array_where_the_schema_says_object_is_refused() {
        for (bad, at) in [
            (body(r#","limits":[100]"#), "limits"),
            (body(r#","limits":[100,null,5]"#), "limits"),
            (
                r#"{"protocol":1,"request_id":"r-1","run":["snippet","python","print(1)"]}"#
                    .to_owned(),
                "run",
            ),
            (
                r#"{"protocol":1,"request_id":"r-1","run":{"kind":"project","files":[["a","x",false]],"steps":[{"run":"true"}]}}"#
                    .to_owned(),
                "run.files[]",
            ),
            (
                r#"{"protocol":1,"request_id":"r-1","run":{"kind":"project","steps":[["n","true"]]}}"#
                    .to_owned(),
                "run.steps[]",
            ),
        ] {
            for parse in [parse_request, parse_session_call] {
                let e = parse(bad.as_bytes()).unwrap_err();
                assert_eq!(e.reason, Reason::Request, "{bad}");
                assert!(e.message.contains(&format!("`{at}`")), "{bad}: {}", e.message);
                assert_eq!(e.request_id.as_deref(), Some("r-1"), "{bad}");
            }
        }
        // The lists themselves, and the object forms, still read.
        let ok = r#"{"protocol":1,"request_id":"r-1","limits":{"timeout_ms":100},"run":{"kind":"project","files":[{"path":"a","content":"x"}],"steps":[{"run":"true"}],"artifacts":["a"]}}"#;
        assert!(parse_request(ok.as_bytes()).is_ok());
    }

    #[test]
    fn duplicate_keys_are_refused() {
        let dup = r#"{"protocol":1,"request_id":"r","run":{"kind":"snippet","language":"python","code":"1","code":"2"}}"#;
        assert_eq!(
            parse_request(dup.as_bytes()).unwrap_err().reason,
            Reason::Request
        );
        let dup = r#"{"protocol":1,"request_id":"r","minimum_isolation":"vm","minimum_isolation":"process","run":{"kind":"snippet","language":"python","code":"1"}}"#;
        assert_eq!(
            parse_request(dup.as_bytes()).unwrap_err().reason,
            Reason::Request
        );
    }

    /// Found by tests/fuzz.rs: `validate` echoed an invalid id on a protocol refusal.
    #[test]
    fn a_protocol_refusal_echoes_only_a_valid_request_id() {
        let mut r = parse_request(body("").as_bytes()).unwrap();
        r.protocol = 2;
        for bad in ["", "a b", "x\n"] {
            r.request_id = bad.into();
            let e = r.validate().unwrap_err();
            assert_eq!(e.reason, Reason::Protocol);
            assert_eq!(e.request_id, None, "{bad:?}");
        }
        r.request_id = "r-2".into();
        assert_eq!(r.validate().unwrap_err().request_id.as_deref(), Some("r-2"));
    }

    #[test]
    fn request_ids_are_checked() {
        assert!(validate_request_id("abc-123_x.y:z").is_ok());
        assert!(validate_request_id("").is_err());
        assert!(validate_request_id("a b").is_err());
        assert!(validate_request_id(&"a".repeat(129)).is_err());
    }

    /// #28 (13): a NUL in a step reaches no shell (it failed inside, `sandbox_failed`, and
    /// took the provider away while it was checked again): refused before anything runs,
    /// in a run and in a session's job alike.
    #[test]
    fn a_step_with_a_nul_byte_is_refused_as_request() {
        let project = |step: &str| {
            format!(
                r#"{{"protocol":1,"request_id":"r-nul","run":{{"kind":"project","steps":[{{"run":{}}}]}}}}"#,
                serde_json::to_string(step).unwrap()
            )
        };
        for step in ["echo a\0b", "\0", "true\0; id"] {
            let e = parse_request(project(step).as_bytes()).unwrap_err();
            assert_eq!(e.reason, Reason::Request, "{step:?}");
            assert_eq!(e.request_id.as_deref(), Some("r-nul"));
            assert!(
                e.message.contains("run.steps[0].run contains a NUL"),
                "{}",
                e.message
            );
            let e = parse_session_call(project(step).as_bytes()).unwrap_err();
            assert_eq!(e.reason, Reason::Request, "{step:?}");
        }
        assert!(parse_request(project("echo a; echo b").as_bytes()).is_ok());
        // In a file's content or a snippet's code a NUL is data, and runs.
        let code = body("").replace("print(1)", "print(1)\\u0000");
        assert!(parse_request(code.as_bytes()).is_ok());
    }

    /// #28 (13): limits an interpreter cannot start under (`memory_bytes: 1` and `pids: 1`
    /// failed inside, `503 environment`) are refused, the message saying the minimum.
    #[test]
    fn limits_below_the_minimums_are_refused_saying_the_minimum() {
        for (limit, min) in [
            ("memory_bytes", Limits::MIN_MEMORY_BYTES),
            ("pids", Limits::MIN_PIDS),
            ("disk_bytes", Limits::MIN_DISK_BYTES),
        ] {
            for value in [1, min - 1] {
                let e =
                    parse_request(body(&format!(r#","limits":{{"{limit}":{value}}}"#)).as_bytes())
                        .unwrap_err();
                assert_eq!(e.reason, Reason::Request, "{limit} = {value}");
                assert!(
                    e.message.contains(&format!(
                        "limits.{limit} = {value} is below the minimum {min}"
                    )),
                    "{}",
                    e.message
                );
            }
            assert!(
                parse_request(body(&format!(r#","limits":{{"{limit}":{min}}}"#)).as_bytes())
                    .is_ok(),
                "{limit} = {min}"
            );
        }
        for limit in ["timeout_ms", "output_bytes", "artifact_bytes"] {
            let e = parse_request(body(&format!(r#","limits":{{"{limit}":0}}"#)).as_bytes())
                .unwrap_err();
            assert!(
                e.message.contains("must be greater than 0"),
                "{}",
                e.message
            );
            assert!(
                parse_request(body(&format!(r#","limits":{{"{limit}":1}}"#)).as_bytes()).is_ok()
            );
        }
    }

    /// docs/openapi.json states the same minimums, so a schema-driven client refuses what
    /// the server refuses.
    #[test]
    fn the_openapi_minimums_are_these() {
        let doc: serde_json::Value =
            serde_json::from_str(include_str!("../../../docs/openapi.json")).unwrap();
        let limits = &doc["components"]["schemas"]["Limits"]["properties"];
        for (name, min) in [
            ("timeout_ms", 1),
            ("memory_bytes", Limits::MIN_MEMORY_BYTES),
            ("output_bytes", 1),
            ("pids", Limits::MIN_PIDS),
            ("disk_bytes", Limits::MIN_DISK_BYTES),
            ("artifact_bytes", 1),
        ] {
            assert_eq!(limits[name]["minimum"].as_u64(), Some(min), "{name}");
        }
    }
}
