//! Images on the wire: how a request names one (`image`: a name or an identity), what a
//! record says ran (its name and identity), and what `GET /v1/providers` lists.

use serde::{Deserialize, Serialize};

/// The image a run ran in: its name in the daemon's image store and its identity
/// (`sha256:` over its manifest). On every record of a run in an image; absent at the
/// process tier, which has no image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageRef {
    /// Its name, as a request's `image` names it.
    pub name: String,
    /// `sha256:` and 64 lowercase hex characters: the digest of its manifest.
    pub identity: String,
}

impl ImageRef {
    /// Whether a request's `image` (a name or an identity) names this image.
    pub fn answers(&self, selector: &str) -> bool {
        self.name == selector || self.identity == selector
    }
}

/// One image the daemon keeps, as `GET /v1/providers` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageInfo {
    /// Its name.
    pub name: String,
    /// Its identity.
    pub identity: String,
    /// Whether a request that names no image gets it.
    pub default: bool,
    /// The languages it can start (`python`, `javascript`), as its check found them.
    #[serde(default)]
    pub languages: Vec<crate::Language>,
    /// Whether the VM provider can boot it (it has a disk made from it).
    #[serde(default)]
    pub vm_disk: bool,
    /// The trial simulators it declares (docs/simulators.md), in its index's order; left out
    /// when it declares none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub simulators: Vec<crate::simulators::SimulatorEntry>,
}

/// The longest image name.
pub const IMAGE_NAME_MAX: usize = 64;

/// Whether `name` is an image name: 1 to 64 characters of `a-z 0-9 . _ -`, starting with a
/// letter or digit. Names never contain `:`, so a selector with one is an identity.
pub fn is_image_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.len() <= IMAGE_NAME_MAX
        && chars
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'))
}

/// Whether `identity` is an image identity: `sha256:` and 64 lowercase hex characters.
pub fn is_image_identity(identity: &str) -> bool {
    identity.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Checks a request's `image`: an image name or an image identity.
pub fn validate_image_selector(selector: &str) -> Result<(), String> {
    if is_image_name(selector) || is_image_identity(selector) {
        return Ok(());
    }
    Err(format!(
        "image `{}` is neither an image name (1 to {IMAGE_NAME_MAX} characters of a-z 0-9 . _ -, \
         starting with a letter or digit) nor an identity (sha256: and 64 lowercase hex \
         characters): `plimsoll image list` or GET /v1/providers lists the images",
        selector.escape_debug()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_identities_are_told_apart() {
        for good in ["sandbox", "python-data", "a", "0.1_x-y"] {
            assert!(is_image_name(good), "{good}");
            assert!(validate_image_selector(good).is_ok());
        }
        for bad in [
            "",
            "Sandbox",
            "-x",
            ".x",
            "a b",
            "a/b",
            "a:b",
            &"x".repeat(65),
        ] {
            assert!(!is_image_name(bad), "{bad}");
        }
        let id = format!("sha256:{}", "0a".repeat(32));
        assert!(is_image_identity(&id) && validate_image_selector(&id).is_ok());
        for bad in [
            "sha256:".to_owned(),
            format!("sha256:{}", "0A".repeat(32)),
            format!("sha512:{}", "0a".repeat(32)),
            format!("sha256:{}", "0a".repeat(33)),
        ] {
            assert!(!is_image_identity(&bad), "{bad}");
            assert!(validate_image_selector(&bad).is_err(), "{bad}");
        }
        let r = ImageRef {
            name: "sandbox".into(),
            identity: id.clone(),
        };
        assert!(r.answers("sandbox") && r.answers(&id) && !r.answers("python-data"));
    }
}
