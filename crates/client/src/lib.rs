//! The official Rust client of plimsolld: a blocking client that sends a fresh request id
//! with every run, honours a "not dispatched" mark only when the answer echoes that id,
//! recomputes the request, result and record digests, and re-checks the tier against the
//! floor it held the run to: the one it asked for, or, none asked for, the daemon's default
//! floor, learnt once from `GET /v1/providers`.
//!
//! ```no_run
//! use plimsoll_client::{Client, RunOptions, Token};
//! use plimsoll_wire::{Language, Tier, not_dispatched_reason};
//!
//! let client = Client::new("http://127.0.0.1:7878", Token::new("plm_..."));
//! let opts = RunOptions::snippet(Language::Python, "print(1)").min_isolation(Tier::Container);
//! match client.run(opts) {
//!     Ok(resp) => println!("ran on {} ({})", resp.provider, resp.isolation),
//!     Err(e) => match not_dispatched_reason(&e) {
//!         Some(reason) => eprintln!("nothing ran ({reason}): {e}"),
//!         None => eprintln!("may have run: {e}"),
//!     },
//! }
//! ```

mod error;
mod session;
mod token;
mod trial;
mod verify;

use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use plimsoll_wire::{
    ErrorResponse, Language, Limits, OutputChunk, PROTOCOL, ProvidersResponse, Reason, RunRequest,
    RunResponse, RunSpec, Snippet, StreamLine, Tier,
};

pub use error::{ClientError, DigestKind, ProvidersError};
pub use session::{Session, SessionOptions};
pub use token::Token;
pub use trial::{TrialOptions, TrialRequestError};
pub use verify::{check_image, check_tier, verify_response, verify_response_held_to};

/// Largest answer read from the daemon (outputs and artifacts can be large).
const MAX_ANSWER_BYTES: u64 = 1 << 30;
/// How long to wait for a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Added to the run's own timeout (or the protocol's largest) for the whole exchange.
const EXCHANGE_SLACK: Duration = Duration::from_secs(120);
/// The largest request body a client sends unless told otherwise: the daemon's default
/// `[daemon].max_body_bytes` (8 MiB). A larger one would be refused with `413`.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
/// The exchange budget of a run that sets no timeout: the built-in maximum timeout.
const DEFAULT_RUN_BUDGET: Duration = Duration::from_secs(600);

/// What to run and under which floor; the client adds the protocol and a fresh request id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOptions {
    /// What to run.
    pub run: RunSpec,
    /// The floor. `None` takes the daemon's default floor: the client learns it from
    /// `GET /v1/providers` before the first such run (once per client, again only after a
    /// failure) and holds the answer to it as to a floor it sent; when it cannot learn it, it
    /// sends nothing ([`ClientError::FloorUnknown`]).
    pub minimum_isolation: Option<Tier>,
    /// Run on this provider only.
    pub provider: Option<String>,
    /// Limits to ask for.
    pub limits: Option<Limits>,
    /// A grant profile name.
    pub grant: Option<String>,
    /// The image to run in (a name or an identity); the daemon's default image when `None`.
    /// The record must name it, or the answer is an evidence mismatch.
    pub image: Option<String>,
}

impl RunOptions {
    /// Options that run `code` in `language`, with no floor, provider, limits or grant.
    pub fn snippet(language: Language, code: impl Into<String>) -> Self {
        RunOptions::new(RunSpec::Snippet(Snippet {
            language,
            code: code.into(),
        }))
    }

    /// Options that run `run`.
    pub fn new(run: RunSpec) -> Self {
        RunOptions {
            run,
            minimum_isolation: None,
            provider: None,
            limits: None,
            grant: None,
            image: None,
        }
    }

    /// Names the image to run in: a name or an identity (`sha256:...`).
    pub fn image(mut self, image: impl Into<String>) -> Self {
        self.image = Some(image.into());
        self
    }

