//! Ed25519 key files: the private key in PKCS#8 PEM (mode 0600), the public key in
//! SubjectPublicKeyInfo PEM, and the key id (SHA-256 of the public key's DER encoding).

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{
    DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey, KeypairBytes,
};
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use plimsoll_secret::Secret;
use sha2::{Digest as _, Sha256};
use zeroize::Zeroize;

/// A private signing key with its public half. Its `Debug` prints only the key id; the
/// private half is the one secret type, [`Secret`], zeroed on drop.
pub struct AttestKey {
    signing: Secret<Signing>,
    public: PublicKey,
}

/// An Ed25519 signing key as a [`Secret`]'s value. `SigningKey` zeroes itself on drop but has
/// no `Zeroize`; zeroising replaces it by the all-zero seed's key, so the old one's own drop
/// clears it.
struct Signing(SigningKey);

impl Zeroize for Signing {
    fn zeroize(&mut self) {
        self.0 = SigningKey::from_bytes(&[0; 32]);
    }
}

impl fmt::Debug for AttestKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttestKey")
            .field("key_id", &self.public.key_id)
            .field("private", &"<redacted>")
            .finish()
    }
}

impl AttestKey {
    /// A key from a 32-byte Ed25519 seed (for golden vectors and tests; real keys come
    /// from [`keygen`]).
    pub fn from_seed(seed: &[u8; 32]) -> Self {
        Self::from_signing(SigningKey::from_bytes(seed))
    }

    fn from_signing(signing: SigningKey) -> Self {
        let public = PublicKey::new(signing.verifying_key());
        AttestKey {
            signing: Secret::new(Signing(signing)),
            public,
        }
    }

    /// The public half.
    pub fn public(&self) -> &PublicKey {
        &self.public
    }

    /// The key id: SHA-256 (lowercase hex) of the public key's DER encoding.
    pub fn key_id(&self) -> &str {
        &self.public.key_id
    }

    /// An Ed25519 signature over `message`.
    pub fn sign(&self, message: &[u8]) -> [u8; 64] {
        self.signing.expose().0.sign(message).to_bytes()
    }

    /// The public key in SubjectPublicKeyInfo PEM, as `keygen` writes it.
    pub fn public_pem(&self) -> String {
        self.public.to_pem()
    }
}

/// A public verifying key and its key id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    key: VerifyingKey,
    key_id: String,
}

impl PublicKey {
    fn new(key: VerifyingKey) -> Self {
        let der = key
            .to_public_key_der()
            .expect("an Ed25519 public key always has a DER encoding");
        let key_id = hex::encode(Sha256::digest(der.as_bytes()));
        PublicKey { key, key_id }
    }

    /// The key id: SHA-256 (lowercase hex) of the DER SubjectPublicKeyInfo.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The SubjectPublicKeyInfo PEM.
    pub fn to_pem(&self) -> String {
        self.key
            .to_public_key_pem(LineEnding::LF)
            .expect("an Ed25519 public key always has a PEM encoding")
    }

    /// Checks an Ed25519 signature strictly (canonical `S`, no small-order points), so a
    /// signature has exactly one accepted byte string.
    pub fn verify(&self, message: &[u8], signature: &[u8]) -> bool {
        let Ok(bytes) = <[u8; 64]>::try_from(signature) else {
            return false;
        };
        self.key
            .verify_strict(message, &Signature::from_bytes(&bytes))
            .is_ok()
    }

    /// The public key from its PEM text.
    pub fn from_pem(pem: &str) -> Result<Self, String> {
        VerifyingKey::from_public_key_pem(pem)
            .map(Self::new)
            .map_err(|e| e.to_string())
    }
}

/// The two files `keygen` writes.
#[derive(Debug, Clone)]
pub struct KeyFiles {
    /// `PREFIX.key`: the private key, PKCS#8 PEM, mode 0600.
    pub private: PathBuf,
    /// `PREFIX.pub`: the public key, SubjectPublicKeyInfo PEM.
    pub public: PathBuf,
    /// The key id.
    pub key_id: String,
}

