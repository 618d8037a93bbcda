//! The upstream HTTP call: a small blocking client (ureq) per profile, with redirects off,
//! no proxy (a proxy from the environment would see the credential), a timeout on every
//! call, and a cap on the response body.

use std::net::IpAddr;
use std::time::Duration;

use ureq::http::{self, HeaderValue, Uri};

use crate::credential::Credential;

/// The API of one profile: its origin and the agent that calls it (connections are pooled
/// across runs).
#[derive(Debug)]
pub(crate) struct Upstream {
    origin: String,
    agent: ureq::Agent,
}

/// One call as the broker decided it.
#[derive(Debug)]
pub(crate) struct Call<'a> {
    pub method: &'static str,
    /// The canonical path with its query, checked already.
    pub path: &'a str,
    /// JSON bytes, for POST, PUT and PATCH.
    pub body: Option<Vec<u8>>,
    pub header: &'a str,
    pub scheme: &'a str,
    pub credential: &'a Credential,
    pub timeout: Duration,
    pub max_response_bytes: u64,
}

/// The API's answer: its status and body (at most the cap).
#[derive(Debug)]
pub(crate) struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

/// The call got no usable answer. Messages go to the sandbox, so they name no host detail.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallUpstreamError {
    /// No answer within the timeout.
    #[error("the API did not answer within {0:?}")]
    Timeout(Duration),
    /// The body was over the cap.
    #[error("the API's response is larger than this grant's cap of {0} bytes")]
    TooLarge(u64),
    /// Anything else (connection refused, TLS, a malformed response).
    #[error("the API could not be reached or sent a malformed response")]
    Failed(#[source] ureq::Error),
}

fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

impl Upstream {
    /// Checks `base_url` (an origin only: scheme, host, port; https unless the host is
    /// loopback) and builds its agent.
    pub fn new(base_url: &str) -> Result<Upstream, String> {
        let err = |why: &str| format!("base_url `{base_url}`: {why}");
        let uri: Uri = base_url
            .parse()
            .map_err(|_| err("not a URL: write an origin such as https://api.example.com"))?;
        let scheme = uri
            .scheme_str()
            .ok_or_else(|| err("no scheme: write https://..."))?;
        if scheme != "https" && scheme != "http" {
            return Err(err(
                "the scheme must be https (or http for a loopback host)",
            ));
        }
        let authority = uri
            .authority()
            .ok_or_else(|| err("no host: write an origin such as https://api.example.com"))?;
        if authority.as_str().contains('@') {
            return Err(err(
                "user information is not allowed: the broker attaches the credential",
            ));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() || base_url.contains('#') {
            return Err(err(
                "it must be an origin only (no path, query or fragment): routes carry the path",
            ));
        }
        let host = authority.host();
        if host.is_empty() {
            return Err(err("no host"));
        }
        if scheme == "http" && !is_loopback(host) {
            return Err(err(
                "plain http is only allowed to a loopback host: use https",
            ));
        }
        let origin = format!("{scheme}://{}", authority.as_str().to_ascii_lowercase());
        let config = ureq::Agent::config_builder()
            .max_redirects(0)
            .http_status_as_error(false)
            .proxy(None)
            .https_only(scheme == "https")
            .user_agent("plimsoll-broker")
            .save_redirect_history(false)
            .build();
        Ok(Upstream {
            origin,
            agent: config.into(),
        })
    }

    /// The origin calls go to.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Makes the call. A redirect is an answer like any other (its status goes back to the
    /// sandbox; its `Location` does not, and it is never followed).
    pub fn call(&self, c: &Call<'_>) -> Result<Answer, CallUpstreamError> {
        let url = format!("{}{}", self.origin, c.path);
        let mut auth = if c.scheme.is_empty() {
            HeaderValue::from_str(c.credential.expose())
        } else {
            HeaderValue::from_str(&format!("{} {}", c.scheme, c.credential.expose()))
        }
        // Checked at load (static) or made of base64url (JWT): always a valid header.
        .expect("a credential is a valid header value");
        auth.set_sensitive(true);
        let builder = http::Request::builder()
            .method(c.method)
            .uri(url.as_str())
            .header(c.header, auth)
            .header("accept", "application/json");
        match &c.body {
            Some(body) => {
                let request = builder
                    .header("content-type", "application/json")
                    .body(body.as_slice())
                    .map_err(|e| CallUpstreamError::Failed(ureq::Error::Http(e)))?;
                self.send(request, c)
            }
            None => {
                let request = builder
                    .body(())
                    .map_err(|e| CallUpstreamError::Failed(ureq::Error::Http(e)))?;
                self.send(request, c)
            }
        }
    }

    fn send<S: ureq::AsSendBody>(
        &self,
        request: http::Request<S>,
        c: &Call<'_>,
    ) -> Result<Answer, CallUpstreamError> {
        let request = self
            .agent
            .configure_request(request)
            .timeout_global(Some(c.timeout))
            .build();
        let response = self.agent.run(request).map_err(|e| classify(e, c))?;
        let status = response.status().as_u16();
        let mut body = response.into_body();
        let body = body
            .with_config()
            .limit(c.max_response_bytes)
            .read_to_vec()
            .map_err(|e| classify(e, c))?;
        Ok(Answer { status, body })
    }
}

fn classify(e: ureq::Error, c: &Call<'_>) -> CallUpstreamError {
    match e {
        ureq::Error::Timeout(_) => CallUpstreamError::Timeout(c.timeout),
        ureq::Error::BodyExceedsLimit(_) => CallUpstreamError::TooLarge(c.max_response_bytes),
        other => CallUpstreamError::Failed(other),
    }
}
