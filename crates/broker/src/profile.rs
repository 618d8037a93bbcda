//! Grant profiles: the grants file (TOML) the daemon reads, parsed, then validated, with
//! every secret it names read from the daemon's environment before anything runs.
//!
//! The file holds no secret, only the names of the variables that do; docs/capability-grants.md
//! describes it with a complete example.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::Deserialize;

use crate::credential::{EnvSecret, MIN_HMAC_KEY_BYTES, Minter, Secret};
use crate::egress::profile::{EgressEntry, EgressProfile, validate_egress};
use crate::route::{ParseRouteError, Route};
use crate::upstream::Upstream;

/// Default request body cap, in bytes.
pub const DEFAULT_MAX_REQUEST_BYTES: u64 = 64 * 1024;
/// Default response body cap, in bytes.
pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 1024 * 1024;
/// Default timeout of one upstream call.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request body cap a profile may set.
pub const MAX_REQUEST_BYTES: u64 = 16 * 1024 * 1024;
/// Largest response body cap a profile may set.
pub const MAX_RESPONSE_BYTES: u64 = 64 * 1024 * 1024;
/// Largest call budget a profile may set.
pub const MAX_CALL_BUDGET: u32 = 10_000;
/// Connections a run may hold open to its broker at once, unless its profile says otherwise.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 8;
/// The most connections at once a profile may allow a run.
pub const MAX_CONNECTIONS: u32 = 64;

/// The message of every grant refusal: the same for an unknown profile and for one the
/// caller may not use, so profile names cannot be probed.
pub const GRANT_REFUSED: &str = "grant not allowed: this caller may not use that grant profile";

/// The grants file, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantsFile {
    #[serde(default)]
    profiles: BTreeMap<String, ProfileEntry>,
    #[serde(default)]
    egress: BTreeMap<String, EgressEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileEntry {
    base_url: String,
    routes: Vec<String>,
    callers: Vec<String>,
    call_budget: u32,
    max_request_bytes: Option<u64>,
    max_response_bytes: Option<u64>,
    timeout_ms: Option<u64>,
    max_connections: Option<u32>,
    credential: CredentialEntry,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CredentialEntry {
    kind: String,
    secret_env: Option<String>,
    key_env: Option<String>,
    audience: Option<String>,
    issuer: Option<String>,
    max_lifetime_secs: Option<u64>,
    header: Option<String>,
    scheme: Option<String>,
}

/// The grants file could not be loaded. No message carries a secret's value.
#[derive(Debug, thiserror::Error)]
pub enum LoadGrantsError {
    /// The file could not be read.
    #[error("cannot read the grants file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The process that holds the secrets (the split daemon's launcher) could not load it.
    #[error("the launcher could not load the grants file: {0}")]
    Elsewhere(String),
    /// The file is not valid TOML of the expected shape.
    #[error("the grants file {path} is not valid: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong, with its line.
        message: String,
    },
    /// A profile breaks a rule.
    #[error("grant profile `{profile}`: {message}")]
    Invalid {
        /// The profile.
        profile: String,
        /// What is wrong and what to write instead.
        message: String,
    },
    /// A variable the profile names is not set in the daemon's environment.
    #[error(
        "grant profile `{profile}`: the variable {variable} it names is not set (or empty) in the environment of the process that loads the grants file: export it before starting"
    )]
    MissingVariable {
        /// The profile.
        profile: String,
        /// The variable's name.
        variable: String,
    },
}

/// One validated profile, its secret already read.
#[derive(Debug)]
pub struct Profile {
    name: String,
    routes: Vec<Route>,
    callers: BTreeSet<String>,
    call_budget: u32,
    max_request_bytes: u64,
    max_response_bytes: u64,
    call_timeout: Duration,
    max_connections: u32,
    header: String,
    scheme: String,
    minter: Minter,
    upstream: Upstream,
    source: OnceLock<Arc<GrantsSource>>,
}

/// What one load of a grants file read: its text and the value of every variable it named,
/// then. A broker in a process of its own loads the same profiles from it
/// ([`crate::apart`]), whatever the file or the environment say later.
pub struct GrantsSource {
    generation: u64,
    text: String,
    env: Vec<(String, Secret)>,
}