    /// Sets the floor.
    pub fn min_isolation(mut self, floor: Tier) -> Self {
        self.minimum_isolation = Some(floor);
        self
    }

    /// Names the provider.
    pub fn provider(mut self, name: impl Into<String>) -> Self {
        self.provider = Some(name.into());
        self
    }

    /// Asks for a wall timeout.
    pub fn timeout_ms(mut self, ms: u64) -> Self {
        self.limits.get_or_insert_with(Limits::default).timeout_ms = Some(ms);
        self
    }

    /// The request these options make, with this id.
    pub fn into_request(self, request_id: String) -> RunRequest {
        RunRequest {
            image: self.image,
            protocol: PROTOCOL,
            request_id,
            minimum_isolation: self.minimum_isolation,
            provider: self.provider,
            limits: self.limits,
            run: self.run,
            grant: self.grant,
        }
    }
}

impl From<RunRequest> for RunOptions {
    /// Takes a request's content; its protocol and id are replaced when it is sent.
    fn from(r: RunRequest) -> Self {
        RunOptions {
            run: r.run,
            minimum_isolation: r.minimum_isolation,
            provider: r.provider,
            limits: r.limits,
            grant: r.grant,
            image: r.image,
        }
    }
}

/// A fresh request id: 128 random bits in lowercase hex.
pub fn new_request_id() -> String {
    let bytes: [u8; 16] = rand::random();
    hex::encode(bytes)
}

/// A client of one daemon. Cheap to clone; blocking; safe to share between threads.
#[derive(Debug, Clone)]
pub struct Client {
    base_url: String,
    token: Token,
    agent: ureq::Agent,
    max_body_bytes: usize,
    /// The daemon's default floor once learnt, shared by this client's clones.
    default_floor: Arc<Mutex<Option<Tier>>>,
}

/// How an exchange ended before an answer could be read.
enum Exchange {
    /// Certainly nothing was sent.
    NotSent(String),
    /// The request may have reached the daemon.
    MaySent(String),
}

