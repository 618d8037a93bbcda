//! Importing an image built elsewhere into the store: a `docker save` or `podman save` tar
//! (docker-archive), an oci-archive tar (`buildah push oci-archive:...`) or an OCI image
//! layout directory, copied by skopeo and unpacked by umoci (Debian's, from bookworm), then
//! made safe for a sandbox, given its manifest and identity, and renamed into place.
//!
//! Layers are untrusted input. What guards the host and the store:
//! - Everything happens in `<store>/.import.<name>.tmp.<random>/` (mode 0700, so no other
//!   user reaches a set-id file before it is cleared); the finished directory is renamed to
//!   `<store>/<name>` with `RENAME_NOREPLACE` at the very end. A failed import removes its
//!   temporary directory and touches no existing image.
//! - skopeo copies the chosen image (one image only) into an OCI layout in that directory,
//!   every layer gzip-compressed (umoci 0.4.7 unpacks gzip layers only; skopeo recompresses
//!   zstd and compresses plain tar). Its temporary files go to `--tmpdir` there, and its
//!   blob-info cache too (`XDG_DATA_HOME` there; `_CONTAINERS_ROOTLESS_UID` makes
//!   containers/image take the per-user cache path instead of /var/lib/containers/cache,
//!   which it would write as root). No network: every transport used is local.
//! - Before anything is unpacked, each layer blob is read once: its SHA-256 checked against
//!   its digest, and its gzip stream decompressed and read as a tar (read, never extracted)
//!   while counting, so a compression bomb is refused after at most the limit's worth of
//!   decompression, having written nothing. The bound counts, over all layers, the larger of
//!   the decompressed bytes and the sizes the headers declare (a sparse file's real size:
//!   Go's tar reader, and so umoci, writes a sparse file's holes out as zeros), and the
//!   entries. Nothing of a bomb reaches the disk but its compressed blob, which the archive
//!   limit bounds.
//! - umoci (`raw unpack`) applies the layers: whiteouts, opaque whiteouts, and every path
//!   and link resolved inside the root (it refuses a hard link to a file the root lacks).
//! - Then a walk that never follows a symlink (directory descriptors, `O_NOFOLLOW`) removes
//!   device nodes, fifos and sockets, clears setuid and setgid bits, and removes every
//!   extended attribute (`security.capability` among them: the manifest format has no
//!   xattrs), recording each; `/work`, `/tmp` (1777) and `/opt/plimsoll/bin` are made real
//!   root-owned directories where missing, and the import is refused where one of them (or
//!   a directory on the way) is a symlink or not a directory. The rootfs is made 0:0, 0755.
//! - The manifest (format header only, so the same content imported under two names has
//!   one identity), the identity, and `source` (what was imported and what was changed).
//!
//! The daemon's tests can make an image that runs Python from the built sandbox image with
//! [`crate::testing::oci_archive_from_rootfs`] and import it with [`import`].

use std::cell::Cell;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use plimsoll_sandbox::{CaptureLimits, Spawn, SpawnError, capture};
use plimsoll_wire::{IMAGE_NAME_MAX, is_image_name};
use rustix::fs::{AtFlags, CWD, FileType, Gid, Mode, RenameFlags, Uid};
use sha2::{Digest as _, Sha256};

use crate::manifest::{self, MakeManifestError, Place, escape, open_dir, walk};
use crate::store::{ImageStore, ResolveImageError, StoredImage};

/// What to import: a path, and which image of it when it holds several.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// A docker-archive or oci-archive tar, or an OCI image layout directory.
    pub path: PathBuf,
    /// Which image, when the source holds several: an OCI layout's or archive's
    /// `org.opencontainers.image.ref.name`, or a docker-archive's tag (`repo:tag`) or
    /// `@<index>`. `None` for a source that holds exactly one.
    pub image: Option<String>,
}

/// The forms an image to import comes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceForm {
    /// A directory with `oci-layout` and `index.json`.
    OciLayout,
    /// A tar holding `oci-layout` and `index.json` (`buildah push oci-archive:...`).
    OciArchive,
    /// A tar holding `manifest.json` (`docker save`, `podman save`).
    DockerArchive,
}

impl SourceForm {
    /// How the `source` file and messages name it.
    pub fn as_str(self) -> &'static str {
        match self {
            SourceForm::OciLayout => "oci-layout",
            SourceForm::OciArchive => "oci-archive",
            SourceForm::DockerArchive => "docker-archive",
        }
    }

    /// skopeo's transport for it.
    fn transport(self) -> &'static str {
        match self {
            SourceForm::OciLayout => "oci",
            SourceForm::OciArchive => "oci-archive",
            SourceForm::DockerArchive => "docker-archive",
        }
    }
}

/// How much an import may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// The source's bytes (an archive's size, a layout's blobs), and the chosen image's
    /// compressed layers: what is copied into the store before anything is unpacked.
    pub archive_bytes: u64,
    /// What all layers may unpack to together (the larger of their decompressed bytes and
    /// the file sizes their headers declare).
    pub unpacked_bytes: u64,
    /// The entries all layers may hold together.
    pub entries: u64,
    /// How long skopeo or umoci may take, each.
    pub tool_timeout: Duration,
}

impl Default for Limits {
    /// 8 GiB in, 8 GiB unpacked, 1,000,000 entries, an hour per tool.
    fn default() -> Self {
        Limits {
            archive_bytes: 8 << 30,
            unpacked_bytes: 8 << 30,
            entries: 1_000_000,
            tool_timeout: Duration::from_secs(3600),
        }
    }
}

/// What the import changed so that the image could go into a sandbox. Paths are inside the
/// image, escaped as the manifest escapes them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Neutralised {
    /// Device nodes, fifos and sockets removed: path and kind.
    pub removed: Vec<(String, &'static str)>,
    /// Files and directories whose setuid or setgid bit was cleared: path and the mode
    /// they had (`st_mode & 07777`).
    pub cleared_setid: Vec<(String, u32)>,
    /// Extended attributes removed (`security.capability` among them): path and name.
    pub removed_xattrs: Vec<(String, String)>,
    /// Directories made (`/work`, `/tmp`, `/opt/plimsoll/bin` and the ones on the way), or
    /// whose owner or mode was set (`/tmp`).
    pub made: Vec<String>,
}