impl GrantsSource {
    /// Which load this was: a number no other load in this process has.
    pub fn generation(&self) -> u64 {
        self.generation
    }
    /// The file's text.
    pub fn text(&self) -> &str {
        &self.text
    }
    /// Each variable the file named, with the value it had.
    pub fn env(&self) -> &[(String, Secret)] {
        &self.env
    }
}

impl std::fmt::Debug for GrantsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrantsSource")
            .field("generation", &self.generation)
            .field("bytes", &self.text.len())
            .field(
                "variables",
                &self.env.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .finish()
    }
}

static GENERATION: AtomicU64 = AtomicU64::new(1);

/// What every variable a grants file names reads as in profiles whose secrets another process
/// holds ([`GrantProfiles::parse_held_apart`]): not a secret, and long enough for every
/// credential kind's checks.
pub const HELD_APART: &str = "held-by-the-launcher-and-the-broker-process-not-here";

impl Profile {
    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The API's origin (`https://api.example.com`).
    pub fn base_url(&self) -> &str {
        self.upstream.origin()
    }
    /// The granted routes.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }
    /// Calls a run may make.
    pub fn call_budget(&self) -> u32 {
        self.call_budget
    }
    /// Request body cap.
    pub fn max_request_bytes(&self) -> u64 {
        self.max_request_bytes
    }
    /// Response body cap.
    pub fn max_response_bytes(&self) -> u64 {
        self.max_response_bytes
    }
    /// Connections a run may hold open to its broker at once.
    pub fn max_connections(&self) -> u32 {
        self.max_connections
    }
    /// Timeout of one upstream call.
    pub fn call_timeout(&self) -> Duration {
        self.call_timeout
    }
    /// The header the credential goes in.
    pub fn header(&self) -> &str {
        &self.header
    }
    /// The scheme before the credential in that header (`Bearer`), or empty.
    pub fn scheme(&self) -> &str {
        &self.scheme
    }
    pub(crate) fn minter(&self) -> &Minter {
        &self.minter
    }
    pub(crate) fn upstream(&self) -> &Upstream {
        &self.upstream
    }
    /// True when `caller` may use this profile.
    pub fn allows(&self, caller: &str) -> bool {
        self.callers.contains(caller)
    }
}

/// A request named a grant it may not have. Deliberately says nothing about which case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{GRANT_REFUSED}")]
pub struct GrantRefused;

/// A profile a request may name: an API grant (`[profiles.NAME]`) or an egress grant
/// (`[egress.NAME]`). Names are one namespace.
#[derive(Debug, Clone)]
pub enum Grant {
    /// Calls to listed routes of one API, with a credential the broker attaches.
    Api(Arc<Profile>),
    /// Connections to listed hosts and ports, through the broker's proxy.
    Egress(Arc<EgressProfile>),
}

impl Grant {
    /// The profile's name.
    pub fn name(&self) -> &str {
        match self {
            Grant::Api(p) => p.name(),
            Grant::Egress(p) => p.name(),
        }
    }
    /// The API profile, for an API grant.
    pub fn api(&self) -> Option<&Arc<Profile>> {
        match self {
            Grant::Api(p) => Some(p),
            Grant::Egress(_) => None,
        }
    }
    /// The egress profile, for an egress grant.
    pub fn egress(&self) -> Option<&Arc<EgressProfile>> {
        match self {
            Grant::Egress(p) => Some(p),
            Grant::Api(_) => None,
        }
    }
    /// The load of the grants file this profile came from.
    pub fn source(&self) -> Option<&Arc<GrantsSource>> {
        match self {
            Grant::Api(p) => p.source.get(),
            Grant::Egress(p) => p.source(),
        }
    }
    fn allows(&self, caller: &str) -> bool {
        match self {
            Grant::Api(p) => p.allows(caller),
            Grant::Egress(p) => p.allows(caller),
        }
    }
}

/// Every grant profile the operator defined, by name.
#[derive(Debug, Clone, Default)]
pub struct GrantProfiles {
    profiles: BTreeMap<String, Grant>,
}

pub(crate) fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.')
        })
}

/// A variable a profile may name: `[A-Z_][A-Z0-9_]*`, and never one of plimsoll's own.
fn valid_variable(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_uppercase() || b == b'_')
        && bytes.all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        && !s.starts_with("PLIMSOLL_")
}

/// Headers a profile may not put the credential in: they frame the request itself.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "te",
    "upgrade",
    "accept",
    "accept-encoding",
    "user-agent",
];

