//! The callers file: who may call the daemon, each by name and the SHA-256 of its bearer
//! token. The file never holds a token; a token exists only in the answer of [`add_caller`].
//! The daemon reads it (and re-reads it when it changes); `plimsoll callers add` and
//! `plimsoll init` write it.
//!
//! ```toml
//! [[caller]]
//! name = "ci"
//! token_sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
//! ```

pub mod store;

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use plimsoll_secret::Secret;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The prefix of every token, so a leaked one is recognisable (and greppable by scanners).
pub const TOKEN_PREFIX: &str = "plm_";

/// A bearer token as a caller presented it: a [`Secret`], read through [`Secret::expose`].
pub type Token = Secret;

/// SHA-256 of a token's text: what the callers file holds in its place.
pub fn token_digest(token: &Token) -> [u8; 32] {
    Sha256::digest(token.expose().as_bytes()).into()
}

/// The file as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CallersFile {
    #[serde(default)]
    caller: Vec<CallerEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CallerEntry {
    name: String,
    token_sha256: String,
}

/// The callers of one callers file, parsed and checked.
#[derive(Debug, Default, Clone)]
pub struct Callers {
    entries: Vec<(String, [u8; 32])>,
}

impl Callers {
    /// Parses a callers file's text: unique valid names, 64-hex-digit lowercase digests.
    pub fn parse(text: &str) -> Result<Callers, String> {
        let file: CallersFile = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut entries: Vec<(String, [u8; 32])> = Vec::with_capacity(file.caller.len());
        for entry in file.caller {
            validate_caller_name(&entry.name)?;
            if entries.iter().any(|(n, _)| *n == entry.name) {
                return Err(format!("caller `{}` appears twice", entry.name));
            }
            let digest = parse_digest(&entry.token_sha256).ok_or_else(|| {
                format!(
                    "caller `{}`: token_sha256 must be 64 lowercase hex digits (the SHA-256 of the token)",
                    entry.name
                )
            })?;
            entries.push((entry.name, digest));
        }
        Ok(Callers { entries })
    }

    /// The caller whose token this is. Compares against every caller's digest in constant
    /// time, so neither the answer's timing nor an early exit tells how close a guess was.
    pub fn authenticate(&self, token: &Token) -> Option<&str> {
        let presented = token_digest(token);
        let mut found: Option<&str> = None;
        for (name, digest) in &self.entries {
            if bool::from(digest.ct_eq(&presented)) {
                found = Some(name);
            }
        }
        found
    }

    /// The callers' names, in file order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(n, _)| n.as_str())
    }

    /// How many callers there are.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

fn parse_digest(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut out = [0u8; 32];
    hex::decode_to_slice(text, &mut out).ok()?;
    Some(out)
}

/// Checks a caller name: 1 to 64 characters of `a-z 0-9 . _ -`, starting with a letter or
/// digit. Names appear in logs and metrics, so they stay plain.
pub fn validate_caller_name(name: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c);
    let starts_well = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if name.is_empty() || name.len() > 64 || !starts_well || !name.chars().all(ok_char) {
        return Err(format!(
            "caller name `{}` is invalid: use 1 to 64 characters of a-z 0-9 . _ -, starting with a letter or digit",
            name.escape_debug()
        ));
    }
    Ok(())
}

/// `add_caller` could not add the caller. The file is unchanged.
#[derive(Debug, thiserror::Error)]
pub enum AddCallerError {
    /// The name is not a valid caller name.
    #[error("{message}")]
    InvalidName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        message: String,
    },
    /// A caller of that name exists.
    #[error(
        "caller `{name}` already exists in {path}: pick another name, or remove its entry from the file first"
    )]
    Duplicate {
        /// The name.
        name: String,
        /// The callers file.
        path: PathBuf,
    },
    /// The callers file could not be opened, read or written.
    #[error(
        "cannot update the callers file {path}: check that its directory exists and is writable"
    )]
    Io {
        /// The callers file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The existing file is not a valid callers file.
    #[error("the callers file {path} is invalid ({message}): fix it before adding callers")]
    Invalid {
        /// The callers file.
        path: PathBuf,
        /// What is wrong, with line and column.
        message: String,
    },
}

