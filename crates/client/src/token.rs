//! The caller's bearer token: a [`Secret`] that prints as `<redacted>` and is read only on
//! purpose, through [`Secret::expose`].

use plimsoll_secret::Secret;

/// A caller token for plimsolld: the one secret type, [`Secret`]. `Debug` and `Display`
/// print `<redacted>`; it has no `Serialize`; it is zeroed on drop; [`Secret::expose`] is
/// the one way to read it.
pub type Token = Secret;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_prints_itself() {
        let t = Token::new("plm_s3cr3t");
        assert_eq!(format!("{t}"), "<redacted>");
        assert_eq!(format!("{t:?}"), "<redacted>");
        assert_eq!(format!("{:?}", Some(&t)), "Some(<redacted>)");
        assert_eq!(t.expose(), "plm_s3cr3t");
    }
}