impl GrantProfiles {
    /// No profiles: every grant is refused.
    pub fn none() -> Self {
        GrantProfiles::default()
    }

    /// Reads and validates the grants file at `path`. `read_env` reads a variable the file
    /// names (the engine passes `plimsoll_env::get_named_by_grants`); every one must
    /// be set now, so a missing secret fails at start-up, not in the middle of a run.
    pub fn load(
        path: &Path,
        read_env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, LoadGrantsError> {
        let text = std::fs::read_to_string(path).map_err(|source| LoadGrantsError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse_at(&text, path, read_env, None)
    }

    /// [`GrantProfiles::load`] of a file's text.
    pub fn parse(
        text: &str,
        read_env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, LoadGrantsError> {
        Self::parse_at(text, Path::new("<text>"), read_env, None)
    }

    /// The profiles of a grants file's `text` that another process loaded, with its secrets,
    /// as load `generation` of its own (the split daemon's launcher, which loads them into the
    /// broker process): here every variable the file names reads as [`HELD_APART`], and the
    /// profiles' source carries no variable. Such profiles only authorize; their brokers run
    /// in the broker process ([`crate::apart::Apart::remote`]), which holds the real values.
    pub fn parse_held_apart(text: &str, generation: u64) -> Result<Self, LoadGrantsError> {
        Self::parse_at(
            text,
            Path::new("<text>"),
            |_| Some(HELD_APART.to_owned()),
            Some(generation),
        )
    }

    /// The load these profiles came from (none when there is no profile).
    pub fn source(&self) -> Option<&Arc<GrantsSource>> {
        self.profiles.values().find_map(Grant::source)
    }

    /// `held_apart`: the generation of another process's load of the same text, whose
    /// variables this load did not read (so its source keeps none).
    fn parse_at(
        text: &str,
        path: &Path,
        read_env: impl Fn(&str) -> Option<String>,
        held_apart: Option<u64>,
    ) -> Result<Self, LoadGrantsError> {
        let file: GrantsFile = toml::from_str(text).map_err(|e| LoadGrantsError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        // Every variable read, with its value, for the source a broker apart loads from.
        let read = RefCell::new(Vec::<(String, Secret)>::new());
        let read_env = |name: &str| {
            let value = read_env(name);
            if let Some(v) = &value {
                let mut read = read.borrow_mut();
                if !read.iter().any(|(k, _)| k == name) {
                    read.push((name.to_owned(), Secret::new(v.clone())));
                }
            }
            value
        };
        let mut profiles = BTreeMap::new();
        for (name, entry) in file.profiles {
            let profile = validate(&name, entry, &read_env)?;
            if profile.minter().is_static() {
                tracing::warn!(
                    profile = %name,
                    "this grant profile sends a static secret: the same token on every call of \
                     every run, which a run that gets hold of it can use after it ends; use \
                     `kind = \"jwt\"` (minted per run, short-lived) outside development"
                );
            }
            profiles.insert(name, Grant::Api(Arc::new(profile)));
        }
        for (name, entry) in file.egress {
            let invalid = |message: String| LoadGrantsError::Invalid {
                profile: name.clone(),
                message,
            };
            if !valid_name(&name) {
                return Err(invalid(
                    "a profile name is 1 to 64 characters of a-z 0-9 . _ -".into(),
                ));
            }
            if profiles.contains_key(&name) {
                return Err(invalid(
                    "there is also a [profiles] table of this name: a request names one grant, so names are one namespace; rename one".into(),
                ));
            }
            let profile = validate_egress(&name, entry).map_err(invalid)?;
            profiles.insert(name, Grant::Egress(Arc::new(profile)));
        }
        let source = Arc::new(match held_apart {
            Some(generation) => GrantsSource {
                generation,
                text: text.to_owned(),
                env: Vec::new(),
            },
            None => GrantsSource {
                generation: GENERATION.fetch_add(1, Ordering::Relaxed),
                text: text.to_owned(),
                env: read.into_inner(),
            },
        });
        for grant in profiles.values() {
            let _ = match grant {
                Grant::Api(p) => p.source.set(Arc::clone(&source)),
                Grant::Egress(p) => p.set_source(Arc::clone(&source)),
            };
        }
        Ok(GrantProfiles { profiles })
    }

    /// The profile `name` if `caller` may use it. An unknown name and a forbidden one give
    /// the same [`GrantRefused`].
    pub fn authorize(&self, name: &str, caller: &str) -> Result<Grant, GrantRefused> {
        match self.profiles.get(name) {
            Some(p) if p.allows(caller) => Ok(p.clone()),
            _ => Err(GrantRefused),
        }
    }

    /// The profile names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.profiles.keys().map(String::as_str)
    }

    /// True when there is no profile.
    pub fn is_empty(&self) -> bool {
        self.profiles.is_empty()
    }
}

fn validate(
    name: &str,
    e: ProfileEntry,
    read_env: &impl Fn(&str) -> Option<String>,
) -> Result<Profile, LoadGrantsError> {
    let invalid = |message: String| LoadGrantsError::Invalid {
        profile: name.to_owned(),
        message,
    };
    if !valid_name(name) {
        return Err(invalid(
            "a profile name is 1 to 64 characters of a-z 0-9 . _ -".into(),
        ));
    }
    let upstream = Upstream::new(&e.base_url).map_err(invalid)?;
    if e.routes.is_empty() {
        return Err(invalid(
            "`routes` is empty: list the routes it grants, e.g. [\"GET /orders/*\"]".into(),
        ));
    }
    let routes = e
        .routes
        .iter()
        .map(|r| Route::parse(r))
        .collect::<Result<Vec<_>, ParseRouteError>>()
        .map_err(|err| invalid(err.to_string()))?;
    if e.callers.is_empty() {
        return Err(invalid(
            "`callers` is empty: name the callers that may use it (`local` for the CLI's embedded engine)".into(),
        ));
    }
    if let Some(bad) = e.callers.iter().find(|c| !valid_name(c)) {
        return Err(invalid(format!(
            "caller `{bad}` is not a caller name (1 to 64 characters of a-z 0-9 . _ -)"
        )));
    }
    if e.call_budget == 0 || e.call_budget > MAX_CALL_BUDGET {
        return Err(invalid(format!(
            "`call_budget` must be 1 to {MAX_CALL_BUDGET}"
        )));
    }
    let bounded = |key: &str, v: Option<u64>, default: u64, max: u64| match v {
        None => Ok(default),
        Some(v) if (1..=max).contains(&v) => Ok(v),
        Some(_) => Err(invalid(format!("`{key}` must be 1 to {max}"))),
    };
    let max_request_bytes = bounded(
        "max_request_bytes",
        e.max_request_bytes,
        DEFAULT_MAX_REQUEST_BYTES,
        MAX_REQUEST_BYTES,
    )?;
    let max_response_bytes = bounded(
        "max_response_bytes",
        e.max_response_bytes,
        DEFAULT_MAX_RESPONSE_BYTES,
        MAX_RESPONSE_BYTES,
    )?;
    let timeout_ms = bounded(
        "timeout_ms",
        e.timeout_ms,
        DEFAULT_CALL_TIMEOUT.as_millis() as u64,
        600_000,
    )?;
    let max_connections = bounded(
        "max_connections",
        e.max_connections.map(u64::from),
        u64::from(DEFAULT_MAX_CONNECTIONS),
        u64::from(MAX_CONNECTIONS),
    )? as u32;

    let c = e.credential;
    let header = c.header.clone().unwrap_or_else(|| "Authorization".into());
    if header.is_empty()
        || !header
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        || RESERVED_HEADERS.contains(&header.to_ascii_lowercase().as_str())
    {
        return Err(invalid(format!(
            "credential.header `{header}` must be a header name of letters, digits and `-`, and not one that frames the request"
        )));
    }
    let scheme = c.scheme.clone().unwrap_or_else(|| "Bearer".into());
    if !scheme
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(invalid(format!(
            "credential.scheme `{scheme}` must be letters, digits and `-` (or empty)"
        )));
    }
    let read_secret = |key: &str, var: &Option<String>| -> Result<EnvSecret, LoadGrantsError> {
        let var = var.as_deref().ok_or_else(|| {
            invalid(format!(
                "credential.{key} is required for kind `{}`: name the environment variable that holds the secret",
                c.kind
            ))
        })?;
        if !valid_variable(var) {
            return Err(invalid(format!(
                "credential.{key} `{var}` must be an environment variable name ([A-Z_][A-Z0-9_]*) not starting with PLIMSOLL_"
            )));
        }
        read_env(var)
            .filter(|v| !v.is_empty())
            .map(Secret::new)
            .ok_or_else(|| LoadGrantsError::MissingVariable {
                profile: name.to_owned(),
                variable: var.to_owned(),
            })
    };
    let unused = |keys: &[(&str, bool)]| -> Result<(), LoadGrantsError> {
        match keys.iter().find(|(_, set)| *set) {
            Some((key, _)) => Err(invalid(format!(
                "credential.{key} does not apply to kind `{}`",
                c.kind
            ))),
            None => Ok(()),
        }
    };
    let minter = match c.kind.as_str() {
        "static" => {
            unused(&[
                ("key_env", c.key_env.is_some()),
                ("audience", c.audience.is_some()),
                ("issuer", c.issuer.is_some()),
                ("max_lifetime_secs", c.max_lifetime_secs.is_some()),
            ])?;
            let secret = read_secret("secret_env", &c.secret_env)?;
            if !secret.expose().iter().all(|b| b.is_ascii_graphic()) {
                return Err(invalid(format!(
                    "the value of {} must be printable ASCII without spaces (it goes in an HTTP header)",
                    c.secret_env.as_deref().unwrap_or_default()
                )));
            }
            Minter::Static { secret }
        }
        "jwt" => {
            unused(&[("secret_env", c.secret_env.is_some())])?;
            let audience = c
                .audience
                .clone()
                .filter(|a| !a.is_empty())
                .ok_or_else(|| invalid("credential.audience is required for kind `jwt`".into()))?;
            let key = read_secret("key_env", &c.key_env)?;
            if key.expose().len() < MIN_HMAC_KEY_BYTES {
                return Err(invalid(format!(
                    "the HMAC key in {} is shorter than {MIN_HMAC_KEY_BYTES} bytes: use a longer random key (e.g. `openssl rand -hex 32`)",
                    c.key_env.as_deref().unwrap_or_default()
                )));
            }
            if c.max_lifetime_secs == Some(0) {
                return Err(invalid(
                    "credential.max_lifetime_secs must be at least 1".into(),
                ));
            }
            Minter::Jwt {
                key,
                audience,
                issuer: c.issuer.clone(),
                max_lifetime: c.max_lifetime_secs.map(Duration::from_secs),
            }
        }
        other => {
            return Err(invalid(format!(
                "credential.kind `{other}` is not `static` (development) or `jwt`"
            )));
        }
    };
    Ok(Profile {
        name: name.to_owned(),
        routes,
        callers: e.callers.into_iter().collect(),
        call_budget: e.call_budget,
        max_request_bytes,
        max_response_bytes,
        call_timeout: Duration::from_millis(timeout_ms),
        max_connections,
        header,
        scheme,
        minter,
        upstream,
        source: OnceLock::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "0123456789abcdef0123456789abcdef";

    fn env(name: &str) -> Option<String> {
        match name {
            "ORDERS_TOKEN" => Some("tok-123".into()),
            "ORDERS_KEY" => Some(KEY.into()),
            "SHORT_KEY" => Some("short".into()),
            _ => None,
        }
    }

    fn profile(body: &str) -> Result<GrantProfiles, LoadGrantsError> {
        GrantProfiles::parse(&format!("[profiles.orders]\n{body}"), env)
    }

    const GOOD: &str = r#"
base_url = "https://api.example.com"
routes = ["GET /orders/*", "POST /orders"]
callers = ["alice"]
call_budget = 5
[profiles.orders.credential]
kind = "jwt"
key_env = "ORDERS_KEY"
audience = "orders"
"#;

    #[test]
    fn a_complete_file_loads() {
        let g = profile(GOOD).unwrap();
        let p = g.authorize("orders", "alice").unwrap();
        let p = p.api().unwrap();
        assert_eq!(p.base_url(), "https://api.example.com");
        assert_eq!(p.routes().len(), 2);
        assert_eq!(p.call_budget(), 5);
        assert_eq!(p.max_request_bytes(), DEFAULT_MAX_REQUEST_BYTES);
        assert_eq!(p.header(), "Authorization");
        assert_eq!(p.scheme(), "Bearer");
        assert!(!format!("{p:?}").contains(KEY), "Debug shows no secret");
    }

    #[test]
    fn unknown_and_forbidden_profiles_get_the_same_refusal() {
        let g = profile(GOOD).unwrap();
        let unknown = g.authorize("nope", "alice").unwrap_err();
        let forbidden = g.authorize("orders", "mallory").unwrap_err();
        assert_eq!(unknown.to_string(), forbidden.to_string());
        assert_eq!(unknown.to_string(), GRANT_REFUSED);
    }

    #[test]
    fn every_rule_is_enforced() {
        let cases: &[(&str, &str)] = &[
            ("https://api.example.com/v1", "origin"),
            ("http://api.example.com", "https"),
            ("https://user:pw@api.example.com", "user"),
            ("https://api.example.com?x=1", "origin"),
            ("ftp://api.example.com", "http"),
        ];
        for (url, needle) in cases {
            let e = profile(&GOOD.replace("https://api.example.com", url)).unwrap_err();
            assert!(e.to_string().contains(needle), "{url}: {e}");
        }
        for url in [
            "http://127.0.0.1:8080",
            "http://localhost:1",
            "http://[::1]:9",
        ] {
            profile(&GOOD.replace("https://api.example.com", url))
                .unwrap_or_else(|e| panic!("{url}: {e}"));
        }
        let e = profile(&GOOD.replace("ORDERS_KEY", "MISSING_KEY")).unwrap_err();
        assert!(matches!(e, LoadGrantsError::MissingVariable { .. }), "{e}");
        let e = profile(&GOOD.replace("ORDERS_KEY", "SHORT_KEY")).unwrap_err();
        assert!(e.to_string().contains("shorter"), "{e}");
        assert!(
            !e.to_string().contains("short\""),
            "no secret value in errors"
        );
        let e = profile(&GOOD.replace("ORDERS_KEY", "PLIMSOLL_TOKEN")).unwrap_err();
        assert!(e.to_string().contains("PLIMSOLL_"), "{e}");
        let e = profile(&GOOD.replace("call_budget = 5", "call_budget = 0")).unwrap_err();
        assert!(e.to_string().contains("call_budget"), "{e}");
        for n in [0, MAX_CONNECTIONS + 1] {
            let text = GOOD.replace(
                "call_budget = 5",
                &format!("call_budget = 5\nmax_connections = {n}"),
            );
            let e = profile(&text).unwrap_err();
            assert!(e.to_string().contains("max_connections"), "{n}: {e}");
        }
        let text = GOOD.replace(
            "call_budget = 5",
            &format!("call_budget = 5\nmax_connections = {MAX_CONNECTIONS}"),
        );
        let p = profile(&text).unwrap();
        assert_eq!(
            p.authorize("orders", "alice")
                .unwrap()
                .api()
                .unwrap()
                .max_connections(),
            MAX_CONNECTIONS
        );
        let e = profile(&GOOD.replace("[\"alice\"]", "[]")).unwrap_err();
        assert!(e.to_string().contains("callers"), "{e}");
        let e = profile(&GOOD.replace("GET /orders/*", "GET /orders/../x")).unwrap_err();
        assert!(e.to_string().contains("route"), "{e}");
        let e = profile(&GOOD.replace("kind = \"jwt\"", "kind = \"magic\"")).unwrap_err();
        assert!(e.to_string().contains("magic"), "{e}");
        let e = profile(&format!("{GOOD}secret_env = \"ORDERS_TOKEN\"\n")).unwrap_err();
        assert!(e.to_string().contains("does not apply"), "{e}");
        let e = profile(&format!("{GOOD}header = \"Host\"\n")).unwrap_err();
        assert!(e.to_string().contains("header"), "{e}");
        let e = profile(&format!("{GOOD}surprise = 1\n")).unwrap_err();
        assert!(matches!(e, LoadGrantsError::Parse { .. }), "{e}");
        let bad_name = format!(
            "[profiles.Bad]\n{}",
            GOOD.replace("profiles.orders.credential", "profiles.Bad.credential")
        );
        let e = GrantProfiles::parse(&bad_name, env).unwrap_err();
        assert!(e.to_string().contains("name"), "{e}");
    }

    #[test]
    fn the_documented_example_loads() {
        let doc = include_str!("../../../docs/capability-grants.md");
        let start = doc.find("```toml\n").expect("the doc has a TOML example") + 8;
        let example = &doc[start..start + doc[start..].find("```").unwrap()];
        let g = GrantProfiles::parse(example, |name| match name {
            "ORDERS_DEV_TOKEN" => Some("dev-token".into()),
            "ORDERS_JWT_KEY" => Some(KEY.into()),
            _ => None,
        })
        .unwrap_or_else(|e| panic!("the example in docs/capability-grants.md: {e}"));
        assert_eq!(g.names().collect::<Vec<_>>(), ["orders", "orders-dev"]);
        assert!(g.authorize("orders-dev", "local").is_ok());
        assert!(g.authorize("orders", "local").is_err());
    }

    #[test]
    fn a_static_profile_reads_its_secret() {
        let text = r#"
base_url = "http://127.0.0.1:9"
routes = ["GET /x"]
callers = ["local"]
call_budget = 1
[profiles.orders.credential]
kind = "static"
secret_env = "ORDERS_TOKEN"
header = "X-Api-Key"
scheme = ""
"#;
        let g = profile(text).unwrap();
        let p = g.authorize("orders", "local").unwrap();
        let p = p.api().unwrap();
        assert_eq!(p.header(), "X-Api-Key");
        assert_eq!(p.scheme(), "");
        assert!(!format!("{g:?}").contains("tok-123"));
    }

    const EGRESS: &str = r#"
[egress.pypi]
callers = ["alice"]
hosts = ["pypi.org", "*.pythonhosted.org"]
"#;

    #[test]
    fn an_egress_profile_loads_with_its_defaults() {
        let g = GrantProfiles::parse(EGRESS, env).unwrap();
        let p = g.authorize("pypi", "alice").unwrap();
        let p = p.egress().expect("an egress grant");
        assert_eq!(p.ports(), [443]);
        assert!(p.host_rule("pypi.org").is_some());
        assert!(p.host_rule("files.pythonhosted.org").is_some());
        assert!(
            p.host_rule("pythonhosted.org").is_none(),
            "a suffix is not its own match"
        );
        assert!(p.host_rule("evilpypi.org").is_none());
        assert!(p.addresses().is_empty());
        assert!(!p.trials());
        assert_eq!(
            g.authorize("pypi", "mallory").unwrap_err().to_string(),
            GRANT_REFUSED
        );
    }

    #[test]
    fn every_egress_rule_is_enforced() {
        let cases: &[(&str, &str)] = &[
            ("callers = [\"alice\"]", "callers = []"),
            (
                "hosts = [\"pypi.org\", \"*.pythonhosted.org\"]",
                "hosts = []",
            ),
            ("pypi.org\"", "10.0.0.1\""),
            ("pypi.org\"", "pypi.*\""),
        ];
        for (from, to) in cases {
            let text = EGRESS.replace(from, to);
            assert!(
                GrantProfiles::parse(&text, env).is_err(),
                "{to} must be refused"
            );
        }
        for extra in [
            "ports = []",
            "ports = [0]",
            "addresses = [\"10.0.0.0/33\"]",
            "addresses = [\"pypi.org\"]",
            "resolve = { \"10.0.0.1\" = [\"10.0.0.1\"] }",
            "resolve = { \"a.test\" = [] }",
            "resolve = { \"a.test\" = [\"nope\"] }",
            "max_connections = 0",
            "max_connections = 10001",
            "max_open = 65",
            "max_bytes_up = 0",
            "max_connection_secs = 0",
            "surprise = 1",
        ] {
            let text = format!("{EGRESS}{extra}\n");
            assert!(
                GrantProfiles::parse(&text, env).is_err(),
                "{extra} must be refused"
            );
        }
        let both = format!("{EGRESS}\n[profiles.pypi]\n{GOOD}")
            .replace("profiles.orders.credential", "profiles.pypi.credential");
        let e = GrantProfiles::parse(&both, env).unwrap_err();
        assert!(e.to_string().contains("namespace"), "{e}");
    }

    #[test]
    fn the_documented_egress_example_loads() {
        let doc = include_str!("../../../docs/capability-grants.md");
        let start = doc
            .find("```toml\n[egress.")
            .expect("the doc has an egress example")
            + 8;
        let example = &doc[start..start + doc[start..].find("```").unwrap()];
        let g = GrantProfiles::parse(example, |_| None)
            .unwrap_or_else(|e| panic!("the egress example in docs/capability-grants.md: {e}"));
        let p = g.authorize("pypi", "alice").unwrap();
        let p = p.egress().unwrap();
        assert_eq!(p.max_open(), 16);
        assert!(p.pinned("mirror.internal").is_some());
    }
}