impl Client {
    /// A client of the daemon at `base_url` (e.g. `http://127.0.0.1:7878`), presenting `token`.
    pub fn new(base_url: impl Into<String>, token: impl Into<Token>) -> Self {
        let config = ureq::Agent::config_builder()
            // Statuses are answers to read, not errors.
            .http_status_as_error(false)
            // No proxy from the environment: every variable read is declared (and a proxy
            // would blur "connection refused" into "may have run").
            .proxy(None)
            // A fresh connection per exchange, so a connect failure proves nothing was sent.
            .max_idle_connections(0)
            .max_idle_connections_per_host(0)
            // Redirects are answers too; a POST is never replayed elsewhere.
            .max_redirects(0)
            .max_redirects_will_error(false)
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .user_agent(concat!("plimsoll-client/", env!("CARGO_PKG_VERSION")))
            .build();
        Client {
            base_url: base_url.into().trim_end_matches('/').to_owned(),
            token: token.into(),
            agent: config.new_agent(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            default_floor: Arc::default(),
        }
    }

    /// Sets the largest request body this client sends (default [`DEFAULT_MAX_BODY_BYTES`]);
    /// set it to the daemon's `[daemon].max_body_bytes` when that differs. A larger request is
    /// refused here ([`ClientError::InvalidRequest`], not dispatched) and nothing is sent.
    pub fn with_max_body_bytes(mut self, bytes: usize) -> Self {
        self.max_body_bytes = bytes;
        self
    }

    /// The largest request body this client sends.
    pub fn max_body_bytes(&self) -> usize {
        self.max_body_bytes
    }

    /// The daemon's base URL.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Runs a request and verifies its answer (see [`verify_response_held_to`]) against the
    /// floor it sets, or, none set, the daemon's default floor ([`Client::default_floor`]).
    /// Blocks until the run is over.
    pub fn run(&self, options: impl Into<RunOptions>) -> Result<RunResponse, ClientError> {
        let request = options.into().into_request(new_request_id());
        let (body, sent) = self.prepare(&request, false)?;
        let floor = self.floor_of(&sent)?;
        let (status, bytes) = self.exchange(
            "POST",
            "/v1/runs",
            Some(&body),
            &[],
            run_budget(&sent),
            &sent.request_id,
        )?;
        self.verified(&sent, floor, status, &bytes)
    }

    /// Examines a controller against a simulator the run's image declares, on scenarios
    /// (docs/simulators.md), as `plimsoll trial` does: one project of one trial step
    /// ([`TrialOptions::project`]), sent and verified as [`Client::run`] sends and verifies
    /// any run. The verdict is `record.trials[0]` (the simulator's name, version and SHA-256,
    /// each trial's end, reason, ticks, score and fingerprint), and the trajectories are
    /// `result.artifacts`, in the scenarios' order. What the runner could not take is
    /// refused here, unsent ([`ClientError::InvalidRequest`]); a simulator the image does not
    /// declare is refused by the daemon ([`ClientError::Refused`], reason `environment`). A
    /// failed exam is a result: the runner's step exits 1 and the record says which trial
    /// failed and why.
    pub fn trial(&self, trial: TrialOptions) -> Result<RunResponse, ClientError> {
        let options = trial
            .into_run_options()
            .map_err(|e| ClientError::InvalidRequest {
                request_id: new_request_id(),
                message: format!("{e}; nothing was sent"),
            })?;
        self.run(options)
    }

    /// [`Client::run`], streamed: each chunk of the run's output goes to `on_chunk` as the
    /// daemon sends it (a preview, in no digest), and the final answer is verified as
    /// [`Client::run`] verifies it. Dropping the connection (a timeout here, or this process
    /// going away) cancels the run on the daemon.
    pub fn run_streamed(
        &self,
        options: impl Into<RunOptions>,
        on_chunk: &mut dyn FnMut(&OutputChunk),
    ) -> Result<RunResponse, ClientError> {
        let request = options.into().into_request(new_request_id());
        let (body, sent) = self.prepare(&request, false)?;
        let floor = self.floor_of(&sent)?;
        self.post_streamed("/v1/runs", &body, &sent, floor, on_chunk)
    }

    /// The floor the daemon gives a run that sets none, from `GET /v1/providers`: asked once
    /// per client (its clones share it), again only after a failure.
    pub fn default_floor(&self) -> Result<Tier, ProvidersError> {
        let known = *self
            .default_floor
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(floor) = known {
            return Ok(floor);
        }
        let floor = self.providers()?.default_floor;
        *self
            .default_floor
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(floor);
        Ok(floor)
    }

    /// The floor `sent` is held to: its own, or the daemon's default floor; when that cannot
    /// be learnt, the refusal (nothing sent).
    fn floor_of(&self, sent: &RunRequest) -> Result<Tier, ClientError> {
        match sent.minimum_isolation {
            Some(floor) => Ok(floor),
            None => self.learnt_floor(&sent.request_id),
        }
    }

    /// The daemon's default floor for the request `request_id` that sets none; when it
    /// cannot be learnt, the refusal (nothing sent).
    pub(crate) fn learnt_floor(&self, request_id: &str) -> Result<Tier, ClientError> {
        self.default_floor().map_err(|e| {
            let (reason, code) = match &e {
                ProvidersError::Unreachable { url, message } => {
                    return ClientError::Unreachable {
                        url: url.clone(),
                        message: message.clone(),
                    };
                }
                ProvidersError::Refused {
                    code,
                    not_dispatched,
                    ..
                } => (
                    not_dispatched.unwrap_or(Reason::Environment),
                    Some(code.clone()),
                ),
                ProvidersError::Transport { .. } | ProvidersError::BadResponse { .. } => {
                    (Reason::Environment, None)
                }
            };
            ClientError::FloorUnknown {
                request_id: request_id.to_owned(),
                reason,
                code,
                message: e.to_string(),
            }
        })
    }

    /// POSTs `body` (`sent` as serialised) to `path` asking for NDJSON, hands every chunk
    /// line to `on_chunk`, skips keep-alive (empty) lines, and verifies the final response
    /// line against `sent`; an error line is read as an error answer is. A daemon that
    /// answers whole (a refusal before the engine) is read as such.
    pub(crate) fn post_streamed(
        &self,
        path: &str,
        body: &[u8],
        sent: &RunRequest,
        floor: Tier,
        on_chunk: &mut dyn FnMut(&OutputChunk),
    ) -> Result<RunResponse, ClientError> {
        use std::io::BufRead as _;
        let id = sent.request_id.clone();
        let url = format!("{}{path}", self.base_url);
        let answer = self.send(
            "POST",
            &url,
            Some(body),
            &[("accept", "application/x-ndjson")],
            run_budget(sent),
        );
        let mut response = answer.map_err(|e| {
            if nothing_was_sent(&e) {
                ClientError::Unreachable {
                    url: url.clone(),
                    message: e.to_string(),
                }
            } else {
                ClientError::Transport {
                    request_id: id.clone(),
                    url: url.clone(),
                    message: e.to_string(),
                }
            }
        })?;
        let status = response.status().as_u16();
        let streamed = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("application/x-ndjson"));
        let transport = |message: String| ClientError::Transport {
            request_id: id.clone(),
            url: url.clone(),
            message,
        };
        let mut reader = std::io::BufReader::new(
            response
                .body_mut()
                .with_config()
                .limit(MAX_ANSWER_BYTES)
                .reader(),
        );
        if status != 200 || !streamed {
            let mut bytes = Vec::new();
            io::Read::read_to_end(&mut reader, &mut bytes)
                .map_err(|e| transport(format!("reading the answer: {e}")))?;
            return self.verified(sent, floor, status, &bytes);
        }
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = reader
                .read_until(b'\n', &mut line)
                .map_err(|e| transport(format!("reading the stream: {e}")))?;
            if n == 0 {
                return Err(transport("the stream ended before its answer".into()));
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let parsed: StreamLine =
                serde_json::from_slice(&line).map_err(|e| ClientError::BadResponse {
                    request_id: id.clone(),
                    status,
                    message: format!("not a stream line: {e}"),
                })?;
            match parsed {
                StreamLine::Chunk(c) => on_chunk(&c.chunk),
                StreamLine::Response(resp) => return verify_response_held_to(sent, floor, *resp),
                StreamLine::Error(e) => {
                    // The stream's own status was 200; the error line is the answer.
                    let bytes = serde_json::to_vec(&e).unwrap_or_default();
                    return Err(refusal(&id, status, &bytes));
                }
            }
        }
    }

