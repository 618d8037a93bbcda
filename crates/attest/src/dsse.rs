//! DSSE envelopes (Dead Simple Signing Envelope, v1): the pre-authentication encoding, signing,
//! and strict opening. The payload is stored base64-encoded, so the signed bytes are kept
//! verbatim whatever happens to the JSON around them.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};

use crate::keys::{AttestKey, PublicKey};

/// The payload type of an in-toto statement.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";

/// The pre-authentication encoding: `"DSSEv1" SP LEN(type) SP type SP LEN(body) SP body`,
/// lengths as ASCII decimal byte counts with no leading zeros. This is what is signed.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {} {} ",
        payload_type.len(),
        payload_type,
        payload.len()
    )
    .into_bytes();
    out.extend_from_slice(payload);
    out
}

/// A DSSE envelope in its JSON form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    /// The payload, standard base64 with padding.
    pub payload: String,
    /// The payload type; always [`PAYLOAD_TYPE`] here.
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    /// The signatures; exactly one in a plimsoll bundle.
    pub signatures: Vec<EnvelopeSignature>,
}

/// One signature of an envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvelopeSignature {
    /// The key id of the signer.
    pub keyid: String,
    /// The Ed25519 signature over the PAE, standard base64 with padding.
    pub sig: String,
}

/// Signs `payload` and wraps it in an envelope.
pub fn sign(key: &AttestKey, payload_type: &str, payload: &[u8]) -> Envelope {
    let sig = key.sign(&pae(payload_type, payload));
    Envelope {
        payload: STANDARD.encode(payload),
        payload_type: payload_type.to_owned(),
        signatures: vec![EnvelopeSignature {
            keyid: key.key_id().to_owned(),
            sig: STANDARD.encode(sig),
        }],
    }
}

/// Why an envelope did not open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenEnvelopeError {
    /// The payload is not standard base64.
    #[error("the envelope payload is not standard base64 ({0})")]
    PayloadBase64(String),
    /// The payload decodes, but is not written the one way the signer writes it.
    #[error("the envelope payload is not in canonical base64 (padded, no stray bits)")]
    PayloadNotCanonical,
    /// Another payload type.
    #[error("payloadType is `{found}`, expected `{PAYLOAD_TYPE}`")]
    PayloadType {
        /// The type found.
        found: String,
    },
    /// Not exactly one signature.
    #[error("the envelope has {count} signatures; a plimsoll bundle has exactly one per envelope")]
    SignatureCount {
        /// How many.
        count: usize,
    },
    /// Signed by another key.
    #[error("signed by key {found}, not by the key given ({expected}): check --pub")]
    KeyId {
        /// The key id in the envelope.
        found: String,
        /// The key id of the key given.
        expected: String,
    },
    /// The signature is not base64 of 64 bytes.
    #[error("the signature is not canonical base64 of 64 bytes")]
    SignatureEncoding,
    /// The signature does not verify.
    #[error(
        "the signature does not verify: the signed statement was changed or signed by another key"
    )]
    BadSignature,
}

fn decode_canonical(text: &str) -> Result<Vec<u8>, Option<String>> {
    let bytes = STANDARD.decode(text).map_err(|e| Some(e.to_string()))?;
    // One accepted spelling per byte string: re-encoding must give the text back.
    if STANDARD.encode(&bytes) != text {
        return Err(None);
    }
    Ok(bytes)
}

/// Checks the payload type, the key id and the signature, and returns the payload.
pub fn open(envelope: &Envelope, key: &PublicKey) -> Result<Vec<u8>, OpenEnvelopeError> {
    let payload = decode_canonical(&envelope.payload).map_err(|e| match e {
        Some(why) => OpenEnvelopeError::PayloadBase64(why),
        None => OpenEnvelopeError::PayloadNotCanonical,
    })?;
    if envelope.payload_type != PAYLOAD_TYPE {
        return Err(OpenEnvelopeError::PayloadType {
            found: envelope.payload_type.clone(),
        });
    }
    let [signature] = envelope.signatures.as_slice() else {
        return Err(OpenEnvelopeError::SignatureCount {
            count: envelope.signatures.len(),
        });
    };
    if signature.keyid != key.key_id() {
        return Err(OpenEnvelopeError::KeyId {
            found: signature.keyid.clone(),
            expected: key.key_id().to_owned(),
        });
    }
    let sig = decode_canonical(&signature.sig).map_err(|_| OpenEnvelopeError::SignatureEncoding)?;
    if sig.len() != 64 {
        return Err(OpenEnvelopeError::SignatureEncoding);
    }
    if !key.verify(&pae(&envelope.payload_type, &payload), &sig) {
        return Err(OpenEnvelopeError::BadSignature);
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pae_matches_the_dsse_spec_example() {
        // The example from the DSSE protocol document.
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
        );
        assert_eq!(pae("", b""), b"DSSEv1 0  0 ");
    }

    #[test]
    fn open_checks_everything() {
        let key = AttestKey::from_seed(&[3; 32]);
        let env = sign(&key, PAYLOAD_TYPE, b"{}");
        assert_eq!(open(&env, key.public()).unwrap(), b"{}");
        let other = AttestKey::from_seed(&[4; 32]);
        assert!(matches!(
            open(&env, other.public()),
            Err(OpenEnvelopeError::KeyId { .. })
        ));
        let mut forged = env.clone();
        forged.signatures[0].keyid = other.key_id().to_owned();
        assert_eq!(
            open(&forged, other.public()),
            Err(OpenEnvelopeError::BadSignature)
        );
        let mut t = env.clone();
        t.payload_type = "text/plain".into();
        assert!(matches!(
            open(&t, key.public()),
            Err(OpenEnvelopeError::PayloadType { .. })
        ));
        let mut t = env.clone();
        t.payload = "e30".into(); // `{}` unpadded
        assert!(open(&t, key.public()).is_err());
        let mut t = env.clone();
        t.signatures.push(t.signatures[0].clone());
        assert_eq!(
            open(&t, key.public()),
            Err(OpenEnvelopeError::SignatureCount { count: 2 })
        );
    }
}
