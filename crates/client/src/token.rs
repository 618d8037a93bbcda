//! The caller's bearer token: a secret that prints as `<redacted>` and is read only on purpose.

use std::fmt;

/// A caller token for plimsolld. `Debug` and `Display` print `<redacted>`; it has no
/// `Serialize`; [`Token::expose_secret`] is the one way to read it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// Wraps a token.
    pub fn new(token: impl Into<String>) -> Self {
        Token(token.into())
    }

    /// The token itself, for the `Authorization` header and nothing else.
    pub fn expose_secret(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl From<String> for Token {
    fn from(s: String) -> Self {
        Token(s)
    }
}

impl From<&str> for Token {
    fn from(s: &str) -> Self {
        Token(s.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_prints_itself() {
        let t = Token::new("plm_s3cr3t");
        assert_eq!(format!("{t}"), "<redacted>");
        assert_eq!(format!("{t:?}"), "<redacted>");
        assert_eq!(format!("{:?}", Some(&t)), "Some(<redacted>)");
        assert_eq!(t.expose_secret(), "plm_s3cr3t");
    }
}
