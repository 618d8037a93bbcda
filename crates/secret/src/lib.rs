//! The one secret type for tokens, credentials and keys: a caller's bearer token, a minted
//! run credential, an API secret or HMAC key read from the environment, an Ed25519 seed.
//!
//! A [`Secret`] prints as `<redacted>` (`Debug` and `Display`), has no `Serialize` (this
//! crate does not depend on serde, so no other crate can add one: the orphan rule forbids
//! it), is zeroed when dropped, and is read only through [`Secret::expose`], named so that
//! every read is greppable.

use std::fmt;

use zeroize::Zeroize;

/// A secret value: `String` for tokens and credentials (the default), `Vec<u8>` or a byte
/// array for keys. `Debug` and `Display` print `<redacted>`; there is no `Serialize`; the
/// value is zeroed on drop; [`Secret::expose`] is the one way to read it.
pub struct Secret<T: Zeroize = String>(T);

impl<T: Zeroize> Secret<T> {
    /// Wraps a secret value.
    pub fn new(value: impl Into<T>) -> Self {
        Secret(value.into())
    }

    /// The secret itself. Call only where it is used (a request header, a MAC, a
    /// signature, a digest), never to log or store it.
    pub fn expose(&self) -> &T {
        &self.0
    }
}

impl<T: Zeroize> Drop for Secret<T> {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl<T: Zeroize + Clone> Clone for Secret<T> {
    fn clone(&self) -> Self {
        Secret(self.0.clone())
    }
}

impl<T: Zeroize> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl<T: Zeroize> fmt::Display for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Secret(s)
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Self {
        Secret(s.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use std::marker::PhantomData;

    use super::*;

    #[test]
    fn debug_and_display_never_print_the_value() {
        let t = Secret::<String>::new("plm_s3cr3t");
        assert_eq!(format!("{t}"), "<redacted>");
        assert_eq!(format!("{t:?}"), "<redacted>");
        assert_eq!(format!("{t:#?}"), "<redacted>");
        assert_eq!(format!("{:?}", Some(&t)), "Some(<redacted>)");
        assert_eq!(format!("{:>20}|{:<3}", t, t), "<redacted>|<redacted>");
        assert_eq!(t.expose(), "plm_s3cr3t");
        let k = Secret::<Vec<u8>>::new(vec![0x41u8; 32]);
        assert_eq!(format!("{k:?} {k}"), "<redacted> <redacted>");
        assert!(!format!("{k:?}").contains("65"));
        let seed = Secret::<[u8; 32]>::new([9u8; 32]);
        assert_eq!(format!("{seed:?}"), "<redacted>");
        assert_eq!(seed.expose(), &[9u8; 32]);
        let c = t.clone();
        assert_eq!(c.expose(), t.expose());
    }

    #[test]
    fn zeroize_clears_what_drop_clears() {
        // Drop runs `Zeroize` on the value; check on a live copy what it leaves behind.
        let mut s = String::from("plm_s3cr3t");
        s.zeroize();
        assert!(s.is_empty());
        let mut v = vec![7u8; 32];
        v.zeroize();
        assert!(v.is_empty());
        let mut a = [7u8; 32];
        a.zeroize();
        assert_eq!(a, [0u8; 32]);
    }

    /// Autoref probe: the inherent method wins when `T: Serialize`, the trait's default
    /// (false) otherwise. Resolved at compile time for each concrete `T`.
    struct Probe<T>(PhantomData<T>);
    impl<T: serde::Serialize> Probe<T> {
        fn is_serialize(&self) -> bool {
            true
        }
    }
    trait NotSerialize {
        fn is_serialize(&self) -> bool {
            false
        }
    }
    impl<T> NotSerialize for Probe<T> {}

    #[test]
    fn a_secret_is_not_serialize() {
        // The probe sees `Serialize` where it is implemented, so it can fail.
        assert!(Probe::<String>(PhantomData).is_serialize());
        assert!(Probe::<Vec<u8>>(PhantomData).is_serialize());
        assert!(!Probe::<Secret>(PhantomData).is_serialize());
        assert!(!Probe::<Secret<Vec<u8>>>(PhantomData).is_serialize());
        assert!(!Probe::<Secret<[u8; 32]>>(PhantomData).is_serialize());
    }
}