/// Adds a caller to the callers file (created with mode 0600 when missing) and returns its new
/// token. Only the token's SHA-256 is written; the token itself is returned once, to be shown
/// to the operator, and cannot be recovered later. It comes back as a [`Token`] (redacted
/// when printed with `{}` or `{:?}`): showing it takes `expose()`, on purpose.
pub fn add_caller(path: &Path, name: &str) -> Result<Token, AddCallerError> {
    validate_caller_name(name).map_err(|message| AddCallerError::InvalidName {
        name: name.to_owned(),
        message,
    })?;
    let io = |source| AddCallerError::Io {
        path: path.to_owned(),
        source,
    };
    let file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    // An exclusive lock, so two `callers add` at once cannot both pass the duplicate check.
    // Released when `file` closes, at the end of this function.
    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|errno| io(std::io::Error::from(errno)))?;
    let mut file = file;
    let mut text = String::new();
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    file.read_to_string(&mut text).map_err(io)?;
    let callers = Callers::parse(&text).map_err(|message| AddCallerError::Invalid {
        path: path.to_owned(),
        message,
    })?;
    if callers.names().any(|n| n == name) {
        return Err(AddCallerError::Duplicate {
            name: name.to_owned(),
            path: path.to_owned(),
        });
    }
    let token = Token::new(new_token());
    let mut entry = String::new();
    if text.is_empty() {
        entry.push_str(
            "# plimsoll callers: one [[caller]] per caller, holding the SHA-256 of its token\n\
             # (never the token). Add callers with `plimsoll callers add NAME`.\n",
        );
    } else if !text.ends_with('\n') {
        entry.push('\n');
    }
    entry.push_str(&format!(
        "\n[[caller]]\nname = \"{name}\"\ntoken_sha256 = \"{}\"\n",
        hex::encode(token_digest(&token))
    ));
    file.write_all(entry.as_bytes()).map_err(io)?;
    file.sync_all().map_err(io)?;
    Ok(token)
}

/// A fresh token: `plm_` and 256 random bits in unpadded base64url.
fn new_token() -> String {
    // rand's thread generator is a CSPRNG seeded from the operating system.
    let bytes: [u8; 32] = rand::random();
    format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn tokens_never_print_themselves() {
        let t = Token::new("plm_secret");
        assert_eq!(format!("{t}"), "<redacted>");
        assert_eq!(format!("{t:?}"), "<redacted>");
        assert_eq!(t.expose(), "plm_secret");
    }

    #[test]
    fn add_caller_stores_only_the_digest_and_refuses_duplicates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("callers.toml");
        let secret = add_caller(&path, "alice").unwrap();
        // What the caller gets is redacted however it is printed; only expose() shows it.
        assert!(!format!("{secret} {secret:?}").contains(TOKEN_PREFIX));
        let token = secret.expose().clone();
        assert!(
            token.starts_with(TOKEN_PREFIX) && token.len() == 4 + 43,
            "{token}"
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&token));
        assert!(text.contains(&hex::encode(Sha256::digest(token.as_bytes()))));

        let bob = add_caller(&path, "bob").unwrap();
        assert_ne!(bob.expose(), &token);
        let callers = Callers::parse(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(callers.authenticate(&secret), Some("alice"));
        assert_eq!(callers.authenticate(&bob), Some("bob"));
        assert_eq!(callers.authenticate(&Token::new(format!("{token}x"))), None);

        assert!(matches!(
            add_caller(&path, "alice"),
            Err(AddCallerError::Duplicate { .. })
        ));
        for bad in ["", "Alice", "a b", "-x", "a\"b", &"a".repeat(65)] {
            assert!(
                matches!(
                    add_caller(&path, bad),
                    Err(AddCallerError::InvalidName { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn bad_files_are_refused() {
        assert!(Callers::parse("[[caller]]\nname = \"a\"\ntoken_sha256 = \"00\"\n").is_err());
        let d = "0".repeat(64);
        let twice = format!(
            "[[caller]]\nname = \"a\"\ntoken_sha256 = \"{d}\"\n[[caller]]\nname = \"a\"\ntoken_sha256 = \"{d}\"\n"
        );
        assert!(Callers::parse(&twice).unwrap_err().contains("twice"));
        assert!(Callers::parse("token = \"x\"").is_err());
    }
}