    /// The body of `request` and the request as that body reads back (what digests are
    /// recomputed over), or a refusal before anything is sent.
    pub(crate) fn prepare(
        &self,
        request: &RunRequest,
        validated: bool,
    ) -> Result<(Vec<u8>, RunRequest), ClientError> {
        let request_id = request.request_id.clone();
        if !validated {
            request
                .validate()
                .map_err(|r| ClientError::InvalidRequest {
                    request_id: request_id.clone(),
                    message: r.message,
                })?;
        }
        let body = serde_json::to_vec(request).map_err(|e| ClientError::InvalidRequest {
            request_id: request_id.clone(),
            message: format!("the request does not serialise: {e}"),
        })?;
        // Over the daemon's limit it would be refused after being sent, and the refusal may
        // arrive as a closed connection ("may have run"): refuse it here, sending nothing.
        if body.len() > self.max_body_bytes {
            return Err(ClientError::InvalidRequest {
                request_id,
                message: format!(
                    "the request is {} bytes, over this client's limit of {} bytes (the daemon's max_body_bytes): send less, or raise the limit to match the daemon's",
                    body.len(),
                    self.max_body_bytes
                ),
            });
        }
        // Digests are recomputed over exactly the bytes that leave this process.
        let sent: RunRequest =
            serde_json::from_slice(&body).map_err(|e| ClientError::InvalidRequest {
                request_id: request_id.clone(),
                message: format!("the request does not read back: {e}"),
            })?;
        Ok((body, sent))
    }