/// A finished import.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    /// The image, as the store now reads it.
    pub image: StoredImage,
    /// The form it came in.
    pub form: SourceForm,
    /// The source's path (canonical).
    pub source: PathBuf,
    /// The digest of the OCI manifest that was unpacked.
    pub oci_manifest: String,
    /// Its layers.
    pub layers: usize,
    /// What its layers unpack to at most, in bytes (the bound that was checked).
    pub unpacked_bytes: u64,
    /// The entries its layers hold.
    pub entries: u64,
    /// What was changed to make it safe.
    pub neutralised: Neutralised,
}

/// An image could not be imported. The store is as it was: no image was changed, and the
/// temporary directory is gone (unless [`ImportImageError::LeftBehind`] says otherwise).
#[derive(Debug, thiserror::Error)]
pub enum ImportImageError {
    /// The name is not an image name.
    #[error(
        "`{name}` is not an image name: use 1 to {} characters of a-z 0-9 . _ -, starting \
         with a letter or digit",
        IMAGE_NAME_MAX
    )]
    Name {
        /// The name.
        name: String,
    },
    /// An image (or something else) already has the name.
    #[error("an image `{name}` is already in {}: remove it first, or choose another name", store.display())]
    Exists {
        /// The name.
        name: String,
        /// The store.
        store: PathBuf,
    },
    /// A program the import needs is missing.
    #[error(
        "{tool} is not installed (looked in /usr/bin, /usr/local/bin): install skopeo and umoci (scripts/install-deps)"
    )]
    ToolMissing {
        /// skopeo or umoci.
        tool: &'static str,
    },
    /// The source cannot be read.
    #[error("cannot read {}", path.display())]
    ReadSource {
        /// The source.
        path: PathBuf,
        /// Why.
        #[source]
        io: io::Error,
    },
    /// The source is not an image in a form this imports.
    #[error("{} is not an image to import: {why}", path.display())]
    NotAnImage {
        /// The source.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The source holds several images and none was chosen.
    #[error("{} holds {} images ({}): choose the one to import", path.display(), images.len(), images.join(", "))]
    SeveralImages {
        /// The source.
        path: PathBuf,
        /// Its images, as they can be chosen.
        images: Vec<String>,
    },
    /// The chosen image is not in the source.
    #[error("{} holds no image `{chosen}`: choose one of {}", path.display(), images.join(", "))]
    NoSuchImage {
        /// The source.
        path: PathBuf,
        /// What was chosen.
        chosen: String,
        /// Its images, as they can be chosen.
        images: Vec<String>,
    },
    /// The source, or the chosen image's layers, are over the archive limit.
    #[error(
        "{what} is {bytes} bytes, over the import limit of {limit}: raise the limit if the image is genuine"
    )]
    ArchiveTooLarge {
        /// The source's path, or the layers.
        what: String,
        /// Its size.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// The layers would unpack to more than the limit (refused before unpacking).
    #[error(
        "the layers unpack to more than {limit} bytes (past it at layer {layer}): refused before unpacking; raise the limit if the image is genuine"
    )]
    UnpackedTooLarge {
        /// The layer's digest.
        layer: String,
        /// The limit.
        limit: u64,
    },
    /// The layers hold more entries than the limit (refused before unpacking).
    #[error(
        "the layers hold more than {limit} entries (past it at layer {layer}): refused before unpacking; raise the limit if the image is genuine"
    )]
    TooManyEntries {
        /// The layer's digest.
        layer: String,
        /// The limit.
        limit: u64,
    },
    /// The copied image is not what skopeo should have made.
    #[error("the copied image is not usable: {why}")]
    BadLayout {
        /// What is wrong.
        why: String,
    },
    /// A layer cannot be read, or is not what its digest says.
    #[error("layer {layer} cannot be imported: {why}")]
    BadLayer {
        /// The layer's digest.
        layer: String,
        /// What is wrong.
        why: String,
    },
    /// skopeo or umoci could not be started.
    #[error("cannot start {tool}")]
    Start {
        /// skopeo or umoci.
        tool: &'static str,
        /// Why.
        #[source]
        source: SpawnError,
    },
    /// skopeo or umoci failed (umoci refuses what it cannot unpack safely, such as a hard
    /// link to a file outside the image).
    #[error("{tool} could not {step}: {why}")]
    ToolFailed {
        /// skopeo or umoci.
        tool: &'static str,
        /// What it was doing.
        step: &'static str,
        /// What it said.
        why: String,
    },
    /// A directory the sandbox needs is, in the image, a symlink or not a directory.
    #[error(
        "{path} in the image is {found}: the sandbox needs a real directory there; fix the image and import it again"
    )]
    Reserved {
        /// The path inside the image.
        path: String,
        /// What it is.
        found: String,
    },
    /// Something in the unpacked image could not be made safe.
    #[error("cannot make {path} in the image safe")]
    Neutralise {
        /// The path inside the image.
        path: String,
        /// Why.
        #[source]
        io: io::Error,
    },
    /// The store could not be written.
    #[error("cannot write {}", path.display())]
    Store {
        /// What could not be written.
        path: PathBuf,
        /// Why.
        #[source]
        io: io::Error,
    },
    /// The image was moved into place but cannot be read back.
    #[error("the imported image cannot be read back from the store")]
    ReadBack(#[source] ResolveImageError),
    /// The manifest could not be made (a last check: nothing the format refuses is left).
    #[error(transparent)]
    Manifest(#[from] MakeManifestError),
    /// The import failed, and its temporary directory could not be removed.
    #[error("the import failed and {} could not be removed ({cleanup}): remove it by hand", tmp.display())]
    LeftBehind {
        /// The temporary directory.
        tmp: PathBuf,
        /// Why it could not be removed.
        cleanup: io::Error,
        /// Why the import failed.
        #[source]
        cause: Box<ImportImageError>,
    },
}

/// Where skopeo and umoci are looked for (children start with an empty environment).
const TOOL_DIRS: [&str; 2] = ["/usr/bin", "/usr/local/bin"];

/// The tag the copied image has in the temporary layout.
const TAG: &str = "import";

/// The most JSON (an index, a manifest) read from an image.
const JSON_MAX: u64 = 16 << 20;

fn tool(name: &'static str) -> Result<PathBuf, ImportImageError> {
    TOOL_DIRS
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .ok_or(ImportImageError::ToolMissing { tool: name })
}

/// Imports `source` into `store` as `name`, reporting progress through `progress` (a line
/// at a time, for stderr). See the module's documentation for what is checked and changed.
pub fn import(
    source: &Source,
    name: &str,
    store: &ImageStore,
    limits: &Limits,
    progress: &mut dyn FnMut(&str),
) -> Result<Imported, ImportImageError> {
    if !is_image_name(name) {
        return Err(ImportImageError::Name {
            name: name.to_owned(),
        });
    }
    let exists = || ImportImageError::Exists {
        name: name.to_owned(),
        store: store.dir().to_owned(),
    };
    let target = store.dir().join(name);
    if fs::symlink_metadata(&target).is_ok() {
        return Err(exists());
    }
    let tools = Tools {
        skopeo: tool("skopeo")?,
        umoci: tool("umoci")?,
        timeout: limits.tool_timeout,
    };
    let found = inspect(source)?;
    if found.bytes > limits.archive_bytes {
        return Err(ImportImageError::ArchiveTooLarge {
            what: found.path.display().to_string(),
            bytes: found.bytes,
            limit: limits.archive_bytes,
        });
    }
    progress(&format!(
        "importing {} ({}, {} bytes) as `{name}`",
        found.path.display(),
        found.form.as_str(),
        found.bytes
    ));
    let store_err = |path: &Path| {
        let path = path.to_owned();
        move |io| ImportImageError::Store { path, io }
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(store.dir())
        .map_err(store_err(store.dir()))?;
    let tmp = store
        .dir()
        .join(format!(".import.{name}.tmp.{}", random_suffix()));
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&tmp)
        .map_err(store_err(&tmp))?;
    let outcome = unpack_into(&found, &tmp, &tools, limits, progress).and_then(|done| {
        progress(&format!("moving into place: {}", target.display()));
        rustix::fs::renameat_with(CWD, &tmp, CWD, &target, RenameFlags::NOREPLACE).map_err(
            |e| match e {
                rustix::io::Errno::EXIST | rustix::io::Errno::NOTEMPTY => exists(),
                e => ImportImageError::Store {
                    path: target.clone(),
                    io: e.into(),
                },
            },
        )?;
        Ok(done)
    });
    let done = match outcome {
        Ok(done) => done,
        Err(cause) => {
            return Err(match fs::remove_dir_all(&tmp) {
                Ok(()) => cause,
                Err(cleanup) => ImportImageError::LeftBehind {
                    tmp,
                    cleanup,
                    cause: Box::new(cause),
                },
            });
        }
    };
    let image = store.read(name).map_err(ImportImageError::ReadBack)?;
    progress(&format!("imported `{name}`: {}", image.identity));
    Ok(Imported {
        image,
        form: found.form,
        source: found.path,
        oci_manifest: done.oci_manifest,
        layers: done.layers,
        unpacked_bytes: done.unpacked_bytes,
        entries: done.entries,
        neutralised: done.neutralised,
    })
}

fn random_suffix() -> String {
    let mut bytes = [0u8; 8];
    // /dev/urandom cannot fail short on Linux; should it, the name still has the time and
    // pid, and the directory is created exclusively.
    let _ = File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{}{:08x}{}", hex::encode(bytes), nanos, std::process::id())
}

/// A source, inspected: its form, canonical path, skopeo's name for the chosen image, size.
#[derive(Debug)]
struct Found {
    form: SourceForm,
    path: PathBuf,
    chosen: Option<String>,
    reference: OsString,
    bytes: u64,
}

fn inspect(source: &Source) -> Result<Found, ImportImageError> {
    let read_err = |path: &Path| {
        let path = path.to_owned();
        move |io| ImportImageError::ReadSource { path, io }
    };
    let path = fs::canonicalize(&source.path).map_err(read_err(&source.path))?;
    let not = |why: String| ImportImageError::NotAnImage {
        path: path.clone(),
        why,
    };
    // skopeo's `transport:path:image` takes the path up to the first colon.
    if path.as_os_str().as_bytes().contains(&b':') {
        return Err(not(
            "its path holds a `:`, which skopeo cannot take: rename it or link to it".into(),
        ));
    }
    let meta = fs::metadata(&path).map_err(read_err(&path))?;
    let (form, bytes, listing) = if meta.is_dir() {
        if !path.join("oci-layout").is_file() || !path.join("index.json").is_file() {
            return Err(not(
                "a directory without oci-layout and index.json is not an OCI image layout".into(),
            ));
        }
        let index = read_bounded(File::open(path.join("index.json")).map_err(read_err(&path))?)
            .map_err(read_err(&path.join("index.json")))?;
        let bytes = tree_bytes(&path.join("blobs")).map_err(read_err(&path))?;
        (SourceForm::OciLayout, bytes, Listing::Oci(index))
    } else if meta.is_file() {
        let (form, listing) = inspect_tar(&path)?;
        (form, meta.len(), listing)
    } else {
        return Err(not("neither a tar archive nor a directory".into()));
    };
    let images = listing.images().map_err(not)?;
    let shown: Vec<String> = images.iter().map(|i| i.shown.clone()).collect();
    let selector = match &source.image {
        Some(chosen) if images.iter().any(|i| i.names.contains(chosen)) => Some(chosen.clone()),
        Some(chosen) => {
            return Err(ImportImageError::NoSuchImage {
                path: path.clone(),
                chosen: chosen.clone(),
                images: shown,
            });
        }
        None if images.len() == 1 => None,
        None if images.is_empty() => return Err(not("it lists no image".into())),
        None => {
            return Err(ImportImageError::SeveralImages {
                path: path.clone(),
                images: shown,
            });
        }
    };
    let mut reference = OsString::from(format!("{}:", form.transport()));
    reference.push(&path);
    if let Some(sel) = &selector {
        reference.push(":");
        reference.push(sel);
    }
    Ok(Found {
        form,
        path,
        chosen: source.image.clone(),
        reference,
        bytes,
    })
}

/// What an image source lists.
enum Listing {
    /// An OCI `index.json`.
    Oci(Vec<u8>),
    /// A docker-archive `manifest.json`.
    Docker(Vec<u8>),
}

/// One image of a source.
#[derive(Debug, PartialEq, Eq)]
struct ListedImage {
    /// How messages show it (one of its names when it has one).
    shown: String,
    /// What chooses it, as skopeo takes it after `<transport>:<path>:` (an OCI manifest's
    /// ref name; a docker-archive image's tags and `@<index>`).
    names: Vec<String>,
}

impl Listing {
    /// Its images.
    fn images(&self) -> Result<Vec<ListedImage>, String> {
        match self {
            Listing::Oci(bytes) => {
                let index: serde_json::Value = serde_json::from_slice(bytes)
                    .map_err(|e| format!("its index.json is not JSON ({e})"))?;
                let manifests = index
                    .get("manifests")
                    .and_then(|m| m.as_array())
                    .ok_or("its index.json has no manifests list")?;
                Ok(manifests
                    .iter()
                    .enumerate()
                    .map(|(i, m)| {
                        let name = m
                            .pointer("/annotations/org.opencontainers.image.ref.name")
                            .and_then(|n| n.as_str());
                        match name {
                            Some(n) => ListedImage {
                                shown: n.to_owned(),
                                names: vec![n.to_owned()],
                            },
                            None => ListedImage {
                                shown: format!(
                                    "#{i} {} (no name: cannot be chosen)",
                                    m.get("digest").and_then(|d| d.as_str()).unwrap_or("?")
                                ),
                                names: Vec::new(),
                            },
                        }
                    })
                    .collect())
            }
            Listing::Docker(bytes) => {
                let list: serde_json::Value = serde_json::from_slice(bytes)
                    .map_err(|e| format!("its manifest.json is not JSON ({e})"))?;
                let list = list.as_array().ok_or("its manifest.json is not a list")?;
                Ok(list
                    .iter()
                    .enumerate()
                    .map(|(i, m)| {
                        let mut names: Vec<String> = m
                            .get("RepoTags")
                            .and_then(|t| t.as_array())
                            .map(|t| {
                                t.iter()
                                    .filter_map(|t| t.as_str())
                                    .map(str::to_owned)
                                    .collect()
                            })
                            .unwrap_or_default();
                        names.push(format!("@{i}"));
                        ListedImage {
                            shown: names[0].clone(),
                            names,
                        }
                    })
                    .collect())
            }
        }
    }
}

/// The form of the tar at `path` and what it lists, from its member names alone.
fn inspect_tar(path: &Path) -> Result<(SourceForm, Listing), ImportImageError> {
    let read_err = |io| ImportImageError::ReadSource {
        path: path.to_owned(),
        io,
    };
    let not = |why: String| ImportImageError::NotAnImage {
        path: path.to_owned(),
        why,
    };
    let mut file = File::open(path).map_err(read_err)?;
    let mut magic = [0u8; 6];
    let got = read_up_to(&mut file, &mut magic).map_err(read_err)?;
    for (prefix, what, how) in [
        (&b"\x1f\x8b"[..], "gzip", "gunzip"),
        (&b"\x28\xb5\x2f\xfd"[..], "zstd", "zstd -d"),
        (&b"\xfd7zXZ\x00"[..], "xz", "unxz"),
    ] {
        if magic[..got].starts_with(prefix) {
            return Err(not(format!(
                "it is {what}-compressed: decompress it first ({how})"
            )));
        }
    }
    let file = File::open(path).map_err(read_err)?;
    let mut archive = tar::Archive::new(file);
    let (mut layout, mut index, mut docker) = (false, None, None);
    let entries = archive
        .entries_with_seek()
        .map_err(|e| not(format!("it is not a tar archive ({e})")))?;
    for entry in entries {
        let entry = entry.map_err(|e| not(format!("it is not a readable tar archive ({e})")))?;
        let name = entry.path_bytes().into_owned();
        let name = name.strip_prefix(b"./").unwrap_or(&name).to_vec();
        match &name[..] {
            b"oci-layout" => layout = true,
            b"index.json" => index = Some(read_bounded(entry).map_err(read_err)?),
            b"manifest.json" => docker = Some(read_bounded(entry).map_err(read_err)?),
            _ => {}
        }
        if layout && index.is_some() {
            break;
        }
    }
    match (layout, index, docker) {
        (true, Some(index), _) => Ok((SourceForm::OciArchive, Listing::Oci(index))),
        (_, _, Some(docker)) => Ok((SourceForm::DockerArchive, Listing::Docker(docker))),
        _ => Err(not(
            "a tar without oci-layout and index.json (oci-archive) or manifest.json \
             (docker-archive)"
                .into(),
        )),
    }
}

fn read_up_to(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match reader.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// At most [`JSON_MAX`] bytes of `reader`; more is an error.
fn read_bounded(reader: impl Read) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    reader.take(JSON_MAX + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > JSON_MAX {
        return Err(io::Error::other(format!("larger than {JSON_MAX} bytes")));
    }
    Ok(bytes)
}

/// The bytes of the files under `dir` (what skopeo may read from a layout's blobs):
/// directories are entered only if they are directories themselves, a symlinked file
/// counts as what it names.
fn tree_bytes(dir: &Path) -> io::Result<u64> {
    let mut total = 0u64;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in fs::read_dir(&d)? {
            let path = entry?.path();
            if fs::symlink_metadata(&path)?.is_dir() {
                pending.push(path);
            } else if let Ok(m) = fs::metadata(&path) {
                total = total.saturating_add(m.len());
            }
        }
    }
    Ok(total)
}

/// The programs an import runs.
#[derive(Debug)]
struct Tools {
    skopeo: PathBuf,
    umoci: PathBuf,
    timeout: Duration,
}

impl Tools {
    /// Runs `spawn` to the end; a failure says what it was doing and what it printed.
    fn run(
        &self,
        tool: &'static str,
        step: &'static str,
        spawn: Spawn,
    ) -> Result<(), ImportImageError> {
        let running = spawn
            .spawn()
            .map_err(|source| ImportImageError::Start { tool, source })?;
        let failed = |why: String| ImportImageError::ToolFailed { tool, step, why };
        let got = capture(running, &CaptureLimits::new(256 << 10, self.timeout))
            .map_err(|e| failed(e.to_string()))?;
        if got.timed_out {
            return Err(failed(format!(
                "it did not finish within {} s (killed)",
                self.timeout.as_secs()
            )));
        }
        if got.exit_code == Some(0) {
            return Ok(());
        }
        let said = said(&got.stderr);
        let status = match (got.exit_code, got.signal) {
            (Some(code), _) => format!("exit status {code}"),
            (None, Some(sig)) => format!("signal {sig}"),
            (None, None) => "no status".into(),
        };
        Err(failed(if said.is_empty() {
            status
        } else {
            format!("{said} ({status})")
        }))
    }
}

/// What a tool printed on stderr, as one short line: its last lines, without umoci's bullets
/// and logrus's decoration.
fn said(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<String> = text
        .lines()
        .map(|l| l.trim().trim_start_matches(['•', '⨯']).trim().to_owned())
        .filter(|l| !l.is_empty() && !l.starts_with("unpacking rootfs") && !l.starts_with("..."))
        .collect();
    let tail = lines[lines.len().saturating_sub(3)..].join("; ");
    if tail.len() > 2000 {
        let mut cut = tail.len() - 2000;
        while !tail.is_char_boundary(cut) {
            cut += 1;
        }
        return format!("...{}", &tail[cut..]);
    }
    tail
}

/// What [`unpack_into`] made.
#[derive(Debug)]
struct Done {
    oci_manifest: String,
    layers: usize,
    unpacked_bytes: u64,
    entries: u64,
    neutralised: Neutralised,
}

/// Everything between the empty temporary directory and the finished image directory.
fn unpack_into(
    found: &Found,
    tmp: &Path,
    tools: &Tools,
    limits: &Limits,
    progress: &mut dyn FnMut(&str),
) -> Result<Done, ImportImageError> {
    let layout = tmp.join("layout");
    copy_image(found, tmp, tools, progress)?;
    let image = read_layout(&layout)?;
    let (unpacked, entries) = measure_layers(&layout, &image, limits, progress)?;

    progress(&format!(
        "unpacking {} layers with umoci (at most {unpacked} bytes, {entries} entries)",
        image.layers.len()
    ));
    let unpack = Spawn::new(&tools.umoci, tmp)
        .args(["raw", "unpack", "--image"])
        .arg(format!("layout:{TAG}"))
        .arg("rootfs");
    tools.run("umoci", "unpack the image", unpack)?;
    fs::remove_dir_all(&layout).map_err(|io| ImportImageError::Store { path: layout, io })?;

    let rootfs = tmp.join("rootfs");
    let neutralised = make_safe(&rootfs, progress)?;

    progress("writing the manifest");
    let manifest_bytes = manifest::manifest(&rootfs, &[])?;
    let identity = manifest::identity(&manifest_bytes);
    let write = |name: &str, bytes: &[u8]| {
        let path = tmp.join(name);
        fs::write(&path, bytes).map_err(|io| ImportImageError::Store { path, io })
    };
    write("manifest", &manifest_bytes)?;
    write("identity", format!("{identity}\n").as_bytes())?;
    write(
        "source",
        source_text(found, &image.digest, image.layers.len(), &neutralised).as_bytes(),
    )?;
    fs::set_permissions(tmp, std::os::unix::fs::PermissionsExt::from_mode(0o755)).map_err(
        |io| ImportImageError::Store {
            path: tmp.to_owned(),
            io,
        },
    )?;
    Ok(Done {
        oci_manifest: image.digest,
        layers: image.layers.len(),
        unpacked_bytes: unpacked,
        entries,
        neutralised,
    })
}

/// skopeo copies the chosen image into `<tmp>/layout`, every layer gzip; its temporary
/// files and its cache stay in `tmp` and are removed after.
fn copy_image(
    found: &Found,
    tmp: &Path,
    tools: &Tools,
    progress: &mut dyn FnMut(&str),
) -> Result<(), ImportImageError> {
    let store_err = |path: &Path| {
        let path = path.to_owned();
        move |io| ImportImageError::Store { path, io }
    };
    let skopeo_tmp = tmp.join("skopeo-tmp");
    let skopeo_data = tmp.join("skopeo-data");
    for d in [&skopeo_tmp, &skopeo_data] {
        fs::create_dir(d).map_err(store_err(d))?;
    }
    progress("copying the image with skopeo");
    // The destination is relative to the working directory, the temporary directory, so
    // that a `:` in the store's path cannot be taken for the tag's.
    let copy = Spawn::new(&tools.skopeo, tmp)
        .arg("--insecure-policy")
        .arg("--tmpdir")
        .arg(&skopeo_tmp)
        .args(["copy", "--quiet", "--remove-signatures"])
        .args(["--dest-compress-format", "gzip"])
        .arg(&found.reference)
        .arg(format!("oci:layout:{TAG}"))
        .env("XDG_DATA_HOME", &skopeo_data)
        .env("_CONTAINERS_ROOTLESS_UID", "65534");
    tools.run("skopeo", "copy the image", copy)?;
    for d in [&skopeo_tmp, &skopeo_data] {
        fs::remove_dir_all(d).map_err(store_err(d))?;
    }
    Ok(())
}

/// Checks the copied image's layers against the limits, before anything is unpacked;
/// returns what they unpack to at most, and their entries.
fn measure_layers(
    layout: &Path,
    image: &CopiedImage,
    limits: &Limits,
    progress: &mut dyn FnMut(&str),
) -> Result<(u64, u64), ImportImageError> {
    let compressed: u64 = image.layers.iter().map(|l| l.size).sum();
    if compressed > limits.archive_bytes {
        return Err(ImportImageError::ArchiveTooLarge {
            what: format!("the image's {} layers", image.layers.len()),
            bytes: compressed,
            limit: limits.archive_bytes,
        });
    }
    let mut budget = Budget {
        unpacked_left: limits.unpacked_bytes,
        entries_left: limits.entries,
        unpacked_limit: limits.unpacked_bytes,
        entries_limit: limits.entries,
    };
    let (mut unpacked, mut entries) = (0u64, 0u64);
    for (i, layer) in image.layers.iter().enumerate() {
        progress(&format!(
            "checking layer {}/{} ({}, {} bytes)",
            i + 1,
            image.layers.len(),
            layer.digest,
            layer.size
        ));
        let (bytes, count) = measure_layer(layout, layer, &mut budget)?;
        unpacked += bytes;
        entries += count;
    }
    Ok((unpacked, entries))
}

/// Neutralises the unpacked rootfs, makes the directories a sandbox needs, makes the root
/// 0:0 0755, and checks once more; says what it changed (the first few of each kind; all
/// of them go into `source`).
fn make_safe(
    rootfs: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<Neutralised, ImportImageError> {
    progress("removing device nodes, fifos, sockets, set-id bits and extended attributes");
    let mut n = Neutralised::default();
    neutralise(rootfs, &mut n)?;
    ensure_directories(rootfs, &mut n)?;
    let root = open_dir(CWD, rootfs).map_err(|io| ImportImageError::Store {
        path: rootfs.to_owned(),
        io,
    })?;
    rustix::fs::fchown(&root, Some(Uid::ROOT), Some(Gid::ROOT))
        .and_then(|()| rustix::fs::fchmod(&root, Mode::from_raw_mode(0o755)))
        .map_err(|e| ImportImageError::Store {
            path: rootfs.to_owned(),
            io: e.into(),
        })?;
    drop(root);
    check_clean(rootfs)?;
    let mut tell = |lines: Vec<String>| {
        const SHOWN: usize = 20;
        for line in lines.iter().take(SHOWN) {
            progress(line);
        }
        if lines.len() > SHOWN {
            progress(&format!(
                "  and {} more (listed in source)",
                lines.len() - SHOWN
            ));
        }
    };
    tell(
        n.removed
            .iter()
            .map(|(p, k)| format!("  removed {k} {p}"))
            .collect(),
    );
    tell(
        n.cleared_setid
            .iter()
            .map(|(p, m)| format!("  cleared the set-id bits of {p} (was {m:04o})"))
            .collect(),
    );
    tell(
        n.removed_xattrs
            .iter()
            .map(|(p, x)| format!("  removed extended attribute {x} of {p}"))
            .collect(),
    );
    tell(n.made.iter().map(|m| format!("  made {m}")).collect());
    Ok(n)
}

/// The `source` file: what was imported and what was changed, one fact a line.
fn source_text(found: &Found, manifest: &str, layers: usize, n: &Neutralised) -> String {
    let mut text = String::new();
    let _ = writeln!(text, "form {}", found.form.as_str());
    let _ = writeln!(text, "path {}", escape(found.path.as_os_str().as_bytes()));
    if let Some(chosen) = &found.chosen {
        let _ = writeln!(text, "image {}", escape(chosen.as_bytes()));
    }
    let _ = writeln!(text, "manifest {manifest}");
    let _ = writeln!(text, "layers {layers}");
    for (path, kind) in &n.removed {
        let _ = writeln!(text, "removed {} {path}", kind.replace(' ', "-"));
    }
    for (path, mode) in &n.cleared_setid {
        let _ = writeln!(text, "cleared-setid {mode:04o} {path}");
    }
    for (path, name) in &n.removed_xattrs {
        let _ = writeln!(text, "removed-xattr {} {path}", escape(name.as_bytes()));
    }
    for path in &n.made {
        let _ = writeln!(text, "made {path}");
    }
    text
}

/// A layer as the OCI manifest lists it.
#[derive(Debug)]
struct Layer {
    media_type: String,
    digest: String,
    size: u64,
}

/// The copied image: its manifest's digest and layers.
#[derive(Debug)]
struct CopiedImage {
    digest: String,
    layers: Vec<Layer>,
}

/// Whether `digest` is `sha256:` and 64 lowercase hex digits (so it names a blob file).
fn is_sha256_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

fn blob_path(layout: &Path, digest: &str) -> PathBuf {
    layout
        .join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"))
}

fn read_layout(layout: &Path) -> Result<CopiedImage, ImportImageError> {
    let bad = |why: String| ImportImageError::BadLayout { why };
    let json = |path: PathBuf| -> Result<serde_json::Value, ImportImageError> {
        let bytes = File::open(&path)
            .and_then(read_bounded)
            .map_err(|e| bad(format!("cannot read {} ({e})", path.display())))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| bad(format!("{} is not JSON ({e})", path.display())))
    };
    let index = json(layout.join("index.json"))?;
    let manifests = index
        .get("manifests")
        .and_then(|m| m.as_array())
        .ok_or_else(|| bad("index.json has no manifests".into()))?;
    let [only] = &manifests[..] else {
        return Err(bad(format!(
            "index.json lists {} manifests, not one",
            manifests.len()
        )));
    };
    let digest = only
        .get("digest")
        .and_then(|d| d.as_str())
        .filter(|d| is_sha256_digest(d))
        .ok_or_else(|| bad("index.json's manifest has no sha256 digest".into()))?
        .to_owned();
    let manifest = json(blob_path(layout, &digest))?;
    let layers = manifest
        .get("layers")
        .and_then(|l| l.as_array())
        .ok_or_else(|| bad(format!("manifest {digest} has no layers list")))?;
    let layers = layers
        .iter()
        .map(|l| {
            let media_type = l.get("mediaType").and_then(|m| m.as_str());
            let layer_digest = l
                .get("digest")
                .and_then(|d| d.as_str())
                .filter(|d| is_sha256_digest(d));
            let size = l.get("size").and_then(|s| s.as_u64());
            match (media_type, layer_digest, size) {
                (Some(m), Some(d), Some(s)) => Ok(Layer {
                    media_type: m.to_owned(),
                    digest: d.to_owned(),
                    size: s,
                }),
                _ => Err(bad(format!(
                    "manifest {digest} lists a layer without a media type, sha256 digest or size"
                ))),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(CopiedImage { digest, layers })
}

/// What the layers checked so far leave of the limits.
#[derive(Debug)]
struct Budget {
    unpacked_left: u64,
    entries_left: u64,
    unpacked_limit: u64,
    entries_limit: u64,
}

/// Reads through, feeding a hasher.
struct Hashing<R> {
    inner: R,
    hasher: Sha256,
    bytes: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

/// Reads through, counting, and fails once more than `limit` bytes have come.
struct Counting<R> {
    inner: R,
    count: Rc<Cell<u64>>,
    limit: u64,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let count = self.count.get() + n as u64;
        self.count.set(count);
        if count > self.limit {
            return Err(io::Error::other("over the unpacked limit"));
        }
        Ok(n)
    }
}

/// Reads one layer blob through: checks its digest and size, and what it unpacks to
/// against `budget` (which it spends). Returns the layer's unpacked bound and entries.
fn measure_layer(
    layout: &Path,
    layer: &Layer,
    budget: &mut Budget,
) -> Result<(u64, u64), ImportImageError> {
    let bad = |why: String| ImportImageError::BadLayer {
        layer: layer.digest.clone(),
        why,
    };
    let too_large = || ImportImageError::UnpackedTooLarge {
        layer: layer.digest.clone(),
        limit: budget.unpacked_limit,
    };
    let gzip = match layer.media_type.as_str() {
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip" => true,
        "application/vnd.oci.image.layer.v1.tar"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar"
        | "application/vnd.docker.image.rootfs.diff.tar" => false,
        other => {
            return Err(bad(format!(
                "its media type {other} is not a (gzip) tar layer"
            )));
        }
    };
    let path = blob_path(layout, &layer.digest);
    let file = File::open(&path).map_err(|e| bad(format!("cannot open its blob ({e})")))?;
    let mut hashing = Hashing {
        inner: file,
        hasher: Sha256::new(),
        bytes: 0,
    };
    let count = Rc::new(Cell::new(0u64));
    let decompressed: Box<dyn Read + '_> = if gzip {
        Box::new(flate2::read::MultiGzDecoder::new(&mut hashing))
    } else {
        Box::new(&mut hashing)
    };
    let counting = Counting {
        inner: decompressed,
        count: Rc::clone(&count),
        limit: budget.unpacked_left,
    };
    let over = |count: &Rc<Cell<u64>>| count.get() > budget.unpacked_left;
    let mut archive = tar::Archive::new(counting);
    let (mut declared, mut entries) = (0u64, 0u64);
    {
        let list = archive
            .entries()
            .map_err(|e| bad(format!("it is not a tar ({e})")))?;
        for entry in list {
            let mut entry = match entry {
                Ok(entry) => entry,
                Err(_) if over(&count) => return Err(too_large()),
                Err(e) => return Err(bad(format!("it is not a readable tar ({e})"))),
            };
            entries += 1;
            if entries > budget.entries_left {
                return Err(ImportImageError::TooManyEntries {
                    layer: layer.digest.clone(),
                    limit: budget.entries_limit,
                });
            }
            let mut size = entry.header().entry_size().unwrap_or(0).max(entry.size());
            // Go's tar reader (umoci's) writes a sparse file's holes out as zeros.
            if entry.header().entry_type().is_gnu_sparse() {
                let real = entry.header().as_gnu().and_then(|g| g.real_size().ok());
                size = size.max(real.unwrap_or(u64::MAX));
            }
            if let Ok(Some(pax)) = entry.pax_extensions() {
                for ext in pax.flatten() {
                    if matches!(ext.key(), Ok("GNU.sparse.realsize" | "GNU.sparse.size")) {
                        let real = ext.value().ok().and_then(|v| v.trim().parse::<u64>().ok());
                        // A size that cannot be read counts as too large.
                        size = size.max(real.unwrap_or(u64::MAX));
                    }
                }
            }
            declared = declared.saturating_add(size);
            if declared > budget.unpacked_left {
                return Err(too_large());
            }
        }
    }
    // Whatever follows the tar's end is decompressed and counted too, to the end.
    let mut rest = archive.into_inner();
    match io::copy(&mut rest, &mut io::sink()) {
        Ok(_) => {}
        Err(_) if over(&count) => return Err(too_large()),
        Err(e) => return Err(bad(format!("it cannot be decompressed ({e})"))),
    }
    drop(rest);
    // And the blob itself, to its end, for its digest.
    io::copy(&mut hashing, &mut io::sink())
        .map_err(|e| bad(format!("cannot read its blob ({e})")))?;
    let digest = format!("sha256:{}", hex::encode(hashing.hasher.finalize()));
    if digest != layer.digest || hashing.bytes != layer.size {
        return Err(bad(format!(
            "its blob is {} bytes with digest {digest}, not what the manifest says",
            hashing.bytes
        )));
    }
    let bound = count.get().max(declared);
    budget.unpacked_left -= bound;
    budget.entries_left -= entries;
    Ok((bound, entries))
}

fn kind_of(file_type: FileType) -> Option<&'static str> {
    match file_type {
        FileType::CharacterDevice => Some("character device"),
        FileType::BlockDevice => Some("block device"),
        FileType::Fifo => Some("fifo"),
        FileType::Socket => Some("socket"),
        _ => None,
    }
}

/// Removes device nodes, fifos and sockets, clears set-id bits, removes extended
/// attributes, recording each, without following a symlink.
fn neutralise(rootfs: &Path, out: &mut Neutralised) -> Result<(), ImportImageError> {
    walk(rootfs, &mut |place, rel, stat| {
        let file_type = FileType::from_raw_mode(stat.st_mode);
        if let Some(kind) = kind_of(file_type) {
            if let Place::In(dir, name) = place {
                rustix::fs::unlinkat(dir, *name, AtFlags::empty())?;
                out.removed.push((escape(rel), kind));
            }
            return Ok(());
        }
        for name in place.xattr_names()? {
            place.remove_xattr(&name)?;
            out.removed_xattrs
                .push((escape(rel), String::from_utf8_lossy(&name).into_owned()));
        }
        let mode = stat.st_mode & 0o7777;
        if mode & 0o6000 != 0 && matches!(file_type, FileType::RegularFile | FileType::Directory) {
            let fd = place.open_file()?;
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & !0o6000))?;
            out.cleared_setid.push((escape(rel), mode));
        }
        Ok(())
    })
    .map_err(|e| ImportImageError::Neutralise {
        path: escape(&e.rel),
        io: e.io,
    })
}

