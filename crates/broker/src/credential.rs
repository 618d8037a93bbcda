//! Secrets and credentials: what the daemon reads from its environment for a profile, and
//! the credential minted from it for one run. Neither prints (`Debug` and `Display` say
//! `<redacted>`), neither serialises, both are zeroed on drop (both are the one
//! [`Secret`] type), and the only way to the bytes is an explicit `expose()`, called in one
//! place: the header of the upstream request.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac as _};
pub use plimsoll_secret::Secret;
use plimsoll_wire::CredentialKind;
use sha2::Sha256;

/// A secret read from the daemon's environment: a static API token, or an HMAC key. The one
/// secret type, holding bytes.
pub type EnvSecret = Secret<Vec<u8>>;

/// The credential of one run, as the broker attaches it (the header value's token): the one
/// secret type. Read through [`Secret::expose`] only to build the upstream request's header
/// (or, in tests, to look for it where it must not be).
pub type Credential = Secret;

/// How a profile mints a run's credential.
#[derive(Debug, Clone)]
pub enum Minter {
    /// The same secret for every run: for development only.
    Static {
        /// The secret, read from the variable the profile names.
        secret: EnvSecret,
    },
    /// An HS256 JWT per run: subject = the caller, the profile's audience, the run's id
    /// (`plimsoll_run`), a random id, and an expiry no later than the end of the run's budget.
    Jwt {
        /// The HMAC key, read from the variable the profile names.
        key: EnvSecret,
        /// `aud`.
        audience: String,
        /// `iss`, when set.
        issuer: Option<String>,
        /// A cap on the lifetime shorter than the run's budget, when set.
        max_lifetime: Option<Duration>,
    },
}

/// The shortest HMAC key a JWT profile accepts (RFC 7518 §3.2: at least the hash size).
pub const MIN_HMAC_KEY_BYTES: usize = 32;

impl Minter {
    /// Whether this mints the same static secret for every run (development only); the
    /// result lists it on every call, so a reader of the run's evidence sees it.
    pub fn is_static(&self) -> bool {
        matches!(self, Minter::Static { .. })
    }

    /// The kind of credential this hands out, as every call the result lists names it.
    pub fn kind(&self) -> CredentialKind {
        match self {
            Minter::Static { .. } => CredentialKind::Static,
            Minter::Jwt { .. } => CredentialKind::Minted,
        }
    }

    /// The credential of run `run_id` by `caller` that started at `now` and may last
    /// `budget`.
    pub fn mint(
        &self,
        caller: &str,
        run_id: &str,
        now: SystemTime,
        budget: Duration,
    ) -> Credential {
        match self {
            Minter::Static { secret } => {
                Credential::new(String::from_utf8_lossy(secret.expose()).into_owned())
            }
            Minter::Jwt {
                key,
                audience,
                issuer,
                max_lifetime,
            } => {
                let now_ms = now
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_millis() as u64;
                let iat = now_ms / 1000;
                // The token dies no later than the run: the end of the budget, rounded down.
                let mut exp = (now_ms + budget.as_millis() as u64) / 1000;
                if let Some(cap) = max_lifetime {
                    exp = exp.min(iat + cap.as_secs());
                }
                let jti: [u8; 16] = rand::random();
                let mut claims = serde_json::Map::new();
                if let Some(iss) = issuer {
                    claims.insert("iss".into(), iss.as_str().into());
                }
                claims.insert("sub".into(), caller.into());
                // Binds the token to the run: the daemon logs this id with each of the run's
                // grant calls, so the API can tell which run a token was minted for.
                claims.insert("plimsoll_run".into(), run_id.into());
                claims.insert("aud".into(), audience.as_str().into());
                claims.insert("iat".into(), iat.into());
                claims.insert("nbf".into(), iat.into());
                claims.insert("exp".into(), exp.into());
                claims.insert("jti".into(), hex::encode(jti).into());
                let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
                let payload = URL_SAFE_NO_PAD.encode(
                    serde_json::to_vec(&serde_json::Value::Object(claims))
                        .expect("claims serialise"),
                );
                let signing_input = format!("{header}.{payload}");
                let mut mac = Hmac::<Sha256>::new_from_slice(key.expose())
                    .expect("HMAC takes a key of any length");
                mac.update(signing_input.as_bytes());
                let signature = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
                Credential::new(format!("{signing_input}.{signature}"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_prints_the_secret() {
        let s = Secret::new("s3cr3t-value");
        assert_eq!(format!("{s:?}"), "<redacted>");
        let m = Minter::Static { secret: s };
        assert!(!format!("{m:?}").contains("s3cr3t"));
        assert!(m.is_static());
        assert_eq!(m.kind(), CredentialKind::Static);
        let c = m.mint("alice", "run-1", SystemTime::now(), Duration::from_secs(5));
        assert_eq!(c.expose(), "s3cr3t-value");
        assert_eq!(format!("{c:?} {c}"), "<redacted> <redacted>");
    }

    #[test]
    fn a_jwt_carries_the_claims_and_dies_with_the_run() {
        let m = Minter::Jwt {
            key: Secret::new(vec![7u8; 32]),
            audience: "orders-api".into(),
            issuer: Some("plimsoll".into()),
            max_lifetime: None,
        };
        let now = UNIX_EPOCH + Duration::from_millis(1_700_000_000_700);
        let token = m.mint("alice", "run-7", now, Duration::from_millis(2_500));
        let parts: Vec<&str> = token.expose().split('.').collect();
        assert_eq!(parts.len(), 3);
        let claims: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
        assert_eq!(claims["sub"], "alice");
        assert_eq!(claims["plimsoll_run"], "run-7", "bound to the run");
        assert_eq!(claims["aud"], "orders-api");
        assert_eq!(claims["iss"], "plimsoll");
        assert_eq!(claims["iat"], 1_700_000_000u64);
        // 1_700_000_000.7 + 2.5 = 1_700_000_003.2, rounded down.
        assert_eq!(claims["exp"], 1_700_000_003u64);
        assert_eq!(claims["jti"].as_str().unwrap().len(), 32);
        let mut mac = Hmac::<Sha256>::new_from_slice(&[7u8; 32]).unwrap();
        mac.update(format!("{}.{}", parts[0], parts[1]).as_bytes());
        mac.verify_slice(&URL_SAFE_NO_PAD.decode(parts[2]).unwrap())
            .expect("the signature verifies");
        let other = m.mint("alice", "run-7", now, Duration::from_millis(2_500));
        assert_ne!(other.expose(), token.expose(), "every run gets its own id");
        let capped = Minter::Jwt {
            key: Secret::new(vec![7u8; 32]),
            audience: "a".into(),
            issuer: None,
            max_lifetime: Some(Duration::from_secs(1)),
        }
        .mint("bob", "run-8", now, Duration::from_secs(600));
        let parts: Vec<&str> = capped.expose().split('.').collect();
        let claims: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
        assert_eq!(claims["exp"], 1_700_000_001u64);
        assert_eq!(claims["plimsoll_run"], "run-8");
        assert!(claims.get("iss").is_none());
        assert!(!m.is_static());
        assert_eq!(m.kind(), CredentialKind::Minted);
    }
}