    /// One exchange with the daemon: `method` on `path` with `body` (JSON unless a header
    /// says otherwise), within `budget`. The answer's status and bytes, or why there is none
    /// (nothing sent, or sent and unanswered).
    pub(crate) fn exchange(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        headers: &[(&str, &str)],
        budget: Duration,
        request_id: &str,
    ) -> Result<(u16, Vec<u8>), ClientError> {
        let url = format!("{}{path}", self.base_url);
        let answer = self.send(method, &url, body, headers, budget);
        read_answer(answer).map_err(|e| match e {
            Exchange::NotSent(message) => ClientError::Unreachable { url, message },
            Exchange::MaySent(message) => ClientError::Transport {
                request_id: request_id.to_owned(),
                url,
                message,
            },
        })
    }

    /// Sends one request; the raw answer.
    pub(crate) fn send(
        &self,
        method: &str,
        url: &str,
        body: Option<&[u8]>,
        headers: &[(&str, &str)],
        budget: Duration,
    ) -> Result<ureq::http::Response<ureq::Body>, ureq::Error> {
        let auth = format!("Bearer {}", self.token.expose());
        macro_rules! headed {
            ($req:expr) => {{
                let mut req = $req.header("authorization", &auth);
                for (k, v) in headers {
                    req = req.header(*k, *v);
                }
                req.config().timeout_global(Some(budget)).build()
            }};
        }
        let typed = headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"));
        match (method, body) {
            ("GET", _) => headed!(self.agent.get(url)).call(),
            ("DELETE", _) => headed!(self.agent.delete(url)).call(),
            ("PUT", Some(b)) => headed!(self.agent.put(url)).send(b),
            (_, b) => {
                let mut req = self.agent.post(url);
                if !typed {
                    req = req.header("content-type", "application/json");
                }
                headed!(req).send(b.unwrap_or_default())
            }
        }
    }

    /// A run response verified against `sent` held to `floor`, or the error an answer of
    /// `status` says.
    pub(crate) fn verified(
        &self,
        sent: &RunRequest,
        floor: Tier,
        status: u16,
        bytes: &[u8],
    ) -> Result<RunResponse, ClientError> {
        if status == 200 {
            let response: RunResponse =
                serde_json::from_slice(bytes).map_err(|e| ClientError::BadResponse {
                    request_id: sent.request_id.clone(),
                    status,
                    message: format!("not a run response: {e}"),
                })?;
            return verify_response_held_to(sent, floor, response);
        }
        Err(refusal(&sent.request_id, status, bytes))
    }

    /// True when the daemon answers `GET /readyz` with `200` (every provider probed, at least
    /// one available); false when it is not ready or cannot be reached.
    pub fn is_ready(&self) -> bool {
        let url = format!("{}/readyz", self.base_url);
        let answer = self
            .agent
            .get(&url)
            .config()
            .timeout_global(Some(CONNECT_TIMEOUT))
            .build()
            .call();
        matches!(read_answer(answer), Ok((200, _)))
    }