/// Checks, once more and on its own, that nothing [`neutralise`] removes is left.
fn check_clean(rootfs: &Path) -> Result<(), ImportImageError> {
    walk(rootfs, &mut |place, rel, stat| {
        let left = if stat.st_mode & 0o6000 != 0 {
            "a set-id bit"
        } else if kind_of(FileType::from_raw_mode(stat.st_mode)).is_some() {
            "a device node, fifo or socket"
        } else if !place.xattr_names()?.is_empty() {
            "an extended attribute"
        } else {
            return Ok(());
        };
        Err(io::Error::other(format!(
            "{} still has {left}",
            escape(rel)
        )))
    })
    .map_err(|e| ImportImageError::Neutralise {
        path: escape(&e.rel),
        io: e.io,
    })
}

/// The directories every sandbox needs, and their modes when made.
const NEEDED: [(&str, u32); 3] = [
    ("/work", 0o755),
    ("/tmp", 0o1777),
    ("/opt/plimsoll/bin", 0o755),
];

/// Makes each of [`NEEDED`] a real directory, owned by root, where it is missing (and /tmp
/// root's with mode 1777 where it is there); refuses a symlink or a non-directory on the way.
fn ensure_directories(rootfs: &Path, out: &mut Neutralised) -> Result<(), ImportImageError> {
    let root = open_dir(CWD, rootfs).map_err(|io| ImportImageError::Store {
        path: rootfs.to_owned(),
        io,
    })?;
    for (path, mode) in NEEDED {
        let mut dir = root.try_clone().map_err(|io| ImportImageError::Store {
            path: rootfs.to_owned(),
            io,
        })?;
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let mut at = String::new();
        for (i, part) in parts.iter().enumerate() {
            at.push('/');
            at.push_str(part);
            let failed = |io: io::Error| ImportImageError::Neutralise {
                path: at.clone(),
                io,
            };
            let want = if i + 1 == parts.len() { mode } else { 0o755 };
            let found = match rustix::fs::statat(&dir, *part, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => Some(st),
                Err(rustix::io::Errno::NOENT) => None,
                Err(e) => return Err(failed(e.into())),
            };
            let reserved = |found: String| ImportImageError::Reserved {
                path: at.clone(),
                found,
            };
            match found.map(|st| FileType::from_raw_mode(st.st_mode)) {
                None => rustix::fs::mkdirat(&dir, *part, Mode::from_raw_mode(0o700))
                    .map_err(|e| failed(e.into()))?,
                Some(FileType::Directory) => {}
                Some(FileType::Symlink) => {
                    let target = rustix::fs::readlinkat(&dir, *part, Vec::new())
                        .map(|t| escape(t.as_bytes()))
                        .unwrap_or_default();
                    return Err(reserved(format!("a symlink (to {target})")));
                }
                Some(other) => return Err(reserved(format!("not a directory ({other:?})"))),
            }
            let fd = open_dir(&dir, *part).map_err(failed)?;
            let change = match found {
                None => Some(at.clone()),
                // /tmp must be writable by the sandbox's user, and root's.
                Some(st)
                    if path == "/tmp"
                        && (st.st_mode & 0o7777 != mode || st.st_uid != 0 || st.st_gid != 0) =>
                {
                    Some(format!(
                        "{at} (mode {mode:04o}, owner 0:0; was {:04o} {}:{})",
                        st.st_mode & 0o7777,
                        st.st_uid,
                        st.st_gid
                    ))
                }
                Some(_) => None,
            };
            if let Some(change) = change {
                rustix::fs::fchown(&fd, Some(Uid::ROOT), Some(Gid::ROOT))
                    .and_then(|()| rustix::fs::fchmod(&fd, Mode::from_raw_mode(want)))
                    .map_err(|e| failed(e.into()))?;
                out.made.push(change);
            }
            dir = fd;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_says_its_last_lines_without_decoration() {
        let stderr = "   • unpacking rootfs ...     \n   ⨯ create rootfs: unpack layer: unpack entry: etc/h1: link: no such file or directory\n";
        assert_eq!(
            said(stderr.as_bytes()),
            "create rootfs: unpack layer: unpack entry: etc/h1: link: no such file or directory"
        );
        let long = "x".repeat(5000);
        assert!(said(long.as_bytes()).len() <= 2003);
    }

    #[test]
    fn digests_name_blob_files_only_when_well_formed() {
        assert!(is_sha256_digest(&format!("sha256:{}", "ab".repeat(32))));
        for bad in [
            "sha256:../../etc/passwd".to_owned(),
            format!("sha256:{}", "AB".repeat(32)),
            format!("sha512:{}", "ab".repeat(32)),
            format!("sha256:{}/", "ab".repeat(32)),
        ] {
            assert!(!is_sha256_digest(&bad), "{bad}");
        }
    }

    #[test]
    fn an_archive_lists_its_images_as_they_can_be_chosen() {
        let listed = |shown: &str, names: &[&str]| ListedImage {
            shown: shown.to_owned(),
            names: names.iter().map(|n| (*n).to_owned()).collect(),
        };
        let oci = Listing::Oci(
            br#"{"manifests":[{"digest":"sha256:aa","annotations":{"org.opencontainers.image.ref.name":"v1"}},{"digest":"sha256:bb"}]}"#.to_vec(),
        );
        assert_eq!(
            oci.images().unwrap(),
            [
                listed("v1", &["v1"]),
                listed("#1 sha256:bb (no name: cannot be chosen)", &[])
            ]
        );
        let docker = Listing::Docker(
            br#"[{"RepoTags":["foo:latest"]},{"RepoTags":null},{"RepoTags":["a:1","b:2"]}]"#
                .to_vec(),
        );
        assert_eq!(
            docker.images().unwrap(),
            [
                listed("foo:latest", &["foo:latest", "@0"]),
                listed("@1", &["@1"]),
                listed("a:1", &["a:1", "b:2", "@2"]),
            ]
        );
        assert!(Listing::Oci(b"[]".to_vec()).images().is_err());
        assert!(Listing::Docker(b"{}".to_vec()).images().is_err());
    }
}