/// `PREFIX` with `suffix` appended (not an extension replaced: `a.b` gives `a.b.key`).
pub fn with_suffix(prefix: &Path, suffix: &str) -> PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Why `keygen` wrote no key pair.
#[derive(Debug, thiserror::Error)]
pub enum KeygenError {
    /// One of the files is already there.
    #[error("{} already exists: keygen never overwrites a key; pick another --out prefix", path.display())]
    Exists {
        /// The file.
        path: PathBuf,
    },
    /// Writing a file failed.
    #[error("cannot write {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Writing the public key failed and removing the half-written private key failed too.
    #[error("cannot write {}, and cannot remove {} after it ({cleanup}): remove it by hand", public.display(), private.display())]
    WriteAndCleanup {
        /// The public key file.
        public: PathBuf,
        /// The private key file left behind.
        private: PathBuf,
        /// Why removing it failed.
        cleanup: std::io::Error,
        /// Why writing the public key failed.
        #[source]
        source: std::io::Error,
    },
}

fn write_new(path: &Path, mode: u32, text: &[u8]) -> std::io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    // The umask may only clear bits; set them exactly so the private key is 0600 whatever it is.
    f.set_permissions(fs::Permissions::from_mode(mode))?;
    f.write_all(text)?;
    f.sync_all()
}

/// The private key as PKCS#8 v1 PEM (RFC 5208 `PrivateKeyInfo`, no public key inside): the
/// form OpenSSL 3.0, Node and Python's `cryptography` all load. The v2 form (RFC 5958, with
/// the public key) is still read, but not written; the public key has its own file.
fn private_pem_v1(signing: &SigningKey) -> impl std::ops::Deref<Target = String> {
    KeypairBytes {
        secret_key: signing.to_bytes(),
        public_key: None,
    }
    .to_pkcs8_pem(LineEnding::LF)
    .expect("an Ed25519 private key always has a PKCS#8 encoding")
}

/// Generates a key pair from the OS random source and writes `PREFIX.key` (mode 0600) and
/// `PREFIX.pub`. Refuses when either exists.
pub fn keygen(prefix: &Path) -> Result<KeyFiles, KeygenError> {
    let private = with_suffix(prefix, ".key");
    let public = with_suffix(prefix, ".pub");
    for path in [&private, &public] {
        if fs::symlink_metadata(path).is_ok() {
            return Err(KeygenError::Exists { path: path.clone() });
        }
    }
    let key = AttestKey::from_signing(SigningKey::generate(&mut rand_core::OsRng));
    let pem = private_pem_v1(&key.signing.expose().0);
    write_new(&private, 0o600, pem.as_bytes()).map_err(|source| match source.kind() {
        std::io::ErrorKind::AlreadyExists => KeygenError::Exists {
            path: private.clone(),
        },
        _ => KeygenError::Write {
            path: private.clone(),
            source,
        },
    })?;
    if let Err(source) = write_new(&public, 0o644, key.public_pem().as_bytes()) {
        return Err(match fs::remove_file(&private) {
            Ok(()) if source.kind() == std::io::ErrorKind::AlreadyExists => {
                KeygenError::Exists { path: public }
            }
            Ok(()) => KeygenError::Write {
                path: public,
                source,
            },
            Err(cleanup) => KeygenError::WriteAndCleanup {
                public,
                private,
                cleanup,
                source,
            },
        });
    }
    Ok(KeyFiles {
        private,
        public,
        key_id: key.key_id().to_owned(),
    })
}

/// Why a key file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadKeyError {
    /// The file could not be read.
    #[error("cannot read key file {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A private key file that others may read.
    #[error("private key {} has mode {mode:04o}: others may read it; run `chmod 600 {}`", path.display(), path.display())]
    TooOpen {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The file is not a key of the expected kind.
    #[error("{} is not {expected}: {why}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What was expected.
        expected: &'static str,
        /// The decoder's complaint (never the key material).
        why: String,
    },
}

/// Reads a private key file (`PREFIX.key`). Refuses one that group or others may read.
pub fn load_private_key(path: &Path) -> Result<AttestKey, LoadKeyError> {
    let read = |source| LoadKeyError::Read {
        path: path.to_owned(),
        source,
    };
    let mode = fs::metadata(path).map_err(read)?.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(LoadKeyError::TooOpen {
            path: path.to_owned(),
            mode,
        });
    }
    let text = fs::read_to_string(path).map_err(read)?;
    let signing = SigningKey::from_pkcs8_pem(&text).map_err(|e| LoadKeyError::Parse {
        path: path.to_owned(),
        expected: "an Ed25519 private key in PKCS#8 PEM (written by `plimsoll-attest keygen`)",
        why: e.to_string(),
    })?;
    Ok(AttestKey::from_signing(signing))
}

