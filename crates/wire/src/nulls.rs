//! The one rule for JSON `null` (docs/protocol.md): on an optional member, `null` means the
//! member is absent, so a member with a default takes its default. A required member is never
//! `null`, except the few marked nullable.

use serde::{Deserialize, Deserializer};

/// Deserialises an optional member with a default: absent (with `#[serde(default)]`) and
/// `null` both give `T::default()`.
pub(crate) fn or_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}