    /// The daemon's providers, their tiers, availability and evidence.
    pub fn providers(&self) -> Result<ProvidersResponse, ProvidersError> {
        let url = format!("{}/v1/providers", self.base_url);
        let answer = self
            .agent
            .get(&url)
            .header("authorization", format!("Bearer {}", self.token.expose()))
            .config()
            .timeout_global(Some(EXCHANGE_SLACK))
            .build()
            .call();
        let (status, bytes) = read_answer(answer).map_err(|e| match e {
            Exchange::NotSent(message) => ProvidersError::Unreachable {
                url: url.clone(),
                message,
            },
            Exchange::MaySent(message) => ProvidersError::Transport {
                url: url.clone(),
                message,
            },
        })?;
        if status == 200 {
            return serde_json::from_slice(&bytes).map_err(|e| ProvidersError::BadResponse {
                url,
                status,
                message: format!("not a providers response: {e}"),
            });
        }
        match serde_json::from_slice::<ErrorResponse>(&bytes) {
            Ok(answer) => Err(ProvidersError::Refused {
                url,
                status,
                code: answer.error.code,
                message: answer.error.message,
                not_dispatched: answer.error.not_dispatched,
            }),
            Err(e) => Err(ProvidersError::BadResponse {
                url,
                status,
                message: format!("not an error response ({e}): {}", preview(&bytes)),
            }),
        }
    }
}

/// The exchange budget of a request: its timeout (or the largest), plus slack.
pub(crate) fn run_budget(request: &RunRequest) -> Duration {
    request
        .limits
        .as_ref()
        .and_then(|l| l.timeout_ms)
        .map_or(DEFAULT_RUN_BUDGET, Duration::from_millis)
        + EXCHANGE_SLACK
}

/// The error an answer other than `200` says to the request `request_id`: a refusal only
/// when its mark comes with that id echoed.
pub(crate) fn refusal(request_id: &str, status: u16, bytes: &[u8]) -> ClientError {
    let answer: ErrorResponse = match serde_json::from_slice(bytes) {
        Ok(a) => a,
        Err(e) => {
            return ClientError::BadResponse {
                request_id: request_id.to_owned(),
                status,
                message: format!("not an error response ({e}): {}", preview(bytes)),
            };
        }
    };
    let error = answer.error;
    match error.not_dispatched {
        Some(reason) if answer.request_id.as_deref() == Some(request_id) => ClientError::Refused {
            request_id: request_id.to_owned(),
            reason,
            code: error.code,
            message: error.message,
            end_reason: error.end_reason,
        },
        Some(reason) => ClientError::UnverifiedRefusal {
            sent: request_id.to_owned(),
            echoed: answer.request_id,
            reason,
            message: error.message,
        },
        None => ClientError::Failed {
            request_id: request_id.to_owned(),
            status,
            code: error.code,
            message: error.message,
        },
    }
}

/// Reads a whole answer, or says whether the request could have been sent.
fn read_answer(
    answer: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
) -> Result<(u16, Vec<u8>), Exchange> {
    let mut response = answer.map_err(|e| {
        if nothing_was_sent(&e) {
            Exchange::NotSent(e.to_string())
        } else {
            Exchange::MaySent(e.to_string())
        }
    })?;
    let status = response.status().as_u16();
    let bytes = response
        .body_mut()
        .with_config()
        .limit(MAX_ANSWER_BYTES)
        .read_to_vec()
        .map_err(|e| Exchange::MaySent(format!("reading the answer: {e}")))?;
    Ok((status, bytes))
}

/// True only for failures that can happen only before a connection exists: a bad URL, a name
/// that does not resolve, a refused or timed-out connect. The agent keeps no idle connections and
/// uses no proxy, so each exchange opens its own connection to the daemon itself, and no
/// byte of the request is written before that connection is up.
fn nothing_was_sent(e: &ureq::Error) -> bool {
    match e {
        ureq::Error::BadUri(_) | ureq::Error::HostNotFound => true,
        ureq::Error::Timeout(t) => matches!(t, ureq::Timeout::Resolve | ureq::Timeout::Connect),
        ureq::Error::Io(io) => matches!(
            io.kind(),
            // TCP reports a refusal only to a connect (a reset after it is ECONNRESET or
            // EPIPE); unreachable kinds can also end an established connection, so they
            // stay "may have run".
            io::ErrorKind::ConnectionRefused | io::ErrorKind::AddrNotAvailable
        ),
        _ => false,
    }
}

/// The start of a body, for messages.
fn preview(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]);
    text.escape_debug().to_string()
}
