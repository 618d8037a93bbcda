//! Exact bytes on the wire: a JSON string when the bytes are UTF-8, `{"base64": "..."}`
//! otherwise, so output that is not text survives the trip unchanged.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A byte string that serialises losslessly.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Bytes(pub Vec<u8>);

impl Bytes {
    /// The raw bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }

    /// The bytes as text, with invalid UTF-8 replaced (for display only).
    pub fn to_string_lossy(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Bytes({:?})", String::from_utf8_lossy(&self.0))
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(v: Vec<u8>) -> Self {
        Bytes(v)
    }
}

impl From<&str> for Bytes {
    fn from(s: &str) -> Self {
        Bytes(s.as_bytes().to_vec())
    }
}

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(&self.0) {
            Ok(text) => s.serialize_str(text),
            Err(_) => {
                let mut map = s.serialize_map(Some(1))?;
                map.serialize_entry("base64", &STANDARD.encode(&self.0))?;
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct BytesVisitor;
        impl<'de> Visitor<'de> for BytesVisitor {
            type Value = Bytes;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, or an object {\"base64\": \"...\"}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Bytes, E> {
                Ok(Bytes(v.as_bytes().to_vec()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Bytes, A::Error> {
                let mut out = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key != "base64" || out.is_some() {
                        return Err(de::Error::custom(format!(
                            "unexpected key `{key}` in a byte string: only `base64` is allowed"
                        )));
                    }
                    let text: String = map.next_value()?;
                    let bytes = STANDARD
                        .decode(text.as_bytes())
                        .map_err(|e| de::Error::custom(format!("invalid base64: {e}")))?;
                    out = Some(Bytes(bytes));
                }
                out.ok_or_else(|| de::Error::custom("a byte-string object needs `base64`"))
            }
        }
        d.deserialize_any(BytesVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_a_string_and_binary_is_base64() {
        assert_eq!(serde_json::to_string(&Bytes::from("hé")).unwrap(), "\"hé\"");
        let bin = Bytes(vec![0xff, 0x00, b'a']);
        let json = serde_json::to_string(&bin).unwrap();
        assert_eq!(json, r#"{"base64":"/wBh"}"#);
        assert_eq!(serde_json::from_str::<Bytes>(&json).unwrap(), bin);
        assert!(serde_json::from_str::<Bytes>(r#"{"hex":"00"}"#).is_err());
    }
}