/// Reads a public key file (`PREFIX.pub`).
pub fn load_public_key(path: &Path) -> Result<PublicKey, LoadKeyError> {
    let text = fs::read_to_string(path).map_err(|source| LoadKeyError::Read {
        path: path.to_owned(),
        source,
    })?;
    PublicKey::from_pem(&text).map_err(|why| LoadKeyError::Parse {
        path: path.to_owned(),
        expected: "an Ed25519 public key in SubjectPublicKeyInfo PEM (`PREFIX.pub`)",
        why,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keygen_writes_0600_and_refuses_to_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("k.v1");
        let files = keygen(&prefix).unwrap();
        assert_eq!(files.private, dir.path().join("k.v1.key"));
        let mode = fs::metadata(&files.private).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let key = load_private_key(&files.private).unwrap();
        let public = load_public_key(&files.public).unwrap();
        assert_eq!(key.key_id(), public.key_id());
        assert_eq!(key.key_id(), files.key_id);
        let sig = key.sign(b"m");
        assert!(public.verify(b"m", &sig));
        assert!(!public.verify(b"n", &sig));
        let before = fs::read(&files.private).unwrap();
        assert!(matches!(keygen(&prefix), Err(KeygenError::Exists { .. })));
        assert_eq!(fs::read(&files.private).unwrap(), before);
        // Only the public half present: still refused, and no private key appears.
        let other = dir.path().join("o");
        fs::write(with_suffix(&other, ".pub"), "x").unwrap();
        assert!(matches!(keygen(&other), Err(KeygenError::Exists { .. })));
        assert!(!with_suffix(&other, ".key").exists());
    }

    #[test]
    fn keygen_writes_pkcs8_v1_and_v2_keys_are_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let files = keygen(&dir.path().join("k")).unwrap();
        let pem = fs::read_to_string(&files.private).unwrap();
        let der = pkcs8_der(&pem);
        // RFC 5208 PrivateKeyInfo: SEQUENCE { INTEGER 0 (v1), AlgorithmIdentifier, OCTET STRING }.
        assert_eq!(
            &der[2..5],
            &[0x02, 0x01, 0x00],
            "not version v1: {der:02x?}"
        );
        assert_eq!(der.len(), 48, "a v1 Ed25519 key is 48 bytes of DER");

        // A v2 key (RFC 5958, public key inside), as keygen used to write: still loads.
        let key = AttestKey::from_seed(&[7; 32]);
        let v2 = key.signing.expose().0.to_pkcs8_pem(LineEnding::LF).unwrap();
        assert_eq!(&pkcs8_der(&v2)[2..5], &[0x02, 0x01, 0x01], "not version v2");
        let path = dir.path().join("v2.key");
        write_new(&path, 0o600, v2.as_bytes()).unwrap();
        assert_eq!(load_private_key(&path).unwrap().key_id(), key.key_id());
    }

    /// The DER inside a one-block PEM.
    fn pkcs8_der(pem: &str) -> Vec<u8> {
        use base64::Engine as _;
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        base64::engine::general_purpose::STANDARD
            .decode(body)
            .unwrap()
    }

    #[test]
    fn an_open_private_key_is_refused_and_debug_hides_it() {
        let dir = tempfile::tempdir().unwrap();
        let files = keygen(&dir.path().join("k")).unwrap();
        fs::set_permissions(&files.private, fs::Permissions::from_mode(0o640)).unwrap();
        let e = load_private_key(&files.private).unwrap_err();
        assert!(e.to_string().contains("chmod 600"), "{e}");
        let key = AttestKey::from_seed(&[9; 32]);
        let shown = format!("{key:?}");
        assert!(
            shown.contains("<redacted>") && !shown.contains("[9"),
            "{shown}"
        );
    }

    #[test]
    fn zeroising_the_private_key_leaves_the_zero_seed() {
        let mut signing = Signing(SigningKey::from_bytes(&[9; 32]));
        signing.zeroize();
        assert_eq!(signing.0.to_bytes(), [0; 32]);
    }

    #[test]
    fn key_id_is_sha256_of_the_spki_der() {
        let key = AttestKey::from_seed(&[1; 32]);
        // SPKI DER for Ed25519: a fixed 12-byte header, then the 32-byte public key.
        let mut der = hex::decode("302a300506032b6570032100").unwrap();
        der.extend_from_slice(key.signing.expose().0.verifying_key().as_bytes());
        assert_eq!(key.key_id(), hex::encode(Sha256::digest(&der)));
    }
}
